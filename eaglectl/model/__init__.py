"""The torch side: the reference drafter (`reference.py`, torch only), loading a checkpoint into it
(`loader.py`), running an HF target (`hf.py`) and the reference speculative loop (`specloop.py`)."""
