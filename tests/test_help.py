"""Help, shell completion, -q / -v and `rules ID`: the CLI explains itself."""

from __future__ import annotations

import json

import click
import pytest

from eaglectl import report
from eaglectl.cli import COMMAND_ORDER, PATH_PARAMS, cli

from .conftest import FIXTURES


def test_every_option_has_help_and_every_argument_is_in_the_docstring():
    for name, cmd in [("eaglectl", cli), *cli.commands.items()]:
        for p in cmd.params:
            if isinstance(p, click.Option):
                assert p.help and len(p.help) > 10, (name, p.opts)
            else:
                assert p.human_readable_name in (cmd.help or ""), (name, p.human_readable_name)


def test_commands_are_in_workflow_order_with_whole_one_line_descriptions(invoke, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = invoke("--help").stdout
    listing = out.split("Commands:", 1)[1].splitlines()[1:]
    assert [line.split()[0] for line in listing if line.strip()] == list(COMMAND_ORDER)
    assert not any(line.endswith("...") for line in listing) and all(len(line) <= 80 for line in out.splitlines())


def test_path_arguments_complete_file_names():
    for name, cmd in cli.commands.items():
        for p in cmd.params:
            if p.name in PATH_PARAMS:
                items = p.shell_complete(click.Context(cmd), "fix")
                assert items and items[0].type in ("file", "dir"), (name, p.name)


def test_rules_id_explains_one_rule_and_suggests_near_ids(invoke):
    r = invoke("rules", "aux-count-unsized")
    assert r.exit_code == 0 and r.stdout.startswith("aux-count-unsized")
    doc = json.loads(invoke("rules", "aux-count-unsized", "--json").stdout)
    assert [x["rule_id"] for x in doc["rules"]] == ["aux-count-unsized"]
    r = invoke("rules", "aux-count-unsizd")
    assert r.exit_code == 2 and "did you mean aux-count-unsized" in r.stderr


def test_quiet_prints_only_the_result_line_and_verbose_more(invoke):
    src = FIXTURES / "trained" / "eagle3"
    quiet = invoke("-q", "inspect", src)
    assert quiet.exit_code == 0 and quiet.stdout.strip().splitlines() == [
        "inspect: eagle, EAGLE 3: 0 error(s), 1 warning(s)"]
    failing = invoke("-q", "inspect", FIXTURES / "defects" / "aux-ids-range")
    assert failing.exit_code == 1 and len(failing.stdout.splitlines()) == 1
    normal, verbose = invoke("inspect", src), invoke("-v", "inspect", src)
    assert "hidden_size" not in normal.stdout and "hidden_size" in verbose.stdout
    assert "inspect:" in verbose.stderr and " s" in verbose.stderr  # timing
    assert invoke("-q", "-v", "formats").exit_code == 2


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
    from .conftest import ROOT

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
