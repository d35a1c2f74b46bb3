"""Benchmark: what measuring with `--target` costs, against the same command on a capture and against the
physical floor of the same work, measured in the same run.

For `inspect`, `convert` and `upgrade` (each a fresh `python -m eaglectl` process, interpreter start-up
included):
- `--target T` (the target runs inside the command);
- `capture T` + the command with `--states S` (the capture path);
- the floor: a fresh process that imports torch and transformers, loads T, runs one forward over the
  tokens the command reads (the measurement text) and one over the greedy continuations it decodes, and one
  teacher-forced drafter pass per reading the command scores.

Printed: seconds, CPU seconds, peak RSS and the ratios `--target / (capture + --states)` (goal <= 1.3, in CPU
seconds: other processes on a shared machine stretch wall time, not CPU time) and `--target / floor` (goal: inspect
<= 5, upgrade <= 10 on the 1B-class target); and `inspect --target`'s CPU seconds on the fixture (goal <= 4).
Each command runs cold (an empty readings cache). The capture runs with --engine (default vllm: the issue's
measure; hf: no vLLM needed). Targets: the trained fixture
(8 layers x 128) and, with `--big`, a synthetic 1B-class Llama (random weights, the fixture's byte tokenizer)
with a matching random drafter.

    python benchmarks/bench_probe.py [--big] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._measure import Run, readings_cache, run  # noqa: E402

TRAINED = ROOT / "fixtures" / "trained"
CLI = "import sys; from eaglectl.cli.app import main; sys.argv = ['eaglectl'] + sys.argv[1:]; main()"
FLOOR = """
import sys, torch
from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.model.loader import load_reference
from eaglectl.model.hf import load_model, forward
from eaglectl.measure.workload import heldout_prompts, measurement_text, text_token_ids
target, drafter, text_tokens, prompts, new, readings = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
m = load_model(target)
d = load_reference(open_drafter(drafter))
ids = d.spec.capture_ids(m.num_layers)
head, tail, _ = measurement_text()
tok = torch.tensor([text_token_ids(m.tokenizer, m.vocab_size, head + tail)[:text_tokens]])
with torch.no_grad():
    _, aux = forward(m, tok, ids)
    if prompts:
        seqs = torch.tensor([p + p[:new] for p in heldout_prompts(m.tokenizer, prompts, 64, 0)])
        _, cont = forward(m, seqs, ids)
    model = d.build(torch.float32, 'cpu')
    embed = None if d.has_embed else m.embedding().float()
    for _ in range(readings):
        model.run(aux[:, :-3], tok, 3, embed=embed)
        if prompts:
            model.run(cont[:, :-3], seqs, 3, embed=embed, anchors=slice(63, 63 + new - 3))
"""


def cli(*args: str, ok: tuple[int, ...] = (0, 1)) -> Run:
    with readings_cache(True, Path()):
        return run(sys.executable, CLI, *args, ok_codes=ok)


def make_big(work: Path) -> tuple[Path, Path]:
    """A 1B-class Llama target (random, fp32) with the fixture's byte tokenizer, and a matching drafter."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    target, drafter = work / "target-1b", work / "drafter-1b"
    if (target / "config.json").exists() and (drafter / "config.json").exists():
        return target, drafter
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TRAINED / "target" / name, target / name)
    del model
    H, V, Vd = 2048, 32000, 8000
    g = torch.Generator().manual_seed(1)

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    tensors = {"fc.weight": w(H, 3 * H), "norm.weight": torch.ones(H, dtype=torch.bfloat16),
               "lm_head.weight": w(Vd, H), "d2t": torch.zeros(Vd, dtype=torch.int64),
               "t2d": torch.zeros(V, dtype=torch.bool)}
    tensors["t2d"][:Vd] = True
    layer = {"self_attn.q_proj.weight": w(2048, 2 * H), "self_attn.k_proj.weight": w(512, 2 * H),
             "self_attn.v_proj.weight": w(512, 2 * H), "self_attn.o_proj.weight": w(H, 2048),
             "mlp.gate_proj.weight": w(5632, H), "mlp.up_proj.weight": w(5632, H), "mlp.down_proj.weight": w(H, 5632),
             "input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
             "hidden_norm.weight": torch.ones(H, dtype=torch.bfloat16),
             "post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16)}
    tensors.update({f"midlayer.{k}": v for k, v in layer.items()})
    drafter.mkdir(parents=True, exist_ok=True)
    save_file(tensors, drafter / "model.safetensors", metadata={"format": "pt"})
    (drafter / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": 5632, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": Vd, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 7, 12]}}))
    return target, drafter


def bench(name: str, target: Path, drafter: Path, work: Path, engine: str) -> None:
    states = work / f"states-{name}"
    capture = cli("capture", str(target), "--out", str(states), "--force", "--num-prompts", "8", "--length", "512",
                  "--drafter", str(drafter), "--engine", engine, "--json")
    for cmd, extra, floor_args in (
            ("inspect", [], (771, 4, 67, 5)),
            ("convert", [str(work / f"{name}-c"), "--to", "speculators", "--force"], (771, 4, 67, 7)),
            ("upgrade", [str(work / f"{name}-u"), "--to", "speculators", "--force"], (4096, 16, 67, 6))):
        t = cli(cmd, str(drafter), *extra, "--target", str(target), "--json")
        s = cli(cmd, str(drafter), *extra, "--states", str(states), "--json")
        f = run(sys.executable, FLOOR, str(target), str(drafter), *map(str, floor_args))
        print(f"{name:8} {cmd:8} --target {t.wall:6.1f} s {t.cpu:6.1f} CPU-s ({t.rss:5.0f} MB)   capture ({engine}) + "
              f"--states {capture.cpu:6.1f} + {s.cpu:5.1f} CPU-s   floor {f.cpu:5.1f} CPU-s ({f.rss:5.0f} MB)   "
              f"vs capture path {t.cpu / (capture.cpu + s.cpu):5.2f} CPU ({t.wall / (capture.wall + s.wall):5.2f} "
              f"wall)   vs floor {t.cpu / f.cpu:5.2f} CPU", flush=True)
        if name == "fixture" and cmd == "inspect":
            print(f"goal inspect --target <= 4 CPU-s on the fixture: {'met' if t.cpu <= 4 else 'MISSED'} "
                  f"({t.cpu:.1f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", action="store_true", help="also the synthetic 1B-class target (a few GB, minutes)")
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "_work")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--engine", default="vllm", choices=("vllm", "hf"), help="the capture's engine")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"torch threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, cores "
          f"{len(os.sched_getaffinity(0))}; started {time.strftime('%H:%M:%S')}")
    try:
        bench("fixture", TRAINED / "target", TRAINED / "eagle3-output", args.work, args.engine)
        if args.big:
            bench("1b", *make_big(args.work), args.work, args.engine)
    finally:
        if not args.keep:
            for p in args.work.glob("*"):
                if p.name not in ("target-1b", "drafter-1b"):
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()


if __name__ == "__main__":
    main()
