"""Benchmark: `eaglectl verify` of a synthetic 8B-class drafter, fp32 CPU, 3 steps x 128 tokens.

Builds a SafeAILab-layout drafter (hidden 4096, 32/8 heads, intermediate 14336, vocab 128256, draft
vocab 32000, bf16 random weights ~0.85 GB), then
  1. runs `eaglectl verify DIR --tokens 128 --steps 3 --json` in a fresh process: wall time and peak
     RSS (VmHWM), and
  2. in-process, the split: load (read + widen to fp32), inputs, reference run, candidate run, metrics.
Goal (issue 3): <= 60 s; peak RSS reported.

    python benchmarks/bench_verify.py [--keep]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import measure, scratch, work_args  # noqa: E402

from eaglectl.io.safetensors import TensorEntry, write_safetensors  # noqa: E402

DIMS = dict(H=4096, I=14336, NH=32, NKV=8, V=128256, VD=32000)


def bf16_bytes(rng: np.random.Generator, n: int, scale: float, offset: float = 0.0) -> bytes:
    x = (rng.standard_normal(n, dtype=np.float32) * scale + offset).view(np.uint32)
    return ((x + 0x8000) >> 16).astype("<u2").tobytes()  # round to nearest bf16


def build(folder: Path, H: int, I: int, NH: int, NKV: int, V: int, VD: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    d = H // NH
    shapes = {
        "fc.weight": (H, 3 * H), "midlayer.self_attn.q_proj.weight": (NH * d, 2 * H),
        "midlayer.self_attn.k_proj.weight": (NKV * d, 2 * H), "midlayer.self_attn.v_proj.weight": (NKV * d, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, NH * d), "midlayer.mlp.gate_proj.weight": (I, H),
        "midlayer.mlp.up_proj.weight": (I, H), "midlayer.mlp.down_proj.weight": (H, I),
        "lm_head.weight": (VD, H),
    }
    entries = []
    for name, shape in shapes.items():
        data = bf16_bytes(rng, int(np.prod(shape)), 0.02)
        entries.append(TensorEntry(name, "BF16", shape, lambda data=data: (data,)))
    for name in ("midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
                 "midlayer.post_attention_layernorm.weight", "norm.weight"):
        data = bf16_bytes(rng, H, 0.05, 1.0)
        entries.append(TensorEntry(name, "BF16", (H,), lambda data=data: (data,)))
    ids = np.sort(rng.choice(V, VD, replace=False))
    d2t = (ids - np.arange(VD)).astype("<i8").tobytes()
    t2d = np.zeros(V, dtype=np.bool_)
    t2d[ids] = True
    entries.append(TensorEntry("d2t", "I64", (VD,), lambda: (d2t,)))
    entries.append(TensorEntry("t2d", "BOOL", (V,), lambda: (t2d.tobytes(),)))
    write_safetensors(folder / "model.safetensors", entries, {"format": "pt"})
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
        "num_attention_heads": NH, "num_key_value_heads": NKV, "num_hidden_layers": 1, "vocab_size": V,
        "draft_vocab_size": VD, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False}))


VERIFY = ("from eaglectl.cli.app import main\n"
          "sys.argv = ['eaglectl', 'verify', sys.argv[1], '--tokens', '128', '--steps', '3', '--json']\n"
          "main()\n")


def split(folder: Path) -> dict[str, float]:
    import torch

    from eaglectl.checkpoint.drafter import open_drafter
    from eaglectl.commands import verify as parity
    from eaglectl.model.loader import load_reference

    times = {}
    t = time.perf_counter()
    d = load_reference(open_drafter(str(folder)))
    times["load"] = time.perf_counter() - t
    t = time.perf_counter()
    inputs = parity.synthetic_inputs(d.args, d.spec.aux_layer_ids_vllm, 128, 3, 0)
    times["inputs"] = time.perf_counter() - t
    with torch.no_grad():
        t = time.perf_counter()
        ref = parity._run(d, "float32", "cpu", inputs, inputs.embed, 3)
        times["reference run"] = time.perf_counter() - t
        t = time.perf_counter()
        cand = parity._run(d, "float32", "cpu", inputs, inputs.embed, 3)
        times["candidate run"] = time.perf_counter() - t
        t = time.perf_counter()
        for j in range(3):
            parity.step_metrics(j, ref[j], cand[j])
        times["metrics"] = time.perf_counter() - t
    return times


def main() -> None:
    args = work_args(__doc__.splitlines()[0])
    folder = args.work / "verify-8B"
    with scratch(args.work, args.keep):
        t = time.perf_counter()
        build(folder, **DIMS)
        print(f"built 8B-class drafter ({(folder / 'model.safetensors').stat().st_size / 1e9:.2f} GB) "
              f"in {time.perf_counter() - t:.1f} s")
        wall, rss, stdout = measure(sys.executable, VERIFY, str(folder))
        doc = json.loads(stdout)
        print(f"eaglectl verify (CLI, fresh process): {wall:.1f} s wall, peak RSS {rss:.0f} MB, "
              f"exit {doc['exit_code']}, regime {doc['regime']}, passed {doc['passed']}  "
              f"(goal <= 60 s: {'met' if wall <= 60 else 'MISSED'})")
        times = split(folder)
        total = sum(times.values())
        print("split (in-process): " + ", ".join(f"{k} {v:.1f} s ({100 * v / total:.0f}%)" for k, v in times.items()))


if __name__ == "__main__":
    main()
