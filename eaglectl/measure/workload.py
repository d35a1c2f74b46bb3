"""Workloads: the prompts smoke, drift and capture run, as token ids of the target's tokenizer.

Built-in sets (bundled text), a JSONL file, or a local SPEED-Bench folder (parquet with `category` and
`turns`, prepared by the user: its prompts are licensed for evaluation and never shipped or downloaded
here). `at_length` makes prompts of an exact length for the context-length axes.

A prompt file is untrusted input, read by one bounded reader (`prompt_lines`, also behind drift's
`--templates`): the file and each line within their size limits, strict UTF-8, every line a JSON
object through the bounded JSON parser, fields of the right types (`prompt` a string,
`prompt_token_ids` integer ids, `messages` role/content objects), token ids within the target's
vocabulary, 1 to `prompt_tokens` tokens per prompt. Any problem is a PromptFileError naming the
file and line (exit 20), never a crash.

This module is also the one home of the bundled text (`data/`): the calibration text and held-out code
that the probe, the parity inputs and calibration read (`measurement_text`, `text_token_ids`, whose
byte-token fallback serves a target without a tokenizer, and `heldout_prompts`).
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import (
    CorruptCheckpointError,
    IncompatibleDrafterError,
    MissingDependencyError,
    PromptFileError,
    UsageError,
    filesystem_error,
)
from ..io.bounded import open_regular, walk
from ..io.jsonio import loads
from ..limits import limit
from ..model.tokens import PlainTokenizer
from . import kinds

DATA = Path(__file__).parents[1] / "data"
HELDOUT = DATA / "heldout-code.txt"
CALIBRATION = DATA / "calibration.txt"
SPEED_PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED"  # the public repo's stand-in for restricted prompts


@dataclass
class PromptSet:
    name: str
    prompts: list[list[int]]
    description: str
    labels: list[dict[str, Any]] = field(default_factory=list)  # per prompt: SPEED-Bench category, bucket


PROMPT_TOKENS = 64  # tokens of each bundled prompt (builtin:short's windows, the kinds' seed prompts)
BUILTIN_PROMPTS = ("short", "long", "calibration", *kinds.SEEDED)
TEMPLATES = ("training", "changed", "none")  # drift --templates: the chat template as trained, changed, none


def _calibration_windows(tokenizer: Any, count: int, length: int) -> PromptSet:
    head, tail, _ = measurement_text()
    ids = tokenizer(head + tail, add_special_tokens=False).input_ids
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    step = length - len(bos)
    prompts = [bos + ids[i * step:(i + 1) * step] for i in range(count) if (i + 1) * step <= len(ids)]
    if not prompts:
        raise PromptFileError(f"builtin:calibration: the bundled text has {len(ids)} tokens, "
                              f"fewer than one window of {length}")
    return PromptSet("builtin:calibration", prompts, f"{len(prompts)} consecutive windows of {length} tokens of "
                     "the bundled calibration text, then held-out code")


def load_prompts(spec: str, tokenizer: Any, *, count: int, max_tokens: int, max_model_len: int, k: int,
                 seed: int, length: int | None = None, vocab: int | None = None) -> PromptSet:
    """`builtin:short`, `builtin:long` (held-out code), `builtin:calibration` (consecutive windows of the
    bundled calibration text, then held-out code: what calibration and the probe read), or a JSONL
    file of {"prompt"} / {"messages"} / {"prompt_token_ids"}. With `length`, every prompt has exactly
    that many tokens (`at_length`). `vocab` (the target's) bounds every token id."""
    if length is not None and length + max_tokens + k + 2 > max_model_len:
        raise UsageError(f"a context of {length} tokens leaves no room for {max_tokens} new tokens in "
                         f"max_model_len {max_model_len}")
    if Path(spec).is_dir():
        return _speed_bench(Path(spec), tokenizer, count, max_tokens, max_model_len, k, length, vocab)
    if spec.startswith("builtin:"):
        return _builtin(spec, tokenizer, count, max_model_len - max_tokens - k - 2, seed, length, vocab)
    path = Path(spec)
    room = None if length is not None else max_model_len - max_tokens - k - 2  # at_length reads whole prompts
    prompts = [prompt_ids(where, obj, tokenizer, vocab, room) for where, obj in prompt_lines(spec, count)]
    if not prompts:
        raise PromptFileError(f"{spec}: no prompts (every line is blank)", path=spec)
    if length is not None:
        return PromptSet(str(path), at_length(prompts, length), f"{len(prompts)} prompts from {path.name}, each "
                         f"truncated or continued with the following prompts to {length} tokens")
    _fits(spec, prompts, max_tokens, max_model_len, k)
    return PromptSet(str(path), prompts, f"{len(prompts)} prompts from {path.name}")


def _builtin(spec: str, tokenizer: Any, count: int, room: int, seed: int, length: int | None,
             vocab: int | None) -> PromptSet:
    """A built-in set; `room`: the most prompt tokens max_model_len leaves."""
    kind = spec.split(":", 1)[1]
    if kind not in BUILTIN_PROMPTS:
        raise PromptFileError(f"{spec}: built-in prompt sets are " + ", ".join(f"builtin:{b}" for b in BUILTIN_PROMPTS))
    if tokenizer is None:
        raise MissingDependencyError("built-in prompts need the target's tokenizer (tokenizer.json)")
    if kind == "calibration":
        ps = _calibration_windows(tokenizer, count, length or room)
        for i, p in enumerate(ps.prompts):
            check_ids(f"{spec} (window {i})", p, vocab)
        return ps
    if kind in kinds.SEEDED:  # the report prompts of a kind of text: what upgrade reports that kind on
        got = kinds.seed_prompts(tokenizer, kind, "report", count, min(room, PROMPT_TOKENS))
        if length:
            got = at_length(got, length)
        return PromptSet(spec, [check_ids(f"{spec} (prompt {i})", ids, vocab) for i, ids in enumerate(got)],
                         f"{len(got)} {kind} prompts (eaglectl's seed prompts, the report role of measure/kinds.py)")
    n = count if kind == "short" or length else max(1, count // 4)
    length = length or (PROMPT_TOKENS if kind == "short" else max(PROMPT_TOKENS, room))
    prompts = [check_ids(f"{spec} (prompt {i})", ids, vocab)
               for i, ids in enumerate(heldout_prompts(tokenizer, n, length, seed))]
    return PromptSet(spec, prompts, f"{n} held-out code windows of {length} tokens (seed {seed})")


_KIND = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
         bool: "true or false", type(None): "null"}


def _opened(spec: str) -> BinaryIO:
    """The prompt file, opened for binary reads after its kind and size are checked (io/bounded.py: a FIFO or
    device is refused before it is opened)."""

    if not Path(spec).exists():
        raise PromptFileError(f"{spec}: prompt file not found", path=spec)
    f = open_regular(spec, lambda p, why: PromptFileError(f"{p}: {why} (a JSONL prompt file, a SPEED-Bench folder or "
                                                          "builtin:...)", path=p),
                     limit("prompt_file_bytes"), doing="read the prompt file")
    if os.fstat(f.fileno()).st_size == 0:
        f.close()
        raise PromptFileError(f"{spec}: the prompt file is empty", path=spec)
    return f


def _raw_lines(spec: str) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes without the newline) of each line, each within the line limit."""
    cap = limit("prompt_line_bytes")
    with _opened(spec) as f:
        lineno = 0
        while True:
            try:
                raw = f.readline(cap + 2)
            except OSError as e:
                raise filesystem_error(e, "read the prompt file", spec) from None
            if not raw:
                return
            lineno += 1
            line = raw.rstrip(b"\r\n")
            if len(line) > cap:
                raise PromptFileError(f"{spec}:{lineno}: a line of more than {cap} bytes (the limit for one prompt "
                                      "line)", path=spec)
            yield lineno, line


def prompt_lines(spec: str, count: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """("FILE:LINE", object) for each non-blank line of a JSONL prompt file, up to `count` (0: all, within
    the `prompts_per_file` limit); any line that is not a JSON object is a PromptFileError naming it."""
    n = 0
    for lineno, line in _raw_lines(spec):
        if not line.strip():
            continue
        where = f"{spec}:{lineno}"
        try:
            obj = loads(line, where, max_bytes=limit("prompt_line_bytes"))
        except CorruptCheckpointError as e:
            raise PromptFileError(e.message, path=spec) from None
        if not isinstance(obj, dict):
            raise PromptFileError(f"{where}: a prompt line must be a JSON object ({{\"prompt\": ...}}, "
                                  f"{{\"messages\": ...}} or {{\"prompt_token_ids\": ...}}), not "
                                  f"{_KIND.get(type(obj), type(obj).__name__)}", path=spec)
        n += 1
        if n > limit("prompts_per_file"):
            raise PromptFileError(f"{spec}: more than {limit('prompts_per_file')} prompts (the limit)", path=spec)
        yield where, obj
        if count and n >= count:
            return


def _text(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise PromptFileError(f"{where}: '{key}' must be a string, not {_KIND.get(type(value), type(value).__name__)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PromptFileError(f"{where}: '{key}' holds a lone surrogate (not encodable text)") from None
    return value


def messages_of(where: str, value: Any) -> list[dict[str, str]]:
    """Chat messages: 1 to `prompt_messages` objects with a string `role` and a string `content`."""
    cap = limit("prompt_messages")
    if not isinstance(value, list) or not 1 <= len(value) <= cap:
        raise PromptFileError(f"{where}: 'messages' must be a list of 1 to {cap} {{\"role\", \"content\"}} objects")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise PromptFileError(f"{where}: messages[{i}] must be an object with 'role' and 'content'")
        out.append({"role": _text(where, f"messages[{i}].role", m["role"]),
                    "content": _text(where, f"messages[{i}].content", m["content"])})
    return out


def text_fits(where: str, texts: list[str], room: int | None = None) -> None:
    """Refuse, before tokenizing, prompt text that cannot fit the tokens a prompt may have (`room`, the most
    max_model_len leaves it, within `prompt_tokens`): no token spans more than `prompt_token_bytes` bytes, so a
    longer text has more tokens than that; tokenizing it would only cost memory (a 5 MB line: over 1 GB)."""
    most = limit("prompt_tokens") if room is None else max(1, min(room, limit("prompt_tokens")))
    per = limit("prompt_token_bytes")
    size = sum(len(t.encode("utf-8")) for t in texts)
    if size > most * per:
        raise PromptFileError(f"{where}: a prompt of {size} bytes has more than the {most} tokens it may have here "
                              f"(no token spans more than {per} bytes); refused before tokenizing",
                              hint=None if room is None or room >= limit("prompt_tokens") else
                              "shorten the prompt, or pass a larger --max-model-len")


def prompt_ids(where: str, obj: dict[str, Any], tokenizer: Any, vocab: int | None, room: int | None = None
               ) -> list[int]:
    """One prompt line's token ids; texts are checked against `room` (`text_fits`) before they are tokenized."""
    if "prompt_token_ids" in obj:
        ids = obj["prompt_token_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise PromptFileError(f"{where}: 'prompt_token_ids' must be a list of integer token ids")
    elif "prompt" in obj:
        text = _text(where, "prompt", obj["prompt"])
        if tokenizer is None:
            raise PromptFileError(f"{where}: a 'prompt' text needs the target's tokenizer; give 'prompt_token_ids'")
        text_fits(where, [text], room)
        ids = tokenizer(text, add_special_tokens=True).input_ids
    elif "messages" in obj:
        msgs = messages_of(where, obj["messages"])
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise PromptFileError(f"{where}: chat 'messages' need a target tokenizer with a chat template; give "
                                  "'prompt' or 'prompt_token_ids'")
        text_fits(where, [m["content"] for m in msgs], room)
        ids = chat_ids(tokenizer, msgs, where)
    else:
        raise PromptFileError(f"{where}: needs a 'prompt' text, chat 'messages' (target with a chat template) or "
                              "'prompt_token_ids'")
    return check_ids(where, list(ids), vocab)


def check_ids(where: str, ids: list[int], vocab: int | None) -> list[int]:
    cap = limit("prompt_tokens")
    if not 1 <= len(ids) <= cap:
        raise PromptFileError(f"{where}: a prompt of {len(ids)} tokens (1 to {cap})")
    bound = vocab or limit("config_int")
    bad = next((t for t in ids if not 0 <= t < bound), None)
    if bad is not None:
        raise PromptFileError(f"{where}: token id {bad} is outside the target's vocabulary [0, {bound})")
    return ids


def template_prompts(path: str, tokenizer: Any, template: str, system_prompt: str, count: int,
                     vocab: int | None = None) -> list[list[int]]:
    """The chat prompts of a JSONL `messages` file under the training template (as written), a changed
    system prompt, or none. Read by `prompt_lines` (the same checks as every prompt file): drift's `--templates`."""
    if template not in TEMPLATES:
        raise UsageError(f"template '{template}' is not one of {', '.join(TEMPLATES)}")
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise IncompatibleDrafterError("--templates needs a target tokenizer with a chat template",
                                       hint="give a target whose tokenizer_config.json has a chat_template")
    out = []
    for where, obj in prompt_lines(path, count):
        if "messages" not in obj:
            raise PromptFileError(f"{where}: --templates needs chat 'messages'", path=path)
        messages = messages_of(where, obj["messages"])
        text_fits(where, [m["content"] for m in messages] + [system_prompt])
        rest = [m for m in messages if m["role"] != "system"]
        if template == "changed":
            messages = [{"role": "system", "content": system_prompt}, *rest]
        elif template == "none":
            messages = rest
        out.append(check_ids(where, chat_ids(tokenizer, messages, where), vocab))
    if not out:
        raise PromptFileError(f"{path}: no prompts", path=path)
    return out


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


def tokenizer_of(target: str, chat: bool = False) -> Any:
    from ..model.hf import _local_folder

    folder = Path(_local_folder(target))
    if not chat and (folder / "tokenizer.json").exists():
        return PlainTokenizer(folder / "tokenizer.json")  # tokenizer.json alone: no transformers import
    if not any((folder / n).exists() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def _fits(name: str, prompts: list[list[int]], max_tokens: int, max_model_len: int, k: int) -> None:
    too_long = [len(p) for p in prompts if len(p) + max_tokens + k + 2 > max_model_len]
    if too_long:
        raise PromptFileError(f"{name}: a prompt of {too_long[0]} tokens leaves no room for {max_tokens} "
                              f"new tokens in max_model_len {max_model_len}", path=name,
                              hint=f"pass --max-model-len {max(too_long) + max_tokens + k + 2} or more")


def chat_ids(tokenizer: Any, messages: list[dict[str, Any]], where: str = "prompt") -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template, with the generation prompt (transformers 5
    returns an encoding, 4 a list). A template that refuses the messages (it may raise) is a PromptFileError."""
    try:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(t) for t in ids]
    except Exception as e:  # noqa: BLE001 - a chat template is code from the target (jinja raise_exception, ...)
        text = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise PromptFileError(f"{where}: the target's chat template refused these messages ({text})") from None


def needs_chat(spec: str) -> bool:
    """Whether the prompts go through the tokenizer's chat template (JSONL messages, SPEED-Bench turns).
    Streams the lines (a bad file is reported by the reader, not here)."""
    path = Path(spec)
    if path.is_dir():
        return True
    try:
        return any(b'"messages"' in line for _, line in _raw_lines(spec)) if path.is_file() else False
    except PromptFileError:
        return False


def _speed_bench(folder: Path, tokenizer: Any, count: int, max_tokens: int, max_model_len: int, k: int,
                 length: int | None, vocab: int | None = None) -> PromptSet:
    """A user-prepared SPEED-Bench folder: every parquet file under it; the first turn of each row, as a
    user message (chat template when the target has one), balanced round-robin over categories (and
    throughput buckets, named by `throughput_<N>k` in the path) up to `count` prompts."""
    try:
        import pyarrow.parquet  # noqa: F401 - read by _parquet
    except ImportError:
        raise MissingDependencyError("reading a SPEED-Bench folder needs pyarrow",
                                     hint="pip install 'eaglectl-cli[speedbench]'") from None

    def fail(path: str, why: str) -> PromptFileError:
        return PromptFileError(f"{path}: {why}", path=path)

    # iterative and bounded (tree_depth, tree_entries): a folder 1,500 levels deep is refused, not a RecursionError
    files = [e.path for e in walk(folder, fail, follow_links=True) if e.rel.endswith(".parquet")]
    if not files:
        raise PromptFileError(f"{folder}: no parquet files (a SPEED-Bench folder holds its splits' parquet)",
                              path=str(folder))
    pools: dict[tuple[str | None, str], list[tuple[str, str]]] = {}
    rows_read = 0
    for file in files:
        table = _parquet(file)
        bucket = re.search(r"throughput_(\d+k)", str(file.relative_to(folder)))
        ids = table.column("question_id").to_pylist() if "question_id" in table.column_names else None
        rows_read += table.num_rows
        if rows_read > limit("prompts_per_file"):
            raise PromptFileError(f"{folder}: more than {limit('prompts_per_file')} rows (the limit)", path=str(folder))
        for i, (cat, turns) in enumerate(zip(table.column("category").to_pylist(), table.column("turns").to_pylist(),
                                             strict=True)):
            qid = ids[i] if ids else f"row {i}"
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise PromptFileError(f"{file}: {qid}: 'turns' is not a list of texts", path=str(file))
            _text(f"{file}: {qid}", "turns[0]", turns[0])
            if len(turns[0].encode("utf-8")) > limit("prompt_line_bytes"):
                raise PromptFileError(f"{file}: {qid}: a first turn of more than {limit('prompt_line_bytes')} bytes",
                                      path=str(file))
            text_fits(f"{file}: {qid}", [turns[0]], None if length is not None else max_model_len - max_tokens - k - 2)
            if SPEED_PLACEHOLDER in turns[0]:
                raise PromptFileError(
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
    if not picked:
        raise PromptFileError(f"{folder}: no prompts (the parquet files hold no rows)", path=str(folder))
    if tokenizer is None:
        raise PromptFileError(f"{folder}: SPEED-Bench turns are text: the target needs a tokenizer")
    chat = getattr(tokenizer, "chat_template", None)
    prompts = [check_ids(f"{folder}: {cat} prompt {i}", chat_ids(tokenizer, [{"role": "user", "content": text}],
                                                                   f"{folder}: {cat}") if chat
                          else tokenizer(text, add_special_tokens=True).input_ids, vocab)
               for i, (_, cat, text) in enumerate(picked)]
    if length is not None:
        prompts = at_length(prompts, length)
    _fits(str(folder), prompts, max_tokens, max_model_len, k)
    cats = sorted({c for _, c, _ in picked})
    return PromptSet(str(folder), prompts, f"{len(prompts)} SPEED-Bench prompts over {len(cats)} categories "
                     f"({'chat template' if chat else 'plain text'}, first turn)",
                     [{"category": c, "bucket": b} for b, c, _ in picked])


def _parquet(file: Path) -> Any:
    """One SPEED-Bench parquet file: within the size limit, `category` and `turns` columns of the right
    kinds (strings; a list of strings), read with only the columns used."""
    import pyarrow as pa
    import pyarrow.parquet as pq


    # a FIFO or device named *.parquet is refused before it is opened; pyarrow reads the descriptor checked here
    with open_regular(file, lambda p, why: PromptFileError(f"{p}: {why}", path=p), limit("prompt_file_bytes")) as f:
        return _parquet_table(file, f, pa, pq)


def _parquet_table(file: Path, f: BinaryIO, pa: Any, pq: Any) -> Any:
    try:
        schema = pq.read_schema(f)
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise PromptFileError(f"{file}: not a readable parquet file ({type(e).__name__})", path=str(file)) from None
    missing = [c for c in ("category", "turns") if c not in schema.names]
    if missing:
        raise PromptFileError(f"{file}: no '{missing[0]}' column (SPEED-Bench rows have category and turns)",
                              path=str(file))
    turns = schema.field("turns").type
    if not (pa.types.is_list(turns) or pa.types.is_large_list(turns)) or not (
            pa.types.is_string(turns.value_type) or pa.types.is_large_string(turns.value_type)):
        raise PromptFileError(f"{file}: 'turns' is {turns}, not a list of strings (SPEED-Bench schema)",
                              path=str(file))
    if not (pa.types.is_string(schema.field("category").type) or pa.types.is_large_string(
            schema.field("category").type)):
        raise PromptFileError(f"{file}: 'category' is {schema.field('category').type}, not a string (SPEED-Bench "
                              "schema)", path=str(file))
    columns = ["category", "turns"] + (["question_id"] if "question_id" in schema.names else [])
    try:
        f.seek(0)
        return pq.read_table(f, columns=columns)
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise PromptFileError(f"{file}: not a readable parquet file ({type(e).__name__})", path=str(file)) from None


# ------------------------------------------------------------------------------------ text for measurement

def measurement_text(text: str | None = None) -> tuple[str, str, str]:
    """(the text calibration reads, the text the probe and parity read after it, description): the given text,
    else the bundled calibration text; then held-out code, so a long read never runs out."""
    head = text if text is not None else CALIBRATION.read_text()
    tail = "\n" + _heldout_text()[:200_000]
    return head, tail, "given text" if text is not None else "bundled text"


def text_token_ids(tokenizer: Any, vocab_size: int, text: str) -> list[int]:
    """`text` as the target's token ids; without a tokenizer, its UTF-8 bytes as ids (byte-level
    vocabularies), clipped to the vocabulary."""
    if tokenizer is not None:
        return list(tokenizer(text, add_special_tokens=True).input_ids)
    return [b % vocab_size for b in text.encode("utf-8")]


def heldout_prompts(tokenizer: Any, count: int, length: int, seed: int,
                    avoid: Sequence[tuple[int, int]] = ()) -> list[list[int]]:
    """`count` windows of `length` tokens at seeded offsets of the held-out code (never the calibration text),
    none overlapping a span of `avoid` (`heldout_spans`)."""
    text = _heldout_text()
    return [tokenizer(text[a:b], add_special_tokens=False).input_ids[:length]
            for a, b in heldout_spans(count, length, seed, avoid)]


def heldout_spans(count: int, length: int, seed: int, avoid: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """The character spans `heldout_prompts` reads: seeded windows of 8·length characters, a draw that overlaps
    a span of `avoid` drawn again (with nothing to avoid, the same windows as ever). What one role reads (the
    prompts an upgrade reports on) is thereby never what another read (the prompts it ranked or fitted on)."""
    size, width = len(_heldout_text()), 8 * length
    rng = random.Random(seed)  # noqa: S311 - seeded windows of text, not a secret
    spans: list[tuple[int, int]] = []
    for _ in range(1000 * count):
        if len(spans) == count:
            break
        start = rng.randrange(0, max(1, size - width))
        if not any(start < b and a < start + width for a, b in avoid):
            spans.append((start, start + width))
    if len(spans) < count:
        raise UsageError(f"the bundled held-out code has no room for {count} more windows of {length} tokens")
    return spans


def _heldout_text() -> str:
    """The bundled held-out code (never calibration text), undecodable bytes replaced."""
    return HELDOUT.read_bytes().decode("utf-8", errors="replace")
