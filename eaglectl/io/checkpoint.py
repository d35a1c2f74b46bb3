"""Open a drafter checkpoint lazily: a folder, one safetensors file, a sharded set, a `.bin`, or a Hub repo.

Only headers and `config.json` are read when a checkpoint is opened; tensor bytes are read one
tensor at a time on request (`Checkpoint.read`). torch is imported only for `.bin` files, which are
refused unless `allow_pickle` is set and are then loaded with `weights_only=True`.
"""

from __future__ import annotations

import difflib
import os
import posixpath
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    PickleNotAllowedError,
    SourceChangedError,
    UsageError,
    filesystem_error,
)
from ..limits import limit
from . import hub
from .dtypes import FROM_TORCH
from .jsonio import ConfigView, load_object
from .safetensors import (
    ByteRange,
    ByteSource,
    Header,
    LocalFile,
    TensorInfo,
    count_nonfinite,
    file_identity,
    nonfinite_in,
    read_exact,
    read_header,
    read_rows,
    read_tensor,
)

if TYPE_CHECKING:
    import numpy as np
    import torch

CONFIG_NAME = "config.json"
INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


@dataclass
class WeightFile:
    """One weight file: its tensors' headers and lazy access to their values."""

    name: str  # path relative to the checkpoint root
    source: ByteSource | None
    header: Header
    pickled: dict[str, torch.Tensor] | None = None  # torch tensors of a `.bin`, loaded weights-only

    def read(self, tensor: str) -> np.ndarray:
        if self.pickled is not None:
            return _torch_to_numpy(self.pickled[tensor])
        assert self.source is not None
        return read_tensor(self.source, self.header, tensor)

    def byte_range(self, tensor: str) -> ByteRange | None:
        """The tensor's bytes as a local file range (None for remote or pickled files)."""
        if not isinstance(self.source, LocalFile):
            return None
        info = self.header.tensors[tensor]
        return ByteRange(self.source.path, self.header.data_start + info.begin, info.nbytes)


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
    index_problems: list[tuple[str, str]] = field(default_factory=list)  # (locator, message)
    hub_ref: hub.HubRef | None = None
    file_names: tuple[str, ...] = ()  # the files directly in the checkpoint folder (for detection)
    identities: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)  # local file -> identity

    @property
    def config_view(self) -> ConfigView:
        return ConfigView(self.config, self.config_name or f"{self.root}/config.json")

    def ensure_unchanged(self) -> None:
        """Raise SourceChangedError if a local file of this checkpoint was replaced or rewritten since
        it was opened (size, mtime, inode)."""
        for path, identity in self.identities.items():
            try:
                now = file_identity(os.stat(path))
            except OSError:
                now = None
            if now != identity:
                raise SourceChangedError(f"{path}: changed while eaglectl was reading it (size, mtime or inode "
                                         "differ); the output was discarded", path=path,
                                         hint="run again once the source is no longer being written")

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        return {name: f.header.tensors[name] for name, f in self.tensor_file.items()}

    def inputs(self) -> dict[str, Any]:
        """What a report says it read (`inputs` in inspect's JSON)."""
        out: dict[str, Any] = {"source": self.source, "root": self.root, "layout": self.layout,
                               "files": [f.name for f in self.files], "config": self.config_name}
        if self.hub_ref is not None:
            out["repo_id"] = self.hub_ref.repo_id
            out["revision"] = self.hub_ref.revision
            out["sha"] = self.hub_ref.sha
        return out

    @property
    def metadata(self) -> dict[str, str] | None:
        return self.files[0].header.metadata if self.files else None

    def read(self, tensor: str) -> np.ndarray:
        """One tensor's values as a numpy array (BF16 widened to float32)."""
        return self.tensor_file[tensor].read(tensor)

    def read_rows(self, tensor: str, rows: list[int]) -> np.ndarray:
        wf = self.tensor_file[tensor]
        if wf.pickled is not None:
            return _torch_to_numpy(wf.pickled[tensor][rows])
        assert wf.source is not None
        return read_rows(wf.source, wf.header, tensor, rows)

    def count_nonfinite(self, tensor: str) -> int:
        wf = self.tensor_file[tensor]
        if wf.pickled is not None:
            import torch

            t = wf.pickled[tensor]  # its bytes, read as the safetensors file would be (torch has no isfinite for FP8)
            return nonfinite_in(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(),
                                self.tensors[tensor].dtype)
        assert wf.source is not None
        return count_nonfinite(wf.source, wf.header, tensor)

    def locate(self, tensor: str) -> str:
        return f"{self.tensor_file[tensor].name}:{tensor}" if tensor in self.tensor_file else tensor


def open_checkpoint(source: str, *, allow_pickle: bool = False, revision: str | None = None,
                    weights_required: bool = True) -> Checkpoint:
    """Open `source`: a local path, or a Hub id (`org/name`, `org/name@rev`, `hf://org/name@rev/sub`).

    With `weights_required=False` a folder holding only `config.json` opens with no tensors
    (used for targets, where the config is what matters).
    """
    path = local_path(source)
    if path is not None and path.exists():
        if revision:
            raise CheckpointNotFoundError(f"{source}: --revision applies to Hub repos, not local paths")
        return _open_local(source, path, allow_pickle, weights_required)
    ref = hub.parse_hub_id(source, revision)
    near = near_path(source)
    if ref is None or looks_like_path(source):
        raise CheckpointNotFoundError(
            f"{source}: no such file or directory", path=source,
            hint=f"did you mean {near}?" if near else
            "give a local folder or file, or a Hub id such as org/name or hf://org/name@rev",
        )
    try:
        resolved = hub.resolve(ref)
    except CheckpointNotFoundError as e:
        if source.startswith("hf://"):
            raise
        # an org/name that is no local folder either: say both, so a mistyped folder is not read as a Hub miss
        raise CheckpointNotFoundError(f"{source}: no such local file or folder, and as a Hub id: {e.message}",
                                      hint=f"did you mean {near}?" if near else e.hint, **e.context) from None
    if resolved.local_dir is not None:
        ckpt = _open_local(source, resolved.local_dir, allow_pickle, weights_required)
    else:
        ckpt = _open_remote(source, resolved, allow_pickle, weights_required)
    ckpt.hub_ref = resolved.ref
    return ckpt


def local_path(source: str) -> Path | None:
    """`source` as a local path (`~` expanded), or None when it cannot be one."""
    if not source or "\x00" in source:
        return None
    try:
        path = Path(source).expanduser()
        path.exists()  # ENAMETOOLONG and friends surface here
    except RuntimeError:  # ~nosuchuser
        raise CheckpointNotFoundError(f"{source}: no such user's home folder", path=source) from None
    except OSError as e:
        raise filesystem_error(e, "look up", source) from None
    except ValueError:
        return None
    return path


def near_path(source: str) -> str | None:
    """An existing path one typo away from `source` (each missing component replaced by its closest
    sibling), for "did you mean": `fixtures/drafters/speculator-3` -> `fixtures/drafters/speculators-3`."""
    if not source or source.startswith("hf://") or "\x00" in source:
        return None
    parts = source.rstrip("/").split("/")
    base = Path("/") if source.startswith("/") else Path(".")
    fixed: list[str] = []
    try:
        for part in parts:
            if part in ("", "."):
                if not fixed and source.startswith("/"):
                    continue
                fixed.append(part)
                continue
            here = base.joinpath(*[p for p in fixed if p])
            if (here / part).exists():
                fixed.append(part)
                continue
            if not here.is_dir():
                return None
            with os.scandir(here) as it:
                siblings = [e.name for n, e in zip(range(limit("folder_entries")), it)]
            close = difflib.get_close_matches(part, siblings, n=1, cutoff=0.8)
            if not close:
                return None
            fixed.append(close[0])
    except OSError:
        return None
    guess = ("/" if source.startswith("/") else "") + "/".join(fixed)
    return guess if guess != source.rstrip("/") and Path(guess).exists() else None


def looks_like_path(source: str) -> bool:
    """A source the user meant as a local path: it starts like one, names a weights file, or its first
    component is a local folder (`fixtures/drafers` when `fixtures/` exists)."""
    if source.startswith(("/", "./", "../", "~")) or source in (".", "..") or source.endswith(
            (".safetensors", ".json", ".bin", ".pt", ".pth")):
        return True
    first = source.split("/", 1)[0]
    try:
        return "/" in source and not source.startswith("hf://") and Path(first).is_dir()
    except OSError:
        return False


# ------------------------------------------------------------------------------------- local

def _listing(root: Path) -> tuple[str, ...]:
    """Files directly in `root` (never a recursive walk: `inspect /` must not crawl the disk)."""
    names = []
    try:
        with os.scandir(root) as it:
            for n, entry in enumerate(it):
                if n >= limit("folder_entries"):
                    raise CorruptCheckpointError(
                        f"{root}: more than {limit('folder_entries')} entries; not a checkpoint folder", path=str(root))
                try:
                    if entry.is_file():
                        names.append(entry.name)
                except OSError:
                    continue
    except OSError as e:
        raise filesystem_error(e, "list", root) from None
    return tuple(sorted(names))


def _nested_weights(root: Path) -> str | None:
    """A subfolder holding weights, for the hint when the folder itself has none (one level deep)."""
    try:
        with os.scandir(root) as it:
            subdirs = sorted(e.name for n, e in zip(range(limit("folder_entries")), it) if e.is_dir())
    except OSError:
        return None
    for sub in subdirs[:64]:
        try:
            inner = _listing(root / sub)
        except (CorruptCheckpointError, CheckpointNotFoundError, OSError):
            continue
        if any(n.endswith((".safetensors", ".safetensors.index.json")) for n in inner):
            return sub
    return None


def _open_local(source: str, path: Path, allow_pickle: bool, weights_required: bool = True) -> Checkpoint:
    if path.is_dir():
        root = path
        names = _listing(root)
        entry = _pick_entry(root, names, weights_required)
    else:
        root = path.parent
        if not path.name.endswith((".safetensors", ".index.json", *PICKLE_SUFFIXES)):
            raise UsageError(f"{source}: {path.name} is not a weights file (.safetensors, *.index.json, .bin); "
                             "pass its folder", path=source, hint=f"give the folder: {root}")
        names = _listing(root)
        entry = path.name
    identities: dict[str, tuple[int, int, int, int]] = {}
    config_path = root / CONFIG_NAME
    config, config_name = None, None
    if config_path.is_file():
        config, config_name = load_object(_read_bytes(config_path), str(config_path)), str(config_path)
        identities[str(config_path)] = file_identity(config_path.stat())

    def opener(rel: str) -> WeightFile:
        file_path = root / rel
        if not file_path.is_file():
            raise CorruptCheckpointError(f"{file_path}: shard listed in the index is missing", file=str(file_path))
        local = LocalFile(file_path)
        identities[str(file_path)] = local.identity
        return _open_weight_file(rel, local, file_path, allow_pickle)

    def index_reader(rel: str) -> bytes:
        identities[str(root / rel)] = file_identity((root / rel).stat())
        return _read_bytes(root / rel)

    ckpt = _assemble(source, str(root), entry, opener, index_reader)
    ckpt.config, ckpt.config_name, ckpt.file_names, ckpt.identities = config, config_name, names, identities
    return ckpt


def _read_bytes(path: Path) -> bytes:
    try:
        size = path.stat().st_size
        if size > limit("json_bytes"):
            raise CorruptCheckpointError(f"{path}: {size} bytes exceeds the {limit('json_bytes')}-byte limit for "
                                         "JSON files", file=str(path))
        return path.read_bytes()
    except OSError as e:
        raise filesystem_error(e, "read", path) from None


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
    nested = _nested_weights(root) if isinstance(root, Path) else None
    hint = f"weights found in a subfolder: point at {root}/{nested}" if nested else None
    raise CheckpointNotFoundError(f"{root}: no *.safetensors or *.bin weights found", path=str(root), hint=hint)


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


def _snapshot(path: Path) -> Path:
    """A private copy of a pickle file in the temporary folder ($TMPDIR), copied with reads that end where the file
    ended when it was opened: torch.load maps the file it reads, and a mapped file that shrinks kills the process
    (SIGBUS); the copy, unlinked once loaded, cannot shrink. A file that shrinks while it is copied is a changed
    source (exit 16)."""
    fd, tmp = tempfile.mkstemp(prefix="eaglectl-pickle-", suffix=".bin")
    try:
        with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
            size = os.fstat(src.fileno()).st_size
            done, buf = 0, bytearray(min(1 << 24, max(1, size)))
            while done < size:
                n = min(len(buf), size - done)
                dst.write(read_exact(src.fileno(), buf, n, done, path))
                done += n
    except OSError as e:
        os.unlink(tmp)
        raise filesystem_error(e, "copy (a private snapshot to load) of", path) from None
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def _open_pickle(rel: str, path: Path) -> WeightFile:
    import torch

    copy = _snapshot(path)
    try:
        with warnings.catch_warnings():  # torch warns about legacy and raw pickles: the refusal is our one line
            warnings.simplefilter("ignore")
            try:
                state = torch.load(copy, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # legacy (non-zip) torch.save files cannot be memory-mapped
                if "mmap" not in str(e):
                    raise
                state = torch.load(copy, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch.load of an untrusted file can raise anything
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        first = first.replace(str(copy), str(path))
        raise CorruptCheckpointError(f"{path}: cannot load weights-only ({first})", file=str(path)) from None
    finally:
        os.unlink(copy)  # the mapping keeps the copy's pages; its name goes now
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CorruptCheckpointError(f"{path}: expected a flat dict of tensors", file=str(path))
    tensors = {}
    for name, t in state.items():
        dtype = FROM_TORCH.get(str(t.dtype).removeprefix("torch."))
        if dtype is None:
            raise CorruptCheckpointError(f"{path}: tensor '{name}': unsupported dtype {t.dtype}", tensor=name)
        nbytes = t.numel() * t.element_size()
        tensors[name] = TensorInfo(name, dtype, tuple(t.shape), 0, nbytes)
    header = Header(str(path), tensors, None, 0)
    return WeightFile(rel, None, header, pickled=state)


def _torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.detach().cpu().numpy()


# ------------------------------------------------------------------------------------ assemble

def _assemble(source: str, root: str, entry: str | None, opener: Callable[[str], WeightFile],
              index_reader: Callable[[str], bytes]) -> Checkpoint:
    """Open the entry file (or every shard of an index) and map each tensor to its file."""
    if entry is None:
        return Checkpoint(source, root, "config-only", [], {}, None, None)
    if not entry.endswith(INDEX_SUFFIXES):
        wf = opener(entry)
        layout = "pickle" if wf.pickled is not None else "safetensors"
        return Checkpoint(source, root, layout, [wf], dict.fromkeys(wf.header.tensors, wf), None, None)

    index = load_object(index_reader(entry), f"{root}/{entry}")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CorruptCheckpointError(f"{root}/{entry}: 'weight_map' must map tensor names to file names",
                                     file=entry)
    metadata = index.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise CorruptCheckpointError(f"{root}/{entry}: 'metadata' must be an object", file=entry)
    base = posixpath.dirname(entry)
    shard_names: list[str] = []
    for tensor, shard in weight_map.items():
        rel = _safe_join(base, shard)
        if rel is None:
            raise CorruptCheckpointError(
                f"{root}/{entry}: weight_map['{tensor}'] = '{shard}' escapes the checkpoint folder",
                file=entry, tensor=tensor,
            )
        if len(rel) > 4096:
            raise CorruptCheckpointError(f"{root}/{entry}: weight_map names a file of {len(rel)} characters",
                                         file=entry, tensor=tensor)
        if rel not in shard_names:
            shard_names.append(rel)
            if len(shard_names) > limit("weight_files"):
                raise CorruptCheckpointError(f"{root}/{entry}: more than {limit('weight_files')} weight files",
                                             file=entry)
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
    total = (metadata or {}).get("total_size")
    actual = sum(t.nbytes for f in files for t in f.header.tensors.values())
    if total is not None and total != actual:
        problems.append((f"{entry}:metadata.total_size",
                         f"metadata.total_size is {total}, tensors hold {actual} bytes"))
    layout = "pickle" if any(f.pickled is not None for f in files) else "sharded"
    return Checkpoint(source, root, layout, files, tensor_file, None, None, index, problems)


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
        config = load_object(resolved.read_small(CONFIG_NAME), config_name)

    def opener(rel: str) -> WeightFile:
        if rel not in names:
            raise CorruptCheckpointError(f"{resolved.ref.display}/{rel}: shard listed in the index is missing",
                                         file=rel)
        return _open_weight_file(rel, resolved.remote_file(rel), None, allow_pickle)

    ckpt = _assemble(source, resolved.ref.display, entry, opener, resolved.read_small)
    ckpt.config, ckpt.config_name, ckpt.file_names = config, config_name, tuple(names)
    return ckpt
