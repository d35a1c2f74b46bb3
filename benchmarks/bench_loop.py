"""Benchmark: the reference speculative loop at 1k, 4k and 8k tokens of context, in seconds per generated token.

A synthetic Llama target (transformers' LlamaForCausalLM, random weights: hidden 512, 4 layers, 8/2 heads,
intermediate 1536, vocab 4096, max_position_embeddings 9216, fp32) and a random EAGLE-3 drafter of the same
width (`eaglectl.model.reference.Drafter`, one layer, aux ids 1, 2, 3) run `speculative_generate` with k = 3
on one random prompt of T tokens. Random weights accept almost no drafts, so every generated token costs one
verification: the loop's worst case.

Each row is one fresh process. Printed per T:

  prefill s     one plain forward of the target over the prompt (what any engine pays once per request);
  cached s/tok  the loop (the target's KV cache cropped after each verification), per generated token;
  old s/tok     the same loop recomputing the target over the whole sequence at every verification (the
                loop before the cache, kept here only as the baseline), per generated token;

then the 4k/1k and 8k/1k ratios of both (the goal: cached 8k/1k <= 2, i.e. the per-token cost does not grow
with the context the way full recomputation does). Per-token costs are the difference of two runs with
different `max_tokens` divided by the difference in tokens, so the one-time prefills (target and drafter)
cancel out; the total per token, prefills included, is printed for the longer run.

    python benchmarks/bench_loop.py            # a few minutes on 2 cores
    python benchmarks/bench_loop.py --quick    # 1k and 4k only
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import measure  # noqa: E402

CODE = """
import sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
from eaglectl.model.hf import HFModel, forward
from eaglectl.model.reference import ChainCache, Drafter, DrafterArgs, chain_step
from eaglectl.model.replay import LoopCounts
sys.path.insert(0, sys.argv[5])  # tests/: the live loop is the tests' oracle
from specloop import _context, speculative_generate

T, mode, short, long = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
H, L, V, K, IDS = 512, 4, 4096, 3, (1, 2, 3)
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                  intermediate_size=1536, vocab_size=V, max_position_embeddings=9216, tie_word_embeddings=False)
target = HFModel(LlamaForCausalLM(cfg).eval(), None, "synthetic", L, H, V)
a = DrafterArgs(hidden_size=H, target_hidden_size=H, num_heads=8, num_kv_heads=2, head_dim=64, intermediate_size=1536,
                num_layers=1, vocab_size=V, draft_vocab_size=V, num_aux=len(IDS))
drafter = Drafter(a).eval()
for n, p in drafter.named_parameters():
    torch.nn.init.ones_(p) if "norm" in n else torch.nn.init.normal_(p, std=0.02)
prompt = torch.randint(0, V, (T,)).tolist()


@torch.no_grad()
def old_loop(target, drafter, prompts, *, k, max_tokens, aux_ids, embed=None):
    # the loop before the target's KV cache: the whole sequence through the target at every verification
    # (the drafter's prompt prefill in blocks, as now: a one-time cost either way, and bounded memory)
    counts = LoopCounts(k, accepted_per_pos=[0] * k)
    for prompt in prompts:
        seq = list(prompt)
        logits, aux = forward(target, torch.tensor([seq]), aux_ids)
        seq.append(int(logits[0, -1].argmax()))
        produced, written = 1, 0
        cache = ChainCache()
        while produced < max_tokens:
            n = len(seq)
            cache.truncate(written)
            out = _context(drafter, aux[:, written: n - 1], seq[written + 1: n], written, cache, embed)
            written = n - 1
            drafts = [int(out.target_ids[0, -1])]
            feedback = out.feedback[:, -1:]
            for j in range(1, k):
                out = chain_step(drafter, feedback, torch.tensor([[drafts[-1]]]), torch.tensor([[n - 2 + j]]), cache,
                                 embed)
                drafts.append(int(out.target_ids[0, -1]))
                feedback = out.feedback
            logits, aux = forward(target, torch.tensor([seq + drafts]), aux_ids)
            greedy = logits[0, n - 1:].argmax(-1).tolist()
            accepted = 0
            while accepted < k and drafts[accepted] == greedy[accepted]:
                accepted += 1
            counts.num_drafts += 1
            counts.num_accepted_tokens += accepted
            seq += drafts[:accepted] + [greedy[accepted]]
            produced += accepted + 1
        counts.outputs.append(seq[len(prompt): len(prompt) + max_tokens])
    return counts


loop = speculative_generate if mode == "cached" else old_loop
with torch.no_grad():
    t = time.perf_counter()
    forward(target, torch.tensor([prompt]), IDS)
    floor = time.perf_counter() - t
runs = {}
for n in (short, long):
    t = time.perf_counter()
    c = loop(target, drafter, [prompt], k=K, max_tokens=n, aux_ids=IDS)
    runs[n] = (time.perf_counter() - t, c.num_drafts, c.num_accepted_tokens)
print(floor, runs[short][0], runs[long][0], runs[long][1], runs[long][2])
"""

TOKENS = {"cached": (8, 72), "old": (2, 6)}  # (shorter, longer) max_tokens per run


def main() -> None:
    python = sys.executable
    lengths = (1024, 4096) if "--quick" in sys.argv else (1024, 4096, 8192)
    rows = {}
    print(f"{'T':>6} {'prefill s':>10} {'cached s/tok':>13} {'(total)':>8} {'old s/tok':>10} {'(total)':>8} "
          f"{'old/cached':>11} {'peak MB':>8}")
    for T in lengths:
        row = {}
        for mode, (short, long) in TOKENS.items():
            _, mb, out = measure(python, CODE, str(T), mode, str(short), str(long), str(ROOT / "tests"))
            floor, t_short, t_long, drafts, accepted = (float(x) for x in out.split())
            row[mode] = ((t_long - t_short) / (long - short), t_long / long, mb, floor)
        rows[T] = row
        (c, ct, cmb, floor), (o, ot, _, _) = row["cached"], row["old"]
        print(f"{T:>6} {floor:>10.2f} {c:>13.4f} {ct:>8.3f} {o:>10.3f} {ot:>8.3f} {o / c:>11.1f} {cmb:>8.0f}")
    base = rows[lengths[0]]
    for T in lengths[1:]:
        print(f"{T // 1024}k/1k: cached {rows[T]['cached'][0] / base['cached'][0]:.2f}x, "
              f"old {rows[T]['old'][0] / base['old'][0]:.2f}x (goal: cached <= 2x)")


if __name__ == "__main__":
    main()
