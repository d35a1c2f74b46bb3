"""Model identities: a local path is never written where a Hub id belongs (speculators verifier, card
base_model, carried `_name_or_path`); --base-model and a target's Hub-id `_name_or_path` name it."""

from __future__ import annotations

import json

import pytest

from .conftest import DRAFTERS, TARGET
from .helpers import edited

HUB = "meta-llama/Llama-3.1-8B-Instruct"


def _target_with_id(tmp_path, name_or_path):
    return edited(TARGET, tmp_path, name="target", config={"_name_or_path": name_or_path})


def _verifier(folder):
    return json.loads((folder / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]


def _all_strings(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _all_strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _all_strings(v)
    elif isinstance(obj, str):
        yield obj


@pytest.mark.parametrize("source", ["specforge-3", "eagle-3", "speculators-3.1"])
def test_convert_with_a_local_target_writes_no_path(invoke, tmp_path, source):
    out = tmp_path / "out"
    r = invoke("convert", DRAFTERS / source, out, "--to", "speculators", "--target", TARGET, "--no-measure")
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert not [s for s in _all_strings(cfg) if str(TARGET) in s or "target-llama" in s and "/" in s
                and not s.startswith("eaglectl-fixtures/")]
    # a source verifier that is a Hub id survives; a local target adds none of its own
    assert _verifier(out) == ("eaglectl-fixtures/target-llama" if source.startswith("speculators") else None)
    doc = json.loads(invoke("inspect", out, "--json").stdout)
    ids = {f["rule_id"] for f in doc["findings"]}
    assert "speculators-config" not in ids and "verifier-local-path" not in ids
    assert ("verifier-unnamed" in ids) == (not source.startswith("speculators"))
    assert doc["summary"]["error"] == 0


def test_base_model_names_the_verifier_and_the_card(invoke, tmp_path):
    out = tmp_path / "out"
    r = invoke("convert", DRAFTERS / "specforge-3", out, "--to", "speculators", "--target", TARGET,
               "--base-model", HUB, "--no-measure")
    assert r.exit_code == 0, r.output
    assert _verifier(out) == HUB
    # no --base-model on check: the verifier is the identity, and the card says it
    r = invoke("check", out, "--target", TARGET, "--card", "--no-measure", "--json")
    assert r.exit_code == 0, r.output
    assert f"base_model: {HUB}" in (out / "README.md").read_text()


def test_upgrade_takes_base_model(invoke, tmp_path):
    out = tmp_path / "up"
    r = invoke("upgrade", DRAFTERS / "specforge-3", out, "--to", "speculators", "--base-model", HUB,
               "--no-fidelity")
    assert r.exit_code == 0, r.output
    assert _verifier(out) == HUB


def test_target_name_or_path_is_the_identity_when_it_is_a_hub_id(invoke, tmp_path):
    target = _target_with_id(tmp_path, HUB)
    out = tmp_path / "out"
    assert invoke("convert", DRAFTERS / "specforge-3", out, "--to", "speculators", "--target", target,
                  "--no-measure").exit_code == 0
    assert _verifier(out) == HUB
    # a card that names the target's declared id is right even though --target is a local folder
    (out / "README.md").write_text(f"---\nbase_model: {HUB}\ntags: [speculative-decoding, eagle3]\n---\nA drafter.\n")
    r = invoke("check", out, "--target", target, "--no-measure", "--json")
    found = {f["rule_id"] for f in json.loads(r.stdout)["findings"]}
    assert "card-base-model" not in found and r.exit_code == 0, r.output
    # and --card writes that id, not the folder
    assert invoke("check", out, "--target", target, "--card", "--no-measure").exit_code == 0
    assert f"base_model: {HUB}" in (out / "README.md").read_text()
    assert str(target) not in (out / "README.md").read_text()


def test_local_name_or_path_is_no_identity(invoke, tmp_path):
    target = _target_with_id(tmp_path, "/home/someone/models/llama")
    out = tmp_path / "out"
    assert invoke("convert", DRAFTERS / "specforge-3", out, "--to", "speculators", "--target", target,
                  "--no-measure").exit_code == 0
    assert _verifier(out) is None
    assert invoke("check", out, "--target", target, "--card", "--no-measure").exit_code == 0
    assert "base_model" not in (out / "README.md").read_text().split("---")[1]


def test_a_card_stating_the_base_model_passes_with_the_flag(invoke, tmp_path):
    card = f"---\nbase_model: {HUB}\ntags: [speculative-decoding, eagle3, eagle3.1]\n---\nx\n"
    d = edited(DRAFTERS / "speculators-3.1", tmp_path, name="d", files={"README.md": card})
    r = invoke("check", d, "--target", TARGET, "--no-measure", "--json")
    assert "card-base-model" in {f["rule_id"] for f in json.loads(r.stdout)["findings"]}  # verifier says otherwise
    r = invoke("check", d, "--target", TARGET, "--base-model", HUB, "--no-measure", "--json")
    assert "card-base-model" not in {f["rule_id"] for f in json.loads(r.stdout)["findings"]} and r.exit_code == 0


def test_verifier_spelled_as_a_local_path_is_flagged(invoke, tmp_path):
    def local_verifier(cfg):
        cfg["speculators_config"]["verifier"]["name_or_path"] = "/data/models/llama"

    d = edited(DRAFTERS / "speculators-3.1", tmp_path, name="d", config=local_verifier)
    doc = json.loads(invoke("inspect", d, "--json").stdout)
    assert "verifier-local-path" in {f["rule_id"] for f in doc["findings"]}
    out = tmp_path / "out"
    assert invoke("convert", d, out, "--to", "speculators").exit_code == 0
    assert _verifier(out) is None  # the path is dropped, not carried
    assert invoke("convert", d, tmp_path / "o2", "--to", "speculators", "--base-model", HUB).exit_code == 0
    assert _verifier(tmp_path / "o2") == HUB


@pytest.mark.parametrize("command", ["convert", "upgrade", "check"])
def test_base_model_refuses_a_local_path(invoke, tmp_path, command):
    args = [command, DRAFTERS / "speculators-3", *([tmp_path / "o"] if command != "check" else []),
            "--base-model", str(TARGET)]
    r = invoke(*args)
    assert r.exit_code == 2 and "is not a Hub id" in r.output
    assert not (tmp_path / "o").exists()
