"""The reference speculative loop: a real HF target and the reference drafter, pure torch.

Chain drafting with k tokens and greedy verification, counted the way vLLM counts: one draft per
verification step that had drafts, k draft tokens each, accepted = the longest prefix equal to the
target's greedy tokens, per-position counts, and drafts keep being proposed (and counted) until the
request has `max_tokens` output tokens, so the last step may accept past `max_tokens`
(docs/math.md#acceptance). Context entries of the drafter's KV cache are rebuilt from fresh target
features after each verification; the previous chain's entries are dropped (docs/math.md#chain).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .hf import HFModel, forward
from .reference import ChainCache, Drafter, chain_step, prefill


def _all(items: Any, **_: Any) -> Any:
    return items  # no progress wanted


@dataclass
class RequestCounts:
    k: int
    num_drafts: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def row(self) -> dict[str, object]:
        """The fields vLLM's per-request spec-decode metrics give (smoke's `requests` rows)."""
        return {"num_drafts": self.num_drafts, "num_accepted_tokens": self.num_accepted_tokens,
                "num_draft_tokens": self.num_drafts * self.k, "accepted_per_pos": self.accepted_per_pos}

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")


@dataclass
class LoopCounts:
    k: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    per_request: list[RequestCounts] = field(default_factory=list)

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")


@torch.no_grad()
def speculative_generate(target: HFModel, drafter: Drafter, prompts: list[list[int]], *, k: int, max_tokens: int,
                         aux_ids: tuple[int, ...], embed: torch.Tensor | None = None, progress: Any = None,
                         label: str = "prompts") -> LoopCounts:
    counts = LoopCounts(k, accepted_per_pos=[0] * k)
    device = drafter.fc.weight.device
    for prompt in (progress or _all)(prompts, label=label, total=len(prompts)):
        seq = list(prompt)
        logits, aux = forward(target, torch.tensor([seq]), aux_ids)
        seq.append(int(logits[0, -1].argmax()))  # the prefill samples the first output token
        produced, written = 1, 0  # output tokens; drafter context entries (positions 0..written-1)
        cache = ChainCache()
        mine = RequestCounts(k, accepted_per_pos=[0] * k)
        counts.per_request.append(mine)
        while produced < max_tokens:
            L = len(seq)
            cache.truncate(written)  # drop the last chain; context entries stay
            out = prefill(drafter, aux[:, written: L - 1].to(device), torch.tensor([seq[written + 1: L]], device=device),
                          torch.arange(written, L - 1, device=device)[None], cache, embed)
            written = L - 1
            drafts = [int(out.target_ids[0, -1])]
            feedback = out.feedback[:, -1:]
            for j in range(1, k):
                out = chain_step(drafter, feedback, torch.tensor([[drafts[-1]]], device=device),
                                 torch.tensor([[L - 2 + j]], device=device), cache, embed)
                drafts.append(int(out.target_ids[0, -1]))
                feedback = out.feedback
            logits, aux = forward(target, torch.tensor([seq + drafts]), aux_ids)
            greedy = logits[0, L - 1:].argmax(-1).tolist()  # target's token after x_{L-1}, d_1, ..., d_k
            accepted = 0
            while accepted < k and drafts[accepted] == greedy[accepted]:
                accepted += 1
            counts.num_drafts += 1
            counts.num_draft_tokens += k
            counts.num_accepted_tokens += accepted
            mine.num_drafts += 1
            mine.num_accepted_tokens += accepted
            for i in range(accepted):
                counts.accepted_per_pos[i] += 1
                mine.accepted_per_pos[i] += 1
            seq += drafts[:accepted] + [greedy[accepted]]
            produced += accepted + 1
        counts.outputs.append(seq[len(prompt): len(prompt) + max_tokens])
    return counts


@torch.no_grad()
def greedy_generate(target: HFModel, prompts: list[list[int]], max_tokens: int, progress: Any = None,
                    label: str = "prompts") -> list[list[int]]:
    """Plain greedy decoding with the target (the no-speculation reference output)."""
    outs = []
    for prompt in (progress or _all)(prompts, label=label, total=len(prompts)):
        seq = torch.tensor([prompt])
        gen = target.model.generate(input_ids=seq, max_new_tokens=max_tokens, do_sample=False, min_new_tokens=max_tokens,
                                    pad_token_id=0, eos_token_id=None)
        outs.append(gen[0, len(prompt):].tolist())
    return outs
