"""Workloads: the prompts smoke, drift and capture run, as token ids of the target's tokenizer.

Built-in sets (bundled text), a JSONL file, or a local SPEED-Bench folder (parquet with `category` and
`turns`, prepared by the user: its prompts are licensed for evaluation and never shipped or downloaded
here). `at_length` makes prompts of an exact length for the context-length axes.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CheckpointNotFoundError, MissingDependencyError, UsageError

DATA = Path(__file__).with_name("data")
HELDOUT = DATA / "heldout-code.txt"
CALIBRATION = DATA / "calibration.txt"
SPEED_PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED"  # the public repo's stand-in for restricted prompts


@dataclass
class PromptSet:
    name: str
    prompts: list[list[int]]
    description: str
    labels: list[dict[str, Any]] = field(default_factory=list)  # per prompt: SPEED-Bench category, bucket


BUILTIN_PROMPTS = ("short", "long", "calibration")


def _calibration_windows(tokenizer: Any, count: int, length: int) -> PromptSet:
    text = CALIBRATION.read_text() + "\n" + HELDOUT.read_bytes().decode("utf-8", errors="replace")[:200_000]
    ids = tokenizer(text, add_special_tokens=False).input_ids
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    step = length - len(bos)
    prompts = [bos + ids[i * step:(i + 1) * step] for i in range(count) if (i + 1) * step <= len(ids)]
    if not prompts:
        raise CheckpointNotFoundError(f"builtin:calibration: the bundled text has {len(ids)} tokens, "
                                      f"fewer than one window of {length}")
    return PromptSet("builtin:calibration", prompts, f"{len(prompts)} consecutive windows of {length} tokens of "
                     "the bundled calibration text, then held-out code")


def load_prompts(spec: str, tokenizer: Any, *, count: int, max_tokens: int, max_model_len: int, k: int,
                 seed: int, length: int | None = None) -> PromptSet:
    """`builtin:short`, `builtin:long` (held-out code), `builtin:calibration` (consecutive windows of the
    bundled calibration text, then held-out code: what calibration and the probe read), or a JSONL
    file of {"prompt"} / {"messages"} / {"prompt_token_ids"}. With `length`, every prompt has exactly
    that many tokens (`at_length`)."""
    if length is not None and length + max_tokens + k + 2 > max_model_len:
        raise UsageError(f"a context of {length} tokens leaves no room for {max_tokens} new tokens in "
                         f"max_model_len {max_model_len}")
    if Path(spec).is_dir():
        return _speed_bench(Path(spec), tokenizer, count, max_tokens, max_model_len, k, length)
    if spec.startswith("builtin:"):
        kind = spec.split(":", 1)[1]
        if kind not in BUILTIN_PROMPTS:
            raise CheckpointNotFoundError(f"{spec}: built-in prompt sets are "
                                          + ", ".join(f"builtin:{b}" for b in BUILTIN_PROMPTS))
        if tokenizer is None:
            raise MissingDependencyError("built-in prompts need the target's tokenizer (tokenizer.json)")
        if kind == "calibration":
            return _calibration_windows(tokenizer, count, length or max_model_len - max_tokens - k - 2)
        text = HELDOUT.read_bytes().decode("utf-8", errors="replace")
        n = count if kind == "short" or length else max(1, count // 4)
        length = length or (64 if kind == "short" else max(64, max_model_len - max_tokens - k - 2))
        rng = random.Random(seed)
        prompts = []
        for _ in range(n):
            start = rng.randrange(0, max(1, len(text) - 8 * length))
            ids = tokenizer(text[start: start + 8 * length], add_special_tokens=False).input_ids[:length]
            prompts.append(ids)
        return PromptSet(spec, prompts, f"{n} held-out code windows of {length} tokens (seed {seed})")
    path = Path(spec)
    if not path.is_file():
        raise CheckpointNotFoundError(f"{spec}: prompt file not found", path=spec)
    prompts = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise CheckpointNotFoundError(f"{spec}:{lineno}: not a JSON object", path=spec) from None
        if isinstance(obj.get("prompt_token_ids"), list):
            prompts.append([int(t) for t in obj["prompt_token_ids"]])
        elif isinstance(obj.get("prompt"), str) and tokenizer is not None:
            prompts.append(tokenizer(obj["prompt"], add_special_tokens=True).input_ids)
        elif isinstance(obj.get("messages"), list) and tokenizer is not None and tokenizer.chat_template:
            prompts.append(chat_ids(tokenizer, obj["messages"]))
        else:
            raise CheckpointNotFoundError(
                f"{spec}:{lineno}: needs a 'prompt' text, chat 'messages' (target with a chat template) or "
                "'prompt_token_ids'", path=spec)
    if not prompts:
        raise CheckpointNotFoundError(f"{spec}: no prompts", path=spec)
    prompts = prompts[:count] if count else prompts
    if length is not None:
        return PromptSet(str(path), at_length(prompts, length), f"{len(prompts)} prompts from {path.name}, each "
                         f"truncated or continued with the following prompts to {length} tokens")
    _fits(spec, prompts, max_tokens, max_model_len, k)
    return PromptSet(str(path), prompts, f"{len(prompts)} prompts from {path.name}")


def at_length(prompts: list[list[int]], length: int) -> list[list[int]]:
    """Each prompt cut to `length` tokens, or continued with the workload's following prompts (cyclically)
    until it has them: a longer context of the same kind of text, never a filler token."""
    stream = [t for p in prompts for t in p]
    if not stream:
        return prompts
    starts = [sum(len(p) for p in prompts[:i]) for i in range(len(prompts))]
    reps = -(-(length + max(starts)) // len(stream)) + 1
    stream = stream * reps
    return [stream[s: s + length] for s in starts]



class _FastTokenizer:
    """tokenizer.json through the `tokenizers` library: no transformers import for plain text prompts."""

    chat_template = None

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(path))

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=self.tok.encode(text, add_special_tokens=add_special_tokens).ids)


def tokenizer_of(target: str, chat: bool = False) -> Any:
    from .model.hf import _local_folder

    folder = Path(_local_folder(target))
    if not chat and (folder / "tokenizer.json").exists():
        return _FastTokenizer(folder / "tokenizer.json")
    if not any((folder / n).exists() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def _fits(name: str, prompts: list[list[int]], max_tokens: int, max_model_len: int, k: int) -> None:
    too_long = [len(p) for p in prompts if len(p) + max_tokens + k + 2 > max_model_len]
    if too_long:
        raise CheckpointNotFoundError(f"{name}: a prompt of {too_long[0]} tokens leaves no room for {max_tokens} "
                                      f"new tokens in max_model_len {max_model_len}", path=name,
                                      hint=f"pass --max-model-len {max(too_long) + max_tokens + k + 2} or more")


def chat_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template, with the generation prompt (transformers 5
    returns an encoding, 4 a list)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(t) for t in ids]


def needs_chat(spec: str) -> bool:
    """Whether the prompts go through the tokenizer's chat template (JSONL messages, SPEED-Bench turns)."""
    path = Path(spec)
    return path.is_dir() or (path.is_file() and '"messages"' in path.read_text(errors="replace"))


def _speed_bench(folder: Path, tokenizer: Any, count: int, max_tokens: int, max_model_len: int, k: int,
                 length: int | None) -> PromptSet:
    """A user-prepared SPEED-Bench folder: every parquet file under it; the first turn of each row, as a
    user message (chat template when the target has one), balanced round-robin over categories (and
    throughput buckets, named by `throughput_<N>k` in the path) up to `count` prompts."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError("reading a SPEED-Bench folder needs pyarrow",
                                     hint="pip install 'eaglectl-cli[speedbench]'") from None
    files = sorted(folder.rglob("*.parquet"))
    if not files:
        raise CheckpointNotFoundError(f"{folder}: no parquet files (a SPEED-Bench folder holds its splits' parquet)",
                                      path=str(folder))
    pools: dict[tuple[str | None, str], list[tuple[str, str]]] = {}
    for file in files:
        try:
            table = pq.read_table(file)
        except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
            raise CheckpointNotFoundError(f"{file}: not a readable parquet file ({type(e).__name__})",
                                          path=str(file)) from None
        missing = [c for c in ("category", "turns") if c not in table.column_names]
        if missing:
            raise CheckpointNotFoundError(f"{file}: no '{missing[0]}' column (SPEED-Bench rows have category and "
                                          "turns)", path=str(file))
        bucket = re.search(r"throughput_(\d+k)", str(file.relative_to(folder)))
        ids = table.column("question_id").to_pylist() if "question_id" in table.column_names else None
        for i, (cat, turns) in enumerate(zip(table.column("category").to_pylist(), table.column("turns").to_pylist(),
                                             strict=True)):
            qid = ids[i] if ids else f"row {i}"
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise CheckpointNotFoundError(f"{file}: {qid}: 'turns' is not a list of texts", path=str(file))
            if SPEED_PLACEHOLDER in turns[0]:
                raise CheckpointNotFoundError(
                    f"{file}: {qid}: a placeholder, not a prompt (the public repo withholds restricted sources)",
                    path=str(file), hint="rebuild the prompts with ModelOpt's specdec_bench prepare_data.py "
                                         "--dataset speed, then point --prompts at that folder")
            pools.setdefault((bucket.group(1) if bucket else None, str(cat)), []).append((str(qid), turns[0]))
    picked: list[tuple[str | None, str, str]] = []
    queues = {key: list(rows) for key, rows in sorted(pools.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))}
    while len(picked) < count and any(queues.values()):
        for (bucket_name, cat), rows in queues.items():
            if rows and len(picked) < count:
                picked.append((bucket_name, cat, rows.pop(0)[1]))
    chat = tokenizer is not None and getattr(tokenizer, "chat_template", None)
    prompts = [chat_ids(tokenizer, [{"role": "user", "content": text}]) if chat
               else tokenizer(text, add_special_tokens=True).input_ids for _, _, text in picked]
    if length is not None:
        prompts = at_length(prompts, length)
    _fits(str(folder), prompts, max_tokens, max_model_len, k)
    cats = sorted({c for _, c, _ in picked})
    return PromptSet(str(folder), prompts, f"{len(prompts)} SPEED-Bench prompts over {len(cats)} categories "
                     f"({'chat template' if chat else 'plain text'}, first turn)",
                     [{"category": c, "bucket": b} for b, c, _ in picked])


# ------------------------------------------------------------------------------------ text for measurement

def measurement_text(text: str | None = None) -> tuple[str, str, str]:
    """(the text calibration reads, the text the probe and parity read after it, description): the given text,
    else the bundled calibration text; then held-out code, so a long read never runs out."""
    head = text if text is not None else CALIBRATION.read_text()
    tail = "\n" + HELDOUT.read_bytes().decode("utf-8", errors="replace")[:200_000]
    return head, tail, "given text" if text is not None else "bundled text"


def text_token_ids(tokenizer: Any, vocab_size: int, text: str) -> list[int]:
    """`text` as the target's token ids; without a tokenizer, its UTF-8 bytes as ids (byte-level
    vocabularies), clipped to the vocabulary."""
    if tokenizer is not None:
        return list(tokenizer(text, add_special_tokens=True).input_ids)
    return [b % vocab_size for b in text.encode("utf-8")]


def heldout_prompts(tokenizer: Any, count: int, length: int, seed: int) -> list[list[int]]:
    """`count` windows of `length` tokens at seeded offsets of the held-out code (never the calibration text)."""
    text = HELDOUT.read_bytes().decode("utf-8", errors="replace")
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        start = rng.randrange(0, max(1, len(text) - 8 * length))
        prompts.append(tokenizer(text[start: start + 8 * length], add_special_tokens=False).input_ids[:length])
    return prompts
