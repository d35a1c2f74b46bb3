"""`smoke` on the drafter families beside EAGLE-3 (docs/families.md#smoke): vLLM's CPU build serves P-EAGLE (eagle3 with
parallel_drafting) and DFlash, and smoke reports vLLM's own counts for them; where smoke cannot measure a family (the
reference loop runs none of them; a CPU build runs V1, which refuses DSpark) it says undecided, with the limit's
owner, in the exit codes `check` maps to undecided."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglectl.engines.engine_process import vllm_has_gpu
from eaglectl.errors import MissingDependencyError, ReferenceLimitError
from eaglectl.formats.families import FAMILIES, smoke_limit

from .conftest import FIXTURES, ROOT
from .helpers import edited

TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"
K = 3


def _smoke(invoke, drafter, *args):
    # the synthetic family fixtures are sized for the small target (the pre-flight refuses another target's sizes)
    target = FIXTURES / "target-llama" if drafter.parent == FIXTURES / "families" else TARGET
    r = invoke("smoke", drafter, "--target", target, "--num-prompts", 4, "--concurrency", 1, "-k", K, *args)
    return r


def test_smoke_limits_are_the_registry_data():
    """The reference loop measures no family; on a CPU build (V1) only the methods V1 refuses are undecided, on a
    GPU none: each answer is the registry's own reason."""
    for f in (f for f in FAMILIES if f.reading is not None):
        assert smoke_limit(f, "reference") == f.reading.reference != ""
        v1 = f.reading.runners["v1"]
        assert smoke_limit(f, "vllm", gpu=False) == (None if v1 is None else f"{v1}; this vLLM is a CPU build")
        assert smoke_limit(f, "vllm", gpu=True) is None
    assert [f.id for f in FAMILIES if f.reading and smoke_limit(f, "vllm", gpu=False)] == ["dspark"]


@pytest.mark.parametrize("drafter", [FIXTURES / "families" / "dspark", FIXTURES / "families" / "dflash",
                                     TRAINED / "peagle"])
def test_reference_loop_says_undecided_for_every_family(invoke, drafter):
    r = _smoke(invoke, drafter, "--engine", "reference")
    assert r.exit_code == ReferenceLimitError.exit_code, r.stderr
    assert "undecided, smoke cannot measure it here: eaglectl's reference loop drafts EAGLE-3's chain" in r.stderr
    assert f"eaglectl smoke {drafter} --target " in r.stderr and "SOURCE" not in r.stderr  # it runs as printed


@pytest.mark.vllm
def test_dspark_on_a_cpu_build_is_undecided_without_running_vllm(invoke, vllm_py):
    """vLLM is not started: the registry (V1 refuses dspark) and the build (no GPU) decide it."""
    if vllm_has_gpu(vllm_py):
        pytest.skip("a GPU build of vLLM serves dspark on Model Runner V2")
    r = _smoke(invoke, FIXTURES / "families" / "dspark", "--engine", "vllm", "--vllm-python", vllm_py)
    assert r.exit_code == MissingDependencyError.exit_code, r.stderr
    assert "DSpark (method dspark): undecided" in r.stderr
    assert "V1 runner refuses method dspark" in r.stderr and "this vLLM is a CPU build" in r.stderr


def test_a_family_with_inspect_errors_is_refused_before_any_engine(invoke, tmp_path):
    """The pre-flight reads the family's own rules: a mask token the target lacks stops smoke (exit 9)."""
    bad = edited(TRAINED / "dflash-untrained", tmp_path, config={"dflash_config": {"mask_token_id": 4000,
                                                                                  "target_layer_ids": [1, 4, 6]}})
    r = _smoke(invoke, bad, "--engine", "vllm", "--vllm-python", "/nonexistent/python")
    assert r.exit_code == 9, r.stderr
    assert "[family-mask-token]" in r.stderr


def _consistent(doc: dict) -> None:
    """The headline counts are vLLM's pooled metrics; they agree with its per-request metrics and with k."""
    reqs = doc["requests"]
    assert doc["num_drafts"] > 0 and len(reqs) == 4
    assert doc["num_drafts"] == sum(r["num_drafts"] for r in reqs)
    assert doc["num_accepted_tokens"] == sum(r["num_accepted_tokens"] for r in reqs)
    assert doc["num_draft_tokens"] == K * doc["num_drafts"]
    assert len(doc["per_position_acceptance"]) == K
    per_pos = [sum(col) for col in zip(*(r["accepted_per_pos"] for r in reqs), strict=True)]
    assert sum(per_pos) == doc["num_accepted_tokens"]
    assert doc["per_position_acceptance"] == [a / doc["num_drafts"] for a in per_pos]
    assert doc["greedy_match"] == 1.0  # speculation is lossless


@pytest.mark.vllm
@pytest.mark.slow
def test_peagle_is_measured_with_parallel_drafting(invoke, vllm_py, tmp_path):
    """P-EAGLE (the trained EAGLE-3 drafter plus a fitted mask_hidden): position 1 drafts as EAGLE-3 does; positions
    2..k come from masked slots. Served as a plain EAGLE-3 chain they would be accepted about as often as position 1
    (trained/expected.json: 0.87, 0.79, 0.73), so the drop after position 1 shows that vLLM drafted in parallel; with
    mask_hidden zeroed vLLM accepts fewer of them, so it reads the fitted one."""
    import torch

    def measured(drafter: Path) -> dict:
        r = _smoke(invoke, drafter, "--engine", "vllm", "--vllm-python", vllm_py, "--max-tokens", 32, "--baseline",
                   "none", "--json")
        assert r.exit_code == 0, r.stderr[-3000:]
        return json.loads(r.stdout)

    doc = measured(TRAINED / "peagle")
    assert doc["family"]["id"] == "peagle" and doc["family"]["extra"] == {"parallel_drafting": True}
    _consistent(doc)
    assert doc["red_flags"] == []
    first, *later = doc["per_position_acceptance"]
    assert first > 0.5 and all(p < 0.6 * first for p in later)
    assert doc["runners"][0]["runner_used"] == "v1"
    assert doc["engine_reading"] is None and doc["engine_reading_note"].startswith("not replayed: ")
    zero = edited(TRAINED / "peagle", tmp_path, tensors={"mask_hidden": torch.zeros(1, 384, dtype=torch.bfloat16)})
    unfitted = measured(zero)
    masked = lambda d: sum(_counts(d)[2][1:])  # noqa: E731 (tokens accepted at positions 2..k)
    assert masked(unfitted) < masked(doc)
    # written in speculators' own P-EAGLE form (vLLM's peagle reader: the mask token at the top level), vLLM
    # accepts exactly the same tokens at every position
    out = tmp_path / "speculators"
    r = invoke("convert", TRAINED / "peagle", out, "--to", "speculators", "--target", TARGET, "--base-model",
               "org/target")
    assert r.exit_code == 0, r.stderr
    assert json.loads((out / "config.json").read_text())["speculators_model_type"] == "peagle"
    assert _counts(measured(out)) == _counts(doc)


@pytest.mark.vllm
@pytest.mark.slow
def test_dflash_is_served_and_its_random_fixture_is_flagged(invoke, vllm_py):
    """DFlash in its own layout, by its own method: vLLM's CPU build loads and drafts it. The fixture's weights are
    random, so vLLM accepts nothing and smoke raises the AL-about-1 red flag (exit 9) on vLLM's counts."""
    r = _smoke(invoke, TRAINED / "dflash-untrained", "--engine", "vllm", "--vllm-python", vllm_py, "--max-tokens", 16,
               "--json")
    assert r.exit_code == 9, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["family"]["id"] == "dflash" and doc["family"]["method"] == "dflash"
    _consistent(doc)
    assert doc["num_accepted_tokens"] == 0 and doc["mean_acceptance_length"] == 1.0
    assert len(doc["red_flags"]) == 1 and doc["red_flags"][0].startswith("acceptance length 1.000 is about 1.0")
    assert doc["versions"]["cuda"] is False


def _counts(doc: dict) -> tuple:
    return (doc["num_drafts"], doc["num_accepted_tokens"],
            [sum(col) for col in zip(*(r["accepted_per_pos"] for r in doc["requests"]), strict=True)])


@pytest.mark.vllm
@pytest.mark.slow
def test_a_trained_dflash_keeps_what_vllm_accepts_through_a_conversion(invoke, vllm_py, tmp_path):
    """fixtures/trained/dflash drafts well under vLLM. Written by TorchSpec (training names vLLM's loader refuses) and
    converted to the speculators format, vLLM accepts exactly the same tokens at every position. The same files with
    the layer ids written as the source numbers them (output-of-layer ids in the format's boundary field: the
    off-by-one convert translates) draft differently: the equality is not for lack of sensitivity."""
    from .test_family_convert import _torchspec

    def measured(drafter: Path) -> dict:
        r = _smoke(invoke, drafter, "--engine", "vllm", "--vllm-python", vllm_py, "--max-tokens", 32, "--baseline",
                   "none", "--json")
        assert r.exit_code == 0, r.stderr[-3000:]
        doc = json.loads(r.stdout)
        assert doc["family"]["method"] == "dflash" and doc["red_flags"] == []
        return doc

    before = measured(TRAINED / "dflash")
    assert before["mean_acceptance_length"] > 2.0  # vLLM's arithmetic is the trainer's (make_served_families.py)
    out = tmp_path / "served"
    r = invoke("convert", _torchspec(tmp_path, TRAINED / "dflash"), out, "--to", "dflash-speculators", "--target",
               TARGET, "--base-model", "org/target")
    assert r.exit_code == 0, r.stderr
    after = measured(out)
    assert _counts(after) == _counts(before)
    assert after["mean_acceptance_length"] == before["mean_acceptance_length"]
    written = json.loads((out / "config.json").read_text())["aux_hidden_state_layer_ids"]
    assert written == [2, 5, 7]  # boundaries of the output-of-layer ids [1, 4, 6]
    shifted = edited(out, tmp_path, name="shifted", config={"aux_hidden_state_layer_ids": [1, 4, 6]})
    assert _counts(measured(shifted))[1] < before["num_accepted_tokens"]


def _gate(invoke, drafter, *args):
    r = invoke("check", drafter, "--json", *args)
    doc = json.loads(r.stdout)
    return r, doc, {s["name"]: s for s in doc["stages"]}


def test_check_gates_a_dflash_drafter_on_its_own_rules(invoke, tmp_path):
    """check reads a DFlash drafter in its layout: inspect by the family's rules, parity undecided (eaglectl's
    reference drafts no DFlash), the card unlinted, the publish stage on its files: UNDECIDED, exit 10."""
    r, doc, stages = _gate(invoke, TRAINED / "dflash-untrained", "--target", TARGET)
    assert r.exit_code == 10 and doc["verdict"] == "UNDECIDED", r.stderr
    assert [s["status"] for s in doc["stages"]] == ["pass", "undecided", "skipped", "skipped", "pass"]
    assert stages["inspect"]["data"]["family"] == "dflash"
    assert "no block-parallel DFlash drafter" in stages["parity"]["detail"] and not stages["parity"]["environment"]
    bad = edited(TRAINED / "dflash-untrained", tmp_path, config={"_name_or_path": "/home/me/run7/dflash",
                                                               "dflash_config": {"mask_token_id": 4000,
                                                                                 "target_layer_ids": [1, 4, 6]}})
    r, doc, stages = _gate(invoke, bad, "--target", TARGET, "--card")
    assert r.exit_code == 1 and doc["verdict"] == "FAIL", r.stderr
    assert stages["inspect"]["status"] == "fail" and stages["parity"]["status"] == "skipped"
    assert stages["card"]["status"] == "undecided" and stages["publish"]["status"] == "fail"
    assert {"family-mask-token", "local-path"} <= {f["rule_id"] for f in doc["findings"]}
    assert not (bad / "README.md").exists()


@pytest.mark.vllm
@pytest.mark.slow
def test_check_smoke_measures_a_dflash_drafter_under_vllm(invoke, vllm_py):
    """check --smoke runs smoke's family path: vLLM's counts, and the random fixture's AL-about-1 red flag fails the
    stage (a DSpark drafter on a CPU build: undecided, vLLM not started)."""
    r, doc, stages = _gate(invoke, TRAINED / "dflash-untrained", "--target", TARGET, "--smoke", "--vllm-python",
                           vllm_py, "--num-prompts", 4, "-k", K)
    assert r.exit_code == 1 and stages["smoke"]["status"] == "fail", r.stderr
    assert "acceptance length 1.000 is about 1.0" in stages["smoke"]["detail"]
    sm = stages["smoke"]["data"]  # vLLM's counts (the gate runs no baseline: greedy_match is not measured)
    assert sm["family"]["method"] == "dflash" and sm["num_drafts"] > 0 and sm["num_accepted_tokens"] == 0
    assert sm["num_draft_tokens"] == K * sm["num_drafts"] == K * sum(r["num_drafts"] for r in sm["requests"])
    if not vllm_has_gpu(vllm_py):
        r, doc, stages = _gate(invoke, FIXTURES / "families" / "dspark", "--smoke", "--vllm-python", vllm_py,
                               "--target", FIXTURES / "target-llama")  # the target it is sized for
        assert stages["smoke"]["status"] == "undecided" and "this vLLM is a CPU build" in stages["smoke"]["detail"]
