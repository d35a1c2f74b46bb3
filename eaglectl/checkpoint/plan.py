"""What a checkpoint eaglectl writes will hold, decided before a byte is written: every tensor's action (copy, cast,
derive, from the target), the config, the shards, the provenance record; and the staged files re-opened against it
(`reopen`). `convert` and `upgrade` plan EAGLE-3 drafters into it, the families their layouts (families/convert.py)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..errors import ConversionError, EaglectlError
from ..io.checkpoint import Checkpoint, open_checkpoint
from ..io.dtypes import DTYPE_BITS
from ..io.hub import cached_architectures
from ..io.jsonio import MISSING, config_get
from ..io.safetensors import Written
from .publish import public_name, public_value
from .target import TargetCheckpoint, is_hub_id


@dataclass
class TensorAction:
    dest: str
    canonical: str
    action: str  # copy | cast | derive | from-target
    dtype: str
    shape: tuple[int, ...]
    source: str | None = None  # stored name in the source (copy / cast)
    source_dtype: str | None = None
    note: str = ""

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * DTYPE_BITS[self.dtype] // 8


@dataclass
class ConversionPlan:
    source: str
    source_dialect: str
    dest: str
    dest_dialect: str
    tensors: list[TensorAction]
    dropped: list[tuple[str, str]]  # (stored source name, why)
    config: dict[str, Any]
    config_changes: list[dict[str, Any]]
    shards: list[list[str]]  # dest tensor names per file; one list = single model.safetensors
    metadata: dict[str, str]
    notes: list[str] = field(default_factory=list)
    side_files: dict[str, Any] = field(default_factory=dict)  # other JSON files written beside config.json
    # what every runner that serves DEST must read: {"boundary_ids", "flags", "basis"} (the post-write check)
    intended: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)  # what a consumer of this dialect will read differently
    engines: tuple[str, ...] = ("vllm",)  # the engines that must read the output right (convert --for)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "source_dialect": self.source_dialect, "dest": self.dest,
            "dest_dialect": self.dest_dialect,
            "tensors": [{**asdict(t), "shape": list(t.shape)} for t in self.tensors],
            "dropped": [{"tensor": n, "why": w} for n, w in self.dropped],
            "config": self.config, "config_changes": self.config_changes,
            "files": self.file_names() + sorted(self.side_files), "metadata": self.metadata, "notes": self.notes,
            "intended": self.intended,
            "warnings": self.warnings,
            "engines": list(self.engines),
        }

    def file_names(self) -> list[str]:
        n = len(self.shards)
        if self.dest_dialect == "gguf":  # one llama.cpp file (commands/convert/gguf.py)
            return ["model.gguf"]
        return ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


# `base_model` when `convert --for` chose speculators and nobody named the target: the verifier is written null, with
# its warning, as with a local --target, so that the choice never depends on --base-model (`--to speculators`
# without any name still refuses: the user asked for the format that names its verifier)
UNNAMED = ""


def verifier(config: dict[str, Any] | None, target: TargetCheckpoint | None, base_model: str | None
             ) -> dict[str, Any] | None:
    """The speculators verifier of a drafter with this config, named by Hub id only: --base-model, the target's own
    id, the source's verifier when that is one; else null (vLLM needs the key, and a local path names nothing once
    published). None: nothing at all is known of the target (and `base_model` is not UNNAMED)."""
    existing = config_get(config or {}, "speculators_config.verifier")
    existing = existing if isinstance(existing, dict) else {}
    named = existing.get("name_or_path") if isinstance(existing.get("name_or_path"), str) else None
    own_null = "name_or_path" in existing and existing["name_or_path"] is None \
        and isinstance((config or {}).get("eaglectl_provenance"), dict)  # eaglectl wrote it null (a local target)
    if target is None and base_model is None and named is None and not own_null:
        return None
    name = base_model or (target.hub_id if target is not None else None) or (named if is_hub_id(named) else None)
    archs = list(target.architectures) if target is not None else existing.get("architectures") or []
    if not archs and name is not None and is_hub_id(name):  # --base-model alone: its config, when cached here
        archs = cached_architectures(name) or []
    return {"name_or_path": name, "architectures": archs}


# The source digest is computed from the bytes read while writing and patched into config and
# safetensors metadata afterwards; same length, so the header layout does not move.
DIGEST_PLACEHOLDER = "sha256:" + "0" * 64


def provenance(ckpt: Checkpoint, source_dialect: str, operation: str, to: str, **extra: Any) -> dict[str, Any]:
    """Where the output came from, as it may be published: a Hub source by its id, a local one by its
    basename (the digest identifies its bytes); never a path of this machine (checkpoint/publish.py)."""
    ref = ckpt.hub_ref
    out = {
        "tool": f"eaglectl {__version__}",
        "operation": operation,
        "source": ref.display if ref else public_name(ckpt.source),
        "source_dialect": source_dialect,
        "source_digest": DIGEST_PLACEHOLDER,
        "dialect": to,
    }
    out.update(public_value(extra))
    return out


# keys whose object is one value in a diff: transformers' remote-code class map (never run here), not its entries
WHOLE = frozenset({"auto_map"})
# one setting under two names: transformers renamed `torch_dtype` to `dtype` (4.56); a rename is a move, not two keys
SAME_SETTING = {"dtype": "torch_dtype", "torch_dtype": "dtype"}


def _flat(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config as {dotted key path: value}: objects are opened (an empty one is a value, and so is one of WHOLE),
    lists are values."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v and k not in WHOLE:
            out.update(_flat(v, path + "."))
        else:
            out[path] = v
    return out


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Key-level config changes: each changed leaf by its dotted path (`speculators_config.verifier.
    name_or_path`), never a whole nested object (but those of WHOLE); a key that only changed place (into or out
    of `transformer_layer_config`, `eagle_config`) or name (SAME_SETTING) is one "moved" change naming both
    paths."""
    a, b = _flat(old), _flat(new)
    removed = [k for k in a if k not in b]
    added = [k for k in b if k not in a]
    moved: dict[str, str] = {}  # new path -> old path
    for k in added:
        parent, _, leaf = k.rpartition(".")
        # the same key under another parent (the value may also have changed), or the same setting renamed
        frm = next((r for r in removed if r not in moved.values() and r.rsplit(".", 1)[-1] == leaf
                    and (r.endswith("." + k) or k.endswith("." + r) or r.count(".") != k.count("."))), None)
        if frm is None and leaf in SAME_SETTING:
            frm = next((r for r in removed if r == ".".join(filter(None, (parent, SAME_SETTING[leaf])))), None)
        if frm is not None:
            moved[k] = frm
    out = []
    for k in sorted(set(a) | set(b)):
        if k in moved.values():
            continue
        x, y = a.get(k, MISSING), b.get(k, MISSING)
        if k in moved:
            x = a[moved[k]]
            out.append({"key": k, "change": "moved", "from": moved[k], **({"old": x} if x != y else {}), "new": y})
            continue
        if x == y:
            continue
        kind = "added" if x is MISSING else "removed" if y is MISSING else "changed"
        out.append({"key": k, "change": kind, **({"old": x} if x is not MISSING else {}),
                    **({"new": y} if y is not MISSING else {})})
    return out


def shard(actions: list[TensorAction], limit: int | None) -> list[list[str]]:
    if not limit:
        return [[a.dest for a in actions]]
    shards: list[list[str]] = [[]]
    size = 0
    for a in actions:
        if shards[-1] and size + a.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(a.dest)
        size += a.nbytes
    return shards


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*", text, re.IGNORECASE)  # ASCII digits only
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 5GB, 500MB, 2GiB)")
    unit = (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    size = int(float(m.group(1)) * scale)
    if size <= 0:
        raise ValueError(f"a shard size must be positive, not {text!r}")
    return size


def reopen(stage: Path, plan: ConversionPlan, written: list[Written]) -> Checkpoint:
    """The staged output, opened: exactly the planned tensors, each where it was written (ConversionError else)."""
    where = f"{plan.dest} (staged)"
    try:
        out = open_checkpoint(str(stage))
    except EaglectlError as e:
        raise ConversionError(f"{where}: the written output does not open ({e.message})") from None
    expected = {a.dest for a in plan.tensors}
    if set(out.tensor_file) != expected:
        raise ConversionError(f"{where}: written tensors differ from the plan "
                              f"({sorted(set(out.tensor_file) ^ expected)[:3]})")
    ranges = {name: r for w in written for name, r in w.ranges.items()}
    for a in plan.tensors:
        info = out.tensors[a.dest]
        if (info.dtype, info.shape) != (a.dtype, tuple(a.shape)) or \
                out.tensor_file[a.dest].byte_range(a.dest) != ranges[a.dest]:
            raise ConversionError(f"{where}: tensor '{a.dest}' is {info.dtype}{list(info.shape)} at another place "
                                  f"than planned ({a.dtype}{list(a.shape)})", tensor=a.dest)
    return out
