"""Help, shell completion, -q / -v and `rules ID`: the CLI explains itself."""

from __future__ import annotations

import json

import click

from eaglectl.cli.app import COMMAND_ORDER, cli
from eaglectl.cli.params import PATH_PARAMS

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
        "inspect: eagle, EAGLE 3: 0 error(s), 0 warning(s)"]  # architectures-plain is sglang advice
    failing = invoke("-q", "inspect", FIXTURES / "defects" / "aux-ids-range")
    assert failing.exit_code == 1 and len(failing.stdout.splitlines()) == 1
    normal, verbose = invoke("inspect", src), invoke("-v", "inspect", src)
    assert "hidden_size" not in normal.stdout and "hidden_size" in verbose.stdout
    assert "inspect:" in verbose.stderr and " s" in verbose.stderr  # timing
    assert invoke("-q", "-v", "formats").exit_code == 2
