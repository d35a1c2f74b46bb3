"""GPU check: vLLM's Model Runner V2 on real GPU vLLM, and `verify` in bf16 on CUDA against the fp32 CPU
reference; writes one JSON summary.

On a machine with a GPU (e.g. the device tool), with vLLM (CUDA build) in EAGLECTL_VLLM_PYTHON or this
interpreter; about 8 minutes on one H200, vLLM start-up included:
    EAGLECTL_VLLM_PYTHON=/path/to/vllm/python python benchmarks/gpu_parity.py --out gpu-parity.json
The summary also goes to $OUT/gpu_parity.json when $OUT is set (and --out is not given).
Locally, to check the script itself without a GPU (what the test suite does):
    python benchmarks/gpu_parity.py --device cpu --skip-8b --out /tmp/x.json
    python benchmarks/gpu_parity.py --dry-run --skip-parity --out /tmp/r.json   # the runner check, no vLLM

RUNNER CHECK (`--device cuda`, or `--runners`; never in CI): three drafters on fixtures/trained/target, each
served by one real vLLM process with Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1):
  - `split`: the trained EAGLE-3 fixture (trained on the target's default layers [2, 4, 5]) in the SpecForge
    layout with its ids only in `eagle_config` ([1, 3, 4]): V1 reads those, V2 the target's default;
  - `upgraded`: eaglectl upgrade of it (EAGLE-3.1 layout, layers measured on the target);
  - `speculators`: eaglectl convert of it to the speculators format (layers measured).
For each it asserts vLLM's own log line ("Using Eagle3 auxiliary layers from ...", V2's) names the layers
eaglectl reads for V2, that vLLM reports it ran V2, and that the acceptance length equals eaglectl's prediction
for V2 (`smoke --engine reference --runner v2` on the same prompts) within 0.02 in float32 (0.05 in bf16:
`--runner-dtype`; whether the counts are exactly equal is recorded too), then prints a table. `--dry-run` does everything but the serving (drafters, readings, predictions).

VLLM FP8 SERVING (needs a GPU and vLLM built with CUDA; not run on CPU machines): with `--vllm-fp8`
the script also asks whether vLLM serves the FP8 fixture (fixtures/drafters/speculators-fp8, ModelOpt's
layout) and the same drafter converted to the HF-style `modelopt` layout, and at what acceptance length
against the bf16 source (fixtures/trained/eagle3.1), all on fixtures/trained/target in bfloat16:
    EAGLECTL_VLLM_PYTHON=/path/to/vllm/python python benchmarks/gpu_parity.py --vllm-fp8 --out gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import library  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="summary JSON (default: $OUT/gpu_parity.json)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runners", action="store_true", help="run the runner check (the default with --device cuda)")
    ap.add_argument("--skip-runners", action="store_true")
    ap.add_argument("--skip-parity", action="store_true", help="skip the bf16 verify parity")
    ap.add_argument("--dry-run", action="store_true", help="runner check without vLLM: drafters, readings, predictions")
    ap.add_argument("--runner-dtype", default="float32", help="dtype vLLM serves the runner check in")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--skip-8b", action="store_true")
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "_work")
    ap.add_argument("--vllm-fp8", action="store_true", help="also: does vLLM (GPU) serve the FP8 fixture?")
    args = ap.parse_args()
    if args.out is None:
        if not os.environ.get("OUT"):
            ap.error("--out is required when $OUT is not set")
        args.out = Path(os.environ["OUT"]) / "gpu_parity.json"
    started = time.perf_counter()

    import torch

    verify = library("verify")

    sources = [] if args.skip_parity else [p for p in sorted((ROOT / "fixtures" / "drafters").iterdir())
                                           if p.name not in ("modelopt-mla", "eagle-3-bin")]
    if not args.skip_8b and not args.skip_parity:
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
        if not args.skip_runners and (args.runners or args.dry_run or args.device == "cuda"):
            results["runner_check"] = runner_check(args.work, dry_run=args.dry_run, dtype=args.runner_dtype,
                                                   num_prompts=args.num_prompts, max_tokens=args.max_tokens)
            ok &= all(r["passed"] is not False for r in results["runner_check"]["drafters"])
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
        results["seconds"] = round(time.perf_counter() - started, 1)
        results["passed"] = ok
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    print(f"{'PASS' if ok else 'FAIL'} in {results['seconds']} s; summary: {args.out}", flush=True)
    return 0 if ok else 1


AL_TOLERANCE = {"float32": 0.02}  # else 0.05 (bf16/fp16 kernels draft slightly differently)
SPLIT_IDS = [1, 3, 4]  # in eagle_config only: V1 reads these, V2 the target's default (2, 4, 5)


def plant_split(dest: Path) -> Path:
    """The trained EAGLE-3 fixture's weights (linked) under a SpecForge-layout config with the ids only in
    eagle_config."""
    src = ROOT / "fixtures" / "trained" / "eagle3"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    try:
        os.link(src / "model.safetensors", dest / "model.safetensors")
    except OSError:
        shutil.copyfile(src / "model.safetensors", dest / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": SPLIT_IDS}
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    return dest


def _ids_in(line: str | None) -> list[int] | None:
    if not line or ":" not in line:
        return None
    return sorted({int(x) for x in re.findall(r"-?\d+", line.rsplit(":", 1)[1])})


def runner_check(work: Path, *, dry_run: bool, dtype: str, num_prompts: int, max_tokens: int) -> dict:
    """Three drafters served by real vLLM with Model Runner V2 (one process each), against eaglectl's V2
    prediction (the reference loop on V2's reading, same prompts)."""
    convert = library("convert")
    smoke = library("smoke")
    upgrade = library("upgrade")
    from eaglectl.errors import EaglectlError

    target = ROOT / "fixtures" / "trained" / "target"
    base = work / "runners"
    split = plant_split(base / "split")
    made = {"split": split}
    t = time.perf_counter()
    for name, make in (("upgraded", lambda d: upgrade(str(split), str(d), target=str(target), init="calibrated",
                                                       force=True)),
                       ("speculators", lambda d: convert(str(split), str(d), "speculators", target=str(target),
                                                         force=True))):
        dest = base / name
        shutil.rmtree(dest, ignore_errors=True)
        make(dest)
        made[name] = dest
    print(f"runner check: drafters written in {time.perf_counter() - t:.1f} s", flush=True)
    # every runner reading in one vLLM import (cached on disk: the smoke runs below read the cache)
    from eaglectl.engines.asking import Request, read_batch

    t = time.perf_counter()
    asked = read_batch([Request(str(f), json.loads((f / "config.json").read_text()), 8, str(target))
                        for f in made.values()])
    print(f"runner check: readings {'asked of vLLM' if all(r.asked for r in asked) else 'assumed'} in "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    common = dict(k=3, num_prompts=num_prompts, max_tokens=max_tokens, baselines=[])
    rows = []
    for name, folder in made.items():
        row: dict = {"drafter": name, "path": str(folder)}
        t = time.perf_counter()
        try:
            pred = smoke(str(folder), str(target), engine="reference", runner="v2", preflight=False, **common).to_json()
        except EaglectlError as e:
            pred = getattr(e, "report", None) or {}
            row["prediction_error"] = f"[{e.reference}] {e.message}"
        v2 = next((r for r in pred.get("runners") or [] if r["runner"] == "v2"), None)
        readings = {r["runner"]: r["boundary_ids"] for r in pred.get("engine_readings") or []}
        row.update(v1_reads=readings.get("v1"), v2_reads=readings.get("v2"),
                   reading_basis=(pred.get("engine_readings") or [{}])[0].get("basis"),
                   intended=(pred.get("intended_reading") or {}).get("boundary_ids"),
                   predicted_v2_al=v2["mean_acceptance_length"] if v2 else None,
                   predicted_counts={c: v2[c] for c in ("num_drafts", "num_accepted_tokens", "accepted_per_pos")}
                   if v2 else None, predict_seconds=round(time.perf_counter() - t, 1))
        row["served"] = None
        row["passed"] = None
        if not dry_run:
            t = time.perf_counter()
            try:
                rep = smoke(str(folder), str(target), engine="vllm", runner="v2", dtype=dtype, concurrency=(16,),
                            preflight=False, timeout_s=300, **common).to_json()
                served = rep["runners"][0]
                line = served.get("aux_log_line")
                row.update(served=True, vllm_version=rep["versions"].get("vllm_version"),
                           cuda=rep["versions"].get("cuda"), runner_used=served.get("runner_used"),
                           emulated=served.get("emulated"), aux_log_line=line, log_ids=_ids_in(line),
                           served_al=served.get("mean_acceptance_length"),
                           served_counts={c: served[c] for c in ("num_drafts", "num_accepted_tokens",
                                                                 "accepted_per_pos")},
                           red_flags=rep["red_flags"], log=rep["log"])
            except EaglectlError as e:
                row.update(served=False, error=f"[{e.reference}] {e.message}", hint=e.hint)
            row["serve_seconds"] = round(time.perf_counter() - t, 1)
            checks = {}
            if row["served"]:
                checks["vLLM ran Model Runner V2"] = row["runner_used"] == "v2" and not row["emulated"]
                checks["V2's log line names eaglectl's V2 reading"] = bool(
                    row["aux_log_line"] and row["aux_log_line"].startswith("Using Eagle3")
                    and row["log_ids"] == row["v2_reads"])
                # GPU kernels reduce in another order than the CPU reference: a rare argmax flip may move a count,
                # while a wrong layer moves the AL by 0.2 or more (the split fixture: V1 3.0 vs V2 3.4)
                tol = AL_TOLERANCE.get(dtype, 0.05)
                row["counts_equal_exactly"] = row["served_counts"] == row["predicted_counts"]
                row["al_tolerance"] = tol
                checks[f"AL within {tol} of the V2 prediction"] = (
                    row["predicted_v2_al"] is not None and row["served_al"] is not None
                    and abs(row["served_al"] - row["predicted_v2_al"]) <= tol)
            if name != "split":
                checks["both runners read the intended layers"] = row["v1_reads"] == row["v2_reads"] == row["intended"]
            row["checks"] = checks
            row["passed"] = bool(row["served"]) and all(checks.values())
        rows.append(row)
    print("\nrunner check (vLLM Model Runner V2" + (", dry run: not served" if dry_run else f", {dtype}") + ")")
    print(f"{'drafter':12} {'V1 reads':12} {'V2 reads':12} {'intended':12} {'V2 predicted':>12} {'V2 served':>10} "
          f"{'runner':6} {'passed':6}  vLLM's log line")
    for r in rows:
        served = "-" if r.get("served_al") is None else f"{r['served_al']:.3f}"
        pred = "-" if r["predicted_v2_al"] is None else f"{r['predicted_v2_al']:.3f}"
        print(f"{r['drafter']:12} {str(r['v1_reads']):12} {str(r['v2_reads']):12} {str(r['intended']):12} "
              f"{pred:>12} {served:>10} {str(r.get('runner_used') or '-'):6} {str(r['passed']):6}  "
              f"{r.get('aux_log_line') or r.get('error') or '-'}", flush=True)
        for check, good in (r.get("checks") or {}).items():
            if not good:
                print(f"  FAILED: {check}", flush=True)
    return {"dtype": dtype, "dry_run": dry_run, "num_prompts": num_prompts, "max_tokens": max_tokens, "k": 3,
            "drafters": rows}


def vllm_fp8(work: Path) -> list[dict]:
    """VLLM FP8 SERVING: vLLM's FP8 paths need a GPU. Smoke under real vLLM (bf16 activations, greedy, k=3)
    for the bf16 source, the FP8 fixture as stored (speculators format) and converted to `modelopt`."""
    convert = library("convert")
    smoke = library("smoke")
    from eaglectl.errors import EaglectlError

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
