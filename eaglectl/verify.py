"""`eaglectl verify`: numerical parity of drafters through the reference drafter.

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

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import __version__
from .drafter import open_drafter
from .errors import (
    IncompatibleDrafterError,
    InvalidStatesError,
    MissingDependencyError,
    ParityMismatchError,
    UsageError,
)
from .io.states import States
from .model.loader import DTYPES, LoadedDrafter
from .model.reference import DrafterArgs, StepOutput
from .progress import Progress, passthrough
from .target import Target

SCHEMA = "eaglectl.verify/1"
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


def load_drafter(source: str, *, from_dialect: str | None = None, allow_pickle: bool = False) -> LoadedDrafter:
    return open_drafter(source, from_dialect=from_dialect, allow_pickle=allow_pickle).reference()


# --------------------------------------------------------------------------------------- inputs

@dataclass
class Inputs:
    aux: torch.Tensor  # (1, T, n_aux·H_t) fp32
    tokens: torch.Tensor  # (1, T + steps)
    embed: torch.Tensor | None  # the target's embedding table, if a target was run
    description: str


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
    import numpy as np

    ids = boundaries or loaded.spec.capture_ids(target.num_layers)  # type: ignore[arg-type]
    if len(ids) != loaded.args.num_aux:
        raise IncompatibleDrafterError(f"{len(ids)} aux ids {list(ids)} but fc takes {loaded.args.num_aux} states")
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
    return Inputs(aux, tok, target.model().embedding().float().cpu(), f"{states.description}: aux ids {list(ids)}")


def states_inputs(captured: States, ids: tuple[int, ...], tokens: int, steps: int, table_needed: bool = True,
                  shrink: bool = False, vocab: int | None = None) -> Inputs:
    """Aux states of a capture (`--states`, io/states.py) at boundaries `ids`: the first request long enough
    (with `shrink`, else the longest one, on fewer anchors). With `table_needed` (no drafter ships an
    embedding) the ids index the rows read off boundary 0. Token ids are checked against `vocab` (the drafter's)."""
    import numpy as np

    from .io.states import compact_embedding

    why = captured.embedding_source() if table_needed else None
    if why is not None:
        raise IncompatibleDrafterError(f"{captured.root}: the drafter ships no embedding table and {why}")
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
                  f"capture {captured.root}: aux ids {list(ids)} on {req.name}")


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
    cos = torch.nn.functional.cosine_similarity(za, zb, dim=-1)
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
    if regime == "upgrade":
        tol = TOLERANCES["upgrade"]
        return m.kl_mean <= tol["kl_mean_max"] and m.top1_agreement >= tol["top1_agreement_min"]
    if regime == "fp32":
        tol = TOLERANCES["fp32"]
        return all(torch.allclose(c.float().cpu(), r.float().cpu(), rtol=tol["rtol"], atol=tol["atol"])
                   for c, r in ((cand.logits, ref.logits), (cand.feedback, ref.feedback)))
    tol = TOLERANCES["low-precision"]
    return (m.kl_mean <= tol["kl_mean_max"] and m.top1_agreement >= tol["top1_agreement_min"]
            and m.state_cos_mean >= tol["state_cos_mean_min"])


# --------------------------------------------------------------------------------------- report

@dataclass
class ParityReport:
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
    layers: dict[str, Any] | None = None  # the target boundaries the inputs were taken at, and how they were known

    @property
    def passed(self) -> bool | None:
        if self.mode == "fidelity":
            return None
        return all(m.passed for m in self.metrics)

    @property
    def exit_code(self) -> int:
        return ParityMismatchError.exit_code if self.passed is False else 0

    def failure(self) -> ParityMismatchError | None:
        if self.passed is not False:
            return None
        failed = [str(m.step) for m in self.metrics if m.passed is False]
        return ParityMismatchError(f"{self.candidate['source']}: step(s) {', '.join(failed)} exceed the {self.regime} "
                                   "tolerance", reported=True)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool_version": __version__,
            "command": "verify",
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
            "layers": self.layers,
            "per_step": [asdict(m) for m in self.metrics],
            "passed": self.passed,
            "exit_code": self.exit_code,
        }


def _side(d: LoadedDrafter, dtype: str, device: str) -> dict[str, Any]:
    return {"source": d.source, "dialect": d.dialect, "eagle_version": d.spec.eagle_version, "dtype": dtype,
            "device": device, "stored_dtypes": sorted(set(d.stored_dtypes.values()))}


def _check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise MissingDependencyError("--device cuda: no CUDA device is available", hint="run on a GPU machine")


@torch.no_grad()
def run(
    candidate: str,
    *,
    against: str | None = None,
    target: str | None = None,
    states: str | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    steps: int = 3,
    tokens: int = 64,
    seed: int = 0,
    text: str | None = None,
    from_dialect: str | None = None,
    against_from: str | None = None,
    allow_pickle: bool = False,
    fidelity: bool = False,
    progress: Progress = passthrough,
) -> ParityReport:
    """Compare CANDIDATE with `against` (conversion / fidelity) or with its own fp32 CPU run (precision).

    Alone, CANDIDATE runs at bfloat16 by default (how drafters are served): fp32 on CPU against its own
    fp32 CPU run compares a run with itself and could never fail, so it is refused."""
    if against is None and dtype in (None, "float32") and device == "cpu":
        if dtype == "float32":
            raise UsageError(f"verify {candidate} --dtype float32 on cpu would compare the fp32 CPU run with itself",
                             hint="give --against REFERENCE, or another --dtype / --device (default: bfloat16)")
        dtype = "bfloat16"
    dtype = dtype or "float32"
    _check_device(device)
    cand_d = open_drafter(candidate, from_dialect=from_dialect, allow_pickle=allow_pickle)
    ref_d = open_drafter(against, from_dialect=against_from, allow_pickle=allow_pickle) if against else cand_d
    cand, ref = cand_d.reference(), ref_d.reference()
    _same_shape(cand, ref)
    t = Target.open(target, states, progress=progress, text=text)
    layers = None
    if t is not None:
        boundaries, layers = measured_layers(ref_d, t)
        inputs = real_inputs(t, ref, tokens, steps, boundaries=boundaries,
                             table_needed=not (cand.has_embed or ref.has_embed))
    else:
        inputs = synthetic_inputs(ref.args, ref.spec.aux_layer_ids_vllm, tokens, steps, seed)
    if against is None:  # precision / device parity against the fp32 CPU reference of itself
        report = compare(cand, ref, inputs, "precision", (dtype, device), ("float32", "cpu"), steps, tokens, seed)
    else:
        report = compare(cand, ref, inputs, "fidelity" if fidelity else "conversion", (dtype, device),
                         (dtype, device), steps, tokens, seed)
    report.layers = layers
    return report


def measured_layers(d: Any, target: Target) -> tuple[tuple[int, ...] | None, dict[str, Any]]:
    """The target boundaries the drafter reads, from the one measured reading (probe.measure, teacher-forced on
    the target's states; no acceptance loop) when it decides them, else the files' reading (None): the inputs
    are the target's states at those layers. (ids or None, {"boundary_ids", "how"} for the report)."""
    from .probe import try_measure

    m, why = try_measure(d, target, loop_prompts=0)
    if m is not None and m.boundary_ids is not None and not m.at_chance:
        return m.boundary_ids, {"boundary_ids": list(m.boundary_ids), "how": f"measured ({m.aux.reason})"}
    L = target.num_layers
    ids = d.spec.capture_ids(L) if L is not None else None
    reason = why or (("the drafter is at chance" if m.at_chance else f"not decided: {m.aux.reason}") if m else "")
    return None, {"boundary_ids": list(ids) if ids is not None else None,
                  "how": "as the files say" + (f" ({reason})" if reason else "")}


def compare(cand: LoadedDrafter, ref: LoadedDrafter, inputs: Inputs, mode: str, run_at: tuple[str, str],
            ref_at: tuple[str, str], steps: int, tokens: int, seed: int) -> ParityReport:
    """Both drafters on the same inputs, per-step metrics, judged by the regime the differences allow."""
    embed = _shared_embedding(cand, ref, inputs)
    # a drafter without embed_tokens borrows the other side's table: that is not a difference
    names = set(cand.tensors) | set(ref.tensors)
    if cand.has_embed != ref.has_embed:
        names.discard("embed_tokens.weight")
    differing = sorted(k for k in names if k not in cand.tensors or k not in ref.tensors
                       or not torch.equal(cand.tensors[k], ref.tensors[k]))
    regime = None if mode == "fidelity" else choose_regime(cand, ref, differing, run_at, ref_at)
    with torch.no_grad():
        ref_out = _run(ref, *ref_at, inputs, embed, steps)
        cand_out = _run(cand, *run_at, inputs, embed, steps)
    report = ParityReport(mode, _side(cand, *run_at), _side(ref, *ref_at), inputs.description,
                          steps, tokens, seed, regime, TOLERANCES.get(regime or "", {}), identical_tensors=not differing,
                          differing_tensors=differing[:20])
    for j, (r, c) in enumerate(zip(ref_out, cand_out, strict=True)):
        m = step_metrics(j, r, c)
        if regime is not None:
            m.passed = judge(m, r, c, regime)
        report.metrics.append(m)
    return report


def choose_regime(cand: LoadedDrafter, ref: LoadedDrafter, differing: list[str], run: tuple[str, str],
                  ref_run: tuple[str, str]) -> str:
    """Which tolerance applies.

    A tensor whose value changed while its stored dtype did not cannot be explained by a conversion:
    outputs must then be bit-identical ("exact"), so any effect fails. Changes that come with a
    dtype change (a cast) and runs at another precision get the tolerance of that precision.
    """
    if differing and run == ref_run and _is_upgrade(cand, ref, differing):
        return "upgrade"
    if any(k not in cand.stored_dtypes or k not in ref.stored_dtypes
           or cand.stored_dtypes[k] == ref.stored_dtypes[k] for k in differing):
        return "exact"
    low_storage = any(d.stored_dtypes[k] in ("BF16", "F16") for k in differing for d in (cand, ref))
    if run[0] != "float32" or ref_run[0] != "float32" or low_storage:
        return "low-precision"
    return "exact" if run == ref_run and not differing else "fp32"


def _is_upgrade(cand: LoadedDrafter, ref: LoadedDrafter, differing: list[str]) -> bool:
    """CANDIDATE is REFERENCE upgraded: it only adds what an upgrade adds (fc_norm, norm_output on)."""
    adds = cand.spec.fc_norm and not ref.spec.fc_norm or cand.spec.norm_output and not ref.spec.norm_output
    return bool(adds) and all(k.startswith(UPGRADE_ADDS) and k not in ref.tensors for k in differing)


def _run(d: LoadedDrafter, dtype: str, device: str, inputs: Inputs, embed: torch.Tensor | None,
         steps: int) -> list[StepOutput]:
    if not d.has_embed and embed is None:
        raise IncompatibleDrafterError(f"{d.source}: no embed_tokens and no target embedding to borrow")
    model = d.build(DTYPES[dtype], device)
    return model.run(inputs.aux.to(device), inputs.tokens.to(device), steps, embed=None if d.has_embed else embed)


def _same_shape(cand: LoadedDrafter, ref: LoadedDrafter) -> None:
    fields = ("hidden_size", "target_hidden_size", "num_aux", "vocab_size", "draft_vocab_size", "num_layers",
              "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "qk_norm", "mla")
    for f in fields:
        if getattr(cand.args, f) != getattr(ref.args, f):
            raise IncompatibleDrafterError(f"{f} differs: candidate {getattr(cand.args, f)}, reference "
                                           f"{getattr(ref.args, f)}", key=f)


def _shared_embedding(cand: LoadedDrafter, ref: LoadedDrafter, inputs: Inputs) -> torch.Tensor | None:
    """The table for drafters that ship none: the reference's own, else the target's (or synthetic)."""
    if cand.has_embed and ref.has_embed:
        return None
    if ref.has_embed:
        return ref.tensors["embed_tokens.weight"]
    if cand.has_embed:
        return cand.tensors["embed_tokens.weight"]
    return inputs.embed
