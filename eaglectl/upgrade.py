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
  (W' = W_fc Cᵀ (U + λI)⁻¹): the richest linear option, it changes `fc.weight` too.

Statistics stream (calibration.py) from the real target (`--target`) on calibration text, or from a
capture of it (`--states DIR`, any size); position 0 of each sequence (the sink token) is excluded.
`auto` ranks the inits by the reference loop's acceptance on held-out prompts when the target runs,
else by the FC-output error on held-out requests of the capture, else takes `ones`.
"""

from __future__ import annotations

import shlex

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from . import __version__
from .calibration import Moments, accumulate, fit, held_out_error
from .convert import ConversionPlan, ConversionResult, execute, plan_conversion, plan_inputs, writable_dialect
from .drafter import DrafterCheckpoint, open_drafter
from .errors import ConversionError
from .io import cast as casting
from .io.atomic import check_destination
from .io.states import States
from .progress import Progress, passthrough
from .target import Target

if TYPE_CHECKING:
    from .verify import ParityReport

SCHEMA = "eaglectl.upgrade/1"
INITS = ("ones", "harmonic", "calibrated", "refit")
NEEDS_TARGET = ("harmonic", "calibrated", "refit")
CHOICES = ("auto", *INITS)  # auto: measure every init (--target or --states) and keep the best; ones without


@dataclass
class UpgradeResult:
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

    @property
    def exit_code(self) -> int:
        return 0

    def summary_line(self) -> str:
        return ", ".join(self.steps) or "nothing to change"

    def to_json(self) -> dict[str, Any]:
        fid = self.fidelity.to_json() if self.fidelity is not None else None
        return {
            "schema": SCHEMA, "tool_version": __version__, "command": "upgrade", "source": self.source,
            "dest": self.dest, "changed": self.changed, "steps": self.steps, "init": self.init,
            "statistics": self.statistics, "needs_fine_tuning": self.changed, "dry_run": not self.conversion.written,
            "fidelity": None if fid is None else {"inputs": fid["inputs"], "per_step": [
                {k: s[k] for k in ("step", "top1_agreement", "near_ties", "kl_mean", "kl_max", "state_cos_mean")}
                for s in fid["per_step"]]},
            "init_candidates": self.init_candidates, "layers": self.layers,
            "plan": self.conversion.plan.to_json(), "checked": self.conversion.checked, "notes": self.notes,
            "exit_code": self.exit_code,
        }


CALIBRATION_TOKENS = 4096  # tokens of the calibration text read for the statistics
RANK_PROMPTS, RANK_TOKENS, RANK_SEED = 16, 64, 3  # held-out prompts the inits are ranked on (reference loop)


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
    to: str | None = None,
    from_dialect: str | None = None,
    allow_pickle: bool = False,
    force: bool = False,
    dry_run: bool = False,
    fidelity: bool = True,
    fidelity_tokens: int = 64,
    progress: Progress = passthrough,
    base_model: str | None = None,
) -> UpgradeResult:
    """Take SOURCE to the EAGLE-3.1 layout at DEST. The target (when given) is loaded once, its states over
    the calibration text are captured once, and its greedy continuations of held-out prompts are decoded
    once; the probe, calibration, the ranking of the inits and the fidelity report all read them."""
    src = open_drafter(source, from_dialect=from_dialect, allow_pickle=allow_pickle)
    tgt = Target.open(target, states, progress=progress, text=calibration_text)
    spec = src.spec
    to, steps = _plan_steps(src, source, dest, init, fc_norm, norm_output, to, target, tgt, allow_pickle)
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
    layers = chosen = None
    ids: tuple[int, ...] | None = None
    if add_fc_norm:
        n, Ht = spec.num_aux_hidden_states, spec.aux_width
        if n is None or Ht is None:
            raise ConversionError(f"{source}: cannot tell the aux count / width from fc.weight")
        inits = _inits(init, tgt)
        if tgt is None or not tgt.has_states:
            fits = {i: fit(i, n, Ht) for i in inits}
        else:
            ids, how = _layers(src, tgt)
            layers = {"boundary_ids": list(ids), "how": how}
            fits, held = _calibrate(src, tgt, ids, inits, n, Ht, progress)
            if tgt.runnable and (fidelity or len(inits) > 1):
                candidates = evaluate_inits(src, fits, tgt, ids, new_flags, dtype, progress=progress)
            elif held is not None:
                candidates = sorted(({"init": i, "heldout_fc_output_relative_error": round(
                    held_out_error(f, held), 6), "heldout_tokens": held.tokens} for i, f in fits.items()),
                    key=lambda r: r["heldout_fc_output_relative_error"])
        chosen = candidates[0]["init"] if candidates else inits[0]
        gammas, new_fc, stats = fits[chosen]
        for j, g in enumerate(gammas):
            canon = f"fc_norm.{j}.weight"
            extra[canon] = (dtype, (Ht,), f"fc_norm init {chosen}")  # type: ignore[assignment]
            supplied[canon] = casting.encode(g, dtype)
        if new_fc is not None:
            extra["fc.weight"] = (dtype, tuple(new_fc.shape), "refit to the 3.0 FC output")
            supplied["fc.weight"] = casting.encode(new_fc, dtype)
    plan = plan_conversion(src, dest, to, target=tgt.checkpoint if tgt else None, spec_override=new_spec,
                           extra_tensors=extra, base_model=base_model)
    _mark(plan, steps, chosen, stats)
    notes = _notes(steps, init, chosen, candidates)
    if dry_run:
        return UpgradeResult(source, dest, bool(steps), steps, chosen, stats, ConversionResult(plan, False, []), None,
                             notes, candidates, layers)
    measured: dict[str, Any] = {}

    def fidelity_of(out: DrafterCheckpoint) -> list[str]:
        measured["report"] = _fidelity(out, src, tgt, fidelity_tokens, ids)
        return []

    result = execute(plan, src, target=tgt.checkpoint if tgt else None, force=force, supplied=supplied,
                     progress=progress, after_write=fidelity_of if steps and fidelity else None)
    return UpgradeResult(source, dest, bool(steps), steps, chosen, stats, result, measured.get("report"), notes,
                         candidates, layers)


def _plan_steps(src: DrafterCheckpoint, source: str, dest: str, init: str, fc_norm: bool, norm_output: bool,
                to: str | None, target: str | None, tgt: Target | None, allow_pickle: bool) -> tuple[str, list[str]]:
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
    return to, steps


def _inits(init: str, tgt: Target | None) -> tuple[str, ...]:
    """The inits to fit: one asked for, or under `auto` every init that can be measured (a target without a
    tokenizer can calibrate but not rank: `calibrated`; nothing to measure: `ones`)."""
    if init != "auto":
        return (init,)
    if tgt is not None and (tgt.runnable or tgt.states is not None):
        return INITS
    if tgt is not None and tgt.has_states:
        return ("calibrated",)
    return ("ones",)


def _layers(src: DrafterCheckpoint, tgt: Target) -> tuple[tuple[int, ...], str]:
    """The boundaries calibration must use: measured when the probe decides, else the files' reading."""
    from .probe import measure

    L = tgt.num_layers
    assert L is not None
    if tgt.states is None and not tgt.runnable:
        return src.spec.capture_ids(L), f"as the files say ({tgt.why_not_runnable()})"
    tgt.need(tokens=CALIBRATION_TOKENS)  # the probe's capture also serves calibration and fidelity
    m = measure(src, tgt, loop_prompts=0)  # what stops the probe stops calibration too: said as it is
    if m.boundary_ids is not None:
        return m.boundary_ids, f"measured ({m.aux.reason})"
    return src.spec.capture_ids(L), f"as the files say (not decided: {m.aux.reason})"


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


def _notes(steps: list[str], init: str, chosen: str | None, candidates: list[dict[str, Any]]) -> list[str]:
    notes = []
    if steps:
        notes.append("structurally upgraded to the EAGLE-3.1 layout: not function-preserving; fine-tune "
                     "(training-time test) before serving it as a 3.1 drafter")
    else:
        notes.append("already has the requested 3.1 features: nothing to change (tensors copied unchanged)")
    if candidates and init == "auto" and "acceptance_kept" in candidates[0]:
        notes.append(f"fc_norm init '{chosen}' measured best on held-out prompts (the reference loop kept "
                     f"{candidates[0]['acceptance_kept']:.1%} of the source's acceptance length before fine-tuning)")
    elif candidates and init == "auto":
        notes.append(f"fc_norm init '{chosen}' has the lowest FC-output error on held-out requests of the capture "
                     f"({candidates[0]['heldout_fc_output_relative_error']:.3f}); acceptance was not measured "
                     "(no runnable target)")
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


def _fidelity(out: DrafterCheckpoint, src: DrafterCheckpoint, tgt: Target | None, tokens: int,
              ids: tuple[int, ...] | None) -> ParityReport:
    """DEST against SOURCE through the reference drafter, on the target's states (at the measured layers)
    when it ran or was captured (a capture's requests shorter than `tokens` give fewer anchors), else
    synthetic states."""
    from .verify import compare, real_inputs, synthetic_inputs

    ref, cand = src.reference(), out.reference()
    if tgt is not None and tgt.has_states:
        inputs = real_inputs(tgt, ref, tokens, FIDELITY_STEPS, boundaries=ids, shrink=True)
    else:
        inputs = synthetic_inputs(ref.args, ref.spec.aux_layer_ids_vllm, tokens, FIDELITY_STEPS, 0)
    tokens = int(inputs.aux.shape[1])
    return compare(cand, ref, inputs, "fidelity", ("float32", "cpu"), ("float32", "cpu"), FIDELITY_STEPS, tokens, 0)


def _float_dtype(src: DrafterCheckpoint) -> str:
    fc = src.view.info("fc.weight").dtype if "fc.weight" in src.view else "BF16"
    return fc if fc in ("F32", "BF16", "F16") else "BF16"


def _mark(plan: ConversionPlan, steps: list[str], init: str | None, stats: dict[str, Any]) -> None:
    """Provenance in config and safetensors metadata: what was done and that it needs fine-tuning."""
    import json

    prov = plan.config["eaglectl_provenance"]
    prov.update({"operation": "upgrade", "upgrade_steps": steps, "fc_norm_init": init, "needs_fine_tuning": bool(steps)})
    if stats:
        prov["calibration"] = {k: v for k, v in stats.items() if k != "per_channel"}
    plan.metadata["eaglectl"] = json.dumps(prov, sort_keys=True)


# ------------------------------------------------------------------------------- choosing by measurement

def evaluate_inits(src: DrafterCheckpoint, fits: dict[str, tuple[list[np.ndarray], np.ndarray | None, Any]],
                   tgt: Target, ids: tuple[int, ...], new_flags: dict[str, bool], dtype: str, *,
                   prompts: int = RANK_PROMPTS, max_tokens: int = RANK_TOKENS, steps: int = 3,
                   progress: Progress = passthrough) -> list[dict[str, Any]]:
    """Each candidate init on held-out prompts (never the calibration text), ranked by the acceptance it keeps.

    The ranking uses the reference loop's acceptance length on the target's greedy continuations of `prompts`
    held-out windows (decoded once, replayed for every init); ties go to the chain acceptance estimated
    teacher-forced over every anchor of those continuations. The top-1 agreement with the source drafter is
    reported too. Values are rounded to the stored dtype first: what is measured is what would be written."""
    import torch

    from .model.replay import chains, correct, counts_of
    from .workload import heldout_prompts

    loaded = src.reference()
    session_ids = tuple(sorted(set(ids)))
    table = None if loaded.has_embed else tgt.model().embedding().float()
    ps = heldout_prompts(tgt.model().tokenizer, prompts, 64, seed=RANK_SEED)
    conts = tgt.continuations(ps, max_tokens=max_tokens, k=steps, boundaries=session_ids)

    def chain(drafted: list[torch.Tensor]) -> float:  # leading correct steps per anchor, over every anchor
        right = torch.cat([correct(c, d) for c, d in zip(conts, drafted, strict=True)], dim=1)
        return 1 + float(right.long().cumprod(0).sum(0).float().mean())

    source = chains(loaded.build(torch.float32, "cpu"), conts, aux_ids=session_ids, embed=table)
    source_chain, source_al = chain(source), counts_of(conts, source).mean_acceptance_length
    out = []
    for init, (gammas, new_fc, _) in progress(list(fits.items()), label="upgrade: fc_norm inits measured"):
        stored = {f"fc_norm.{j}.weight": _as_stored(g, dtype) for j, g in enumerate(gammas)}
        if new_fc is not None:
            stored["fc.weight"] = _as_stored(new_fc, dtype)
        drafter = loaded.build(torch.float32, "cpu", replace=stored, **new_flags)
        cand = chains(drafter, conts, aux_ids=session_ids, embed=table)
        agreement = [float(torch.cat([(c[j] == r[j]).float() for c, r in zip(cand, source, strict=True)]).mean())
                     for j in range(steps)]
        al = counts_of(conts, cand).mean_acceptance_length
        out.append({"init": init, "agreement_with_source": [round(a, 4) for a in agreement],
                    "estimated_acceptance_kept": round(chain(cand) / source_chain, 4),
                    "acceptance_length": round(al, 4), "source_acceptance_length": round(source_al, 4),
                    "acceptance_kept": round(al / source_al, 4)})
    out.sort(key=lambda r: (-r["acceptance_kept"], -r["estimated_acceptance_kept"]))
    return out


def _as_stored(values: np.ndarray, dtype: str) -> Any:
    import torch

    return torch.from_numpy(casting.decode(casting.encode(values, dtype), dtype).astype(np.float32).reshape(
        values.shape).copy())
