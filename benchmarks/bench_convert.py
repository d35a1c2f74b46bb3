"""Benchmark: convert an 8B-class drafter (SafeAILab layout, ~0.85 GB bf16) to speculators and to
modelopt without a dtype change, and with a bf16 -> fp16 cast. The baseline, measured in the same
run, is the physical limit of the same work: a durable copy of the same bytes, `cat SRC > DST` plus
an fsync of DST (coreutils `sync DST`), not a global `sync` that also flushes unrelated pages.
Goals (issue 10): no-cast conversion <= 2x the durable copy (stretch 1.3x) and <= 256 MB peak RSS,
with the post-write re-read check kept.

    python benchmarks/bench_convert.py [--keep]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import ENV, measure, scratch, work_args  # noqa: E402
from bench_verify import DIMS, build  # noqa: E402

REPEATS = 5
CONVERT = "from eaglectl.cli.app import main\nsys.argv = ['eaglectl', 'convert', *sys.argv[1:]]\nmain()\n"


def durable_copy(src: Path, dst: Path) -> float:
    """Wall time of `cat src > dst && sync dst` (earlier writes flushed first, outside the timing)."""
    subprocess.run(["sync"], check=True)
    t = time.perf_counter()
    subprocess.run(["sh", "-c", 'cat "$0" > "$1" && sync "$1"', str(src), str(dst)], check=True)
    return time.perf_counter() - t


def convert(py: str, *args: str, cache: Path | None = None) -> tuple[float, float]:
    """One convert in a fresh process; `cache`: an empty readings cache (cold: nothing vLLM answered is kept)."""
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
        ENV["EAGLECTL_CACHE_DIR"] = str(cache)
    wall, rss, _ = measure(py, CONVERT, *args, sync=True)
    return wall, rss


def main() -> None:
    args = work_args(__doc__.splitlines()[0])
    work = args.work / "convert"
    shutil.rmtree(work, ignore_errors=True)
    src = work / "src"
    target = work / "target"
    with scratch(args.work, args.keep):
        build(src, **DIMS)
        target.mkdir(parents=True)
        (target / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": DIMS["H"],
            "num_hidden_layers": 32, "vocab_size": DIMS["V"], "rope_theta": 500000.0}))
        size = (src / "model.safetensors").stat().st_size
        py = sys.executable
        # interleaved repetitions, best of each: this machine's disk throughput varies from run to run
        cases = [("speculators", []), ("modelopt", []), ("speculators", ["--dtype", "float16"])]
        copies: list[float] = []
        runs: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(cases))}
        for rep in range(REPEATS):
            copies.append(durable_copy(src / "model.safetensors", work / f"copy{rep}.safetensors"))
            for i, (to, extra) in enumerate(cases):
                dest = work / f"{to}{'-fp16' if extra else ''}-{rep}"
                runs[i].append(convert(py, str(src), str(dest), "--to", to, "--target", str(target), *extra,
                                       cache=work / "cache"))
                shutil.rmtree(dest)
            (work / f"copy{rep}.safetensors").unlink()
        base = min(copies)
        rows = [("cat + fsync of the same bytes (baseline)", base, float("nan"))]
        for i, (to, extra) in enumerate(cases):
            wall, rss = min(r[0] for r in runs[i]), max(r[1] for r in runs[i])
            rows.append((f"convert --to {to}" + (" --dtype float16" if extra else ""), wall, rss))
        print(f"source: 8B-class SafeAILab drafter, {size / 1e9:.2f} GB bf16, page cache warm; best of {REPEATS}; "
              "convert includes process start, planning, the post-write re-read check and the fsync of its output; "
              f"cold: an empty readings cache each run; vLLM: {os.environ.get('EAGLECTL_VLLM_PYTHON') or 'none'}")
        print(f"{'run':44} {'wall s':>7} {'peak MB':>8} {'x baseline':>10}")
        for name, wall, rss in rows:
            print(f"{name:44} {wall:7.2f} {rss:8.0f} {wall / base:10.2f}")
        no_cast = [r for r in rows if r[0].startswith("convert") and "dtype" not in r[0]]
        worst = max(w for _, w, _ in no_cast) / base
        peak = max(m for _, _, m in no_cast)
        print(f"goal no-cast <= 2x baseline and <= 256 MB: {'met' if worst <= 2 and peak <= 256 else 'MISSED'} "
              f"({worst:.2f}x, {peak:.0f} MB); stretch <= 1.3x: {'met' if worst <= 1.3 else 'missed'}")


if __name__ == "__main__":
    main()
