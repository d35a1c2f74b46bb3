"""`eaglectl convert`: one dialect to another, planned first, streamed, fail-closed, checked after writing.

`plan_conversion` decides everything (tensor renames, casts, drops, derivations, the config) and
`execute` does exactly that plan: `--dry-run` prints the same object a real run executes. Semantics
travel through the DrafterSpec: every flag is written explicitly where the destination keeps it,
aux ids are translated between conventions, `d2t` is validated and `t2d` derived when needed, and
tables missing from the source come from `--target` (single tensor / row reads). Anything the
destination cannot represent is a ConversionError naming it.

Writing runs at disk speed: copied tensors move with `copy_file_range` (no user-space copy), the
source's sha256 (the provenance digest) is computed on another core from the page cache while they
copy, and the post-write check compares every copied range with its source byte for byte (memory
mapped) and every produced tensor with the CRC-32 taken as it was written. The output is built in a
staging folder, re-opened, detected and inspected, and only then renamed to DEST.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import __version__, formats
from .drafter import DrafterCheckpoint, interpret, open_drafter
from .errors import ConversionError, EaglectlError, filesystem_error
from .formats import Dialect
from .io import cast as casting
from .io.atomic import check_destination, staged_output
from .io.checkpoint import Checkpoint, open_checkpoint
from .io.dtypes import CONFIG_NAMES, DTYPE_BITS, FLOAT_DTYPES, TO_CONFIG
from .io.jsonio import MISSING, config_set
from .io.quant import QUANT_FILE, converted_configs, layout_of
from .io.safetensors import (
    TensorEntry,
    Written,
    crc32_range,
    same_bytes,
    sha256_range,
    write_safetensors,
)
from .progress import Progress, passthrough
from .result import Result
from .rules import Context, run_checks
from .rules.hazards import strip_null_template_fields
from .spec import FLAGS, DrafterSpec, default_aux_ids
from .target import Target, TargetCheckpoint, is_hub_id

if TYPE_CHECKING:
    from .probe import Measurement

# Keys of every config that describe the drafter as a whole, not its decoder layer.
_DRAFTER_KEYS = frozenset({
    "architectures", "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
    "num_aux_hidden_states", "eaglectl_provenance", "torch_dtype", "dtype", "quantization_config", *FLAGS,
})


def wrapper_keys() -> frozenset[str]:
    """Keys that belong to a dialect's wrapping (never copied into the decoder-layer config)."""
    return _DRAFTER_KEYS | {k for d in formats.DIALECTS.values() for k in d.owned_config_keys}


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
        }

    def file_names(self) -> list[str]:
        n = len(self.shards)
        return ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


@dataclass
class ConversionResult(Result):
    SCHEMA, COMMAND = "eaglectl.convert/1", "convert"

    plan: ConversionPlan
    written: bool
    checked: list[str]  # what the post-write check established
    source_digest: str | None = None  # computed while writing (the plan holds a placeholder)
    serve: dict[str, Any] | None = None  # convert --for ENGINE: the choice and the serve line

    def summary_line(self) -> str:
        p = self.plan
        return f"{p.source_dialect} -> {p.dest_dialect}: {len(p.tensors)} tensors" + ("" if self.written else " (dry run)")

    def payload(self) -> dict[str, Any]:
        return {"dry_run": not self.written, "plan": self.plan.to_json(), "checked": self.checked,
                "source_digest": self.source_digest, "serve": self.serve}


def run(source: str, dest: str, to: str | None, *, from_dialect: str | None = None, dtype: str | None = None,
        target: str | None = None, aux_layer_ids: tuple[int, ...] | None = None,
        source_aux_convention: str | None = None, max_shard_size: int | None = None, dry_run: bool = False,
        force: bool = False, allow_pickle: bool = False, measure: bool = True, states: str | None = None,
        progress: Progress = passthrough, base_model: str | None = None,
        for_engine: str | None = None, embed_from_target: bool = False) -> ConversionResult:
    """Convert SOURCE to dialect `to` at DEST (or only plan it with `dry_run`); with `for_engine` instead of
    `to`, to the dialect that engine serves this drafter from best (serving.pick), with its serve line.

    With `target` (when it can be run) the source's aux reading is measured and wins over the dialect
    table, and the written output must draft exactly like the source under the reference loop, read the
    way the destination's serving engine reads it (else BehaviourChangedError, nothing at DEST). Whatever can
    be refused without measuring (the destination, the dialect) is refused before the target is touched."""
    src = open_drafter(source, from_dialect=from_dialect, allow_pickle=allow_pickle)
    tgt = Target.open(target, states, progress=progress)
    checkpoint = tgt.checkpoint if tgt is not None else None
    if to is not None:
        writable_dialect(to)
    if not dry_run:
        check_destination(dest, force=force, sources=plan_inputs(src, checkpoint))
    measured = None
    notes: list[str] = []
    if tgt is not None and measure:
        from .probe import try_measure

        measured, why = try_measure(src, tgt, progress=progress)
        if why:
            notes.append(why)

    def plan_for(dialect: str) -> tuple[ConversionPlan, Any, Any, list[str]]:
        ids, convention, more = follow_measurement(src, measured, source_aux_convention, aux_layer_ids, dialect)
        return plan_conversion(src, dest, dialect, dtype=dtype, target=checkpoint, aux_layer_ids=ids,
                               source_aux_convention=convention, max_shard_size=max_shard_size, measured=measured,
                               base_model=base_model, embed_from_target=embed_from_target), ids, convention, more

    serve = None
    if for_engine is not None:
        from .serving import pick

        to, (plan, ids, convention, more), serve = pick(src, for_engine, plan_for)
    else:
        assert to is not None
        plan, ids, convention, more = plan_for(to)
    plan.notes[:0] = notes + more
    if serve is not None:
        from .serving import serve_command

        serve["command"] = serve_command(src, dest, checkpoint, base_model, plan.config)
    if dry_run:
        return ConversionResult(plan, False, [], serve=serve)
    check = None
    if tgt is not None and tgt.runnable and measured is not None and not measured.at_chance:
        check = behaviour_check(src, measured, tgt, ids, convention, to)
    elif tgt is not None and tgt.states is not None and measured is not None:
        plan.notes.append("measured on the capture; the written output's drafting was not replayed (that needs a "
                          "runnable --target without --states)")
    result = execute(plan, src, target=checkpoint, force=force, progress=progress, after_write=check)
    result.serve = serve
    return result


def writable_dialect(to: str) -> Dialect:
    """The destination dialect, or ConversionError naming what eaglectl can write."""
    if to not in formats.DIALECTS:
        raise ConversionError(f"unknown dialect '{to}' (known: {', '.join(formats.names())})", dialect=to)
    dialect = formats.get(to)
    if dialect.writer is None:
        raise ConversionError(f"eaglectl reads {to} checkpoints but does not write them", dialect=to,
                              hint=f"write one of: {', '.join(formats.writable())}")
    return dialect


def follow_measurement(src: DrafterCheckpoint, m: Any, given: str | None, given_ids: tuple[int, ...] | None,
                       to: str) -> tuple[tuple[int, ...] | None, str | None, list[str]]:
    """(explicit boundary ids, source convention, notes) for the conversion: the user's ids, else the
    measured reading (which wins over the dialect table), else the table, said to be assumed."""
    spec, table = src.spec, src.spec.aux_convention
    if given_ids is not None or spec.aux_layer_ids is None:
        return given_ids, given, []
    if m is None:
        how = f"--source-aux-convention {given}" if given else f"the {src.dialect.title} table ({table})"
        return None, given, [f"the aux-id numbering was assumed from {how}, not measured; pass --target with a "
                             "runnable target to measure it"]
    if m.at_chance:
        return None, given, []  # drafter-at-chance blocks the conversion with the reason
    if m.boundary_ids is None:
        dest = formats.get(to)
        writes = (dest.writer.aux_convention if dest.writer else None) or dest.aux_convention
        if given is None and table != writes:
            raise ConversionError(f"{src.root}: the aux-id numbering could not be measured ({m.aux.reason}), and "
                                  f"{src.dialect.title} -> {dest.title} must translate the ids",
                                  hint="pass --source-aux-convention boundary|output if you know how it was trained")
        return None, given, [f"the aux-id numbering could not be measured ({m.aux.reason})"]
    measured = m.convention
    if given is not None and measured not in ("undecided", given):
        return None, given, [f"--source-aux-convention {given} contradicts the measurement ({measured}: "
                             f"{m.aux.reason}); using {given} as you asked"]
    if measured in ("boundary", "output"):
        note = [] if measured == table else [
            f"measured: the stored ids {list(spec.aux_layer_ids)} are {measured} ids (the drafter reads "
            f"boundaries {list(m.boundary_ids)}), not {table} as the {src.dialect.title} table says; the "
            "measurement wins"]
        return None, measured, note
    return tuple(m.boundary_ids), None, [
        f"measured: the drafter reads boundaries {list(m.boundary_ids)}, which fit neither numbering of the stored ids "
        f"{list(spec.aux_layer_ids)}; the measured boundaries are written"]


def behaviour_check(src: DrafterCheckpoint, m: Measurement, target: Target, ids: tuple[int, ...] | None,
                    convention: str | None, to: str) -> Any:
    """After writing: the reference loop drafts exactly as much with the output (read the way the
    destination's engine reads it) as with the source (read as measured), on the same greedy continuations."""
    from .errors import BehaviourChangedError
    from .probe import LOOP_TOKENS, acceptance, flag_overrides, probe_prompts

    def check(out: DrafterCheckpoint) -> list[str]:
        L = target.num_layers
        assert L is not None
        spec = src.spec
        if ids is not None:
            src_ids = tuple(ids)
        elif m.boundary_ids is not None:
            src_ids = m.boundary_ids
        elif spec.aux_layer_ids is not None and convention is not None:
            src_ids = tuple(sorted(i + (1 if convention == "output" else 0) for i in spec.aux_layer_ids))
        else:
            src_ids = spec.capture_ids(L)
        prompts = probe_prompts(target.model().tokenizer)  # decoded once already, for the probe
        k = m.steps
        a = acceptance(src.reference(), target, prompts, boundaries=src_ids, k=k, max_tokens=LOOP_TOKENS,
                       **flag_overrides(m))
        counts = lambda c: (c.num_drafts, c.num_accepted_tokens, c.accepted_per_pos)  # noqa: E731
        lines = []
        # once per distinct reading of the written files (normally one: the post-write check made vLLM's two
        # runners agree), under every engine that serves them
        for who, out_ids in _distinct_readings(out, to, target, L):
            b = acceptance(out.reference(), target, prompts, boundaries=out_ids, k=k, max_tokens=LOOP_TOKENS)
            if counts(a) != counts(b):
                raise BehaviourChangedError(
                    f"{to} output under {who} (boundaries {list(out_ids)}): acceptance length "
                    f"{b.mean_acceptance_length:.3f}, the source (boundaries {list(src_ids)}): "
                    f"{a.mean_acceptance_length:.3f}; nothing was written", path=out.root,
                    hint="the destination cannot carry this drafter's meaning for that engine; pick another --to")
            lines.append(f"drafts exactly like the source under {who} (boundaries {list(out_ids)}): "
                         f"{a.num_drafts} drafts, {a.num_accepted_tokens} accepted on {len(prompts)} held-out prompts, "
                         f"AL {a.mean_acceptance_length:.3f}")
        return lines

    return check


def _distinct_readings(out: DrafterCheckpoint, to: str, target: Any, L: int) -> list[tuple[str, tuple[int, ...]]]:
    """(who reads them, boundaries) for each distinct reading of the written files: vLLM's runners (asked of vLLM
    where it is installed, else its table: runners.readings_for) and, for a dialect another engine serves
    (`Dialect.consumer`), that engine's reading of the dialect's own field."""
    from .engines import aux_reading, engine_boundaries, engine_ids
    from .runners import readings_for

    readings = readings_for(out, target)
    found: dict[tuple[int, ...], list[str]] = {}
    for r in readings.runners:
        ids = r.boundary_ids if r.boundary_ids is not None else default_aux_ids(L, "boundary")
        if not r.error:
            found.setdefault(ids, []).append(f"vLLM {r.runner}")
    dialect = formats.get(to)
    if dialect.consumer != "vllm":
        ids = engine_boundaries(dialect.consumer, engine_ids(dialect.consumer, out.config, out.spec.aux_layer_ids), L)
        found.setdefault(ids, []).append(f"{dialect.consumer} (since {aux_reading(dialect.consumer).since})")
    return [(" and ".join(who), ids) for ids, who in found.items()]


def check_readings(out: DrafterCheckpoint, plan: ConversionPlan, target: Any) -> list[str]:
    """After writing: every vLLM runner's reading of the WRITTEN config (asked of vLLM's own selection code and
    draft model class where its interpreter is available, else the table: runners.readings_for) captures the
    intended boundaries and applies the intended flags (ConversionError naming the runner, the key and both id
    lists otherwise: nothing is left at DEST)."""
    from .runners import FLAG_NAMES, readings_for

    intended = plan.intended
    if intended is None:
        return []
    readings = readings_for(out, target)
    want = tuple(intended["boundary_ids"]) if intended["boundary_ids"] is not None else None
    where = f"{plan.dest} (staged)"
    skipped = []
    for r in readings.runners:
        if r.error:
            skipped.append(f"vLLM {r.runner} refuses the config ({r.error})")
            continue
        if want is not None and r.boundary_ids != want:
            got = r.ids_text()
            raise ConversionError(
                f"{where}: vLLM's {r.runner} runner reads {r.source or 'nothing'} as boundaries {got}, but the "
                f"drafter reads {list(want)} ({intended['basis']}); nothing was written",
                path=plan.dest, runner=r.runner, key=r.source, read=got, intended=list(want), dialect=plan.dest_dialect,
                hint="the destination cannot make this runner read the drafter's layers: pick another --to "
                     "(or --for vllm)")
        if r.flags is not None:
            flags = intended["flags"]
            wrong = [f for f in FLAG_NAMES if bool(r.flags.get(f)) != bool(flags.get(f))]
            if wrong:
                applies = ", ".join(f"{f}={str(bool(r.flags.get(f))).lower()}" for f in wrong)
                means = ", ".join(f"{f}={str(bool(flags.get(f))).lower()}" for f in wrong)
                raise ConversionError(
                    f"{where}: vLLM's {r.runner} runner applies {applies}, but the drafter has {means} "
                    f"({intended['basis']}); nothing was written", path=plan.dest, runner=r.runner,
                    dialect=plan.dest_dialect, hint="pick another --to (or --for vllm)")
    if len(readings.runners) < 2 and not skipped:
        return []
    read = readings.runners[0].ids_text() if want is None else str(list(want))
    line = (f"vLLM's runners read the written config as the drafter means it ({intended['basis']}): "
            f"{' = '.join(r.runner for r in readings.runners if not r.error)} capture {read}, same flags; "
            f"{readings.basis}")
    return [line] + skipped


# ------------------------------------------------------------------------------------------ plan

def plan_conversion(
    src: DrafterCheckpoint,
    dest: str | os.PathLike[str],
    to: str,
    *,
    dtype: str | None = None,
    target: TargetCheckpoint | None = None,
    aux_layer_ids: tuple[int, ...] | None = None,
    source_aux_convention: str | None = None,
    max_shard_size: int | None = None,
    spec_override: DrafterSpec | None = None,
    extra_tensors: dict[str, tuple[str, tuple[int, ...], str]] | None = None,
    measured: Any = None,
    base_model: str | None = None,
    embed_from_target: bool = False,
) -> ConversionPlan:
    """Everything a conversion will do, decided before a byte is written.

    `spec_override` and `extra_tensors` (canonical name -> (dtype, shape, note)) let `upgrade` reuse
    the same machinery: they declare flags and new tensors whose bytes the caller supplies.
    """
    dialect = writable_dialect(to)
    w = dialect.writer
    assert w is not None
    _refuse_source_errors(src, target, measured)
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

    quantized = layout_of(src)
    if dtype and quantized is not None:  # a cast would lose the scales' meaning: FP8 / NVFP4 stay as stored
        fail(f"the drafter is quantised ({quantized.describe()}); --dtype {dtype} would cast its scales and leave the "
             "quantised weights as they are: convert it without --dtype (its tensors are copied bit for bit)")
    out_dtype = CONFIG_NAMES[dtype] if dtype else None
    V, Vd = spec.vocab_size, spec.draft_vocab_size or spec.vocab_size
    reduced = V is not None and Vd is not None and Vd < V
    actions: list[TensorAction] = []
    dropped: list[tuple[str, str]] = []
    allowed = [re.compile(p + "$") for p in (w.allowed_tensors or (".*",))]
    for canon in src.view.names():
        stored = src.view.stored[canon]
        info = src.view.info(canon)
        if canon in ("d2t", "t2d") and not reduced:
            dropped.append((stored, "draft vocab == vocab: vLLM has no parameter for it"))
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
        if target is None or not target.ckpt.tensor_file:
            fail(f"'{dialect.from_canonical(canon)}' is needed ({why}) and the source has none: pass --target")
        actions.append(TensorAction(dialect.from_canonical(canon), canon, "from-target", float_dtype, shape, note=why))

    if reduced and "d2t" not in src.view:
        fail("reduced draft vocabulary without d2t: the mapping cannot be invented")
    if reduced and w.t2d and "t2d" not in src.view:
        actions.append(TensorAction(dialect.from_canonical("t2d"), "t2d", "derive", "BOOL", (V,),  # type: ignore[arg-type]
                                    note="t2d[i + d2t[i]] = true"))
    H = spec.hidden_size
    if not spec.has_lm_head:
        need_from_target("lm_head.weight", (Vd, H), "every engine needs the drafter's head")  # type: ignore[arg-type]
    if not spec.has_embed_tokens and (w.require_embed_tokens or (spec.target_hidden_size or H) != H):
        need_from_target("embed_tokens.weight", (V, H), "the destination keeps embed_tokens")  # type: ignore[arg-type]
    elif not spec.has_embed_tokens and embed_from_target:
        # the target's table, which every engine shares into such a drafter anyway; speculators' loader fills a
        # missing embed_tokens from the verifier only when the fresh tensor reads as NaN, so without it the
        # embedding is whatever memory held (docs/convert.md#embed-from-target)
        need_from_target("embed_tokens.weight", (V, H), "--embed-from-target: the target's embedding, shipped so "  # type: ignore[arg-type]
                         "that loaders which do not share it (speculators) need not")
    for canon, (dt, shape, note) in (extra_tensors or {}).items():
        name = dialect.from_canonical(canon)
        if not any(p.match(canon) for p in allowed):
            fail(f"{dialect.title} cannot hold '{name}'")
        actions = [x for x in actions if x.canonical != canon]  # an upgrade may replace a tensor
        actions.append(TensorAction(name, canon, "derive", out_dtype or dt, shape, note=note))
    actions.sort(key=lambda a: _tensor_order(a.canonical))

    aux_ids = _dest_aux_ids(src, spec, dialect, target, aux_layer_ids, source_aux_convention, fail)
    notes: list[str] = []
    fields: dict[str, tuple[str, list[int]]] = {}
    warnings = [message for when, message in w.warnings if all(getattr(spec, k) == v for k, v in when.items())]
    config = _dest_config(src, spec, dialect, aux_ids, float_dtype, target, fail, base_model, notes, fields,
                          warnings)
    quant_config, quant_file = converted_configs(src, dialect)
    if quant_config is not None:
        config["quantization_config"] = quant_config  # entries renamed to this dialect's tensor names
    first = next((fields[p][0] for p in (dialect.aux_ids_paths or w.aux_ids_paths) if p in fields), None)
    record: dict[str, Any] = {"aux_convention": first or w.aux_convention or dialect.aux_convention}
    if fields:
        record["aux_id_fields"] = {p: c for p, (c, _) in fields.items()}  # the numbering of each field written
    config["eaglectl_provenance"] = provenance(src, "convert", to, **record)
    intended = _intended(spec, aux_ids, target, measured, aux_layer_ids, measured_flags=spec_override is None)
    metadata = {"format": "pt", "eaglectl": json.dumps(config["eaglectl_provenance"], sort_keys=True)}
    shard_limit = max_shard_size or (_largest_file(src) if src.ckpt.layout == "sharded" else None)
    return ConversionPlan(
        source=src.ckpt.source, source_dialect=src.dialect.name, dest=os.fspath(dest), dest_dialect=to,
        tensors=actions, dropped=dropped, config=config, config_changes=_diff(src.ckpt.config or {}, config),
        shards=_shard(actions, shard_limit), metadata=metadata, notes=notes,
        side_files={QUANT_FILE: quant_file} if quant_file is not None else {}, intended=intended,
        warnings=warnings,
    )


def _intended(spec: DrafterSpec, boundary: tuple[int, ...] | None, target: TargetCheckpoint | None, measured: Any,
              given: tuple[int, ...] | None, measured_flags: bool = True) -> dict[str, Any]:
    """The drafter's meaning that every runner serving the output must read: its boundaries (the measured
    reading when the probe decided it, else --aux-layer-ids, else the declared one; the target's default when no
    ids are known and the target's depth is) and its flags (with the flags the measurement decided)."""
    L = target.num_layers if target is not None else None
    ids = boundary if boundary is not None else (default_aux_ids(L, "boundary") if L is not None else None)
    flags = {f: bool(getattr(spec, f)) for f in FLAGS}
    basis = "given (--aux-layer-ids)" if given is not None else "declared (the files)"
    if measured is not None and not measured.at_chance:
        if measured.boundary_ids is not None and ids is not None and tuple(sorted(ids)) == tuple(measured.boundary_ids):
            basis = "measured"
        for name, fact in measured.facts.items() if measured_flags else ():  # upgrade sets its own flags
            if name in flags and fact.measured in ("true", "false") and fact.measured != fact.declared:
                flags[name] = fact.measured == "true"
    return {"boundary_ids": list(ids) if ids is not None else None, "flags": flags, "basis": basis}


def _failer(src: DrafterCheckpoint, to: str) -> Any:
    def fail(message: str) -> None:
        raise ConversionError(f"{src.root} -> {to}: {message}", dialect=to, path=src.root)
    return fail


def _refuse_source_errors(src: DrafterCheckpoint, target: TargetCheckpoint | None, measured: Any = None) -> None:
    for f in run_checks(Context(src, target, measured=measured)):
        if f.severity == "error" and not f.rule.repaired_by_convert:
            raise ConversionError(f"{src.root}: source has error [{f.rule_id}] {f.message} ({f.locator})",
                                  path=src.root, hint=f"eaglectl inspect {src.source} shows every finding")


def _main_float_dtype(src: DrafterCheckpoint) -> str:
    counts: dict[str, int] = {}
    for info in src.ckpt.tensors.values():
        if info.dtype in FLOAT_DTYPES:
            counts[info.dtype] = counts.get(info.dtype, 0) + info.numel
    return max(counts, key=counts.__getitem__) if counts else "F32"


def _tensor_order(canon: str) -> tuple[int, str]:
    order = ("embed_tokens", "input_norm", "fc_norm", "fc.", "layers.", "norm.", "lm_head", "d2t", "t2d")
    return next((i for i, p in enumerate(order) if canon.startswith(p)), len(order)), canon


def _dest_aux_ids(src: DrafterCheckpoint, spec: DrafterSpec, dialect: Dialect, target: TargetCheckpoint | None,
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
    L = target.num_layers if target else None
    if boundary is None and L is not None and w.aux_ids_paths:
        boundary = default_aux_ids(L, "boundary")  # made explicit from the target, not guessed
    if boundary is None:
        return None
    if sorted(set(boundary)) != list(boundary):
        fail(f"aux ids {list(boundary)} must be ascending and distinct")
    if not w.aux_ids_paths:
        if L is None or tuple(boundary) != default_aux_ids(L, "boundary"):
            fail(f"{dialect.title} cannot record aux ids {list(boundary)} (it always uses (2, L//2, L-3), and both of "
                 "vLLM's runners would capture that default); "
                 + ("they are not that default for the target" if L is not None else
                    "pass --target to show they are that default"))
        return tuple(boundary)  # not written: every engine's default names them
    if w.exactly_3_aux and len(boundary) != 3:
        fail(f"{dialect.title} holds exactly 3 aux ids, not {len(boundary)}")
    if 0 in boundary and any(c == "output" for _, c in w.aux_fields(dialect.aux_convention)):
        fail("aux id 0 (the embeddings) has no output-of-layer equivalent")
    return boundary


def aux_fields_written(dialect: Dialect, boundary: tuple[int, ...]) -> dict[str, tuple[str, list[int]]]:
    """path -> (convention, ids) of every aux-id field the writer writes, from the drafter's boundary ids: vLLM's
    top-level key in vLLM's numbering, the dialect's own field in its own (formats/*.py, Writer.aux_conventions)."""
    w = dialect.writer
    assert w is not None
    return {path: (c, [i - 1 if c == "output" else i for i in boundary])
            for path, c in w.aux_fields(dialect.aux_convention)}


def _layer_config(src: DrafterCheckpoint) -> dict[str, Any]:
    skip = wrapper_keys()
    return {k: v for k, v in src.layer_config.data.items() if k not in skip}


_EC_IDS = "eagle_config.eagle_aux_hidden_state_layer_ids"


def _dest_config(src: DrafterCheckpoint, spec: DrafterSpec, dialect: Dialect, aux_ids: tuple[int, ...] | None,
                 float_dtype: str, target: TargetCheckpoint | None, fail: Any,
                 base_model: str | None = None, notes: list[str] | None = None,
                 written_fields: dict[str, tuple[str, list[int]]] | None = None,
                 warnings: list[str] | None = None) -> dict[str, Any]:
    """The destination config; `aux_ids` are boundary ids, written into `written_fields` (path -> (convention,
    ids), filled here) in each field's own numbering."""
    w = dialect.writer
    assert w is not None
    written_fields = written_fields if written_fields is not None else {}
    if aux_ids is not None and w.aux_ids_paths:
        written_fields.update(aux_fields_written(dialect, aux_ids))
    notes = notes if notes is not None else []
    warnings = warnings if warnings is not None else []
    layer = json.loads(json.dumps(_layer_config(src)))  # a deep copy: the plan owns its config
    if not is_hub_id(layer.get("_name_or_path")):
        layer.pop("_name_or_path", None)  # a training machine's path is no identity
    strip_null_template_fields(layer)  # a typed field is never written as null (rule null-template-field)
    layer["tie_word_embeddings"] = False  # the drafter's head is its own (sglang would tie it)
    if spec.rope_theta is None and "rope_parameters" not in layer:
        layer["rope_theta"] = 10000.0  # absent means base 10000 (SafeAILab); written explicitly
    if isinstance(layer.get("rope_parameters"), dict) and "rope_theta" in layer:
        layer["rope_parameters"]["rope_theta"] = layer["rope_theta"]  # both encodings agree
    n_aux = spec.num_aux_hidden_states
    draft_vocab = spec.draft_vocab_size or spec.vocab_size
    torch_dtype = TO_CONFIG.get(float_dtype, "float32")
    top: dict[str, Any] = {}
    if w.style == "speculators":
        verifier = _verifier(src, target, base_model)
        if verifier is None:
            fail("the speculators format names its verifier (target): pass --base-model ORG/NAME or --target")
        assert verifier is not None
        if verifier["name_or_path"] is None:
            warnings.append("the speculators verifier is null (no Hub id of the target is known): the speculators "
                            "library's SpeculatorModel.from_pretrained raises OSError on it (rule verifier-unnamed), "
                            "and vllm serve needs --speculative-config and the target; pass --base-model ORG/NAME "
                            "to name it")
        methods = src.config.raw("speculators_config.proposal_methods")
        tokens = 3
        if isinstance(methods, list) and methods and isinstance(methods[0], dict):
            k = methods[0].get("speculative_tokens")
            tokens = k if isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 64 else 3
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
        top.update({"architectures": [_dest_architecture(src, spec, w.architectures[spec.arch])], **layer})
    top["draft_vocab_size"] = draft_vocab
    top["target_hidden_size"] = spec.target_hidden_size
    for flag in FLAGS:
        if flag in w.omit_false and not getattr(spec, flag):
            continue  # the dialect's own loader reads an explicit false differently from an absent key
        for path in w.flag_paths.get(flag, ()):
            config_set(top, path, bool(getattr(spec, flag)))
        if flag in w.explicit_false:
            config_set(top, flag, False)  # plan_conversion refused a true value above
    if aux_ids is not None:
        for path, (_, ids) in written_fields.items():
            config_set(top, path, ids)
    if n_aux is not None and n_aux != 3:  # vLLM sizes fc for 3 unless told
        top["num_aux_hidden_states"] = n_aux
        if aux_ids is not None and w.aux_ids_paths and _EC_IDS not in written_fields:
            config_set(top, _EC_IDS, list(aux_ids))  # vLLM's sizing path, in vLLM's numbering
            written_fields[_EC_IDS] = ("boundary", list(aux_ids))
    for path, value in w.extra_config.items():
        config_set(top, path, value)
    top["torch_dtype"] = torch_dtype
    return top


def _dest_architecture(src: DrafterCheckpoint, spec: DrafterSpec, written: str) -> str:
    """The writer's class for the family, except that an MLA source spelled any known way keeps its
    DeepSeek version under vLLM's registered name (rules/layout.py MLA_SPELLINGS)."""
    from .rules.layout import MLA_SPELLINGS, REGISTERED

    archs = src.config.str_list("architectures") or ()
    name = MLA_SPELLINGS.get(archs[0]) if archs and spec.arch == "mla" else None
    return name if name in REGISTERED["mla"] and written in REGISTERED["mla"] else written


def _verifier(src: DrafterCheckpoint, target: TargetCheckpoint | None, base_model: str | None) -> dict[str, Any] | None:
    """The speculators verifier, named by Hub id only: --base-model, the target's own id, the source's
    verifier when that is one; else null (vLLM needs the key, and a local path names nothing once
    published). None: nothing at all is known of the target."""
    existing = src.config.dict("speculators_config.verifier") or {}
    named = existing.get("name_or_path") if isinstance(existing.get("name_or_path"), str) else None
    own_null = "name_or_path" in existing and existing["name_or_path"] is None \
        and src.config.dict("eaglectl_provenance") is not None  # eaglectl wrote it null (a local target)
    if target is None and base_model is None and named is None and not own_null:
        return None
    name = base_model or (target.hub_id if target is not None else None) or (named if is_hub_id(named) else None)
    archs = list(target.architectures) if target is not None else existing.get("architectures") or []
    return {"name_or_path": name, "architectures": archs}


# The source digest is computed from the bytes read while writing and patched into config and
# safetensors metadata afterwards; same length, so the header layout does not move.
DIGEST_PLACEHOLDER = "sha256:" + "0" * 64


def provenance(src: DrafterCheckpoint, operation: str, to: str, **extra: Any) -> dict[str, Any]:
    """Where the output came from, as it may be published: a Hub source by its id, a local one by its
    basename (the digest identifies its bytes); never a path of this machine (eaglectl/publish.py)."""
    from .publish import public_name, public_value

    ref = src.ckpt.hub_ref
    out = {
        "tool": f"eaglectl {__version__}",
        "operation": operation,
        "source": ref.display if ref else public_name(src.ckpt.source),
        "source_dialect": src.dialect.name,
        "source_digest": DIGEST_PLACEHOLDER,
        "dialect": to,
    }
    out.update(public_value(extra))
    return out


def _public_provenance(plan: ConversionPlan) -> None:
    """What a caller added to the plan's provenance (upgrade's calibration record names its target and
    capture) is made public before it is written: Hub ids and basenames only."""
    from .publish import public_value

    prov = plan.config.get("eaglectl_provenance")
    if isinstance(prov, dict):
        plan.config["eaglectl_provenance"] = prov = public_value(prov)
        if "eaglectl" in plan.metadata:
            plan.metadata["eaglectl"] = json.dumps(prov, sort_keys=True)


def _flat(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config as {dotted key path: value}: objects are opened (an empty one is a value), lists are values."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, path + "."))
        else:
            out[path] = v
    return out


def _diff(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Key-level config changes: each changed leaf by its dotted path (`speculators_config.verifier.
    name_or_path`), never a whole nested object; a key that only changed place (into or out of
    `transformer_layer_config`, `eagle_config`) is one "moved" change naming both paths."""
    a, b = _flat(old), _flat(new)
    removed = [k for k in a if k not in b]
    added = [k for k in b if k not in a]
    moved: dict[str, str] = {}  # new path -> old path
    for k in added:
        leaf = k.rsplit(".", 1)[-1]
        # the same key under another parent: the value may also have changed
        frm = next((r for r in removed if r not in moved.values() and r.rsplit(".", 1)[-1] == leaf
                    and (r.endswith("." + k) or k.endswith("." + r) or r.count(".") != k.count("."))), None)
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


def _largest_file(src: DrafterCheckpoint) -> int:
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
    size = int(float(m.group(1)) * scale)
    if size <= 0:
        raise ValueError(f"a shard size must be positive, not {text!r}")
    return size


# --------------------------------------------------------------------------------------- execute

class SourceDigest:
    """sha256 of every source tensor (the provenance digest), computed off the main thread.

    Local copied ranges are hashed from the page cache by a worker while the main thread copies;
    bytes the main thread reads anyway (casts) are hashed as they pass; the rest at the end.
    """

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self.per_tensor: dict[str, Future[str] | str] = {}
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="eaglectl-sha256")

    def start(self, stored: str) -> None:
        r = self.ckpt.tensor_file[stored].byte_range(stored)
        if r is not None and stored not in self.per_tensor:
            self.per_tensor[stored] = self.pool.submit(sha256_range, r)

    def chunks(self, stored: str, chunks: Any) -> Any:
        """Pass `chunks` (the stored tensor's raw bytes) through, hashing them on the way."""
        h = hashlib.sha256()
        for chunk in chunks:
            h.update(chunk)
            yield chunk
        self.per_tensor[stored] = h.hexdigest()

    def result(self) -> str:
        h = hashlib.sha256()
        try:
            for name in sorted(self.ckpt.tensor_file):
                info = self.ckpt.tensors[name]
                got = self.per_tensor.get(name)
                if got is None:
                    digest = hashlib.sha256()
                    for chunk in raw_chunks(self.ckpt, name):
                        digest.update(chunk)
                    got = digest.hexdigest()
                value = got.result() if isinstance(got, Future) else got
                h.update(f"{name}|{info.dtype}|{list(info.shape)}|{value}\n".encode())
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
        return "sha256:" + h.hexdigest()


def raw_chunks(ckpt: Checkpoint, stored: str, chunk: int = 1 << 24) -> Any:
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


def _target_table(target: TargetCheckpoint, canon: str) -> str:
    which = canon.split(".")[0]
    name = target.table_name(which)
    if name is None:
        raise ConversionError(f"{target.source}: the target has no {which} tensor", path=target.source)
    return name


def tensor_entry(a: TensorAction, src: DrafterCheckpoint, target: TargetCheckpoint | None, supplied: dict[str, bytes],
                 digest: SourceDigest) -> TensorEntry:
    """How one destination tensor's bytes are produced, exactly as the plan says."""
    if a.action == "copy":
        assert a.source is not None
        r = src.ckpt.tensor_file[a.source].byte_range(a.source)
        if r is not None:
            digest.start(a.source)
            return TensorEntry(a.dest, a.dtype, a.shape, copy=r)
        return TensorEntry(a.dest, a.dtype, a.shape, lambda: digest.chunks(a.source, raw_chunks(src.ckpt, a.source)))
    if a.action == "cast":
        assert a.source is not None and a.source_dtype is not None
        src_dtype = a.source_dtype

        def cast_chunks() -> Any:
            for raw in digest.chunks(a.source, raw_chunks(src.ckpt, a.source)):
                yield casting.cast(raw, src_dtype, a.dtype)  # elementwise; 16 MB chunks hold whole elements

        return TensorEntry(a.dest, a.dtype, a.shape, cast_chunks)
    if a.action == "derive":
        if a.canonical in supplied:
            data = supplied[a.canonical]
            return TensorEntry(a.dest, a.dtype, a.shape, lambda: (data,))
        assert a.canonical == "t2d"

        def t2d() -> Any:
            d2t = src.view.read("d2t").astype(np.int64)
            mask = np.zeros(a.shape[0], dtype=np.bool_)
            mask[np.arange(len(d2t)) + d2t] = True
            yield mask.tobytes()

        return TensorEntry(a.dest, a.dtype, a.shape, t2d)
    assert a.action == "from-target" and target is not None
    name = _target_table(target, a.canonical)

    def table() -> Any:
        if a.canonical == "lm_head.weight" and "d2t" in src.view:
            rows = (np.arange(a.shape[0]) + src.view.read("d2t").astype(np.int64)).tolist()  # arange + d2t
            yield casting.encode(target.ckpt.read_rows(name, rows), a.dtype)
        else:
            yield casting.encode(target.ckpt.read(name), a.dtype)

    return TensorEntry(a.dest, a.dtype, a.shape, table)


def plan_inputs(src: DrafterCheckpoint, target: TargetCheckpoint | None, *extra: str) -> list[str]:
    """Every local path a conversion reads: DEST may overlap none of them."""
    paths = [*src.ckpt.identities, *extra]
    for ckpt in [src.ckpt] + ([target.ckpt] if target is not None else []):
        paths += list(ckpt.identities)
        if Path(ckpt.root).exists():
            paths.append(ckpt.root)
    return paths


def execute(plan: ConversionPlan, src: DrafterCheckpoint, *, target: TargetCheckpoint | None = None,
            force: bool = False, supplied: dict[str, bytes] | None = None, progress: Progress = passthrough,
            after_write: Callable[[DrafterCheckpoint], list[str]] | None = None,
            inputs: tuple[str, ...] = ()) -> ConversionResult:
    """Write exactly `plan` into a staging folder, check it, then rename it to DEST.

    `after_write(out)` (the behavioural check, upgrade's fidelity) runs on the staged output, interpreted,
    before the rename and returns more lines for `checked`; `inputs` are further paths DEST may not overlap.
    """
    supplied = supplied or {}
    _public_provenance(plan)
    by_name = {a.dest: a for a in plan.tensors}
    wrap = progress
    names = plan.file_names()
    total = sum(a.nbytes for a in plan.tensors)
    with staged_output(plan.dest, force=force, sources=plan_inputs(src, target, *inputs)) as stage:
        digest = SourceDigest(src.ckpt)
        try:
            written: list[Written] = []
            for file_name, members in wrap(list(zip(names, plan.shards, strict=True)), label="writing", total=total,
                                           weight=lambda item: sum(by_name[n].nbytes for n in item[1]), unit="B"):
                entries = [tensor_entry(by_name[n], src, target, supplied, digest) for n in members]
                written.append(write_safetensors(stage / file_name, entries, plan.metadata))
            # flush to disk (the device works) while this core re-reads and compares (the page cache works)
            with ThreadPoolExecutor(1, thread_name_prefix="eaglectl-fsync") as flusher:
                flushed = [flusher.submit(_fsync, w.path) for w in written]
                checked = [check_tensors(plan, written, src)]
                for f in flushed:
                    f.result()
            source_digest = digest.result()
        except OSError as e:
            raise filesystem_error(e, "write the output in", stage) from None
        finally:
            digest.pool.shutdown(wait=True, cancel_futures=True)
        for file_name in names:
            _patch(stage / file_name, DIGEST_PLACEHOLDER.encode(), source_digest.encode())
        if len(names) > 1:
            weight_map = {n: f for f, members in zip(names, plan.shards, strict=True) for n in members}
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (stage / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        config = json.loads(json.dumps(plan.config).replace(DIGEST_PLACEHOLDER, source_digest))
        (stage / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for side_name, side_data in plan.side_files.items():  # hf_quant_config.json of a quantised drafter
            (stage / side_name).write_text(json.dumps(side_data, indent=2) + "\n")
        out, lines = check_checkpoint(stage, plan, written, target)
        checked += lines
        checked += check_readings(out, plan, target)
        if after_write is not None:
            checked += after_write(out)
        src.ckpt.ensure_unchanged()
        if target is not None:
            target.ckpt.ensure_unchanged()
        checked.append("the source did not change while it was read")
    return ConversionResult(plan, True, checked, source_digest)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _patch(path: Path, old: bytes, new: bytes) -> None:
    """Replace a same-length placeholder inside a safetensors header (the metadata)."""
    assert len(old) == len(new)
    with path.open("r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = f.read(n)
        at = header.find(old)
        if at < 0:
            return
        f.seek(8 + at)
        f.write(new)


def check_tensors(plan: ConversionPlan, written: list[Written], src: DrafterCheckpoint) -> str:
    """Re-read every written tensor: a copied tensor's bytes equal the source's (compared directly), a
    produced one's equal what was written (the CRC-32 taken while writing)."""
    ranges = {name: (w, r) for w in written for name, r in w.ranges.items()}
    for a in plan.tensors:
        w, r = ranges[a.dest]
        source = src.ckpt.tensor_file[a.source].byte_range(a.source) if a.action == "copy" and a.source else None
        ok = same_bytes(source, r) if a.dest not in w.crc32 and source is not None else \
            crc32_range(r) == w.crc32.get(a.dest)
        if not ok:
            raise ConversionError(f"{plan.dest} (staged): tensor '{a.dest}' does not equal its source ({a.action})",
                                  tensor=a.dest)
    return f"{len(plan.tensors)} tensors equal their source or documented transform (re-read after writing)"


def check_checkpoint(stage: Path, plan: ConversionPlan, written: list[Written], target: TargetCheckpoint | None
                     ) -> tuple[DrafterCheckpoint, list[str]]:
    """The finished output opens, holds exactly the planned tensors where they were written, is detected
    as the planned dialect, and inspect finds no errors in it: (the output, interpreted; what was checked)."""
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
    checks = []
    d = interpret(out)
    if d.dialect.name != plan.dest_dialect:
        raise ConversionError(f"{where}: written checkpoint is detected as {d.dialect.name}, not {plan.dest_dialect}")
    checks.append(f"detected as {d.dialect.name}")
    errors = [f for f in run_checks(Context(d, target)) if f.severity == "error"]
    if errors:
        raise ConversionError(f"{where}: inspect finds [{errors[0].rule_id}] {errors[0].message}",
                              tensor=errors[0].locator)
    checks.append("inspect finds no errors")
    return d, checks
