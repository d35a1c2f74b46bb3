"""`eaglectl verify`: numerical parity of the drafters the user names, through the reference drafter (the modes,
inputs, metrics and regimes are measure/parity.py's)."""

from __future__ import annotations

import torch

from ..checkpoint.drafter import open_drafter
from ..errors import MissingDependencyError, ReferenceLimitError, UsageError
from ..measure.parity import ParityReport, compare, real_inputs, same_shape, synthetic_inputs, upgrade_provenance
from ..measure.probe import measured_layers
from ..measure.target import Target
from ..model.loader import load_reference
from ..progress import Progress, passthrough
from .requests import VerifyRequest


@torch.no_grad()
def run(req: VerifyRequest, progress: Progress = passthrough) -> ParityReport:
    """Compare CANDIDATE with `against` (conversion / fidelity) or with its own fp32 CPU run (precision).

    Alone, CANDIDATE runs at bfloat16 by default (how drafters are served): fp32 on CPU against its own
    fp32 CPU run compares a run with itself and could never fail, so it is refused."""
    candidate, against, target, device, dtype, steps, tokens, seed = (req.candidate, req.against, req.target,
                                                                      req.device, req.dtype, req.steps, req.tokens,
                                                                      req.seed)
    if against is None and dtype in (None, "float32") and device == "cpu":
        if dtype == "float32":
            raise UsageError(f"verify {candidate} --dtype float32 on cpu would compare the fp32 CPU run with itself",
                             hint="give --against REFERENCE, or another --dtype / --device (default: bfloat16)")
        dtype = "bfloat16"
    dtype = dtype or "float32"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise MissingDependencyError("--device cuda: no CUDA device is available", hint="run on a GPU machine")
    cand_d = open_drafter(candidate, from_dialect=req.from_dialect, allow_pickle=req.allow_pickle)
    ref_d = open_drafter(against, from_dialect=req.against_from, allow_pickle=req.allow_pickle) if against else cand_d
    try:
        cand, ref = load_reference(cand_d), load_reference(ref_d)
    except ReferenceLimitError as e:  # the hint measures this drafter on this target, as it runs when pasted
        e.measure_with(candidate, target)
        raise
    same_shape(cand, ref)
    t = Target.open(target, req.states, progress=progress, text=req.text)
    layers = None
    if t is not None:
        boundaries, layers = measured_layers(ref_d, t)
        inputs = real_inputs(t, ref, tokens, steps, boundaries=boundaries,
                             table_needed=not (cand.has_embed or ref.has_embed))
    else:
        inputs = synthetic_inputs(ref.args, ref.spec.aux_layer_ids_vllm, tokens, steps, seed)
    mode = "precision" if against is None else "fidelity" if req.fidelity else "conversion"
    ref_at = ("float32", "cpu") if against is None else (dtype, device)  # precision: the fp32 CPU run of itself
    report = compare(cand, ref, inputs, mode, (dtype, device), ref_at, steps, tokens, seed,
                     upgrade=upgrade_provenance(cand_d.config) if against is not None else None)
    report.layers = layers
    return report
