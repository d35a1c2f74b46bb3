"""Progress on stderr for long steps: shown on a terminal (NO_COLOR or not), never with --json or -q."""

from __future__ import annotations

import sys

import pytest

from eaglectl.cli import report
from eaglectl.commands.smoke.command import WorkerRun, _configs_done

from .conftest import ROOT


def test_no_color_keeps_progress_on_a_terminal(monkeypatch):
    from rich.console import Console

    monkeypatch.setenv("NO_COLOR", "1")
    console = Console(stderr=True, force_terminal=True)
    monkeypatch.setattr(report, "stderr", console)
    report.SETTINGS.reset()
    assert console.no_color and report.progress_enabled()
    report.SETTINGS.json = True
    assert not report.progress_enabled()
    report.SETTINGS.reset(verbosity=-1)
    assert not report.progress_enabled()
    report.SETTINGS.reset()


@pytest.mark.parametrize("args", [
    ["smoke", "fixtures/trained/eagle3", "--target", "fixtures/trained/target", "--engine", "reference",
     "--num-prompts", "2", "--max-tokens", "4"],
    ["upgrade", "fixtures/drafters/speculators-3", "{tmp}/u", "--init", "calibrated", "--target",
     "fixtures/target-llama", "--no-fidelity"],
    ["verify", "fixtures/trained/eagle3", "--target", "fixtures/trained/target", "--tokens", "8", "--steps", "1"],
])
def test_long_steps_report_progress(invoke, monkeypatch, tmp_path, args):
    """Every long step goes through report.progress (shown on a terminal; counted here)."""
    monkeypatch.chdir(ROOT)
    seen: list[tuple[str, int]] = []
    real = report.progress

    def counting(items, *, label, **kw):
        n = 0
        for item in real(items, label=label, **kw):
            n += 1
            yield item
        seen.append((label, n))

    monkeypatch.setattr(report, "progress", counting)
    r = invoke(*[a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 0, r.stderr
    assert seen and all(n > 0 for _, n in seen), seen


def test_vllm_worker_progress_follows_its_result_file(tmp_path):
    """The smoke worker rewrites result.json after each configuration; ticks() reports the growth."""
    worker = tmp_path / "fake_worker.py"
    worker.write_text("""import json, sys, time
out = {"configs": []}
for i in range(3):
    time.sleep(0.3)
    out["configs"].append({"i": i})
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
time.sleep(0.3)
""")
    run = WorkerRun(sys.executable, {}, timeout_s=60, worker=worker)
    grew = list(run.ticks(lambda: _configs_done(run.res_path), every_s=0.05))
    doc, _ = run.result()
    assert sum(grew) == 3 and len(grew) >= 2 and len(doc["configs"]) == 3


def test_off_a_terminal_a_long_step_still_prints_a_line(monkeypatch, capsys):
    """CI logs: stderr is no terminal, yet a measurement prints a plain line at least every HEARTBEAT_S, even
    while one item takes longer than that (a thread keeps the beat); --json too (its document is on stdout),
    none with -q."""
    import time

    from rich.console import Console

    console = Console(stderr=True, force_terminal=False)
    monkeypatch.setattr(report, "stderr", console)
    monkeypatch.setattr(report, "HEARTBEAT_S", 0.05)
    report.SETTINGS.reset()
    for _ in report.progress(range(2), label="measuring", total=2):
        time.sleep(0.3)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("measuring: ")]
    assert len(lines) >= 4 and lines[0].startswith("measuring: 0 of 2 after") and " of 2 after " in lines[-1]
    assert any("s left" in x for x in lines)  # an ETA once an item is done
    report.SETTINGS.json = True
    for _ in report.progress(range(1), label="measuring", total=1):
        time.sleep(0.3)
    assert "measuring: 0 of 1 after" in capsys.readouterr().err
    report.SETTINGS.reset(verbosity=-1)
    for _ in report.progress(range(1), label="measuring", total=1):
        time.sleep(0.2)
    assert "measuring" not in capsys.readouterr().err
    report.SETTINGS.reset()


def test_the_estimate_leaves_out_the_first_items_start_up():
    """The first item also pays for start-up (vLLM's worker, a model load): the time left is estimated from the
    items after it, so the estimate does not jump as the steady items come in (the demo's smoke: 283 -> 433 ->
    233 s)."""
    pulse = report.Pulse()
    entry = {"label": "smoke (vLLM): configurations", "total": 6, "done": 3, "counted": True, "started": 0.0,
             "first": (100.0, 1)}  # 100 s to start and run the first, 10 s each after it
    pulse.steps.append(entry)
    assert pulse.line(120.0).endswith(": 3 of 6 after 120 s, about 30 s left")
    entry["first"], entry["done"] = (100.0, 1), 1  # one item done: nothing better than the mean yet
    assert pulse.line(100.0).endswith(": 1 of 6 after 100 s, about 500 s left")
