"""A CI log (issue 34, items 3 and 5): piped at 80 columns, nothing silent for long, each batch item as it finishes
with what its own run would say last, stage failures with their reason (in SARIF too), no line over the width but a
command, which is never broken."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from rich.cells import cell_len

from eaglectl.cli import report, views
from eaglectl.text import COMMAND

from .conftest import DEFECTS, DRAFTERS, ROOT

T = ROOT / "fixtures" / "trained"


@pytest.fixture
def width80(monkeypatch):
    monkeypatch.setattr(report.stdout, "width", 80)
    monkeypatch.setattr(report.stderr, "width", 80)
    monkeypatch.chdir(ROOT)


def _too_wide(text: str, width: int = 80) -> list[str]:
    """Lines over the width that hold no command (a command runs on, whole, so that it pastes) and no word that
    cannot fit a line by itself (a long path is never broken)."""
    def unbreakable(line: str) -> bool:
        return max(map(cell_len, line.split())) > width - (len(line) - len(line.lstrip()))

    return [line for line in text.splitlines() if cell_len(line) > width and not COMMAND.search(line)
            and "vllm serve" not in line and not unbreakable(line)]


def _manifest(tmp_path, name, *items):
    path = tmp_path / name
    path.write_text("".join(json.dumps({k: str(v) if not isinstance(v, bool) else v for k, v in item.items()}) + "\n"
                            for item in items))
    return path


def test_batch_items_are_printed_as_they_finish(invoke, width80, tmp_path, monkeypatch):
    """The first item's lines are out before the second item starts; each carries its result, its hint (an error's),
    the warm-start note and the command to run next; --json puts them on stderr, its document alone on stdout."""
    from eaglectl.commands.upgrade import command as upgrade

    events: list[str] = []
    real_run, real_item = upgrade.run, views.batch_item
    monkeypatch.setattr(upgrade, "run", lambda req, progress: (events.append(f"start {req.dest}"),
                                                               real_run(req, progress))[1])
    monkeypatch.setattr(views, "batch_item", lambda n, total, row, out: (events.append(f"printed {n}"),
                                                                          real_item(n, total, row, out))[1])
    m = _manifest(tmp_path, "m.jsonl", {"source": DRAFTERS / "speculators-3", "dest": tmp_path / "a"},
                  {"source": DRAFTERS / "speculators-3", "dest": tmp_path / "b", "init": "fit"})
    r = invoke("upgrade", "--manifest", m)
    assert events == [f"start {tmp_path / 'a'}", "printed 1", f"start {tmp_path / 'b'}", "printed 2"], events
    out = r.stdout
    assert out.index("[1/2] exit 0") < out.index("[2/2] exit ") < out.index("1 ok, 1 failed"), out
    first, second = out.split("[2/2]")
    flat = " ".join(first.split())  # the human view wraps at 80 columns
    assert "result: add-fc-norm, set-norm-output" in flat and "warm start: fine-tune before publishing" in flat
    assert flat.count("warm start") == 1  # said once: in the result line
    assert "next:" in first and f"eaglectl check {tmp_path / 'a'}" in first
    assert "result: error[" in second and "hint: " in second and "--target TARGET" in second, second
    assert not _too_wide(out), out

    events.clear()
    r = invoke("upgrade", "--manifest", m, "--json", "--force")
    doc = json.loads(r.stdout)  # stdout: the one document
    assert [i["exit_code"] for i in doc["items"]][0] == 0 and "[1/2] exit 0" in r.stderr and "[2/2]" in r.stderr
    assert events.index("printed 1") < events.index(f"start {tmp_path / 'b'}")
    assert "[1/2]" not in invoke("upgrade", "--manifest", m, "-q", "--force").stdout  # -q: its one line


def test_a_failed_check_stage_carries_its_reason_in_the_batch_and_in_sarif(invoke, width80, tmp_path):
    m = _manifest(tmp_path, "gate.jsonl", {"source": DRAFTERS / "speculators-3"},
                  {"source": DRAFTERS / "speculators-3", "smoke": True},
                  {"source": DEFECTS / "d2t-range"}, {"source": tmp_path / "no-such-drafter"})
    sarif = tmp_path / "gate.sarif"
    r = invoke("check", "--manifest", m, "--no-card", "--sarif", sarif)
    assert r.exit_code == 3  # the worst item: one not found
    items = r.stdout.split("[")
    smoke = next(i for i in items if i.startswith("2/4]"))
    assert "smoke fail: requested but cannot run: needs --target" in " ".join(smoke.split()), r.stdout
    d2t = next(i for i in items if i.startswith("3/4]"))
    assert "inspect fail: " in d2t and "fix d2t-range: " in d2t, r.stdout  # the reason and the fix
    assert not _too_wide(r.stdout), r.stdout
    run = json.loads(sarif.read_text())["runs"][0]
    rules = [x["id"] for x in run["tool"]["driver"]["rules"]]
    stage = [x for x in run["results"] if x["ruleId"] == "check-smoke"]
    assert len(stage) == 1 and stage[0]["level"] == "error" and rules[stage[0]["ruleIndex"]] == "check-smoke"
    assert "needs --target" in stage[0]["message"]["text"]
    assert stage[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("config.json")
    assert {x["ruleId"] for x in run["results"]} >= {"d2t-range", "check-inspect", "check-smoke"}
    assert all(rules[x["ruleIndex"]] == x["ruleId"] for x in run["results"])
    missing = [x for x in run["results"] if x["ruleId"] == "check-error"]  # stopped before a report: still a result
    assert len(missing) == 1 and "(exit 3)" in missing[0]["message"]["text"]
    assert missing[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("no-such-drafter")


def test_a_piped_batch_has_a_heartbeat(invoke, width80, tmp_path, monkeypatch):
    """Off a terminal, a line on stderr at least every HEARTBEAT_S, naming the item and the step running —
    with --json too (its document is on stdout); none with -q."""
    monkeypatch.setattr(report, "HEARTBEAT_S", 0.02)
    m = _manifest(tmp_path, "m.jsonl", {"source": DRAFTERS / "speculators-3", "dest": tmp_path / "a",
                                        "target": ROOT / "fixtures" / "target-llama", "init": "calibrated"})
    r = invoke("upgrade", "--manifest", m, "--json", "--no-fidelity")
    assert r.exit_code == 0, r.stderr
    json.loads(r.stdout)
    # one line a beat at 80 columns: a long label gives way (…), never the count and the time
    beats = [line for line in r.stderr.splitlines() if line.startswith("upgrade 1/1 ")]
    assert beats and all(re.search(r": (\d+ (of \d+ )?)?after \d+ s(, about \d+ s left)?$", b) for b in beats), beats
    assert not _too_wide(r.stderr), r.stderr
    from eaglectl.commands import check as gate

    real_parity = gate._parity
    monkeypatch.setattr(gate, "_parity", lambda rep: (time.sleep(0.3), real_parity(rep))[1])  # a stage that lasts
    check = invoke("check", DRAFTERS / "speculators-3", "--no-card", "--json")  # its beats name the stage running
    assert any(line.startswith("check: parity: ") for line in check.stderr.splitlines()), check.stderr
    r = invoke("upgrade", "--manifest", m, "--json", "--no-fidelity", "--force", "-q")
    assert r.exit_code == 0 and not r.stderr, r.stderr


def test_the_findings_have_one_layout(invoke, width80, monkeypatch):
    """Whatever the messages and locators, a finding is its severity, rule and place on a line, the message below;
    a fix's command has a line of its own."""
    alone = 0
    for source, target in ((DEFECTS / "d2t-range", T / "target"), (DEFECTS / "aux-ids-range", T / "target"),
                           (DRAFTERS / "specforge-3.1", ROOT / "fixtures" / "target-llama")):
        for width in (80, 200):
            monkeypatch.setattr(report.stdout, "width", width)
            lines = invoke("inspect", source, "--target", target).stdout.splitlines()
            block = lines[lines.index("findings") + 1:]
            assert block[0].split()[0] in ("error", "warning") and block[1].startswith("    "), lines
            fixes = block[block.index("fixes") + 1:] if "fixes" in block else []
            for line in fixes[:fixes.index("")]:
                found = COMMAND.search(line)
                assert found is None or line.strip() == found.group(), line  # alone on its line
                alone += found is not None
    assert alone >= 4  # specforge-3.1's two fixes convert, at each width
    monkeypatch.setattr(report.stdout, "width", 80)
    catalogue = invoke("rules").stdout  # the rule catalogue: the same layout
    commands = [line for line in catalogue.splitlines() if COMMAND.search(line)]
    assert commands and all(line.strip() == COMMAND.search(line).group() for line in commands), commands
    assert not _too_wide(catalogue)


def test_smoke_tables_are_one_line_a_configuration(invoke, width80):
    """The per-position rates (as many as k) are lines below the tables, never a column that folds each
    configuration into three lines."""
    r = invoke("smoke", "fixtures/trained/eagle3", "--target", "fixtures/trained/target", "--engine", "reference",
               "--num-prompts", "2", "--max-tokens", "8", "--context-lengths", "64,128", "--baseline",
               "eagle3:fixtures/trained/eagle3.1")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert not _too_wide(r.stdout), r.stdout
    for header in ("config  ", "acceptance by context tokens"):
        start = next(i for i, line in enumerate(lines) if line.startswith(header))
        rows = lines[start + 1 + (header != "config  "):]
        rows = rows[:next(i for i, line in enumerate(rows) if not line.startswith(("drafter ", "eagle3:")))]
        assert len(rows) == (2 if header == "config  " else 4), r.stdout  # a configuration (and length) a line
    assert any(line.startswith("  eagle3:fixtures/trained/eagle3.1: ") and line.count(" / ") == 2 for line in lines)
    assert any(line.startswith("  drafter 128: ") for line in lines), r.stdout


def test_titles_are_never_cut_from_the_left(invoke, tmp_path, monkeypatch):
    deep = tmp_path / "a-rather-long-folder-name" / "and-another-one" / "drafter"
    deep.parent.mkdir(parents=True)
    os.symlink(DRAFTERS / "speculators-3", deep)
    monkeypatch.setattr(report.stdout, "width", 200)
    assert invoke("inspect", deep).stdout.splitlines()[0] == str(deep)
    assert f"check  {deep}" in invoke("check", deep, "--no-card").stdout


@pytest.mark.slow
def test_the_readme_journeys_piped_at_80_columns(tmp_path):
    """Terminal, pre-publish check, CI batch: run as a CI log runs them (a pipe, COLUMNS=80), every line fits but
    a command, and a batch prints each item before the next starts (seen in the order of the lines)."""
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    env.pop("EAGLECTL_VLLM_PYTHON", None)

    def run(*args):
        r = subprocess.run([sys.executable, "-m", "eaglectl", *map(str, args)], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=600)
        human = r.stderr + ("" if "--json" in args else r.stdout)  # a JSON document is no log line
        assert not _too_wide(human), (args, _too_wide(human))
        return r

    target = "fixtures/trained/target"
    assert run("inspect", "fixtures/trained/eagle3", "--target", target).returncode == 0
    up = run("upgrade", "fixtures/trained/eagle3", tmp_path / "o", "--to", "speculators", "--target", target)
    assert up.returncode == 0 and "acceptance length " in up.stdout and "fit: " in up.stdout, up.stderr
    assert run("check", tmp_path / "o", "--target", target).returncode == 0
    m = _manifest(tmp_path, "m.jsonl", {"source": DRAFTERS / "speculators-3", "dest": tmp_path / "a"},
                  {"source": "fixtures/trained/eagle3", "dest": tmp_path / "b", "to": "speculators", "target": target,
                   "fidelity": False})
    batch = run("upgrade", "--manifest", m, "--json")
    assert batch.stderr.index("[1/2] exit 0") < batch.stderr.index("[2/2] exit 0"), batch.stderr
    second = " ".join(batch.stderr.split("[2/2]")[1].split())  # wrapped at 80 columns
    assert "acceptance length " in second and json.loads(batch.stdout)["exit_code"] == 0
    gate = _manifest(tmp_path, "gate.jsonl", {"source": tmp_path / "a"}, {"source": tmp_path / "b", "target": target})
    assert run("check", "--manifest", gate, "--sarif", tmp_path / "g.sarif").returncode == 0
