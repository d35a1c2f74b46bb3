"""`eaglectl upgrade`: EAGLE-3 -> 3.1 layout, idempotence, conflicts, calibration, provenance."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eaglectl.io.checkpoint import open_checkpoint
from eaglectl.errors import ConversionError
from eaglectl.inspect import run as inspect_checkpoint
from eaglectl.upgrade import run as upgrade

from .conftest import DRAFTERS, TARGET


def _canonical_tensors(path):
    from eaglectl.formats import detect
    from eaglectl.drafter import CanonicalView, probe_of

    ck = open_checkpoint(str(path))
    view = CanonicalView(ck, detect(probe_of(ck))[0])
    return {c: view.read(c).tobytes() for c in view.names()}


def test_ones_upgrade_gives_a_clean_3_1_drafter_that_says_it_needs_training(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "speculators-3", tmp_path / "o", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["changed"] and doc["steps"] == ["add-fc-norm", "set-norm-output"] and doc["needs_fine_tuning"]
    rep = inspect_checkpoint(str(tmp_path / "o"))
    assert rep.spec.eagle_version == "3.1" and rep.exit_code == 0
    assert [f.rule_id for f in rep.findings] == ["needs-fine-tuning"]  # said by inspect too, and fails --strict
    out = open_checkpoint(str(tmp_path / "o"))
    for j in range(3):
        np.testing.assert_array_equal(out.read(f"fc_norm.{j}.weight"), np.ones(32, dtype=np.float32))
    prov = json.loads((tmp_path / "o" / "config.json").read_text())["eaglectl_provenance"]
    assert prov["operation"] == "upgrade" and prov["fc_norm_init"] == "ones" and prov["needs_fine_tuning"] is True
    assert json.loads(out.metadata["eaglectl"]) == prov
    fid = doc["fidelity"]["per_step"]
    assert len(fid) == 3 and all(s["kl_mean"] > 0 for s in fid)  # measured, not assumed


def test_upgrade_is_idempotent(tmp_path):
    first = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "a"))
    again = upgrade(str(tmp_path / "a"), str(tmp_path / "b"))
    assert first.changed and not again.changed and again.steps == [] and again.fidelity is None
    assert "nothing to change" in again.notes[0]
    assert _canonical_tensors(tmp_path / "a") == _canonical_tensors(tmp_path / "b")
    a = json.loads((tmp_path / "a" / "config.json").read_text())
    b = json.loads((tmp_path / "b" / "config.json").read_text())
    a.pop("eaglectl_provenance"), b.pop("eaglectl_provenance")
    assert a == b


def test_3_1_source_changes_nothing(tmp_path):
    res = upgrade(str(DRAFTERS / "specforge-3.1"), str(tmp_path / "o"))
    assert not res.changed
    assert _canonical_tensors(tmp_path / "o") == _canonical_tensors(DRAFTERS / "specforge-3.1")


def test_flags_one_at_a_time(tmp_path):
    res = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "o"), fc_norm=False)
    assert res.steps == ["set-norm-output"]
    assert inspect_checkpoint(str(tmp_path / "o")).spec.eagle_version == "3.1-norm-output-only"
    # norm_output never touches step 0: the first draft position is unchanged
    assert res.fidelity.metrics[0].kl_mean == 0 and res.fidelity.metrics[1].kl_mean > 0
    res = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "p"), norm_output=False)
    assert res.steps == ["add-fc-norm"]


def test_norm_before_fc_conflict_is_refused_with_a_way_out(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "speculators-norm-before-fc", tmp_path / "o")
    assert r.exit_code == 7 and "normalise twice" in r.stderr and "--no-fc-norm" in r.stderr
    assert invoke("upgrade", DRAFTERS / "speculators-norm-before-fc", tmp_path / "o", "--no-fc-norm").exit_code == 0


def test_safeailab_source_needs_a_3_1_capable_destination(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "eagle-3", tmp_path / "o")
    assert r.exit_code == 7 and "cannot record fc_norm" in r.stderr and "--to speculators" in r.stderr
    r = invoke("upgrade", DRAFTERS / "eagle-3", tmp_path / "s", "--to", "speculators", "--target", TARGET, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["plan"]["dest_dialect"] == "speculators"


@pytest.mark.parametrize("init", ["harmonic", "calibrated", "refit"])
def test_calibrated_inits_need_a_target(tmp_path, init):
    with pytest.raises(ConversionError, match="--target"):
        upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "o"), init=init)


def test_calibration_preserves_the_fc_output_better_than_ones(tmp_path):
    cal = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "c"), init="calibrated", target=str(TARGET))
    ref = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "r"), init="refit", target=str(TARGET))
    har = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "h"), init="harmonic", target=str(TARGET))
    s = cal.statistics
    assert s["tokens"] > 1000 and s["sink_excluded"] and len(s["rms_mean"]) == 3
    # least squares over gamma can only beat gamma = 1; a free refit of fc can only beat a diagonal
    assert s["fc_output_relative_error"] < 0.5 * s["fc_output_relative_error_ones"]
    assert ref.statistics["fc_output_relative_error"] <= s["fc_output_relative_error"] + 1e-9
    gamma = open_checkpoint(str(tmp_path / "h")).read("fc_norm.0.weight")
    assert np.allclose(gamma, har.statistics["rms_harmonic_mean"][0], rtol=1e-2)
    # refit changes fc.weight and keeps fc_norm at one
    out = open_checkpoint(str(tmp_path / "r"))
    assert np.all(out.read("fc_norm.1.weight") == 1)
    assert not np.array_equal(out.read("fc.weight"), open_checkpoint(str(DRAFTERS / "speculators-3")).read("fc.weight"))
    # calibrated step-0 output stays closer to the source than ones does (fc_norm only touches step 0 inputs)
    ones = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "o"), norm_output=False)
    cal0 = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "c0"), norm_output=False, init="calibrated",
                   target=str(TARGET))
    assert cal0.fidelity.metrics[0].kl_mean < ones.fidelity.metrics[0].kl_mean


def test_dry_run_writes_nothing(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "speculators-3", tmp_path / "o", "--dry-run", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["dry_run"] and not (tmp_path / "o").exists()
    assert [t["dest"] for t in doc["plan"]["tensors"] if t["action"] == "derive"] == [
        "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"]


def test_human_output(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "specforge-3", tmp_path / "o", "--init", "calibrated", "--target", TARGET)
    assert r.exit_code == 0
    for part in ("add-fc-norm, set-norm-output", "fine-tune", "FC output relative error", "fidelity to the source"):
        assert part in r.stdout
