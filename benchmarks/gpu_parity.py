"""GPU check: `verify` in bf16 on CUDA against the fp32 CPU reference, on the bundled fixtures and a
synthetic 8B-class drafter; writes the per-step numbers as one JSON file.

On a machine with a GPU (e.g. the device tool):
    python benchmarks/gpu_parity.py --out gpu-parity.json
Locally, to check the script itself without a GPU (what the test suite does):
    python benchmarks/gpu_parity.py --device cpu --skip-8b --out /tmp/x.json

VLLM FP8 SERVING (needs a GPU and vLLM built with CUDA; not run on CPU machines): with `--vllm-fp8`
the script also asks whether vLLM serves the FP8 fixture (fixtures/drafters/speculators-fp8, ModelOpt's
layout) and the same drafter converted to the HF-style `modelopt` layout, and at what acceptance length
against the bf16 source (fixtures/trained/eagle3.1), all on fixtures/trained/target in bfloat16:
    EAGLECTL_VLLM_PYTHON=/path/to/vllm/python python benchmarks/gpu_parity.py --vllm-fp8 --out gpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--skip-8b", action="store_true")
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "_work")
    ap.add_argument("--vllm-fp8", action="store_true", help="also: does vLLM (GPU) serve the FP8 fixture?")
    args = ap.parse_args()

    import torch

    from eaglectl.verify import run as verify

    sources = [p for p in sorted((ROOT / "fixtures" / "drafters").iterdir())
               if p.name not in ("modelopt-mla", "eagle-3-bin")]
    if not args.skip_8b:
        from bench_verify import DIMS, build

        big = args.work / "gpu-8B"
        build(big, **DIMS)
        sources.append(big)
    results = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "runs": [],
    }
    ok = True
    try:
        for src in sources:
            for dtype in args.dtypes.split(","):
                t = time.perf_counter()
                tokens = 128 if src.name == "gpu-8B" else 64
                rep = verify(str(src), device=args.device, dtype=dtype, steps=3, tokens=tokens)
                row = {"source": src.name, "dtype": dtype, "seconds": round(time.perf_counter() - t, 2),
                       "passed": rep.passed, "regime": rep.regime,
                       "per_step": [{k: v for k, v in m.__dict__.items()} for m in rep.metrics]}
                ok &= bool(rep.passed)
                results["runs"].append(row)
                worst = max(rep.metrics, key=lambda m: m.kl_mean)
                print(f"{src.name:28} {dtype:9} passed={rep.passed} kl_mean<= {worst.kl_mean:.2e} "
                      f"top1>= {min(m.top1_agreement for m in rep.metrics):.4f} "
                      f"cos_min>= {min(m.state_cos_min for m in rep.metrics):.6f}", flush=True)
        if args.vllm_fp8:
            results["vllm_fp8"] = vllm_fp8(args.work)
            ok &= all(r.get("served") for r in results["vllm_fp8"])
    finally:
        shutil.rmtree(args.work / "gpu-8B", ignore_errors=True)
    args.out.write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


def vllm_fp8(work: Path) -> list[dict]:
    """VLLM FP8 SERVING: vLLM's FP8 paths need a GPU. Smoke under real vLLM (bf16 activations, greedy, k=3)
    for the bf16 source, the FP8 fixture as stored (speculators format) and converted to `modelopt`."""
    from eaglectl.convert import run as convert
    from eaglectl.errors import EaglectlError
    from eaglectl.smoke import run as smoke

    trained = ROOT / "fixtures" / "trained"
    fp8 = ROOT / "fixtures" / "drafters" / "speculators-fp8"
    hf_style = work / "fp8-modelopt"
    shutil.rmtree(hf_style, ignore_errors=True)
    convert(str(fp8), str(hf_style), "modelopt", source_aux_convention="boundary", measure=False)
    rows = []
    for name, drafter in (("bf16 source", trained / "eagle3.1"), ("fp8 speculators", fp8), ("fp8 modelopt", hf_style)):
        t = time.perf_counter()
        try:
            rep = smoke(str(drafter), str(trained / "target"), engine="vllm", k=3, num_prompts=16, max_tokens=64,
                        dtype="bfloat16", concurrency=(1,), preflight=True).to_json()
            row = {"served": True, "mean_acceptance_length": rep["mean_acceptance_length"],
                   "per_position_acceptance": rep["per_position_acceptance"], "red_flags": rep["red_flags"],
                   "vllm_version": rep["versions"].get("vllm_version"), "log": rep["log"]}
        except EaglectlError as e:
            row = {"served": False, "error": f"[{e.reference}] {e.message}", "hint": e.hint}
        row.update(drafter=name, seconds=round(time.perf_counter() - t, 1))
        print(f"vLLM FP8 serving  {name:16} served={row['served']} AL={row.get('mean_acceptance_length')}", flush=True)
        rows.append(row)
    shutil.rmtree(hf_style, ignore_errors=True)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
