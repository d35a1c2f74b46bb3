"""Benchmark: the cost of reading attention in `eaglectl drift`, on a synthetic 8B-class drafter.

A random Llama-3-8B-class EAGLE-3 drafter (hidden 4096, 32/8 heads, intermediate 14336, draft vocab
32000, fp32) drafts depth-8 chains from an anchor every 8 positions of the last 512 of a T-token
context, with random target states. Each row is one fresh process (wall time and peak RSS, VmHWM):

  baseline  the same chains, attention not read (`measure_chains(..., attention=False)`): the drafting
            work itself, the physical floor of the measurement;
  drift     the same chains with every softmax row kept and reduced to masses.

Printed: seconds, peak MB, and drift / baseline ratios, for T = 1024, 4096, 8192 (peak memory must not
grow with T beyond the KV and the chunked score rows).

    python benchmarks/bench_drift.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import measure  # noqa: E402

CODE = """
import sys, time, torch
from eaglectl.commands.drift import measure_chains
from eaglectl.model.reference import Drafter, DrafterArgs
torch.manual_seed(0)
T, attention = int(sys.argv[1]), sys.argv[2] == "drift"
a = DrafterArgs(hidden_size=4096, target_hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                intermediate_size=14336, num_layers=1, vocab_size=32000, draft_vocab_size=32000, num_aux=3)
with torch.device("meta"):
    model = Drafter(a)
model = model.to_empty(device="cpu")
for p in model.parameters():
    torch.nn.init.normal_(p, std=0.02)
for n, p in model.named_parameters():
    if "norm" in n:
        torch.nn.init.ones_(p)
model.d2t.zero_()
model.eval()
aux = torch.randn(1, T, 3 * 4096)
tokens = torch.randint(0, 32000, (1, T))
anchors = list(range(T - 513, T - 1, 8))
t = time.perf_counter()
c = measure_chains(model, aux, tokens, anchors, 8, sink_tokens=1, recent_window=16, attention=attention)
print(time.perf_counter() - t, len(anchors))
"""


def main() -> None:
    python = sys.executable
    print(f"{'T':>6} {'baseline s':>11} {'drift s':>8} {'ratio':>6} {'baseline MB':>12} {'drift MB':>9} {'ratio':>6}")
    for T in (1024, 4096, 8192):
        rows = {}
        for mode in ("baseline", "drift"):
            _, mb, out = measure(python, CODE, str(T), mode)
            rows[mode] = (float(out.split()[0]), mb)
        (bs, bm), (ds, dm) = rows["baseline"], rows["drift"]
        print(f"{T:>6} {bs:>11.2f} {ds:>8.2f} {ds / bs:>6.2f} {bm:>12.0f} {dm:>9.0f} {dm / bm:>6.2f}")


if __name__ == "__main__":
    main()
