"""Worker processes that leave nothing behind: each runs in its own session, and the whole session is ended.

A vLLM worker starts children of its own (`EngineCore`, its `VLLM::Worker`); killing the worker alone
leaves them running, reparented to PID 1 and holding their memory. Started with
`start_new_session=True`, the worker and every process it starts share one process group (the
worker's pid), and `stop_group` ends all of them: SIGTERM, then SIGKILL for whatever is still there
after a grace period. It is called when a worker times out, when the caller is interrupted or fails,
and after a worker that exited by itself (its children must not outlive it either).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, from /proc; elsewhere, [pgid] while it can be signalled."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


def stop_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """End `proc` and its group as the module says (`grace_s` seconds between SIGTERM and SIGKILL). Reaps
    `proc`; returns at once when nothing is left."""
    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        proc.poll()  # reap an exited worker, so its zombie does not count
        if not group_members(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()
            if not group_members(pgid):
                break
            time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
