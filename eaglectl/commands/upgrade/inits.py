"""Which fc_norm init an upgrade writes, and its values: the closed forms fitted on the target's states
(calibration.py), `fit` tuned from the best of them (fitting.py), ranked by the reference loop's acceptance on
held-out prompts (fidelity.py) or, from a capture, by the FC-output error on held-out requests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ConversionError
from ...io.states import States
from ...measure import kinds as text_kinds
from ...measure.target import Target
from ...measure.workload import heldout_prompts
from ..requests import UpgradeRequest
from .calibration import Fit, Moments, accumulate, fit, held_out_error
from .fidelity import STEPS, Setup, boundaries, measured_requests, rank_by_acceptance, reserved_spans

if TYPE_CHECKING:
    from .fitting import FitReport

CLOSED_FORM = ("ones", "harmonic", "calibrated", "refit")
INITS = (*CLOSED_FORM, "fit")
NEEDS_TARGET = ("harmonic", "calibrated", "refit", "fit")
CHOICES = ("auto", *INITS)  # auto: measure every init (--target or --states) and keep the best; ones without

CALIBRATION_TOKENS = 4096  # tokens of the calibration text read for the statistics
# held-out prompts the inits are ranked on (reference loop), tokens decoded
RANK_PROMPTS, RANK_TOKENS = UpgradeRequest.num_prompts, UpgradeRequest.max_tokens
CAL_PROMPTS, CAL_SEED = 32, 5  # held-out prompts whose greedy continuations calibration and `fit` read (never ranked)
FIT_CAPTURE_TOKENS = 8192  # anchors of a capture `fit` reads


@dataclass
class Choice:
    """The fc_norm init chosen (None: no fc_norm is added), its values, the candidates measured (best first) and
    the `fit` init's report."""

    init: str | None = None
    fitted: Fit = field(default_factory=lambda: ([], None, {}))
    candidates: list[dict[str, Any]] = field(default_factory=list)
    fit_report: FitReport | None = None


def _inits(init: str, tgt: Target | None) -> tuple[str, ...]:
    """The inits to fit: one asked for (`fit` also needs the closed-form inits it starts from), or under `auto`
    every init that can be measured: `fit` too when the target runs (its acceptance decides, on prompts it
    was not fitted on); a capture ranks the closed-form inits by FC-output error; a target without a tokenizer
    can calibrate but not rank: `calibrated`; nothing to measure: `ones`."""
    if init == "fit":
        return (*(CLOSED_FORM if tgt is not None and tgt.runnable else ("calibrated",)), "fit")
    if init != "auto":
        return (init,)
    if tgt is not None and tgt.replays:  # acceptance ranks them all: the target runs, or its continuations replay
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
        cal_part, held_part, where = _split_requests(tgt.states, ids, rank=len(inits) > 1 and s.work is None,
                                                     skip=measured_requests(s))
        moments = accumulate(W, n, Ht, eps, s.progress(cal_part, label="calibration: requests"))
        held = accumulate(W, n, Ht, eps, held_part) if held_part is not None else None
        held = held if held is not None and held.tokens else None  # held-out requests of one token each
        note = {"target": tgt.states.target, "states": str(tgt.states.root), "text_source": where}
    elif from_continuations(tgt):
        conts = tgt.continuations(_calibration_prompts(s), max_tokens=RANK_TOKENS, k=STEPS, boundaries=ids)
        moments = accumulate(W, n, Ht, eps, (c.aux(ids)[: c.prompt_length + c.max_tokens].double().numpy()
                                             for c in s.progress(conts, label="calibration: continuations")))
        bundled = len(conts) - len(s.fitting)
        note = {"target": tgt.source, "text_source": f"the target's greedy continuations of {bundled} prompts "
                f"of every kind ({text_kinds.DESCRIPTION}; code seed {CAL_SEED}; the calibration prompts, never "
                f"ranked or reported on){_of_yours(s)}; up to {RANK_TOKENS} generated tokens each"}
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


def from_continuations(tgt: Target) -> bool:
    """Calibration reads the target's greedy continuations of held-out prompts (positions and text like those it
    serves) when it can decode them and no --calibration-text was given; else its run over the text."""
    return tgt.states is None and tgt.runnable and tgt.text is None


def _split_requests(captured: States, ids: tuple[int, ...], rank: bool, skip: int = 0
                    ) -> tuple[Iterator[np.ndarray], Iterator[np.ndarray] | None, str]:
    """(calibration sequences, held-out sequences, description) of the requests after the first `skip` (those
    the acceptance is measured on): the last quarter is held out for ranking the inits when there is more than
    one request and a ranking is wanted."""
    captured.require(ids)
    count = len(captured.files)
    held = max(1, (count - skip) // 4) if rank and count - skip > 1 else 0

    def seqs(part: slice) -> Iterator[np.ndarray]:
        for req in captured.requests(ids, part):
            yield req.hidden.reshape(req.hidden.shape[0], -1)

    how = f"{count - skip - held} captured requests" + (f" ({held} more held out to rank the inits)" if held else "") \
        + (f" (after the first {skip}, which the acceptance is ranked and reported on)" if skip else "")
    return seqs(slice(skip, count - held)), seqs(slice(count - held, count)) if held else None, how


def _calibration_prompts(s: Setup) -> list[list[int]]:
    """The prompts calibration and `fit` read, of every kind of text (measure/kinds.py): the calibration role of
    the seed prompts, and code windows apart from those the inits are ranked and the acceptance is reported on."""

    assert s.tgt is not None
    tokenizer, per = s.tgt.model().tokenizer, CAL_PROMPTS // len(text_kinds.KINDS)
    out = heldout_prompts(tokenizer, per, RANK_TOKENS, seed=CAL_SEED,
                          avoid=reserved_spans(s.work.num_prompts if s.work is not None else RANK_PROMPTS))
    for kind in text_kinds.SEEDED:
        out += text_kinds.seed_prompts(tokenizer, kind, "calibration", per, RANK_TOKENS)
    return out + [list(p) for p in s.fitting]


def _of_yours(s: Setup) -> str:
    """How many of the user's prompts calibration and `fit` read too, as said."""
    return f" and {len(s.fitting)} of your prompts (never ranked or reported on)" if s.fitting else ""


def _declare(s: Setup, with_fit: bool = False) -> None:
    """Every boundary the command reads, then one decode of every prompt it replays or reads states of (the
    ranking, report and calibration prompts)."""
    tgt, work, report = s.tgt, s.work, s.report
    assert tgt is not None and work is not None and report is not None and s.ids is not None
    assert tgt.num_layers is not None
    wanted = set(s.ids) | set(boundaries(s, s.src.ckpt.config or {}))
    tgt.need(wanted)
    extra = _calibration_prompts(s) if tgt.runnable and (from_continuations(tgt) or with_fit) else []
    kinds = s.kinds_report.prompts if s.kinds_report is not None else []
    longest = max(work.max_tokens, RANK_TOKENS) if extra else work.max_tokens  # calibration decodes RANK_TOKENS
    tgt.continuations(work.prompts + report.prompts + kinds + extra, max_tokens=longest, k=work.k, boundaries=wanted)


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
        data = (f"the target's greedy continuations of {len(calp) - len(s.fitting)} prompts of every kind (the "
                f"calibration prompts: never ranked on){_of_yours(s)}")
    else:
        assert tgt.states is not None
        skip = measured_requests(s)  # never what the acceptance is ranked or reported on
        seqs = fitting.from_requests(tgt.states.requests(session_ids, slice(skip, None)), STEPS, FIT_CAPTURE_TOKENS)
        data = f"{sum(int(q.labels.shape[1]) for q in seqs)} anchors of the capture {tgt.states.root}" + (
            f" (after its first {skip} requests)" if skip else "")
    table = None if loaded.has_embed else tgt.embedding_table()  # the target's weights, or a capture's boundary 0
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


# ------------------------------------------------------------------------------------ the plan and the files

