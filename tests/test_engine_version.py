"""`--engine-version X.Y` scopes inspect/check findings to what that vLLM release serves."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from eaglectl.engines import facts
from eaglectl.engines.facts import FEATURES, version_key

from .conftest import DRAFTERS, FIXTURES, TARGET
from .helpers import edited


def _engine_findings(invoke, *args):
    r = invoke("inspect", *args, "--json")
    doc = json.loads(r.stdout)
    return r.exit_code, {f["rule_id"]: f["message"] for f in doc["findings"] if f["rule_id"].startswith("engine-")}


def _unserved(invoke, *args) -> list[str]:
    """The engine-version-unserved messages of an inspect run."""
    doc = json.loads(invoke("inspect", *args, "--json").stdout)
    return [f["message"] for f in doc["findings"] if f["rule_id"] == "engine-version-unserved"]


def test_eagle_3_1_on_0_21_refuses_to_load_for_fc_norm_and_ignores_norm_output(invoke):
    code, found = _engine_findings(invoke, FIXTURES / "trained" / "eagle3.1", "--engine-version", "0.21")
    assert code == 1 and set(found) == {"engine-version-unserved"}
    messages = _unserved(invoke, FIXTURES / "trained" / "eagle3.1", "--engine-version", "0.21")
    assert any(m.startswith("vLLM 0.21 refuses to load it: fc_norm") and "served from 0.22" in m
               and "AutoWeightsLoader raise" in m for m in messages), messages
    # norm_output alone is silent, but this release never gets that far: said as "also"
    assert any(m.startswith("vLLM 0.21 would also serve it wrong silently: norm_output") for m in messages), messages
    code, found = _engine_findings(invoke, FIXTURES / "trained" / "eagle3.1")
    assert code == 0 and found == {}  # no version: nothing scoped


def _flag_in_eagle_config_only(c: dict) -> None:
    c["eagle_config"]["norm_before_fc"] = c.pop("norm_before_fc")


# Each release boundary of engines.FEATURES, one release below it and at it: (fixture, config edit, release, the
# feature, how the message starts: "loud" / "silent" / "also" (silent beside a loud one), or None: no finding of
# that feature). A speculators config and the rows of the model classes that also concern it are told apart by
# the feature's name.
LOUD, SILENT, ALSO = "refuses to load it", "serves it wrong silently", "would also serve it wrong silently"
BOUNDARIES = [
    ("speculators-3", None, "0.7", "eagle3 is served from 0.8", LOUD),
    ("speculators-3", None, "0.8", "eagle3 is served", None),
    ("modelopt-mla", None, "0.17", "MLA drafters (Eagle3DeepseekV2ForCausalLM) is served from 0.18", LOUD),
    ("modelopt-mla", None, "0.18", "MLA drafters (Eagle3", None),
    ("defects/norm-before-fc-placement", None, "0.17", "norm_before_fc (input_norm before fc) is served from 0.18",
     LOUD),
    ("defects/norm-before-fc-placement", None, "0.18", "norm_before_fc", None),
    # the flag at the top level: every release that has norm_before_fc reads it there
    ("defects/norm-before-fc-placement", None, "0.21", "read from eagle_config", None),
    ("defects/norm-before-fc-placement", _flag_in_eagle_config_only, "0.21",
     "norm_before_fc read from eagle_config is served from 0.22", SILENT),
    ("defects/norm-before-fc-placement", _flag_in_eagle_config_only, "0.22", "read from eagle_config", None),
    ("speculators-norm-before-fc", None, "0.18", "norm_before_fc (speculators-format configs) is served from 0.19",
     SILENT),
    ("speculators-norm-before-fc", None, "0.19", "norm_before_fc", None),
    # before 0.18 the model refuses the weights; the speculators reader dropping the flag is not yet the issue
    ("speculators-norm-before-fc", None, "0.17", "norm_before_fc (input_norm before fc)", LOUD),
    ("speculators-norm-before-fc", None, "0.17", "norm_before_fc (speculators-format configs)", None),
    ("modelopt-3", {"norm_output": True}, "0.21", "norm_output (EAGLE-3.1 post-norm feedback) is served from 0.22",
     SILENT),
    ("modelopt-3", {"norm_output": True}, "0.22", "norm_output", None),
    ("specforge-3.1", None, "0.21", "fc_norm (EAGLE-3.1 per-aux RMSNorm) is served from 0.22", LOUD),
    ("specforge-3.1", None, "0.22", "fc_norm", None),
    ("modelopt-mla", None, "0.22", "fc_norm applied on MLA drafters is served from 0.23", SILENT),
    ("modelopt-mla", None, "0.23", "fc_norm", None),
    # 0.21 has no fc_norm at all: the load fails, the MLA row (0.22.x only) is not the reason
    ("modelopt-mla", None, "0.21", "fc_norm (EAGLE-3.1 per-aux RMSNorm)", LOUD),
    ("modelopt-mla", None, "0.21", "applied on MLA", None),
    ("speculators-3.1", None, "0.24", "fc_norm (speculators-format configs) is served from 0.25", LOUD),
    ("speculators-3.1", None, "0.24", "norm_output (speculators-format configs) is served from 0.25", ALSO),
    ("speculators-3.1", None, "0.25", "speculators-format", None),
    ("speculators-3.1", None, "0.21", "speculators-format", None),
]


@pytest.mark.parametrize("fixture,edit,version,feature,how", BOUNDARIES)
def test_each_release_boundary_below_and_at(invoke, tmp_path, fixture, edit, version, feature, how):
    folder = (FIXTURES if "/" in fixture else DRAFTERS) / fixture
    if edit is not None:
        folder = edited(folder, tmp_path, config=edit)
    messages = _unserved(invoke, folder, "--engine-version", version)
    if how is None:
        assert not any(feature in m for m in messages), messages
    else:
        assert any(m.startswith(f"vLLM {version} {how}: {feature}") for m in messages), messages


@pytest.mark.parametrize("fixture,version,code,rules", [
    ("specforge-3.1", "0.21", 1, {"engine-version-unserved"}),
    ("specforge-3.1", "0.22", 1, set()),  # HF-style 3.1 flags: served from 0.22 (exit 1: the runner split)
    ("speculators-3.1", "0.22", 1, {"engine-version-unserved"}),  # the speculators reader drops them until 0.25
    ("speculators-3.1", "0.32", 0, set()),
    ("speculators-3", "0.21", 0, set()),  # nothing 3.1 in it
    ("speculators-3", "0.7", 1, {"engine-version-unserved"}),  # before EAGLE-3
    ("modelopt-mla", "0.31", 1, set()),  # exit 1: the runner split
])
def test_findings_follow_the_feature_table(invoke, fixture, version, code, rules):
    got_code, found = _engine_findings(invoke, DRAFTERS / fixture, "--engine-version", version)
    assert (got_code, set(found)) == (code, rules), found


def test_a_row_without_a_known_release_is_a_warning_below_the_reference(invoke, monkeypatch):
    """No vLLM row lacks its first release today (the sglang row does, and --engine-version is vLLM's): the
    mechanism is shown on the MLA row with its release taken away."""
    assert all(f.release is not None for f in FEATURES if f.engine == "vllm")
    rows = tuple(replace(f, release=None) if f.feature.startswith("MLA drafters") else f for f in FEATURES)
    monkeypatch.setattr(facts, "FEATURES", rows)
    code, found = _engine_findings(invoke, DRAFTERS / "modelopt-mla", "--engine-version", "0.17")
    assert "PR #36361 (merged 2026-03-07), whose first release is unconfirmed (0.32 has it)" in found[
        "engine-version-unconfirmed"]
    _, found = _engine_findings(invoke, DRAFTERS / "modelopt-mla", "--engine-version", "0.32")
    assert "engine-version-unconfirmed" not in found


def test_check_takes_it_too(invoke):
    r = invoke("check", DRAFTERS / "specforge-3.1", "--target", TARGET, "--engine-version", "0.21", "--no-card",
               "--no-measure", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and "engine-version-unserved" in {f["rule_id"] for f in doc["findings"]}


@pytest.mark.parametrize("bad", ["latest", "0", "1.2.3.4", "v0.22"])
def test_version_must_be_a_release_number(invoke, bad):
    r = invoke("inspect", DRAFTERS / "speculators-3", "--engine-version", bad)
    assert r.exit_code == 2 and "release number" in r.output


def test_every_row_says_what_older_releases_do_and_where_it_was_read():
    for f in FEATURES:
        assert f.release is None or all(x.isdigit() for x in f.release.split("."))
        assert f.release is not None or "PR #" in f.since  # an unconfirmed release names its change
        assert f.before in ("loud", "silent") and f.note
        # the citation names the release and a file it was read in
        assert (f.release is None or f.cite.startswith(f"vLLM {f.release}")) and ".py" in f.cite, f.cite
        assert f.broken_from is None or version_key(f.broken_from) < version_key(f.release)


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
    assert "draft-context-cap" not in found  # 0.27 to 0.32 raise the draft's length to the target's
    assert "draft-context-overrun" not in found
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


def _short(tmp_path, name: str, length: int, rope: dict | None = None):
    """speculators-3 (default RoPE) with max_position_embeddings `length` and `rope` as its rope_scaling."""
    def edit(c: dict) -> None:
        c["transformer_layer_config"].update(max_position_embeddings=length, rope_scaling=rope)

    return edited(DRAFTERS / "speculators-3", tmp_path, name=name, config=edit)


def test_a_drafter_shorter_than_the_target_overruns_vllm_before_0_27(invoke, tmp_path):
    fixture = FIXTURES / "defects" / "draft-context-cap"
    code, found = _rules(invoke, fixture, "--target", TARGET, "--engine-version", "0.26")
    f = found["draft-context-overrun"]
    assert code == 1 and f["severity"] == "error" and "draft-context-cap" not in found
    assert f["message"].startswith("vLLM 0.26 crashes or reads out of bounds past 128 positions (fixed in 0.27)")
    assert f["locator"].endswith("config.json:transformer_layer_config.max_position_embeddings")
    _, found = _rules(invoke, fixture, "--target", TARGET, "--engine-version", "0.27")
    assert "draft-context-overrun" not in found
    _, found = _rules(invoke, fixture, "--engine-version", "0.26")
    assert "draft-context-overrun" not in found  # the target's length decides
    _, found = _rules(invoke, fixture, "--target", TARGET)
    assert "draft-context-overrun" not in found  # the current release raises it
    # whatever the RoPE type: a default-RoPE drafter (which >= 0.33 resizes, so no cap) overruns 0.26 too
    short = _short(tmp_path, "short", 64)
    _, found = _rules(invoke, short, "--target", TARGET, "--engine-version", "0.26")
    assert "past 64 positions" in found["draft-context-overrun"]["message"]
    _, found = _rules(invoke, short, "--target", TARGET, "--engine-version", "0.33")
    assert "draft-context-overrun" not in found and "draft-context-cap" not in found
    # the length as vLLM derives it: dynamic NTK x2 over 128 reaches the target's 256, linear x2 over 64 does not
    _, found = _rules(invoke, _short(tmp_path, "dyn", 128, {"rope_type": "dynamic", "factor": 2.0}), "--target",
                      TARGET, "--engine-version", "0.26")
    assert "draft-context-overrun" not in found
    _, found = _rules(invoke, _short(tmp_path, "lin", 64, {"rope_type": "linear", "factor": 2.0}), "--target",
                      TARGET, "--engine-version", "0.26")
    assert "past 128 positions" in found["draft-context-overrun"]["message"]
