"""The torch side: the reference drafter (`reference.py`), loading a checkpoint into it (`loader.py`), running an
HF target (`hf.py`) or a plain Llama target without transformers (`native.py`; its tokenizer: `tokens.py`, torch-free)
and the speculative loop's counts by replay (`replay.py`)."""
