"""Every command's --json output against the one envelope (docs/json.md)."""

from __future__ import annotations

import json
import re

import pytest

from eaglectl import __version__
from eaglectl.cli.app import cli

from .conftest import FIXTURES, ROOT

T = FIXTURES / "trained"
D = FIXTURES / "drafters"
SCHEMA = re.compile(r"^eaglectl\.[a-z-]+/[0-9]+$")
FINDING_KEYS = {"rule_id", "severity", "message", "hint", "locator"}


def _cases(tmp):
    """(command line, expected schema, expected exit code): every command, cheap options."""
    return [
        (["inspect", T / "eagle3"], "eaglectl.inspect/1", 0),
        (["inspect", FIXTURES / "defects" / "aux-ids-range"], "eaglectl.inspect/1", 1),
        (["convert", T / "eagle3", tmp / "c", "--to", "modelopt", "--dry-run"], "eaglectl.convert/1", 0),
        (["upgrade", D / "speculators-3", tmp / "u", "--dry-run", "--no-fidelity"], "eaglectl.upgrade/1", 0),
        (["verify", T / "eagle3", "--tokens", "4", "--steps", "1"], "eaglectl.verify/1", 0),
        (["smoke", T / "eagle3", "--target", T / "target", "--engine", "reference", "--num-prompts", "1",
          "--max-tokens", "4"], "eaglectl.smoke/1", 0),
        (["check", T / "eagle3"], "eaglectl.check/1", 0),
        (["check", T / "eagle3", D / "speculators-3"], "eaglectl.batch/1", 0),
        (["upload", T / "eagle3", "acme/eagle3", "--dry-run", "--no-card"], "eaglectl.upload/1", 0),
        (["capture", T / "target", "--out", tmp / "cap", "--num-prompts", "1", "--length", "8"],
         "eaglectl.capture-result/1", 0),
        (["drift", T / "eagle3", "--target", T / "target", "--num-prompts", "1", "--max-tokens", "8", "--depth", "2",
          "--bootstrap", "100"], "eaglectl.drift/1", 0),
        (["diff", T / "eagle3", T / "eagle3.1", "--no-values"], "eaglectl.diff/1", 1),
        (["formats"], "eaglectl.formats/1", 0),
        (["rules"], "eaglectl.rules/1", 0),
        (["rules", "aux-count-unsized"], "eaglectl.rules/1", 0),
        # errors: a library error, a library usage error, Click usage errors (option, argument, value, command)
        (["inspect", tmp / "missing"], "eaglectl.error/1", 3),
        (["rules", "no-such-rule"], "eaglectl.error/1", 2),
        (["inspect", T / "eagle3", "--bogus"], "eaglectl.error/1", 2),
        (["smoke", T / "eagle3"], "eaglectl.error/1", 2),
        (["verify", T / "eagle3", "--steps", "0"], "eaglectl.error/1", 2),
        (["no-such-command"], "eaglectl.error/1", 2),
    ]


def _walk(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}")
            yield f"{path}.{k}", k, v
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")


def test_every_command_prints_the_envelope(invoke, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    seen = set()
    for args, schema, code in _cases(tmp_path):
        r = invoke(*args, "--json")
        where = " ".join(map(str, args))
        assert r.exit_code == code, (where, r.stdout[-400:], r.stderr[-400:])
        doc = json.loads(r.stdout)  # exactly one document, nothing else on stdout
        keys = list(doc)
        assert keys[:3] == ["schema", "tool_version", "command"] and keys[-1] == "exit_code", (where, keys)
        assert SCHEMA.match(doc["schema"]) and doc["schema"] == schema, where
        assert doc["tool_version"] == __version__ and doc["exit_code"] == code, where
        command = str(args[0])
        assert doc["command"] == (command if command in cli.commands else None), where
        if schema == "eaglectl.error/1":
            err = doc["error"]
            assert err["exit_code"] == code and err["reference"] and err["message"], where
            assert "Usage:" not in r.stdout, where
        for path, key, value in _walk(doc):
            assert value != "nothing", (where, path)  # no placeholder words, null instead
            if key == "summary":
                assert isinstance(value, dict), (where, path)
            if key == "findings":
                assert all(set(f) == FINDING_KEYS for f in value), (where, path)
            if key == "rules":
                assert all({"rule_id", "severity", "title", "hint"} <= set(x) for x in value), (where, path)
        seen.add(command)
    assert seen >= set(cli.commands) - {"completion"}


def test_sarif_has_no_placeholder_hints(invoke, tmp_path):
    out = tmp_path / "x.sarif"
    invoke("check", FIXTURES / "defects" / "aux-ids-range", "--sarif", out)
    rules = json.loads(out.read_text())["runs"][0]["tool"]["driver"]["rules"]
    assert rules and all(r.get("help", {}).get("text") not in ("nothing", "", None) for r in rules if "help" in r)


@pytest.mark.parametrize("args", [["inspect", "--json", "--bogus"], ["--bogus", "inspect", "x", "--json"]])
def test_usage_error_json_wherever_the_flag_is(invoke, args):
    r = invoke(*args)
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["reference"] == "usage"
    assert "No such option" in r.stderr
