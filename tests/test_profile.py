"""ModelOpt's speculation_profile.json: `smoke --profile` writes it, the validator checks the schema as ModelOpt
documents it, `check --card` validates a profile beside the drafter and puts its figures on the card."""

from __future__ import annotations

import json

import pytest

from eaglectl.checkpoint import speculation_profile as sp

from .conftest import ROOT
from .helpers import edited

TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"


def _doc(drafts: int, per_pos: list[int], k: int = 3) -> dict:
    """A smoke report's fields the profile reads (what SmokeReport.to_json writes)."""
    return {"engine": "reference", "num_speculative_tokens": k, "num_drafts": drafts, "dtype": "float32",
            "per_position_acceptance": [a / drafts for a in per_pos], "mean_acceptance_length_per_request": 2.1,
            "drafter": "/home/me/ckpts/org/drafter", "target": "org/target", "max_tokens": 64,
            "prompts": {"set": "builtin:short", "description": "16 windows", "count": 16},
            "versions": {"eaglectl_version": "0.1"}, "by_category": []}


def test_rates_from_counts_by_hand():
    # 10 verify steps; 6 accepted draft 1, 3 accepted drafts 1-2, 1 accepted all three.
    # lengths (bonus token included): 4 steps of 1, 3 of 2, 2 of 3, 1 of 4
    p = sp.from_smoke(_doc(10, [6, 3, 1]))
    assert p["acceptance_length_histogram"] == {"1": 4, "2": 3, "3": 2, "4": 1}
    assert p["marginal_accept_rates"] == [0.6, 0.3, 0.1]  # P(len >= 2), P(len >= 3), P(len >= 4)
    assert p["conditional_accept_rates"] == [0.6, 0.5, round(1 / 3, 6)]  # 6/10, 3/6, 1/3
    assert p["mean_accept_length"] == 2.0 == (4 * 1 + 3 * 2 + 2 * 3 + 1 * 4) / 10
    assert p["measured"] is True and p["schema_version"] == "1.0" and sp.validate(p) == []
    assert p["validation"]["mean_consistency"]["passed"] and p["accept_length_by_k"] == {"3": 2.0}
    assert p["draft_checkpoint"]["name"] == "org/drafter"  # no machine path travels with the checkpoint
    cond = p["measurement_conditions"]
    assert (cond["engine"], cond["num_speculative_tokens"], cond["dtype"], cond["num_samples"]) == \
        ("reference", 3, "float32", 16) and cond["runner"] and cond["engine_version"] == "eaglectl 0.1"


def test_modelopt_s_own_worked_example():
    """specdec_bench's own test: lengths {1: 40, 2: 30, 3: 30}, k = 3 -> marginal [0.6, 0.3, 0], conditional
    [0.6, 0.5, 0]."""
    marginal, conditional = sp.rates({1: 40, 2: 30, 3: 30}, 3)
    assert marginal == pytest.approx([0.6, 0.3, 0.0]) and conditional == pytest.approx([0.6, 0.5, 0.0])
    assert sp.histogram(100, [60, 30, 0]) == {1: 40, 2: 30, 3: 30, 4: 0}


def test_counts_that_are_not_prefix_acceptance_are_refused():
    with pytest.raises(ValueError, match="not prefix acceptance"):
        sp.histogram(10, [3, 5, 1])


@pytest.mark.parametrize("edit,says", [
    (lambda p: p.update(marginal_accept_rates=[0.6, 0.7, 0.1]), "increase"),
    (lambda p: p.update(conditional_accept_rates=[0.6, 0.3, 0.1]), "conditional_accept_rates[1]"),
    (lambda p: p.update(num_speculative_tokens=2, max_supported_k=2), "not a list of 2 rates"),
    (lambda p: p.update(mean_accept_length=2.5), "1 + sum(marginal_accept_rates)"),
    (lambda p: p["acceptance_length_histogram"].update({"5": 1}), "lengths run 1..k+1"),
    (lambda p: p.update(measured="yes"), "measured is not true or false"),
    (lambda p: p.update(schema_version="2.0"), "schema_version"),
    (lambda p: p.update(verification_method="tree"), "verification_method"),
    (lambda p: p.update(max_supported_k=1), "max_supported_k"),
])
def test_the_validator_finds_what_breaks_the_schema(edit, says):
    p = sp.from_smoke(_doc(10, [6, 3, 1]))
    edit(p)
    problems = sp.validate(p)
    assert problems and any(says in x for x in problems), problems


def test_an_unmeasured_stub_is_valid_schema():
    stub = {"schema_version": "1.0", "measured": False, "num_speculative_tokens": 3, "mean_accept_length": None,
            "conditional_accept_rates": [0.0, 0.0, 0.0], "marginal_accept_rates": [0.0, 0.0, 0.0],
            "acceptance_length_histogram": None, "validation": None}
    assert sp.validate(stub) == []


def test_smoke_writes_a_profile_that_validates_and_matches_its_counts(invoke, tmp_path):
    out = tmp_path / "speculation_profile.json"
    r = invoke("smoke", TRAINED / "eagle3.1", "--target", TARGET, "--engine", "reference", "--num-prompts", "4",
               "--max-tokens", "32", "--profile", out, "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["profile"] == str(out)
    p = json.loads(out.read_text())
    assert sp.validate(p) == []
    assert p["marginal_accept_rates"] == [round(x, 6) for x in rep["per_position_acceptance"]]
    assert sum(p["acceptance_length_histogram"].values()) == rep["num_drafts"]
    assert p["mean_accept_length"] == pytest.approx(rep["mean_acceptance_length"], abs=1e-6)
    assert p["measurement_conditions"]["num_speculative_tokens"] == rep["num_speculative_tokens"] == 3


def test_check_card_validates_the_profile_and_shows_its_figures(invoke, tmp_path):
    p = sp.from_smoke(_doc(10, [6, 3, 1]))
    d = edited(TRAINED / "eagle3.1", tmp_path, name="drafter", files={sp.FILE: json.dumps(p)})
    r = invoke("check", d, "--card", "--json")
    assert r.exit_code == 0, r.stdout
    card = (d / "README.md").read_text()
    assert "## Measured acceptance (speculation_profile.json)" in card and "| 2 | 0.500 | 0.300 |" in card
    assert "mean acceptance length 2.000 per decode step" in card
    p["marginal_accept_rates"][1] = 0.9  # increases: not a survival function
    (d / sp.FILE).write_text(json.dumps(p))
    r = invoke("check", d, "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and "profile-invalid" in {f["rule_id"] for f in doc["findings"]}
    stub = {**p, "measured": False, "mean_accept_length": None, "marginal_accept_rates": [0.0] * 3,
            "conditional_accept_rates": [0.0] * 3, "acceptance_length_histogram": None}
    (d / sp.FILE).write_text(json.dumps(stub))
    doc = json.loads(invoke("check", d, "--json").stdout)
    assert "profile-unmeasured" in {f["rule_id"] for f in doc["findings"]}
    (d / sp.FILE).write_text("{not json")
    doc = json.loads(invoke("check", d, "--json").stdout)
    assert "profile-invalid" in {f["rule_id"] for f in doc["findings"]}


def test_the_profile_file_is_written_atomically_and_never_over_a_link(invoke, tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("keep")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    from eaglectl.errors import OutputExistsError

    with pytest.raises(OutputExistsError, match="not a regular file"):
        sp.write(link, sp.from_smoke(_doc(10, [6, 3, 1])))
    assert target.read_text() == "keep" and not list(tmp_path.glob(".link.json.eaglectl-*"))


# Real vLLM: the profile of its counters (validates, equals the committed reference counts) is checked on the
# engine-parity run, tests/test_smoke.py::test_vllm_counts_equal_the_reference_loop_exactly (one vLLM start-up less).
