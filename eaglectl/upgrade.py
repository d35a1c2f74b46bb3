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
`auto` ranks the inits by the reference loop's acceptance on held-out prompts (or the user's `--prompts`)
when the target runs, else by the FC-output error on held-out requests of the capture, else takes `ones`.

The acceptance lengths before and after (`acceptance`) are the reference loop's on the ranking prompts, with
the source and the written output each read the way vLLM (V1 runner) reads their files: greedy counts that
equal vLLM's exactly (docs/smoke.md#engine-parity), so with `--prompts` they are what vLLM prints on them.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .calibration import Fit, Moments, accumulate, fit, held_out_error
from .convert import ConversionPlan, ConversionResult, execute, plan_conversion, plan_inputs, writable_dialect
from .drafter import DrafterCheckpoint, open_drafter
from .errors import BehaviourChangedError, ConversionError, UsageError
from .io import cast as casting
from .io.atomic import check_destination
from .io.states import States
from .progress import Progress, passthrough
from .result import Result
from .target import Target

if TYPE_CHECKING:
    from .fitting import FitReport
    from .probe import Measurement
    from .verify import ParityReport

CLOSED_FORM = ("ones", "harmonic", "calibrated", "refit")
INITS = (*CLOSED_FORM, "fit")
NEEDS_TARGET = ("harmonic", "calibrated", "refit", "fit")
CHOICES = ("auto", *INITS)  # auto: measure every init (--target or --states) and keep the best; ones without
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
    fidelity: Any = None  # a ParityReport (mode fidelity) of DEST against SOURCE
    notes: list[str] = field(default_factory=list)
    init_candidates: list[dict[str, Any]] = field(default_factory=list)  # measured on held-out text
    layers: dict[str, Any] | None = None  # the boundaries calibration used, and how they were known
    acceptance: dict[str, Any] | None = None  # AL before / after on the ranking prompts, as vLLM reads the files
    fit: dict[str, Any] | None = None  # the `fit` init's report (steps, tokens, held-out gain, seconds)
    next_command: str | None = None  # what to run next, as printed

    def summary_line(self) -> str:
        return ", ".join(self.steps) or "nothing to change"

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


CALIBRATION_TOKENS = 4096  # tokens of the calibration text read for the statistics
RANK_PROMPTS, RANK_TOKENS, RANK_SEED = 16, 64, 3  # held-out prompts the inits are ranked on (reference loop)
CAL_PROMPTS, CAL_SEED = 32, 5  # held-out prompts whose greedy continuations calibration and `fit` read (never ranked)
STEPS = 3  # draft steps (k) of the ranking loop, as smoke's default
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 2000, 0


@dataclass
class Workload:
    """The prompts the inits are ranked on and the acceptance is reported on."""

    prompts: list[list[int]]
    source: str  # the --prompts spec, or "bundled"
    description: str
    given: bool  # the user's --prompts
    max_tokens: int
    num_prompts: int
    k: int = STEPS

    def identity(self) -> dict[str, Any]:
        import hashlib
        import json

        digest = hashlib.sha256(json.dumps(self.prompts, separators=(",", ":")).encode()).hexdigest()
        return {"source": self.source, "given": self.given, "count": len(self.prompts), "description":
                self.description, "digest": f"sha256:{digest}", "max_tokens": self.max_tokens, "k": self.k}


def run(
    source: str,
    dest: str,
    *,
    fc_norm: bool = True,
    norm_output: bool = True,
    init: str = "auto",
    target: str | None = None,
    states: str | None = None,
    calibration_text: str | None = None,
    prompts: str | None = None,
    num_prompts: int = RANK_PROMPTS,
    max_tokens: int = RANK_TOKENS,
    fit_fc: bool = False,
    to: str | None = None,
    from_dialect: str | None = None,
    allow_pickle: bool = False,
    force: bool = False,
    dry_run: bool = False,
    fidelity: bool = True,
    fidelity_tokens: int = 64,
    progress: Progress = passthrough,
    base_model: str | None = None,
    reading: Reading | None = None,
) -> UpgradeResult:
    """Take SOURCE to the EAGLE-3.1 layout at DEST. The target (when given) is loaded once, its states over
    the calibration text are captured once, and its greedy continuations of the ranking (and fitting) prompts
    are decoded once; the probe, calibration, the ranking of the inits, the acceptance before / after and the
    fidelity report all read them. `reading` says how the served engine reads a config's aux ids (default:
    vLLM's V1 runner)."""
    reading = reading or VLLM_V1
    src = open_drafter(source, from_dialect=from_dialect, allow_pickle=allow_pickle)
    tgt = Target.open(target, states, progress=progress, text=calibration_text)
    spec = src.spec
    to, steps = _plan_steps(src, source, dest, init, fc_norm, norm_output, to, target, tgt, allow_pickle, prompts)
    if not dry_run:
        check_destination(dest, force=force, sources=plan_inputs(src, tgt.checkpoint if tgt else None))
    add_fc_norm = "add-fc-norm" in steps
    new_spec = replace(spec, fc_norm=spec.fc_norm or add_fc_norm,
                       norm_output=spec.norm_output or "set-norm-output" in steps)
    new_flags = {"fc_norm": new_spec.fc_norm, "norm_output": new_spec.norm_output}
    supplied: dict[str, bytes] = {}
    extra: dict[str, tuple[str, tuple[int, ...], str]] = {}
    stats: dict[str, Any] = {}
    dtype = _float_dtype(src)
    candidates: list[dict[str, Any]] = []
    layers = chosen = fit_report = None
    ids: tuple[int, ...] | None = None
    work = _workload(tgt, prompts, num_prompts, max_tokens) if tgt is not None and tgt.runnable and steps else None
    gammas: list[np.ndarray] | None = None
    new_fc: np.ndarray | None = None
    measurement = None
    if steps and tgt is not None and tgt.has_states:
        # one measured reading for the whole command: calibration, the ranking, fit, the ids written and the
        # fidelity step all read the boundaries it decided (the files' reading only when it did not)
        ids, how, measurement = _layers(src, tgt, text=add_fc_norm and not _from_continuations(tgt))
        layers = {"boundary_ids": list(ids), "how": how}
    if add_fc_norm:
        n, Ht = spec.num_aux_hidden_states, spec.aux_width
        if n is None or Ht is None:
            raise ConversionError(f"{source}: cannot tell the aux count / width from fc.weight")
        inits = _inits(init, tgt)
        if tgt is None or not tgt.has_states or ids is None:
            fits = {i: fit(i, n, Ht) for i in inits}
        else:
            closed = tuple(i for i in inits if i != "fit")
            if work is not None:
                _declare(tgt, src, ids, work, reading, with_fit="fit" in inits)
            fits, held = _calibrate(src, tgt, ids, closed, n, Ht, progress)
            if work is not None:
                candidates = evaluate_inits(src, fits, tgt, ids, new_flags, dtype, workload=work, progress=progress)
            elif held is not None:
                candidates = sorted(({"init": i, "heldout_fc_output_relative_error": round(
                    held_out_error(f, held), 6), "heldout_tokens": held.tokens} for i, f in fits.items()),
                    key=lambda r: r["heldout_fc_output_relative_error"])
            if "fit" in inits:
                start = candidates[0]["init"] if candidates else ("calibrated" if "calibrated" in fits else closed[0])
                fits["fit"], fit_report = _fit_init(src, tgt, ids, fits[start], start, new_flags, fit_fc, progress)
                if work is not None:
                    candidates = _rank(candidates + evaluate_inits(src, {"fit": fits["fit"]}, tgt, ids, new_flags,
                                                                   dtype, workload=work, progress=progress))
        chosen = "fit" if init == "fit" else candidates[0]["init"] if candidates else inits[0]
        gammas, new_fc, stats = fits[chosen]
        for j, g in enumerate(gammas):
            canon = f"fc_norm.{j}.weight"
            extra[canon] = (dtype, (Ht,), f"fc_norm init {chosen}")  # type: ignore[assignment]
            supplied[canon] = casting.encode(g, dtype)
        if new_fc is not None:
            why = "tuned by the fit init" if chosen == "fit" and fit_fc else "refit to the 3.0 FC output"
            extra["fc.weight"] = (dtype, tuple(new_fc.shape), why)
            supplied["fc.weight"] = casting.encode(new_fc, dtype)
    if measurement is not None and measurement.at_chance:
        measurement = None  # a drafter at chance says nothing about its layers: the files' reading is written
    decided = measurement is not None and measurement.boundary_ids is not None
    plan = plan_conversion(src, dest, to, target=tgt.checkpoint if tgt else None, spec_override=new_spec,
                           extra_tensors=extra, base_model=base_model, measured=measurement,
                           aux_layer_ids=tuple(ids) if decided and ids is not None and spec.aux_layer_ids is not None
                           else None)
    acceptance = None
    if work is not None:
        acceptance = _acceptance(src, tgt, work, gammas, new_fc, new_flags, dtype, plan.config, reading, ids,
                                 written=not dry_run)
    written = {k: casting.decode(v, extra[k][0]) for k, v in supplied.items()}
    recorded = None
    if fidelity and steps and not dry_run:  # what verify DEST --against SOURCE holds the files to
        planned = _planned(src, dest, new_spec, written, extra)
        recorded = _fidelity_record(_fidelity(planned, src, tgt, fidelity_tokens, ids))
    _mark(plan, steps, chosen, stats, acceptance, fit_report, written=written, fidelity=recorded)
    notes = _notes(steps, init, chosen, candidates, acceptance, ids)
    after = _next_command(dest, target, work, steps, prompts)
    if dry_run:
        return UpgradeResult(source, dest, bool(steps), steps, chosen, stats, ConversionResult(plan, False, []), None,
                             notes, candidates, layers, acceptance, fit_report.to_json() if fit_report else None,
                             after)
    measured: dict[str, Any] = {}

    def after_write(out: DrafterCheckpoint) -> list[str]:
        checked = _check_acceptance(out, tgt, work, acceptance, reading) if acceptance is not None else []
        if fidelity:
            measured["report"] = _fidelity(out, src, tgt, fidelity_tokens, ids)
        return checked

    result = execute(plan, src, target=tgt.checkpoint if tgt else None, force=force, supplied=supplied,
                     progress=progress, after_write=after_write if steps else None)
    return UpgradeResult(source, dest, bool(steps), steps, chosen, stats, result, measured.get("report"), notes,
                         candidates, layers, acceptance, fit_report.to_json() if fit_report else None, after)


def _plan_steps(src: DrafterCheckpoint, source: str, dest: str, init: str, fc_norm: bool, norm_output: bool,
                to: str | None, target: str | None, tgt: Target | None, allow_pickle: bool,
                prompts: str | None = None) -> tuple[str, list[str]]:
    """(the destination dialect, the steps), or ConversionError with the command that works: every refusal
    that needs no measurement, before the target is touched."""
    spec = src.spec
    if init not in CHOICES:
        raise ConversionError(f"--init {init}: one of {', '.join(CHOICES)}")
    again = f"eaglectl upgrade {shlex.quote(source)} {shlex.quote(str(dest))}" + (
        " --allow-pickle" if allow_pickle else "")
    # specforge records the 3.1 flags and needs no target; speculators (vLLM's own) names its verifier
    other = (f"{again} --to speculators --target {shlex.quote(target)}" if target else
             f"{again} --to specforge (or --to speculators --target TARGET)")
    if to is None:
        if src.dialect.writer is None:
            raise ConversionError(f"{source}: eaglectl reads {src.dialect.name} checkpoints but does not write them",
                                  hint=other)
        to = src.dialect.name
    writable_dialect(to)
    if fc_norm and not spec.fc_norm and spec.norm_before_fc:
        raise ConversionError(f"{source}: the drafter has norm_before_fc; adding fc_norm would normalise twice "
                              "(vLLM applies both, TRT-LLM one, speculators refuses)",
                              hint=f"{again} --no-fc-norm (norm_output only)")
    add_fc_norm = fc_norm and not spec.fc_norm
    steps = [s for s, on in (("add-fc-norm", add_fc_norm), ("set-norm-output", norm_output and not spec.norm_output))
             if on]
    if init in NEEDS_TARGET and add_fc_norm and tgt is None:
        raise ConversionError(f"--init {init} measures the target's hidden states: pass --target or --states",
                              hint=f"{again} --init {init} --target TARGET "
                                   "(or --states DIR from eaglectl capture)")
    if to == src.dialect.name and src.dialect.writer is not None and not src.dialect.writer.flag_paths and steps:
        raise ConversionError(f"{source}: the {src.dialect.title} layout cannot record fc_norm / norm_output",
                              hint=other)
    if init == "fit" and add_fc_norm and tgt is not None and not tgt.runnable and tgt.states is None:
        raise ConversionError(f"--init fit tunes fc_norm on the target's states: {tgt.why_not_runnable()}",
                              hint=f"{again} --init fit --target TARGET (weights and a tokenizer) or --states DIR")
    if prompts is not None and (tgt is None or not tgt.runnable):
        why = "no --target" if tgt is None else tgt.why_not_runnable()
        raise UsageError(f"--prompts {prompts}: acceptance on prompts needs a runnable --target ({why})",
                         hint=f"{again} --target TARGET --prompts {shlex.quote(prompts)}")
    return to, steps


def _inits(init: str, tgt: Target | None) -> tuple[str, ...]:
    """The inits to fit: one asked for (`fit` also needs the closed-form inits it starts from), or under `auto`
    every init that can be measured: `fit` too when the target runs (its acceptance decides, on prompts it
    was not fitted on); a capture ranks the closed-form inits by FC-output error; a target without a tokenizer
    can calibrate but not rank: `calibrated`; nothing to measure: `ones`."""
    if init == "fit":
        return (*(CLOSED_FORM if tgt is not None and tgt.runnable else ("calibrated",)), "fit")
    if init != "auto":
        return (init,)
    if tgt is not None and tgt.runnable:
        return INITS
    if tgt is not None and tgt.states is not None:
        return CLOSED_FORM
    if tgt is not None and tgt.has_states:
        return ("calibrated",)
    return ("ones",)


def _layers(src: DrafterCheckpoint, tgt: Target, text: bool = True) -> tuple[tuple[int, ...], str, Measurement | None]:
    """The boundaries calibration, fit, the written ids and fidelity use, how they were known, and the measurement
    (None: the target cannot run and there is no capture): measured when the probe decides, else the files'
    reading. `text`: calibration reads the target's run over the text too (declared now, so one pass serves
    both)."""
    from .probe import measure

    L = tgt.num_layers
    assert L is not None
    if tgt.states is None and not tgt.runnable:
        return src.spec.capture_ids(L), f"as the files say ({tgt.why_not_runnable()})", None
    if text:
        tgt.need(tokens=CALIBRATION_TOKENS)  # the probe's capture also serves calibration and fidelity
    m = measure(src, tgt, loop_prompts=0)  # what stops the probe stops calibration too: said as it is
    if m.boundary_ids is not None:
        return m.boundary_ids, f"measured ({m.aux.reason})", m
    return src.spec.capture_ids(L), f"as the files say (not decided: {m.aux.reason})", m


def _calibrate(src: DrafterCheckpoint, tgt: Target, ids: tuple[int, ...], inits: tuple[str, ...], n: int, Ht: int,
               progress: Progress) -> tuple[dict[str, Any], Moments | None]:
    """Every init fitted on the target's states at `ids` (its run over the calibration text, or the capture's
    requests, the last quarter held out to rank the inits when the target cannot run), and the held-out
    moments."""
    spec = src.spec
    W = src.view.read("fc.weight").astype(np.float64)
    eps = spec.rms_norm_eps if spec.rms_norm_eps is not None else 1e-6
    held = None
    if tgt.states is not None:
        captured = tgt.states
        cal_part, held_part, where = _split_requests(captured, ids, rank=len(inits) > 1 and not tgt.runnable)
        moments = accumulate(W, n, Ht, eps, progress(cal_part, label="calibration: requests"))
        held = accumulate(W, n, Ht, eps, held_part) if held_part is not None else None
        held = held if held is not None and held.tokens else None  # held-out requests of one token each
        note = {"target": captured.target, "states": str(captured.root), "text_source": where}
    elif _from_continuations(tgt):
        conts = tgt.continuations(_calibration_prompts(tgt), max_tokens=RANK_TOKENS, k=STEPS, boundaries=ids)
        moments = accumulate(W, n, Ht, eps, (c.aux(ids)[: c.prompt_length + c.max_tokens].double().numpy()
                                             for c in progress(conts, label="calibration: continuations")))
        note = {"target": tgt.source, "text_source": f"the target's greedy continuations of {len(conts)} held-out "
                f"code windows (seed {CAL_SEED}; {RANK_TOKENS} prompt + {RANK_TOKENS} generated tokens each)"}
    else:
        text = tgt.text_states(ids, CALIBRATION_TOKENS)
        req = next(text.requests(ids))
        count = min(CALIBRATION_TOKENS, int(text.meta.get("calibration_tokens", CALIBRATION_TOKENS)))
        moments = accumulate(W, n, Ht, eps, [req.hidden[:count].reshape(min(count, len(req.hidden)), -1)])
        note = {"target": tgt.source, "text_source": text.description}
    fits = {i: fit(i, n, Ht, moments) for i in inits}
    for _, _, st in fits.values():
        if st:
            st.update({**note, "aux_ids_vllm": list(ids)})
    return fits, held


def _from_continuations(tgt: Target) -> bool:
    """Calibration reads the target's greedy continuations of held-out prompts (positions and text like those it
    serves) when it can decode them and no --calibration-text was given; else its run over the text."""
    return tgt.states is None and tgt.runnable and tgt.text is None


def _notes(steps: list[str], init: str, chosen: str | None, candidates: list[dict[str, Any]],
           acceptance: dict[str, Any] | None = None, ids: tuple[int, ...] | None = None) -> list[str]:
    notes = []
    if steps:
        notes.append("structurally upgraded to the EAGLE-3.1 layout: not function-preserving; fine-tune "
                     "(training-time test) before serving it as a 3.1 drafter")
    else:
        notes.append("already has the requested 3.1 features: nothing to change (tensors copied unchanged)")
    where = acceptance["prompts"]["description"] if acceptance else "held-out prompts"
    if candidates and init == "auto" and "acceptance_kept" in candidates[0]:
        notes.append(f"fc_norm init '{chosen}' measured best on {where} (the reference loop kept "
                     f"{candidates[0]['acceptance_kept']:.1%} of the source's acceptance length before fine-tuning, "
                     "at the measured layers)")
    elif candidates and init == "auto":
        notes.append(f"fc_norm init '{chosen}' has the lowest FC-output error on held-out requests of the capture "
                     f"({candidates[0]['heldout_fc_output_relative_error']:.3f}); acceptance was not measured "
                     "(no runnable target)")
    if acceptance is not None and ids is not None:
        for who, key in (("the source", "source_boundary_ids"), ("the output", "dest_boundary_ids")):
            if list(acceptance[key]) != list(ids):
                notes.append(f"{acceptance['reading_description']}: {who} is read at boundaries {acceptance[key]}, "
                             f"but the drafter was measured to read {list(ids)}; the acceptance lengths are what "
                             "that engine serves")
    return notes


def _split_requests(captured: States, ids: tuple[int, ...], rank: bool) -> tuple[Any, Any, str]:
    """(calibration sequences, held-out sequences, description): the last quarter of the requests is held
    out for ranking the inits when there is more than one request and a ranking is wanted."""
    captured.require(ids)
    count = len(captured.files)
    held = max(1, count // 4) if rank and count > 1 else 0

    def seqs(part: slice) -> Any:
        for req in captured.requests(ids, part):
            yield req.hidden.reshape(req.hidden.shape[0], -1)

    how = f"{count - held} captured requests" + (f" ({held} more held out to rank the inits)" if held else "")
    return seqs(slice(0, count - held)), seqs(slice(count - held, count)) if held else None, how


FIDELITY_STEPS = 3


def _planned(src: DrafterCheckpoint, dest: str, spec: Any, written: dict[str, np.ndarray],
             extra: dict[str, tuple[str, tuple[int, ...], str]]) -> Any:
    """DEST as the plan will write it, in memory: SOURCE's tensors, the written ones, the new flags."""
    import torch

    from .model.loader import LoadedDrafter, args_from_spec

    ref = src.reference()
    tensors = {**ref.tensors, **{k: torch.from_numpy(np.array(v, dtype=np.float32).reshape(extra[k][1]))
                                 for k, v in written.items()}}
    stored = {**ref.stored_dtypes, **{k: extra[k][0] for k in written}}
    return LoadedDrafter(dest, ref.dialect, spec, args_from_spec(spec, dest), tensors, stored, ref.has_embed)


def _fidelity_record(report: ParityReport) -> dict[str, Any]:
    """The fidelity an upgrade measured, as its provenance keeps it (verify's upgrade regime bounds by it)."""
    return {"inputs": "target" if report.inputs_real else "synthetic", "seed": report.seed, "tokens": report.tokens,
            "per_step": [{"step": m.step, "kl_mean": round(m.kl_mean, 6), "top1_agreement": round(m.top1_agreement, 6)}
                         for m in report.metrics]}


def _fidelity(out: Any, src: DrafterCheckpoint, tgt: Target | None, tokens: int,
              ids: tuple[int, ...] | None) -> ParityReport:
    """DEST (the written files, or `_planned`) against SOURCE through the reference drafter, on the target's
    states (at the measured layers) when it ran or was captured (a capture's requests shorter than `tokens` give
    fewer anchors), else synthetic states."""
    from .verify import compare, real_inputs, synthetic_inputs

    ref = src.reference()
    cand = out.reference() if isinstance(out, DrafterCheckpoint) else out
    if tgt is not None and tgt.has_states:
        inputs = real_inputs(tgt, ref, tokens, FIDELITY_STEPS, boundaries=ids, shrink=True)
    else:
        inputs = synthetic_inputs(ref.args, ref.spec.aux_layer_ids_vllm, tokens, FIDELITY_STEPS, 0)
    tokens = int(inputs.aux.shape[1])
    return compare(cand, ref, inputs, "fidelity", ("float32", "cpu"), ("float32", "cpu"), FIDELITY_STEPS, tokens, 0)


def _float_dtype(src: DrafterCheckpoint) -> str:
    fc = src.view.info("fc.weight").dtype if "fc.weight" in src.view else "BF16"
    return fc if fc in ("F32", "BF16", "F16") else "BF16"


def _mark(plan: ConversionPlan, steps: list[str], init: str | None, stats: dict[str, Any],
          acceptance: dict[str, Any] | None = None, fit_report: FitReport | None = None,
          written: dict[str, np.ndarray] | None = None, fidelity: dict[str, Any] | None = None) -> None:
    """Provenance in config and safetensors metadata: what was done, that it needs fine-tuning, the
    acceptance lengths before / after on which prompts, and the value digest of every tensor the upgrade
    wrote (`verify DEST --against SOURCE` holds them to it)."""
    import json

    from .verify import values_digest

    prov = plan.config["eaglectl_provenance"]
    prov.update({"operation": "upgrade", "upgrade_steps": steps, "fc_norm_init": init,
                 "needs_fine_tuning": bool(steps)})
    if written:
        prov["upgrade_tensors"] = {k: values_digest(v) for k, v in sorted(written.items())}
    if fidelity is not None:
        prov["fidelity"] = fidelity
    if stats:
        prov["calibration"] = {k: v for k, v in stats.items() if k not in ("per_channel", "fit")}
    if fit_report is not None and init == "fit":
        prov["fit"] = fit_report.to_json()
    if acceptance is not None:
        prov["acceptance"] = {k: acceptance[k] for k in ("before", "after", "kept", "reading", "source_boundary_ids",
                                                          "dest_boundary_ids", "interval")}
        prov["acceptance"]["prompts"] = {k: acceptance["prompts"][k] for k in (
            "source", "given", "count", "description", "digest", "max_tokens", "k")}
    plan.metadata["eaglectl"] = json.dumps(prov, sort_keys=True)


# ------------------------------------------------------------------------------- choosing by measurement

def evaluate_inits(src: DrafterCheckpoint, fits: dict[str, tuple[list[np.ndarray], np.ndarray | None, Any]],
                   tgt: Target, ids: tuple[int, ...], new_flags: dict[str, bool], dtype: str, *,
                   workload: Workload | None = None, progress: Progress = passthrough) -> list[dict[str, Any]]:
    """Each candidate init on the ranking prompts (never the calibration text, never what `fit` fitted on),
    ranked by the acceptance it keeps.

    The ranking uses the reference loop's acceptance length on the target's greedy continuations of the
    workload's prompts (decoded once, replayed for every init) at the measured boundaries `ids`; ties go to
    the chain acceptance estimated teacher-forced over every anchor of those continuations. The top-1
    agreement with the source drafter is reported too. Values are rounded to the stored dtype first: what is
    measured is what would be written."""
    import torch

    from .model.replay import chains, correct, counts_of

    work = workload or _workload(tgt, None, RANK_PROMPTS, RANK_TOKENS)
    steps = work.k
    loaded = src.reference()
    session_ids = tuple(sorted(set(ids)))
    table = None if loaded.has_embed else tgt.model().embedding().float()
    conts = tgt.continuations(work.prompts, max_tokens=work.max_tokens, k=steps, boundaries=session_ids)

    def chain(drafted: list[torch.Tensor]) -> float:  # leading correct steps per anchor, over every anchor
        right = torch.cat([correct(c, d) for c, d in zip(conts, drafted, strict=True)], dim=1)
        return 1 + float(right.long().cumprod(0).sum(0).float().mean())

    source = chains(loaded.build(torch.float32, "cpu"), conts, aux_ids=session_ids, embed=table)
    source_chain, source_al = chain(source), counts_of(conts, source).mean_acceptance_length
    out = []
    for init, (gammas, new_fc, _) in progress(list(fits.items()), label="upgrade: fc_norm inits measured"):
        drafter = loaded.build(torch.float32, "cpu", replace=_stored(gammas, new_fc, dtype), **new_flags)
        cand = chains(drafter, conts, aux_ids=session_ids, embed=table)
        agreement = [float(torch.cat([(c[j] == r[j]).float() for c, r in zip(cand, source, strict=True)]).mean())
                     for j in range(steps)]
        al = counts_of(conts, cand).mean_acceptance_length
        out.append({"init": init, "agreement_with_source": [round(a, 4) for a in agreement],
                    "estimated_acceptance_kept": round(chain(cand) / source_chain, 4),
                    "acceptance_length": round(al, 4), "source_acceptance_length": round(source_al, 4),
                    "acceptance_kept": round(al / source_al, 4)})
    return _rank(out)


def _rank(candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Best first: acceptance kept, then the chain estimate; `fit` must beat a closed-form init, not tie it."""
    return sorted(candidates, key=lambda r: (-r["acceptance_kept"], -r["estimated_acceptance_kept"],
                                             r["init"] == "fit"))


def _stored(gammas: list[np.ndarray] | None, new_fc: np.ndarray | None, dtype: str) -> dict[str, Any]:
    """The added / changed tensors as they will be stored (rounded to `dtype`), fp32 for the reference."""
    stored = {f"fc_norm.{j}.weight": _as_stored(g, dtype) for j, g in enumerate(gammas or [])}
    if new_fc is not None:
        stored["fc.weight"] = _as_stored(new_fc, dtype)
    return stored


# --------------------------------------------------------------------------------------- the prompts

def _workload(tgt: Target, prompts: str | None, num_prompts: int, max_tokens: int) -> Workload:
    """The user's prompts (`--prompts`: smoke's loaders and defaults, so `smoke --prompts` sees the same
    tokens), else windows of the bundled held-out code that calibration, the probe and `fit` never read."""
    from .workload import heldout_prompts, load_prompts, needs_chat, tokenizer_of

    if prompts is not None:
        tokenizer = tokenizer_of(tgt.source, chat=needs_chat(prompts))
        got = load_prompts(prompts, tokenizer, count=num_prompts, max_tokens=max_tokens,
                           max_model_len=SMOKE_MAX_MODEL_LEN, k=STEPS, seed=SMOKE_SEED)
        return Workload(got.prompts, prompts, got.description, True, max_tokens, num_prompts)
    ps = heldout_prompts(tgt.model().tokenizer, num_prompts, 64, seed=RANK_SEED)
    return Workload(ps, "bundled", f"{len(ps)} windows of 64 tokens of the bundled held-out code (seed {RANK_SEED}), "
                    "not your prompts", False, max_tokens, num_prompts)


SMOKE_MAX_MODEL_LEN, SMOKE_SEED = 1024, 0  # smoke's defaults: its --prompts loader reads the same prompts


def _calibration_prompts(tgt: Target) -> list[list[int]]:
    from .workload import heldout_prompts

    return heldout_prompts(tgt.model().tokenizer, CAL_PROMPTS, RANK_TOKENS, seed=CAL_SEED)


def _declare(tgt: Target, src: DrafterCheckpoint, ids: tuple[int, ...], work: Workload, reading: Reading,
             with_fit: bool = False) -> None:
    """Every boundary the command reads, then one decode of every prompt it replays or reads states of (the
    ranking prompts and the calibration prompts)."""
    L = tgt.num_layers
    assert L is not None
    wanted = set(ids) | set(reading.boundaries(src.ckpt.config or {}, L))
    tgt.need(wanted)
    extra = _calibration_prompts(tgt) if _from_continuations(tgt) or with_fit else []
    tgt.continuations(work.prompts + extra, max_tokens=max(work.max_tokens, RANK_TOKENS), k=work.k,
                      boundaries=wanted)


# ------------------------------------------------------------------------------------------------ fit

def _fit_init(src: DrafterCheckpoint, tgt: Target, ids: tuple[int, ...], start: Fit, start_name: str,
              new_flags: dict[str, bool], fit_fc: bool, progress: Progress) -> tuple[Fit, FitReport]:
    """The `fit` init from the closed-form `start`: on the greedy continuations of the fitting prompts when
    the target runs, else on the capture's requests (fitting.py)."""
    from . import fitting

    loaded = src.reference()
    session_ids = tuple(sorted(set(ids)))
    if tgt.runnable:
        calp = _calibration_prompts(tgt)
        conts = tgt.continuations(calp, max_tokens=RANK_TOKENS, k=STEPS, boundaries=session_ids)
        seqs = fitting.from_continuations(conts, session_ids)
        data = (f"the target's greedy continuations of {len(calp)} held-out code windows (seed {CAL_SEED}; never "
                "ranked on)")
        table = None if loaded.has_embed else tgt.model().embedding().float()
    else:
        assert tgt.states is not None
        seqs = fitting.from_requests(tgt.states.requests(session_ids), STEPS, FIT_CAPTURE_TOKENS)
        data = f"{sum(int(q.labels.shape[1]) for q in seqs)} anchors of the capture {tgt.states.root}"
        table = None if loaded.has_embed else _capture_table(tgt)
    if len(seqs) < 2:
        raise ConversionError("--init fit needs at least two sequences of target states (one held out)")
    gammas, new_fc, st = start
    for _ in progress([0], label=f"upgrade: fit ({'fc_norm and fc' if fit_fc else 'fc_norm'}) from {start_name}",
                      total=1):
        g, fc, report = fitting.fit_fc_norm(loaded, (gammas, new_fc), new_flags, seqs, embed=table,
                                            start_name=start_name, data=data, fit_fc=fit_fc)
    stats = dict(st or {})
    stats["fit"] = report.to_json()
    return (g, fc, stats), report


FIT_CAPTURE_TOKENS = 8192  # anchors of a capture `fit` reads


def _capture_table(tgt: Target) -> Any:
    """The target's embedding table for a drafter that ships none, with only a capture: from the target's
    weights when its files hold them, else the rows of the tokens seen, read off boundary 0."""
    import numpy as np
    import torch

    assert tgt.states is not None
    if tgt.checkpoint.ckpt.tensor_file:
        name = tgt.checkpoint.table_name("embed_tokens")
        if name is not None:
            return torch.from_numpy(np.asarray(tgt.checkpoint.ckpt.read(name), dtype=np.float32).copy())
    why = tgt.states.embedding_source()
    if why is not None:
        raise ConversionError(f"--init fit: the drafter ships no embedding table and {why}",
                              hint="capture with boundary 0 (--layers auto does), or pass --target with weights")
    rows: dict[int, Any] = {}
    for req in tgt.states.requests((0,)):
        for t, h in zip(req.token_ids.tolist(), req.hidden[:, 0], strict=False):
            rows.setdefault(int(t), h)
    table = torch.zeros(max(rows) + 1, len(next(iter(rows.values()))))
    for t, h in rows.items():
        table[t] = torch.from_numpy(np.asarray(h, dtype=np.float32))
    return table


# ------------------------------------------------------------------------ acceptance before and after

@dataclass(frozen=True)
class Reading:
    """How a serving engine turns a drafter's config into the target boundaries it captures."""

    name: str
    description: str
    boundaries: Callable[[dict[str, Any], int], tuple[int, ...]]


def v1_boundaries(config: dict[str, Any], target_layers: int) -> tuple[int, ...]:
    """vLLM's V1 runner (`_get_eagle3_aux_layers_from_config`): the top-level `eagle_aux_hidden_state_layer_ids`,
    else `eagle_config.eagle_aux_hidden_state_layer_ids`, as boundaries; else the target's default
    (2, L//2, L-3). Sorted and de-duplicated, as vLLM captures them."""
    from .spec import default_aux_ids

    for ids in (config.get("eagle_aux_hidden_state_layer_ids"),
                (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
                if isinstance(config.get("eagle_config"), dict) else None):
        if isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            return tuple(sorted(set(ids)))
    return default_aux_ids(target_layers, "boundary")


VLLM_V1 = Reading("vllm-v1", "as vLLM's V1 runner reads the files", v1_boundaries)


def _acceptance(src: DrafterCheckpoint, tgt: Target, work: Workload, gammas: list[np.ndarray] | None,
                new_fc: np.ndarray | None, new_flags: dict[str, bool], dtype: str, dest_config: dict[str, Any],
                reading: Reading, ids: tuple[int, ...] | None, written: bool) -> dict[str, Any]:
    """The reference loop's acceptance on the workload for the source (read as the engine reads its files) and
    for the output about to be written (as the engine will read the written config): greedy fp32 counts,
    which equal vLLM's. Without `--prompts`, a seeded bootstrap 95 % interval over the prompts."""
    import torch

    from .model.replay import replay

    L = tgt.num_layers
    assert L is not None
    src_b = reading.boundaries(src.ckpt.config or {}, L)
    dst_b = reading.boundaries(dest_config, L)
    tgt.need(set(src_b) | set(dst_b))
    loaded = src.reference()
    table = None if loaded.has_embed else tgt.model().embedding().float()

    def counts(drafter: Any, boundaries: tuple[int, ...]) -> Any:
        conts = tgt.continuations(work.prompts, max_tokens=work.max_tokens, k=work.k, boundaries=boundaries)
        return replay(drafter, conts, aux_ids=boundaries, embed=table)

    before = counts(loaded.build(torch.float32, "cpu"), src_b)
    after = counts(loaded.build(torch.float32, "cpu", replace=_stored(gammas, new_fc, dtype), **new_flags), dst_b)
    al_b, al_a = before.mean_acceptance_length, after.mean_acceptance_length
    out: dict[str, Any] = {
        "before": round(al_b, 4), "after": round(al_a, 4), "kept": round(al_a / al_b, 4) if al_b else None,
        "reading": reading.name, "reading_description": reading.description,
        "source_boundary_ids": list(src_b), "dest_boundary_ids": list(dst_b),
        "measured_boundary_ids": list(ids) if ids is not None else None,
        "prompts": work.identity(), "counts_before": _counts(before), "counts_after": _counts(after),
        "predicted_for": "the written files" if written else "the files a run without --dry-run would write",
        "how": "the reference loop's greedy fp32 counts on the target's greedy continuations (replayed), which "
               "equal vLLM's (docs/smoke.md#engine-parity)",
        "interval": None if work.given else bootstrap(before, after),
    }
    return out


def _counts(c: Any) -> dict[str, Any]:
    return {"num_drafts": c.num_drafts, "num_accepted_tokens": c.num_accepted_tokens,
            "accepted_per_pos": c.accepted_per_pos,
            "per_request": [[r.num_drafts, r.num_accepted_tokens] for r in c.per_request]}


def bootstrap(before: Any, after: Any, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
              ) -> dict[str, Any]:
    """Percentile 95 % intervals of AL before, after and kept, resampling prompts with replacement (paired:
    one draw of prompts serves all three). AL of a draw = 1 + accepted / drafts over its prompts, as vLLM
    pools a batch."""
    rng = np.random.default_rng(seed)
    b = np.array([[r.num_drafts, r.num_accepted_tokens] for r in before.per_request], dtype=np.float64)
    a = np.array([[r.num_drafts, r.num_accepted_tokens] for r in after.per_request], dtype=np.float64)
    pick = rng.integers(0, len(b), size=(resamples, len(b)))
    al_b = 1 + b[pick, 1].sum(1) / np.maximum(b[pick, 0].sum(1), 1)
    al_a = 1 + a[pick, 1].sum(1) / np.maximum(a[pick, 0].sum(1), 1)

    def ci(x: np.ndarray) -> list[float]:
        return [round(float(np.percentile(x, 2.5)), 4), round(float(np.percentile(x, 97.5)), 4)]

    return {"confidence": 0.95, "resamples": resamples, "seed": seed, "before": ci(al_b), "after": ci(al_a),
            "kept": ci(al_a / al_b)}


def _check_acceptance(out: DrafterCheckpoint, tgt: Target | None, work: Workload | None,
                      acceptance: dict[str, Any], reading: Reading) -> list[str]:
    """After writing: the written files, read back and read as the engine reads them, replay to the counts
    that were reported (else nothing is written)."""
    import torch

    from .model.replay import replay

    assert tgt is not None and work is not None
    L = tgt.num_layers
    assert L is not None
    boundaries = reading.boundaries(out.ckpt.config or {}, L)
    loaded = out.reference()
    table = None if loaded.has_embed else tgt.model().embedding().float()
    conts = tgt.continuations(work.prompts, max_tokens=work.max_tokens, k=work.k, boundaries=boundaries)
    got = _counts(replay(loaded.build(torch.float32, "cpu"), conts, aux_ids=boundaries, embed=table))
    if list(boundaries) != acceptance["dest_boundary_ids"] or got != acceptance["counts_after"]:
        raise BehaviourChangedError(
            f"the written files replay to {got['num_accepted_tokens']} accepted in {got['num_drafts']} drafts at "
            f"boundaries {list(boundaries)}, not the reported {acceptance['counts_after']['num_accepted_tokens']} in "
            f"{acceptance['counts_after']['num_drafts']} at {acceptance['dest_boundary_ids']}; nothing was written",
            path=out.root)
    return [f"the written files replay to AL {acceptance['after']:.3f} {reading.description} (boundaries "
            f"{list(boundaries)}) on {work.identity()['count']} prompts, as reported"]


def _next_command(dest: str, target: str | None, work: Workload | None, steps: list[str],
                  prompts: str | None) -> str | None:
    """The command to run next on DEST, as it runs when pasted."""
    q = shlex.quote
    if work is not None and work.given and prompts is not None:
        extra = (f" --num-prompts {work.num_prompts}" if work.num_prompts != RANK_PROMPTS else "") + (
            f" --max-tokens {work.max_tokens}" if work.max_tokens != RANK_TOKENS else "")
        return f"eaglectl smoke {q(str(dest))} --target {q(target or '')} --prompts {q(prompts)}{extra}"
    return f"eaglectl check {q(str(dest))}" + (f" --target {q(target)}" if target else "")


def _as_stored(values: np.ndarray, dtype: str) -> Any:
    import torch

    return torch.from_numpy(casting.decode(casting.encode(values, dtype), dtype).astype(np.float32).reshape(
        values.shape).copy())
