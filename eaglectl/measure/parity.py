"""Numerical parity of drafters through the reference drafter: the inputs (real target states, a capture, or
seeded synthetic ones), the per-step metrics, the regime a pair's differences allow, and the report
(`compare`). `verify` runs it on what the user names; `check` and `upgrade` on what they hold.

Modes
- conversion: CANDIDATE and `--against` REFERENCE (any dialects) on the same inputs, both at the
  chosen dtype/device. Identical tensors must give bit-identical outputs; changed tensors are held
  to the tolerance of their precision.
- precision: CANDIDATE at `--dtype` on `--device` against the fp32 CPU reference of itself.
- fidelity: like conversion, but a measurement without pass/fail (upgrade reports it).

Every step is teacher-forced: both sides draft from every anchor of the same token sequence, so
one argmax flip does not cascade (docs/math.md#tolerances). Inputs are real aux states of `--target` on text,
or seeded synthetic states with per-layer scales and a large-norm sink token at position 0.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import CorruptCheckpointError, IncompatibleDrafterError, InvalidStatesError, ParityMismatchError
from ..io.dtypes import TO_CONFIG
from ..io.states import States, compact_embedding
from ..model.loader import CHAIN_UNUSED, DTYPES, LoadedDrafter
from ..model.reference import DrafterArgs, StepOutput
from ..result import Result
from .target import Target

if TYPE_CHECKING:
    import numpy as np

    from ..io.jsonio import ConfigView

NEAR_TIE_NATS = 0.125  # top-2 log-prob margin below which a top-1 flip is not a disagreement

# Tolerances (docs/math.md#tolerances). "exact": identical tensors, same precision: outputs bit-identical.
# "fp32": torch.allclose on logits and fed-back state. "low-precision": distribution-level.
TOLERANCES: dict[str, dict[str, float]] = {
    "exact": {"max_abs": 0.0},
    "fp32": {"rtol": 1e-4, "atol": 1e-4},
    "low-precision": {"kl_mean_max": 1e-3, "top1_agreement_min": 0.99, "state_cos_mean_min": 0.999},
    # an upgrade adds fc_norm / turns on norm_output and is not function-preserving by design: every
    # carried tensor is identical (checked by choosing this regime) and the outputs stay a warm start
    # (a fixture upgrade with ones: KL mean <= 0.005, top-1 >= 78%); a broken init (NaN, zeros) fails
    "upgrade": {"kl_mean_max": 0.1, "top1_agreement_min": 0.5},
}
UPGRADE_ADDS = ("fc_norm.",)  # tensors an upgrade adds (docs/upgrade.md)
UPGRADE_REWRITES = ("fc.weight",)  # tensors an upgrade may rewrite (refit, fit --fit-fc), when its provenance says so


# --------------------------------------------------------------------------------------- inputs

@dataclass
class Inputs:
    aux: torch.Tensor  # (1, T, n_aux·H_t) fp32
    tokens: torch.Tensor  # (1, T + steps)
    embed: torch.Tensor | None  # the target's embedding table, if a target was run
    description: str
    real: bool = False  # the target's states (run or captured), not synthetic ones


def synthetic_inputs(args: DrafterArgs, aux_ids: tuple[int, ...] | None, tokens: int, steps: int,
                     seed: int) -> Inputs:
    """Seeded states: chunk j ~ N(0, σ_j²) with σ growing with layer depth, position 0 a sink (×30)."""
    g = torch.Generator().manual_seed(seed)
    ids = aux_ids or tuple(range(1, args.num_aux + 1))
    chunks = []
    for layer in ids[: args.num_aux]:
        sigma = 0.5 * math.sqrt(1.0 + layer)
        chunks.append(torch.randn(1, tokens, args.target_hidden_size, generator=g) * sigma)
    aux = torch.cat(chunks, dim=-1)
    aux[:, 0] *= 30.0
    # token ids from the first 4096 ids, so a borrowed synthetic table stays small (a 128k x 4096
    # table would cost 2 GB for rows nobody reads); which ids they are does not matter to the drafter
    rows = min(args.vocab_size, 4096)
    tok = torch.randint(0, rows, (1, tokens + steps), generator=g)
    embed = torch.randn(rows, args.hidden_size, generator=g) * 0.5
    return Inputs(aux, tok, embed, f"synthetic (seed {seed}): per-layer scales 0.5·sqrt(1+id), sink ×30 at 0, "
                  f"token ids < {rows}")


def real_inputs(target: Target, loaded: LoadedDrafter, tokens: int, steps: int,
                boundaries: tuple[int, ...] | None = None, table_needed: bool | None = None,
                shrink: bool = False) -> Inputs:
    """Real aux states at the drafter's layers (`boundaries`, default: as the files say): the target's run over
    the measurement text (once per command, `Target.text_states`), else its capture (`--states`)."""

    if not boundaries and loaded.spec.aux_layer_ids is None and target.num_layers is None:
        raise CorruptCheckpointError(f"{target.source}: the target's config gives no valid 'num_hidden_layers', so "
                                     "the default aux layers the drafter reads cannot be placed",
                                     key="num_hidden_layers", hint="give the target's config.json num_hidden_layers")
    ids = boundaries or loaded.spec.capture_ids(target.num_layers)  # type: ignore[arg-type]
    if len(ids) != loaded.args.num_aux:
        raise IncompatibleDrafterError(f"{len(ids)} aux ids {list(ids)} but fc takes {loaded.args.num_aux} states",
                                       hint="give the config one aux id per aux state fc takes (convert writes them)")
    if target.states is not None:
        needed = not loaded.has_embed if table_needed is None else table_needed
        return states_inputs(target.states, ids, tokens, steps, table_needed=needed, shrink=shrink,
                             vocab=loaded.args.vocab_size)
    target.need(ids, tokens + steps)
    states = target.text_states(ids, tokens + steps)
    req = next(states.requests(tuple(ids)))
    hidden = np.ascontiguousarray(req.hidden[:tokens], dtype=np.float32)
    aux = torch.from_numpy(hidden.reshape(1, tokens, -1).copy())
    tok = torch.from_numpy(req.token_ids[: tokens + steps].copy())[None]
    return Inputs(aux, tok, target.model().embedding().float().cpu(), f"{states.description}: aux ids {list(ids)}",
                  real=True)


def states_inputs(captured: States, ids: tuple[int, ...], tokens: int, steps: int, table_needed: bool = True,
                  shrink: bool = False, vocab: int | None = None) -> Inputs:
    """Aux states of a capture (`--states`, io/states.py) at boundaries `ids`: the first request long enough
    (with `shrink`, else the longest one, on fewer anchors). With `table_needed` (no drafter ships an
    embedding) the ids index the rows read off boundary 0. Token ids are checked against `vocab` (the drafter's)."""


    why = captured.embedding_source() if table_needed else None
    if why is not None:
        raise IncompatibleDrafterError(f"{captured.root}: the drafter ships no embedding table and {why}",
                                       hint="capture boundary 0 too, or pass --target for its embedding table")
    fetch = ids + ((0,) if table_needed and 0 not in ids else ())
    req = None
    for r in captured.requests(fetch, vocab=vocab):
        if len(r.token_ids) >= tokens + steps:
            req = r
            break
        if shrink and len(r.token_ids) > steps and (req is None or len(r.token_ids) > len(req.token_ids)):
            req = r
    if req is None or (not shrink and len(req.token_ids) < tokens + steps):
        need = steps + 1 if shrink else tokens + steps
        raise InvalidStatesError(f"{captured.root}: no captured request has {need} tokens: too few states",
                                 hint=f"capture with --length {tokens + steps} or more, or pass a smaller --tokens")
    tokens = min(tokens, len(req.token_ids) - steps)
    hidden = np.ascontiguousarray(req.hidden, dtype=np.float32)
    aux = torch.from_numpy(hidden[:tokens, : len(ids)].reshape(1, tokens, -1).copy())
    tok, embed = req.token_ids[: tokens + steps], None
    if table_needed:
        tok, rows = compact_embedding(tok, hidden[: tokens + steps, fetch.index(0)])
        embed = torch.from_numpy(rows)
    return Inputs(aux, torch.from_numpy(np.ascontiguousarray(tok))[None], embed,
                  f"capture {captured.root}: aux ids {list(ids)} on {req.name}", real=True)


# -------------------------------------------------------------------------------------- metrics

@dataclass
class StepMetrics:
    step: int
    logits_max_abs: float
    logits_max_rel: float  # max |Δ| / max |reference|
    state_max_abs: float
    state_max_rel: float
    state_cos_mean: float
    state_cos_min: float
    kl_mean: float  # KL(P_ref ‖ P_cand) over the draft vocab, nats
    kl_max: float
    top1_agreement: float  # over rows whose reference top-2 margin is ≥ NEAR_TIE_NATS
    top1_rows: int
    near_ties: int
    near_tie_agreement: float | None
    passed: bool | None = None


def step_metrics(step: int, ref: StepOutput, cand: StepOutput) -> StepMetrics:
    a, b = ref.logits.double().flatten(0, 1), cand.logits.double().flatten(0, 1).to(ref.logits.device)
    za, zb = ref.feedback.double().flatten(0, 1), cand.feedback.double().flatten(0, 1).to(ref.logits.device)
    la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
    kl = (la.exp() * (la - lb)).sum(-1)
    top2 = la.topk(2, dim=-1).values
    near = (top2[:, 0] - top2[:, 1]) < NEAR_TIE_NATS
    agree = a.argmax(-1) == b.argmax(-1)
    # identical rows agree whatever their norm (cosine_similarity says 0 for two zero vectors)
    cos = torch.where((za == zb).all(-1), 1.0, torch.nn.functional.cosine_similarity(za, zb, dim=-1))
    return StepMetrics(
        step=step,
        logits_max_abs=float((a - b).abs().max()),
        logits_max_rel=float((a - b).abs().max() / a.abs().max().clamp_min(1e-30)),
        state_max_abs=float((za - zb).abs().max()),
        state_max_rel=float((za - zb).abs().max() / za.abs().max().clamp_min(1e-30)),
        state_cos_mean=float(cos.mean()),
        state_cos_min=float(cos.min()),
        kl_mean=float(kl.mean()),
        kl_max=float(kl.max()),
        top1_agreement=float(agree[~near].double().mean()) if (~near).any() else 1.0,
        top1_rows=int((~near).sum()),
        near_ties=int(near.sum()),
        near_tie_agreement=float(agree[near].double().mean()) if near.any() else None,
    )


def judge(m: StepMetrics, ref: StepOutput, cand: StepOutput, regime: str) -> bool:
    if regime == "exact":
        return m.logits_max_abs == 0.0 and m.state_max_abs == 0.0
    if regime == "upgrade":  # the steps a warm start bounds (WarmStart.judged); the others are reported
        tol = TOLERANCES["upgrade"]
        return m.kl_mean <= tol["kl_mean_max"] and m.top1_agreement >= tol["top1_agreement_min"]
    if regime == "fp32":
        tol = TOLERANCES["fp32"]
        return all(torch.allclose(c.float().cpu(), r.float().cpu(), rtol=tol["rtol"], atol=tol["atol"])
                   for c, r in ((cand.logits, ref.logits), (cand.feedback, ref.feedback)))
    tol = TOLERANCES["low-precision"]
    return (m.kl_mean <= tol["kl_mean_max"] and m.top1_agreement >= tol["top1_agreement_min"]
            and m.state_cos_mean >= tol["state_cos_mean_min"])


def breaches(m: StepMetrics, regime: str | None) -> list[str]:
    """What failed at this step, each as the measured value against its limit ("state_cos_mean 0.000 < 0.999")."""
    if m.passed is not False or regime is None:
        return []
    if regime == "exact":
        return [f"{name} {value:.2e} > 0" for name, value in (("logits_max_abs", m.logits_max_abs),
                                                               ("state_max_abs", m.state_max_abs)) if not value == 0]
    if regime == "fp32":
        tol = TOLERANCES["fp32"]
        return [f"logits max |diff| {m.logits_max_abs:.2e} (rel {m.logits_max_rel:.2e}), state max |diff| "
                f"{m.state_max_abs:.2e} (rel {m.state_max_rel:.2e}): beyond allclose(rtol={tol['rtol']:g}, "
                f"atol={tol['atol']:g})"]
    tol = TOLERANCES[regime]
    out = []  # `not (x <= limit)`: a NaN is a breach too
    if not m.kl_mean <= tol["kl_mean_max"]:
        out.append(f"KL mean {m.kl_mean:.2e} > {tol['kl_mean_max']:.0e}")
    if not m.top1_agreement >= tol["top1_agreement_min"]:
        out.append(f"top-1 {m.top1_agreement:.3f} < {tol['top1_agreement_min']}")
    if "state_cos_mean_min" in tol and not m.state_cos_mean >= tol["state_cos_mean_min"]:
        out.append(f"state_cos_mean {m.state_cos_mean:.3f} < {tol['state_cos_mean_min']}")
    return out


# ----------------------------------------------------------------------------------- warm start

@dataclass
class WarmStart:
    """What `verify UPGRADED --against SOURCE` establishes about an upgrade (docs/verify.md#an-upgrade).

    An upgrade is not function-preserving, so its outputs are not held to SOURCE's everywhere. What it must
    keep: every carried tensor identical (else the `exact` regime applies, and fails), the tensors it wrote
    equal to what it recorded in its provenance (`upgrade_tensors`, value digests) and finite, and the outputs
    a warm start on the steps the flags leave comparable: on the target's states, step 0 (fc_norm only
    rescales each aux chunk of the fc input) and, when `norm_output` was not turned on, every later step.
    With `norm_output` turned on, steps >= 1 see the post-norm state instead of the pre-norm one by design:
    they are reported, not judged. On synthetic states no step is judged: fc_norm divides each aux chunk by
    its RMS, so the drift measures the synthetic per-layer scales rather than the upgrade."""

    recorded: bool  # CANDIDATE's provenance says eaglectl upgraded it
    steps: list[str]  # what the upgrade did: add-fc-norm, set-norm-output
    init: str | None
    written: list[str]  # tensors the upgrade wrote (the added fc_norm, a rewritten fc)
    digests_checked: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)  # written tensors that are not what the upgrade recorded
    nonfinite: list[str] = field(default_factory=list)
    judged: list[int] = field(default_factory=list)
    reported: list[int] = field(default_factory=list)
    why: str = ""
    bounds: dict[int, tuple[float, float]] = field(default_factory=dict)  # step -> (KL mean max, top-1 min)
    bounded_by: str = "tolerance"  # "record": the upgrade's own fidelity (provenance), with a margin

    @property
    def problems(self) -> list[str]:
        return ([f"{k} is not what the upgrade wrote (its value digest differs from the provenance's)"
                 for k in self.mismatched] + [f"{k} has NaN/Inf values" for k in self.nonfinite])

    def to_json(self) -> dict[str, Any]:
        return {"recorded": self.recorded, "upgrade_steps": self.steps, "fc_norm_init": self.init,
                "written_tensors": self.written, "digests_checked": self.digests_checked,
                "mismatched_tensors": self.mismatched, "nonfinite_tensors": self.nonfinite,
                "judged_steps": self.judged, "reported_steps": self.reported, "why": self.why,
                "bounded_by": self.bounded_by, "bounds": [{"step": j, "kl_mean_max": k, "top1_agreement_min": t}
                                                          for j, (k, t) in sorted(self.bounds.items())],
                "problems": self.problems}

    def judge(self, m: StepMetrics) -> bool | None:
        if m.step not in self.bounds:
            return None
        kl_max, top1_min = self.bounds[m.step]
        return m.kl_mean <= kl_max and m.top1_agreement >= top1_min


def values_digest(values: torch.Tensor | np.ndarray) -> str:
    """sha256 of a tensor's values as little-endian float32 (exact for the F32/BF16/F16 an upgrade writes)."""


    if isinstance(values, torch.Tensor):
        values = values.detach().float().cpu().numpy()
    return "sha256:" + hashlib.sha256(np.ascontiguousarray(values, dtype="<f4").tobytes()).hexdigest()


def upgrade_provenance(config: ConfigView | None) -> dict[str, Any] | None:
    """eaglectl's own record of an upgrade in a config (`eaglectl_provenance`, operation upgrade), else None."""
    prov = config.raw("eaglectl_provenance") if config is not None else None
    return prov if isinstance(prov, dict) and prov.get("operation") == "upgrade" else None


def warm_start(cand: LoadedDrafter, ref: LoadedDrafter, differing: list[str], prov: dict[str, Any] | None,
               inputs: Inputs, steps: int, seed: int = 0, tokens: int = 0) -> WarmStart:
    recorded = prov.get("upgrade_tensors") if prov else None
    recorded = recorded if isinstance(recorded, dict) else {}
    up_steps = [s for s in (prov or {}).get("upgrade_steps") or [] if isinstance(s, str)] or (
        (["add-fc-norm"] if cand.spec.fc_norm and not ref.spec.fc_norm else [])
        + (["set-norm-output"] if cand.spec.norm_output and not ref.spec.norm_output else []))
    init = (prov or {}).get("fc_norm_init")
    w = WarmStart(prov is not None, up_steps, init if isinstance(init, str) else None, list(differing))
    for k in differing:
        if k in cand.tensors and not bool(torch.isfinite(cand.tensors[k]).all()):
            w.nonfinite.append(k)
        if isinstance(recorded.get(k), str) and k in cand.tensors:
            w.digests_checked.append(k)
            if values_digest(cand.tensors[k]) != recorded[k]:
                w.mismatched.append(k)
    norm_output_set = cand.spec.norm_output and not ref.spec.norm_output
    record = _recorded_fidelity(prov, inputs, seed, tokens)
    tol = TOLERANCES["upgrade"]
    if record:  # the upgrade's own measurement on these inputs: the files must still do what it measured
        w.bounded_by = "record"
        w.bounds = {j: (round(REC_KL_FACTOR * kl + REC_KL_SLACK, 6), round(max(0.0, top1 - REC_TOP1_SLACK), 6))
                    for j, (kl, top1) in record.items() if j < steps}
        w.why = ("bounded by the fidelity the upgrade measured and recorded in its provenance (KL mean <= "
                 f"{REC_KL_FACTOR:g} x recorded + {REC_KL_SLACK:g}, top-1 >= recorded - {REC_TOP1_SLACK:g})")
    elif isinstance((prov or {}).get("fidelity"), dict):
        kind = prov["fidelity"].get("inputs")  # type: ignore[index]
        w.why = (f"the upgrade measured its fidelity on {kind} states, this run is on "
                 f"{'target' if inputs.real else 'synthetic'} states: verify "
                 + ("with --target" if kind == "target" else "without --target") + " bounds the steps by it")
    elif not inputs.real:
        w.why = ("synthetic states: fc_norm divides each aux chunk by its RMS, so the outputs measure the synthetic "
                 "per-layer scales, not the upgrade; --target bounds the steps")
    elif norm_output_set:
        w.bounds = {0: (tol["kl_mean_max"], tol["top1_agreement_min"])}
        w.why = ("norm_output was turned on: steps >= 1 see the post-norm state by design and are reported; step 0 "
                 "is bounded (fc_norm only rescales the fc input)")
    else:
        w.bounds = {j: (tol["kl_mean_max"], tol["top1_agreement_min"]) for j in range(steps)}
        w.why = "fc_norm only: every step is bounded (the fed-back state keeps its meaning)"
    w.judged = sorted(w.bounds)
    w.reported = [j for j in range(steps) if j not in w.bounds]
    return w


REC_KL_FACTOR, REC_KL_SLACK, REC_TOP1_SLACK = 1.25, 0.01, 0.1  # margins over an upgrade's recorded fidelity


def _recorded_fidelity(prov: dict[str, Any] | None, inputs: Inputs, seed: int,
                       tokens: int) -> dict[int, tuple[float, float]]:
    """Step -> (KL mean, top-1) the upgrade recorded, when it measured on inputs like these: the target's states
    (any text: the margins cover another window of it), or the same synthetic states (same seed and anchors)."""
    rec = (prov or {}).get("fidelity")
    if not isinstance(rec, dict) or not isinstance(rec.get("per_step"), list):
        return {}
    if rec.get("inputs") != ("target" if inputs.real else "synthetic"):
        return {}
    if not inputs.real and (rec.get("seed") != seed or rec.get("tokens") != tokens):
        return {}
    out: dict[int, tuple[float, float]] = {}
    for row in rec["per_step"]:
        numbers = isinstance(row, dict) and all(isinstance(row.get(k), (int, float)) and not isinstance(
            row.get(k), bool) for k in ("step", "kl_mean", "top1_agreement"))
        if numbers and math.isfinite(row["kl_mean"]) and math.isfinite(row["top1_agreement"]):
            out[int(row["step"])] = (float(row["kl_mean"]), float(row["top1_agreement"]))
    return out


# --------------------------------------------------------------------------------------- report

@dataclass
class ParityReport(Result):
    SCHEMA, COMMAND = "eaglectl.verify/1", "verify"

    mode: str  # conversion | precision | fidelity
    candidate: dict[str, Any]
    reference: dict[str, Any]
    inputs: str
    steps: int
    tokens: int
    seed: int
    regime: str | None  # exact | fp32 | low-precision | upgrade (None for fidelity)
    tolerances: dict[str, float]
    metrics: list[StepMetrics] = field(default_factory=list)
    identical_tensors: bool = False
    differing_tensors: list[str] = field(default_factory=list)
    warm_start: WarmStart | None = None  # the upgrade regime: what an upgrade must keep, and which steps are judged
    inputs_real: bool = False  # the target's states, not synthetic ones
    layers: dict[str, Any] | None = None  # the target boundaries the inputs were taken at, and how they were known
    # tensors the reference does not run (model/loader.CHAIN_UNUSED) whose values differ beyond a conversion's rounding
    unrun_differences: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool | None:
        if self.mode == "fidelity":
            return None
        if self.warm_start is not None and self.warm_start.problems or self.unrun_differences:
            return False
        return all(m.passed is not False for m in self.metrics)

    @property
    def exit_code(self) -> int:
        return ParityMismatchError.exit_code if self.passed is False else 0

    def summary_line(self) -> str:
        return {True: "PASS", False: "FAIL", None: "measured"}[self.passed]

    def failure(self) -> ParityMismatchError | None:
        if self.passed is not False:
            return None
        failed = [str(m.step) for m in self.metrics if m.passed is False]
        if self.warm_start is not None and self.warm_start.problems:
            return ParityMismatchError(f"{self.candidate['source']}: {self.warm_start.problems[0]}", reported=True)
        if self.unrun_differences:
            return ParityMismatchError(f"{self.candidate['source']}: {self.unrun_differences[0]} (the reference does "
                                       "not run it: P-EAGLE's parallel slots)", reported=True)
        return ParityMismatchError(f"{self.candidate['source']}: step(s) {', '.join(failed)} exceed the {self.regime} "
                                   f"tolerance ({self.breached()})", reported=True)

    def breached(self) -> str:
        """Each failed step's measured values against their limits, in one phrase."""
        return "; ".join(f"step {m.step}: {', '.join(b)}" for m in self.metrics
                         if (b := breaches(m, self.regime)))

    def payload(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "candidate": self.candidate,
            "reference": self.reference,
            "inputs": self.inputs,
            "steps": self.steps,
            "tokens": self.tokens,
            "seed": self.seed,
            "regime": self.regime,
            "tolerances": self.tolerances,
            "near_tie_nats": NEAR_TIE_NATS,
            "identical_tensors": self.identical_tensors,
            "differing_tensors": self.differing_tensors,
            "unrun_differences": self.unrun_differences,
            "warm_start": self.warm_start.to_json() if self.warm_start is not None else None,
            "layers": self.layers,
            "per_step": [asdict(m) for m in self.metrics],
            "passed": self.passed,
        }


def _side(d: LoadedDrafter, dtype: str, device: str) -> dict[str, Any]:
    return {"source": d.source, "dialect": d.dialect, "eagle_version": d.spec.eagle_version, "dtype": dtype,
            "device": device, "stored_dtypes": sorted(set(d.stored_dtypes.values()))}


def compare(cand: LoadedDrafter, ref: LoadedDrafter, inputs: Inputs, mode: str, run_at: tuple[str, str],
            ref_at: tuple[str, str], steps: int, tokens: int, seed: int,
            upgrade: dict[str, Any] | None = None) -> ParityReport:
    """Both drafters on the same inputs, per-step metrics, judged by the regime the differences allow.
    `upgrade` is CANDIDATE's provenance when eaglectl upgraded it (the tensors it wrote and their digests)."""
    embed = _shared_embedding(cand, ref, inputs)
    # a drafter without embed_tokens borrows the other side's table: that is not a difference
    names = set(cand.tensors) | set(ref.tensors)
    if cand.has_embed != ref.has_embed:
        names.discard("embed_tokens.weight")
    differing = sorted(k for k in names if k not in cand.tensors or k not in ref.tensors
                       or not _same(k, cand.tensors[k], ref.tensors[k]))
    # what the reference does not run (P-EAGLE's mask_hidden) is judged on its values: its outputs cannot show it
    unrun = [problem for k in differing if k in CHAIN_UNUSED and (problem := _unrun_difference(cand, ref, k))]
    run = [k for k in differing if k not in CHAIN_UNUSED]
    regime = None if mode == "fidelity" else choose_regime(cand, ref, run, run_at, ref_at, upgrade)
    warm = warm_start(cand, ref, run, upgrade, inputs, steps, seed, tokens) if regime == "upgrade" else None
    with torch.no_grad():
        ref_out = _run(ref, *ref_at, inputs, embed, steps)
        cand_out = _run(cand, *run_at, inputs, embed, steps)
    report = ParityReport(mode, _side(cand, *run_at), _side(ref, *ref_at), inputs.description, steps, tokens, seed,
                          regime, TOLERANCES.get(regime or "", {}), identical_tensors=not differing,
                          differing_tensors=differing[:20], warm_start=warm, inputs_real=inputs.real,
                          unrun_differences=unrun)
    for j, (r, c) in enumerate(zip(ref_out, cand_out, strict=True)):
        m = step_metrics(j, r, c)
        if warm is not None:
            m.passed = warm.judge(m)
        elif regime is not None:
            m.passed = judge(m, r, c, regime)
        report.metrics.append(m)
    return report


def _same(k: str, c: torch.Tensor, r: torch.Tensor) -> bool:
    """Equal tensors; one the reference does not run may be stored at another shape (a layout's own rank:
    formats Writer.ranks), its values in the same order."""
    if k in CHAIN_UNUSED:
        return c.numel() == r.numel() and torch.equal(c.reshape(-1), r.reshape(-1))
    return torch.equal(c, r)


def _unrun_difference(cand: LoadedDrafter, ref: LoadedDrafter, k: str) -> str | None:
    """Why tensor `k`, which the reference does not run, differs more than a conversion explains (None: it does not):
    absent on one side, another number of values, a value changed while its stored dtype did not, or moved by more
    than the rounding of the coarser stored dtype."""
    if k not in cand.tensors or k not in ref.tensors:
        return f"'{k}' is only in the {'candidate' if k in cand.tensors else 'reference'}"
    c, r = cand.tensors[k], ref.tensors[k]
    dtypes = (cand.stored_dtypes.get(k), ref.stored_dtypes.get(k))
    if c.numel() != r.numel():
        return f"'{k}' holds {c.numel()} values in the candidate, {r.numel()} in the reference"
    if dtypes[0] == dtypes[1]:
        return f"'{k}' changed while its stored dtype ({dtypes[0]}) did not"
    # a cast between two float types moves a value by at most half the coarser one's spacing (eps: the spacing at 1)
    rtol = max(torch.finfo(DTYPES.get(TO_CONFIG.get(d or "", ""), torch.bfloat16)).eps for d in dtypes)
    if not torch.allclose(c.reshape(-1), r.reshape(-1), rtol=rtol, atol=1e-30):
        return f"'{k}' differs by more than the rounding of a {'/'.join(map(str, dtypes))} cast"
    return None


def choose_regime(cand: LoadedDrafter, ref: LoadedDrafter, differing: list[str], run: tuple[str, str],
                  ref_run: tuple[str, str], upgrade: dict[str, Any] | None = None) -> str:
    """Which tolerance applies.

    A tensor whose value changed while its stored dtype did not cannot be explained by a conversion:
    outputs must then be bit-identical ("exact"), so any effect fails. Changes that come with a
    dtype change (a cast) and runs at another precision get the tolerance of that precision.
    """
    if differing and run == ref_run and _is_upgrade(cand, ref, differing, upgrade):
        return "upgrade"
    if any(k not in cand.stored_dtypes or k not in ref.stored_dtypes
           or cand.stored_dtypes[k] == ref.stored_dtypes[k] for k in differing):
        return "exact"
    low_storage = any(d.stored_dtypes[k] in ("BF16", "F16") for k in differing for d in (cand, ref))
    if run[0] != "float32" or ref_run[0] != "float32" or low_storage:
        return "low-precision"
    return "exact" if run == ref_run and not differing else "fp32"


def _is_upgrade(cand: LoadedDrafter, ref: LoadedDrafter, differing: list[str],
                upgrade: dict[str, Any] | None = None) -> bool:
    """CANDIDATE is REFERENCE upgraded: it only adds what an upgrade adds (fc_norm, norm_output on), and
    rewrites fc.weight only where its own provenance records writing it (the refit and fit inits)."""
    adds = cand.spec.fc_norm and not ref.spec.fc_norm or cand.spec.norm_output and not ref.spec.norm_output
    written = (upgrade or {}).get("upgrade_tensors")
    rewrites = {k for k in written if k in UPGRADE_REWRITES} if isinstance(written, dict) else set()
    return bool(adds) and all(k.startswith(UPGRADE_ADDS) and k not in ref.tensors or k in rewrites for k in differing)


def _run(d: LoadedDrafter, dtype: str, device: str, inputs: Inputs, embed: torch.Tensor | None,
         steps: int) -> list[StepOutput]:
    if not d.has_embed and embed is None:
        raise IncompatibleDrafterError(f"{d.source}: no embed_tokens and no target embedding to borrow",
                                       hint="pass --target: the drafter borrows the target's embedding table")
    model = d.build(DTYPES[dtype], device)
    return model.run(inputs.aux.to(device), inputs.tokens.to(device), steps, embed=None if d.has_embed else embed)


def same_shape(cand: LoadedDrafter, ref: LoadedDrafter) -> None:
    fields = ("hidden_size", "target_hidden_size", "num_aux", "vocab_size", "draft_vocab_size", "num_layers",
              "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "qk_norm", "mla")
    for f in fields:
        if getattr(cand.args, f) != getattr(ref.args, f):
            raise IncompatibleDrafterError(f"{f} differs: candidate {getattr(cand.args, f)}, reference "
                                           f"{getattr(ref.args, f)}", key=f,
                                           hint="--against compares two drafters of the same shape")


def _shared_embedding(cand: LoadedDrafter, ref: LoadedDrafter, inputs: Inputs) -> torch.Tensor | None:
    """The table for drafters that ship none: the reference's own, else the target's (or synthetic)."""
    if cand.has_embed and ref.has_embed:
        return None
    if ref.has_embed:
        return ref.tensors["embed_tokens.weight"]
    if cand.has_embed:
        return cand.tensors["embed_tokens.weight"]
    return inputs.embed
