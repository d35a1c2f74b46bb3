"""`eaglectl upgrade`: an EAGLE-3 drafter to the EAGLE-3.1 layout (`fc_norm`, `norm_output`).

Not function-preserving (docs/math.md#upgrade-is-not-exact): `fc_norm` rescales every aux chunk per token and
`norm_output` changes what steps ≥ 1 see. The result is a warm start that needs fine-tuning, and
says so in its config and safetensors metadata. `fc_norm` weights are initialised by one of:

- `ones`: γ_j = 1, the plain warm start;
- `harmonic`: γ_j = c_j·1 with c_j the harmonic mean of chunk j's RMS (docs/math.md#upgrade-inits: makes each
  block's linear contribution unbiased);
- `calibrated`: per-channel least squares. With u_t the per-chunk normalised aux features and c_t
  the raw ones, choose γ (n·H_t values) minimising Σ_t ‖W_fc diag(u_t) γ − W_fc c_t‖², i.e. the FC
  output of the 3.1 drafter closest to the 3.0 one over the calibration tokens. Normal equations
  (M ⊙ U) γ = (M ⊙ Cᵀ) 1 with M = W_fcᵀW_fc, U = Σ u uᵀ, C = Σ c uᵀ; a tiny ridge keeps it stable;
- `refit`: keep γ = 1 and refit W_fc by ridge regression from u_t to the 3.0 FC output
  (W' = W_fc Cᵀ (U + λI)⁻¹): the richest linear option, it changes `fc.weight` too;
- `fit`: the best closed-form init, then γ (and with `fit_fc` W_fc) tuned by the target's own next-token
  likelihood under the drafter's teacher-forced multi-step unrolling (fitting.py), early-stopped on held-out
  sequences. `auto` keeps it only when it beats every closed-form init on prompts it was not fitted on.

Statistics stream (calibration.py) from the real target (`--target`) on calibration text, or from a
capture of it (`--states DIR`, any size); position 0 of each sequence (the sink token) is excluded.
`auto` ranks the inits by the reference loop's acceptance when the target runs (on a part of the user's
`--prompts`, else on the bundled kinds of text, kept by the kind where each keeps least), else by the FC-output
error on held-out requests of the capture, else takes `ones`.

The acceptance lengths before and after (`acceptance`) are the reference loop's on other prompts, never ranked
or fitted on: the first part of the user's `--prompts` (fidelity.workloads_for), else smoke's default prompts.
The source and the written output are each read the way vLLM (V1 runner) reads their files: greedy counts that
equal vLLM's exactly (docs/smoke.md#engine-parity), so they are what `acceptance.reproduce` (a `smoke` command)
prints.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ...checkpoint.drafter import DrafterCheckpoint, open_drafter
from ...engines.facts import engines_of
from ...engines.serving import pick
from ...errors import ConversionError, UsageError
from ...io import cast as casting
from ...io.atomic import check_destination, local_inputs
from ...measure.target import Target
from ...progress import Progress, passthrough
from ...result import Result
from ..convert.command import ConversionPlan, ConversionResult, execute, plan_conversion, writable_dialect
from ..convert.plan import Additions, for_engines
from ..requests import UpgradeRequest
from .fidelity import (
    Setup,
    before_after,
    check_written,
    workloads_for,
)
from .inits import CALIBRATION_TOKENS, CHOICES, NEEDS_TARGET, Choice, choose_init, from_continuations

if TYPE_CHECKING:

    from ...measure.parity import ParityReport
    from ...measure.probe import Measurement
    from ...model.loader import LoadedDrafter
    from ...spec import DrafterSpec
    from .fidelity import Workload

WARM_START = "warm start: fine-tune before publishing"


@dataclass
class UpgradeResult(Result):
    SCHEMA, COMMAND = "eaglectl.upgrade/1", "upgrade"

    source: str
    dest: str
    changed: bool
    steps: list[str]  # what was done, in order
    init: str | None
    statistics: dict[str, Any]
    conversion: ConversionResult
    fidelity: ParityReport | None = None  # mode fidelity, DEST against SOURCE
    notes: list[str] = field(default_factory=list)
    init_candidates: list[dict[str, Any]] = field(default_factory=list)  # measured on held-out text
    layers: dict[str, Any] | None = None  # the boundaries calibration used, and how they were known
    acceptance: dict[str, Any] | None = None  # AL before / after on prompts never ranked on, as vLLM reads the files
    fit: dict[str, Any] | None = None  # the `fit` init's report (steps, tokens, held-out gain, seconds)
    next_command: str | None = None  # what to run next, as printed

    def summary_line(self) -> str:
        """The one line `-q` prints: what was done, the acceptance length it kept, and that it is a warm start."""
        if not self.steps:
            return "nothing to change"
        acc = self.acceptance or {}
        al = (f"; acceptance length {acc['before']:.3f} -> {acc['after']:.3f}"
              + (f" ({acc['kept']:.1%} kept)" if acc.get("kept") is not None else "")) if acc.get("before") else ""
        return ", ".join(self.steps) + (f" (fc_norm init {self.init})" if self.init else "") + al + f"; {WARM_START}"

    def payload(self) -> dict[str, Any]:
        fid = self.fidelity.to_json() if self.fidelity is not None else None
        acc = self.acceptance or {}
        return {
            "source": self.source,
            "dest": self.dest, "changed": self.changed, "steps": self.steps, "init": self.init,
            "statistics": self.statistics, "needs_fine_tuning": self.changed, "dry_run": not self.conversion.written,
            "fidelity": None if fid is None else {"inputs": fid["inputs"], "per_step": [
                {k: s[k] for k in ("step", "top1_agreement", "near_ties", "kl_mean", "kl_max", "state_cos_mean")}
                for s in fid["per_step"]]},
            "init_candidates": self.init_candidates, "layers": self.layers, "fit": self.fit,
            "acceptance_length_before": acc.get("before"), "acceptance_length_after": acc.get("after"),
            "acceptance": self.acceptance, "warm_start": WARM_START if self.changed else None,
            "next_command": self.next_command,
            "plan": self.conversion.plan.to_json(), "checked": self.conversion.checked, "notes": self.notes,
        }


FIDELITY_STEPS = 3


def run(req: UpgradeRequest, progress: Progress = passthrough) -> UpgradeResult:
    """Take SOURCE to the EAGLE-3.1 layout at DEST. The target (when given) is loaded once, its states over
    the calibration text are captured once, and its greedy continuations of the ranking (and fitting) prompts
    are decoded once; the probe, calibration, the ranking of the inits, the acceptance before / after and the
    fidelity report all read them. `runner` is the vLLM runner whose reading of a config's aux ids the
    figures follow (v1: every CPU build)."""
    source, dest, init, target, prompts, to = req.source, req.dest, req.init, req.target, req.prompts, req.to
    src = open_drafter(source, from_dialect=req.from_dialect, allow_pickle=req.allow_pickle)
    tgt = Target.open(target, req.states, progress=progress, text=req.calibration_text)
    again = f"eaglectl upgrade {shlex.quote(source)} {shlex.quote(str(dest))}" + (
        " --allow-pickle" if req.allow_pickle else "")
    inputs = local_inputs(src, tgt, prompts)  # the drafter, the target, its capture (--states), the prompts
    if not req.dry_run:  # before anything is measured: an output over an input is the first thing refused
        check_destination(dest, force=req.force, sources=inputs)
    engines = engines_of(req.for_engine) if req.for_engine else ("vllm",)
    if req.for_engine:
        to = _dialect_for(req, src, tgt, engines)
    to, steps = upgrade_steps(src, tgt, init, req.fc_norm, req.norm_output, to, target, prompts, again)
    new_spec = replace(src.spec, fc_norm=src.spec.fc_norm or "add-fc-norm" in steps,
                       norm_output=src.spec.norm_output or "set-norm-output" in steps)
    replays = tgt is not None and tgt.replays  # the target runs, or a capture of its continuations replays
    work, report, by_kind, fitting = (workloads_for(tgt, prompts, req.num_prompts, req.max_tokens)
                                      if replays and steps else (None, None, None, []))
    ids, layers, measurement = _layers(src, tgt, steps)
    fc = src.view.info("fc.weight").dtype if "fc.weight" in src.view else "BF16"  # the written tensors' dtype
    s = Setup(src, tgt, {"fc_norm": new_spec.fc_norm, "norm_output": new_spec.norm_output},
              fc if fc in ("F32", "BF16", "F16") else "BF16", req.runner, progress, ids, work, report, by_kind,
              tuple(map(tuple, fitting)))
    choice = choose_init(s, init, req.fit_fc) if "add-fc-norm" in steps else Choice()
    plan, supplied, written = plan_upgrade(s, dest, to, new_spec, choice, req.fit_fc, req.base_model, measurement,
                                           engines)
    acceptance = before_after(s, choice.fitted, plan.config, written=not req.dry_run) if report else None
    rerun = again + (f" --to {to}" if req.to else "") + (
        f" --base-model {shlex.quote(req.base_model)}" if req.base_model else "")
    if acceptance is not None and report is not None and (target is not None or report.states is not None):
        acceptance["reproduce"] = report.smoke_command(str(dest), target or "", req.runner)
        if not report.given and target is not None:  # the figure is for the bundled text: how to have it on the user's own
            acceptance["on_your_prompts"] = command_line(req, prompts="YOUR.jsonl", force=not req.dry_run)
    recorded = None
    if req.fidelity and steps and not req.dry_run:  # what verify DEST --against SOURCE holds the files to (the record)
        fid = _fidelity(_planned(src, dest, new_spec, written, s.dtype), s, req.fidelity_tokens)
        recorded = {"inputs": "target" if fid.inputs_real else "synthetic", "seed": fid.seed, "tokens": fid.tokens,
                    "per_step": [{"step": m.step, "kl_mean": round(m.kl_mean, 6),
                                  "top1_agreement": round(m.top1_agreement, 6)} for m in fid.metrics]}
    _mark(plan, steps, choice, acceptance, written, recorded)
    result = UpgradeResult(source, dest, bool(steps), steps, choice.init, choice.fitted[2],
                           ConversionResult(plan, False, []), None,
                           _notes(steps, init, choice, acceptance, ids, rerun + (
                               "" if req.dry_run else " --force")),  # a note is read after DEST is written
                           choice.candidates, layers, acceptance,
                           choice.fit_report.to_json() if choice.fit_report else None,
                           _next_command(dest, target, report, req.runner))
    return result if req.dry_run else _write(result, s, plan, supplied, req.force,
                                             req.fidelity_tokens if req.fidelity else None, inputs)


FLAGS = {"for_engine": "--for", "from_dialect": "--from"}  # UpgradeRequest fields whose flag is not their name
NOT_FLAGS = ("runner",)  # library-only fields


def command_line(req: UpgradeRequest, **changes: Any) -> str:
    """The `eaglectl upgrade` command of `req` with `changes`, as it runs when pasted: every option that differs
    from its default, so that what is measured again is the same upgrade."""
    req = replace(req, **changes)
    words = ["eaglectl", "upgrade", req.source, str(req.dest)]
    for f in fields(req):
        value = getattr(req, f.name)
        if f.name in ("source", "dest", *NOT_FLAGS) or value == f.default:
            continue
        flag = FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
        words += [flag if value else f"--no-{flag[2:]}"] if isinstance(value, bool) else [flag, str(value)]
    return shlex.join(words)


# ------------------------------------------------------------------------------------ what to do, or why not

def _dialect_for(req: UpgradeRequest, src: DrafterCheckpoint, tgt: Target | None, engines: tuple[str, ...]) -> str:
    """`--for`: the dialect the engines serve the upgraded drafter from best (engines/serving.pick), planned with the
    flags the upgrade sets (its fc_norm weights come later: the choice reads the layout, not the values)."""
    if req.to:
        raise UsageError("give --to DIALECT or --for ENGINE, not both", hint=f"eaglectl upgrade {req.source} "
                         f"{req.dest} --for {req.for_engine}")
    spec = replace(src.spec, fc_norm=src.spec.fc_norm or req.fc_norm, norm_output=src.spec.norm_output or
                   req.norm_output)
    checkpoint = tgt.checkpoint if tgt is not None else None
    return pick(src, engines, lambda d: for_engines(plan_conversion(
        src, "(planned)", d, target=checkpoint, upgrade=Additions(spec, {}), base_model=req.base_model), src,
        checkpoint, engines))[0]


def upgrade_steps(src: DrafterCheckpoint, tgt: Target | None, init: str, fc_norm: bool, norm_output: bool,
                  to: str | None, target: str | None, prompts: str | None, again: str) -> tuple[str, list[str]]:
    """(the destination dialect, the steps), or ConversionError with the command that works (`again` is the
    command as given): every refusal that needs no measurement, before the target is touched."""
    spec = src.spec
    if init not in CHOICES:
        raise ConversionError(f"--init {init}: one of {', '.join(CHOICES)}")
    # specforge records the 3.1 flags and needs no target; speculators (vLLM's own) names its verifier
    other = (f"{again} --to speculators --target {shlex.quote(target)}" if target else
             f"{again} --to specforge (or --to speculators --base-model ORG/NAME)")
    if to is None:
        if src.dialect.writer is None:
            raise ConversionError(f"{src.source}: eaglectl reads {src.dialect.name} checkpoints but does not write "
                                  "them", hint=other)
        to = src.dialect.name
    writable_dialect(to)
    if fc_norm and not spec.fc_norm and spec.norm_before_fc:
        raise ConversionError(f"{src.source}: the drafter has norm_before_fc; adding fc_norm would normalise twice "
                              "(vLLM applies both, TRT-LLM one, speculators refuses)",
                              hint=f"{again} --no-fc-norm (norm_output only)")
    add_fc_norm = fc_norm and not spec.fc_norm
    steps = [s for s, on in (("add-fc-norm", add_fc_norm), ("set-norm-output", norm_output and not spec.norm_output))
             if on]
    _refuse_unmeasurable(src, tgt, init, to, steps, prompts, again, other)
    return to, steps


def _refuse_unmeasurable(src: DrafterCheckpoint, tgt: Target | None, init: str, to: str, steps: list[str],
                         prompts: str | None, again: str, other: str) -> None:
    """The refusals that depend on the steps: an init or prompts the target cannot measure, a layout that
    cannot record the 3.1 flags."""
    add_fc_norm = "add-fc-norm" in steps
    if init in NEEDS_TARGET and add_fc_norm and tgt is None:
        raise ConversionError(f"--init {init} measures the target's hidden states: pass --target or --states",
                              hint=f"{again} --init {init} --target TARGET "
                                   "(or --states DIR from eaglectl capture)")
    if to == src.dialect.name and src.dialect.writer is not None and not src.dialect.writer.flag_paths and steps:
        raise ConversionError(f"{src.source}: the {src.dialect.title} layout cannot record fc_norm / norm_output",
                              hint=other)
    if init == "fit" and add_fc_norm and tgt is not None and not tgt.runnable and tgt.states is None:
        raise ConversionError(f"--init fit tunes fc_norm on the target's states: {tgt.why_not_runnable()}",
                              hint=f"{again} --init fit --target TARGET (weights and a tokenizer) or --states DIR")
    if prompts is not None and (tgt is None or not tgt.runnable):
        why = "no --target" if tgt is None else tgt.why_not_runnable()
        raise UsageError(f"--prompts {prompts}: acceptance on prompts needs a runnable --target ({why})",
                         hint=f"{again} --target TARGET --prompts {shlex.quote(prompts)}")


def _layers(src: DrafterCheckpoint, tgt: Target | None, steps: list[str]
            ) -> tuple[tuple[int, ...] | None, dict[str, Any] | None, Measurement | None]:
    """The boundaries calibration, fit, the written ids and fidelity use (None: nothing to change or no states),
    how they were known, and the measurement (None: the target cannot run and there is no capture): measured
    when the probe decides, else the files' reading. One measured reading serves the whole command."""
    from ...measure.probe import measure

    if not steps or tgt is None or not tgt.has_states:
        return None, None, None
    L = tgt.num_layers
    assert L is not None
    m = None
    if tgt.states is None and not tgt.runnable:
        ids, how = src.spec.capture_ids(L), f"as the files say ({tgt.why_not_runnable()})"
    else:
        if "add-fc-norm" in steps and not from_continuations(tgt):  # calibration reads the text run too
            tgt.need(tokens=CALIBRATION_TOKENS)  # declared now: the probe's capture serves calibration and fidelity
        m = measure(src, tgt, loop_prompts=0)  # what stops the probe stops calibration too: said as it is
        ids, how = ((m.boundary_ids, f"measured ({m.aux.reason})") if m.boundary_ids is not None else
                    (src.spec.capture_ids(L), f"as the files say (not decided: {m.aux.reason})"))
    return ids, {"boundary_ids": list(ids), "how": how}, m


def plan_upgrade(s: Setup, dest: str, to: str, new_spec: DrafterSpec, choice: Choice, fit_fc: bool,
                 base_model: str | None, measurement: Measurement | None, engines: tuple[str, ...] = ("vllm",)
                 ) -> tuple[ConversionPlan, dict[str, bytes], dict[str, np.ndarray]]:
    """The conversion plan with the new flags and tensors, the stored bytes of those tensors, and their values
    as stored (shaped)."""
    gammas, new_fc, _ = choice.fitted
    extra: dict[str, tuple[str, tuple[int, ...], str]] = {}
    supplied: dict[str, bytes] = {}
    for j, g in enumerate(gammas):
        extra[f"fc_norm.{j}.weight"] = (s.dtype, (s.src.spec.aux_width,), f"fc_norm init {choice.init}")  # type: ignore[assignment]
        supplied[f"fc_norm.{j}.weight"] = casting.encode(g, s.dtype)
    if new_fc is not None:
        why = "tuned by the fit init" if choice.init == "fit" and fit_fc else "refit to the 3.0 FC output"
        extra["fc.weight"] = (s.dtype, tuple(new_fc.shape), why)
        supplied["fc.weight"] = casting.encode(new_fc, s.dtype)
    if measurement is not None and measurement.at_chance:
        measurement = None  # a drafter at chance says nothing about its layers: the files' reading is written
    decided = measurement is not None and measurement.boundary_ids is not None
    plan = plan_conversion(s.src, dest, to, target=s.tgt.checkpoint if s.tgt else None,
                           upgrade=Additions(new_spec, extra), base_model=base_model, measured=measurement,
                           aux_layer_ids=tuple(s.ids) if decided and s.ids is not None
                           and s.src.spec.aux_layer_ids is not None else None)
    plan = for_engines(plan, s.src, s.tgt.checkpoint if s.tgt else None, engines)
    written = {k: casting.decode(v, s.dtype).reshape(extra[k][1]) for k, v in supplied.items()}
    return plan, supplied, written


def _write(result: UpgradeResult, s: Setup, plan: ConversionPlan, supplied: dict[str, bytes], force: bool,
           fidelity_tokens: int | None, inputs: list[str]) -> UpgradeResult:
    """The plan executed. On the staged output, before it takes DEST's place, the written files replay to the
    acceptance reported and their fidelity to SOURCE is measured (`fidelity_tokens` None: not)."""
    measured: dict[str, ParityReport] = {}

    def after_write(out: DrafterCheckpoint) -> list[str]:
        # the written files in fp32 once: the tensors copied from SOURCE (equal byte for byte, checked after
        # writing) share SOURCE's fp32 copy, so the output costs only the tensors the upgrade wrote
        from ...model.loader import load_reference

        src = load_reference(s.src)
        load_reference(out, shared={a.canonical: src.tensors[a.canonical] for a in plan.tensors
                                    if a.action == "copy" and a.canonical in src.tensors})
        checked = check_written(s, out, result.acceptance) if result.acceptance is not None else []
        if fidelity_tokens is not None:
            measured["report"] = _fidelity(out, s, fidelity_tokens)
        return checked

    done = execute(plan, s.src, target=s.tgt.checkpoint if s.tgt else None, force=force, supplied=supplied,
                   progress=s.progress, after_write=after_write if result.steps else None, inputs=inputs)
    return replace(result, conversion=done, fidelity=measured.get("report"))


def _mark(plan: ConversionPlan, steps: list[str], choice: Choice, acceptance: dict[str, Any] | None,
          written: dict[str, np.ndarray], fidelity: dict[str, Any] | None) -> None:
    """Provenance in config and safetensors metadata: what was done, that it needs fine-tuning, the
    acceptance lengths before / after on which prompts, and the value digest of every tensor the upgrade
    wrote (`verify DEST --against SOURCE` holds them to it)."""

    from ...measure.parity import values_digest

    prov = plan.config["eaglectl_provenance"]
    prov.update({"operation": "upgrade", "upgrade_steps": steps, "fc_norm_init": choice.init,
                 "needs_fine_tuning": bool(steps)})
    if written:
        prov["upgrade_tensors"] = {k: values_digest(v) for k, v in sorted(written.items())}
    if fidelity is not None:
        prov["fidelity"] = fidelity
    stats = choice.fitted[2]
    if stats:
        prov["calibration"] = {k: v for k, v in stats.items() if k not in ("per_channel", "fit")}
    if choice.fit_report is not None and choice.init == "fit":
        prov["fit"] = choice.fit_report.to_json()
    if acceptance is not None:
        prov["acceptance"] = {k: acceptance[k] for k in ("before", "after", "kept", "reading", "source_boundary_ids",
                                                          "dest_boundary_ids", "interval")}
        prov["acceptance"]["prompts"] = {k: acceptance["prompts"][k] for k in (
            "source", "given", "count", "description", "digest", "max_tokens", "k")}
    plan.metadata["eaglectl"] = json.dumps(prov, sort_keys=True)


# ------------------------------------------------------------------------------------------------ fidelity

def _planned(src: DrafterCheckpoint, dest: str, spec: DrafterSpec, written: dict[str, np.ndarray], dtype: str
             ) -> LoadedDrafter:
    """DEST as the plan will write it, in memory: SOURCE's tensors, the written ones, the new flags."""
    import torch

    from ...model.loader import LoadedDrafter, args_from_spec, load_reference

    ref = load_reference(src)
    tensors = {**ref.tensors, **{k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in written.items()}}
    stored = {**ref.stored_dtypes, **{k: dtype for k in written}}
    return LoadedDrafter(dest, ref.dialect, spec, args_from_spec(spec, dest), tensors, stored, ref.has_embed)


def _fidelity(out: DrafterCheckpoint | LoadedDrafter, s: Setup, tokens: int) -> ParityReport:
    """DEST (the written files, or `_planned`) against SOURCE through the reference drafter, on the target's
    states (at the measured layers) when it ran or was captured (a capture's requests shorter than `tokens` give
    fewer anchors), else synthetic states."""
    from ...measure.parity import compare, real_inputs, synthetic_inputs
    from ...model.loader import load_reference

    ref = load_reference(s.src)
    cand = load_reference(out) if isinstance(out, DrafterCheckpoint) else out
    if s.tgt is not None and s.tgt.has_states:
        inputs = real_inputs(s.tgt, ref, tokens, FIDELITY_STEPS, boundaries=s.ids, shrink=True)
    else:
        inputs = synthetic_inputs(ref.args, ref.spec.aux_layer_ids_vllm, tokens, FIDELITY_STEPS, 0)
    tokens = int(inputs.aux.shape[1])
    return compare(cand, ref, inputs, "fidelity", ("float32", "cpu"), ("float32", "cpu"), FIDELITY_STEPS, tokens, 0)


# ------------------------------------------------------------------------------------------- what is said

def _notes(steps: list[str], init: str, choice: Choice, acceptance: dict[str, Any] | None,
           ids: tuple[int, ...] | None, again: str) -> list[str]:
    notes = ["structurally upgraded to the EAGLE-3.1 layout: not function-preserving; fine-tune (training-time "
             "test) before serving it as a 3.1 drafter" if steps else
             "already has the requested 3.1 features: nothing to change (tensors copied unchanged)"]
    where = acceptance["ranked_on"]["description"] if acceptance and acceptance["ranked_on"] else "held-out prompts"
    candidates, chosen = choice.candidates, choice.init
    if candidates and init == "auto" and "acceptance_kept" in candidates[0]:
        notes.append(f"fc_norm init '{chosen}' measured best on {where} (the reference loop kept "
                     f"{candidates[0]['acceptance_kept']:.1%} of the source's acceptance length before fine-tuning, "
                     "at the measured layers)")
    elif candidates and init == "auto":
        notes.append(f"fc_norm init '{chosen}' has the lowest FC-output error on held-out requests of the capture "
                     f"({candidates[0]['heldout_fc_output_relative_error']:.3f}); acceptance was not measured "
                     "(no runnable target)")
    if init == "auto" and chosen == "ones" and not candidates:  # nothing measured: say how to measure
        notes.append("fc_norm init 'ones' (unit weights), chosen without measuring: a runnable target ranks every "
                     "init by acceptance, `fit` too (on the fixtures `fit` keeps 98.0% of the acceptance length where "
                     f"`ones` keeps 83.9%): {again} --target TARGET (a runnable target), or capture the target's "
                     "states once where it runs with eaglectl capture TARGET --out DIR, then rank the closed-form "
                     f"inits here with {again} --states DIR")
    if acceptance is not None and ids is not None:
        for who, key in (("the source", "source_boundary_ids"), ("the output", "dest_boundary_ids")):
            if list(acceptance[key]) != list(ids):
                notes.append(f"{acceptance['reading_description']}: {who} is read at boundaries {acceptance[key]}, "
                             f"but the drafter was measured to read {list(ids)}; the acceptance lengths are what "
                             "that engine serves")
    return notes


def _next_command(dest: str, target: str | None, report: Workload | None, runner: str) -> str | None:
    """The command to run next on DEST, as it runs when pasted: smoke on the user's prompts, else check."""
    if report is not None and report.given and target is not None:
        return report.smoke_command(str(dest), target, runner)
    return f"eaglectl check {shlex.quote(str(dest))}" + (f" --target {shlex.quote(target)}" if target else "")
