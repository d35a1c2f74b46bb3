"""Measure what a checkpoint means: the facts its files cannot settle, asked of its weights.

A drafter predicts the target's next token far better from the target layers it was trained on, with
the embedding and head it was trained with, and under the flags it was trained with. So for each such
fact the probe evaluates candidate *readings* with the reference drafter on the target's real states
over text (docs/math.md#reading-probe):

- `aux_convention`: the stored ids read as boundaries, as output-of-layer ids, and one further shift
  each way (or, with no ids stored, the engines' default and its shifts);
- `embedding`: the drafter's own `embed_tokens` against the target's (when it ships one);
- `lm_head`: its own head against the target's rows at the mapped ids (when both exist);
- the flags no tensor settles (`TRAINED_FLAGS`: `norm_output`, `norm_before_residual`), for every drafter, and
  any other the dialect cannot settle (`Dialect.caveats`): as stored and flipped. A config can declare a norm
  arrangement its weights were not trained with (SpecForge between its PRs #568 and #879, a hand edit): only the
  weights tell.

Each candidate is scored, on the draft steps the fact can change (step 0 for layers, embedding and
head; steps >= 1 for `norm_output`), by teacher-forced top-1 agreement with the target's greedy next
token, by the log-probability the drafter gives that token, and by the acceptance length of the
reference speculative loop. Readings are ranked by log-probability; the best wins when its top-1
agreement exceeds the runner-up's by `MARGIN` and a paired sign test over tokens (which reading gives
the target's token more probability) rejects "no difference" at `ALPHA`; otherwise the fact is
"undecided", with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..checkpoint.drafter import DrafterCheckpoint
from ..errors import EaglectlError, IncompatibleDrafterError, InvalidStatesError
from ..io.states import States, compact_embedding
from ..model.blocks import owned
from ..model.loader import LoadedDrafter, load_reference
from ..model.replay import Continuation, LoopCounts, replay
from ..progress import Progress, passthrough
from ..spec import default_aux_ids
from .target import Target
from .workload import heldout_prompts

MARGIN = 0.02  # absolute top-1 agreement between the best reading and the runner-up
ALPHA = 1e-3  # two-sided sign test over tokens: which reading gives the target's token more probability
FLOOR = -30.0  # log-probability of a token outside the draft vocabulary
CHANCE_MARGIN = 0.05  # a best reading within this of the chance level is "no better than chance"
# the probe's acceptance loops: held-out windows of 64 tokens (the first of smoke's builtin:short prompts, so
# a command that smokes too decodes them once), 64 new tokens each
LOOP_PROMPTS, LOOP_TOKENS, LOOP_SEED = 4, 64, 0


def probe_prompts(tokenizer: Any, count: int = LOOP_PROMPTS) -> list[list[int]]:
    return heldout_prompts(tokenizer, count, 64, LOOP_SEED)


@dataclass
class Candidate:
    reading: str
    boundary_ids: tuple[int, ...]
    options: dict[str, Any] = field(default_factory=dict)  # how to build and run the drafter
    agreement: list[float] = field(default_factory=list)  # teacher-forced top-1 agreement per draft step
    loglik: list[float] = field(default_factory=list)  # mean log-probability of the target's token per step
    acceptance_length: float | None = None
    correct: torch.Tensor | None = None  # bool (steps, tokens) and float (steps, tokens): kept for the decision,
    logp: torch.Tensor | None = None  # not reported

    def on(self, steps: list[int]) -> tuple[float, float]:
        """(top-1 agreement, mean log-probability) over the given draft steps."""
        return float(self.correct[steps].float().mean()), float(self.logp[steps].mean())

    def to_json(self) -> dict[str, Any]:
        return {"reading": self.reading, "boundary_ids": list(self.boundary_ids),
                "step0_agreement": round(self.agreement[0], 4) if self.agreement else None,
                "agreement": [round(a, 4) for a in self.agreement],
                "log_likelihood": [round(x, 4) for x in self.loglik],
                "acceptance_length": None if self.acceptance_length is None else round(self.acceptance_length, 4)}


@dataclass
class Fact:
    name: str
    declared: str | None  # what the files / dialect table imply
    candidates: list[Candidate]
    tokens: int
    steps: list[int] = field(default_factory=lambda: [0])  # the draft steps this fact can change
    measured: str = "undecided"  # the winning reading, or "undecided"
    margin: float = 0.0
    p_value: float = 1.0
    reason: str = ""

    @property
    def winner(self) -> Candidate | None:
        return next((c for c in self.candidates if c.reading == self.measured), None)

    def to_json(self) -> dict[str, Any]:
        return {"declared": self.declared, "measured": self.measured, "margin": round(self.margin, 4),
                "p_value": float(f"{self.p_value:.3g}"), "tokens": self.tokens, "steps": self.steps,
                "reason": self.reason,
                "candidates": [c.to_json() for c in self.candidates]}


@dataclass
class Measurement:
    facts: dict[str, Fact]
    chance: float  # the agreement of always guessing the target's most frequent next token
    inputs: str
    steps: int

    @property
    def aux(self) -> Fact:
        return self.facts["aux_convention"]

    @property
    def convention(self) -> str:
        """boundary | output | undecided: the numbering the stored ids were written in."""
        w = self.aux.winner
        if w is None:
            return "undecided"
        if w.reading in ("boundary", "output"):
            return w.reading
        if w.reading == "default":  # no ids stored: every engine's default names these boundaries
            return self.aux.declared or "undecided"
        return "undecided"  # a further shift won: the stored ids are wrong in both numberings

    @property
    def boundary_ids(self) -> tuple[int, ...] | None:
        w = self.aux.winner
        return w.boundary_ids if w is not None else None

    @property
    def best_agreement(self) -> float:
        """The best step-0 agreement of any reading (a shipped random table must not hide a good drafter)."""
        return max(c.agreement[0] for f in self.facts.values() for c in f.candidates)

    @property
    def at_chance(self) -> bool:
        return self.best_agreement <= self.chance + CHANCE_MARGIN

    def to_json(self) -> dict[str, Any]:
        aux = self.aux.to_json()
        aux["measured"] = self.convention
        aux["reading"] = self.aux.measured
        aux["boundary_ids"] = list(self.boundary_ids) if self.boundary_ids is not None else None
        out: dict[str, Any] = {"aux_convention": aux}
        out.update({name: f.to_json() for name, f in self.facts.items() if name != "aux_convention"})
        out.update({"chance_agreement": round(self.chance, 4), "best_step0_agreement": round(self.best_agreement, 4),
                    "inputs": self.inputs, "steps": self.steps, "margin_required": MARGIN, "alpha": ALPHA})
        return out


# --------------------------------------------------------------------------------------- candidates

def aux_candidates(stored: tuple[int, ...] | None, default: tuple[int, ...], num_aux: int,
                   target_layers: int) -> list[Candidate]:
    base, prefix = (tuple(stored), "") if stored is not None else (tuple(default), "default")
    shifts = ((0, "boundary"), (1, "output"), (-1, "shift-1"), (2, "shift+2")) if stored is not None else \
        ((0, "default"), (1, "default+1"), (-1, "default-1"), (2, "default+2"))
    out = []
    for shift, label in shifts:
        ids = tuple(sorted({i + shift for i in base}))
        if len(ids) == num_aux and all(0 <= i <= target_layers for i in ids):
            out.append(Candidate(label, ids))
    return out if out else [Candidate(prefix or "boundary", base)]


def _sign_test(diff: torch.Tensor) -> float:
    """Two-sided exact sign test on paired differences (ties dropped)."""
    wins, losses = int((diff > 0).sum()), int((diff < 0).sum())
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    # P(X <= k) for X ~ Binomial(n, 1/2), doubled; log-space to stay finite for large n
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2) for i in range(k + 1)]
    top = max(logs)
    return min(1.0, 2 * math.exp(top) * sum(math.exp(x - top) for x in logs))


def decide(fact: Fact) -> Fact:
    steps = fact.steps
    ranked = sorted(fact.candidates, key=lambda c: -c.on(steps)[1])
    if len(ranked) < 2:
        fact.measured = ranked[0].reading if ranked else "undecided"
        fact.reason = "only one reading is possible"
        return fact
    best, second = ranked[0], ranked[1]
    (a1, l1), (a2, l2) = best.on(steps), second.on(steps)
    fact.margin = a1 - a2
    fact.p_value = _sign_test((best.logp[steps] - second.logp[steps]).flatten())
    where = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    said = (f"'{best.reading}' agrees with the target's next token on {a1:.1%} ({where}, log-likelihood {l1:.3f}), "
            f"'{second.reading}' on {a2:.1%} ({l2:.3f}); sign test p = {fact.p_value:.2g}")
    if fact.margin >= MARGIN and fact.p_value <= ALPHA:
        fact.measured, fact.reason = best.reading, said
    else:
        fact.measured = "undecided"
        fact.reason = said + f" (a decision needs a top-1 margin >= {MARGIN} and p <= {ALPHA})"
    return fact


# ------------------------------------------------------------------------------------------- probe

@dataclass
class Segment:
    """One teacher-forcing window: T anchors, `steps` draft steps each."""

    tokens: torch.Tensor  # (1, T + steps) token ids
    labels: torch.Tensor  # (T + steps,) the target's next token after each position
    states: dict[int, torch.Tensor]  # boundary -> (1, T, H_t)
    target_embedding: tuple[torch.Tensor, torch.Tensor] | None  # (ids, table): F.embedding(ids, table) is the
    # target's embedding of `tokens` (a capture's boundary 0 gives only the rows it saw), None when unknown

    @property
    def anchors(self) -> int:
        return next(iter(self.states.values())).shape[1]

    def aux(self, ids: tuple[int, ...]) -> torch.Tensor:
        return torch.cat([self.states[i] for i in ids], dim=-1)

    def truth(self, steps: int) -> list[torch.Tensor]:
        T = self.anchors
        return [self.labels[j + 1: j + 1 + T] for j in range(steps)]


# The flags of the norm arrangement that no tensor settles (weights settle fc_norm and norm_before_fc: their norms
# are stored or not): every drafter is scored under both values of each
TRAINED_FLAGS = ("norm_output", "norm_before_residual")


@dataclass
class Session:
    """The target's states over the probe text, for every boundary any candidate reads (windows of the
    target's run over the measurement text, or of a capture), and the greedy continuations of held-out
    prompts that the acceptance loops replay (a runnable target only)."""

    segments: list[Segment]
    steps: int
    description: str
    continuations: list[Continuation] = field(default_factory=list)
    target_table: torch.Tensor | None = None  # the target's embedding table, when it ran

    @property
    def anchors(self) -> int:
        return sum(seg.anchors for seg in self.segments)


def states_session(states: States, boundaries: set[int], tokens: int, steps: int,
                   table: torch.Tensor | None = None, vocab: int | None = None) -> Session:
    """Windows of captured states (io/states.py, or the target's run) until `tokens` anchors: the labels are
    the target's greedy next tokens when recorded, else the text's next tokens. Without the target's
    embedding `table`, the rows of the tokens seen are read off boundary 0. Token ids and labels are checked
    against `vocab` (the drafter's) as well as the capture's own."""


    wanted = tuple(sorted(boundaries))
    states.require(wanted)
    no_table = None if table is not None else states.embedding_source()
    fetch = wanted if table is not None or no_table is not None or 0 in wanted else (0, *wanted)
    segments, got = [], 0
    for req in states.requests(fetch, vocab=vocab):
        labels = np.asarray(req.labels)
        T = min(len(labels) - steps, tokens - got)
        if T < 1:
            continue
        hidden = owned(req.hidden, np.float32)
        tok = torch.from_numpy(req.token_ids[: T + steps].copy())[None]
        if table is not None:
            rows = (tok, table)
        elif no_table is None:
            index, found = compact_embedding(tok[0].numpy(), hidden[: tok.shape[1], fetch.index(0)].numpy())
            rows = (torch.from_numpy(index)[None], torch.from_numpy(found))
        else:
            rows = None
        segments.append(Segment(tok, torch.from_numpy(labels[: T + steps].copy()),
                                {b: hidden[None, :T, fetch.index(b)] for b in wanted}, rows))
        got += T
        if got >= tokens:
            break
    if not segments:
        raise InvalidStatesError(f"{states.root}: no request is longer than {steps + 1} tokens: too few states")
    label = "the target's greedy next tokens" if states.labels_are == "target" else "the text's next tokens"
    where = getattr(states, "description", f"capture {states.root}")
    return Session(segments, steps, f"{where}: {got} tokens in {len(segments)} requests, labels {label}")


@torch.no_grad()
def score(loaded: LoadedDrafter, c: Candidate, s: Session) -> None:
    """Teacher-forced agreement per step on the session text, and the reference loop's acceptance length
    (replayed on the session's greedy continuations)."""
    opts = dict(c.options)
    use_target_table = opts.pop("target_embedding", False)
    drafter = loaded.build(torch.float32, "cpu", **opts)
    own = getattr(drafter, "embed_tokens", None) is not None and not use_target_table
    correct, logp = [], []
    for seg in s.segments:
        if own:
            tok, table = seg.tokens, None
        elif seg.target_embedding is not None:
            tok, table = seg.target_embedding
        else:
            raise IncompatibleDrafterError("the drafter ships no embedding table and the target's is unknown",
                                           hint="capture with boundary 0 (--layers auto does), or pass --target")
        outs = drafter.run(seg.aux(c.boundary_ids), tok, s.steps, embed=table)
        truth = seg.truth(s.steps)
        T = seg.anchors
        correct.append(torch.stack([outs[j].target_ids[0, :T] == truth[j] for j in range(s.steps)]))
        logp.append(torch.stack([torch.log_softmax(drafter.full_vocab_logits(outs[j].logits[0, :T].float()), -1)
                                 .gather(-1, truth[j][:, None])[:, 0].clamp_min(FLOOR) for j in range(s.steps)]))
    c.correct, c.logp = torch.cat(correct, dim=1), torch.cat(logp, dim=1)
    c.agreement = [float(r.float().mean()) for r in c.correct]
    c.loglik = [float(r.mean()) for r in c.logp]
    if s.continuations and (own or s.target_table is not None):  # no table to draft from: no loop
        counts = replay(drafter, s.continuations, aux_ids=c.boundary_ids, embed=None if own else s.target_table)
        c.acceptance_length = counts.mean_acceptance_length


def measure(d: DrafterCheckpoint, target: Target, *, tokens: int = 768, steps: int = 3,
            loop_prompts: int = LOOP_PROMPTS, progress: Progress = passthrough
            ) -> Measurement:
    """Measure every fact the files of `d` cannot settle, against the target (run once for the command) or a
    capture of it (`Target.states`; then no speculative loop and no target head: agreement only).

    The aux reading is decided first; the other facts are then measured at the winning reading (the
    files' own reading when undecided), so each comparison changes one thing at a time."""

    loaded = load_reference(d)
    spec = d.spec
    L = target.num_layers
    if L is None:
        raise IncompatibleDrafterError(f"{target.source}: the target config has no valid num_hidden_layers",
                                       hint="fix num_hidden_layers in the target's config.json")
    aux = aux_candidates(spec.aux_layer_ids, default_aux_ids(L, "boundary"), loaded.args.num_aux, L)
    if target.states is not None:
        aux = [c for c in aux if set(c.boundary_ids) <= set(target.states.layer_ids)]
        if not aux:
            target.states.require(tuple(sorted({i for c in aux_candidates(
                spec.aux_layer_ids, default_aux_ids(L, "boundary"), loaded.args.num_aux, L) for i in c.boundary_ids})))
    wanted = {i for c in aux for i in c.boundary_ids}
    target.need(wanted, tokens + steps)
    table = target.embedding_table() if target.states is None else None
    session = states_session(target.text_states(wanted, tokens + steps), wanted, tokens, steps, table,
                             vocab=loaded.args.vocab_size)
    if target.replays and loop_prompts:  # the target runs, or its capture holds greedy continuations
        prompts = (probe_prompts(target.model().tokenizer, loop_prompts) if target.states is None else
                   target.captured_prompts()[:loop_prompts])
        tokens = LOOP_TOKENS if target.states is None else min(LOOP_TOKENS, target.states.continuation.max_tokens)
        session.continuations = target.continuations(prompts, max_tokens=tokens, k=steps, boundaries=wanted)
        session.target_table = table if target.states is None else _capture_table(target, loaded.has_embed)
    aux_fact = Fact("aux_convention", spec.aux_convention, aux, session.anchors)
    for c in progress(aux, label="measuring aux readings", total=len(aux)):
        score(loaded, c, session)
    decide(aux_fact)
    at = aux_fact.winner or aux[0]
    facts = {"aux_convention": aux_fact}
    alternatives: list[tuple[str, str | None, Candidate]] = []
    if loaded.has_embed and all(seg.target_embedding is not None for seg in session.segments):
        alternatives.append(("embedding", "own", Candidate("target", at.boundary_ids, {
            "own_embedding": False, "target_embedding": True})))
    head = _target_head_rows(loaded, target) if target.states is None else None
    if head is not None:
        alternatives.append(("lm_head", "own", Candidate("target", at.boundary_ids,
                                                         {"replace": {"lm_head.weight": head}})))
    flipped = [*TRAINED_FLAGS, *(c.subject for c in d.dialect.caveats
                                 if all(getattr(spec, k) == v for k, v in c.when.items()))]
    for flag in dict.fromkeys(f for f in flipped if not d.set_by_upgrade(f)):  # an upgrade's: trained next
        stored = bool(getattr(spec, flag))
        alternatives.append((flag, str(stored).lower(), Candidate(str(not stored).lower(), at.boundary_ids,
                                                                   {flag: not stored})))
    for name, as_stored, other in progress(alternatives, label="measuring other readings", total=len(alternatives)):
        score(loaded, other, session)
        same = Candidate(as_stored or "own", at.boundary_ids, agreement=at.agreement, loglik=at.loglik,
                         acceptance_length=at.acceptance_length, correct=at.correct, logp=at.logp)  # as the files say
        steps_changed = list(range(1, steps)) if name == "norm_output" and steps > 1 else [0]
        facts[name] = decide(Fact(name, as_stored, [same, other], session.anchors, steps_changed))
    labels = torch.cat([seg.truth(1)[0] for seg in session.segments])
    chance = float(torch.bincount(labels).max()) / len(labels)
    return Measurement(facts, chance, session.description, steps)


def _capture_table(target: Target, optional: bool) -> torch.Tensor | None:
    """The target's embedding table from a capture; None where it cannot give one and the drafter has its own."""
    try:
        return target.embedding_table()
    except IncompatibleDrafterError:
        if optional:
            return None
        raise


def _target_head_rows(loaded: LoadedDrafter, target: Target) -> torch.Tensor | None:
    """The target head's rows at the drafter's mapped ids, when both heads exist and widths agree."""
    own = loaded.tensors.get("lm_head.weight")
    if own is None:
        return None
    head = target.model().head().float()
    if head.shape[1] != own.shape[1]:
        return None
    d2t = loaded.tensors.get("d2t")
    rows = torch.arange(own.shape[0]) + (d2t if d2t is not None else 0)
    if int(rows.max()) >= head.shape[0]:
        return None
    return head[rows].contiguous()


def try_measure(d: DrafterCheckpoint, target: Target | None, **kw: Any) -> tuple[Measurement | None, str | None]:
    """(measurement, None), or (None, why nothing could be measured): no target, a target without weights
    or a tokenizer, a drafter the reference cannot run, no transformers. A capture stands in for the target."""
    if target is None:
        return None, None
    why = target.why_not_measurable()
    if why is not None:
        return None, why
    try:
        return measure(d, target, **kw), None
    except InvalidStatesError:
        raise  # a capture the user gave is broken: that is the answer, not "not measured"
    except EaglectlError as e:
        return None, f"not measured: {e.message}"


def measured_layers(d: DrafterCheckpoint, target: Target) -> tuple[tuple[int, ...] | None, dict[str, Any]]:
    """The target boundaries the drafter reads, from the one measured reading (`measure`, teacher-forced on
    the target's states; no acceptance loop) when it decides them, else the files' reading (None): the inputs
    are the target's states at those layers. (ids or None, {"boundary_ids", "how"} for the report)."""
    m, why = try_measure(d, target, loop_prompts=0)
    if m is not None and m.boundary_ids is not None and not m.at_chance:
        return m.boundary_ids, {"boundary_ids": list(m.boundary_ids), "how": f"measured ({m.aux.reason})"}
    L = target.num_layers
    ids = d.spec.capture_ids(L) if L is not None else None
    reason = why or (("the drafter is at chance" if m.at_chance else f"not decided: {m.aux.reason}") if m else "")
    return None, {"boundary_ids": list(ids) if ids is not None else None,
                  "how": "as the files say" + (f" ({reason})" if reason else "")}


def replay_counts(loaded: LoadedDrafter, target: Target, prompts: list[list[int]], *, boundaries: tuple[int, ...],
               k: int, max_tokens: int, **overrides: Any) -> LoopCounts:
    """The reference speculative loop for one reading of a drafter on the target's greedy continuations of
    `prompts` (decoded once per command): its LoopCounts (drafts, accepted, per position), exactly as vLLM
    counts them."""
    drafter = loaded.build(torch.float32, "cpu", **overrides)
    table = None if getattr(drafter, "embed_tokens", None) is not None else target.embedding_table()
    conts = target.continuations(prompts, max_tokens=max_tokens, k=k, boundaries=boundaries)
    return replay(drafter, conts, aux_ids=boundaries, embed=table)


def flag_overrides(m: Measurement | None) -> dict[str, bool]:
    """Flags the measurement decided against the files (e.g. SpecForge's norm_output)."""
    if m is None:
        return {}
    return {name: f.measured == "true" for name, f in m.facts.items()
            if name not in ("aux_convention", "embedding", "lm_head") and f.measured in ("true", "false")
            and f.measured != f.declared}
