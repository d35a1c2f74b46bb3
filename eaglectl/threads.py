"""How many threads torch computes with: the cores this process may use, or what the user asked for.

`configure()` runs once when the CLI starts, before any torch work (torch is imported lazily, so it
usually is not loaded yet: the count then goes into `OMP_NUM_THREADS`, which torch and its OpenMP
read when they load, with `OMP_WAIT_POLICY=PASSIVE`; if torch is loaded already,
`torch.set_num_threads` is called). numpy's OpenBLAS runs its own threads (pthreads, not OpenMP): as numpy
loads they spin about 0.1 CPU-s each before they sleep, which on 2 cores is taken from the work of the command
(a conversion's copy and hash); `OPENBLAS_THREAD_TIMEOUT=4` puts them to sleep at once (`import numpy`:
0.23 -> 0.12 CPU-s on 2 cores). A variable the user set is respected as it is.

The cores a process may use are its scheduler affinity mask (`taskset`, cpusets, Slurm, Kubernetes
CPU pinning), narrowed by a CPU quota (`docker --cpus`, a cgroup `cpu.max`): more OpenMP threads
than cores makes them spin against each other, which on a loaded 2-core machine cost minutes.

A vLLM worker (`smoke`, `capture`) runs in its own interpreter and sizes its own threads (vLLM keeps
one core for itself); the variables eaglectl set for itself are not passed to it (`worker_env`), and
when eaglectl computes while the worker runs, the worker gets the cores eaglectl leaves free.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

VAR, WAIT, BLAS_SPIN = "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT"
_state: dict[str, object] = {}  # "threads": the count; "ours": the variables configure() set (not the user's)


def cores() -> int:
    """The cores this process may run on: its affinity mask, capped by a cgroup CPU quota (≥ 1)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    quota = cpu_quota()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


def cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs' worth of time the cgroup allows (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`), None if unlimited."""
    try:
        text = (root / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def user_threads(environ: dict[str, str] | os._Environ[str] | None = None) -> int | None:
    """The user's OMP_NUM_THREADS as a positive count (its first entry: OpenMP allows a nested list), else None."""
    env = os.environ if environ is None else environ
    value = env.get(VAR, "").split(",")[0].strip()
    try:
        n = int(value)
    except ValueError:
        return None
    return n if n > 0 else None


def configure() -> int:
    """Set torch's intra-op threads once per process, as the module says; returns the count. Idempotent.
    With OMP_WAIT_POLICY=PASSIVE idle OpenMP threads sleep instead of spinning, so a core another process
    keeps busy costs the threads little (README.md, "Set up and run", has the measurement)."""
    if "threads" in _state:
        return int(_state["threads"])  # type: ignore[call-overload]
    user = user_threads()
    n = user if user is not None else cores()
    ours: list[str] = []
    _state.update(threads=n, ours=ours)
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        return n
    for var, value in ((VAR, str(n)), (WAIT, "PASSIVE"), (BLAS_SPIN, "4")):  # read by OpenMP / OpenBLAS as they load
        if var not in os.environ:
            os.environ[var] = value
            ours.append(var)
    return n


def worker_env(env: dict[str, str], busy: int = 0) -> dict[str, str]:
    """The environment for a worker process (vLLM): what the user set passes through; what eaglectl set for
    itself does not (the worker sizes its own threads) — except that, when eaglectl keeps `busy` threads
    computing beside the worker, the worker gets OMP_NUM_THREADS = the cores left over (at least 1)."""
    out = dict(env)
    ours = list(_state.get("ours", []))  # type: ignore[call-overload]
    for var in ours:
        out.pop(var, None)
    if busy and VAR not in out:
        out[VAR] = str(max(1, cores() - busy))
    return out


def reset() -> None:
    """Undo `configure` (tests): the variables it set are removed, and it runs again when next called."""
    for var in _state.get("ours", []):  # type: ignore[union-attr]
        os.environ.pop(var, None)
    _state.clear()
