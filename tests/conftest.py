from __future__ import annotations

import os
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

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers on two cores: one thread each (oversubscribed OpenMP slows both about 5x)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def invoke(runner):
    """Run the CLI in-process; returns the click Result (stdout and stderr kept apart)."""
    from eaglectl.cli import cli

    def run(*args: str):
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)

    return run
