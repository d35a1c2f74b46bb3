"""Every command's --help, the registry listings, docs freshness, and the error contract."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eaglectl import errors, formats
from eaglectl.cli.app import cli
from eaglectl.rules import RULES

from .conftest import DRAFTERS, ROOT
from .helpers import inspect_checkpoint
from .helpers import upgrade_run as upgrade


@pytest.mark.parametrize("command", [[], *([c] for c in cli.commands)])
def test_help_of_every_command(invoke, command):
    r = invoke(*command, "--help")
    assert r.exit_code == 0 and "Usage:" in r.stdout


def test_version(invoke):
    from eaglectl import __version__

    assert __version__ in invoke("--version").stdout


def test_formats_json_lists_the_registry(invoke):
    doc = json.loads(invoke("formats", "--json").stdout)
    assert doc["schema"] == "eaglectl.formats/1"
    assert [d["id"] for d in doc["dialects"]] == formats.names()
    # the human table: a row per dialect, in registry order, each with its name, aux-id convention and flags
    lines = invoke("formats").stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.split()[:1] and line.split()[0] in formats.names()]
    assert [lines[i].split()[0] for i in starts] == formats.names()
    ends = [*starts[1:], None]
    rows = {lines[i].split()[0]: " ".join(" ".join(lines[i:j]).split()) for i, j in zip(starts, ends, strict=True)}
    for dialect, cells in {"eagle": ("SafeAILab/EAGLE", "boundary (ids not stored)", "none"),
                           "speculators": ("vLLM speculators", "boundary",
                                           "fc_norm, norm_before_fc, norm_before_residual, norm_output"),
                           "specforge": ("SpecForge / sglang", "output", "fc_norm, norm_output")}.items():
        assert all(cell in rows[dialect] for cell in cells), (dialect, rows[dialect])
    assert "(ids not stored)" not in rows["speculators"] and "norm_before_fc" not in rows["specforge"]


def test_rules_json_is_the_catalogue(invoke):
    doc = json.loads(invoke("rules", "--json").stdout)
    assert [r["rule_id"] for r in doc["rules"]] == list(RULES)
    assert {r["severity"] for r in doc["rules"]} == {"error", "warning", "info"}


def test_generated_docs_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "generate.py"), "--check"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_every_documented_example_runs_with_its_exit_code(tmp_path, monkeypatch):
    """docs/examples.md holds machine-specific numbers, so it is not compared; its commands must still work."""
    sys.path.insert(0, str(ROOT / "docs"))
    import generate

    monkeypatch.chdir(ROOT)
    page = (ROOT / "docs" / "examples.md").read_text()
    for title, line, expected in generate.EXAMPLES:
        code, text = generate.run_example(line, str(tmp_path))
        assert code == expected, (line, text)
        assert f"## {title}" in page and f"$ eaglectl {line}" in page


@pytest.mark.slow
def test_every_tour_step_runs_in_order_with_its_exit_code(tmp_path, monkeypatch):
    """docs/tour.md is generated from real runs (not hand-kept): each step's command, in order, still works."""
    sys.path.insert(0, str(ROOT / "docs"))
    import generate

    monkeypatch.chdir(ROOT)
    page = (ROOT / "docs" / "tour.md").read_text()
    assert page.startswith(generate.BANNER)
    for title, _, line, expected in generate.TOUR:
        code, text = generate.run_example(line, str(tmp_path), quiet=True)
        assert code == expected, (line, text)
        assert len(text.strip().splitlines()) == 1, (line, text)  # -q: the one-line result
        assert f"**{title}**" in page and f"$ eaglectl {line}" in page


def test_json_keys_are_documented():
    page = (ROOT / "docs" / "inspect.md").read_text()
    doc = inspect_checkpoint(str(DRAFTERS / "speculators-3.1"), target=str(ROOT / "fixtures" / "target-llama")).to_json()
    for key in [*doc, *doc["spec"], *doc["inputs"], *doc["tensors"], *doc["target"]]:
        assert f"`{key}`" in page, key


def test_error_types_have_distinct_codes_and_references():
    codes = [c.exit_code for c in errors.ERROR_TYPES]
    refs = [c.reference for c in errors.ERROR_TYPES]
    assert len(set(codes)) == len(codes) and len(set(refs)) == len(refs)
    assert not {errors.EXIT_OK, errors.EXIT_FINDINGS, errors.EXIT_USAGE, errors.EXIT_INTERNAL} & set(codes)
    subclasses = set(errors.EaglectlError.__subclasses__())
    assert subclasses == set(errors.ERROR_TYPES) | {errors.UsageError}
    assert errors.UsageError.exit_code == errors.EXIT_USAGE


def test_changelog_names_every_exit_code_and_dialect():
    log = (ROOT / "CHANGELOG.md").read_text()
    for cls in errors.ERROR_TYPES:
        assert f"{cls.exit_code} `{cls.reference}`" in log.replace("\n  ", " ")
    for name in formats.names():
        assert f"`{name}`" in log


def test_the_readme_and_help_name_the_exit_codes_errors_declares(invoke):
    """The range of specific failures is computed from errors.py; the README says the same."""
    assert errors.SPECIFIC_EXIT_CODES == f"3-{max(c.exit_code for c in errors.ERROR_TYPES if c.exit_code < 70)}"
    assert f"{errors.SPECIFIC_EXIT_CODES} specific failures" in (ROOT / "README.md").read_text()
    assert f"{errors.SPECIFIC_EXIT_CODES} specific failures" in " ".join(invoke("--help").stdout.split())


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Set up and run", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_convert_and_upgrade_json_keys_are_documented(tmp_path):
    from eaglectl.checkpoint.drafter import open_drafter
    from eaglectl.commands.convert.command import execute, plan_conversion
    
    src = open_drafter(str(DRAFTERS / "speculators-3"))
    doc = execute(plan_conversion(src, tmp_path / "c", "modelopt"), src).to_json()
    page = (ROOT / "docs" / "convert.md").read_text()
    for key in [*doc, *doc["plan"], *doc["plan"]["tensors"][0]]:
        assert f"`{key}`" in page, key
    up = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "u"), init="calibrated",
                 target=str(ROOT / "fixtures" / "target-llama")).to_json()
    page = (ROOT / "docs" / "upgrade.md").read_text()
    for key in [*up, *up["statistics"], *up["fidelity"], *up["fidelity"]["per_step"][0]]:
        assert f"`{key}`" in page, key
