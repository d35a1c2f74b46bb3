"""Benchmark: what each `upgrade --init` keeps of a trained EAGLE-3 drafter's acceptance length before
any fine-tuning, for both fixture drafters (boundary- and output-numbered) and both flag sets, and which
init `--init auto` picks. Acceptance is measured on the builtin short prompts (greedy, k=3, 16 x 64
tokens; reference loop, whose counts equal vLLM's on these fixtures), which `auto` never sees: it
chooses on other held-out windows. Goal (issue 11): the auto choice keeps >= 95 % with fc_norm alone
and >= 92 % with both flags (stretch 98 % / 95 %).

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

    tmp = Path(tempfile.mkdtemp(prefix="eaglectl-bench-upgrade-"))
    try:
        print(f"{'drafter':14} {'flags':22} {'init':11} {'AL':>6} {'kept':>7} {'auto picks':>10}")
        for name in ("eagle3", "eagle3-output"):
            base = al(str(TRAINED / name))
            print(f"{name:14} {'(source)':22} {'-':11} {base:6.3f}")
            for label, no in (("fc_norm only", False), ("fc_norm + norm_output", True)):
                auto = upgrade(str(TRAINED / name), str(tmp / f"{name}-auto-{no}"), norm_output=no, target=target,
                               to="speculators", fidelity=False).init
                for init in ("ones", "harmonic", "calibrated", "refit"):
                    dest = tmp / f"{name}-{init}-{no}"
                    upgrade(str(TRAINED / name), str(dest), init=init, norm_output=no, target=target,
                            to="speculators", fidelity=False)
                    a = al(str(dest))
                    print(f"{name:14} {label:22} {init:11} {a:6.3f} {100 * a / base:6.1f}% "
                          f"{'<- auto' if init == auto else '':>10}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
