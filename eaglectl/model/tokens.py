"""A target's tokenizer without transformers, where tokenizer.json is all it is (torch-free: `smoke` and `capture`
read prompts with it too, through measure/workload.py's `tokenizer_of`)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tokenizers import Tokenizer

# tokenizer_config.json classes that are tokenizer.json and nothing more (no class-specific special-token rules)
PLAIN_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


class PlainTokenizer:
    """tokenizer.json through the `tokenizers` library, called as transformers' tokenizers are
    (`tok(text, add_special_tokens=...).input_ids`); the special tokens' ids where tokenizer_config.json names them."""

    chat_template = None

    def __init__(self, path: Path, settings: dict[str, Any] | None = None) -> None:

        self.tok = Tokenizer.from_file(str(path))
        for which in ("bos", "eos", "pad"):
            token = (settings or {}).get(f"{which}_token")
            token = token.get("content") if isinstance(token, dict) else token
            setattr(self, f"{which}_token_id", self.tok.token_to_id(token) if isinstance(token, str) else None)

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        return SimpleNamespace(input_ids=self.tok.encode(text, add_special_tokens=add_special_tokens).ids)


def plain_tokenizer(folder: Path) -> PlainTokenizer | None:
    """The folder's tokenizer when tokenizer_config.json says it is tokenizer.json and nothing more (a plain class,
    no chat template), else None (transformers' AutoTokenizer reads it)."""
    try:
        settings = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    chat = (folder / "chat_template.jinja").exists() or (folder / "chat_template.json").exists()
    if not isinstance(settings, dict) or settings.get("tokenizer_class") not in PLAIN_TOKENIZERS or chat or \
            "chat_template" in settings or not (folder / "tokenizer.json").exists():
        return None
    return PlainTokenizer(folder / "tokenizer.json", settings)
