"""`smoke --runner`: each vLLM model runner measured on its own reading; V2 emulated on CPU by a staged copy.

The drafter here is the trained EAGLE-3 fixture (trained on the target's default layers [2, 4, 5]) in the SpecForge
layout with its ids only in `eagle_config` ([1, 3, 4], output-numbered): vLLM's V1 runner reads them as they
stand, Model Runner V2 never reads that key and captures the target's default (2, 4, 5). The vLLM test is marked
`vllm` and `slow` (one worker run: both runners and a copy pinned by hand).
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.commands.smoke import runner as runner_smoke
from eaglectl.engines.readings import table_readings
from eaglectl.engines.target_support import engines_own

from .conftest import ROOT
from .helpers import smoke

TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"
SPLIT_IDS = [1, 3, 4]  # V1 reads these; V2 the default (2, 4, 5), which the drafter was trained on


def plant(dest, *, eagle_config_ids=SPLIT_IDS, top_level=None):
    """The trained eagle3 weights (hard-linked) under a SpecForge-layout config: the ids only in eagle_config, or
    (`top_level`, pinned by hand) only at the top level."""
    dest.mkdir()
    os.link(TRAINED / "eagle3" / "model.safetensors", dest / "model.safetensors")
    cfg = json.loads((TRAINED / "eagle3" / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    if top_level is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = top_level
    else:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": eagle_config_ids}
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    return dest


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    return plant(tmp_path_factory.mktemp("runners") / "specforge-split")


def _digest(folder):
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.iterdir())}


# ------------------------------------------------------------------------------------------ options

def test_serving_options_parse_and_refuse():
    assert runner_smoke.parse_serving_options(["rejection_sample_method=block"]) == {
        "rejection_sample_method": "block"}
    for bad, why in (("rejection_sample_method", "KEY=VALUE"), ("temperature=1", "unknown serving option"),
                     ("rejection_sample_method=lossy", "not one of")):
        with pytest.raises(ValueError, match=why):
            runner_smoke.parse_serving_options([bad])
    req = runner_smoke.serving_request({"rejection_sample_method": "fly"})
    assert req["rejection_sample_method"] == {"value": "fly", "set_by": "user (--serving-option)"}
    assert req["draft_lm_head_quantization"] == {"value": None, "set_by": "eaglectl (standard)"}
    rec = runner_smoke.serving_record(req, {"rejection_sample_method": {"in_vllm": True},
                                            "draft_lm_head_quantization": {"in_vllm": False}},
                                      k=3, dtype="float32", max_model_len=1024, seed=0, engine="vllm")
    assert rec["overridden"] == ["rejection_sample_method"] and rec["standard"] is False
    assert rec["speculative"]["draft_lm_head_quantization"]["in_vllm"] is False
    assert (rec["num_speculative_tokens"], rec["temperature"], rec["max_model_len"]) == (3, 0.0, 1024)


@pytest.mark.parametrize("args, message", [
    (["--runner", "v3"], "'v3' is not one of"),
    (["--serving-option", "rejection_sample_method=lossy"], "not one of"),
    (["--serving-option", "top_p=0.5"], "unknown serving option"),
    (["--serving-option", "rejection_sample_method=block", "--serving-option", "rejection_sample_method=fly"],
     "given twice"),
    (["--engine", "reference", "--serving-option", "rejection_sample_method=block"], "the reference loop"),
])
def test_bad_runner_and_serving_options_are_usage_errors(invoke, args, message):
    r = invoke("smoke", TRAINED / "eagle3", "--target", TARGET, *args)
    assert r.exit_code == 2 and message in r.stderr, r.stderr


def test_default_runners_follow_the_split(split):
    readings = table_readings(json.loads((split / "config.json").read_text()), 8)
    assert readings.split and runner_smoke.choose(None, readings) == ["v1", "v2"]
    same = table_readings(json.loads((TRAINED / "eagle3.1" / "config.json").read_text()), 8)
    assert not same.split and runner_smoke.choose(None, same) == ["v1"]
    assert runner_smoke.choose("v2", same) == ["v2"] and runner_smoke.choose("both", same) == ["v1", "v2"]
    runs = runner_smoke.plan(None, readings)
    assert [(r.name, r.boundary_ids) for r in runs] == [("drafter", (1, 3, 4)), ("drafter@v2", (2, 4, 5))]


# ------------------------------------------------------------------------------------------ staging

def test_staged_copy_pins_v2_and_leaves_the_source_untouched(split):
    before = _digest(split)
    v2 = table_readings(json.loads((split / "config.json").read_text()), 8).get("v2")
    staged = runner_smoke.stage_pinned(split, v2.boundary_ids)
    try:
        cfg = json.loads((staged / "config.json").read_text())
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
        assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": SPLIT_IDS}  # kept as it was
        assert cfg["eaglectl_staged"]["runner"] == "v2" and cfg["eaglectl_staged"]["source"] == str(split.resolve())
        # the weights are the source's own file (a link), not a copy
        assert (staged / "model.safetensors").stat().st_ino == (split / "model.safetensors").stat().st_ino
        runner_smoke.check_staged(staged, (2, 4, 5), 8)
        both = table_readings(cfg, 8)
        assert both.get("v1").boundary_ids == both.get("v2").boundary_ids == (2, 4, 5)
        assert open_drafter(str(staged)).spec.hidden_size == open_drafter(str(split)).spec.hidden_size
    finally:
        import shutil

        shutil.rmtree(staged)
    assert _digest(split) == before and (split / "model.safetensors").exists()
    run = runner_smoke.RunnerRun("v2", v2, (2, 4, 5), emulated=True)
    assert run.label() == "V2 emulated on the V1 runner: top-level ids pinned to V2's selection [2, 4, 5]"


def test_log_sections_find_each_runners_aux_line():
    log = ("noise\neaglectl-smoke: configuration drafter\nINFO Using auxiliary layers from speculative config: "
           "(1, 3, 4)\neaglectl-smoke: configuration drafter@v2\nINFO Using Eagle3 auxiliary layers from model: "
           "(2, 4, 5)\n")
    sections = runner_smoke.log_sections(log)
    assert runner_smoke.aux_line(sections["drafter"]) == (
        "Using auxiliary layers from speculative config: (1, 3, 4)", "v1")
    assert runner_smoke.aux_line(sections["drafter@v2"])[1] == "v2"
    assert runner_smoke.aux_line("no such line") == (None, None)


# ------------------------------------------------------------------------------------------ the reference loop

ARGS = ["--target", TARGET, "--engine", "reference", "--num-prompts", "4", "--max-tokens", "32", "--baseline", "none"]


def test_runner_split_is_a_red_flag_with_both_lists_and_both_als(invoke, split, tmp_path):
    profile = tmp_path / "speculation_profile.json"
    r = invoke("smoke", split, *ARGS, "--json", "--profile", profile)
    doc = json.loads(r.stdout)
    assert r.exit_code == 9 and r.stderr.startswith("error[smoke-failed]: vLLM's runners read different layers")
    runs = {x["runner"]: x for x in doc["runners"]}
    assert runs["v1"]["boundary_ids"] == SPLIT_IDS and runs["v2"]["boundary_ids"] == [2, 4, 5]
    # the reference loop ran each runner's reading, not the dialect table's (which reads [2, 4, 5] for both)
    assert runs["v2"]["mean_acceptance_length"] > runs["v1"]["mean_acceptance_length"] + 0.1
    assert doc["mean_acceptance_length"] == runs["v1"]["mean_acceptance_length"]  # the headline: the first runner
    assert doc["baselines"][0]["name"] == "none"  # the second runner is no baseline
    assert doc["intended_reading"] == {"boundary_ids": [2, 4, 5], "basis": "measured by the probe"}
    assert doc["reference_layers"]["boundary_ids"] == {"v1": SPLIT_IDS, "v2": [2, 4, 5]}
    al1, al2 = runs["v1"]["mean_acceptance_length"], runs["v2"]["mean_acceptance_length"]
    assert doc["red_flags"][0] == (f"vLLM's runners read different layers: V1 [1, 3, 4] (AL {al1:.3f}), V2 [2, 4, 5] "
                                   f"(AL {al2:.3f}); intended [2, 4, 5] (measured by the probe)")
    assert len(doc["red_flags"]) == 1  # one line for the split (V2 reads what the drafter was trained on)
    assert doc["serving_options"]["speculative"]["rejection_sample_method"]["value"] == "standard"
    cond = json.loads(profile.read_text())["measurement_conditions"]
    assert cond["rejection_sample_method"] == "standard" and cond["serving_options_overridden"] == []


def test_runner_v2_and_measured_layers_on_the_reference_loop(invoke, split):
    r = invoke("smoke", split, *ARGS, "--runner", "v2")
    assert r.exit_code == 0, r.stderr  # V2 alone, judged against the intended reading: it reads it
    assert "v2: V2 [2, 4, 5]; AL" in r.stdout and "vLLM V2's reading [2, 4, 5] (assumed)" in r.stdout
    assert "vLLM's runners read different layers: V1 [1, 3, 4], V2 [2, 4, 5]; --runner v2 measures V2 only" in (
        " ".join(r.stdout.split()))
    one = json.loads(invoke("smoke", split, *ARGS, "--runner", "v1", "--json").stdout)
    assert one["exit_code"] == 9 and one["red_flags"][0].startswith("vLLM V1 reads [1, 3, 4] (V1 AL ")
    m = invoke("smoke", split, *ARGS, "--reference-layers", "measured", "--json")
    doc = json.loads(m.stdout)
    assert doc["reference_layers"]["from"].startswith("measured by the probe")
    assert doc["reference_layers"]["boundary_ids"] == [2, 4, 5] and len(doc["runners"]) == 1
    assert "not measured" in doc["red_flags"][0]  # the split is named; no runner was measured on its own reading


def test_no_split_runs_one_runner_quietly(invoke):
    r = invoke("smoke", TRAINED / "eagle3.1", *ARGS[:-2], "--num-prompts", "2", "--max-tokens", "16", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and [x["runner"] for x in doc["runners"]] == ["v1"] and not doc["red_flags"]


# ------------------------------------------------------------------------------------------ real vLLM (slow)

@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_runner_v2_equals_a_config_pinned_by_hand(tmp_path, vllm_py):
    """One worker run: V1 and V2 (emulated: the staged copy) of the split drafter, and a copy pinned by hand."""
    from eaglectl.commands.requests import Baseline
    
    from .test_smoke import EXPECTED

    python = vllm_py
    source = plant(tmp_path / "split")
    by_hand = plant(tmp_path / "by-hand", top_level=[2, 4, 5])
    before = _digest(source)
    rep = smoke(str(source), str(TARGET), engine="vllm", k=3, num_prompts=16, max_tokens=64, concurrency=(1,),
                baselines=[Baseline("by-hand", "eagle3", str(by_hand))], vllm_python=python, runner="both").to_json()
    runs = {x["runner"]: x for x in rep["runners"]}
    pinned = rep["baselines"][0]
    counted = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos")
    assert {c: runs["v2"][c] for c in counted} == {c: pinned[c] for c in counted}
    e = EXPECTED["eagle3-k3-short"]  # and that is the drafter on the layers it was trained on
    assert runs["v2"]["num_drafts"] == e["num_drafts"] and runs["v2"]["num_accepted_tokens"] == e["num_accepted_tokens"]
    assert runs["v1"]["mean_acceptance_length"] < runs["v2"]["mean_acceptance_length"]
    assert runs["v2"]["emulated"] and runs["v2"]["label"] == (
        "V2 emulated on the V1 runner: top-level ids pinned to V2's selection [2, 4, 5]")
    assert runs["v1"]["runner_used"] == runs["v2"]["runner_used"] == "v1"  # CPU vLLM runs V1
    assert "(2, 4, 5)" in runs["v2"]["aux_log_line"] and "(1, 3, 4)" in runs["v1"]["aux_log_line"]
    assert engines_own(runs["v1"]["reading"]["basis"])  # vLLM asked, or its code verified by hash
    # each runner's counts are the reference loop's on that runner's reading
    assert runs["v1"]["engine_reading"]["matched"]["boundary_ids"] == SPLIT_IDS
    assert runs["v2"]["engine_reading"]["matched"]["boundary_ids"] == [2, 4, 5]
    assert rep["exit_code"] == 9
    assert rep["red_flags"][0].startswith("vLLM's runners read different layers: V1 [1, 3, 4]")
    assert rep["serving_options"]["speculative"]["rejection_sample_method"] == {
        "value": "standard", "set_by": "eaglectl (standard)", "in_vllm": True}
    assert _digest(source) == before and not os.path.exists(runs["v2"]["staged"])  # removed, source untouched


@pytest.mark.slow
def test_gpu_script_dry_run_prepares_and_predicts(tmp_path):
    """benchmarks/gpu_parity.py's runner check without vLLM: the three drafters, their readings and the V2
    predictions (what a GPU server must then reproduce)."""
    import subprocess
    import sys

    from .test_smoke import EXPECTED

    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_parity.py"), "--dry-run", "--skip-parity",
                        "--work", str(tmp_path / "work"), "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {row["drafter"]: row for row in json.loads(out.read_text())["runner_check"]["drafters"]}
    assert list(rows) == ["split", "upgraded", "speculators"] and "runner check (vLLM Model Runner V2" in r.stdout
    split = rows["split"]
    assert (split["v1_reads"], split["v2_reads"], split["intended"]) == (SPLIT_IDS, [2, 4, 5], [2, 4, 5])
    e = EXPECTED["eagle3-k3-short"]
    assert split["predicted_counts"]["num_drafts"] == e["num_drafts"]
    assert split["predicted_counts"]["num_accepted_tokens"] == e["num_accepted_tokens"]
    assert rows["speculators"]["v1_reads"] == rows["speculators"]["v2_reads"] == [2, 4, 5]
    assert all(row["served"] is None and row["passed"] is None for row in rows.values())
