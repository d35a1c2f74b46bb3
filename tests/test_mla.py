"""MLA drafters end to end: a random drafter in the published Kimi-K2 layout (nvidia/Kimi-K2.6-Eagle3: 16
tensors, `Eagle3DeepseekV2ForCausalLM`, `model_type: kimi_k2`, YaRN factor 64, no embed_tokens, full vocab)
through verify, check, upgrade, convert and the rules; the trained MLA pair through the probe."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.errors import ConversionError
from eaglectl.io.checkpoint import open_checkpoint
from eaglectl.model.loader import load_reference

from .conftest import ROOT
from .helpers import convert_run as convert
from .helpers import edited, inspect_checkpoint, smoke
from .helpers import upgrade_run as upgrade
from .helpers import verify_run as verify

TRAINED = ROOT / "fixtures" / "trained"
H, HEADS, VOCAB, INTER = 64, 2, 256, 96
DIMS = {"q_lora_rank": 32, "kv_lora_rank": 256, "qk_nope_head_dim": 16, "qk_rope_head_dim": 64, "v_head_dim": 16}
KIMI_ROPE = {"type": "yarn", "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
             "original_max_position_embeddings": 4096}


def kimi_tensors(seed: int = 0, q_lora: bool = True) -> dict[str, torch.Tensor]:
    """The 16 tensors of the published layout (plus q_proj instead of q_a/q_a_norm/q_b without q_lora)."""
    g = torch.Generator().manual_seed(seed)
    d = DIMS
    qk = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]

    def w(*shape: int, scale: float = 0.08) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    def norm(n: int) -> torch.Tensor:
        return (1 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)

    a = "layers.0.self_attn."
    t = {"fc.weight": w(H, 3 * H)}
    if q_lora:
        t |= {a + "q_a_proj.weight": w(d["q_lora_rank"], 2 * H), a + "q_a_layernorm.weight": norm(d["q_lora_rank"]),
              a + "q_b_proj.weight": w(HEADS * qk, d["q_lora_rank"])}
    else:
        t[a + "q_proj.weight"] = w(HEADS * qk, 2 * H)
    t |= {a + "kv_a_proj_with_mqa.weight": w(d["kv_lora_rank"] + d["qk_rope_head_dim"], 2 * H),
          a + "kv_a_layernorm.weight": norm(d["kv_lora_rank"]),
          a + "kv_b_proj.weight": w(HEADS * (d["qk_nope_head_dim"] + d["v_head_dim"]), d["kv_lora_rank"]),
          a + "o_proj.weight": w(H, HEADS * d["v_head_dim"]),
          "layers.0.mlp.gate_proj.weight": w(INTER, H), "layers.0.mlp.up_proj.weight": w(INTER, H),
          "layers.0.mlp.down_proj.weight": w(H, INTER), "layers.0.input_layernorm.weight": norm(H),
          "layers.0.hidden_norm.weight": norm(H), "layers.0.post_attention_layernorm.weight": norm(H),
          "norm.weight": norm(H), "lm_head.weight": w(VOCAB, H, scale=0.3)}
    return t


def kimi_config(**changes) -> dict:
    cfg = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2", "hidden_size": H,
           "intermediate_size": INTER, "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "head_dim": 128,
           "num_hidden_layers": 1, "vocab_size": VOCAB, "draft_vocab_size": VOCAB, **DIMS, "rms_norm_eps": 1e-5,
           "rope_theta": 50000.0, "rope_scaling": dict(KIMI_ROPE), "max_position_embeddings": 262144,
           "hidden_act": "silu", "tie_word_embeddings": False, "dtype": "bfloat16", "first_k_dense_replace": 1,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True}}
    cfg.update(changes)
    return cfg


def write(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


@pytest.fixture
def kimi(tmp_path) -> Path:
    return write(tmp_path / "kimi", kimi_config(), kimi_tensors())


def test_the_published_layout_reads_as_an_mla_drafter(kimi):
    d = open_drafter(str(kimi))
    assert len(d.ckpt.tensors) == 16 and d.dialect.name == "modelopt" and d.spec.arch == "mla"
    assert d.spec.mla == DIMS and d.spec.rope_scaling["type"] == "yarn"
    drafter = load_reference(d).build(torch.float32, "cpu")
    attn = drafter.layers[0].self_attn
    # Kimi-K2: factor 64, mscale = mscale_all_dim = 1 -> cos/sin unscaled, softmax scale (80)^-1/2 · m²
    m = 0.1 * np.log(64) + 1
    assert attn.rope_kind == "deepseek_yarn" and attn.rope_mscale == 1.0
    assert attn.scale == pytest.approx(80 ** -0.5 * m * m, rel=1e-12)


def test_verify_against_itself_passes_and_a_perturbed_latent_norm_fails(invoke, kimi, tmp_path):
    r = invoke("verify", kimi, "--against", kimi, "--json", "--tokens", "32")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["regime"] == "exact" and doc["passed"] is True
    assert all(s["logits_max_abs"] == 0 and s["state_max_abs"] == 0 for s in doc["per_step"])
    name = "layers.0.self_attn.kv_a_layernorm.weight"
    w = load_file(kimi / "model.safetensors")[name].clone()
    w[7] += 0.5
    bad = edited(kimi, tmp_path, name="perturbed", tensors={name: w})
    r = invoke("verify", bad, "--against", kimi, "--json", "--tokens", "32")
    doc = json.loads(r.stdout)
    assert r.exit_code == 8 and doc["passed"] is False and doc["differing_tensors"] == [name]
    assert doc["regime"] == "exact" and doc["per_step"][0]["logits_max_abs"] > 0
    assert r.stderr.startswith("error[parity-mismatch]:")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_against_fp32_passes(invoke, kimi, dtype):
    r = invoke("verify", kimi, "--dtype", dtype, "--json", "--tokens", "48", "--steps", "4")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["mode"] == "precision" and doc["regime"] == "low-precision" and doc["passed"]
    assert all(0 < s["kl_mean"] < 1e-3 and s["top1_agreement"] >= 0.99 for s in doc["per_step"])


def test_a_bf16_to_fp32_conversion_is_held_to_the_precision_tolerance(kimi, tmp_path):
    out = tmp_path / "fp32"
    convert(str(kimi), str(out), "modelopt", dtype="float32", source_aux_convention="boundary")
    rep = verify(str(out), against=str(kimi), tokens=32)
    assert rep.passed and rep.identical_tensors and rep.regime == "exact"  # bf16 -> fp32 keeps every value


def test_q_lora_null_runs_in_the_reference_and_is_an_error_for_vllm(invoke, tmp_path):
    d = write(tmp_path / "qproj", kimi_config(q_lora_rank=None), kimi_tensors(q_lora=False))
    rep = verify(str(d), against=str(d), tokens=16)
    assert rep.passed and rep.regime == "exact"
    assert verify(str(d), dtype="bfloat16", tokens=32).passed
    doc = json.loads(invoke("inspect", d, "--json").stdout)
    found = {f["rule_id"]: f for f in doc["findings"]}
    assert found["mla-q-lora-null"]["severity"] == "error" and "q_lora_rank" in found["mla-q-lora-null"]["locator"]
    assert "tensor-shape" not in found and "missing-tensor" not in found  # q_proj is the expected tensor
    with pytest.raises(ConversionError, match="mla-q-lora-null"):
        convert(str(d), str(tmp_path / "out"), "modelopt", source_aux_convention="boundary")


@pytest.mark.parametrize("spelling,registered", [("DeepseekV3ForCausalLMEagle3", "Eagle3DeepseekV3ForCausalLM"),
                                                 ("Eagle3DeepSeekV3ForCausalLM", "Eagle3DeepseekV3ForCausalLM"),
                                                 ("DeepseekV3ForCausalLM", "Eagle3DeepseekV3ForCausalLM"),
                                                 ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV2ForCausalLM")])
def test_convert_writes_the_registered_spelling(tmp_path, spelling, registered):
    src = write(tmp_path / "src", kimi_config(architectures=[spelling]), kimi_tensors())
    rules = {f.rule_id for f in inspect_checkpoint(str(src)).findings}
    expected = {"DeepseekV3ForCausalLM": None, "Eagle3DeepseekV2ForCausalLM": None}.get(
        spelling, "architectures-spelling")  # a plain class: vLLM renames it Eagle3X; SGLang's says --for sglang
    assert expected is None or expected in rules
    res = convert(str(src), str(tmp_path / "out"), "modelopt", source_aux_convention="boundary")
    assert res.plan.config["architectures"] == [registered]
    out = inspect_checkpoint(str(tmp_path / "out"))
    assert not {"architectures-spelling", "architectures-unregistered"} & {
        f.rule_id for f in out.findings} and out.exit_code == 0


def test_speculators_cannot_hold_an_mla_drafter(kimi, tmp_path):
    with pytest.raises(ConversionError, match="cannot hold a mla drafter"):
        convert(str(kimi), str(tmp_path / "o"), "speculators", source_aux_convention="boundary")


@pytest.mark.parametrize("changes,rule,severity", [
    ({"kv_lora_rank": 128}, "mla-head-size", "error"),  # 128 + 64 = 192
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]}}, "kimi-aux-ids-ambiguous", "warning"),
    ({}, "kimi-aux-ids-ambiguous", "warning"),
    ({"norm_before_fc": True}, "mla-norm-before-fc", "error"),
])
def test_mla_rules(invoke, tmp_path, changes, rule, severity):
    tensors = kimi_tensors()
    if "kv_lora_rank" in changes:
        tensors = {k: v for k, v in tensors.items() if "kv_" not in k}
    if changes.get("norm_before_fc"):
        tensors["input_norm.weight"] = torch.ones(3 * H, dtype=torch.bfloat16)
    d = write(tmp_path / "d", kimi_config(**changes), tensors)
    doc = json.loads(invoke("inspect", d, "--json").stdout)
    found = [f for f in doc["findings"] if f["rule_id"] == rule]
    assert found and found[0]["severity"] == severity, [f["rule_id"] for f in doc["findings"]]
    if rule == "mla-head-size":
        assert "kv_lora_rank 128 + qk_rope_head_dim 64 = 192" in found[0]["message"]
    if rule == "kimi-aux-ids-ambiguous":
        assert "eagle_aux_hidden_state_layer_ids" in found[0]["locator"]


def kimi_target(folder: Path, layers: int) -> Path:
    """A Kimi-shaped target as a config alone (no weights: nothing is measured, the ids stay undecided)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": H, "num_hidden_layers":
        layers, "vocab_size": VOCAB, "num_attention_heads": HEADS, **DIMS, "max_position_embeddings": 262144}))
    return folder


@pytest.mark.parametrize("ids,numbering,other", [([2, 46, 90], "boundary", [3, 47, 91]),
                                                 ([1, 45, 89], "output", [1, 45, 89])])
def test_kimi_k3_ids_are_ambiguous_in_both_numberings_on_a_93_layer_target(invoke, tmp_path, ids, numbering, other):
    """The K3 3.1 drafter writes [2, 46, 90] (boundaries), TorchSpec's K3 3.0 config [1, 45, 89] (output ids):
    the same layers of a 93-layer target, or the other numbering's, which only a measurement settles."""
    d = write(tmp_path / "d", kimi_config(eagle_config={"eagle_aux_hidden_state_layer_ids": ids,
                                                        "use_aux_hidden_state": True}), kimi_tensors())
    for target in (kimi_target(tmp_path / "k3", 93), None):
        args = ["--target", target] if target is not None else []
        doc = json.loads(invoke("inspect", d, *args, "--json").stdout)
        found = [f for f in doc["findings"] if f["rule_id"] == "kimi-aux-ids-ambiguous"]
        assert len(found) == 1 and found[0]["severity"] == "warning", [f["rule_id"] for f in doc["findings"]]
        message = found[0]["message"]
        # what is ambiguous (the two readings), which one is the default, and what decides it
        as_output = [i + 1 for i in ids]
        assert message.startswith(f"aux ids {ids} name different layers in the two numberings: boundaries {ids} "
                                  f"read as boundary ids, boundaries {as_output} read as output-of-layer ids; "
                                  "Kimi-K3's default (boundaries [2, 46, 90] of a 93-layer target) is the "
                                  f"{numbering} reading"), message
        assert "what decides it is the target's weights" in message
        hint = found[0]["hint"]
        if target is not None:  # inspect --target was just run: the fix does not name it again
            assert "eaglectl inspect" not in hint and "--source-aux-convention boundary|output" in hint, hint
        else:
            assert hint.startswith(f"eaglectl inspect {d} --target TARGET (measures it)"), hint
        if target is not None:  # nothing measured: a config-only target
            assert doc["measured"] is None or doc["measured"].get("boundary_ids") is None
    # a depth the ids are not the default of: nothing ambiguous about them
    doc = json.loads(invoke("inspect", d, "--target", kimi_target(tmp_path / "k2", 61), "--json").stdout)
    assert "kimi-aux-ids-ambiguous" not in {f["rule_id"] for f in doc["findings"]}


def test_kimi_k2_ids_on_a_93_layer_target_are_not_k3_defaults(invoke, tmp_path):
    d = write(tmp_path / "d", kimi_config(), kimi_tensors())  # [2, 30, 58]
    doc = json.loads(invoke("inspect", d, "--target", kimi_target(tmp_path / "k3", 93), "--json").stdout)
    assert "kimi-aux-ids-ambiguous" not in {f["rule_id"] for f in doc["findings"]}
    doc = json.loads(invoke("inspect", d, "--target", kimi_target(tmp_path / "k2", 61), "--json").stdout)
    found = [f["message"] for f in doc["findings"] if f["rule_id"] == "kimi-aux-ids-ambiguous"]
    # counted as output ids, [2, 30, 58] would be boundaries one higher
    assert found and "Kimi-K2's default (boundaries [2, 30, 58] of a 61-layer target) is the boundary reading" \
        in found[0] and "boundaries [3, 31, 59] read as output-of-layer ids" in found[0], found


def test_missing_lm_head_is_borrowed_with_full_vocab_only(invoke, tmp_path):
    tensors = {k: v for k, v in kimi_tensors().items() if k != "lm_head.weight"}
    full = json.loads(invoke("inspect", write(tmp_path / "a", kimi_config(), tensors), "--json").stdout)
    assert {f["rule_id"]: f["severity"] for f in full["findings"]}["lm-head-borrowed"] == "warning"
    reduced = json.loads(invoke("inspect", write(tmp_path / "b", kimi_config(draft_vocab_size=128), tensors),
                                "--json").stdout)
    assert {f["rule_id"]: f["severity"] for f in reduced["findings"]}["lm-head-missing"] == "error"


def test_modelopt_exported_rope_scaling_is_reported(invoke, tmp_path):
    rope = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 2048}
    d = write(tmp_path / "d", kimi_config(rope_scaling=rope), kimi_tensors())
    doc = json.loads(invoke("inspect", d, "--json").stdout)
    found = {f["rule_id"]: f for f in doc["findings"]}
    assert found["exported-rope-scaling"]["severity"] == "info" and doc["exit_code"] == 0
    assert verify(str(d), against=str(d), tokens=16).passed  # run as exported


def test_rope_scaling_without_factor_is_refused_with_the_key(invoke, tmp_path):
    d = write(tmp_path / "d", kimi_config(rope_scaling={"type": "yarn"}), kimi_tensors())
    r = invoke("verify", d)
    assert r.exit_code == 13 and "factor" in r.stderr and r.stdout == ""


def test_upgrade_writes_fc_norm_of_target_width_and_top_level_flags(invoke, kimi, tmp_path):
    r = invoke("upgrade", kimi, tmp_path / "up", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["steps"] == ["add-fc-norm", "set-norm-output"] and doc["fidelity"]["per_step"]
    out = open_checkpoint(str(tmp_path / "up"))
    for j in range(3):
        np.testing.assert_array_equal(out.read(f"fc_norm.{j}.weight"), np.ones(H, dtype=np.float32))
    assert "fc_norm.3.weight" not in out.tensors and "input_norm.weight" not in out.tensors
    cfg = json.loads((tmp_path / "up" / "config.json").read_text())
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True  # vLLM reads them at the top level only
    assert "fc_norm" not in cfg["eagle_config"] and "norm_output" not in cfg["eagle_config"]
    assert cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and cfg["kv_lora_rank"] == 256
    rep = inspect_checkpoint(str(tmp_path / "up"))
    assert rep.drafter.spec.eagle_version == "3.1" and rep.exit_code == 0
    assert verify(str(tmp_path / "up"), against=str(tmp_path / "up"), tokens=16).passed


def test_check_runs_the_parity_stage_for_mla(invoke, kimi):
    r = invoke("check", kimi, "--json", "--no-card")
    doc = json.loads(r.stdout)
    stages = {s["name"]: s for s in doc["stages"]}
    assert r.exit_code == 0 and stages["parity"]["status"] == "pass" and "bf16 vs fp32" in stages["parity"]["detail"]


# ------------------------------------------------------------------------- the trained MLA pair

def test_trained_mla_pair_is_clean_and_measured(invoke):
    drafter, target = TRAINED / "eagle3.1-mla", TRAINED / "target-mla"
    r = invoke("inspect", drafter, "--target", target, "--json")
    doc = json.loads(r.stdout)
    errors = {f["rule_id"]: f["message"] for f in doc["findings"] if f["severity"] == "error"}
    # ids only in eagle_config: vLLM's V1 (CPU) reads them, V2 (GPU) the 4-layer default (2, 2, 1) -> [1, 2]
    assert r.exit_code == 1 and set(errors) == {"aux-ids-runner-split", "aux-ids-runner-count"}, errors
    assert "V1 (CPU) [2, 3, 4]" in errors["aux-ids-runner-split"]
    assert "V2 (GPU default) [1, 2] (the target's default)" in errors["aux-ids-runner-split"]
    assert "measured: trained on [2, 3, 4], V1 right" in errors["aux-ids-runner-split"]
    assert "captures 2 layers [1, 2]" in errors["aux-ids-runner-count"]
    m = doc["measured"]["aux_convention"]
    assert m["measured"] == "boundary" and m["boundary_ids"] == [2, 3, 4]
    assert doc["spec"]["eagle_version"] == "3.1" and doc["spec"]["mla"]["kv_lora_rank"] == 512


def test_trained_mla_verify_with_target_and_upgrade_calibration(invoke, tmp_path):
    drafter, target = TRAINED / "eagle3.1-mla", TRAINED / "target-mla"
    r = invoke("verify", drafter, "--target", target, "--dtype", "bfloat16", "--json", "--tokens", "64")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["passed"] and doc["inputs"].startswith(f"target {target}: ")
    assert doc["inputs"].endswith("aux ids [2, 3, 4]")
    # a 3.0 copy (fc_norm dropped) upgraded back with calibration on the MLA target
    src = edited(drafter, tmp_path, name="e3", config={"fc_norm": False, "norm_output": False},
                 tensors=lambda t: {k: v for k, v in t.items() if not k.startswith("fc_norm.")})
    res = upgrade(str(src), str(tmp_path / "up"), init="calibrated", target=str(target))
    s = res.statistics
    # without its trained fc_norm the copy predicts poorly, so the layers may stay undecided: either way calibration
    # read real MLA-target states at the layers it names
    assert res.layers["how"].startswith(("measured", "as the files say")) and s["tokens"] > 1000
    assert s["fc_output_relative_error"] < s["fc_output_relative_error_ones"]
    assert open_checkpoint(str(tmp_path / "up")).read("fc_norm.0.weight").shape == (128,)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_counts_equal_the_reference_loop_exactly_on_the_mla_pair(tmp_path, vllm_py):
    """vLLM's Eagle3DeepseekV2ForCausalLM (CPU_MLA backend, DeepSeek YaRN, fc_norm, norm_output) drafts
    exactly what the reference loop drafts: the committed counts, as shipped and after a conversion."""
    from eaglectl.commands.requests import Baseline
    
    from .test_smoke import COUNTS, EXPECTED

    python = vllm_py
    e = EXPECTED["eagle3.1-mla-k3-short"]
    drafter, target = TRAINED / e["drafter"], TRAINED / e["target"]
    converted = tmp_path / "modelopt"
    convert(str(drafter), str(converted), "modelopt", target=str(target))  # measured, behaviour-checked
    rep = smoke(str(drafter), str(target), engine="vllm", k=e["k"], num_prompts=e["num_prompts"],
                max_tokens=e["max_tokens"], concurrency=(1,), vllm_python=python, runner="v1",  # V2 cannot load it
                baselines=[Baseline("modelopt", "eagle3", str(converted)), Baseline("none", "none")]).to_json()
    by_name = {"drafter": rep, **{b["name"]: b for b in rep["baselines"]}}
    for name in ("drafter", "modelopt"):
        assert {c: by_name[name][c] for c in COUNTS} == {c: e[c] for c in COUNTS}, name
        assert by_name[name]["greedy_match"] == 1.0, name
    assert not rep["red_flags"], rep["red_flags"]
    reading = rep["engine_reading"]
    assert reading["matched"] is not None and reading["matched"]["boundary_ids"] == [2, 3, 4]
