"""torch's threads follow OMP_NUM_THREADS or the cores the process may use; vLLM workers leave no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eaglectl import threads
from eaglectl.commands.smoke.command import WorkerRun
from eaglectl.engines.process_group import group_members
from eaglectl.errors import SmokeFailedError

from .conftest import ROOT

# a fresh interpreter: torch must not be loaded yet, as at the start of the CLI
PROBE = """
import json, os, sys
if sys.argv[1] != "all":
    os.sched_setaffinity(0, {int(sys.argv[1])})
from click.testing import CliRunner
from eaglectl.cli.app import cli
assert "torch" not in sys.modules
r = CliRunner().invoke(cli, ["rules", "fc-norm-weights-without-flag"])
assert r.exit_code == 0, r.output
import torch
from eaglectl.threads import worker_env
worker = {k: v for k, v in worker_env(dict(os.environ)).items() if k.startswith(("OMP_", "OPENBLAS_"))}
print(json.dumps({"torch": torch.get_num_threads(), "env": os.environ.get("OMP_NUM_THREADS"),
                  "cores": len(os.sched_getaffinity(0)), "wait": os.environ.get("OMP_WAIT_POLICY"),
                  "blas_spin": os.environ.get("OPENBLAS_THREAD_TIMEOUT"), "worker": worker}))
"""


def _probe(cpu: str, omp: str | None, wait: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                                                             "OPENBLAS_THREAD_TIMEOUT")}
    env["PYTHONPATH"] = str(ROOT)
    for var, value in (("OMP_NUM_THREADS", omp), ("OMP_WAIT_POLICY", wait)):
        if value is not None:
            env[var] = value
    r = subprocess.run([sys.executable, "-c", PROBE, cpu], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no affinity masks here")
def test_the_cli_sizes_torch_to_the_affinity_mask_and_respects_omp_num_threads():
    cpu = str(min(os.sched_getaffinity(0)))
    pinned = _probe(cpu, None)  # one core allowed: one thread, whatever the machine has
    # eaglectl's own choices do not reach a vLLM worker (it sizes its own threads)
    # numpy's OpenBLAS threads sleep as soon as they idle (they would spin ~0.1 CPU-s each as numpy loads)
    assert pinned == {"torch": 1, "env": "1", "cores": 1, "wait": "PASSIVE", "blas_spin": "4", "worker": {}}
    free = _probe("all", None)
    assert free["torch"] == free["cores"] == threads.cores() and free["env"] == str(free["cores"])
    want = min(2, os.cpu_count() or 1)  # torch caps OMP_NUM_THREADS at the machine's CPUs
    user = _probe(cpu, str(want), "ACTIVE")  # the user's values win, even beyond the mask
    assert user == {"torch": want, "env": str(want), "cores": 1, "wait": "ACTIVE", "blas_spin": "4",
                    "worker": {"OMP_NUM_THREADS": str(want), "OMP_WAIT_POLICY": "ACTIVE"}}


def test_a_cpu_quota_caps_the_cores(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # cgroup v2: 1.5 CPUs
    assert threads.cpu_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cpu_quota(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cpu_quota(v1) == 2.0
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cpu_quota(v1) is None


@pytest.mark.parametrize("value,count", [("4", 4), ("2,1", 2), ("0", None), ("many", None), ("", None)])
def test_omp_num_threads_is_read_as_openmp_reads_it(value, count):
    assert threads.user_threads({"OMP_NUM_THREADS": value}) == count


def test_a_worker_beside_eaglectls_own_work_gets_the_cores_left(monkeypatch):
    import torch

    before = torch.get_num_threads()
    threads.reset()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert threads.configure() == threads.cores() == torch.get_num_threads()  # torch is loaded: set directly
        assert "OMP_NUM_THREADS" not in threads.worker_env(dict(os.environ))
        assert threads.worker_env(dict(os.environ), busy=1)["OMP_NUM_THREADS"] == str(max(1, threads.cores() - 1))
        threads.reset()
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert threads.configure() == 1
        assert threads.worker_env(dict(os.environ))["OMP_NUM_THREADS"] == "1"
        assert threads.worker_env(dict(os.environ), busy=1)["OMP_NUM_THREADS"] == "1"
    finally:
        threads.reset()
        torch.set_num_threads(before)


# ------------------------------------------------------------------------- no orphaned workers

# a worker that starts a child of its own (as vLLM starts its EngineCore), then waits or exits
FAMILY = """
import subprocess, sys, time, json
req = json.load(open(sys.argv[1]))
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "time.sleep(600)"])
open(req["pid_file"], "w").write(str(child.pid))
if req["exit"]:
    json.dump({"ok": True}, open(sys.argv[2], "w"))
    sys.exit(0)  # the child is left running, as a crashed or careless worker leaves it
time.sleep(600)
"""


def _worker(tmp_path, exit_at_once: bool, timeout_s: float) -> tuple[WorkerRun, int]:
    script = tmp_path / "family.py"
    script.write_text(FAMILY)
    pid_file = tmp_path / "child.pid"
    run = WorkerRun(sys.executable, {"pid_file": str(pid_file), "exit": exit_at_once}, timeout_s, worker=script)
    run.grace_s = 1.0
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return run, int(pid_file.read_text())


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_timed_out_worker_takes_its_children_with_it(tmp_path):
    run, child = _worker(tmp_path, exit_at_once=False, timeout_s=1.0)
    assert len(group_members(run.proc.pid)) == 2
    with pytest.raises(SmokeFailedError, match="did not finish within"):
        run.result()
    assert group_members(run.proc.pid) == [] and _gone(child)  # SIGTERM ignored: SIGKILL after the grace period


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_worker_that_exits_leaves_no_child_running(tmp_path):
    run, child = _worker(tmp_path, exit_at_once=True, timeout_s=60)
    result, _ = run.result()
    assert result == {"ok": True} and group_members(run.proc.pid) == [] and _gone(child)


# a serving worker that starts a child of its own, then never answers
SILENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_serving_worker_that_does_not_answer_takes_its_children_with_it(tmp_path):
    from eaglectl.engines.engine_process import WorkerSession
    from eaglectl.errors import MissingDependencyError

    script = tmp_path / "silent.py"
    script.write_text(SILENT)
    session = WorkerSession(sys.executable, script)
    session.grace_s = 1.0
    log = session.log_path
    deadline = time.monotonic() + 30
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(log.read_text().split()[0])
    with pytest.raises(MissingDependencyError, match="did not answer within"):
        session.ask({"requests": []}, timeout_s=1.0)
    assert group_members(session.proc.pid) == [] and _gone(child) and not session.exited
    assert log.exists()  # a failure names its log: kept


def test_the_reading_worker_serves_until_its_input_closes_or_it_idles(tmp_path):
    """The real reading worker, in an interpreter without vLLM: each request is answered on its own line (vLLM's
    absence is an answer, not a crash), it stays up between requests, and it stops when its stdin closes or after
    its idle time."""
    from eaglectl.engines.asking import WORKER
    from eaglectl.engines.engine_process import WorkerSession

    session = WorkerSession(sys.executable, WORKER, idle_s=600)
    for _ in range(2):
        raw = session.ask({"requests": []}, timeout_s=60)
        assert raw["ok"] is False and "vllm" in raw["error"] and session.alive
    session.close()
    assert not session.alive and not session.tmp.exists()
    idle = WorkerSession(sys.executable, WORKER, idle_s=0.5)
    idle.proc.wait(timeout=30)  # no request within its idle time: it stops by itself
    assert idle.proc.returncode == 0
    idle.close()


def test_an_engine_worker_starts_with_no_reading_worker_beside_it(tmp_path):
    """An engine (smoke, capture) sizes itself by the memory it finds free: the reading worker this process kept
    running is ended before an engine worker starts, and the next question starts a new one."""
    from eaglectl.engines import engine_process
    from eaglectl.engines.asking import WORKER

    reading, running = engine_process.session(sys.executable, WORKER)
    assert not running and reading.alive and engine_process.session(sys.executable, WORKER) == (reading, True)
    run, child = _worker(tmp_path, exit_at_once=True, timeout_s=60)
    assert not reading.alive and not engine_process.session_running(sys.executable, WORKER)
    run.result()
    assert _gone(child)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_timeout_while_vllm_loads_leaves_no_engine_behind(vllm_py, vllm_default_processes):
    """vLLM's EngineCore (and its worker) are children of our worker: the timeout must end them too."""
    from eaglectl.commands.smoke.command import engine_path

    from .test_smoke import TARGET

    python = vllm_py
    request = {"target": engine_path(str(TARGET)), "dtype": "float32", "max_model_len": 256, "seed": 0,
               "kv_cache_gib": 1, "tensor_parallel_size": 1, "max_tokens": 8, "concurrency": [1],
               "prompts": [[1, 2, 3, 4]], "groups": [], "configs": [{"name": "none", "speculative_config": None}]}
    run = WorkerRun(python, request, timeout_s=600)
    engines: list[int] = []

    def engine_started() -> int:  # once vLLM's EngineCore runs (loading the model), time out at the next tick
        for pid in group_members(run.proc.pid):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"EngineCore" in title and pid not in engines:
                engines.append(pid)
                run.timeout_s = 0
        return 0

    with pytest.raises(SmokeFailedError, match="did not finish within"):
        for _ in run.ticks(engine_started):
            pass
    assert engines  # the engine was running beside the worker when the timeout fired
    assert group_members(run.proc.pid) == [] and all(_gone(pid) for pid in engines)
