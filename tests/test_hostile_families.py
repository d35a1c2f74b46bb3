"""Issue 44: DFlash, DSpark and P-EAGLE checked as strictly as EAGLE-3. Every config value vLLM 0.32's DFlash / DSpark
code reads is checked by type and range, the layer ids it captures, what one value demands of another, and each
weight against the config (eaglectl/families/validate.py); P-EAGLE's mask_hidden dtype, its mask token's range and
a quantization_config vLLM cannot read are refused; convert bounds what it reads before any loop and re-reads the
written values; and seeded fuzzing of family configs, weights and target configs finds no internal error."""

from __future__ import annotations

import resource
import time

import pytest
import torch

from .conftest import FIXTURES
from .fuzzing import clean, fuzz_families, fuzz_targets
from .helpers import edited, run_json

FAM = FIXTURES / "families"
TRAINED = FIXTURES / "trained"
DFLASH = TRAINED / "dflash"  # every tensor vLLM loads, trained on TRAINED / "target" (8 layers, vocab 320)
PEAGLE = TRAINED / "peagle"
TARGET = TRAINED / "target"


def _errors(doc: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in doc["findings"]:
        if f["severity"] == "error":
            out.setdefault(f["rule_id"], []).append(f["message"])
    return out


def _set(path: str, value):
    def edit(cfg):
        *parents, last = path.split(".")
        node = cfg
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return edit


# (fixture, config path, value, the rule that refuses it, a piece of its message)
HOSTILE_CONFIG = [
    (DFLASH, "dflash_config.target_layer_ids", -1, "config-field-invalid", "should be a list of at most 64 integers"),
    (DFLASH, "dflash_config.target_layer_ids", 2**63, "config-field-invalid", "got 9223372036854775808"),
    (DFLASH, "dflash_config.target_layer_ids", "abc", "config-field-invalid", 'got "abc"'),
    (DFLASH, "dflash_config.target_layer_ids", [], "family-layer-ids", "no target layer ids vLLM can read"),
    (DFLASH, "dflash_config.target_layer_ids", None, "family-layer-ids", "no target layer ids vLLM can read"),
    (DFLASH, "dflash_config.target_layer_ids", list(range(10**6)), "config-field-invalid", "at most 64 integers"),
    (DFLASH, "dflash_config.target_layer_ids", [4, 4, 6], "family-layer-ids", "gets 2"),
    (DFLASH, "dflash_config.target_layer_ids", [4, 1, 6], "family-layer-ids", "in layer order"),
    (DFLASH, "dflash_config.target_layer_ids", [1, 4, 60], "family-layers-range", "beyond the 8-layer target"),
    (FAM / "dspark", "target_layer_ids", ["1"], "config-field-invalid", "'target_layer_ids' should be a list"),
    (DFLASH, "num_hidden_layers", 10**12, "config-field-invalid", "'num_hidden_layers' should be an integer in "
                                                                   "[1, 256]"),
    (DFLASH, "num_hidden_layers", 2, "missing-tensor", "'layers.N.mlp.down_proj.weight' is absent (layers 1)"),
    (DFLASH, "num_hidden_layers", "8", "config-field-invalid", "got \"8\""),
    (DFLASH, "num_hidden_layers", None, "config-field-missing", "no 'num_hidden_layers': vLLM would build"),
    (DFLASH, "hidden_size", 0, "config-field-invalid", "'hidden_size' should be an integer"),
    (DFLASH, "hidden_size", 64, "tensor-shape", "'fc.weight' is [128, 384]; the config makes vLLM's parameter "
                                                "[64, 192]"),
    (DFLASH, "vocab_size", 8.5, "config-field-invalid", "'vocab_size' should be an integer"),
    (DFLASH, "block_size", 10**9, "config-field-invalid", "'block_size' should be an integer in [1, 1024]"),
    (DFLASH, "layer_types", ["full_attention"] * 3, "family-config", "layer_types has 3 entries for "
                                                                     "num_hidden_layers 1"),
    (DFLASH, "layer_types", ["sliding_attention"], "family-config", "a sliding layer without"),
    (DFLASH, "layer_types", "full_attention", "config-field-invalid", "'layer_types' should be a list"),
    (DFLASH, "dflash_config.use_swa", True, "family-config", "a sliding layer without"),
    (DFLASH, "sliding_window", -4, "config-field-invalid", "'sliding_window' should be an integer"),
    (DFLASH, "num_target_layers", 10**6, "config-field-invalid", "'num_target_layers' should be an integer in "
                                                                 "[1, 4096]"),
    (DFLASH, "dflash_config", "abc", "config-field-invalid", "'dflash_config' should be an object"),
    (DFLASH, "draft_vocab_size", 4096, "family-config", "draft_vocab_size 4096 exceeds vocab_size 320"),
    (DFLASH, "rms_norm_eps", float("nan"), "config-field-invalid", "'rms_norm_eps' should be a finite number"),
    (DFLASH, "num_key_value_heads", 3, "family-config", "not a multiple of num_key_value_heads 3"),
    (DFLASH, "dflash_config.mask_token_id", 2**63, "family-mask-token", "not a token id"),
    (DFLASH, "dflash_config.mask_token_id", 320, "family-mask-token", "outside the drafter's vocabulary"),
    (FAM / "dspark", "markov_rank", 10**12, "tensor-shape", "'markov_head.markov_w1.weight' is [128, 8]"),
    (FAM / "dspark", "markov_rank", "r", "config-field-invalid", "'markov_rank' should be an integer"),
    (FAM / "dspark", "markov_rank", None, "family-config", "no markov_rank"),
]


@pytest.mark.parametrize("fixture,path,value,rule_id,says", HOSTILE_CONFIG,
                         ids=[f"{f.name}-{p}-{str(v)[:12]}" for f, p, v, *_ in HOSTILE_CONFIG])
def test_every_value_vllm_reads_is_checked(invoke, tmp_path, fixture, path, value, rule_id, says):
    """1,305 hostile values of these fields passed inspect with exit 0 (and with --target); the same values on an
    EAGLE-3 config got exit 1 or 4."""
    src = edited(fixture, tmp_path, config=_set(path, value))
    for args in ((), ("--target", TARGET)):
        _, doc = run_json(invoke, "inspect", src, *args, code=1)
        assert any(says in m for m in _errors(doc).get(rule_id, [])), (args, _errors(doc))
    if fixture == DFLASH:  # convert refuses the source by the same finding, before writing
        out = tmp_path / "out"
        r = invoke("convert", src, out, "--to", "dflash-speculators", "--base-model", "a/b", "--dry-run")
        assert r.exit_code == 7 and "source has error [" in r.stderr, r.output
        assert not out.exists()


def test_the_clean_fixtures_pass(invoke):
    for src in (DFLASH, FAM / "dflash", FAM / "dspark", TRAINED / "dflash-untrained"):
        _, doc = run_json(invoke, "inspect", src, "--scan", code=0)
        assert not _errors(doc), (src, _errors(doc))


# (tensor edits, the rule, a piece of its message)
HOSTILE_WEIGHTS = [
    ({"fc.weight": None}, "missing-tensor", "'fc.weight' is absent"),
    ({"fc.weight": torch.zeros(128 * 384, dtype=torch.bfloat16)}, "tensor-shape", "'fc.weight' is [49152]"),
    ({"fc.weight": torch.zeros(128, 383, dtype=torch.bfloat16)}, "tensor-shape", "'fc.weight' is [128, 383]"),
    ({"fc.weight": torch.zeros(128, 384, dtype=torch.int64)}, "family-tensor", "'fc.weight' is I64"),
    ({"hidden_norm.weight": None}, "missing-tensor", "'hidden_norm.weight' is absent"),
    ({"norm.weight": torch.ones(127, dtype=torch.bfloat16)}, "tensor-shape", "'norm.weight' is [127]"),
    ({"layers.99.mlp.up_proj.weight": torch.ones(384, 128, dtype=torch.bfloat16)}, "family-tensor",
     "layer 99 of a 1-layer drafter"),
    ({"mask_hidden": torch.ones(1, 384, dtype=torch.bfloat16)}, "family-tensor", "asserts no mask_hidden ships"),
    ({"d2t": torch.zeros(320, dtype=torch.bfloat16)}, "family-tensor", "'d2t' is BF16; vLLM loads an integer map"),
]


@pytest.mark.parametrize("tensors,rule_id,says", HOSTILE_WEIGHTS, ids=[w[2][:24] for w in HOSTILE_WEIGHTS])
def test_each_weight_is_checked_against_the_config(invoke, tmp_path, tensors, rule_id, says):
    src = edited(DFLASH, tmp_path, tensors=tensors)
    _, doc = run_json(invoke, "inspect", src, code=1)
    assert any(says in m for m in _errors(doc).get(rule_id, [])), _errors(doc)
    r = invoke("convert", src, tmp_path / "out", "--to", "dflash-speculators", "--base-model", "a/b")
    assert r.exit_code == 7 and f"source has error [{rule_id}]" in r.stderr, r.output


def test_nan_weights_are_found_by_scan_and_never_written(invoke, tmp_path):
    src = edited(DFLASH, tmp_path, tensors={"fc.weight": torch.full((128, 384), float("nan"), dtype=torch.bfloat16)})
    run_json(invoke, "inspect", src, code=0)  # header-only: the values are not read
    _, doc = run_json(invoke, "inspect", src, "--scan", code=1)
    assert _errors(doc) == {"nonfinite-values": ["'fc.weight' has 49152 NaN/Inf values"]}
    out = tmp_path / "out"
    r = invoke("convert", src, out, "--to", "dflash-speculators", "--base-model", "a/b")
    assert r.exit_code == 7 and "inspect finds [nonfinite-values] 'fc.weight' has 49152 NaN/Inf values" in r.stderr
    assert not out.exists()
    _, doc = run_json(invoke, "check", src, "--no-card", code=1)  # no parity stage runs it: the gate scans
    assert "nonfinite-values" in {f["rule_id"] for f in doc["findings"]}


@pytest.mark.parametrize("layers", [10**8, 10**12])
def test_a_huge_layer_count_is_refused_before_any_loop(invoke, tmp_path, layers):
    """convert looped range(num_hidden_layers): 8.7 GB at 10^8 layers, 12.9 GB at 10^12."""
    src = edited(DFLASH, tmp_path, config={"num_hidden_layers": layers})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    r = invoke("convert", src, tmp_path / "out", "--to", "dflash-speculators", "--base-model", "a/b")
    assert r.exit_code == 7 and "'num_hidden_layers' should be an integer in [1, 256]" in r.stderr, r.output
    assert time.perf_counter() - t < 10 and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000


@pytest.mark.parametrize("dc", ["abc", {"target_layer_ids": ["1", "4", "6"], "mask_token_id": 319}])
def test_a_dflash_config_convert_cannot_read_is_refused(invoke, tmp_path, dc):
    """dflash_config as a string, and ids as strings, crashed convert (exit 70)."""
    src = edited(DFLASH, tmp_path, config={"dflash_config": dc})
    r = invoke("convert", src, tmp_path / "out", "--to", "dflash-speculators", "--base-model", "a/b")
    assert r.exit_code == 7 and "source has error [config-field-invalid] config 'dflash_config" in r.stderr, r.output


# ------------------------------------------------------------------------------------------ P-EAGLE

def test_an_integer_mask_hidden_is_refused_by_inspect_and_verify(invoke, tmp_path):
    src = edited(PEAGLE, tmp_path, tensors={"mask_hidden": torch.zeros(1, 384, dtype=torch.int64)})
    _, doc = run_json(invoke, "inspect", src, code=1)
    assert _errors(doc)["peagle-mask-hidden"] == ["mask_hidden is I64: a learned placeholder of floating-point "
                                                  "values stored as integers; vLLM casts it into its float buffer "
                                                  "without a word"]
    r = invoke("verify", src)
    assert r.exit_code == 13 and "'mask_hidden' is I64, not floating-point values" in r.stderr, r.output


@pytest.mark.parametrize("shape", [(384,), (1, 1, 384)])
def test_mask_hidden_of_the_right_size_at_another_shape_is_what_vllm_reads(invoke, tmp_path, shape):
    """vLLM 0.32 copies loaded_weight.view(1, -1) into its [1, n_aux x target_hidden] buffer (llama_eagle3.py
    load_weights): any shape of that size loads; speculators' own writer keeps [1, 1, n]."""
    src = edited(PEAGLE, tmp_path, tensors={"mask_hidden": torch.zeros(*shape, dtype=torch.bfloat16)})
    _, doc = run_json(invoke, "inspect", src, code=0)
    assert not _errors(doc)
    src = edited(PEAGLE, tmp_path, name="short", tensors={"mask_hidden": torch.zeros(1, 1, 383, dtype=torch.bfloat16)})
    _, doc = run_json(invoke, "inspect", src, code=1)
    assert "vLLM copies it into [1, 384]" in _errors(doc)["peagle-mask-hidden"][0]


@pytest.mark.parametrize("value,says", [(2**63, "not a token id (an integer in [0, 2^63))"),
                                        (320, "outside the drafter's vocabulary (vocab_size 320)"),
                                        (-1, "not a token id")])
def test_the_mask_token_is_bounded_without_a_target(invoke, tmp_path, value, says):
    src = edited(PEAGLE, tmp_path, config={"mask_token_id": value})
    _, doc = run_json(invoke, "inspect", src, code=1)
    assert any(says in m for m in _errors(doc)["family-mask-token"]), _errors(doc)


@pytest.mark.parametrize("quant,key", [([1], "quantization_config"), ("fp8", "quantization_config"),
                                       ({"quant_algo": 3}, "quantization_config.quant_algo"),
                                       ({"quant_method": ["modelopt"]}, "quantization_config.quant_method")])
def test_a_quantization_config_vllm_cannot_read_is_refused_by_name(invoke, tmp_path, quant, key):
    src = edited(PEAGLE, tmp_path, config={"quantization_config": quant})
    for args in ((), ("--scan",)):
        _, doc = run_json(invoke, "inspect", src, *args, code=1)
        hit = [f for f in doc["findings"] if f["rule_id"] == "config-field-invalid"]
        assert hit and hit[0]["locator"].endswith(f"config.json:{key}"), doc["findings"]
    r = invoke("verify", src)
    assert r.exit_code == 13 and f"config '{key}' should be" in r.stderr, r.output


# ------------------------------------------------------------------------------------------ fuzzing

def test_fuzzing_family_configs_and_weights(tmp_path):
    """Seeded, in process: mutated DFlash / DSpark / P-EAGLE configs and weights through inspect (and --scan,
    --target), check --no-card and convert --dry-run."""
    clean(fuzz_families(tmp_path, cases=240, seed=0), "families", 240, 0, 1)


def test_fuzzing_target_configs(tmp_path):
    """Mutated target configs under inspect --target, a run of the target, and check --no-card --target."""
    clean(fuzz_targets(tmp_path, cases=100, seed=0), "targets", 100, 0, 4, 5)


def test_a_d2t_vllm_has_no_parameter_for_is_refused_against_the_target(invoke, tmp_path):
    """A full-vocabulary draft builds no draft_id_to_target_id (qwen3_dflash.py), so a shipped d2t cannot load."""
    src = edited(DFLASH, tmp_path, tensors={"d2t": torch.zeros(320, dtype=torch.int64)})
    run_json(invoke, "inspect", src, code=0)  # the target's vocabulary decides it
    _, doc = run_json(invoke, "inspect", src, "--target", TARGET, code=1)
    assert _errors(doc) == {"family-head-d2t": ["d2t ships, but with draft vocab 320 and target vocab 320 vLLM builds "
                                                "no d2t parameter to load it into: its weight loader raises (no "
                                                "parameter 'draft_id_to_target_id')"]}
