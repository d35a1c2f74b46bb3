"""Captured target states (`--states DIR`): vLLM's hidden-states dump layout, read one request at a time.

A states folder holds one safetensors file per request — `token_ids` [seq] (int64) and
`hidden_states` [seq, n_layers, hidden] (layers in ascending boundary-id order, as vLLM writes them)
— plus `capture.json`, which says which boundary ids the layers are and what the target is. It is
written by `eaglectl capture` (either engine), or by a user's own `vllm serve` with the
`extract_hidden_states` method and the hidden-states connector (then `capture.json` comes from
`eaglectl capture --print-recipe`). Files are read one at a time, so memory is flat in the number of
requests; never torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointNotFoundError, CorruptCheckpointError, IncompatibleDrafterError, filesystem_error
from .jsonio import ConfigView, load_object
from .safetensors import LocalFile, read_header, read_tensor

CAPTURE_JSON = "capture.json"
SCHEMA = "eaglectl.capture/1"


# targets whose decoder input is the embedding row scaled (boundary 0 is then not the table's row)
SCALED_EMBEDDINGS = ("gemma", "gemma2", "gemma3", "gemma3_text", "granite", "minicpm")


@dataclass
class Request:
    name: str
    token_ids: Any  # numpy int64 [seq]
    hidden: Any  # numpy float32 [seq, n_layers, hidden]
    target_argmax: Any = None  # numpy int64 [seq]: the target's greedy next token after each position

    @property
    def labels(self) -> Any:
        """The target's next token after each position when the capture recorded it, else the text's
        next token (one position shorter)."""
        return self.target_argmax if self.target_argmax is not None else self.token_ids[1:]


@dataclass
class States:
    root: Path
    meta: dict[str, Any]
    layer_ids: tuple[int, ...]  # boundary ids of the hidden_states layers, in order
    files: list[Path]

    @property
    def target_config(self) -> ConfigView:
        return ConfigView(self.meta.get("target_config"), f"{self.root}/{CAPTURE_JSON}:target_config")

    @property
    def target(self) -> str | None:
        t = self.meta.get("target")
        return t if isinstance(t, str) else None

    @property
    def num_layers(self) -> int | None:
        return self.target_config.int("num_hidden_layers", lo=1)

    @property
    def hidden_size(self) -> int | None:
        return self.target_config.int("hidden_size", lo=1)

    def require(self, ids: tuple[int, ...]) -> None:
        missing = sorted(set(ids) - set(self.layer_ids))
        if missing:
            raise IncompatibleDrafterError(
                f"{self.root}: the capture holds boundaries {list(self.layer_ids)}, not {missing}",
                hint=f"capture again with --layers {','.join(map(str, sorted(set(ids) | set(self.layer_ids))))}")

    def requests(self, ids: tuple[int, ...] | None = None, which: slice = slice(None)) -> Iterator[Request]:
        """Each request's tokens and states (only the layers `ids`, in that order, when given)."""
        import numpy as np

        if ids is not None:
            self.require(ids)
        index = [self.layer_ids.index(i) for i in ids] if ids is not None else None
        for path in self.files[which]:
            src = LocalFile(path)
            header = read_header(src)
            for name in ("token_ids", "hidden_states"):
                if name not in header.tensors:
                    raise CorruptCheckpointError(f"{path}: no '{name}' tensor (not a hidden-states dump)", file=str(path))
            tokens = np.asarray(read_tensor(src, header, "token_ids"), dtype=np.int64)
            hidden = read_tensor(src, header, "hidden_states")
            if hidden.ndim != 3 or hidden.shape[0] != tokens.shape[0] or hidden.shape[1] != len(self.layer_ids):
                raise CorruptCheckpointError(f"{path}: hidden_states {list(hidden.shape)} does not fit "
                                             f"{tokens.shape[0]} tokens x {len(self.layer_ids)} layers", file=str(path))
            argmax = None
            if "target_argmax" in header.tensors:
                argmax = np.asarray(read_tensor(src, header, "target_argmax"), dtype=np.int64)
                if argmax.shape != tokens.shape:
                    raise CorruptCheckpointError(f"{path}: target_argmax {list(argmax.shape)} does not fit "
                                                 f"{tokens.shape[0]} tokens", file=str(path))
            yield Request(path.name, tokens, hidden[:, index] if index is not None else hidden, argmax)

    @property
    def labels_are(self) -> str:
        """'target' when the dumps hold the target's greedy next tokens, else 'text'."""
        header = read_header(LocalFile(self.files[0]))
        return "target" if "target_argmax" in header.tensors else "text"

    def embedding_source(self) -> str | None:
        """Why boundary 0 cannot stand in for the target's embedding table, or None when it can."""
        if 0 not in self.layer_ids:
            return "the capture has no boundary 0 (the embeddings); capture again with --layers including 0"
        model_type = self.target_config.str("model_type")
        if model_type in SCALED_EMBEDDINGS:
            return f"a {model_type} target scales its embeddings, so boundary 0 is not the table's rows"
        return None


def compact_embedding(token_ids: Any, h0: Any) -> tuple[Any, Any]:
    """(ids, table) with table[ids[t]] = h0[t]: the target's embedding rows of the tokens seen, read off
    boundary 0 (the decoder's input), so a drafter without its own table can run on a capture."""
    import numpy as np

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
    try:
        meta = load_object(meta_path.read_bytes(), str(meta_path))
    except OSError as e:
        raise filesystem_error(e, "read", meta_path) from None
    view = ConfigView(meta, str(meta_path))
    ids = view.int_list("layer_ids", hi=1 << 16)
    if ids is None or list(ids) != sorted(set(ids)) or not ids:
        raise CorruptCheckpointError(f"{meta_path}: 'layer_ids' must be ascending, distinct boundary ids",
                                     file=str(meta_path))
    if view.str("convention") not in (None, "boundary"):
        raise CorruptCheckpointError(f"{meta_path}: layer ids must be boundaries (vLLM's numbering)", file=str(meta_path))
    files = sorted(p for p in root.glob("*.safetensors") if p.is_file())
    if not files:
        raise CheckpointNotFoundError(f"{folder}: no *.safetensors dumps", path=folder)
    return States(root, meta, tuple(ids), files)
