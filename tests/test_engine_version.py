"""`--engine-version X.Y` scopes inspect/check findings to what that vLLM release serves."""

from __future__ import annotations

import json

import pytest

from eaglectl.engines.facts import FEATURES

from .conftest import DRAFTERS, FIXTURES, TARGET


def _engine_findings(invoke, *args):
    r = invoke("inspect", *args, "--json")
    doc = json.loads(r.stdout)
    return r.exit_code, {f["rule_id"]: f["message"] for f in doc["findings"] if f["rule_id"].startswith("engine-")}


def test_eagle_3_1_on_0_21_is_an_error_naming_the_flags(invoke):
    code, found = _engine_findings(invoke, FIXTURES / "trained" / "eagle3.1", "--engine-version", "0.21")
    assert code == 1 and "vLLM 0.21 does not serve fc_norm / norm_output" in found["engine-version-unserved"]
    assert "from 0.22" in found["engine-version-unserved"]
    code, found = _engine_findings(invoke, FIXTURES / "trained" / "eagle3.1")
    assert code == 0 and found == {}  # no version: nothing scoped


@pytest.mark.parametrize("fixture,version,code,rules", [
    ("specforge-3.1", "0.21", 1, {"engine-version-unserved"}),
    ("specforge-3.1", "0.22", 1, set()),  # HF-style 3.1 flags: served from 0.22 (exit 1: the runner split)
    ("speculators-3.1", "0.22", 0, {"engine-version-unconfirmed"}),  # the speculators-config fix: PR only
    ("speculators-3.1", "0.32", 0, set()),
    ("speculators-3", "0.21", 0, set()),  # nothing 3.1 in it
    ("speculators-3", "0.7", 1, {"engine-version-unserved"}),  # before EAGLE-3
    ("modelopt-mla", "0.31", 1, {"engine-version-unconfirmed"}),  # MLA drafters: PR #36361, release unconfirmed
])
def test_findings_follow_the_feature_table(invoke, fixture, version, code, rules):
    got_code, found = _engine_findings(invoke, DRAFTERS / fixture, "--engine-version", version)
    assert (got_code, set(found)) == (code, rules), found


def test_check_takes_it_too(invoke):
    r = invoke("check", DRAFTERS / "specforge-3.1", "--target", TARGET, "--engine-version", "0.21", "--no-card",
               "--no-measure", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and "engine-version-unserved" in {f["rule_id"] for f in doc["findings"]}


@pytest.mark.parametrize("bad", ["latest", "0", "1.2.3.4", "v0.22"])
def test_version_must_be_a_release_number(invoke, bad):
    r = invoke("inspect", DRAFTERS / "speculators-3", "--engine-version", bad)
    assert r.exit_code == 2 and "release number" in r.output


def test_every_known_release_in_the_table_parses_and_unknown_ones_say_so():
    for f in FEATURES:
        assert f.release is None or all(x.isdigit() for x in f.release.split("."))
        assert f.release is not None or "PR #" in f.since  # an unconfirmed release names its change


def _rules(invoke, *args):
    r = invoke("inspect", *args, "--json")
    return r.exit_code, {f["rule_id"]: f for f in json.loads(r.stdout)["findings"]}


def test_a_local_verifier_path_is_an_error_from_0_33_on(invoke):
    fixture = FIXTURES / "defects" / "verifier-local-path"
    code, found = _rules(invoke, fixture)
    assert code == 0 and found["verifier-local-path"]["severity"] == "warning"
    assert "from vLLM 0.33 on" in found["verifier-local-path"]["message"]
    code, found = _rules(invoke, fixture, "--engine-version", "0.32")
    assert code == 0 and "verifier-local-path" in found and "verifier-local-path-rejected" not in found
    code, found = _rules(invoke, fixture, "--engine-version", "0.33")
    assert code == 1 and "verifier-local-path" not in found  # the same check, the version's severity
    assert "Speculators verifier must name a remote model repository" in found["verifier-local-path-rejected"]["message"]


def test_a_yarn_drafter_shorter_than_the_target_caps_the_server_from_0_33_on(invoke):
    fixture = FIXTURES / "defects" / "draft-context-cap"
    _, found = _rules(invoke, fixture, "--target", TARGET)
    assert "128 < the target's 256" in found["draft-context-cap"]["message"]
    _, found = _rules(invoke, fixture, "--target", TARGET, "--engine-version", "0.33")
    assert "vLLM 0.33 serves at most 128 tokens" in found["draft-context-cap"]["message"]
    _, found = _rules(invoke, fixture, "--target", TARGET, "--engine-version", "0.32")
    assert "draft-context-cap" not in found  # 0.32 raised the draft's length to the target's
    _, found = _rules(invoke, fixture)
    assert "draft-context-cap" not in found  # the cap needs the target's length
    _, found = _rules(invoke, DRAFTERS / "speculators-3", "--target", TARGET, "--engine-version", "0.33")
    assert "draft-context-cap" not in found  # default RoPE: vLLM resizes the rotary table instead


def test_the_readings_say_how_far_they_hold_for_the_release(invoke):
    doc = json.loads(invoke("inspect", DRAFTERS / "specforge-3", "--engine-version", "0.31", "--json").stdout)
    assert "whether 0.31 selects the same layers is unconfirmed" in doc["engine_readings_note"]
    assert [r["runner"] for r in doc["engine_readings"]] == ["v1", "v2"]
    doc = json.loads(invoke("inspect", DRAFTERS / "specforge-3", "--engine-version", "0.33", "--json").stdout)
    assert "unconfirmed" not in (doc["engine_readings_note"] or "")
    assert "aux-ids-runner-split" in {f["rule_id"] for f in doc["findings"]}
