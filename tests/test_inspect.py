"""`eaglectl inspect` end to end: dialects, planted defects, corrupt files, targets, exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from eaglectl.rules import RULES

from .conftest import CORRUPT, DEFECTS, DRAFTERS, ROOT, TARGET
from .helpers import edited, inspect_checkpoint

# fixture -> (dialect, eagle version, arch, exit code)
EXPECTED = {
    "eagle-3": ("eagle", "3", "llama", 0),
    "eagle-3-bin": ("eagle", "3", "llama", 0),
    "specforge-3": ("specforge", "3", "llama", 1),
    "specforge-3.1": ("specforge", "3.1", "llama", 1),
    "speculators-3": ("speculators", "3", "llama", 0),
    "speculators-3.1": ("speculators", "3.1", "llama", 0),
    "speculators-norm-before-fc": ("speculators", "3.1-single-norm", "llama", 0),
    "speculators-qwen3": ("speculators", "3", "qwen3", 0),
    "speculators-sharded": ("speculators", "3.1", "llama", 0),
    "torchspec-3.1": ("torchspec", "3.1", "llama", 1),
    "modelopt-3": ("modelopt", "3", "llama", 1),
    "modelopt-mla": ("modelopt", "3.1", "mla", 1),
    "nemo-3.1": ("nemo", "3.1", "llama", 1),  # model.-prefixed keys: vLLM cannot load it as is
    "speculators-fp8": ("speculators", "3.1", "llama", 0),  # ModelOpt FP8, quantised from trained/eagle3.1
}
# ids only in eagle_config: vLLM's V1 runner (CPU) captures them, V2 (the GPU default) the target's default
RUNNER_SPLIT = ("specforge-3", "specforge-3.1", "torchspec-3.1", "modelopt-3", "modelopt-mla")


# the findings each dialect fixture carries by design (pins the info rules too)
EXPECTED_FINDINGS = {
    "eagle-3": {"aux-ids-implicit", "embed-tokens-shared", "flags-implicit",
                "method-from-path", "rope-theta-missing"},  # the folder name contains "eagle-"
    "eagle-3-bin": {"aux-ids-implicit", "embed-tokens-shared", "flags-implicit",
                    "method-from-path", "pickle-file", "rope-theta-missing"},
    "modelopt-3": {"aux-convention-unverifiable", "embed-tokens-shared", "aux-ids-runner-split"},
    "modelopt-mla": {"aux-convention-unverifiable", "embed-tokens-shared", "aux-ids-runner-split"},
    "nemo-3.1": {"architectures-unregistered", "aux-ids-missing", "model-prefix"},
    "specforge-3": {"aux-ids-output-convention", "embed-tokens-shared", "aux-ids-runner-split"},
    "specforge-3.1": {"aux-ids-output-convention", "embed-tokens-shared", "specforge-norm-output-window",
                      "aux-ids-runner-split"},
    "speculators-3": set(),
    "speculators-3.1": set(),
    "speculators-norm-before-fc": set(),
    "speculators-qwen3": set(),
    "speculators-sharded": set(),
    "torchspec-3.1": {"aux-ids-output-convention", "metadata-format", "aux-ids-runner-split"},
    "speculators-fp8": {"embed-tokens-shared", "quantized"},  # no exotic-dtype, no mixed-dtypes
}


def _json(result) -> dict:
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_dialect_fixture_is_named(invoke, name):
    dialect, version, arch, code = EXPECTED[name]
    r = invoke("inspect", DRAFTERS / name, "--json", "--allow-pickle")
    assert r.exit_code == code, r.stderr
    doc = _json(r)
    assert (doc["dialect"], doc["eagle_version"], doc["arch"], doc["exit_code"]) == (dialect, version, arch, code)
    assert doc["schema"] == "eaglectl.inspect/1"
    assert {"dialect", "eagle_version", "spec", "findings", "exit_code", "speculative_config"} <= set(doc)
    assert doc["dialect_evidence"]
    assert {f["rule_id"] for f in doc["findings"]} == EXPECTED_FINDINGS[name]


def test_the_same_drafter_reads_the_same_in_every_dialect():
    """One EAGLE-3.1 drafter written in five layouts: same canonical tensors, values and semantics."""
    names = ["speculators-3.1", "speculators-sharded", "specforge-3.1", "torchspec-3.1", "nemo-3.1"]
    reports = {n: inspect_checkpoint(str(DRAFTERS / n)) for n in names}
    base = reports["speculators-3.1"]
    for name, rep in reports.items():
        for field in ("hidden_size", "target_hidden_size", "vocab_size", "draft_vocab_size", "fc_norm",
                      "norm_output", "norm_before_residual", "norm_before_fc", "num_aux_hidden_states"):
            assert getattr(rep.drafter.spec, field) == getattr(base.drafter.spec, field), (name, field)
        assert rep.drafter.spec.aux_layer_ids_vllm in (base.drafter.spec.aux_layer_ids_vllm, None), name
        names, base_names = rep.drafter.view.stored, base.drafter.view.stored
        shared = set(names) & set(base_names)
        assert set(names) - {"embed_tokens.weight"} == set(base_names) - {"embed_tokens.weight"}
        from eaglectl.io.checkpoint import open_checkpoint

        a, b = open_checkpoint(str(DRAFTERS / name)), open_checkpoint(str(DRAFTERS / "speculators-3.1"))
        for canon in shared:
            np.testing.assert_array_equal(a.read(names[canon]), b.read(base_names[canon]))


def test_output_convention_ids_translate_to_vllm_ids():
    sf = inspect_checkpoint(str(DRAFTERS / "specforge-3.1")).drafter.spec
    sp = inspect_checkpoint(str(DRAFTERS / "speculators-3.1")).drafter.spec
    assert (sf.aux_convention, sf.aux_layer_ids) == ("output", (0, 3, 6))
    assert (sp.aux_convention, sp.aux_layer_ids) == ("boundary", (1, 4, 7))
    assert sf.aux_layer_ids_vllm == sp.aux_layer_ids_vllm == (1, 4, 7)


@pytest.mark.parametrize("rule", sorted(p.name for p in DEFECTS.iterdir()))
def test_planted_defect_is_reported_under_its_rule(invoke, rule):
    with_target = ["--target", TARGET] if rule in NEEDS_TARGET else []
    # a rule about another engine is judged in a report for that engine (inspect --for); in vLLM's it is info
    engine = ["--for", RULES[rule].engine] if RULES[rule].engine in ("vllm", "sglang") else []
    r = invoke("inspect", DEFECTS / rule, "--json", "--scan", *with_target, *engine)
    doc = _json(r)
    hits = [f for f in doc["findings"] if f["rule_id"] == rule]
    assert hits, [f["rule_id"] for f in doc["findings"]]
    assert all(f["severity"] == RULES[rule].severity and f["message"] and f["hint"] for f in hits)
    expected = 1 if any(f["severity"] == "error" for f in doc["findings"]) else 0
    assert r.exit_code == doc["exit_code"] == expected


NEEDS_TARGET = {"draft-context-cap"}  # planted defects only a target reveals


def test_every_rule_with_a_fixture_or_a_test():
    """Each rule id is planted in fixtures/defects or exercised by name in this file."""
    planted = {p.name for p in DEFECTS.iterdir()}
    source = "".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    by_fixture = set().union(*EXPECTED_FINDINGS.values())
    missing = [r for r in RULES if r not in planted | by_fixture and f'"{r}"' not in source]
    assert not missing


def test_clean_fixtures_raise_no_silent_breakage(invoke):
    r = invoke("inspect", DRAFTERS / "speculators-3.1", "--json", "--scan")
    assert r.exit_code == 0 and [f["rule_id"] for f in _json(r)["findings"]] == ["scanned"]  # --scan says it ran
    assert "no NaN/Inf" in _json(r)["findings"][0]["message"]


def test_strict_fails_on_warnings(invoke):
    assert invoke("inspect", DEFECTS / "flag-absent").exit_code == 0
    assert invoke("inspect", DEFECTS / "flag-absent", "--strict").exit_code == 1


CORRUPT_CASES = sorted(p.name for p in CORRUPT.iterdir() if p.suffix != ".bin")


@pytest.mark.parametrize("name", CORRUPT_CASES)
def test_corrupt_input_gets_one_line_and_exit_4(invoke, name):
    r = invoke("inspect", CORRUPT / name)
    assert r.exit_code == 4
    assert r.stdout == ""
    first, *rest = r.stderr.strip().splitlines()
    assert first.startswith("error[corrupt-checkpoint]: ") and name in first
    assert "Traceback" not in r.stderr and all(line.startswith("hint:") for line in rest)


def test_corrupt_error_in_json_mode(invoke):
    r = invoke("inspect", CORRUPT / "hole.safetensors", "--json")
    assert r.exit_code == 4
    err = _json(r)["error"]
    assert err["reference"] == "corrupt-checkpoint" and err["exit_code"] == 4 and "'b'" in err["message"]


def test_pickle_policy_exit_codes(invoke):
    assert invoke("inspect", DRAFTERS / "eagle-3-bin").exit_code == 11
    r = invoke("inspect", CORRUPT / "not-a-pickle.bin", "--allow-pickle")
    assert r.exit_code == 4 and "not-a-pickle.bin" in r.stderr


def test_ambiguous_dialect_asks_for_from(invoke, tmp_path):
    d = edited(DRAFTERS / "eagle-3", tmp_path, name="d", config=lambda cfg: cfg.pop("architectures"))
    r = invoke("inspect", d)
    assert r.exit_code == 6 and "eagle and specforge" in r.stderr and "--from" in r.stderr
    r = invoke("inspect", d, "--from", "eagle", "--json")
    assert _json(r)["dialect"] == "eagle" and _json(r)["dialect_forced"] is True


def test_unknown_dialect(invoke, tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"encoder.weight": torch.zeros(2)}, tmp_path / "model.safetensors")
    r = invoke("inspect", tmp_path)
    assert r.exit_code == 5 and "error[unknown-format]" in r.stderr


def test_missing_source(invoke):
    r = invoke("inspect", "./no/such/drafter")
    assert r.exit_code == 3 and "error[checkpoint-not-found]" in r.stderr


def test_usage_error_is_2(invoke):
    from click.testing import CliRunner

    from eaglectl.cli.app import cli

    assert CliRunner().invoke(cli, ["inspect", str(DRAFTERS / "eagle-3"), "--from", "nope"]).exit_code == 2


def test_internal_error_is_70_with_debug_hint(monkeypatch, invoke):
    import eaglectl.commands.inspect

    def boom(*a, **k):
        raise ZeroDivisionError("oops")

    monkeypatch.setattr(eaglectl.commands.inspect, "run", boom)
    r = invoke("inspect", DRAFTERS / "eagle-3")
    assert r.exit_code == 70 and "EAGLECTL_DEBUG" in r.stderr and "Traceback" not in r.stderr


def test_human_output_has_every_section(invoke):
    r = invoke("-v", "inspect", DRAFTERS / "specforge-3.1", "--target", TARGET)
    out = r.stdout
    for part in ("dialect  specforge", "EAGLE    3.1", "spec", "aux ids (vLLM)", "tensors", "findings",
                 "specforge-norm-output-window", "target ", "aux-ids-runner-split",
                 "vLLM     v1: [0, 3, 6] from eagle_config.eagle_aux_hidden_state_layer_ids",
                 "         v2: [2, 4, 5] the target's default", "assumed (eaglectl's table of vLLM 0.32/0.33"):
        assert part in out, part
    assert "\x1b[" not in out  # not a terminal: no colour
    out = invoke("inspect", DRAFTERS / "speculators-3.1", "--target", TARGET).stdout
    for part in ("vllm serve", '"method": "eagle3"', "vLLM     v1 = v2: [1, 4, 7] from eagle_aux_hidden_state_layer_ids",
                 "fc_norm, norm_output applied; fc takes 3 aux states"):
        assert part in out, part


def test_speculative_config_is_ready_to_paste(invoke):
    doc = _json(invoke("inspect", DRAFTERS / "speculators-3.1", "--json"))
    cfg = doc["speculative_config"]
    assert cfg["method"] == "eagle3" and cfg["num_speculative_tokens"] == 3 and cfg["draft_tensor_parallel_size"] == 1
    assert cfg["model"] == str(DRAFTERS / "speculators-3.1")
    assert "tensor_parallel_size" not in cfg
    assert doc["serve_command"].startswith("vllm serve eaglectl-fixtures/target-llama --speculative-config ")


def test_method_from_path(invoke, tmp_path):
    doc = _json(invoke("inspect", edited(DRAFTERS / "speculators-3", tmp_path, name="my-eagle-head"), "--json"))
    assert "method-from-path" in {f["rule_id"] for f in doc["findings"]}
    doc = _json(invoke("inspect", edited(DRAFTERS / "speculators-3", tmp_path, name="my-eagle3-head"), "--json"))
    assert "method-from-path" not in {f["rule_id"] for f in doc["findings"]}


# ------------------------------------------------------------------------------------ target

def _target(tmp_path, **changes):
    return edited(TARGET, tmp_path, name="target", config=changes)


def _rules(invoke, drafter, target) -> dict[str, str]:
    doc = _json(invoke("inspect", drafter, "--target", target, "--json"))
    return {f["rule_id"]: f["message"] for f in doc["findings"]}


def test_matching_target_gives_only_facts(invoke):
    found = _rules(invoke, DRAFTERS / "speculators-3.1", TARGET)
    assert set(found) == {"target-embeddings"}
    assert "embed_tokens identical to the target's" in found["target-embeddings"]
    assert "lm_head trained separately" in found["target-embeddings"]


@pytest.mark.parametrize("changes,rule", [
    ({"vocab_size": 100}, "target-vocab-mismatch"),
    ({"hidden_size": 48}, "target-hidden-mismatch"),
    ({"num_hidden_layers": 6}, "target-aux-range"),
    ({"rope_theta": 500000.0}, "target-rope-differs"),
])
def test_target_disagreements(invoke, tmp_path, changes, rule):
    assert rule in _rules(invoke, DRAFTERS / "speculators-3.1", _target(tmp_path, **changes))


def test_output_convention_ids_are_checked_against_the_target_in_their_convention(invoke, tmp_path):
    # specforge ids [0, 3, 6] (output-of-layer) fit a 7-layer target; boundary ids [1, 4, 7] do too (7 = L)
    target = _target(tmp_path, num_hidden_layers=7)
    assert "target-aux-range" not in _rules(invoke, DRAFTERS / "specforge-3.1", target)
    assert "target-aux-range" not in _rules(invoke, DRAFTERS / "speculators-3.1", target)
    target6 = _target(tmp_path / "six", num_hidden_layers=6)
    assert "target-aux-range" in _rules(invoke, DRAFTERS / "specforge-3.1", target6)


def test_default_ids_collide_on_a_small_target(invoke, tmp_path):
    found = _rules(invoke, DRAFTERS / "eagle-3", _target(tmp_path, num_hidden_layers=6))
    assert "target-aux-default-collision" in found and "[2, 3]" in found["target-aux-default-collision"]


def test_verifier_mismatch(invoke, tmp_path):
    other = _target(tmp_path / "x")
    renamed = other.parent / "another-model"
    other.rename(renamed)
    assert "target-verifier-mismatch" in _rules(invoke, DRAFTERS / "speculators-3.1", renamed)


def test_target_without_weights_still_checks_config(invoke, tmp_path):
    dest = tmp_path / "cfg-only"
    dest.mkdir()
    shutil.copy(TARGET / "config.json", dest / "config.json")
    found = _rules(invoke, DRAFTERS / "speculators-3.1", dest)
    assert "target-embeddings" not in found and "target-vocab-mismatch" not in found


# -------------------------------------------------------------------------------- lightness

def test_header_only_inspect_does_not_import_torch():
    code = (
        "import sys\n"
        "from eaglectl.cli.app import cli\n"
        f"try:\n    cli(['inspect', {str(DRAFTERS / 'speculators-3.1')!r}, '--target', {str(TARGET)!r}, '--json'])\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = [m for m in ('torch', 'safetensors.torch', 'transformers', 'vllm') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)


def test_help_does_not_import_torch():
    code = "import sys\nfrom eaglectl.cli.app import cli\ntry:\n    cli(['--help'])\nexcept SystemExit:\n    pass\nassert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)


# ----------------------------------------------------- regressions from real published configs

def test_mla_ranks_are_checked_against_the_config(invoke, tmp_path):
    d = edited(DRAFTERS / "modelopt-mla", tmp_path, config={"q_lora_rank": 12, "kv_lora_rank": 20})
    doc = _json(invoke("inspect", d, "--json"))
    shapes = [f["message"] for f in doc["findings"] if f["rule_id"] == "tensor-shape"]
    assert any("q_a_proj" in m for m in shapes) and any("kv_a_proj_with_mqa" in m for m in shapes)
    assert doc["spec"]["head_dim"] == 72  # qk_nope 8 + qk_rope 64, not hidden / heads
    assert doc["spec"]["mla"] == {"q_lora_rank": 12, "kv_lora_rank": 20, "qk_nope_head_dim": 8, "qk_rope_head_dim": 64,
                                  "v_head_dim": 8}


def test_a_wrong_layer_count_is_one_finding_not_a_flood(invoke, tmp_path):
    doc = _json(invoke("inspect", edited(DRAFTERS / "nemo-3.1", tmp_path, config={"num_hidden_layers": 32}), "--json"))
    rules = [f["rule_id"] for f in doc["findings"]]
    assert rules.count("layer-count") == 1 and "missing-tensor" not in rules


def test_eagle_dash_wins_over_eagle3_in_vllm_method_inference(invoke, tmp_path):
    d = edited(DRAFTERS / "speculators-3", tmp_path, name="eagle-checkpoints/eagle3_export")
    doc = _json(invoke("inspect", d, "--json"))
    assert "method-from-path" in {f["rule_id"] for f in doc["findings"]}


def test_speculators_nested_rope_parameters_and_top_level_tie(invoke, tmp_path):
    def nested_rope(cfg):
        layer = cfg["transformer_layer_config"]
        del layer["tie_word_embeddings"], layer["rope_theta"]
        layer["rope_parameters"] = {"rope_type": "yarn", "factor": 32.0, "rope_theta": 150000.0}
        cfg["tie_word_embeddings"] = False

    dest = edited(DRAFTERS / "speculators-3", tmp_path, name="s", config=nested_rope)
    spec = _json(invoke("inspect", dest, "--json"))["spec"]
    assert spec["rope_scaling"]["rope_type"] == "yarn" and spec["rope_theta"] == 150000.0
    assert spec["tie_word_embeddings"] is False


def test_head_dim_required_when_hidden_is_not_divisible(invoke, tmp_path):
    def three_heads(cfg):
        cfg["num_attention_heads"] = 3
        del cfg["head_dim"]

    dest = edited(DRAFTERS / "specforge-3", tmp_path, config=three_heads)
    found = {f["rule_id"]: f["message"] for f in _json(invoke("inspect", dest, "--json"))["findings"]}
    assert "head_dim" in found["config-field-missing"]
