"""`eaglectl convert`: one dialect to another, planned first, streamed, fail-closed, checked after writing.

`plan_conversion` decides everything (tensor renames, casts, drops, derivations, the config) and
`execute` does exactly that plan: `--dry-run` prints the same object a real run executes. Semantics
travel through the DrafterSpec: every flag is written explicitly where the destination keeps it,
aux ids are translated between conventions, `d2t` is validated and `t2d` derived when needed, and
tables missing from the source come from `--target` (single tensor / row reads). Anything the
destination cannot represent is a ConversionError naming it. Output is built in a staging folder,
re-opened and compared with the source, and only then renamed to DEST.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, formats
from .atomic import staged_output
from .checkpoint import Checkpoint, open_checkpoint
from .errors import ConversionError
from .formats import MISSING, Dialect, config_get
from .reading import CanonicalView, probe_of, read_spec
from .rules import Context, TargetFacts, run_checks
from .safetensors_io import DTYPE_BITS, FLOAT_DTYPES, TensorEntry, write_safetensors
from .spec import FLAGS, DrafterSpec, default_aux_ids

SCHEMA = "eaglectl.convert/1"
DTYPE_NAMES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
TORCH_DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
# Source findings a conversion repairs by construction; any other error-level finding blocks it.
REPAIRED_BY_CONVERSION = frozenset({
    "model-prefix", "architectures-unregistered", "architectures-plain", "architectures-missing",
    "d2t-full-vocab", "tie-word-embeddings", "metadata-format", "lm-head-missing", "lm-head-borrowed",
    "embed-tokens-missing", "flag-absent", "aux-count-unsized", "norm-before-fc-placement", "pickle-file",
})
# Keys that belong to a dialect's wrapping, not to the decoder-layer config carried across.
WRAPPER_KEYS = frozenset({
    "architectures", "eagle_config", "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
    "num_aux_hidden_states", "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
    "_torchspec_version", "speculators_config", "speculators_model_type", "speculators_version",
    "transformer_layer_config", "eaglectl_provenance", "auto_map", "has_no_defaults_at_init", "torch_dtype", "dtype",
})


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

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "source_dialect": self.source_dialect, "dest": self.dest,
            "dest_dialect": self.dest_dialect,
            "tensors": [{**asdict(t), "shape": list(t.shape)} for t in self.tensors],
            "dropped": [{"tensor": n, "why": w} for n, w in self.dropped],
            "config": self.config, "config_changes": self.config_changes,
            "files": self.file_names(), "metadata": self.metadata, "notes": self.notes,
        }

    def file_names(self) -> list[str]:
        n = len(self.shards)
        return ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


@dataclass
class ConversionResult:
    plan: ConversionPlan
    written: bool
    checked: list[str]  # what the post-write check established
    source_digest: str | None = None  # computed while writing (the plan holds a placeholder)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "tool_version": __version__, "command": "convert", "dry_run": not self.written,
                "plan": self.plan.to_json(), "checked": self.checked, "source_digest": self.source_digest,
                "exit_code": 0}


# ------------------------------------------------------------------------------------------ plan

@dataclass
class Source:
    ckpt: Checkpoint
    dialect: Dialect
    view: CanonicalView
    spec: DrafterSpec


def open_source(source: str, from_dialect: str | None, allow_pickle: bool) -> Source:
    ckpt = open_checkpoint(source, allow_pickle=allow_pickle)
    dialect, _ = formats.detect(probe_of(ckpt), from_dialect, where=ckpt.root)
    view = CanonicalView(ckpt, dialect)
    spec, _ = read_spec(ckpt, dialect, view)
    return Source(ckpt, dialect, view, spec)


def plan_conversion(
    src: Source,
    dest: str,
    to: str,
    *,
    dtype: str | None = None,
    target: TargetFacts | None = None,
    aux_layer_ids: tuple[int, ...] | None = None,
    source_aux_convention: str | None = None,
    max_shard_size: int | None = None,
    spec_override: DrafterSpec | None = None,
    extra_tensors: dict[str, tuple[str, tuple[int, ...], str]] | None = None,
) -> ConversionPlan:
    """Everything a conversion will do, decided before a byte is written.

    `spec_override` and `extra_tensors` (canonical name -> (dtype, shape, note)) let `upgrade` reuse
    the same machinery: they declare flags and new tensors whose bytes the caller supplies.
    """
    dialect = formats.get(to)
    w = dialect.writer
    if w is None:
        raise ConversionError(f"eaglectl reads {to} checkpoints but does not write them", dialect=to)
    _refuse_source_errors(src, target)
    spec = spec_override or src.spec
    fail = _failer(src, to)

    if spec.arch not in w.architectures:
        fail(f"{dialect.title} cannot hold a {spec.arch} drafter (it writes {', '.join(w.architectures)})")
    layers = spec.num_hidden_layers or 1
    if w.max_layers is not None and layers > w.max_layers:
        fail(f"{dialect.title} holds {w.max_layers} decoder layer(s); the source has {layers}")
    for flag in FLAGS:
        if getattr(spec, flag) and flag not in w.flag_paths:
            fail(f"{dialect.title} cannot express {flag}=true (the drafter would be served without it)")
    if w.style == "speculators" and spec.norm_before_fc and spec.fc_norm:
        fail("the speculators format rejects norm_before_fc together with fc_norm")

    out_dtype = DTYPE_NAMES[dtype] if dtype else None
    V, Vd = spec.vocab_size, spec.draft_vocab_size or spec.vocab_size
    reduced = V is not None and Vd is not None and Vd < V
    actions: list[TensorAction] = []
    dropped: list[tuple[str, str]] = []
    allowed = [re.compile(p + "$") for p in (w.allowed_tensors or (".*",))]
    for canon in src.view.names():
        stored = src.view.stored[canon]
        info = src.view.info(canon)
        if canon in ("d2t", "t2d") and not reduced:
            dropped.append((stored, "draft vocab == vocab: vLLM has no parameter for it (H14)"))
            continue
        if canon == "t2d" and not w.t2d:
            dropped.append((stored, f"{dialect.title} stores no t2d (derivable from d2t)"))
            continue
        if canon.startswith("layers.") and canon.endswith("hidden_norm.weight") and not canon.startswith("layers.0."):
            dropped.append((stored, "hidden_norm of layers >= 1 is unused by vLLM and speculators"))
            continue
        if not any(p.match(canon) for p in allowed):
            fail(f"{dialect.title} cannot hold '{stored}'")
        name = dialect.from_canonical(canon)
        cast = out_dtype if (out_dtype and info.dtype in FLOAT_DTYPES) else None
        if cast and cast != info.dtype:
            actions.append(TensorAction(name, canon, "cast", cast, info.shape, stored, info.dtype,
                                        f"{info.dtype} -> {cast}"))
        else:
            actions.append(TensorAction(name, canon, "copy", info.dtype, info.shape, stored, info.dtype))
    float_dtype = out_dtype or _main_float_dtype(src)

    def need_from_target(canon: str, shape: tuple[int, ...], why: str) -> None:
        if target is None or target.ckpt is None or not target.ckpt.tensor_file:
            fail(f"'{dialect.from_canonical(canon)}' is needed ({why}) and the source has none: pass --target")
        actions.append(TensorAction(dialect.from_canonical(canon), canon, "from-target", float_dtype, shape, note=why))

    if reduced and "d2t" not in src.view:
        fail("reduced draft vocabulary without d2t: the mapping cannot be invented")
    if reduced and w.t2d and "t2d" not in src.view:
        actions.append(TensorAction(dialect.from_canonical("t2d"), "t2d", "derive", "BOOL", (V,),  # type: ignore[arg-type]
                                    note="t2d[i + d2t[i]] = true"))
    H = spec.hidden_size
    if not spec.has_lm_head:
        need_from_target("lm_head.weight", (Vd, H), "every engine needs the drafter's head (H15)")  # type: ignore[arg-type]
    if not spec.has_embed_tokens and (w.require_embed_tokens or (spec.target_hidden_size or H) != H):
        need_from_target("embed_tokens.weight", (V, H), "the destination keeps embed_tokens (H16)")  # type: ignore[arg-type]
    for canon, (dt, shape, note) in (extra_tensors or {}).items():
        name = dialect.from_canonical(canon)
        if not any(p.match(canon) for p in allowed):
            fail(f"{dialect.title} cannot hold '{name}'")
        actions = [x for x in actions if x.canonical != canon]  # an upgrade may replace a tensor
        actions.append(TensorAction(name, canon, "derive", out_dtype or dt, shape, note=note))
    actions.sort(key=lambda a: _tensor_order(a.canonical))

    aux_ids = _dest_aux_ids(src, spec, dialect, target, aux_layer_ids, source_aux_convention, fail)
    config = _dest_config(src, spec, dialect, aux_ids, float_dtype, target, fail)
    config["eaglectl_provenance"] = provenance(src, "convert", to, aux_convention=w.aux_convention or dialect.aux_convention)
    metadata = {"format": "pt", "eaglectl": json.dumps(config["eaglectl_provenance"], sort_keys=True)}
    shard_limit = max_shard_size or (_largest_file(src) if src.ckpt.layout == "sharded" else None)
    return ConversionPlan(
        source=src.ckpt.source, source_dialect=src.dialect.name, dest=str(dest), dest_dialect=to,
        tensors=actions, dropped=dropped, config=config, config_changes=_diff(src.ckpt.config or {}, config),
        shards=_shard(actions, shard_limit), metadata=metadata,
    )


def _failer(src: Source, to: str) -> Any:
    def fail(message: str) -> None:
        raise ConversionError(f"{src.ckpt.root} -> {to}: {message}", dialect=to, path=src.ckpt.root)
    return fail


def _refuse_source_errors(src: Source, target: TargetFacts | None) -> None:
    ctx = Context(src.ckpt, src.dialect, src.view, src.spec, read_spec(src.ckpt, src.dialect, src.view)[1], target)
    for f in run_checks(ctx):
        if f.severity == "error" and f.rule not in REPAIRED_BY_CONVERSION:
            raise ConversionError(f"{src.ckpt.root}: source has error [{f.rule}] {f.message} ({f.locator})",
                                  path=src.ckpt.root, hint=f"eaglectl inspect {src.ckpt.source} shows every finding")


def _main_float_dtype(src: Source) -> str:
    counts: dict[str, int] = {}
    for info in src.ckpt.tensors.values():
        if info.dtype in FLOAT_DTYPES:
            counts[info.dtype] = counts.get(info.dtype, 0) + info.numel
    return max(counts, key=counts.__getitem__) if counts else "F32"


def _tensor_order(canon: str) -> tuple[int, str]:
    order = ("embed_tokens", "input_norm", "fc_norm", "fc.", "layers.", "norm.", "lm_head", "d2t", "t2d")
    return next((i for i, p in enumerate(order) if canon.startswith(p)), len(order)), canon


def _dest_aux_ids(src: Source, spec: DrafterSpec, dialect: Dialect, target: TargetFacts | None,
                  override: tuple[int, ...] | None, source_convention: str | None, fail: Any) -> tuple[int, ...] | None:
    """Aux ids in the destination's convention; None when nobody knows them."""
    w = dialect.writer
    assert w is not None
    if override is not None:
        boundary: tuple[int, ...] | None = tuple(override)  # --aux-layer-ids is given in vLLM's convention
    elif spec.aux_layer_ids is not None:
        convention = source_convention or spec.aux_convention
        unverifiable = src.dialect.aux_convention_note and spec.sources["aux_convention"].startswith("dialect")
        if unverifiable and source_convention is None and src.dialect.name != dialect.name:
            fail(f"{src.dialect.aux_convention_note}; pass --source-aux-convention boundary|output")
        shift = 1 if convention == "output" else 0
        boundary = tuple(i + shift for i in spec.aux_layer_ids)
    else:
        boundary = None
    L = target.text_config().get("num_hidden_layers") if target else None
    if boundary is None and isinstance(L, int) and w.aux_ids_paths:
        boundary = default_aux_ids(L, "boundary")  # made explicit from the target, not guessed
    if boundary is None:
        return None
    if sorted(set(boundary)) != list(boundary):
        fail(f"aux ids {list(boundary)} must be ascending and distinct")
    if not w.aux_ids_paths:
        if not isinstance(L, int) or tuple(boundary) != default_aux_ids(L, "boundary"):
            fail(f"{dialect.title} cannot record aux ids {list(boundary)} (it always uses (2, L//2, L-3)); "
                 + ("they are not that default for the target" if isinstance(L, int) else
                    "pass --target to show they are that default"))
        return None
    if w.exactly_3_aux and len(boundary) != 3:
        fail(f"{dialect.title} holds exactly 3 aux ids, not {len(boundary)}")
    if (w.aux_convention or dialect.aux_convention) == "output":
        if 0 in boundary:
            fail("aux id 0 (the embeddings) has no output-of-layer equivalent")
        return tuple(i - 1 for i in boundary)
    return boundary


def _layer_config(src: Source) -> dict[str, Any]:
    cfg = src.ckpt.config or {}
    root = config_get(cfg, src.dialect.arch_config) if src.dialect.arch_config else cfg
    return {k: v for k, v in (root if isinstance(root, dict) else {}).items() if k not in WRAPPER_KEYS}


def _set(cfg: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = cfg
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


def _dest_config(src: Source, spec: DrafterSpec, dialect: Dialect, aux_ids: tuple[int, ...] | None,
                 float_dtype: str, target: TargetFacts | None, fail: Any) -> dict[str, Any]:
    w = dialect.writer
    assert w is not None
    layer = _layer_config(src)
    layer["tie_word_embeddings"] = False  # H15: the drafter's head is its own
    if spec.rope_theta is None and "rope_parameters" not in layer:
        layer["rope_theta"] = 10000.0  # absent means base 10000 (SafeAILab); written explicitly
    if isinstance(layer.get("rope_parameters"), dict) and "rope_theta" in layer:
        layer["rope_parameters"]["rope_theta"] = layer["rope_theta"]  # H17: both encodings agree
    n_aux = spec.num_aux_hidden_states
    draft_vocab = spec.draft_vocab_size or spec.vocab_size
    torch_dtype = TORCH_DTYPE_NAMES.get(float_dtype, "float32")
    top: dict[str, Any] = {}
    if w.style == "speculators":
        verifier = _verifier(src, target)
        if verifier is None:
            fail("the speculators format names its verifier (target): pass --target")
        k = config_get(src.ckpt.config, "speculators_config.proposal_methods")
        tokens = k[0].get("speculative_tokens", 3) if isinstance(k, list) and k and isinstance(k[0], dict) else 3
        layer["model_type"] = "qwen3" if spec.arch == "qwen3" else "llama"
        layer["architectures"] = ["Qwen3ForCausalLM" if spec.arch == "qwen3" else "LlamaForCausalLM"]
        layer["torch_dtype"] = torch_dtype
        top.update({
            "architectures": [w.architectures[spec.arch]],
            "speculators_model_type": "eagle3",
            "speculators_version": "eaglectl-" + __version__,
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens}],
                "verifier": verifier,
            },
            "transformer_layer_config": layer,
        })
    else:
        top.update({"architectures": [w.architectures[spec.arch]], **layer})
    top["draft_vocab_size"] = draft_vocab
    top["target_hidden_size"] = spec.target_hidden_size
    for flag in FLAGS:
        for path in w.flag_paths.get(flag, ()):
            _set(top, path, bool(getattr(spec, flag)))
    if aux_ids is not None:
        for path in w.aux_ids_paths:
            _set(top, path, list(aux_ids))
    if n_aux is not None and n_aux != 3:  # H5: vLLM sizes fc for 3 unless told
        top["num_aux_hidden_states"] = n_aux
        if aux_ids is not None:
            _set(top, "eagle_config.eagle_aux_hidden_state_layer_ids", list(aux_ids))
    for path, value in w.extra_config.items():
        _set(top, path, value)
    top["torch_dtype"] = torch_dtype
    return top


def _verifier(src: Source, target: TargetFacts | None) -> dict[str, Any] | None:
    if target is not None:
        archs = target.config.get("architectures") or []
        name = target.source
        if target.ckpt is not None and target.ckpt.hub_ref is not None:
            name = target.ckpt.hub_ref.repo_id
        return {"name_or_path": name, "architectures": archs}
    existing = config_get(src.ckpt.config, "speculators_config.verifier")
    return existing if isinstance(existing, dict) and existing.get("name_or_path") else None


# The source digest is computed from the bytes streamed while writing (no extra pass over the
# source) and patched into config and safetensors metadata afterwards; same length, so the header
# layout does not move.
DIGEST_PLACEHOLDER = "sha256:" + "0" * 64


def provenance(src: Source, operation: str, to: str, **extra: Any) -> dict[str, Any]:
    out = {
        "tool": f"eaglectl {__version__}",
        "operation": operation,
        "source": src.ckpt.hub_ref.display if src.ckpt.hub_ref else src.ckpt.source,
        "source_dialect": src.dialect.name,
        "source_digest": DIGEST_PLACEHOLDER,
        "dialect": to,
    }
    out.update(extra)
    return out


def combine_digests(ckpt: Checkpoint, per_tensor: dict[str, str]) -> str:
    """sha256 over every source tensor's name, dtype, shape and sha256 (layout- and metadata-free)."""
    h = hashlib.sha256()
    for name in sorted(ckpt.tensor_file):
        info = ckpt.tensors[name]
        if name not in per_tensor:
            per_tensor[name] = _digest(_raw_chunks(ckpt, name))
        h.update(f"{name}|{info.dtype}|{list(info.shape)}|{per_tensor[name]}\n".encode())
    return "sha256:" + h.hexdigest()


def _digest(chunks: Any) -> str:
    h = hashlib.sha256()
    for _ in _hashing(chunks, h):
        pass
    return h.hexdigest()


def _hashing(chunks: Any, h: Any) -> Any:
    """Yield `chunks` while they are read ahead in one thread and hashed in another (both release
    the GIL on large buffers), so reading, hashing and writing overlap."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as hasher:
        pending: deque[Any] = deque()
        for chunk in _read_ahead(chunks):
            pending.append(hasher.submit(h.update, chunk))
            if len(pending) > 2:
                pending.popleft().result()
            yield chunk
        for f in pending:
            f.result()


def _read_ahead(chunks: Any, depth: int = 2) -> Any:
    import queue
    import threading

    q: queue.Queue[Any] = queue.Queue(depth)
    done = object()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            for c in chunks:
                q.put(c)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer thread
            failure.append(e)
        finally:
            q.put(done)

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    while (item := q.get()) is not done:
        yield item
    worker.join()
    if failure:
        raise failure[0]


def _diff(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    keys = sorted(set(old) | set(new))
    out = []
    for k in keys:
        a, b = old.get(k, MISSING), new.get(k, MISSING)
        if a == b:
            continue
        kind = "added" if a is MISSING else "removed" if b is MISSING else "changed"
        out.append({"key": k, "change": kind, **({"old": a} if a is not MISSING else {}),
                    **({"new": b} if b is not MISSING else {})})
    return out


def _largest_file(src: Source) -> int:
    return max(sum(t.nbytes for t in f.header.tensors.values()) for f in src.ckpt.files)


def _shard(actions: list[TensorAction], limit: int | None) -> list[list[str]]:
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
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 5GB, 500MB, 2GiB)")
    unit = (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    return int(float(m.group(1)) * scale)


# --------------------------------------------------------------------------------------- execute

def _raw_chunks(ckpt: Checkpoint, stored: str, chunk: int = 1 << 24) -> Any:
    wf = ckpt.tensor_file[stored]
    if wf.pickled is not None:
        import torch

        yield wf.pickled[stored].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return
    assert wf.source is not None
    info = wf.header.tensors[stored]
    start = wf.header.data_start + info.begin
    for off in range(0, info.nbytes, chunk):
        yield wf.source.read(start + off, min(chunk, info.nbytes - off))


def _cast_chunks(ckpt: Checkpoint, stored: str, src_dtype: str, dtype: str) -> Any:
    """Cast chunk by chunk: elementwise, and the 16 MB chunks hold whole elements."""
    import torch

    tdt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
    for raw in _raw_chunks(ckpt, stored):
        t = torch.frombuffer(bytearray(raw), dtype=tdt[src_dtype]).to(tdt[dtype])
        yield t.view(torch.uint8).numpy().tobytes()


def _from_numpy(arr: Any, dtype: str) -> bytes:
    import torch

    tdt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "BOOL": torch.bool, "I64": torch.int64}
    t = torch.from_numpy(np.ascontiguousarray(arr)).to(tdt[dtype])
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _target_table(target: TargetFacts, canon: str) -> str:
    assert target.ckpt is not None
    names = target.ckpt.tensor_file
    embed = next((n for n in ("model.embed_tokens.weight", "embed_tokens.weight",
                              "model.language_model.embed_tokens.weight") if n in names), None)
    head = "lm_head.weight" if "lm_head.weight" in names else embed  # a tied target's head is its embedding
    name = embed if canon == "embed_tokens.weight" else head
    if name is None:
        raise ConversionError(f"{target.source}: the target has no {canon.split('.')[0]} tensor", path=target.source)
    return name


def tensor_bytes(a: TensorAction, src: Source, target: TargetFacts | None, supplied: dict[str, bytes]) -> Any:
    """An iterable over the bytes of one destination tensor, produced exactly as the plan says."""
    if a.action == "copy":
        assert a.source is not None
        return _raw_chunks(src.ckpt, a.source)
    if a.action == "cast":
        assert a.source is not None and a.source_dtype is not None
        return _cast_chunks(src.ckpt, a.source, a.source_dtype, a.dtype)
    if a.action == "derive":
        if a.canonical in supplied:
            return iter((supplied[a.canonical],))
        assert a.canonical == "t2d"
        d2t = src.view.read("d2t").astype(np.int64)
        t2d = np.zeros(a.shape[0], dtype=np.bool_)
        t2d[np.arange(len(d2t)) + d2t] = True
        return iter((t2d.tobytes(),))
    assert a.action == "from-target" and target is not None and target.ckpt is not None
    name = _target_table(target, a.canonical)
    if a.canonical == "lm_head.weight" and "d2t" in src.view:
        rows = (np.arange(a.shape[0]) + src.view.read("d2t").astype(np.int64)).tolist()  # H12: arange + d2t
        return iter((_from_numpy(target.ckpt.read_rows(name, rows), a.dtype),))
    return iter((_from_numpy(target.ckpt.read(name), a.dtype),))


def execute(plan: ConversionPlan, src: Source, *, target: TargetFacts | None = None, force: bool = False,
            supplied: dict[str, bytes] | None = None, progress: Any = None) -> ConversionResult:
    """Write exactly `plan` into a staging folder, check it, then rename to DEST.

    Each tensor's bytes are hashed as they stream out; the check re-reads the output and compares.
    """
    supplied = supplied or {}
    dest = Path(plan.dest)
    _refuse_overlap(src, dest)
    by_name = {a.dest: a for a in plan.tensors}
    streamed: dict[str, str] = {}  # dest tensor -> sha256 of the bytes written
    wrap = progress or (lambda it, **kw: it)

    def hashed(a: TensorAction) -> Any:
        h = hashlib.sha256()
        yield from _hashing(tensor_bytes(a, src, target, supplied), h)
        streamed[a.dest] = h.hexdigest()

    with staged_output(dest, force=force) as stage:
        names = plan.file_names()
        for file_name, members in wrap(list(zip(names, plan.shards, strict=True)), label="writing", total=len(names)):
            entries = [TensorEntry(n, by_name[n].dtype, by_name[n].shape, lambda a=by_name[n]: hashed(a))
                       for n in members]
            write_safetensors(stage / file_name, entries, plan.metadata)
        digest = combine_digests(src.ckpt, {a.source: streamed[a.dest] for a in plan.tensors if a.action == "copy"})
        for file_name in names:
            _patch(stage / file_name, DIGEST_PLACEHOLDER.encode(), digest.encode())
        if len(names) > 1:
            weight_map = {n: f for f, members in zip(names, plan.shards, strict=True) for n in members}
            index = {"metadata": {"total_size": sum(a.nbytes for a in plan.tensors)}, "weight_map": weight_map}
            (stage / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        config = json.loads(json.dumps(plan.config).replace(DIGEST_PLACEHOLDER, digest))
        (stage / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        checked = check_written(stage, plan, streamed, target)
    return ConversionResult(plan, True, checked, digest)


def _patch(path: Path, old: bytes, new: bytes) -> None:
    """Replace a same-length placeholder inside a safetensors header (the metadata)."""
    assert len(old) == len(new)
    with path.open("r+b") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little")
        header = f.read(n)
        at = header.find(old)
        if at < 0:
            return
        f.seek(8 + at)
        f.write(new)
        f.flush()
        os.fsync(f.fileno())


def _refuse_overlap(src: Source, dest: Path) -> None:
    root = Path(os.path.abspath(src.ckpt.root))
    d = Path(os.path.abspath(dest))
    if src.ckpt.hub_ref is None and (d == root or root in d.parents or d in root.parents):
        raise ConversionError(f"{dest}: the destination overlaps the source {root}; the source is never modified",
                              path=str(dest))


def check_written(stage: Path, plan: ConversionPlan, streamed: dict[str, str], target: TargetFacts | None) -> list[str]:
    """Re-open the output: every tensor has its planned dtype/shape and exactly the bytes streamed for it
    (the source's for copies, the documented transform otherwise); detection names the dialect; no errors."""
    out = open_checkpoint(str(stage))
    where = f"{plan.dest} (staged)"
    expected = {a.dest for a in plan.tensors}
    if set(out.tensor_file) != expected:
        raise ConversionError(f"{where}: written tensors differ from the plan "
                              f"({sorted(set(out.tensor_file) ^ expected)[:3]})")
    for a in plan.tensors:
        info = out.tensors[a.dest]
        if (info.dtype, info.shape) != (a.dtype, tuple(a.shape)):
            raise ConversionError(f"{where}: tensor '{a.dest}' is {info.dtype}{list(info.shape)}, planned "
                                  f"{a.dtype}{list(a.shape)}", tensor=a.dest)
        if _digest(_raw_chunks(out, a.dest)) != streamed[a.dest]:
            raise ConversionError(f"{where}: tensor '{a.dest}' does not equal its source ({a.action})", tensor=a.dest)
    checks = [f"{len(plan.tensors)} tensors equal their source or documented transform"]
    dialect, _ = formats.detect(probe_of(out), where=where)
    if dialect.name != plan.dest_dialect:
        raise ConversionError(f"{where}: written checkpoint is detected as {dialect.name}, not {plan.dest_dialect}")
    checks.append(f"detected as {dialect.name}")
    view = CanonicalView(out, dialect)
    spec, invalid = read_spec(out, dialect, view)
    errors = [f for f in run_checks(Context(out, dialect, view, spec, invalid, target)) if f.severity == "error"]
    if errors:
        raise ConversionError(f"{where}: inspect finds [{errors[0].rule}] {errors[0].message}", tensor=errors[0].locator)
    checks.append("inspect finds no errors")
    return checks
