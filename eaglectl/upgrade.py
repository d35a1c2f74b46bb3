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
from typing import Any

import numpy as np

from . import __version__
from .convert import ConversionPlan, ConversionResult, execute, plan_conversion
from .drafter import DrafterCheckpoint, open_drafter
from .errors import ConversionError
from .io import cast as casting
from .calibration import accumulate, fit, held_out_error
from .io.states import open_states
from .target import open_target, target_of_capture

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
    progress: Any = None,
    base_model: str | None = None,
) -> UpgradeResult:
    """Take SOURCE to the EAGLE-3.1 layout at DEST; the target (when given) runs once, for calibration
    and for the fidelity report."""
    src = open_drafter(source, from_dialect=from_dialect, allow_pickle=allow_pickle)
    captured = open_states(states) if states else None
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
    if fc_norm and not spec.fc_norm and spec.norm_before_fc:
        raise ConversionError(f"{source}: the drafter has norm_before_fc; adding fc_norm would normalise twice "
                              "(vLLM applies both, TRT-LLM one, speculators refuses)",
                              hint=f"{again} --no-fc-norm (norm_output only)")
    add_fc_norm = fc_norm and not spec.fc_norm
    set_norm_output = norm_output and not spec.norm_output
    steps = [s for s, on in (("add-fc-norm", add_fc_norm), ("set-norm-output", set_norm_output)) if on]
    if init in NEEDS_TARGET and add_fc_norm and target is None and states is None:
        raise ConversionError(f"--init {init} measures the target's hidden states: pass --target or --states",
                              hint=f"{again} --init {init} --target TARGET "
                                   "(or --states DIR from eaglectl capture)")
    if to == src.dialect.name and src.dialect.writer is not None and not src.dialect.writer.flag_paths and steps:
        raise ConversionError(f"{source}: the {src.dialect.title} layout cannot record fc_norm / norm_output",
                              hint=other)
    tgt = open_target(target) if target else target_of_capture(captured) if captured else None
    model = None
    if target and ((add_fc_norm and captured is None) or (fidelity and steps and not dry_run)):
        from .model.hf import load_model

        model = load_model(target)

    new_spec = replace(spec, fc_norm=spec.fc_norm or add_fc_norm, norm_output=spec.norm_output or set_norm_output)
    new_flags = {"fc_norm": new_spec.fc_norm, "norm_output": new_spec.norm_output}
    supplied: dict[str, bytes] = {}
    extra: dict[str, tuple[str, tuple[int, ...], str]] = {}
    stats: dict[str, Any] = {}
    dtype = _float_dtype(src)
    candidates: list[dict[str, Any]] = []
    layers = None
    chosen = None
    if add_fc_norm:
        n, Ht = spec.num_aux_hidden_states, spec.aux_width
        if n is None or Ht is None:
            raise ConversionError(f"{source}: cannot tell the aux count / width from fc.weight")
        runnable = tgt is not None and tgt.why_not_runnable() is None
        measurable = runnable or captured is not None
        inits = (INITS if measurable else ("calibrated",) if model is not None else ("ones",)) if init == "auto" \
            else (init,)
        if model is None and captured is None:
            fits = {i: fit(i, n, Ht) for i in inits}
        else:
            ids, how = _layers(src, model if runnable else None, captured, tgt)
            layers = {"boundary_ids": list(ids), "how": how}
            W = src.view.read("fc.weight").astype(np.float64)
            eps = spec.rms_norm_eps if spec.rms_norm_eps is not None else 1e-6
            held = None
            if captured is not None:
                cal_part, held_part, where = _split_requests(captured, ids, rank=len(inits) > 1 and not runnable)
                moments = accumulate(W, n, Ht, eps, (progress or (lambda it, **kw: it))(
                    cal_part, label="calibration: requests"))
                held = accumulate(W, n, Ht, eps, held_part) if held_part is not None else None
                held = held if held is not None and held.tokens else None  # held-out requests of one token each
                source_note = {"target": captured.target, "states": str(captured.root), "text_source": where}
            else:
                moments, text_how = _text_moments(model, calibration_text, ids, W, n, Ht, eps)
                source_note = {"target": model.path, "text_source": text_how}
            fits = {i: fit(i, n, Ht, moments) for i in inits}
            for _, _, st in fits.values():
                st.update({**source_note, "aux_ids_vllm": list(ids)}) if st else None
            if runnable and (fidelity or len(inits) > 1):
                candidates = evaluate_inits(src, fits, model, ids, new_flags, dtype, progress=progress)
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
    plan = plan_conversion(src, dest, to, target=tgt, spec_override=new_spec, extra_tensors=extra,
                           base_model=base_model)
    _mark(plan, steps, chosen, stats)
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
    if dry_run:
        return UpgradeResult(source, dest, bool(steps), steps, chosen, stats, ConversionResult(plan, False, []), None,
                             notes, candidates, layers)
    # the fidelity inputs are read before anything is written: a capture too short for them fails here, not
    # after DEST exists
    fid_inputs = _fidelity_inputs(src, model, captured, calibration_text, fidelity_tokens) if steps and fidelity \
        else None
    result = execute(plan, src, target=tgt, force=force, supplied=supplied, progress=progress)
    fid = _fidelity(dest, *fid_inputs) if fid_inputs is not None else None
    return UpgradeResult(source, dest, bool(steps), steps, chosen, stats, result, fid, notes, candidates, layers)


def _layers(src: DrafterCheckpoint, model: Any, captured: Any, tgt: Any) -> tuple[tuple[int, ...], str]:
    """The boundaries calibration must use: measured when the probe decides, else the files' reading."""
    from .probe import try_measure

    L = model.num_layers if model is not None else captured.num_layers if captured is not None else tgt.num_layers
    if model is None and captured is None:
        return src.spec.capture_ids(L), f"as the files say ({tgt.why_not_runnable()})"
    m, _, why = try_measure(src, None, states=captured, loop_prompts=0) if model is None else \
        (_measure(src, model), None, None)
    if m is not None and m.boundary_ids is not None:
        return m.boundary_ids, f"measured ({m.aux.reason})"
    return src.spec.capture_ids(L), f"as the files say (not decided: {m.aux.reason if m else why})"


def _measure(src: DrafterCheckpoint, model: Any) -> Any:
    from .probe import measure

    return measure(src, model, loop_prompts=0)


def _split_requests(captured: Any, ids: tuple[int, ...], rank: bool) -> tuple[Any, Any, str]:
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


def _text_moments(model: Any, text: str | None, ids: tuple[int, ...], W: Any, n: int, Ht: int, eps: float
                  ) -> tuple[Any, str]:
    """Statistics of the target's states over calibration text (one forward pass)."""
    import torch

    from .model.hf import capture_aux
    from .verify import BUNDLED_TEXT

    body = text if text is not None else BUNDLED_TEXT.read_text()
    if model.tokenizer is not None:
        input_ids = model.tokenizer(body, return_tensors="pt").input_ids[:, :4096]
        how = "bundled text" if text is None else "given text"
    else:
        # no tokenizer: bytes of the text as ids (byte-level vocabularies), clipped to the vocab
        input_ids = (torch.tensor(list(body.encode("utf-8"))[:4096]) % model.vocab_size)[None]
        how = "text bytes as token ids (the target has no tokenizer)"
    aux = capture_aux(model, input_ids, ids)[0].double().numpy()
    return accumulate(W, n, Ht, eps, [aux]), how


FIDELITY_STEPS = 3


def _fidelity_inputs(src: DrafterCheckpoint, model: Any, captured: Any, text: str | None, tokens: int
                     ) -> tuple[Any, Any]:
    """(the source's reference drafter, the inputs DEST and SOURCE are compared on): the target's states when it
    runs or was captured (a capture's requests shorter than `tokens` give fewer anchors), else synthetic."""
    from .model.loader import load_reference
    from .verify import states_inputs, synthetic_inputs, target_inputs

    ref = load_reference(src)
    steps = FIDELITY_STEPS
    if model is not None:
        inputs = target_inputs(model, ref.spec, ref.args, tokens, steps, 0, text)
    elif captured is not None:
        inputs = states_inputs(captured, ref.spec, ref.args, tokens, steps, table_needed=not ref.has_embed,
                               shrink=True)
    else:
        inputs = synthetic_inputs(ref.args, ref.spec.aux_layer_ids_vllm, tokens, steps, 0)
    return ref, inputs


def _fidelity(dest: str, ref: Any, inputs: Any) -> Any:
    """DEST against SOURCE through the reference drafter, on the inputs `_fidelity_inputs` prepared."""
    from .model.loader import load_reference
    from .verify import compare

    cand = load_reference(open_drafter(dest))
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
                   model: Any, ids: tuple[int, ...], new_flags: dict[str, bool], dtype: str, *, tokens: int = 1024,
                   prompts: int = 16, max_tokens: int = 64, steps: int = 3, progress: Any = None) -> list[dict[str, Any]]:
    """Each candidate init on held-out text (never the calibration text), ranked by the acceptance it keeps.

    The ranking uses the reference loop's acceptance length on `prompts` held-out windows (the kind of
    text the drafter serves: the target's own continuations); ties go to the chain acceptance estimated
    teacher-forced over `tokens` anchors of real text. The top-1 agreement with the source drafter is
    reported too. Values are rounded to the stored dtype first: what is measured is what would be written."""
    import torch

    from .model.hf import forward
    from .model.loader import load_reference
    from .probe import heldout_prompts, replay

    loaded = load_reference(src)
    tok = torch.tensor([heldout_prompts(model, 1, tokens + steps + 1, seed=7)[0]])
    session_ids = tuple(sorted(set(ids)))
    with torch.no_grad():
        logits, aux = forward(model, tok, session_ids)
    aux = aux[:, :tokens]
    greedy = logits.argmax(-1)[0]
    table = None if loaded.has_embed else model.embedding().float()
    ps = heldout_prompts(model, prompts, 64, seed=3)

    def chain(outs: list[Any]) -> float:
        right = torch.stack([o.target_ids[0] == greedy[j + 1: j + 1 + tokens] for j, o in enumerate(outs)])
        return 1 + float(right.long().cumprod(0).sum(0).float().mean())  # leading correct steps per anchor

    with torch.no_grad():
        ref_out = loaded.build(torch.float32, "cpu").run(aux, tok, steps, embed=table)
    source_chain = chain(ref_out)
    source_al = replay(loaded, session_ids, model, ps, k=steps, max_tokens=max_tokens).mean_acceptance_length
    out = []
    for init, (gammas, new_fc, _) in (progress or (lambda it, **kw: it))(list(fits.items()),
                                                                         label="upgrade: fc_norm inits measured"):
        stored = {f"fc_norm.{j}.weight": _as_stored(g, dtype) for j, g in enumerate(gammas)}
        if new_fc is not None:
            stored["fc.weight"] = _as_stored(new_fc, dtype)
        with torch.no_grad():
            cand = loaded.build(torch.float32, "cpu", replace=stored, **new_flags).run(aux, tok, steps, embed=table)
        agreement = [float((c.target_ids == r.target_ids).float().mean()) for c, r in zip(cand, ref_out, strict=True)]
        al = replay(loaded, session_ids, model, ps, k=steps, max_tokens=max_tokens, replace=stored,
                    **new_flags).mean_acceptance_length
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
