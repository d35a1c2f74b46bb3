"""Outputs before and after a change that should not change them (a move, a refactor): every command on every
fixture, run with the working tree and with REV, stdout and exit code compared byte for byte (timings masked).

    python tests/compare_outputs.py REV

Run by hand (it takes a few minutes on 2 cores); REV is checked out into a temporary git worktree. vLLM is not
asked (the runner tables answer), so no vLLM version enters the outputs. Exit 0 when every output is identical.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINED = "fixtures/trained"
# measured durations differ run to run; everything else must not
# (also inside JSON held in a string, where the quotes are escaped: a safetensors metadata record)
_TIMES = re.compile(r'(\\?"(?:seconds|wall_s|elapsed_s|generate_seconds)\\?"): [0-9.e+-]+')


def commands(tmp: Path) -> list[list[str]]:
    drafters = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fixtures" / "drafters").iterdir() if p.is_dir())
    drafters += [f"{TRAINED}/{n}" for n in ("eagle3", "eagle3-output", "eagle3.1", "eagle3.1-mla", "field-swa",
                                              "field-layers2", "field-aux4")]
    out: list[list[str]] = []
    for d in drafters:
        out += [["inspect", d, "--json", "--allow-pickle"], ["inspect", d, "--allow-pickle"],
                ["convert", d, str(tmp / "x"), "--to", "speculators", "--dry-run", "--no-measure", "--json",
                 "--allow-pickle", "--target", f"{TRAINED}/target"],
                ["diff", d, f"{TRAINED}/eagle3", "--no-values", "--json", "--allow-pickle"]]
    out += [["inspect", f"{TRAINED}/eagle3", "--target", f"{TRAINED}/target", "--json"],
            ["convert", f"{TRAINED}/eagle3", str(tmp / "y"), "--to", "speculators", "--target", f"{TRAINED}/target",
             "--dry-run", "--json"],
            ["upgrade", f"{TRAINED}/eagle3", str(tmp / "z"), "--to", "speculators", "--target", f"{TRAINED}/target",
             "--dry-run", "--json"],
            ["verify", f"{TRAINED}/eagle3", "--tokens", "8", "--steps", "2", "--json"],
            ["smoke", f"{TRAINED}/eagle3", "--target", f"{TRAINED}/target", "--engine", "reference",
             "--num-prompts", "2", "--max-tokens", "16", "--json"],
            ["check", "fixtures/drafters/speculators-3", "--no-card", "--json"],
            ["formats", "--json"], ["rules", "--json"]]
    return out


def run_all(tree: Path, tmp: Path) -> list[tuple[int, str]]:
    env = {**os.environ, "PYTHONPATH": str(tree), "EAGLECTL_VLLM_PYTHON": str(tmp / "no-vllm")}
    got = []
    for argv in commands(tmp):
        r = subprocess.run([sys.executable, "-m", "eaglectl", *argv], capture_output=True, text=True, cwd=ROOT,
                           env=env, timeout=900)
        got.append((r.returncode, _TIMES.sub(r"\1: 0", r.stdout)))
    return got


def main() -> int:
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "-f", "--detach", str(before), rev], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            old, new = run_all(before, Path(tmp)), run_all(ROOT, Path(tmp))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, capture_output=True)
            shutil.rmtree(before, ignore_errors=True)
    differ = [(argv, a, b) for argv, a, b in zip(commands(Path("TMP")), old, new, strict=True) if a != b]
    for argv, a, b in differ:
        print(json.dumps({"command": argv, "before_exit": a[0], "after_exit": b[0],
                          "same_stdout": a[1] == b[1]}))
    print(f"{len(old) - len(differ)} of {len(old)} outputs identical to {rev}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
