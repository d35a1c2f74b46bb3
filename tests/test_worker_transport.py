"""An engine's reading worker is untrusted: whatever it does (stalls halfway through a line, closes its answer pipe
and runs on, answers garbage or an endless line, dies after a huge log, outlives a killed eaglectl), eaglectl
ends it within the question's timeout with its own error naming the log, reads nothing unbounded, and leaves no
process behind. Each stand-in worker below is one misbehaviour found from outside (issue: hostile input, round 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eaglectl.engines import engine_process
from eaglectl.engines.engine_process import WorkerSession, engine_timeout
from eaglectl.engines.process_group import group_members
from eaglectl.errors import MissingDependencyError, UsageError
from eaglectl.limits import LIMITS, Limit

from .conftest import ROOT

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")

# each serves like workers/vllm_reading.py (`--serve FD IDLE_S`, a request per stdin line) and misbehaves once asked
_HEAD = """
import os, sys, time
fd = int(sys.argv[sys.argv.index("--serve") + 1])
sys.stdin.readline()
out = os.fdopen(fd, "wb", buffering=0)
"""
MODES = {
    "half a line, then silence": 'out.write(b\'{"ok": tr\'); time.sleep(600)',
    "the answer pipe closed, running on": "out.close(); time.sleep(600)",
    "not JSON": "out.write(b'vLLM says hello\\n'); time.sleep(600)",
    "JSON 200,000 levels deep": "out.write(b'[' * 200000 + b']' * 200000 + b'\\n'); time.sleep(600)",
    "a list": "out.write(b'[1, 2]\\n'); time.sleep(600)",
    "null": "out.write(b'null\\n'); time.sleep(600)",
    "a line that never ends": "chunk = b'x' * 65536\nwhile True:\n    out.write(chunk)",
    "a huge log, then death": "sys.stdout.write('log line\\n' * 2_000_000); sys.stdout.flush(); os._exit(3)",
}


def _session(tmp_path: Path, body: str) -> WorkerSession:
    script = tmp_path / "hostile.py"
    script.write_text(_HEAD + body + "\n")
    session = WorkerSession(sys.executable, script)
    session.grace_s = 1.0
    return session


@pytest.mark.parametrize("mode", list(MODES))
def test_a_misbehaving_worker_is_ended_with_an_error_naming_its_log(mode, tmp_path, monkeypatch):
    monkeypatch.setitem(LIMITS, "engine_answer_bytes", Limit(1 << 20, "test"))
    session = _session(tmp_path, MODES[mode])
    t0 = time.monotonic()
    with pytest.raises(MissingDependencyError) as e:
        session.ask({"requests": []}, timeout_s=5.0)
    assert time.monotonic() - t0 < 30
    assert str(session.log_path) in e.value.message and "\n" not in e.value.message
    assert not session.alive and group_members(session.proc.pid) == []
    if mode == "a huge log, then death":
        assert "exited with 3" in e.value.message and len(e.value.hint or "") < 2000


def test_the_log_tail_reads_only_the_end_of_the_log(tmp_path, monkeypatch):
    log = tmp_path / "vllm.log"
    log.write_bytes(b"early line\n" * 100_000 + b"the last line\n")
    monkeypatch.setitem(LIMITS, "log_tail_bytes", Limit(64, "test"))
    reads = []
    real_open = Path.open

    def counting(self, mode="r", *a, **k):  # type: ignore[no-untyped-def]
        f = real_open(self, mode, *a, **k)
        real_read = f.read
        f.read = lambda *x: reads.append(len(got := real_read(*x))) or got  # type: ignore[method-assign]
        return f

    monkeypatch.setattr(Path, "open", counting)
    tail = engine_process._tail(log)
    assert tail.endswith("the last line") and reads and max(reads) <= 64


def test_engine_timeout_only_lowers_the_limit_and_refuses_garbage(monkeypatch):
    monkeypatch.delenv("EAGLECTL_ENGINE_TIMEOUT", raising=False)
    assert engine_timeout() == LIMITS["engine_answer_s"].value
    monkeypatch.setenv("EAGLECTL_ENGINE_TIMEOUT", "20")
    assert engine_timeout() == 20.0
    monkeypatch.setenv("EAGLECTL_ENGINE_TIMEOUT", "1e9")
    assert engine_timeout() == LIMITS["engine_answer_s"].value
    for bad in ("0", "-3", "nan", "inf", "soon", "٢٠"):
        monkeypatch.setenv("EAGLECTL_ENGINE_TIMEOUT", bad)
        with pytest.raises(UsageError, match="EAGLECTL_ENGINE_TIMEOUT"):
            engine_timeout()


# a process that starts a serving worker (which starts a child of its own), says their pids, then waits to be killed
KILLED = """
import sys, time
from eaglectl.engines.engine_process import WorkerSession
from pathlib import Path
session = WorkerSession(sys.executable, Path(sys.argv[1]))
deadline = time.monotonic() + 30
while not session.log_path.read_text().strip() and time.monotonic() < deadline:
    time.sleep(0.05)
print(session.proc.pid, session.log_path.read_text().split()[0], flush=True)
time.sleep(600)
"""
CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_eaglectl_takes_its_worker_and_the_workers_children_with_it(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    parent = subprocess.Popen([sys.executable, "-c", KILLED, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert parent.stdout is not None
    worker, child = (int(x) for x in parent.stdout.readline().split())
    assert group_members(worker) and _alive(child)
    parent.send_signal(signal.SIGKILL)  # no atexit, no cleanup of eaglectl's runs
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 20
    while (group_members(worker) or _alive(child)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_members(worker) and not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
