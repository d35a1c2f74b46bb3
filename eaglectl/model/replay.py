"""Acceptance by replay: the speculative loop's counts from the target's greedy continuation, one target pass
for any number of drafters (docs/math.md#replay).

Under greedy verification the output is the target's own greedy continuation whatever the drafter proposes
(speculation is lossless), and a draft is only looked at while every earlier draft of its chain was accepted,
i.e. equal to that continuation. So the chain a drafter makes from anchor t inside the loop is exactly its
teacher-forced chain over the continuation (`Drafter.run`), and the loop's counts follow from walking those
chains: from the last prompt position, accept the leading correct drafts a (<= k), record one draft, move on
by a + 1, until `max_tokens` output tokens exist (the last chain may run past them, as vLLM counts it). This
is the offline replay that reproduces vLLM's counters exactly (docs/smoke.md#engine-parity); the live loop
(tests/specloop.py, the test oracle) computes the same counts one verification at a time.

`continue_greedily` runs the target once per prompt group (prompts of one length decode together, no
padding): greedy decoding with its KV cache, then one forward over the result for the states at every
boundary any drafter asks for. `replay` then costs one batched drafter pass per drafter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..progress import Progress, passthrough
from .hf import HFModel, forward, greedy
from .reference import Drafter

TOP_K = 32  # the target's next-token candidates kept per position (Continuation.top)
BATCH = 16  # sequences per target pass


@dataclass
class RequestCounts:
    k: int
    num_drafts: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, accepted: int) -> None:
        """One draft whose first `accepted` tokens the target accepted."""
        self.num_drafts += 1
        self.num_accepted_tokens += accepted
        for p in range(accepted):
            self.accepted_per_pos[p] += 1

    def row(self) -> dict[str, object]:
        """The fields vLLM's per-request spec-decode metrics give (smoke's `requests` rows)."""
        return {"num_drafts": self.num_drafts, "num_accepted_tokens": self.num_accepted_tokens,
                "num_draft_tokens": self.num_drafts * self.k, "accepted_per_pos": self.accepted_per_pos}

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")


@dataclass
class LoopCounts(RequestCounts):
    num_draft_tokens: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    per_request: list[RequestCounts] = field(default_factory=list)

    def record(self, accepted: int) -> None:
        super().record(accepted)
        self.num_draft_tokens += self.k


@dataclass
class Continuation:
    """One prompt and the target's greedy continuation, with the target's states at some boundaries."""

    prompt_length: int
    tokens: torch.Tensor  # (T,) int64: the prompt, then max_tokens + k greedy tokens
    states: dict[int, torch.Tensor]  # boundary -> (T - k, H) fp32: positions every anchor's chain can need
    max_tokens: int
    k: int
    # the target's TOP_K next-token candidates after each state position: ids (T - k, K) int64 and
    # probabilities (T - k, K) fp32 (what upgrade's `fit` init matches; None until the states are taken)
    top: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_length: self.prompt_length + self.max_tokens].tolist()

    def aux(self, ids: tuple[int, ...]) -> torch.Tensor:
        return torch.cat([self.states[i] for i in ids], dim=-1)

    def cut(self, max_tokens: int, k: int) -> Continuation:
        """The same continuation for a shorter request (max_tokens <= self.max_tokens, max_tokens + k <= ours)."""
        if (max_tokens, k) == (self.max_tokens, self.k):
            return self
        assert max_tokens <= self.max_tokens and max_tokens + k <= self.max_tokens + self.k
        P = self.prompt_length
        top = None if self.top is None else (self.top[0][: P + max_tokens], self.top[1][: P + max_tokens])
        return Continuation(P, self.tokens[: P + max_tokens + k], {b: s[: P + max_tokens] for b, s in self.states.items()},
                            max_tokens, k, top)


def _groups(items: list[Any], key: Any) -> list[list[int]]:
    """Indices of `items` grouped by `key(item)`, in first-seen order."""
    out: dict[Any, list[int]] = {}
    for i, item in enumerate(items):
        out.setdefault(key(item), []).append(i)
    return list(out.values())


@torch.no_grad()
def decode_greedily(target: HFModel, prompts: list[list[int]], new: int, progress: Progress = passthrough
                    ) -> list[torch.Tensor]:
    """Each prompt followed by `new` greedy tokens of the target's. Prompts of one length decode together (no
    padding, so each row computes what it would alone, as vLLM batches requests)."""
    out: list[torch.Tensor | None] = [None] * len(prompts)
    groups = [g[i: i + BATCH] for g in _groups(prompts, len) for i in range(0, len(g), BATCH)]
    for group in progress(groups, label="target: greedy continuations", total=len(groups)):
        seqs = greedy(target, torch.tensor([prompts[i] for i in group]), new)
        for row, i in enumerate(group):
            out[i] = seqs[row].cpu()
    return [x for x in out if x is not None]


@torch.no_grad()
def continue_greedily(target: HFModel, prompts: list[list[int]], *, max_tokens: int, k: int,
                      boundaries: tuple[int, ...], progress: Progress = passthrough) -> list[Continuation]:
    """The target's greedy continuation of each prompt (max_tokens + k tokens: the last chain can draft k past
    the end) and its states at `boundaries` at every position a chain can read."""
    made = [Continuation(len(p), seq, {}, max_tokens, k)
            for p, seq in zip(prompts, decode_greedily(target, prompts, max_tokens + k, progress), strict=True)]
    with_states(target, made, boundaries)
    return made


@torch.no_grad()
def with_states(target: HFModel, continuations: list[Continuation], boundaries: tuple[int, ...]) -> None:
    """Fill in the target's states at `boundaries` (one forward per group of equal shape)."""
    wanted = tuple(sorted(set(boundaries)))
    for group in _groups(continuations, lambda c: (c.prompt_length, len(c.tokens), c.k)):
        for at in range(0, len(group), BATCH):
            rows = [continuations[i] for i in group[at: at + BATCH]]
            seqs = torch.stack([c.tokens for c in rows])
            logits, aux = forward(target, seqs[:, : seqs.shape[1] - rows[0].k], wanted)
            width = aux.shape[-1] // len(wanted)
            top_logits, top_ids = logits.float().topk(min(TOP_K, logits.shape[-1]), dim=-1)
            top_p = (top_logits - torch.logsumexp(logits.float(), -1, keepdim=True)).exp()
            for r, c in enumerate(rows):
                c.states = {b: aux[r, :, j * width:(j + 1) * width] for j, b in enumerate(wanted)}
                c.top = (top_ids[r].cpu(), top_p[r].cpu())


def walk(correct: torch.Tensor, k: int, max_tokens: int) -> RequestCounts:
    """vLLM's counting over one request: `correct` (k, W) says whether draft j of anchor (last prompt position
    + i) equals the continuation."""
    counts = RequestCounts(k, accepted_per_pos=[0] * k)
    produced, i = 1, 0  # the prefill samples the first output token; the first chain is drafted after it
    while produced < max_tokens:
        accepted = 0
        while accepted < k and bool(correct[accepted, i]):
            accepted += 1
        counts.record(accepted)
        produced += accepted + 1
        i += accepted + 1
    return counts


@torch.no_grad()
def chains(drafter: Drafter, continuations: list[Continuation], *, aux_ids: tuple[int, ...],
           embed: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Per continuation, (k, W) target ids: draft j of the chain from anchor (last prompt position + i),
    teacher-forced (one batched drafter pass per group of equal shape)."""
    out: list[torch.Tensor | None] = [None] * len(continuations)
    device = drafter.fc.weight.device
    for group in _groups(continuations, lambda c: (c.prompt_length, len(c.tokens), c.max_tokens, c.k)):
        first = continuations[group[0]]
        P, k = first.prompt_length, first.k
        aux = torch.stack([continuations[i].aux(aux_ids) for i in group]).to(device)
        tokens = torch.stack([continuations[i].tokens for i in group]).to(device)
        window = slice(P - 1, P + first.max_tokens - 1)  # the anchors a chain can start from
        outs = drafter.run(aux, tokens, k, embed=embed, anchors=window)  # states cover T - k positions
        drafted = torch.stack([o.target_ids for o in outs], dim=1).cpu()  # (B, k, W)
        for row, i in enumerate(group):
            out[i] = drafted[row]
    return [x for x in out if x is not None]


def correct(c: Continuation, drafted: torch.Tensor) -> torch.Tensor:
    """(k, W) bool: draft j of anchor i equals the continuation's token there."""
    start, span = c.prompt_length - 1, drafted.shape[1]
    return torch.stack([drafted[j] == c.tokens[start + j + 2: start + j + 2 + span] for j in range(c.k)])


def counts_of(continuations: list[Continuation], drafted: list[torch.Tensor]) -> LoopCounts:
    """The loop's counts from teacher-forced chains (`chains`), walked as vLLM counts them."""
    if not continuations:
        return LoopCounts(0)
    k = continuations[0].k
    total = LoopCounts(k, accepted_per_pos=[0] * k)
    for c, d in zip(continuations, drafted, strict=True):
        mine = walk(correct(c, d), k, c.max_tokens)
        total.per_request.append(mine)
        total.num_drafts += mine.num_drafts
        total.num_draft_tokens += mine.num_drafts * k
        total.num_accepted_tokens += mine.num_accepted_tokens
        total.accepted_per_pos = [a + b for a, b in zip(total.accepted_per_pos, mine.accepted_per_pos, strict=True)]
        total.outputs.append(c.output)
    return total


def replay(drafter: Drafter, continuations: list[Continuation], *, aux_ids: tuple[int, ...],
           embed: torch.Tensor | None = None) -> LoopCounts:
    """The speculative loop's counts (drafts, accepted, per position, per request, outputs) for `drafter`
    reading the target at boundaries `aux_ids`, exactly as vLLM counts them."""
    return counts_of(continuations, chains(drafter, continuations, aux_ids=aux_ids, embed=embed))
