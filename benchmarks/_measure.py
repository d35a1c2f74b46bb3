"""Shared by the benchmarks: run a Python snippet in a fresh process and read its wall time, CPU time and peak RSS.

Peak RSS is the child's own VmHWM at exit, printed by an atexit hook: rusage's ru_maxrss would include
the parent's memory copied at fork time (Linux keeps maxrss across exec). CPU time (user + system of the child and
its own children) is what to compare on a shared machine: other processes stretch wall time, not CPU time.

Cold and warm (`readings_cache`): eaglectl keeps what vLLM answered for a config in its readings cache
(engines/asking.py `cache_dir`, EAGLECTL_CACHE_DIR); a cold run gets an empty one, a warm run the one an
earlier run filled.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
HWM = ("import atexit, sys\n"
       "def _hwm():\n"
       "    line = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
       "    sys.stderr.write('VMHWM ' + line.split()[1] + '\\n')\n"
       "atexit.register(_hwm)\n")


# as an installed tool runs: with its bytecode cached (some machines set PYTHONDONTWRITEBYTECODE, which makes every
# process compile eaglectl's ~150 modules again, ~0.2 s)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


class Run(NamedTuple):
    wall: float  # seconds
    rss: float  # peak MB
    stdout: str
    cpu: float  # CPU seconds (user + system), the process and its children


def run(python: str, code: str, *args: str, ok_codes: tuple[int, ...] = (0,), sync: bool = False) -> Run:
    """One fresh `python -c HWM+code args...`: its Run."""
    if sync:
        subprocess.run(["sync"], check=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run([python, "-c", HWM + code, *args], capture_output=True, text=True, cwd=ROOT, env=ENV)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in ok_codes or "VMHWM" not in r.stderr:
        raise SystemExit(f"{args} failed ({r.returncode}): {r.stderr[-2000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Run(wall, int(r.stderr.rsplit("VMHWM ", 1)[1].split()[0]) / 1024, r.stdout, cpu)


def measure(python: str, code: str, *args: str, ok_codes: tuple[int, ...] = (0,), sync: bool = False
            ) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of `python -c HWM+code args...`."""
    wall, rss, stdout, _ = run(python, code, *args, ok_codes=ok_codes, sync=sync)
    return wall, rss, stdout


def timed(argv: list[str], sync: bool = False) -> Run:
    """A command that is not Python (a baseline such as `cat` + `sync`, another tool's CLI): its Run, without peak
    RSS (nan: no hook in it)."""
    if sync:
        subprocess.run(["sync"], check=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=ENV)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(f"{argv[:3]} failed ({r.returncode}): {r.stderr[-2000:]}")
    return Run(wall, float("nan"), r.stdout, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


@contextmanager
def readings_cache(cold: bool, shared: Path) -> Iterator[None]:
    """Runs inside see an empty readings cache (`cold`) or `shared`, kept from earlier warm runs."""
    previous = ENV.get("EAGLECTL_CACHE_DIR")
    with tempfile.TemporaryDirectory() as empty:
        ENV["EAGLECTL_CACHE_DIR"] = empty if cold else str(shared)
        try:
            yield
        finally:
            if previous is None:
                ENV.pop("EAGLECTL_CACHE_DIR", None)
            else:
                ENV["EAGLECTL_CACHE_DIR"] = previous


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
