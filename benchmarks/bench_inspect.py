"""Benchmark: header-only `eaglectl inspect` vs loading the state dict, on 8B- and 70B-class drafters.

Builds SafeAILab-layout drafters on the fly (bf16 weights filled with random bytes, d2t/t2d real),
then measures, each in a fresh process, wall time and peak RSS of
  - `eaglectl inspect DIR --json` (the real CLI, asserting torch was never imported), and
  - `safetensors.torch.load_file(model.safetensors)` (the baseline),
and prints ratios; inspect cold (an empty readings cache) and warm (the cache an earlier run filled). Goals (issue
33): inspect, cold, <= 0.5 s and <= 100 MB peak RSS on both.

    python benchmarks/bench_inspect.py [--keep] [--work DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import ENV, readings_cache, run, scratch, work_args  # noqa: E402

from eaglectl.io.safetensors import TensorEntry, serialize_header  # noqa: E402

SIZES = {
    "8B-class": dict(H=4096, I=14336, NH=32, NKV=8, V=128256, VD=32000),
    "70B-class": dict(H=8192, I=28672, NH=64, NKV=8, V=128256, VD=32000),
}


def drafter_entries(H: int, I: int, NH: int, NKV: int, V: int, VD: int) -> list[tuple[str, str, tuple]]:
    d = H // NH
    p = "midlayer."
    return [
        ("fc.weight", "BF16", (H, 3 * H)),
        (p + "self_attn.q_proj.weight", "BF16", (NH * d, 2 * H)),
        (p + "self_attn.k_proj.weight", "BF16", (NKV * d, 2 * H)),
        (p + "self_attn.v_proj.weight", "BF16", (NKV * d, 2 * H)),
        (p + "self_attn.o_proj.weight", "BF16", (H, NH * d)),
        (p + "mlp.gate_proj.weight", "BF16", (I, H)),
        (p + "mlp.up_proj.weight", "BF16", (I, H)),
        (p + "mlp.down_proj.weight", "BF16", (H, I)),
        (p + "input_layernorm.weight", "BF16", (H,)),
        (p + "hidden_norm.weight", "BF16", (H,)),
        (p + "post_attention_layernorm.weight", "BF16", (H,)),
        ("norm.weight", "BF16", (H,)),
        ("lm_head.weight", "BF16", (VD, H)),
        ("d2t", "I64", (VD,)),
        ("t2d", "BOOL", (V,)),
    ]


def build(folder: Path, H: int, I: int, NH: int, NKV: int, V: int, VD: int) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    ids = np.sort(rng.choice(V, VD, replace=False))
    d2t = (ids - np.arange(VD)).astype("<i8").tobytes()
    t2d = np.zeros(V, dtype=np.bool_)
    t2d[ids] = True
    specials = {"d2t": d2t, "t2d": t2d.tobytes()}
    entries = [TensorEntry(n, dt, s, None) for n, dt, s in drafter_entries(H, I, NH, NKV, V, VD)]
    header = serialize_header(entries, {"format": "pt"})
    path = folder / "model.safetensors"
    block = rng.integers(0, 256, 1 << 24, dtype=np.uint8).tobytes()
    with path.open("wb") as f:
        f.write(header)
        for e in entries:
            if e.name in specials:
                f.write(specials[e.name])
                continue
            left = e.nbytes
            while left:
                left -= f.write(block[: min(left, len(block))])
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
              "intermediate_size": I, "num_attention_heads": NH, "num_key_value_heads": NKV,
              "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": VD, "rms_norm_eps": 1e-5,
              "max_position_embeddings": 2048, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(config))
    return path.stat().st_size


def measure(argv: list[str], cold: bool = True, cache: Path = Path()) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one child process (`python -c CODE args`), cold (an empty
    readings cache: what vLLM answered for a config is not kept from an earlier run) or warm (`cache`)."""
    with readings_cache(cold, cache):
        wall, rss, _, cpu = run(argv[0], argv[2], *argv[3:], ok_codes=(0, 1))
    return wall, cpu, rss


INSPECT = ("import sys\nfrom eaglectl.cli.app import cli\n"
           "try:\n    cli(['inspect', sys.argv[1], '--json'])\nexcept SystemExit as e:\n    code = e.code\n"
           "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)\n")
# load_file maps lazily; touching every tensor once is what using the state dict costs
LOAD = ("import sys\nfrom safetensors.torch import load_file\nsd = load_file(sys.argv[1])\n"
        "sd = {k: v.clone() for k, v in sd.items()}\n")
BARE = "import sys\n"


def best_of(n: int, argv: list[str], cold: bool = True, cache: Path = Path()) -> tuple[float, float, float]:
    runs = [measure(argv, cold, cache) for _ in range(n)]
    return min(r[0] for r in runs), min(r[1] for r in runs), max(r[2] for r in runs)


def main() -> None:
    args = work_args(__doc__.splitlines()[0])
    py = sys.executable
    bare_wall, _, bare_rss = best_of(3, [py, "-c", BARE])
    print(f"python startup alone: {bare_wall:.3f} s, {bare_rss:.0f} MB\n")
    print("page cache warm (files just written); inspect: best of 3, cold (an empty readings cache) and warm, vLLM: "
          f"{ENV.get('EAGLECTL_VLLM_PYTHON') or 'none'}; baseline: load_file + touch every tensor")
    print(f"{'drafter':10} {'size':>8} | {'cold s':>6} {'CPU s':>5} {'MB':>5} | {'warm s':>6} {'MB':>5} | "
          f"{'load_file s':>11} {'MB':>7} | {'x faster':>8} {'RSS ratio':>9} | goal cold <=0.5 s, <=100 MB")
    with scratch(args.work, args.keep):
        for name, dims in SIZES.items():
            folder = args.work / name
            size = build(folder, **dims)
            inspect = [py, "-c", INSPECT, str(folder)]
            i_wall, i_cpu, i_rss = best_of(3, inspect)
            best_of(1, inspect, cold=False, cache=args.work / "cache")  # fills the cache
            w_wall, _, w_rss = best_of(3, inspect, cold=False, cache=args.work / "cache")
            l_wall, _, l_rss = best_of(1, [py, "-c", LOAD, str(folder / "model.safetensors")])
            ok = "met" if i_wall <= 0.5 and i_rss <= 100 else "MISSED"
            print(f"{name:10} {size / 1e9:6.2f}GB | {i_wall:6.3f} {i_cpu:5.2f} {i_rss:5.0f} | {w_wall:6.3f} "
                  f"{w_rss:5.0f} | {l_wall:11.3f} {l_rss:7.0f} | {l_wall / i_wall:7.1f}x {l_rss / i_rss:8.1f}x | {ok}")

if __name__ == "__main__":
    main()
