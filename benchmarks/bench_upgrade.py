"""Benchmark: what each `upgrade --init` keeps of an EAGLE-3 drafter's acceptance length before any fine-tuning,
on prompts the tool never saw, measured by the engine; whether the AL `upgrade --prompts` prints is the one the
engine measures; and what `--init auto` picks, with its printed interval.

Drafters: the two trained EAGLE-3 fixtures (`eagle3` boundary-numbered, `eagle3-output` output-numbered
SpecForge) and, when they exist, two drafters the tests never see: `heldout` (benchmarks/train_heldout_drafter.py:
other layers, seeds and data) and `mla-3.0` (benchmarks/train_mla30_drafter.py: an MLA drafter trained as EAGLE-3
on the MLA fixture target; the committed MLA drafter is 3.1-trained, and without its fc_norm it is at chance).
Both flag sets; every init, written `--to speculators` (vLLM's own format;
`--to modelopt` for MLA, which speculators cannot hold).

Evaluation prompts (the user's own): 48 windows of 64 tokens of the bundled held-out code at seed 101, which
calibration, the probe, the ranking (seed 3) and `fit` (seed 5) never read. `upgrade --prompts EVAL
--num-prompts 16` reports on the first 16 (the engine measures those: REPORT), ranks on the next 16 and
calibrates and fits on the last 16. The source's AL is that of its function-preserving speculators conversion
(the drafter as trained, read at its measured layers: a SpecForge file's own ids are misread by vLLM, which is
not what upgrade changes).

For every forced init, `upgrade --prompts EVAL` prints the AL after; the table gives the engine's AL on REPORT
and whether the two are equal. `auto` runs twice: without --prompts (the bundled kinds of text; the table says
whether the engine's AL on REPORT lies in the 95 % interval it printed) and with --prompts EVAL ("auto, yours":
what a user who passes their prompts gets).

    flock /tmp/eaglectl-heavy.lock python benchmarks/bench_upgrade.py --engine vllm [--markdown]

Goals: the default init keeps >= 95 % with fc_norm alone and >= 92 % with both flags (issue 21); with the
user's prompts, >= 96 % and >= 93 % (issue 46).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import library  # noqa: E402

from eaglectl.commands.requests import Baseline  # noqa: E402
from eaglectl.commands.upgrade.inits import INITS  # noqa: E402
from eaglectl.measure.workload import heldout_prompts, tokenizer_of  # noqa: E402

convert, smoke, upgrade = library("convert"), library("smoke"), library("upgrade")

TRAINED = ROOT / "fixtures" / "trained"
WORK = ROOT / "benchmarks" / "_work"
# drafters the tests never see, each trained by its script: (folder, script)
UNSEEN = {"heldout": (WORK / "heldout-drafter", "train_heldout_drafter.py"),
          "mla-3.0": (WORK / "mla-3.0-drafter", "train_mla30_drafter.py")}
EVAL_SEED, EVAL_PROMPTS, EVAL_TOKENS = 101, 16, 64  # EVAL_PROMPTS reported on, of 3 x as many in the file


def eval_prompts(target: Path, path: Path) -> Path:
    ps = heldout_prompts(tokenizer_of(str(target)), 3 * EVAL_PROMPTS, 64, seed=EVAL_SEED)
    path.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in ps))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="reference", choices=["reference", "vllm"])
    ap.add_argument("--drafters", default="eagle3,eagle3-output,mla-3.0,heldout")
    ap.add_argument("--inits", default=",".join(INITS))
    ap.add_argument("--markdown", action="store_true", help="print the docs/upgrade.md table at the end")
    ap.add_argument("--json", type=Path, help="write every row here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="eaglectl-bench-upgrade-"))
    rows: list[dict] = []
    try:
        for name in args.drafters.split(","):
            src, script = UNSEEN.get(name, (TRAINED / name, None))
            if not src.exists():
                print(f"(no {name} drafter: run benchmarks/{script} first)", flush=True)
                continue
            target = TRAINED / ("target-mla" if "mla" in name else "target")
            to = "modelopt" if "mla" in name else "speculators"  # speculators cannot hold MLA
            prompts = eval_prompts(target, tmp / f"eval-{target.name}.jsonl")
            t0 = time.time()
            trained = tmp / f"{name}-source"
            convert(str(src), str(trained), to, target=str(target))
            variants: list[tuple[str, str, Path, dict]] = []
            for label, no in (("fc_norm only", False), ("fc_norm + norm_output", True)):
                for init in [*args.inits.split(","), "auto", "auto, yours"]:
                    dest = tmp / f"{name}-{init.replace(', ', '-')}-{no}"
                    bundled = init == "auto"
                    res = upgrade(str(src), str(dest), init=init.split(",")[0], norm_output=no, target=str(target),
                                  to=to, fidelity=False, prompts=None if bundled else str(prompts),
                                  num_prompts=EVAL_PROMPTS, max_tokens=EVAL_TOKENS)
                    variants.append((label, init, dest, res.to_json()))
            print(f"{name}: {len(variants)} upgrades in {time.time() - t0:.0f} s", flush=True)
            rep = smoke(str(trained), str(target), engine=args.engine, k=3, prompts=str(prompts),
                        num_prompts=EVAL_PROMPTS, max_tokens=EVAL_TOKENS, concurrency=(1,), preflight=False,
                        baselines=[Baseline(f"eagle3:{d}", "eagle3", str(d)) for _, _, d, _ in variants]).to_json()
            base = rep["mean_acceptance_length"]
            measured = {b["name"]: b["mean_acceptance_length"] for b in rep["baselines"]}
            print(f"{name:14} {'(source)':22} {'-':11} engine AL {base:6.3f}", flush=True)
            for label, init, dest, doc in variants:
                al = measured[f"eagle3:{dest}"]
                acc = doc["acceptance"]
                shown = init if "auto" not in init else f"{init} ({doc['init']})"
                row = {"drafter": name, "flags": label, "init": shown,
                       "source_al": round(base, 4), "engine_al": round(al, 4), "kept": round(al / base, 4),
                       "printed_after": acc["after"], "printed_kept": acc["kept"], "engine": args.engine,
                       "equal": round(al, 4) == acc["after"] if init != "auto" else None,
                       "interval": acc["interval"], "fit": doc["fit"] if doc["init"] == "fit" else None}
                if init == "auto":
                    lo, hi = acc["interval"]["after"]
                    row["inside_interval"] = lo <= al <= hi
                rows.append(row)
                extra = (f"printed {acc['after']:.3f} {'==' if row['equal'] else '!='}" if init != "auto" else
                         f"printed {acc['after']:.3f} [{acc['interval']['after'][0]:.3f}, "
                         f"{acc['interval']['after'][1]:.3f}] on its own prompts, "
                         f"{'inside' if row['inside_interval'] else 'OUTSIDE'}")
                print(f"{name:14} {label:22} {row['init']:16} engine AL {al:6.3f} {100 * al / base:6.1f}%  {extra}",
                      flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.markdown:
        print(f"\n| drafter | flags | init | {rows[0]['engine'] if rows else ''} AL | kept | printed AL | equal |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            eq = "yes" if r["equal"] else "no" if r["equal"] is False else \
                f"in [{r['interval']['after'][0]:.3f}, {r['interval']['after'][1]:.3f}]: " \
                f"{'yes' if r['inside_interval'] else 'no'}"
            print(f"| {r['drafter']} | {r['flags']} | {r['init']} | {r['engine_al']:.3f} | {100 * r['kept']:.1f}% | "
                  f"{r['printed_after']:.3f} | {eq} |")


if __name__ == "__main__":
    main()
