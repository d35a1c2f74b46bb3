"""Shared by the benchmarks: run a Python snippet in a fresh process and read its wall time and peak RSS.

Peak RSS is the child's own VmHWM at exit, printed by an atexit hook: rusage's ru_maxrss would include
the parent's memory copied at fork time (Linux keeps maxrss across exec).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HWM = ("import atexit, sys\n"
       "def _hwm():\n"
       "    line = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
       "    sys.stderr.write('VMHWM ' + line.split()[1] + '\\n')\n"
       "atexit.register(_hwm)\n")


# as an installed tool runs: with its bytecode cached (some machines set PYTHONDONTWRITEBYTECODE, which makes every
# process compile eaglectl's ~150 modules again, ~0.2 s)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def measure(python: str, code: str, *args: str, ok_codes: tuple[int, ...] = (0,), sync: bool = False
            ) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of `python -c HWM+code args...`."""
    if sync:
        subprocess.run(["sync"], check=True)
    t = time.perf_counter()
    r = subprocess.run([python, "-c", HWM + code, *args], capture_output=True, text=True, cwd=ROOT, env=ENV)
    wall = time.perf_counter() - t
    if r.returncode not in ok_codes or "VMHWM" not in r.stderr:
        raise SystemExit(f"{args} failed ({r.returncode}): {r.stderr[-2000:]}")
    return wall, int(r.stderr.rsplit("VMHWM ", 1)[1].split()[0]) / 1024, r.stdout


@contextmanager
def scratch(folder: Path, keep: bool, fresh: bool = False) -> Iterator[Path]:
    """FOLDER for one benchmark's checkpoints (`fresh`: emptied first), removed afterwards unless `keep` (--keep)."""
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        yield folder
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def work_args(description: str) -> Any:
    """--work DIR (scratch, removed afterwards unless --keep) for the benchmarks that build checkpoints."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "_work")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    return ap.parse_args()


# each command's library call takes its request (eaglectl/commands/requests.py): built here from the positional
# fields and keyword options a benchmark passes, as the command line builds it
_COMMANDS = {"convert": ("convert.command", "ConvertRequest"), "smoke": ("smoke.command", "SmokeRequest"),
             "upgrade": ("upgrade.command", "UpgradeRequest"), "verify": ("verify", "VerifyRequest")}


def library(command: str) -> Any:
    """`eaglectl <command>`'s library call, taking the request's fields as arguments."""
    import importlib

    from eaglectl.commands import requests

    module, kind = _COMMANDS[command]

    def call(*args: Any, **options: Any) -> Any:
        run = importlib.import_module(f"eaglectl.commands.{module}").run
        return run(getattr(requests, kind)(*args, **options))

    return call
