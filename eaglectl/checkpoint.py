"""Open a drafter checkpoint lazily: a folder, one safetensors file, a sharded set, a `.bin`, or a Hub repo.

Only headers and `config.json` are read when a checkpoint is opened; tensor bytes are read one
tensor at a time on request (`Checkpoint.read`). torch is imported only for `.bin` files, which are
refused unless `allow_pickle` is set and are then loaded with `weights_only=True`.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import hub
from .errors import CheckpointNotFoundError, CorruptCheckpointError, PickleNotAllowedError
from .safetensors_io import (
    ByteSource,
    Header,
    LocalFile,
    TensorInfo,
    count_nonfinite,
    read_header,
    read_rows,
    read_tensor,
)

CONFIG_NAME = "config.json"
INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


@dataclass
class WeightFile:
    """One weight file: its tensors' headers and lazy access to their values."""

    name: str  # path relative to the checkpoint root
    source: ByteSource | None
    header: Header
    pickled: dict[str, Any] | None = None  # torch tensors of a `.bin`, loaded weights-only

    def read(self, tensor: str) -> Any:
        if self.pickled is not None:
            return _torch_to_numpy(self.pickled[tensor])
        assert self.source is not None
        return read_tensor(self.source, self.header, tensor)

    def read_rows(self, tensor: str, rows: list[int]) -> Any:
        if self.pickled is not None:
            return _torch_to_numpy(self.pickled[tensor][rows])
        assert self.source is not None
        return read_rows(self.source, self.header, tensor, rows)

    def count_nonfinite(self, tensor: str) -> int:
        if self.pickled is not None:
            import torch

            t = self.pickled[tensor]
            return int((~torch.isfinite(t)).sum()) if t.is_floating_point() else 0
        assert self.source is not None
        return count_nonfinite(self.source, self.header, tensor)


@dataclass
class Checkpoint:
    """A drafter checkpoint: config, weight files and where each tensor lives."""

    source: str  # as the user gave it
    root: str  # local folder (or Hub repo@sha) the names below are relative to
    layout: str  # "safetensors" | "sharded" | "pickle"
    files: list[WeightFile]
    tensor_file: dict[str, WeightFile]
    config: dict[str, Any] | None
    config_name: str | None
    index: dict[str, Any] | None = None
    index_name: str | None = None
    index_problems: list[tuple[str, str]] = field(default_factory=list)  # (locator, message)
    hub_ref: hub.HubRef | None = None
    file_names: tuple[str, ...] = ()  # every file in the checkpoint folder (for detection)

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        return {name: f.header.tensors[name] for name, f in self.tensor_file.items()}

    @property
    def metadata(self) -> dict[str, str] | None:
        return self.files[0].header.metadata if self.files else None

    def read(self, tensor: str) -> Any:
        """One tensor's values as a numpy array (BF16 widened to float32)."""
        return self.tensor_file[tensor].read(tensor)

    def read_rows(self, tensor: str, rows: list[int]) -> Any:
        return self.tensor_file[tensor].read_rows(tensor, rows)

    def count_nonfinite(self, tensor: str) -> int:
        return self.tensor_file[tensor].count_nonfinite(tensor)

    def locate(self, tensor: str) -> str:
        return f"{self.tensor_file[tensor].name}:{tensor}" if tensor in self.tensor_file else tensor


def open_checkpoint(source: str, *, allow_pickle: bool = False, revision: str | None = None,
                    weights_required: bool = True) -> Checkpoint:
    """Open `source`: a local path, or a Hub id (`org/name`, `org/name@rev`, `hf://org/name@rev/sub`).

    With `weights_required=False` a folder holding only `config.json` opens with no tensors
    (used for targets, where the config is what matters).
    """
    path = Path(source).expanduser()
    if path.exists():
        if revision:
            raise CheckpointNotFoundError(f"{source}: --revision applies to Hub repos, not local paths")
        return _open_local(source, path, allow_pickle, weights_required)
    ref = hub.parse_hub_id(source, revision)
    if ref is None:
        raise CheckpointNotFoundError(
            f"{source}: no such file or directory", path=source,
            hint="give a local folder or file, or a Hub id such as org/name or hf://org/name@rev",
        )
    resolved = hub.resolve(ref)
    if resolved.local_dir is not None:
        ckpt = _open_local(source, resolved.local_dir, allow_pickle, weights_required)
    else:
        ckpt = _open_remote(source, resolved, allow_pickle, weights_required)
    ckpt.hub_ref = resolved.ref
    return ckpt


# ------------------------------------------------------------------------------------- local

def _open_local(source: str, path: Path, allow_pickle: bool, weights_required: bool = True) -> Checkpoint:
    if path.is_dir():
        root = path
        names = tuple(sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()))
        entry = _pick_entry(root, names, weights_required)
    else:
        root = path.parent
        names = tuple(sorted(p.name for p in root.iterdir() if p.is_file()))
        entry = path.name
    config, config_name = _read_config(root / CONFIG_NAME if (root / CONFIG_NAME).is_file() else None)

    def opener(rel: str) -> WeightFile:
        file_path = root / rel
        if not file_path.is_file():
            raise CorruptCheckpointError(f"{file_path}: shard listed in the index is missing", file=str(file_path))
        return _open_weight_file(rel, LocalFile(file_path), file_path, allow_pickle)

    def index_reader(rel: str) -> bytes:
        return (root / rel).read_bytes()

    ckpt = _assemble(source, str(root), entry, opener, index_reader)
    ckpt.config, ckpt.config_name, ckpt.file_names = config, config_name, names
    return ckpt


def _pick_entry(root: Path | str, names: tuple[str, ...], weights_required: bool = True) -> str | None:
    """The weights entry among the files directly in the folder (subfolders are not searched)."""
    top = [n for n in names if "/" not in n]
    for preferred in ("model.safetensors.index.json", "model.safetensors",
                      "pytorch_model.bin.index.json", "pytorch_model.bin"):
        if preferred in top:
            return preferred
    for group in (
        [n for n in top if n.endswith(".safetensors.index.json")],
        [n for n in top if n.endswith(".safetensors")],
        [n for n in top if n.endswith(".bin.index.json")],
        [n for n in top if n.endswith(PICKLE_SUFFIXES)],
    ):
        if len(group) == 1:
            return group[0]
        if len(group) > 1:
            raise CorruptCheckpointError(
                f"{root}: several weight files ({', '.join(group[:4])}) and no index naming them",
                path=str(root), hint="point at one file or add a *.index.json",
            )
    if not weights_required:
        return None
    nested = [n for n in names if n.endswith((".safetensors", ".safetensors.index.json"))]
    hint = f"weights found in a subfolder: point at {posixpath.dirname(nested[0])}/" if nested else None
    raise CheckpointNotFoundError(f"{root}: no *.safetensors or *.bin weights found", path=str(root), hint=hint)


def _read_config(path: Path | None) -> tuple[dict[str, Any] | None, str | None]:
    if path is None:
        return None, None
    return parse_json_object(path.read_bytes(), str(path)), str(path)


def parse_json_object(raw: bytes, name: str) -> dict[str, Any]:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptCheckpointError(f"{name}: not valid JSON ({e})", file=name) from None
    if not isinstance(obj, dict):
        raise CorruptCheckpointError(f"{name}: expected a JSON object", file=name)
    return obj


def _open_weight_file(rel: str, source: ByteSource, path: Path | None, allow_pickle: bool) -> WeightFile:
    if rel.endswith(PICKLE_SUFFIXES):
        if not allow_pickle:
            raise PickleNotAllowedError(
                f"{source.name}: pickle checkpoint refused", file=source.name,
                hint="pass --allow-pickle to load it with torch.load(weights_only=True), "
                     "or convert it to safetensors",
            )
        if path is None:
            raise PickleNotAllowedError(f"{source.name}: remote pickle files are not read", file=source.name,
                                        hint="download the repo and inspect the local copy")
        return _open_pickle(rel, path)
    return WeightFile(rel, source, read_header(source))


def _open_pickle(rel: str, path: Path) -> WeightFile:
    import torch

    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:  # legacy (non-zip) torch.save files cannot be memory-mapped
            if "mmap" not in str(e):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch.load of an untrusted file can raise anything
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CorruptCheckpointError(f"{path}: cannot load weights-only ({first})", file=str(path)) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CorruptCheckpointError(f"{path}: expected a flat dict of tensors", file=str(path))
    tensors = {}
    for name, t in state.items():
        dtype = TORCH_TO_SAFETENSORS.get(str(t.dtype).removeprefix("torch."))
        if dtype is None:
            raise CorruptCheckpointError(f"{path}: tensor '{name}': unsupported dtype {t.dtype}", tensor=name)
        nbytes = t.numel() * t.element_size()
        tensors[name] = TensorInfo(name, dtype, tuple(t.shape), 0, nbytes)
    header = Header(str(path), tensors, None, 0, path.stat().st_size)
    return WeightFile(rel, None, header, pickled=state)


TORCH_TO_SAFETENSORS = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


def _torch_to_numpy(t: Any) -> Any:
    import torch

    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.detach().cpu().numpy()


# ------------------------------------------------------------------------------------ assemble

def _assemble(source: str, root: str, entry: str | None, opener: Any, index_reader: Any) -> Checkpoint:
    """Open the entry file (or every shard of an index) and map each tensor to its file."""
    if entry is None:
        return Checkpoint(source, root, "config-only", [], {}, None, None)
    if not entry.endswith(INDEX_SUFFIXES):
        wf = opener(entry)
        layout = "pickle" if wf.pickled is not None else "safetensors"
        return Checkpoint(source, root, layout, [wf], dict.fromkeys(wf.header.tensors, wf), None, None)

    index_name = entry
    index = parse_json_object(index_reader(entry), f"{root}/{entry}")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CorruptCheckpointError(f"{root}/{entry}: 'weight_map' must map tensor names to file names",
                                     file=entry)
    base = posixpath.dirname(entry)
    shard_names: list[str] = []
    for tensor, shard in weight_map.items():
        rel = _safe_join(base, shard)
        if rel is None:
            raise CorruptCheckpointError(
                f"{root}/{entry}: weight_map['{tensor}'] = '{shard}' escapes the checkpoint folder",
                file=entry, tensor=tensor,
            )
        if rel not in shard_names:
            shard_names.append(rel)
    files = [opener(rel) for rel in shard_names]
    by_name = {f.name: f for f in files}

    problems: list[tuple[str, str]] = []
    tensor_file: dict[str, WeightFile] = {}
    for f in files:
        for tensor in f.header.tensors:
            if tensor in tensor_file:
                problems.append((f"{f.name}:{tensor}", f"tensor '{tensor}' is stored in both "
                                 f"{tensor_file[tensor].name} and {f.name}"))
                continue
            listed = weight_map.get(tensor)
            if listed is None:
                problems.append((f"{f.name}:{tensor}", f"tensor '{tensor}' in {f.name} is not in the weight_map"))
            elif _safe_join(base, listed) != f.name:
                problems.append((f"{f.name}:{tensor}", f"weight_map puts '{tensor}' in {listed}, found in {f.name}"))
            tensor_file[tensor] = f
    for tensor, shard in weight_map.items():
        rel = _safe_join(base, shard)
        if tensor not in by_name[rel].header.tensors and tensor not in tensor_file:
            problems.append((f"{entry}:{tensor}", f"weight_map lists '{tensor}' in {shard}, which does not hold it"))
    total = (index.get("metadata") or {}).get("total_size")
    actual = sum(t.nbytes for f in files for t in f.header.tensors.values())
    if total is not None and total != actual:
        problems.append((f"{entry}:metadata.total_size", f"metadata.total_size is {total}, tensors hold {actual} bytes"))
    layout = "pickle" if any(f.pickled is not None for f in files) else "sharded"
    return Checkpoint(source, root, layout, files, tensor_file, None, None, index, index_name, problems)


def _safe_join(base: str, name: str) -> str | None:
    """`base/name` normalised, or None when it is absolute or leaves the checkpoint folder."""
    if name.startswith(("/", "\\")) or ":" in name or "\\" in name:
        return None
    joined = posixpath.normpath(posixpath.join(base, name))
    if joined == ".." or joined.startswith("../") or joined.startswith("/"):
        return None
    return joined


# -------------------------------------------------------------------------------------- remote

def _open_remote(source: str, resolved: hub.Resolved, allow_pickle: bool, weights_required: bool) -> Checkpoint:
    names = resolved.files
    entry = _pick_entry(resolved.ref.display, names, weights_required)
    config = None
    config_name = None
    if CONFIG_NAME in names:
        config_name = f"{resolved.ref.display}/{CONFIG_NAME}"
        config = parse_json_object(resolved.read_small(CONFIG_NAME), config_name)

    def opener(rel: str) -> WeightFile:
        if rel not in names:
            raise CorruptCheckpointError(f"{resolved.ref.display}/{rel}: shard listed in the index is missing",
                                         file=rel)
        return _open_weight_file(rel, resolved.remote_file(rel), None, allow_pickle)

    ckpt = _assemble(source, resolved.ref.display, entry, opener, resolved.read_small)
    ckpt.config, ckpt.config_name, ckpt.file_names = config, config_name, tuple(names)
    return ckpt
