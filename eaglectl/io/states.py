"""Captured target states (`--states DIR`): vLLM's hidden-states dump layout, read one request at a time.

A states folder holds one safetensors file per request — `token_ids` [seq] (int64) and
`hidden_states` [seq, n_layers, hidden] (layers in ascending boundary-id order, as vLLM writes them)
— plus `capture.json`, which says which boundary ids the layers are and what the target is. It is
written by `eaglectl capture` (either engine), or by a user's own `vllm serve` with the
`extract_hidden_states` method and the hidden-states connector (then `capture.json` comes from
`eaglectl capture --print-recipe`). Files are read one at a time, so memory is flat in the number of
requests; never torch.

Every value is checked here (`open_states`, `States._read`), before any consumer (probe, calibration, verify,
drift) sees it (docs/errors.md#input-limits); a problem is an InvalidStatesError naming the file and tensor
(exit 19).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    IncompatibleDrafterError,
    InvalidStatesError,
    filesystem_error,
)
from ..limits import limit
from .jsonio import ConfigView, load_object
from .safetensors import LocalFile, read_header, read_tensor

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

CAPTURE_JSON = "capture.json"
SCHEMA = "eaglectl.capture/1"
INT_DTYPES = ("I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64")
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


# targets whose decoder input is the embedding row scaled (boundary 0 is then not the table's row)
SCALED_EMBEDDINGS = ("gemma", "gemma2", "gemma3", "gemma3_text", "granite", "minicpm")


@dataclass
class Request:
    name: str
    token_ids: NDArray[np.int64]  # [seq]
    hidden: NDArray[np.floating]  # [seq, n_layers, hidden]
    target_argmax: NDArray[np.int64] | None = None  # [seq]: the target's greedy next token after each position

    @property
    def labels(self) -> NDArray[np.int64]:
        """The target's next token after each position when the capture recorded it, else the text's
        next token (one position shorter)."""
        return self.target_argmax if self.target_argmax is not None else self.token_ids[1:]


@dataclass(frozen=True)
class Continued:
    """A capture of greedy continuations (`eaglectl capture --max-tokens`): request i is prompt i (its first
    `prompt_lengths[i]` tokens), then the target's greedy continuation of `max_tokens` + `k` tokens."""

    max_tokens: int
    k: int
    prompt_lengths: tuple[int, ...]


@dataclass
class States:
    root: Path
    meta: dict[str, Any]
    layer_ids: tuple[int, ...]  # boundary ids of the hidden_states layers, in order
    files: list[Path]
    num_layers: int  # the target's num_hidden_layers (checked)
    hidden_size: int  # the target's hidden_size: the width of every state (checked)
    vocab_size: int | None = None  # the target's vocab_size when capture.json records it (checked)
    continuation: Continued | None = None  # each request continued greedily (checked here; lengths when read)

    @property
    def target_config(self) -> ConfigView:
        """The target's (text) config as capture.json records it."""
        view = ConfigView(self.meta.get("target_config"), f"{self.root}/{CAPTURE_JSON}:target_config")
        return view.sub("text_config") if view.dict("text_config") is not None else view

    @property
    def target(self) -> str | None:
        t = self.meta.get("target")
        return t if isinstance(t, str) else None

    def require(self, ids: tuple[int, ...]) -> None:
        missing = sorted(set(ids) - set(self.layer_ids))
        if missing:
            raise IncompatibleDrafterError(
                f"{self.root}: the capture holds boundaries {list(self.layer_ids)}, not {missing}",
                hint=f"capture again with --layers {','.join(map(str, sorted(set(ids) | set(self.layer_ids))))}")

    def requests(self, ids: tuple[int, ...] | None = None, which: slice = slice(None),
                 vocab: int | None = None) -> Iterator[Request]:
        """Each request's tokens and states (only the layers `ids`, in that order, when given), checked:
        `vocab` (the drafter's, when the consumer knows it) bounds the token ids with the capture's own."""
        if ids is not None:
            self.require(ids)
        index = [self.layer_ids.index(i) for i in ids] if ids is not None else None
        known = [v for v in (self.vocab_size, vocab) if v]  # token ids are below the smaller vocabulary
        bound = min(known) if known else limit("config_int")
        for path in self.files[which]:
            yield self._read(path, index, bound)

    def _read(self, path: Path, index: list[int] | None, bound: int) -> Request:

        where = str(path)
        try:
            src = LocalFile(path)
            header = read_header(src)
        except CorruptCheckpointError as e:
            raise InvalidStatesError(e.message, file=where) from None
        tensors = header.tensors
        for name in ("token_ids", "hidden_states"):
            if name not in tensors:
                raise InvalidStatesError(f"{path}: no '{name}' tensor (not a hidden-states dump)", file=where)
        tok, hid, arg = tensors["token_ids"], tensors["hidden_states"], tensors.get("target_argmax")
        if tok.dtype not in INT_DTYPES or len(tok.shape) != 1:
            raise InvalidStatesError(f"{path}: token_ids is {tok.dtype} {list(tok.shape)}; a dump stores integer "
                                     "ids [seq]", file=where, tensor="token_ids")
        seq = tok.shape[0]
        if not 1 <= seq <= limit("capture_tokens"):
            raise InvalidStatesError(f"{path}: {seq} tokens (a request holds 1 to {limit('capture_tokens')})",
                                     file=where, tensor="token_ids")
        want = (seq, len(self.layer_ids), self.hidden_size)
        if hid.dtype not in FLOAT_DTYPES or tuple(hid.shape) != want:
            raise InvalidStatesError(
                f"{path}: hidden_states {hid.dtype} {list(hid.shape)} does not fit {seq} tokens x "
                f"{len(self.layer_ids)} layers x hidden {self.hidden_size} (capture.json) in a float dtype",
                file=where, tensor="hidden_states")
        if arg is not None and (arg.dtype not in INT_DTYPES or tuple(arg.shape) != (seq,)):
            raise InvalidStatesError(f"{path}: target_argmax {arg.dtype} {list(arg.shape)} does not fit {seq} "
                                     "tokens (integer ids)", file=where, tensor="target_argmax")
        try:
            tokens = _ids(path, "token_ids", read_tensor(src, header, "token_ids"), bound)
            argmax = _ids(path, "target_argmax", read_tensor(src, header, "target_argmax"), bound) \
                if arg is not None else None
            hidden = read_tensor(src, header, "hidden_states")
        except CorruptCheckpointError as e:
            raise InvalidStatesError(e.message, file=where) from None
        if hidden.dtype == np.float16:  # compared in float32: the limit does not fit a float16
            hidden = hidden.astype(np.float32)
        ok = np.abs(hidden) <= limit("state_abs")  # False for NaN and infinities too
        if not ok.all():
            t, layer, _ = (int(x) for x in np.argwhere(~ok)[0])
            v = float(hidden[t, layer, _])
            what = f"a non-finite value ({v})" if not np.isfinite(v) else \
                f"the value {v:.3g} (beyond the {limit('state_abs'):.0e} limit)"
            raise InvalidStatesError(f"{path}: hidden_states holds {what} at token {t}, boundary "
                                     f"{self.layer_ids[layer]}: a broken capture, refused", file=where,
                                     tensor="hidden_states")
        return Request(path.name, tokens, hidden[:, index] if index is not None else hidden, argmax)

    @property
    def labels_are(self) -> str:
        """'target' when the dumps hold the target's greedy next tokens, else 'text'."""
        try:
            header = read_header(LocalFile(self.files[0]))
        except CorruptCheckpointError as e:
            raise InvalidStatesError(e.message, file=str(self.files[0])) from None
        return "target" if "target_argmax" in header.tensors else "text"

    def embedding_source(self) -> str | None:
        """Why boundary 0 cannot stand in for the target's embedding table, or None when it can."""
        if 0 not in self.layer_ids:
            return "the capture has no boundary 0 (the embeddings); capture again with --layers including 0"
        model_type = self.target_config.str("model_type")
        if model_type in SCALED_EMBEDDINGS:
            return f"a {model_type} target scales its embeddings, so boundary 0 is not the table's rows"
        return None


def _ids(path: Path, name: str, values: NDArray[np.integer], bound: int) -> NDArray[np.int64]:
    """Integer ids as int64, each within [0, bound)."""

    bad = np.flatnonzero((values < 0) | (values >= bound))
    if bad.size:
        i = int(bad[0])
        raise InvalidStatesError(f"{path}: {name}[{i}] = {int(values[i])} is outside the vocabulary [0, {bound})",
                                 file=str(path), tensor=name)
    return values.astype(np.int64)


def compact_embedding(token_ids: NDArray[np.integer], h0: NDArray[np.floating]
                      ) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """(ids, table) with table[ids[t]] = h0[t]: the target's embedding rows of the tokens seen, read off
    boundary 0 (the decoder's input), so a drafter without its own table can run on a capture."""

    rows, index = np.unique(token_ids, return_inverse=True)
    table = np.zeros((len(rows), h0.shape[-1]), dtype=np.float32)
    table[index] = h0  # every occurrence of a token carries the same row
    return index.astype(np.int64), table


def open_states(folder: str) -> States:
    root = Path(folder)
    meta_path = root / CAPTURE_JSON
    if not root.is_dir():
        raise CheckpointNotFoundError(f"{folder}: no such states folder", path=folder)
    if not meta_path.is_file():
        raise CheckpointNotFoundError(f"{folder}: no {CAPTURE_JSON} (which layers, which target)", path=folder,
                                      hint="write one with: eaglectl capture TARGET --print-recipe --out DIR ...")
    where = str(meta_path)
    try:
        size = meta_path.stat().st_size
        if size > limit("json_bytes"):
            raise InvalidStatesError(f"{meta_path}: {size} bytes exceeds the {limit('json_bytes')}-byte limit",
                                     file=where)
        meta = load_object(meta_path.read_bytes(), where)
    except OSError as e:
        raise filesystem_error(e, "read", meta_path) from None
    except CorruptCheckpointError as e:
        raise InvalidStatesError(e.message, file=where) from None
    view = ConfigView(meta, where)
    ids = view.int_list("layer_ids", max_len=limit("capture_layers"), hi=limit("target_layers"))
    if ids is None or list(ids) != sorted(set(ids)) or not ids:
        raise InvalidStatesError(f"{meta_path}: 'layer_ids' must be ascending, distinct boundary ids (at most "
                                 f"{limit('capture_layers')})", file=where)
    if view.str("convention") not in (None, "boundary"):
        raise InvalidStatesError(f"{meta_path}: layer ids must be boundaries (vLLM's numbering)", file=where)
    if not isinstance(meta.get("target_config"), dict):
        raise InvalidStatesError(f"{meta_path}: 'target_config' must be an object (the target's config.json)",
                                 file=where)
    top = ConfigView(meta["target_config"], where, "target_config.")
    cfg = top.sub("text_config") if top.dict("text_config") is not None else top
    L = cfg.int("num_hidden_layers", lo=1, hi=limit("target_layers"))
    H = cfg.int("hidden_size", lo=1)
    V = cfg.int("vocab_size", lo=1)
    bad = next(iter(cfg.problems.values()), None)
    if bad is not None or L is None or H is None:
        raise InvalidStatesError(f"{meta_path}: " + (bad or f"{cfg.prefix}num_hidden_layers and hidden_size are "
                                                      "required (integers)"), file=where)
    if ids[-1] > L:
        raise InvalidStatesError(f"{meta_path}: layer_ids {list(ids)} go beyond boundary {L} of this {L}-layer "
                                 "target", file=where)
    files = _dumps(root)
    if not files:
        raise CheckpointNotFoundError(f"{folder}: no *.safetensors dumps", path=folder)
    return States(root, meta, tuple(ids), files, L, H, V, _continued(view, where, len(files)))


def _continued(view: ConfigView, where: str, count: int) -> Continued | None:
    """capture.json's `continuation` (max_tokens, k, one prompt length per request file), checked."""
    if not view.has("continuation"):
        return None
    c = view.sub("continuation")
    n, k = c.int("max_tokens", lo=1, hi=limit("capture_tokens")), c.int("k", lo=1, hi=16)
    lengths = c.int_list("prompt_lengths", max_len=limit("capture_requests"), hi=limit("capture_tokens"))
    bad = next(iter(c.problems.values()), None)
    if bad is not None or n is None or k is None or lengths is None:
        raise InvalidStatesError(f"{where}: " + (bad or "continuation needs max_tokens, k and prompt_lengths"),
                                 file=where)
    if len(lengths) != count or min(lengths) < 1:
        raise InvalidStatesError(f"{where}: continuation.prompt_lengths holds {len(lengths)} lengths for {count} "
                                 "request files (one positive length each)", file=where)
    return Continued(n, k, tuple(lengths))


def _dumps(root: Path) -> list[Path]:
    """The request files, counted as they are listed (a folder of millions stops at the limit)."""
    cap = limit("capture_requests")
    out = []
    try:
        with os.scandir(root) as it:
            for entry in it:
                if entry.name.endswith(".safetensors") and entry.is_file():
                    out.append(root / entry.name)
                    if len(out) > cap:
                        raise InvalidStatesError(f"{root}: more than {cap} request files (the limit)", path=str(root))
    except OSError as e:
        raise filesystem_error(e, "list", root) from None
    return sorted(out)
