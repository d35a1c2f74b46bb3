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
`auto` ranks the inits by the reference loop's acceptance on windows of the bundled held-out code when the
target runs, else by the FC-output error on held-out requests of the capture, else takes `ones`.

The acceptance lengths before and after (`acceptance`) are the reference loop's on other prompts, never ranked
or fitted on: the user's `--prompts`, else smoke's default prompts. The source and the written output are each
read the way vLLM (V1 runner) reads their files: greedy counts that equal vLLM's exactly
(docs/smoke.md#engine-parity), so they are what `acceptance.reproduce` (a `smoke` command) prints.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ...checkpoint.drafter import DrafterCheckpoint, open_drafter
from ...errors import ConversionError, UsageError
from ...io import cast as casting
from ...io.atomic import check_destination, local_inputs
from ...io.states import States
from ...measure.calibration import Fit, Moments, accumulate, fit, held_out_error
from ...measure.fidelity import (
    STEPS,
    Setup,
    before_after,
    boundaries,
    check_written,
    rank_by_acceptance,
    reserved_spans,
    workloads_for,
)
from ...measure.target import Target
from ...progress import Progress, passthrough
from ...result import Result
from ..convert.command import ConversionPlan, ConversionResult, execute, plan_conversion, writable_dialect
from ..convert.plan import Additions
from ..requests import UpgradeRequest

if TYPE_CHECKING:
    import torch

    from ...measure.fidelity import Workload
    from ...measure.probe import Measurement
    from ...model.loader import LoadedDrafter
    from ...spec import DrafterSpec
    from ..verify import ParityReport
    from .fitting import FitReport

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


CALIBRATION_TOKENS = 4096  # tokens of the calibration text read for the statistics
# held-out prompts the inits are ranked on (reference loop), tokens decoded
RANK_PROMPTS, RANK_TOKENS = UpgradeRequest.num_prompts, UpgradeRequest.max_tokens
CAL_PROMPTS, CAL_SEED = 32, 5  # held-out prompts whose greedy continuations calibration and `fit` read (never ranked)
FIT_CAPTURE_TOKENS = 8192  # anchors of a capture `fit` reads
FIDELITY_STEPS = 3


@dataclass
class Choice:
    """The fc_norm init chosen (None: no fc_norm is added), its values, the candidates measured (best first) and
    the `fit` init's report."""

    init: str | None = None
    fitted: Fit = field(default_factory=lambda: ([], None, {}))
    candidates: list[dict[str, Any]] = field(default_factory=list)
    fit_report: FitReport | None = None


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
    to, steps = upgrade_steps(src, tgt, init, req.fc_norm, req.norm_output, to, target, prompts, again)
    new_spec = replace(src.spec, fc_norm=src.spec.fc_norm or "add-fc-norm" in steps,
                       norm_output=src.spec.norm_output or "set-norm-output" in steps)
    runnable = tgt is not None and tgt.runnable
    work, report = (workloads_for(tgt, prompts, req.num_prompts, req.max_tokens) if runnable and steps
                    else (None, None))
    ids, layers, measurement = _layers(src, tgt, steps)
    fc = src.view.info("fc.weight").dtype if "fc.weight" in src.view else "BF16"  # the written tensors' dtype
    s = Setup(src, tgt, {"fc_norm": new_spec.fc_norm, "norm_output": new_spec.norm_output},
              fc if fc in ("F32", "BF16", "F16") else "BF16", req.runner, progress, ids, work, report)
    choice = choose_init(s, init, req.fit_fc) if "add-fc-norm" in steps else Choice()
    plan, supplied, written = plan_upgrade(s, dest, to, new_spec, choice, req.fit_fc, req.base_model, measurement)
    acceptance = before_after(s, choice.fitted, plan.config, written=not req.dry_run) if report else None
    if acceptance is not None and report is not None and target is not None:
        acceptance["reproduce"] = report.smoke_command(str(dest), target, req.runner)
    recorded = None
    if req.fidelity and steps and not req.dry_run:  # what verify DEST --against SOURCE holds the files to (the record)
        fid = _fidelity(_planned(src, dest, new_spec, written, s.dtype), s, req.fidelity_tokens)
        recorded = {"inputs": "target" if fid.inputs_real else "synthetic", "seed": fid.seed, "tokens": fid.tokens,
                    "per_step": [{"step": m.step, "kl_mean": round(m.kl_mean, 6),
                                  "top1_agreement": round(m.top1_agreement, 6)} for m in fid.metrics]}
    _mark(plan, steps, choice, acceptance, written, recorded)
    result = UpgradeResult(source, dest, bool(steps), steps, choice.init, choice.fitted[2],
                           ConversionResult(plan, False, []), None,
                           _notes(steps, init, choice, acceptance, ids, again + (f" --to {to}" if req.to else "") + (
                               f" --base-model {shlex.quote(req.base_model)}" if req.base_model else "")),
                           choice.candidates, layers, acceptance,
                           choice.fit_report.to_json() if choice.fit_report else None,
                           _next_command(dest, target, report, req.runner))
    return result if req.dry_run else _write(result, s, plan, supplied, req.force,
                                             req.fidelity_tokens if req.fidelity else None, inputs)


# ------------------------------------------------------------------------------------ what to do, or why not

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
        if "add-fc-norm" in steps and not _from_continuations(tgt):  # calibration reads the text run too
            tgt.need(tokens=CALIBRATION_TOKENS)  # declared now: the probe's capture serves calibration and fidelity
        m = measure(src, tgt, loop_prompts=0)  # what stops the probe stops calibration too: said as it is
        ids, how = ((m.boundary_ids, f"measured ({m.aux.reason})") if m.boundary_ids is not None else
                    (src.spec.capture_ids(L), f"as the files say (not decided: {m.aux.reason})"))
    return ids, {"boundary_ids": list(ids), "how": how}, m


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


# --------------------------------------------------------------------------------------- choosing the init

def choose_init(s: Setup, init: str, fit_fc: bool) -> Choice:
    """The fc_norm init: every init `init` asks for, fitted on the target's states when they can be had, ranked
    (`rank_inits`), `fit` tuned from the best closed-form one; kept: the best, or the one `init` names."""
    n, Ht = s.src.spec.num_aux_hidden_states, s.src.spec.aux_width
    if n is None or Ht is None:
        raise ConversionError(f"{s.src.source}: cannot tell the aux count / width from fc.weight")
    inits = _inits(init, s.tgt)
    if s.tgt is None or not s.tgt.has_states or s.ids is None:  # nothing to measure: `ones`, or the refusal
        fits = {i: fit(i, n, Ht) for i in inits}
        return Choice(inits[0], fits[inits[0]])
    closed = tuple(i for i in inits if i != "fit")
    if s.work is not None:
        _declare(s, with_fit="fit" in inits)
    fits, held = calibrate(s, closed, n, Ht)
    candidates, report = rank_inits(s, fits, held), None
    if "fit" in inits:
        start = candidates[0]["init"] if candidates else ("calibrated" if "calibrated" in fits else closed[0])
        fits["fit"], report = _fit_init(s, fits[start], start, fit_fc)
        if s.work is not None:
            candidates = rank_by_acceptance(s, {"fit": fits["fit"]}, ranked=candidates)
    chosen = "fit" if init == "fit" else candidates[0]["init"] if candidates else inits[0]
    return Choice(chosen, fits[chosen], candidates, report)


def rank_inits(s: Setup, fits: dict[str, Fit], held: Moments | None) -> list[dict[str, Any]]:
    """Best first: by the acceptance each keeps on the ranking prompts when the target runs, else by the
    FC-output error on the capture's held-out requests; nothing to rank them on: none."""
    if s.work is not None:
        return rank_by_acceptance(s, fits)
    if held is None:
        return []
    return sorted(({"init": i, "heldout_fc_output_relative_error": round(held_out_error(f, held), 6),
                    "heldout_tokens": held.tokens} for i, f in fits.items()),
                  key=lambda r: r["heldout_fc_output_relative_error"])


def calibrate(s: Setup, inits: tuple[str, ...], n: int, Ht: int) -> tuple[dict[str, Fit], Moments | None]:
    """Every init fitted on the target's states at the measured boundaries (its run over the calibration text,
    its greedy continuations of held-out prompts, or the capture's requests, the last quarter held out to rank
    the inits when the target cannot run), and the held-out moments."""
    tgt, ids = s.tgt, s.ids
    assert tgt is not None and ids is not None
    W = s.src.view.read("fc.weight").astype(np.float64)
    eps = s.src.spec.rms_norm_eps if s.src.spec.rms_norm_eps is not None else 1e-6
    held = None
    if tgt.states is not None:
        cal_part, held_part, where = _split_requests(tgt.states, ids, rank=len(inits) > 1 and not tgt.runnable)
        moments = accumulate(W, n, Ht, eps, s.progress(cal_part, label="calibration: requests"))
        held = accumulate(W, n, Ht, eps, held_part) if held_part is not None else None
        held = held if held is not None and held.tokens else None  # held-out requests of one token each
        note = {"target": tgt.states.target, "states": str(tgt.states.root), "text_source": where}
    elif _from_continuations(tgt):
        conts = tgt.continuations(_calibration_prompts(s), max_tokens=RANK_TOKENS, k=STEPS, boundaries=ids)
        moments = accumulate(W, n, Ht, eps, (c.aux(ids)[: c.prompt_length + c.max_tokens].double().numpy()
                                             for c in s.progress(conts, label="calibration: continuations")))
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


def _split_requests(captured: States, ids: tuple[int, ...], rank: bool
                    ) -> tuple[Iterator[np.ndarray], Iterator[np.ndarray] | None, str]:
    """(calibration sequences, held-out sequences, description): the last quarter of the requests is held
    out for ranking the inits when there is more than one request and a ranking is wanted."""
    captured.require(ids)
    count = len(captured.files)
    held = max(1, count // 4) if rank and count > 1 else 0

    def seqs(part: slice) -> Iterator[np.ndarray]:
        for req in captured.requests(ids, part):
            yield req.hidden.reshape(req.hidden.shape[0], -1)

    how = f"{count - held} captured requests" + (f" ({held} more held out to rank the inits)" if held else "")
    return seqs(slice(0, count - held)), seqs(slice(count - held, count)) if held else None, how


def _calibration_prompts(s: Setup) -> list[list[int]]:
    """The windows calibration and `fit` read: apart from those the inits are ranked and the acceptance is
    reported on."""
    from ...measure.workload import heldout_prompts

    assert s.tgt is not None
    return heldout_prompts(s.tgt.model().tokenizer, CAL_PROMPTS, RANK_TOKENS, seed=CAL_SEED,
                           avoid=reserved_spans(s.work.num_prompts if s.work is not None else RANK_PROMPTS))


def _declare(s: Setup, with_fit: bool = False) -> None:
    """Every boundary the command reads, then one decode of every prompt it replays or reads states of (the
    ranking, report and calibration prompts)."""
    tgt, work, report = s.tgt, s.work, s.report
    assert tgt is not None and work is not None and report is not None and s.ids is not None
    assert tgt.num_layers is not None
    wanted = set(s.ids) | set(boundaries(s, s.src.ckpt.config or {}))
    tgt.need(wanted)
    extra = _calibration_prompts(s) if _from_continuations(tgt) or with_fit else []
    tgt.continuations(work.prompts + report.prompts + extra, max_tokens=max(work.max_tokens, RANK_TOKENS),
                      k=work.k, boundaries=wanted)


def _fit_init(s: Setup, start: Fit, start_name: str, fit_fc: bool) -> tuple[Fit, FitReport]:
    """The `fit` init from the closed-form `start`: on the greedy continuations of the fitting prompts when
    the target runs, else on the capture's requests (fitting.py)."""
    from ...model.loader import load_reference
    from . import fitting

    tgt = s.tgt
    assert tgt is not None and s.ids is not None
    loaded = load_reference(s.src)
    session_ids = tuple(sorted(set(s.ids)))
    if tgt.runnable:
        calp = _calibration_prompts(s)
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
    for _ in s.progress([0], label=f"upgrade: fit ({'fc_norm and fc' if fit_fc else 'fc_norm'}) from {start_name}",
                        total=1):
        g, fc, report = fitting.fit_fc_norm(loaded, (gammas, new_fc), s.flags, seqs, embed=table,
                                            start_name=start_name, data=data, fit_fc=fit_fc)
    stats = dict(st or {})
    stats["fit"] = report.to_json()
    return (g, fc, stats), report


def _capture_table(tgt: Target) -> torch.Tensor:
    """The target's embedding table for a drafter that ships none, with only a capture: from the target's
    weights when its files hold them, else the rows of the tokens seen, read off boundary 0."""
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
    rows: dict[int, np.ndarray] = {}
    for req in tgt.states.requests((0,)):
        for t, h in zip(req.token_ids.tolist(), req.hidden[:, 0], strict=False):
            rows.setdefault(int(t), h)
    table = torch.zeros(max(rows) + 1, len(next(iter(rows.values()))))
    for t, h in rows.items():
        table[t] = torch.from_numpy(np.asarray(h, dtype=np.float32))
    return table


# ------------------------------------------------------------------------------------ the plan and the files

def plan_upgrade(s: Setup, dest: str, to: str, new_spec: DrafterSpec, choice: Choice, fit_fc: bool,
                 base_model: str | None, measurement: Measurement | None
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
    import json

    from ..verify import values_digest

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
    from ...model.loader import load_reference
    from ..verify import compare, real_inputs, synthetic_inputs

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
    where = acceptance["ranked_on"]["description"] if acceptance else "held-out prompts"
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
                     f"`ones` keeps 83.9%): {again} --target TARGET; or capture the target's states once where it "
                     f"runs: eaglectl capture TARGET --out DIR; then rank the closed-form inits here: {again} "
                     "--states DIR")
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
