"""What users see, pinned: the outputs of eaglectl's commands on the fixtures.

Two uses:

    python tests/compare_outputs.py REV        # by hand: every command run with the working tree and with REV
    python tests/compare_outputs.py --record   # record RECORDED's outputs into tests/recorded/ (after a change
                                               # that is meant to change them; review the diff)

`tests/test_recorded_outputs.py` runs RECORDED in CI and compares each output with its recording byte for byte, so
a refactor that changes what a command prints is seen. RECORDED holds only outputs no machine changes: no number
from a kernel, a thread count or a library version (nothing runs the reference drafter or a target); paths, the
scratch folder, durations and eaglectl's version are masked. vLLM is not asked (its runner tables answer), so no
vLLM version enters the outputs. The REV comparison runs more (it compares on one machine).
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
RECORDINGS = ROOT / "tests" / "recorded"
# measured durations differ run to run; everything else must not
# (also inside JSON held in a string, where the quotes are escaped: a safetensors metadata record)
_TIMES = re.compile(r'(\\?"(?:seconds|wall_s|elapsed_s|generate_seconds)\\?"): [0-9.e+-]+')
HELP = ("inspect", "convert", "upgrade", "verify", "diff", "smoke", "check", "upload", "capture", "drift", "formats",
        "rules", "completion")


def _drafters() -> list[str]:
    drafters = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fixtures" / "drafters").iterdir() if p.is_dir())
    return drafters + [f"{TRAINED}/{n}" for n in ("eagle3", "eagle3-output", "eagle3.1", "eagle3.1-mla", "field-swa",
                                                   "field-layers2", "field-aux4", "peagle")]


def recorded(tmp: Path) -> list[list[str]]:
    """The commands whose outputs are recorded: header-only, planned or listed; nothing runs weights."""
    out: list[list[str]] = []
    for d in _drafters():
        out += [["inspect", d, "--json", "--allow-pickle"], ["inspect", d, "--allow-pickle"],
                ["convert", d, str(tmp / "x"), "--to", "speculators", "--dry-run", "--no-measure", "--json",
                 "--allow-pickle", "--target", f"{TRAINED}/target"],
                ["diff", d, f"{TRAINED}/eagle3", "--no-values", "--json", "--allow-pickle"]]
    families = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fixtures" / "families").iterdir() if p.is_dir())
    for f in [*families, f"{TRAINED}/dflash"]:
        out += [["inspect", f, "--json"], ["inspect", f]]
    out += [["inspect", f"{TRAINED}/eagle3", "--target", f"{TRAINED}/target", "--no-measure", "--json"],
            ["inspect", f"{TRAINED}/eagle3", "--target", f"{TRAINED}/target", "--no-measure"],
            ["inspect", f"{TRAINED}/eagle3", "--for", "sglang"],
            ["convert", f"{TRAINED}/eagle3", str(tmp / "y"), "--for", "vllm", "--dry-run", "--no-measure", "--json",
             "--target", f"{TRAINED}/target"],
            ["convert", f"{TRAINED}/dflash", str(tmp / "z"), "--to", "dflash-speculators", "--dry-run", "--json",
             "--base-model", "org/target"],
            ["formats", "--json"], ["rules", "--json"], ["formats"], ["rules"], ["--help"]]
    out += [[command, "--help"] for command in HELP]
    return out


def commands(tmp: Path) -> list[list[str]]:
    """The REV comparison: the recorded commands and those whose numbers come from running weights here."""
    return recorded(tmp) + [
        ["inspect", f"{TRAINED}/eagle3", "--target", f"{TRAINED}/target", "--json"],
        ["convert", f"{TRAINED}/eagle3", str(tmp / "y"), "--to", "speculators", "--target", f"{TRAINED}/target",
         "--dry-run", "--json"],
        ["upgrade", f"{TRAINED}/eagle3", str(tmp / "z"), "--to", "speculators", "--target", f"{TRAINED}/target",
         "--dry-run", "--json"],
        ["verify", f"{TRAINED}/eagle3", "--tokens", "8", "--steps", "2", "--json"],
        ["smoke", f"{TRAINED}/eagle3", "--target", f"{TRAINED}/target", "--engine", "reference",
         "--num-prompts", "2", "--max-tokens", "16", "--json"],
        ["check", "fixtures/drafters/speculators-3", "--no-card", "--json"]]


def environment(tree: Path, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLECTL_", "COLUMNS", "LINES"))}
    # a fixed path named in a note: its length does not move a line break
    return {**env, "PYTHONPATH": str(tree), "EAGLECTL_VLLM_PYTHON": "/no-vllm/python", "COLUMNS": "100",
            "NO_COLOR": "1", "TERM": "dumb", "EAGLECTL_CACHE_DIR": str(tmp / "cache")}


def run(argv: list[str], tree: Path, tmp: Path) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "eaglectl", *argv], capture_output=True, text=True, cwd=ROOT,
                       env=environment(tree, tmp), timeout=900)
    return r.returncode, _TIMES.sub(r"\1: 0", r.stdout)


def masked(text: str, tmp: Path) -> str:
    """What no machine changes: the repository and scratch paths and eaglectl's version masked."""
    from eaglectl import __version__

    for path, name in ((tmp, "<tmp>"), (ROOT, "<root>")):
        text = text.replace(json.dumps(str(path))[1:-1], name).replace(str(path), name)
    return text.replace(__version__, "<version>")


def recording_name(argv: list[str]) -> str:
    """A file name for a command line: its words (a scratch path, the only absolute one, left out), path separators
    and odd characters as '_'."""
    words = [a for a in argv if not os.path.isabs(a)]
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", " ".join(words)).strip("_")[:150] + ".txt"


def recording(code: int, stdout: str) -> str:
    return f"exit {code}\n{stdout}"


def record() -> int:
    if RECORDINGS.exists():
        shutil.rmtree(RECORDINGS)
    RECORDINGS.mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        for argv in recorded(Path(tmp)):
            code, out = run(argv, ROOT, Path(tmp))
            (RECORDINGS / recording_name(argv)).write_text(recording(code, masked(out, Path(tmp))))
    print(f"{len(list(RECORDINGS.iterdir()))} outputs recorded in {RECORDINGS.relative_to(ROOT)}")
    return 0


def compare(rev: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "-f", "--detach", str(before), rev], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            argvs = commands(Path(tmp))
            old = [run(a, before, Path(tmp)) for a in argvs]
            new = [run(a, ROOT, Path(tmp)) for a in argvs]
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, capture_output=True)
            shutil.rmtree(before, ignore_errors=True)
    differ = [(argv, a, b) for argv, a, b in zip(commands(Path("TMP")), old, new, strict=True) if a != b]
    for argv, a, b in differ:
        print(json.dumps({"command": argv, "before_exit": a[0], "after_exit": b[0], "same_stdout": a[1] == b[1]}))
    print(f"{len(old) - len(differ)} of {len(old)} outputs identical to {rev}")
    return 1 if differ else 0


if __name__ == "__main__":
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    raise SystemExit(record() if sys.argv[1:] == ["--record"] else compare(rev))
