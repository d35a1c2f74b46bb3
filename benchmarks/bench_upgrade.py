"""Benchmark: what each `upgrade --init` keeps of the trained EAGLE-3 fixture's acceptance length,
before any fine-tuning (greedy, k=3, builtin:short, 16 x 64 tokens; reference loop, whose counts
equal vLLM's on these fixtures). Goal (issue 4): calibrated keeps >= 95 % with fc_norm alone and
>= 92 % with both flags.

    python benchmarks/bench_upgrade.py [--engine vllm]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eaglectl.smoke import run as smoke  # noqa: E402
from eaglectl.upgrade import run as upgrade  # noqa: E402

TRAINED = ROOT / "fixtures" / "trained"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="reference", choices=["reference", "vllm"])
    ap.add_argument("-k", type=int, default=3)
    args = ap.parse_args()
    target = str(TRAINED / "target")

    def al(path: str) -> float:
        return smoke(path, target, engine=args.engine, k=args.k, baselines=[], concurrency=(1,)).to_json()[
            "mean_acceptance_length"]

    base = al(str(TRAINED / "eagle3"))
    print(f"source EAGLE-3 drafter: AL {base:.3f} (k={args.k}, {args.engine})")
    print(f"{'init':12} {'flags':22} {'AL':>6} {'kept':>7} {'FC rel. error':>14} {'step-0 top-1':>13}")
    tmp = Path(tempfile.mkdtemp(prefix="eaglectl-bench-upgrade-"))
    try:
        for init in ("ones", "harmonic", "calibrated", "refit"):
            for label, fc, no in (("fc_norm", True, False), ("fc_norm + norm_output", True, True)):
                dest = tmp / f"{init}-{fc}-{no}"
                res = upgrade(str(TRAINED / "eagle3"), str(dest), init=init, fc_norm=fc, norm_output=no,
                              target=target, to="speculators")
                a = al(str(dest))
                err = res.statistics.get("fc_output_relative_error")
                top1 = res.fidelity.metrics[0].top1_agreement
                print(f"{init:12} {label:22} {a:6.3f} {100 * a / base:6.1f}% "
                      f"{'-' if err is None else f'{err:.4f}':>14} {100 * top1:12.1f}%", flush=True)
        dest = tmp / "norm-output-only"
        upgrade(str(TRAINED / "eagle3"), str(dest), fc_norm=False, target=target, to="speculators")
        a = al(str(dest))
        print(f"{'-':12} {'norm_output only':22} {a:6.3f} {100 * a / base:6.1f}%")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
