"""`eaglectl convert`: one dialect to another, planned first, streamed, fail-closed, checked after writing.

This module is the command (`run`, `execute`, the result). `plan.plan_conversion` decides everything
(tensor renames, casts, drops, derivations, the config) and `execute` does exactly that plan: `--dry-run` prints
the same object a real run executes. Semantics travel through the DrafterSpec: every flag is written explicitly
where the destination keeps it, aux ids are translated between conventions, `d2t` is validated and `t2d` derived
when needed, and tables missing from the source come from `--target` (single tensor / row reads). Anything the
destination cannot represent is a ConversionError naming it. The output is built in a staging folder with the
mechanisms of `write.py` (streamed copies, the digest computed alongside, the post-write checks),
re-opened, detected and inspected, and only then renamed to DEST.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import formats
from ...checkpoint.drafter import DrafterCheckpoint
from ...checkpoint.plan import DIGEST_PLACEHOLDER, UNNAMED, ConversionPlan
from ...checkpoint.target import TargetCheckpoint, open_target
from ...engines import sglang
from ...engines.facts import engines_of
from ...engines.serving import pick, serve_command
from ...errors import BehaviourChangedError, ConversionError, UsageError, filesystem_error
from ...families.checkpoint import FamilyCheckpoint, open_any
from ...families.convert import plan_family, recheck
from ...formats.families import writable_layouts
from ...io.atomic import check_destination, fsync, local_inputs, staged_output
from ...io.safetensors import Written, write_safetensors
from ...measure.target import Target
from ...progress import Progress, passthrough
from ...result import Result
from ..requests import ConvertRequest
from .gguf import execute_gguf
from .plan import for_engines, plan_conversion, writable_dialect
from .write import (
    SourceDigest,
    check_checkpoint,
    check_readings,
    check_tensors,
    distinct_readings,
    patch_header,
    public_provenance,
    tensor_entry,
)

if TYPE_CHECKING:
    from pathlib import Path

    from ...measure.probe import Measurement

Recheck = Callable[["Path", ConversionPlan, list[Written]], list[str]]


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


def run(req: ConvertRequest, progress: Progress = passthrough) -> ConversionResult:
    """Convert SOURCE to dialect `to` at DEST (or only plan it with `dry_run`); with `for_engine` instead of
    `to`, to the dialect that engine serves this drafter from best (serving.pick), with its serve line.

    With `target` (when it can be run) the source's aux reading is measured and wins over the dialect
    table, and the written output must draft exactly like the source under the reference loop, read the
    way the destination's serving engine reads it (else BehaviourChangedError, nothing at DEST). Whatever can
    be refused without measuring (the destination, the dialect) is refused before the target is touched."""
    source, dest, to, for_engine, dtype, base_model = req.source, req.dest, req.to, req.for_engine, req.dtype, \
        req.base_model
    if bool(to) == bool(for_engine):  # exactly one of them (the CLI's --to / --for, or a manifest line's keys)
        raise UsageError("give --to DIALECT or --for ENGINE (or a 'to' / 'for' key per manifest line), not both"
                         if to else "--to DIALECT or --for ENGINE is required (or a 'to' / 'for' key per manifest "
                         "line)", hint="eaglectl convert SOURCE DEST --for vllm")
    src = open_any(source, from_dialect=req.from_dialect, allow_pickle=req.allow_pickle)
    if not src.eagle3_layout:  # DFlash: between its producers' layouts (families/convert.py)
        return _convert_family(req, src, progress)  # type: ignore[arg-type]
    tgt = Target.open(req.target, req.states, progress=progress)
    checkpoint = tgt.checkpoint if tgt is not None else None
    if to is not None:
        writable_dialect(to)
    inputs = local_inputs(src, tgt)  # the drafter, the target and its capture (--states)
    if not req.dry_run:
        check_destination(dest, force=req.force, sources=inputs)
    # the provenance digest hashes the source from now on, on the other cores, while this one plans and writes
    digest = None if req.dry_run else SourceDigest(src.ckpt)
    try:
        measured = None
        notes: list[str] = []
        if tgt is not None and req.measure:
            why = tgt.why_not_measurable()
            if why is None:
                from ...measure.probe import try_measure  # torch and transformers: only when the target can be run

                measured, why = try_measure(src, tgt, progress=progress)
            if why:
                notes.append(why)

        named = UNNAMED if base_model is None and for_engine is not None else base_model  # --for: never refused for it

        engines = engines_of(for_engine) if for_engine is not None else ("vllm",)

        def plan_for(dialect: str) -> tuple[ConversionPlan, tuple[int, ...] | None, str | None, list[str]]:
            ids, convention, more = follow_measurement(src, measured, req.source_aux_convention, req.aux_layer_ids,
                                                       dialect)
            return for_engines(plan_conversion(src, dest, dialect, dtype=dtype, target=checkpoint, aux_layer_ids=ids,
                                               source_aux_convention=convention, max_shard_size=req.max_shard_size,
                                               measured=measured, base_model=named,
                                               embed_from_target=req.embed_from_target), src, checkpoint,
                               engines), ids, convention, more

        serve = None
        if for_engine is not None:
            to, (plan, ids, convention, more), serve = pick(src, engines, plan_for)
        else:
            assert to is not None
            plan, ids, convention, more = plan_for(to)
        plan.notes[:0] = notes + more
        if serve is not None:
            serve_lines(serve, src, dest, checkpoint, base_model, plan.config, engines)
        if req.dry_run:
            return ConversionResult(plan, False, [], serve=serve)
        check = None
        if tgt is not None and tgt.runnable and measured is not None and not measured.at_chance:
            check = behaviour_check(src, measured, tgt, ids, convention, to)
        elif tgt is not None and tgt.states is not None and measured is not None:
            plan.notes.append("measured on the capture; the written output's drafting was not replayed (that needs a "
                              "runnable --target without --states)")
        result = execute(plan, src, target=checkpoint, force=req.force, progress=progress, after_write=check,
                         inputs=inputs, digest=digest)
        result.serve = serve
        return result
    finally:
        if digest is not None:
            digest.close()


def follow_measurement(src: DrafterCheckpoint, m: Measurement | None, given: str | None,
                       given_ids: tuple[int, ...] | None, to: str
                       ) -> tuple[tuple[int, ...] | None, str | None, list[str]]:
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
                    convention: str | None, to: str) -> Callable[[DrafterCheckpoint], list[str]]:
    """After writing: the reference loop drafts exactly as much with the output (read the way the
    destination's engine reads it) as with the source (read as measured), on the same greedy continuations."""
    from ...measure.probe import LOOP_TOKENS, flag_overrides, probe_prompts, replay_counts
    from ...model.loader import load_reference

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
        a = replay_counts(load_reference(src), target, prompts, boundaries=src_ids, k=k, max_tokens=LOOP_TOKENS,
                       **flag_overrides(m))
        counts = lambda c: (c.num_drafts, c.num_accepted_tokens, c.accepted_per_pos)  # noqa: E731
        lines = []
        # once per distinct reading of the written files (normally one: the post-write check made vLLM's two
        # runners agree), under every engine that serves them
        for who, out_ids in distinct_readings(out, to, target, L):
            b = replay_counts(load_reference(out), target, prompts, boundaries=out_ids, k=k, max_tokens=LOOP_TOKENS)
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


def serve_lines(serve: dict[str, Any], src: DrafterCheckpoint, dest: str, target: TargetCheckpoint | None,
                base_model: str | None, config: dict[str, Any], engines: tuple[str, ...]) -> None:
    """The line that serves DEST for each engine the conversion is for (`command`: vLLM's, when it is one)."""
    if "vllm" in engines:
        serve["command"] = serve_command(src, dest, target, base_model, config)
    if "sglang" in engines:
        served = os.path.abspath(target.source) if target is not None and target.ckpt.hub_ref is None else (
            base_model or (target.hub_id if target is not None else None) or "<target-model>")
        serve["sglang_command"] = sglang.serve_line(served, os.path.abspath(dest), src.spec.sliding_window)


# what a request may ask that only an EAGLE-3 conversion does
_EAGLE3_ONLY = (("aux_layer_ids", "--aux-layer-ids"), ("source_aux_convention", "--source-aux-convention"),
                ("embed_from_target", "--embed-from-target"), ("for_engine", "--for"), ("states", "--states"))


def _convert_family(req: ConvertRequest, src: FamilyCheckpoint, progress: Progress) -> ConversionResult:
    """A family's drafter between its producers' layouts (families/convert.py): planned, executed and re-checked by
    the same machinery as EAGLE-3's; an option only an EAGLE-3 conversion takes is refused by name."""
    for name, option in _EAGLE3_ONLY:
        if getattr(req, name):
            raise UsageError(f"{src.source}: {option} is for EAGLE-3 drafters; this is a {src.family.name} drafter",
                             hint=f"eaglectl convert {src.source} DEST --to {writable_layouts()[0]} (its layouts: "
                                  f"{', '.join(writable_layouts())})")
    target = open_target(req.target) if req.target else None
    plan = plan_family(src, req.dest, req.to or "", dtype=req.dtype, target=target, base_model=req.base_model,
                       max_shard_size=req.max_shard_size)
    if req.dry_run:
        return ConversionResult(plan, False, [])
    inputs = local_inputs(src, target)
    check_destination(req.dest, force=req.force, sources=inputs)
    return execute(plan, src, force=req.force, progress=progress, inputs=inputs,
                   recheck=lambda stage, p, written: recheck(stage, p, written, target))


def execute(plan: ConversionPlan, src: DrafterCheckpoint | FamilyCheckpoint, *, target: TargetCheckpoint | None = None,
            force: bool = False, supplied: dict[str, bytes] | None = None, progress: Progress = passthrough,
            after_write: Callable[[DrafterCheckpoint], list[str]] | None = None,
            inputs: list[str] | None = None, recheck: Recheck | None = None, digest: SourceDigest | None = None
            ) -> ConversionResult:
    """Write exactly `plan` into a staging folder, check it, then rename it to DEST.

    `after_write(out)` (the behavioural check, upgrade's fidelity) runs on the staged output, interpreted,
    before the rename and returns more lines for `checked`. `recheck(stage, plan, written)` replaces the EAGLE-3
    re-checks of the staged output (a family's layouts: families/convert.py). `digest`: the source's,
    started by the caller as soon as it opened the source (else here).
    """
    supplied = supplied or {}
    public_provenance(plan)
    if plan.dest_dialect == "gguf":  # one llama.cpp file, not safetensors (gguf.py)

        return ConversionResult(plan, True, *execute_gguf(plan, src, target=target, force=force,
                                                                after_write=after_write, inputs=inputs, digest=digest))
    by_name = {a.dest: a for a in plan.tensors}
    names = plan.file_names()
    total = sum(a.nbytes for a in plan.tensors)
    with staged_output(plan.dest, force=force, sources=local_inputs(src, target) if inputs is None else inputs) as stage:
        digest = digest or SourceDigest(src.ckpt)
        try:
            written: list[Written] = []
            for file_name, members in progress(list(zip(names, plan.shards, strict=True)), label="writing", total=total,
                                           weight=lambda item: sum(by_name[n].nbytes for n in item[1]), unit="B"):
                entries = [tensor_entry(by_name[n], src, target, supplied, digest) for n in members]
                written.append(write_safetensors(stage / file_name, entries, plan.metadata))
            # flush to disk (the device works) while this core re-reads and compares (the page cache works)
            with ThreadPoolExecutor(1, thread_name_prefix="eaglectl-fsync") as flusher:
                flushed = [flusher.submit(fsync, w.path) for w in written]
                checked = [check_tensors(plan, written, src)]
                for f in flushed:
                    f.result()
            source_digest = digest.result()
        except OSError as e:
            raise filesystem_error(e, "write the output in", stage) from None
        finally:
            digest.close()
        for file_name in names:
            patch_header(stage / file_name, DIGEST_PLACEHOLDER.encode(), source_digest.encode())
        if len(names) > 1:
            weight_map = {n: f for f, members in zip(names, plan.shards, strict=True) for n in members}
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (stage / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        config = json.loads(json.dumps(plan.config).replace(DIGEST_PLACEHOLDER, source_digest))
        (stage / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for side_name, side_data in plan.side_files.items():  # hf_quant_config.json of a quantised drafter
            (stage / side_name).write_text(json.dumps(side_data, indent=2) + "\n")
        if recheck is not None:
            checked += recheck(stage, plan, written)
        else:
            out, lines = check_checkpoint(stage, plan, written, target)
            checked += lines + check_readings(out, plan, target)
            if after_write is not None:
                checked += after_write(out)
        src.ckpt.ensure_unchanged()
        if target is not None:
            target.ckpt.ensure_unchanged()
        checked.append("the source did not change while it was read")
    return ConversionResult(plan, True, checked, source_digest)
