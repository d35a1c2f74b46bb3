"""The `fit` init of `upgrade`: a small, seeded calibration of the added `fc_norm.N.weight` (and, behind
`--fit-fc`, `fc.weight`) by the target's own next-token likelihood (docs/upgrade.md#fit, docs/math.md#upgrade-fit).

Starting from the best closed-form init, the drafter is unrolled as in training-time test (`Drafter.run`:
every anchor at once, each step fed the drafter's own state, with the attention layout of vLLM's drafter KV
cache), teacher-forced over the target's captured states, and the loss is the cross-entropy of each step's
draft distribution against the target's next-token distribution there (restricted to the draft vocab; its
greedy token where only that is known), steps weighted 0.8^j as the fixtures' trainer does. Only the few
thousand added parameters move; every other drafter weight is frozen. Full-batch L-BFGS (strong Wolfe line
search; no sampling, so two runs give the same bytes) on three quarters of the sequences; after every
iteration the held-out quarter is scored, the parameters kept are those of the check with the highest
held-out chain estimate (1 + mean leading correct drafts per anchor, the start included, so `fit` never keeps
worse than it started on held-out states), and it stops when the held-out loss has not fallen for `PATIENCE`
checks. This is a calibration, not training: full retraining stays with TorchSpec / SpecForge.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...model.blocks import owned

if TYPE_CHECKING:
    from ...io.states import Request
    from ...model.loader import LoadedDrafter
    from ...model.reference import Drafter
    from ...model.replay import Continuation

STEP_WEIGHT = 0.8  # the trainer's per-step weight (fixtures/train_fixtures.py)
SEED = 0
PATIENCE = 6  # held-out checks without a lower loss before the fit stops


@dataclass
class Sequence:
    """One teacher-forced window: aux states of T positions, T + steps tokens, the anchors scored (`lo`..`hi`),
    per (step, scored anchor) the target's next token (-1: unknown), and, when the target's distribution is
    known, its top candidates there (ids and probabilities)."""

    aux: torch.Tensor  # (T, n·H_t) fp32
    tokens: torch.Tensor  # (T + steps,) int64
    labels: torch.Tensor  # (steps, W) int64 target ids, -1 = not scored
    lo: int = 0  # the first scored anchor; W = hi - lo
    soft: tuple[torch.Tensor, torch.Tensor] | None = None  # (steps, W, K) target ids, (steps, W, K) probabilities

    @property
    def hi(self) -> int:
        return self.lo + int(self.labels.shape[1])


def from_continuations(conts: list[Continuation], ids: tuple[int, ...]) -> list[Sequence]:
    """Sequences from greedy continuations: the anchors the speculative loop drafts from (the last prompt
    position onwards), labelled with the continuation's tokens and, when the continuation kept them, the
    target's top next-token probabilities."""
    out = []
    for c in conts:
        T, k, P = c.prompt_length + c.max_tokens, c.k, c.prompt_length
        W = T - P  # anchors P-1 .. T-2: every chain the loop can draft
        labels = torch.stack([c.tokens[P + 1 + j: P + 1 + j + W] for j in range(k)])
        soft = None
        if c.top is not None:
            soft = _soft(c.top, labels, P)
        out.append(Sequence(c.aux(ids)[:T].float(), c.tokens[: T + k], labels, P - 1, soft))
    return out


def _soft(top: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor, P: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(steps, W, K) ids and probabilities of the target's next token for every scored draft: draft j of anchor
    P-1+i is the token after position P+i+j. The last positions, past the states, get their greedy token
    with probability 1."""
    top_ids, top_p = top  # (T, K)
    steps, W = labels.shape
    K = top_ids.shape[1]
    ids = torch.zeros(steps, W, K, dtype=torch.long)
    p = torch.zeros(steps, W, K)
    for j in range(steps):
        have = max(0, min(W, top_ids.shape[0] - (P + j)))
        ids[j, :have], p[j, :have] = top_ids[P + j: P + j + have], top_p[P + j: P + j + have]
        ids[j, have:, 0], p[j, have:, 0] = labels[j, have:], 1.0
    return ids, p


def from_requests(requests: Iterable[Request], steps: int, limit: int, length: int = 256) -> list[Sequence]:
    """Sequences from captured requests (io/states.py `Request`, hidden already at the drafter's boundaries):
    windows of `length` anchors, labelled with the target's greedy next token where the capture recorded it
    (else the text's next token), until `limit` anchors."""
    out, got = [], 0
    for req in requests:
        labels = np.asarray(req.labels)
        hidden = np.asarray(req.hidden, dtype=np.float32)
        hidden = hidden.reshape(hidden.shape[0], -1)
        n = min(len(labels), len(req.token_ids)) - steps - 1
        for start in range(0, max(0, n), length):
            T = min(length, n - start)
            if T < 2 or got >= limit:
                break
            tok = owned(req.token_ids[start: start + T + steps], np.int64)
            lab = owned(labels[start: start + T + steps], np.int64)
            y = torch.stack([lab[j + 1: j + 1 + T] for j in range(steps)])
            out.append(Sequence(torch.from_numpy(hidden[start: start + T].copy()), tok, y))
            got += T
    return out


@dataclass
class FitReport:
    start: str  # the closed-form init it started from
    fc: bool  # fc.weight tuned too
    steps: int  # optimiser steps taken
    best_step: int  # the step whose parameters were kept
    tokens: int  # anchors fitted on
    heldout_tokens: int  # anchors held out for early stopping
    parameters: int
    loss_before: float
    loss_after: float
    heldout_loss_before: float
    heldout_loss_after: float
    heldout_top1_before: list[float]
    heldout_top1_after: list[float]
    seconds: float
    stopped: str  # why it stopped
    data: str  # what it was fitted on
    heldout_chain_before: float = 0.0  # 1 + mean leading correct drafts per held-out anchor (teacher-forced AL)
    heldout_chain_after: float = 0.0
    log: list[dict[str, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "fit_fc": self.fc, "steps": self.steps, "best_step": self.best_step,
                "tokens": self.tokens, "heldout_tokens": self.heldout_tokens, "parameters": self.parameters,
                "loss_before": round(self.loss_before, 5), "loss_after": round(self.loss_after, 5),
                "heldout_loss_before": round(self.heldout_loss_before, 5),
                "heldout_loss_after": round(self.heldout_loss_after, 5),
                # how much the held-out negative log-likelihood fell, nats per scored draft
                "heldout_gain": round(self.heldout_loss_before - self.heldout_loss_after, 5),
                "heldout_top1_before": [round(x, 4) for x in self.heldout_top1_before],
                "heldout_top1_after": [round(x, 4) for x in self.heldout_top1_after],
                "heldout_chain_before": round(self.heldout_chain_before, 4),
                "heldout_chain_after": round(self.heldout_chain_after, 4),
                "seconds": round(self.seconds, 2), "stopped": self.stopped, "data": self.data}


def split(seqs: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
    """(fitted, held out): every fourth sequence held out (deterministic, spread over the set)."""
    if len(seqs) < 2:
        raise ValueError("fit needs at least two sequences (one to fit on, one to stop on)")
    return [s for i, s in enumerate(seqs) if i % 4 != 3], [s for i, s in enumerate(seqs) if i % 4 == 3]


def fit_fc_norm(loaded: LoadedDrafter, start: tuple[list[np.ndarray], np.ndarray | None], flags: dict[str, bool],
                seqs: list[Sequence], *, embed: torch.Tensor | None, start_name: str, data: str,
                fit_fc: bool = False, max_steps: int = 40
                ) -> tuple[list[np.ndarray], np.ndarray | None, FitReport]:
    """(γ per chunk, fc.weight or None when unchanged, report): `start` (γ per chunk, a refitted fc or None)
    tuned on `seqs` by the teacher-forced multi-step likelihood, early-stopped on a held-out quarter."""
    t0 = time.perf_counter()
    torch.manual_seed(SEED)
    drafter, params, opt = _trainable(loaded, start, flags, fit_fc)
    objective = _Objective(drafter, drafter.table(embed) if embed is not None else None,
                           _draft_index(drafter, loaded.args.vocab_size), int(seqs[0].labels.shape[0]))
    fitted, held = split(seqs)
    fit_batches, held_batches = _batches(fitted), _batches(held)
    with torch.no_grad():
        loss0, _, _ = objective(fit_batches, False)
        held0, top0, chain0 = objective(held_batches, False)
    best, log, stopped, step = _descend(opt, objective, params, fit_batches, held_batches, (loss0, held0, top0, chain0),
                                        max_steps)
    chain_best, best_step, values, top_best, held_best = best
    with torch.no_grad():
        for p, v in zip(params, values, strict=True):
            p.copy_(v)
        loss_best, _, _ = objective(fit_batches, False)
    out_g = [drafter.fc_norm[j].weight.detach().numpy().astype(np.float32).copy() for j in range(len(start[0]))]
    out_fc = drafter.fc.weight.detach().numpy().astype(np.float32).copy() if (fit_fc or start[1] is not None) else None
    tokens = sum(int((s.labels[0] >= 0).sum()) for s in fitted)
    held_tokens = sum(int((s.labels[0] >= 0).sum()) for s in held)
    report = FitReport(start_name, fit_fc, step, best_step, tokens, held_tokens, sum(p.numel() for p in params),
                       float(loss0), float(loss_best), float(held0), held_best, top0, top_best,
                       time.perf_counter() - t0, stopped, data, chain0, chain_best, log)
    return out_g, out_fc, report


def _trainable(loaded: LoadedDrafter, start: tuple[list[np.ndarray], np.ndarray | None], flags: dict[str, bool],
               fit_fc: bool) -> tuple[Drafter, list[torch.nn.Parameter], torch.optim.Optimizer]:
    """The drafter built from `start` with every weight frozen but fresh leaves for fc_norm (and fc with
    `fit_fc`), those parameters, and the optimiser over them."""
    gammas, new_fc = start
    replace = {f"fc_norm.{j}.weight": torch.from_numpy(np.asarray(g, dtype=np.float32).copy())
               for j, g in enumerate(gammas)}
    if new_fc is not None:
        replace["fc.weight"] = torch.from_numpy(np.asarray(new_fc, dtype=np.float32).copy())
    drafter = loaded.build(torch.float32, "cpu", replace=replace, **{**flags, "fc_norm": True})
    for p in drafter.parameters():
        p.requires_grad_(False)
    # fresh leaves: the built drafter shares the loaded fp32 tensors, which must not change
    params = []
    for j in range(len(gammas)):
        drafter.fc_norm[j].weight = torch.nn.Parameter(drafter.fc_norm[j].weight.detach().clone())
        params.append(drafter.fc_norm[j].weight)
    if fit_fc:
        drafter.fc.weight = torch.nn.Parameter(drafter.fc.weight.detach().clone())
        params.append(drafter.fc.weight)
    return drafter, params, torch.optim.LBFGS(params, lr=1.0, max_iter=1, history_size=10,
                                              line_search_fn="strong_wolfe")


@dataclass
class _Objective:
    """The weighted mean cross-entropy per scored draft (against the target's distribution restricted to the
    draft vocab when known, else its greedy token), the top-1 rate per step, and the chain estimate: 1 + the
    mean number of leading drafts equal to the target's tokens per anchor (teacher-forced AL)."""

    drafter: Drafter
    table: torch.Tensor | None
    to_draft: torch.Tensor  # target id -> draft id (-1: not in the draft vocab)
    steps: int

    def __call__(self, batches: list[Batch], grad: bool) -> tuple[torch.Tensor, list[float], float]:
        steps = self.steps
        nll = [torch.zeros(()) for _ in range(steps)]
        right, count, seen = [0.0] * steps, [0] * steps, [0] * steps
        lead, anchors = 0.0, 0
        with torch.set_grad_enabled(grad):
            for b in batches:
                outs = self.drafter.run(b.aux, b.tokens, steps, embed=self.table, anchors=slice(b.lo, b.hi))
                hits = []
                for j, o in enumerate(outs):
                    y = b.labels[:, j]  # (B, W) target ids, -1 not scored
                    soft = None if b.soft is None else (b.soft[0][:, j], b.soft[1][:, j])  # (B, W, K)
                    per, mask = _step_nll(torch.log_softmax(o.logits, -1), y, soft, self.to_draft)
                    nll[j] = nll[j] + per[mask].sum()
                    hit = (o.target_ids == y) & (y >= 0)
                    hits.append(hit)
                    right[j] += float(hit.float().sum())
                    count[j] += int(mask.sum())
                    seen[j] += int((y >= 0).sum())
                valid = b.labels[:, 0] >= 0
                lead += float(torch.stack(hits).long().cumprod(0).sum(0)[valid].sum())
                anchors += int(valid.sum())
        weights = [STEP_WEIGHT ** j for j in range(steps)]
        total = sum(w * x / max(1, c) for w, x, c in zip(weights, nll, count, strict=True)) / sum(weights)
        return total, [r / max(1, c) for r, c in zip(right, seen, strict=True)], 1 + lead / max(1, anchors)


def _step_nll(logq: torch.Tensor, y: torch.Tensor, soft: tuple[torch.Tensor, torch.Tensor] | None,
              to_draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(negative log-likelihood per draft, which drafts are scored) of one step, from the draft log-probabilities
    (B, W, V_d): against the target's top candidates renormalised over the draft vocab when known, else its token."""
    if soft is not None:
        ids, p = soft
        d = to_draft[ids]
        p = torch.where(d >= 0, p, torch.zeros_like(p))
        mass = p.sum(-1, keepdim=True)
        mask = (y >= 0) & (mass[..., 0] > 0)
        p = p / mass.clamp_min(1e-12)
        return -(p * logq.gather(-1, d.clamp_min(0))).sum(-1), mask
    d = to_draft[y.clamp_min(0)]
    mask = (y >= 0) & (d >= 0)  # a token outside the draft vocab is never drafted: no signal
    return -logq.gather(-1, d.clamp_min(0)[..., None])[..., 0], mask


def _descend(opt: torch.optim.Optimizer, objective: _Objective, params: list[torch.nn.Parameter],
             fit_batches: list[Batch], held_batches: list[Batch], start: tuple[torch.Tensor, torch.Tensor, list[float],
             float], max_steps: int
             ) -> tuple[tuple[float, int, list[torch.Tensor], list[float], float], list[dict[str, float]], str, int]:
    """(chain, step, values, top-1, held-out loss) of the check kept, the log, why it stopped, the last step. Kept:
    the highest held-out chain estimate (the start counts: fit never keeps worse); stopped: when the held-out loss
    has not fallen for PATIENCE checks (one check per step)."""
    loss0, held0, top0, chain0 = start
    best = (chain0, 0, [p.detach().clone() for p in params], top0, float(held0))
    lowest = float(held0)
    log = [{"step": 0, "loss": float(loss0), "heldout_loss": float(held0), "heldout_chain": chain0}]
    stopped, since, step, evals = f"max steps {max_steps}", 0, 0, [0]

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss, _, _ = objective(fit_batches, True)
        loss.backward()
        evals[0] += 1
        return loss

    for step in range(1, max_steps + 1):
        loss = opt.step(closure)
        h, top, chain = objective(held_batches, False)
        log.append({"step": step, "loss": float(loss.detach()), "heldout_loss": float(h), "heldout_chain": chain,
                    "evaluations": evals[0]})
        if chain > best[0] + 1e-9:
            best = (chain, step, [p.detach().clone() for p in params], top, float(h))
        if float(h) < lowest - 1e-6:
            lowest, since = float(h), 0
        else:
            since += 1
            if since >= PATIENCE:
                stopped = f"held-out loss did not fall for {PATIENCE} checks (every 1 steps)"
                break
    return best, log, stopped, step


def _draft_index(drafter: Drafter, vocab: int) -> torch.Tensor:
    """target id -> draft id (-1: not in the draft vocab)."""
    index = torch.full((vocab,), -1, dtype=torch.long)
    ids = torch.arange(drafter.a.draft_vocab_size) + drafter.d2t
    index[ids] = torch.arange(drafter.a.draft_vocab_size)
    return index


@dataclass
class Batch:
    aux: torch.Tensor
    tokens: torch.Tensor
    labels: torch.Tensor
    lo: int
    hi: int
    soft: tuple[torch.Tensor, torch.Tensor] | None


def _batches(seqs: list[Sequence]) -> list[Batch]:
    """Sequences of one shape stacked (one drafter pass per shape)."""
    groups: dict[tuple[int, ...], list[Sequence]] = {}
    for s in seqs:
        groups.setdefault((s.aux.shape[0], s.tokens.shape[0], s.lo, s.hi, s.soft is None), []).append(s)
    out = []
    for g in groups.values():
        soft = None if g[0].soft is None else (torch.stack([s.soft[0] for s in g]),  # type: ignore[index]
                                                torch.stack([s.soft[1] for s in g]))  # type: ignore[index]
        out.append(Batch(torch.stack([s.aux for s in g]), torch.stack([s.tokens for s in g]),
                         torch.stack([s.labels for s in g]), g[0].lo, g[0].hi, soft))
    return out
