"""How many threads torch computes with: the cores this process may use, or what the user asked for.

`configure()` runs once when the CLI starts, before any torch work (torch is imported lazily, so it
usually is not loaded yet: the count then goes into `OMP_NUM_THREADS`, which torch and its OpenMP
read when they load; if torch is loaded already, `torch.set_num_threads` is called). An
`OMP_NUM_THREADS` the user set is respected as it is.

The cores a process may use are its scheduler affinity mask (`taskset`, cpusets, Slurm, Kubernetes
CPU pinning), narrowed by a CPU quota (`docker --cpus`, a cgroup `cpu.max`): more OpenMP threads
than cores makes them spin against each other, which on a loaded 2-core machine cost minutes.

A vLLM worker (`smoke`, `capture`) runs in its own interpreter and sizes its own threads; the
`OMP_NUM_THREADS` eaglectl chose for itself is not passed to it (`worker_env`), and when eaglectl
computes while the worker runs, the worker gets the cores eaglectl leaves free.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

VAR = "OMP_NUM_THREADS"
_state: dict[str, object] = {}  # "user": the user's OMP_NUM_THREADS (None: unset); "threads": eaglectl's count


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
    """Set torch's intra-op threads once per process; returns the count. Idempotent."""
    if "threads" in _state:
        return int(_state["threads"])  # type: ignore[call-overload]
    user = user_threads()
    _state["user"] = os.environ.get(VAR)
    n = user if user is not None else cores()
    _state["threads"] = n
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
    elif user is None:
        os.environ[VAR] = str(n)  # read by torch's OpenMP when it loads
    return n


def worker_env(env: dict[str, str], busy: int = 0) -> dict[str, str]:
    """The environment for a worker process (vLLM): the user's OMP_NUM_THREADS if they set one, else none
    (the worker sizes its own threads) — or, when eaglectl keeps `busy` threads computing beside it,
    the cores left over (at least 1)."""
    out = dict(env)
    user = _state["user"] if "threads" in _state else os.environ.get(VAR)  # not ours to change
    if user is not None:
        out[VAR] = str(user)
        return out
    out.pop(VAR, None)
    if busy:
        out[VAR] = str(max(1, cores() - busy))
    return out


def reset() -> None:
    """Forget the configured count (tests)."""
    if "threads" in _state and _state.get("user") is None and os.environ.get(VAR) == str(_state["threads"]):
        os.environ.pop(VAR, None)
    _state.clear()
