"""Benchmark: convert an 8B-class drafter (SafeAILab layout, ~0.85 GB bf16) to speculators and to
modelopt without a dtype change, and with a bf16 -> fp16 cast; baselines in the same run: `cp` of
the same bytes and a naive load-everything-then-save (safetensors.torch load_file + save_file).
Goals (issue 4): no-cast conversion <= 2x the cp wall time and <= 400 MB peak RSS.

    python benchmarks/bench_convert.py [--keep]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import measure, work_args  # noqa: E402
from bench_verify import DIMS, build  # noqa: E402

CONVERT = "from eaglectl.cli import main\nsys.argv = ['eaglectl', 'convert', *sys.argv[1:]]\nmain()\n"
NAIVE = ("from safetensors.torch import load_file, save_file\n"
               "sd = load_file(sys.argv[1])\nsd = {k: v.clone() for k, v in sd.items()}\n"
               "save_file(sd, sys.argv[2], metadata={'format': 'pt'})\n")


def run(argv: list[str], durable: bool = False) -> tuple[float, float]:
    """Wall time (after flushing earlier writes, so runs do not pay for each other) and peak RSS."""
    if argv[0] == "cp":
        subprocess.run(["sync"], check=True)
        t = time.perf_counter()
        subprocess.run(argv, check=True)
        if durable:
            subprocess.run(["sync"], check=True)
        return time.perf_counter() - t, float("nan")
    wall, rss, _ = measure(argv[0], argv[2], *argv[3:], sync=True)
    return wall, rss


def main() -> None:
    args = work_args(__doc__.splitlines()[0])
    work = args.work / "convert"
    shutil.rmtree(work, ignore_errors=True)
    src = work / "src"
    target = work / "target"
    try:
        build(src, **DIMS)
        target.mkdir(parents=True)
        (target / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": DIMS["H"],
            "num_hidden_layers": 32, "vocab_size": DIMS["V"], "rope_theta": 500000.0}))
        size = (src / "model.safetensors").stat().st_size
        py = sys.executable
        rows = []
        cp_wall = min(run(["cp", "-r", str(src), str(work / f"cp{i}")])[0] for i in range(2))
        cp_sync = min(run(["cp", "-r", str(src), str(work / f"cps{i}")], durable=True)[0] for i in range(2))
        rows.append(("cp -r (baseline)", cp_wall, float("nan")))
        rows.append(("cp -r && sync (durable baseline)", cp_sync, float("nan")))
        rows.append(("load_file + save_file", *run([py, "-c", NAIVE, str(src / "model.safetensors"),
                                                    str(work / "naive.safetensors")])))
        for to, extra in (("speculators", []), ("modelopt", []), ("speculators", ["--dtype", "float16"]),
                          ("modelopt", ["--dtype", "float16"])):
            dest = work / f"{to}{'-fp16' if extra else ''}"
            runs = [run([py, "-c", CONVERT, str(src), str(dest) + str(i), "--to", to, "--target", str(target), *extra])
                    for i in range(2)]
            wall, rss = min(r[0] for r in runs), max(r[1] for r in runs)
            rows.append((f"convert --to {to}" + (" --dtype float16" if extra else ""), wall, rss))
        print(f"source: 8B-class SafeAILab drafter, {size / 1e9:.2f} GB bf16, page cache warm; best of 2; "
              "convert fsyncs its output before the rename, plain cp does not")
        print(f"{'run':40} {'wall s':>7} {'peak MB':>8} {'x cp':>6} {'x cp+sync':>9}")
        for name, wall, rss in rows:
            print(f"{name:40} {wall:7.2f} {rss:8.0f} {wall / cp_wall:6.2f} {wall / cp_sync:9.2f}")
        no_cast = [r for r in rows if r[0].startswith("convert") and "dtype" not in r[0]]
        for label, base in (("cp", cp_wall), ("cp && sync", cp_sync)):
            ok = all(w <= 2 * base and m <= 400 for _, w, m in no_cast)
            print(f"goal (no-cast <= 2x {label}, <= 400 MB): {'met' if ok else 'MISSED'}")
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
