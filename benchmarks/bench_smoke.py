"""Benchmark: `eaglectl smoke` overhead against a bare vLLM script doing the same generation, and the
trained fixtures' acceptance length for EAGLE-3, EAGLE-3.1, the vanilla draft model and ngram, short vs
long context, and the speedup by concurrency at k = 3.

Needs the vLLM interpreter (EAGLECTL_VLLM_PYTHON, e.g. .venv-vllm/bin/python). Goal (issue 5):
<= 10 % wall overhead beyond vLLM start-up.

    python benchmarks/bench_smoke.py [--skip-table]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
TRAINED = ROOT / "fixtures" / "trained"

BARE = """
import json, sys, time, os
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    req = json.load(open(sys.argv[1]))
    llm = LLM(model=req["target"], skip_tokenizer_init=True, dtype="float32", max_model_len=1024, enforce_eager=True,
              max_num_seqs=16, disable_log_stats=False, seed=0, speculative_config=req["spec"])
    p = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=x) for x in req["prompts"]]
    llm.generate([TokensPrompt(prompt_token_ids=req["prompts"][0][:8])], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    llm.generate(prompts, p, use_tqdm=False)
    llm.generate(prompts, p, use_tqdm=False)
    m = {x.name: getattr(x, "value", None) for x in llm.get_metrics()}
    print(json.dumps({"drafts": m.get("vllm:spec_decode_num_drafts")}))
"""


def overhead(python: str) -> None:
    from eaglectl.measure.workload import load_prompts, tokenizer_of

    tok = tokenizer_of(str(TRAINED / "target"))
    prompts = load_prompts("builtin:short", tok, count=16, max_tokens=64, max_model_len=1024, k=3, seed=0).prompts
    spec = {"method": "eagle3", "model": str(TRAINED / "eagle3.1"), "num_speculative_tokens": 3}
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "req.json"
        req.write_text(json.dumps({"target": str(TRAINED / "target"), "spec": spec, "prompts": prompts}))
        script = Path(tmp) / "bare.py"
        script.write_text(BARE)
        t = time.perf_counter()
        subprocess.run([python, str(script), str(req)], check=True, capture_output=True, env={**os.environ})
        bare = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "eaglectl", "smoke", str(TRAINED / "eagle3.1"), "--target",
                    str(TRAINED / "target"), "--baseline", "", "--concurrency", "16", "--json"], check=True,
                   capture_output=True, cwd=ROOT)
    smoke = time.perf_counter() - t
    print(f"bare vLLM script (load + warm-up + 2 x generate 16x64): {bare:.1f} s")
    print(f"eaglectl smoke (same generations + pre-flight inspect + tokenization + report): {smoke:.1f} s")
    print(f"overhead: {smoke - bare:+.1f} s = {100 * (smoke - bare) / bare:+.1f} % of the bare run (goal <= 10 %)")


def table(ks: tuple[int, ...]) -> None:
    from _measure import library

    from eaglectl.commands.requests import parse_baselines

    smoke = library("smoke")

    base = parse_baselines(f"{TRAINED / 'eagle3.1'},draft_model:{TRAINED / 'vanilla-draft'},ngram,none")
    names = ["EAGLE-3", "EAGLE-3.1", "vanilla draft", "ngram"]
    print("\nacceptance length (vLLM, greedy, fp32, 64 new tokens)")
    print("short: 16 prompts of 64 tokens; long: 4 prompts of 512 - 64 - k - 2 tokens")
    print(f"{'k':>2} {'prompts':>7} | " + " | ".join(f"{n:>13}" for n in names))
    for prompts in ("builtin:short", "builtin:long"):
        for k in ks:
            conc = (1, 4, 16) if (k == 3 and prompts == "builtin:short") else (1,)
            # max_model_len 512: the fixtures were trained on 512-token windows, so "long" prompts
            # (max_model_len - max_tokens - k - 2 tokens) stay in distribution
            rep = smoke(str(TRAINED / "eagle3"), str(TRAINED / "target"), k=k, prompts=prompts, concurrency=conc,
                        baselines=base, max_model_len=512).to_json()
            als = [rep["mean_acceptance_length"], *(b.get("mean_acceptance_length") for b in rep["baselines"][:3])]
            print(f"{k:>2} {prompts.split(':')[1]:>7} | " + " | ".join(f"{a:13.3f}" for a in als), flush=True)
            if len(conc) > 1:
                speed = rep["speedup"]
                print("    speedup over no speculation (per-user tokens/s) by concurrency: " + "; ".join(
                    f"{s['config'].split('/')[-1]} c={s['concurrency']}: {s['speedup']:.2f}x" for s in speed), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-table", action="store_true")
    ap.add_argument("--ks", default="1,3,5", help="k values for the acceptance table")
    args = ap.parse_args()
    python = os.environ.get("EAGLECTL_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    os.environ["EAGLECTL_VLLM_PYTHON"] = python
    overhead(python)
    if not args.skip_table:
        table(tuple(int(k) for k in args.ks.split(",")))


if __name__ == "__main__":
    main()
