"""The reference loop with KV caches: the same counts as recomputing the target over the whole sequence.

vLLM (which keeps a KV cache) is the judge of the counts (tests/test_smoke.py, tests/test_mla.py). These
tests pin, without vLLM, that the cached loop drafts, verifies and counts exactly as a straightforward
loop that runs the target over the whole sequence at every verification, on the trained fixtures at a
context longer than the drafter's prefill block, on the MLA target, and on a sliding-window target whose
cache cannot be cropped (recomputed instead).
"""

from __future__ import annotations

import pytest
import torch

from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.measure.workload import load_prompts, tokenizer_of
from eaglectl.model.hf import HFModel, croppable, forward, load_model, new_cache
from eaglectl.model.loader import load_reference
from eaglectl.model.reference import ChainCache, Drafter, DrafterArgs, chain_step, prefill
from eaglectl.model.replay import LoopCounts, RequestCounts

from .conftest import ROOT
from .specloop import PREFILL_ROWS, TargetRun, greedy_generate, speculative_generate

TRAINED = ROOT / "fixtures" / "trained"


@torch.no_grad()
def full_recompute(target: HFModel, drafter: Drafter, prompts: list[list[int]], *, k: int, max_tokens: int,
                   aux_ids: tuple[int, ...], embed: torch.Tensor | None = None) -> LoopCounts:
    """The loop written plainly: the whole sequence through the target at every verification, the drafter's
    context entries of every new position in one prefill."""
    counts = LoopCounts(k, accepted_per_pos=[0] * k)
    for prompt in prompts:
        seq = list(prompt)
        logits, aux = forward(target, torch.tensor([seq]), aux_ids)
        seq.append(int(logits[0, -1].argmax()))
        mine = RequestCounts(k, accepted_per_pos=[0] * k)
        counts.per_request.append(mine)
        written, cache = 0, ChainCache()
        while len(seq) - len(prompt) < max_tokens:
            n = len(seq)
            cache.truncate(written)
            out = prefill(drafter, aux[:, written: n - 1], torch.tensor([seq[written + 1: n]]),
                          torch.arange(written, n - 1)[None], cache, embed)
            written = n - 1
            drafts, feedback = [int(out.target_ids[0, -1])], out.feedback[:, -1:]
            for j in range(1, k):
                out = chain_step(drafter, feedback, torch.tensor([[drafts[-1]]]), torch.tensor([[n - 2 + j]]), cache,
                                 embed)
                drafts.append(int(out.target_ids[0, -1]))
                feedback = out.feedback
            logits, aux = forward(target, torch.tensor([seq + drafts]), aux_ids)
            greedy = logits[0, n - 1:].argmax(-1).tolist()
            a = 0
            while a < k and drafts[a] == greedy[a]:
                a += 1
            for c in (counts, mine):
                c.num_drafts += 1
                c.num_accepted_tokens += a
                for i in range(a):
                    c.accepted_per_pos[i] += 1
            seq += drafts[:a] + [greedy[a]]
        counts.outputs.append(seq[len(prompt): len(prompt) + max_tokens])
    return counts


def _fixture(drafter: str, target: str) -> tuple[HFModel, Drafter, tuple[int, ...], torch.Tensor | None]:
    tgt = load_model(str(TRAINED / target))
    d = load_reference(open_drafter(str(TRAINED / drafter)))
    embed = None if d.has_embed else tgt.embedding().float()
    return tgt, d.build(torch.float32, "cpu"), d.spec.capture_ids(tgt.num_layers), embed


def _same(cached: LoopCounts, plain: LoopCounts) -> None:
    assert [r.row() for r in cached.per_request] == [r.row() for r in plain.per_request]
    assert cached.outputs == plain.outputs
    assert (cached.num_drafts, cached.num_accepted_tokens, cached.accepted_per_pos) == (
        plain.num_drafts, plain.num_accepted_tokens, plain.accepted_per_pos)


@pytest.mark.parametrize("drafter,target,length,k", [("eagle3.1", "target", PREFILL_ROWS + 76, 3),
                                                     ("eagle3", "target", 96, 5),
                                                     ("eagle3.1-mla", "target-mla", 320, 3)])
def test_cached_loop_counts_equal_full_recomputation(drafter, target, length, k):
    tgt, model, ids, embed = _fixture(drafter, target)
    tok = tokenizer_of(str(TRAINED / target))
    prompts = load_prompts("builtin:short", tok, count=2, max_tokens=40, max_model_len=length + 48, k=k, seed=1,
                           length=length).prompts
    cached = speculative_generate(tgt, model, prompts, k=k, max_tokens=40, aux_ids=ids, embed=embed)
    _same(cached, full_recompute(tgt, model, prompts, k=k, max_tokens=40, aux_ids=ids, embed=embed))
    assert cached.num_accepted_tokens > 0  # drafts were accepted, so crops kept accepted drafts' entries
    assert all(len(o) == 40 for o in cached.outputs)
    run = TargetRun(tgt, ids)  # and the cache was used (not the recomputing fallback)
    run.extend(prompts[0], last_only=True)
    run.keep(len(prompts[0]) - 3)
    assert run.cache is not None and run.cache.get_seq_length() == len(prompts[0]) - 3


def test_greedy_generate_is_the_targets_own_greedy_decoding():
    tgt = load_model(str(TRAINED / "target"))
    tok = tokenizer_of(str(TRAINED / "target"))
    prompts = load_prompts("builtin:short", tok, count=3, max_tokens=24, max_model_len=1024, k=3, seed=0).prompts
    ours = greedy_generate(tgt, prompts, 24)
    for prompt, out in zip(prompts, ours, strict=True):
        gen = tgt.model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24,
                                 do_sample=False, pad_token_id=0, eos_token_id=None)
        assert out == gen[0, len(prompt):].tolist()
    _, model, ids, embed = _fixture("eagle3.1", "target")
    spec = speculative_generate(tgt, model, prompts, k=3, max_tokens=24, aux_ids=ids, embed=embed)
    assert spec.outputs == ours  # speculation is lossless


def _sliding_target() -> HFModel:
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=32, vocab_size=96, max_position_embeddings=256,
                        sliding_window=16, tie_word_embeddings=False)
    return HFModel(MistralForCausalLM(cfg).eval(), None, "sliding", 3, 64, 96)


def test_a_cache_that_cannot_be_cropped_is_recomputed_with_the_same_counts():
    """Sliding-window layers drop old positions: cropping them would lose entries the window still needs."""
    tgt = _sliding_target()
    cache = new_cache(tgt)
    forward(tgt, torch.arange(40)[None] % 96, (1, 2), cache=cache, positions=torch.arange(40)[None])
    assert not croppable(cache)
    torch.manual_seed(1)
    a = DrafterArgs(hidden_size=64, target_hidden_size=64, num_heads=2, num_kv_heads=1, head_dim=32,
                    intermediate_size=128, num_layers=1, vocab_size=96, draft_vocab_size=96, num_aux=2)
    drafter = Drafter(a).eval()
    prompts = [torch.randint(0, 96, (48,)).tolist(), torch.randint(0, 96, (30,)).tolist()]
    cached = speculative_generate(tgt, drafter, prompts, k=3, max_tokens=24, aux_ids=(1, 2))
    _same(cached, full_recompute(tgt, drafter, prompts, k=3, max_tokens=24, aux_ids=(1, 2)))
    for name in ("target", "target-mla"):  # full attention (GQA, MLA's latent cache): cropped, not recomputed
        full = load_model(str(TRAINED / name))
        cache = new_cache(full)
        forward(full, torch.tensor([[1, 2, 3]]), (1,), cache=cache, positions=torch.arange(3)[None])
        assert croppable(cache)
