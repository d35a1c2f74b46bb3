"""`--engine-version X.Y` scopes inspect/check findings to what that vLLM release serves."""

from __future__ import annotations

import json

import pytest

from eaglectl.engines import FEATURES

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
    ("specforge-3.1", "0.22", 0, set()),  # HF-style 3.1 flags: served from 0.22
    ("speculators-3.1", "0.22", 0, {"engine-version-unconfirmed"}),  # the speculators-config fix: PR only
    ("speculators-3.1", "0.32", 0, set()),
    ("speculators-3", "0.21", 0, set()),  # nothing 3.1 in it
    ("speculators-3", "0.7", 1, {"engine-version-unserved"}),  # before EAGLE-3
    ("modelopt-mla", "0.31", 0, {"engine-version-unconfirmed"}),  # MLA drafters: PR #36361, release unconfirmed
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
