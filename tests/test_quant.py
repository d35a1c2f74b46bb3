"""Quantised drafters (ModelOpt FP8 / NVFP4): inspect's loading rules, the dequantised reference, verify against
the bf16 source, and conversions that keep every scale with its weight."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eaglectl import formats
from eaglectl.drafter import open_drafter
from eaglectl.io.quant import excluded, layout_of, rewrite_entries, vllm_module
from eaglectl.model.loader import load_reference

from .conftest import DEFECTS, DRAFTERS, ROOT
from .helpers import edited

FP8 = DRAFTERS / "speculators-fp8"
TRAINED = ROOT / "fixtures" / "trained"
QUANTISED = ("fc.weight", "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight",
             "layers.0.mlp.down_proj.weight")


def _json(r) -> dict:
    return json.loads(r.stdout)


def test_the_fp8_fixture_is_the_trained_drafter_quantised_per_tensor():
    q, src = load_file(FP8 / "model.safetensors"), load_file(TRAINED / "eagle3.1" / "model.safetensors")
    for name in QUANTISED:
        base = name.removesuffix(".weight")
        assert q[name].dtype == torch.float8_e4m3fn and q[base + ".weight_scale"].shape == ()
        assert q[base + ".input_scale"].item() == 1.0
        # torch's own E4M3 decoding: within half an E4M3 step (2^-4 relative) of the bf16 source
        back = q[name].float() * q[base + ".weight_scale"]
        assert torch.allclose(back, src[name].float(), rtol=2**-4, atol=float(q[base + ".weight_scale"]) * 2**-9)
    assert set(src) - set(QUANTISED) <= set(q) and all(torch.equal(q[n], src[n]) for n in src if n not in QUANTISED)
    cfg = json.loads((FP8 / "config.json").read_text())["quantization_config"]
    side = json.loads((FP8 / "hf_quant_config.json").read_text())
    assert (cfg["quant_method"], cfg["quant_algo"], cfg["ignore"]) == ("modelopt", "FP8", ["lm_head", "*self_attn*"])
    assert side["quantization"]["exclude_modules"] == cfg["ignore"] and side["producer"]["name"] == "modelopt"


def test_the_reference_dequantises_weight_times_scale_exactly_as_torch():
    d = open_drafter(str(FP8))
    loaded = load_reference(d)
    raw = load_file(FP8 / "model.safetensors")
    for name in QUANTISED:
        want = raw[name].float() * raw[name.removesuffix(".weight") + ".weight_scale"].float()
        assert torch.equal(loaded.tensors[name], want), name
    assert not any(k.endswith(("_scale", "_scale_2")) for k in loaded.tensors)  # scales are not parameters
    assert loaded.stored_dtypes["fc.weight"] == "F8_E4M3"


def test_inspect_recognises_the_layout_instead_of_exotic_dtypes(invoke):
    r = invoke("inspect", FP8, "--json")
    doc = _json(r)
    assert r.exit_code == 0
    ids = {f["rule_id"] for f in doc["findings"]}
    assert "exotic-dtype" not in ids and "mixed-dtypes" not in ids and "unknown-tensor" not in ids
    q = next(f for f in doc["findings"] if f["rule_id"] == "quantized")
    assert "3 of 6 linear layers quantised" in q["message"] and "model.layers.0.self_attn.qkv_proj" in q["message"]


def test_an_fp8_tensor_without_a_config_is_still_exotic(invoke):
    doc = _json(invoke("inspect", DEFECTS / "exotic-dtype", "--json"))
    assert [f["rule_id"] for f in doc["findings"]] == ["exotic-dtype"]


@pytest.mark.parametrize("rule,says", [
    ("quant-module-mismatch", "model.layers.0.self_attn.qkv_proj is not quantised and no entry excludes it"),
    ("quant-ignore-unmatched", "'midlayer.self_attn.o_proj' excludes none of vLLM's modules"),
    ("quant-embed-tokens", "'embed_tokens.weight' is F8_E4M3 with input_scale, weight_scale"),
    ("quant-scale-missing", "'layers.0.mlp.down_proj.weight' (F8_E4M3) has no weight_scale"),
    ("quant-method-missing", "no quant_method"),
    ("quant-exclude-modules-ignored", "no ignore"),
    ("quant-config-missing", "no config says how"),
    ("quant-config-disagree", "exclusions"),
])
def test_each_quantisation_defect_is_named(invoke, rule, says):
    doc = _json(invoke("inspect", DEFECTS / rule, "--json"))
    assert any(f["rule_id"] == rule and says in f["message"] for f in doc["findings"]), doc["findings"]


def test_vllm_exclusion_matching():
    qkv, _ = vllm_module("layers.0.self_attn.k_proj.weight")
    assert qkv == "model.layers.0.self_attn.qkv_proj" and vllm_module("fc.weight")[0] == "model.fc"
    assert vllm_module("layers.0.mlp.up_proj.weight")[0] == "model.layers.0.mlp.gate_up_proj"
    assert excluded("model.fc", ("*fc",)) and excluded("model.fc", ("fc",))  # wildcard; substring
    assert excluded("lm_head", ("lm_head",)) and not excluded("lm_head", ("*fc",))
    assert excluded(qkv, ("*qkv_proj",)) and excluded(qkv, ("*self_attn*",))
    assert not excluded(qkv, ("layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj", "layers.0.self_attn.v_proj"))
    shards = tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv")
    assert excluded(qkv, shards) is True and excluded(qkv, shards[:2]) is None  # some shards only: vLLM refuses
    assert not excluded("model.layers.0.mlp.down_proj", ("midlayer.mlp*",))  # training-time names match nothing


def test_exclusions_are_renamed_to_the_destination_names():
    sf, sp, nemo = formats.get("specforge"), formats.get("speculators"), formats.get("nemo")
    entries = ["lm_head", "*fc", "*layers.0.self_attn*", "layers.0.mlp.down_proj", 7]
    # to midlayer names (sglang's modules), keeping the spelling vLLM's module names contain
    assert rewrite_entries(entries, sp, sf) == ["lm_head", "*fc", "*midlayer.self_attn*", "*layers.0.self_attn*",
                                                "midlayer.mlp.down_proj", "layers.0.mlp.down_proj", 7]
    assert rewrite_entries(rewrite_entries(entries, sp, sf), sf, sp) == entries
    assert rewrite_entries(["*midlayer.mlp*"], sf, sp) == ["*layers.0.mlp*"]
    assert rewrite_entries(["model.layers.0.mlp*", "lm_head"], nemo, sp) == ["layers.0.mlp*", "lm_head"]


def _tensor_bytes(folder) -> dict[str, tuple[str, bytes]]:
    out = {}
    with safe_open(folder / "model.safetensors", "pt") as f:
        for k in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            t = f.get_tensor(k)
            out[k] = (str(t.dtype), t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return out


def test_convert_round_trip_keeps_every_scale_bit_identical(invoke, tmp_path):
    """speculators -> specforge (layers.0. -> midlayer.) -> speculators: scales follow their weights."""
    def prefixed(cfg):
        cfg["quantization_config"]["ignore"] = ["lm_head", "*layers.0.self_attn*"]  # a name with a dialect prefix

    src = edited(FP8, tmp_path, name="src", config=prefixed)
    r = invoke("convert", src, tmp_path / "sf", "--to", "specforge", "--json")
    assert r.exit_code == 0, r.stderr
    sf = _tensor_bytes(tmp_path / "sf")
    assert sf["midlayer.mlp.down_proj.weight_scale"] == _tensor_bytes(src)["layers.0.mlp.down_proj.weight_scale"]
    out_cfg = json.loads((tmp_path / "sf" / "config.json").read_text())["quantization_config"]
    assert out_cfg["ignore"] == ["lm_head", "*midlayer.self_attn*", "*layers.0.self_attn*"]
    assert out_cfg["quant_method"] == "modelopt"
    assert {f["rule_id"] for f in _json(invoke("inspect", tmp_path / "sf", "--json"))["findings"]} & {
        "quant-module-mismatch", "quant-ignore-unmatched", "exotic-dtype"} == set()
    side = json.loads((tmp_path / "sf" / "hf_quant_config.json").read_text())
    assert side["quantization"]["exclude_modules"] == ["lm_head", "*self_attn*"]  # no prefix: kept as written
    r = invoke("convert", tmp_path / "sf", tmp_path / "back", "--to", "speculators", "--base-model",
               "eaglectl-fixtures/target", "--json")
    assert r.exit_code == 0, r.stderr
    assert _tensor_bytes(tmp_path / "back") == _tensor_bytes(src)  # every weight and scale, bit for bit
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back["quantization_config"]["ignore"] == ["lm_head", "*layers.0.self_attn*"]
    assert "quantization_config" not in back["transformer_layer_config"]
    doc = _json(invoke("inspect", tmp_path / "back", "--json"))
    assert doc["exit_code"] == 0 and "exotic-dtype" not in {f["rule_id"] for f in doc["findings"]}


def test_dtype_is_refused_on_a_quantised_drafter(invoke, tmp_path):
    r = invoke("convert", FP8, tmp_path / "out", "--to", "modelopt", "--dtype", "bfloat16")
    assert r.exit_code == 7 and "quantised" in r.stderr and "--dtype bfloat16" in r.stderr
    assert not (tmp_path / "out").exists()


def test_verify_fp8_against_its_bf16_source_passes_under_low_precision(invoke):
    r = invoke("verify", FP8, "--against", TRAINED / "eagle3.1", "--target", TRAINED / "target", "--json")
    doc = _json(r)
    assert r.exit_code == 0 and doc["regime"] == "low-precision" and doc["passed"] is True, doc["per_step"]
    assert set(doc["differing_tensors"]) == set(QUANTISED)
    assert all(s["kl_mean"] > 0 and s["top1_agreement"] >= 0.99 for s in doc["per_step"])
    assert "F8_E4M3" in doc["candidate"]["stored_dtypes"]


def _nvfp4(tmp_path):
    """The fp32 drafter with fc in NVFP4 (packed E2M1 values, FP8 block scales, a global scale): the values
    are chosen on the E2M1 grid, so the expected dequantisation is known without any quantiser."""
    rows, k = load_file(DRAFTERS / "speculators-3" / "model.safetensors")["fc.weight"].shape
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (rows, k), generator=g)
    block = torch.tensor([0.25, 0.5, 1.0, 2.0])[torch.randint(0, 4, (rows, k // 16), generator=g)]
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)  # low nibble: the even element
    d = edited(DRAFTERS / "speculators-3", tmp_path, name="nvfp4", tensors={
        "fc.weight": packed, "fc.weight_scale": block.to(torch.float8_e4m3fn),
        "fc.weight_scale_2": torch.tensor(0.125), "fc.input_scale": torch.tensor(1.0)},
        config={"quantization_config": {"quant_method": "modelopt_fp4", "quant_algo": "NVFP4",
                                        "ignore": ["lm_head", "*layers*"]}})
    expected = grid[codes] * block.repeat_interleave(16, dim=1) * 0.125
    return d, expected


def test_nvfp4_dequantises_as_vllm_unpacks_it(invoke, tmp_path):
    d, expected = _nvfp4(tmp_path)
    doc = _json(invoke("inspect", d, "--json"))
    assert doc["exit_code"] == 0 and doc["spec"]["num_aux_hidden_states"] == 3, doc["findings"]
    assert "tensor-shape" not in {f["rule_id"] for f in doc["findings"]}
    loaded = load_reference(open_drafter(str(d)))
    assert torch.equal(loaded.tensors["fc.weight"], expected)
    assert layout_of(open_drafter(str(d))).scheme == "nvfp4"


def test_an_unsupported_scheme_is_named(invoke, tmp_path):
    d = edited(FP8, tmp_path, name="awq",
               config=lambda cfg: cfg["quantization_config"].update(quant_method="awq", quant_algo="W4A16_AWQ"))
    (d / "hf_quant_config.json").unlink()
    ids = [f["rule_id"] for f in _json(invoke("inspect", d, "--json"))["findings"]]
    assert "quant-unsupported" in ids and "exotic-dtype" in ids  # not a layout eaglectl recognises


def test_the_reference_refuses_what_it_cannot_dequantise(invoke, tmp_path):
    e5m2 = load_file(FP8 / "model.safetensors")["fc.weight"].float().to(torch.float8_e5m2)
    d = edited(FP8, tmp_path, name="e5m2", tensors={"fc.weight": e5m2})
    r = invoke("verify", d, "--dtype", "bfloat16")
    assert r.exit_code == 13 and "F8_E5M2" in r.stderr and "NVFP4" in r.stderr, r.stderr
