"""Benchmark: what asking vLLM costs a batch. Four conversions of the trained fixtures, each output's runner readings
asked of vLLM's own code (EAGLECTL_ASK_VLLM=1, an empty readings cache per run), three ways in the same run:
  - the four as one `eaglectl convert --manifest` (one reading worker imports vLLM once for the process),
  - the baseline: the four as separate `eaglectl convert` processes (a shell loop; each imports vLLM), and
  - the floor: the manifest answered by the verified tables (vLLM installed, its deciding code hashed, no worker).
Needs a vLLM interpreter: EAGLECTL_VLLM_PYTHON, default /work/main/.venv-vllm/bin/python.

    python benchmarks/bench_readings.py [--keep] [--work DIR]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import ENV, Run, run, scratch, work_args  # noqa: E402

TRAINED = ROOT / "fixtures" / "trained"
LINES = [("eagle3", "speculators"), ("eagle3", "modelopt"), ("eagle3.1", "specforge"), ("eagle3-output", "modelopt")]
CONVERT = "from eaglectl.cli.app import main\nsys.argv = ['eaglectl', 'convert', *sys.argv[1:]]\nmain()\n"
REPEATS = 2


def vllm_python() -> str:
    py = os.environ.get("EAGLECTL_VLLM_PYTHON", "/work/main/.venv-vllm/bin/python")
    if not Path(py).exists():
        raise SystemExit(f"no vLLM interpreter at {py} (set EAGLECTL_VLLM_PYTHON)")
    return py


def main() -> None:
    args = work_args(__doc__.splitlines()[0])
    work = args.work / "readings"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    vpy = vllm_python()
    py = sys.executable
    items = [{"source": str(TRAINED / src), "dest": str(work / f"out-{i}"), "to": to, "base_model": "org/target"}
             for i, (src, to) in enumerate(LINES)]
    manifest = work / "m.jsonl"
    manifest.write_text("".join(json.dumps(item) + "\n" for item in items))

    def with_env(ask: bool) -> None:
        shutil.rmtree(work / "cache", ignore_errors=True)
        ENV.update(EAGLECTL_CACHE_DIR=str(work / "cache"), EAGLECTL_VLLM_PYTHON=vpy)  # what each run is given
        if ask:
            ENV["EAGLECTL_ASK_VLLM"] = "1"
        else:
            ENV.pop("EAGLECTL_ASK_VLLM", None)
        for item in items:
            shutil.rmtree(item["dest"], ignore_errors=True)

    def loop() -> Run:
        runs = [run(py, CONVERT, item["source"], item["dest"], "--to", item["to"], "--base-model", "org/target")
                for item in items]
        return Run(sum(r.wall for r in runs), max(r.rss for r in runs), "", sum(r.cpu for r in runs))

    with scratch(args.work, args.keep):
        rows: dict[str, list[Run]] = {"manifest": [], "loop": [], "floor": []}
        for _ in range(REPEATS):  # interleaved
            with_env(ask=True)
            rows["manifest"].append(run(py, CONVERT, "--manifest", str(manifest)))
            with_env(ask=True)
            rows["loop"].append(loop())
            with_env(ask=False)
            rows["floor"].append(run(py, CONVERT, "--manifest", str(manifest)))
        cached = len(list((work / "cache").glob("*.json")))
        base = min(r.wall for r in rows["loop"])
        print(f"{len(items)} conversions of the trained fixtures, each output asked of vLLM ({vpy}); best of "
              f"{REPEATS}; {len(os.sched_getaffinity(0))} cores, load {os.getloadavg()[0]:.1f}; the floor run cached "
              f"{cached} answer(s) (0: the verified tables answered every question)")
        print(f"{'run':62} {'wall s':>7} {'CPU s':>6} {'x baseline':>10}")
        names = {"loop": "separate `eaglectl convert` processes (baseline)",
                 "manifest": "one `convert --manifest` (one reading worker)",
                 "floor": "one `convert --manifest`, verified tables (no worker: floor)"}
        for key in ("loop", "manifest", "floor"):
            wall, cpu = min(r.wall for r in rows[key]), min(r.cpu for r in rows[key])
            print(f"{names[key]:62} {wall:7.2f} {cpu:6.2f} {wall / base:10.2f}")


if __name__ == "__main__":
    main()
