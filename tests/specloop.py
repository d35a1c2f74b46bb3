"""The live speculative loop, kept as the test oracle: a real HF target and the reference drafter, pure torch.

Production counts come from the replay (eaglectl/model/replay.py); this loop computes the same counts one
verification at a time, independently, and the tests assert both agree.

Chain drafting with k tokens and greedy verification, counted the way vLLM counts: one draft per
verification step that had drafts, k draft tokens each, accepted = the longest prefix equal to the
target's greedy tokens, per-position counts, and drafts keep being proposed (and counted) until the
request has `max_tokens` output tokens, so the last step may accept past `max_tokens`
(docs/math.md#acceptance). Context entries of the drafter's KV cache are rebuilt from fresh target
features after each verification; the previous chain's entries are dropped (docs/math.md#chain).

The target keeps a KV cache too: each verification runs only `[x_{L-1}, d_1..d_k]` at positions
L-1..L-1+k, and the cache is then cropped to the accepted prefix, so a request costs work linear in
its length (docs/math.md#reference-loop-cache).
"""

from __future__ import annotations

from typing import Any

import torch

from eaglectl.model.hf import HFModel, crop_cache, croppable, forward, new_cache
from eaglectl.model.reference import ChainCache, Drafter, chain_step, prefill
from eaglectl.model.replay import LoopCounts, RequestCounts

PREFILL_ROWS = 1024  # drafter context entries written per call (a long prompt's first prefill)


class TargetRun:
    """One request on the target: the tokens it has processed and their KV cache.

    `extend(tokens)` runs only the new tokens, at the positions after the processed ones, and returns
    their logits and aux states; `keep(n)` crops the cache back to the first n positions (the accepted
    prefix). A target whose cache cannot be cropped (sliding-window or linear-attention layers) is
    recomputed over the whole sequence at each step instead, with the same results."""

    def __init__(self, target: HFModel, aux_ids: tuple[int, ...]) -> None:
        self.target, self.aux_ids = target, aux_ids
        self.cache: Any = new_cache(target)
        self.tokens: list[int] = []

    def extend(self, tokens: list[int], last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        start = len(self.tokens)
        self.tokens += tokens
        if self.cache is None:
            logits, aux = forward(self.target, torch.tensor([self.tokens]), self.aux_ids)
            return logits[:, -1:] if last_only else logits[:, start:], aux[:, start:]
        positions = torch.arange(start, len(self.tokens))[None]
        logits, aux = forward(self.target, torch.tensor([tokens]), self.aux_ids, cache=self.cache, positions=positions,
                              logits_to_keep=1 if last_only else 0)
        if not croppable(self.cache):
            self.cache = None
        return logits, aux

    def keep(self, length: int) -> None:
        del self.tokens[length:]
        if self.cache is not None:
            crop_cache(self.cache, length)


def _context(drafter: Drafter, aux: torch.Tensor, next_tokens: list[int], start: int, cache: ChainCache,
             embed: torch.Tensor | None) -> Any:
    """Write the drafter's context entries of positions start.. (features of p with token p+1) and return
    the last one's step-0 output. A long prompt is written in blocks of PREFILL_ROWS positions, each
    attending to the blocks before it: the same entries, with attention scores of PREFILL_ROWS rows at
    a time instead of a T x T matrix per head."""
    device = drafter.fc.weight.device
    for lo in range(0, len(next_tokens), PREFILL_ROWS):
        hi = min(len(next_tokens), lo + PREFILL_ROWS)
        out = prefill(drafter, aux[:, lo:hi].to(device), torch.tensor([next_tokens[lo:hi]], device=device),
                      torch.arange(start + lo, start + hi, device=device)[None], cache, embed)
    return out


@torch.no_grad()
def speculative_generate(target: HFModel, drafter: Drafter, prompts: list[list[int]], *, k: int, max_tokens: int,
                         aux_ids: tuple[int, ...], embed: torch.Tensor | None = None) -> LoopCounts:
    counts = LoopCounts(k, accepted_per_pos=[0] * k)
    device = drafter.fc.weight.device
    for prompt in prompts:
        seq = list(prompt)
        run = TargetRun(target, aux_ids)
        logits, aux = run.extend(seq, last_only=True)  # aux: the prompt's positions 0..P-1
        seq.append(int(logits[0, -1].argmax()))  # the prefill samples the first output token
        produced, written = 1, 0  # output tokens; drafter context entries (positions 0..written-1)
        cache = ChainCache()
        mine = RequestCounts(k, accepted_per_pos=[0] * k)
        counts.per_request.append(mine)
        while produced < max_tokens:
            L = len(seq)  # the target holds positions 0..L-2; `aux` covers written..L-2
            cache.truncate(written)  # drop the last chain; context entries stay
            out = _context(drafter, aux, seq[written + 1: L], written, cache, embed)
            written = L - 1
            drafts = [int(out.target_ids[0, -1])]
            feedback = out.feedback[:, -1:]
            for j in range(1, k):
                out = chain_step(drafter, feedback, torch.tensor([[drafts[-1]]], device=device),
                                 torch.tensor([[L - 2 + j]], device=device), cache, embed)
                drafts.append(int(out.target_ids[0, -1]))
                feedback = out.feedback
            logits, aux = run.extend([seq[L - 1], *drafts])  # positions L-1 .. L-1+k
            greedy = logits[0].argmax(-1).tolist()  # target's token after x_{L-1}, d_1, ..., d_k
            accepted = 0
            while accepted < k and drafts[accepted] == greedy[accepted]:
                accepted += 1
            run.keep(L + accepted)  # x_{L-1}, d_1..d_accepted are the sequence now; the rest is cropped
            aux = aux[:, :accepted + 1]
            counts.record(accepted)
            mine.record(accepted)
            seq += drafts[:accepted] + [greedy[accepted]]
            produced += accepted + 1
        counts.outputs.append(seq[len(prompt): len(prompt) + max_tokens])
    return counts


@torch.no_grad()
def greedy_generate(target: HFModel, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Plain greedy decoding with the target (the no-speculation reference output): the same cached
    forward as the speculative loop, one token per step."""
    outs = []
    for prompt in prompts:
        run = TargetRun(target, ())
        logits, _ = run.extend(list(prompt), last_only=True)
        out = [int(logits[0, -1].argmax())]
        while len(out) < max_tokens:
            logits, _ = run.extend(out[-1:])
            out.append(int(logits[0, -1].argmax()))
        outs.append(out)
    return outs
