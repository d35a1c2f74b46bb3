"""Quantised drafters (ModelOpt FP8 / NVFP4): inspect's loading rules, the dequantised reference, verify against
the bf16 source, and conversions that keep every scale with its weight."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eaglectl import formats
from eaglectl.checkpoint.drafter import open_drafter
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


# ------------------------------------------------------------------ hostile scales (issue 30, items 9 and 12)

def _refused(r, code: int, tensor: str) -> None:
    """One line on stderr naming the tensor, under a stable exit code (never 70)."""
    assert r.exit_code == code, (r.exit_code, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error[")]
    assert len(lines) == 1 and f"'{tensor}'" in lines[0], r.stderr


def _finding(invoke, d, rule: str, tensor: str, *args) -> dict:
    """inspect (ARGS: --scan) fails with RULE naming TENSOR; the finding."""
    r = invoke("inspect", d, "--json", *args)
    doc = _json(r)
    hits = [f for f in doc["findings"] if f["rule_id"] == rule]
    assert r.exit_code == 1 and doc["exit_code"] == 1, doc["findings"]
    assert len(hits) == 1 and f"'{tensor}'" in hits[0]["message"] and hits[0]["severity"] == "error", hits
    assert hits[0]["locator"].endswith(f":{tensor}")
    return hits[0]


def _e4m3(codes: torch.Tensor) -> torch.Tensor:
    return codes.to(torch.uint8).view(torch.float8_e4m3fn)


@pytest.mark.parametrize("shape", [[2], [0], [1, 1]])
def test_nvfp4_weight_scale_2_is_one_value(invoke, tmp_path, shape):
    """Issue 30 item 9: weight_scale_2 of shape [2] or [0] was exit 70 in verify (a reshape to ()); a scalar only."""
    d, _ = _nvfp4(tmp_path)
    bad = edited(d, tmp_path, name="bad", tensors={"fc.weight_scale_2": torch.full(shape, 0.125)})
    f = _finding(invoke, bad, "quant-scale-shape", "fc.weight_scale_2")
    assert f"has shape {shape}, expected [] or [1]" in f["message"]
    _refused(invoke("verify", bad, "--dtype", "bfloat16"), 4, "fc.weight_scale_2")
    r = invoke("smoke", bad, "--target", ROOT / "fixtures" / "target-llama", "--engine", "reference",
               "--num-prompts", "1", "--max-tokens", "2")  # its pre-flight inspect names the finding
    _refused(r, 9, "fc.weight_scale_2")
    assert "[quant-scale-shape]" in r.stderr
    r = invoke("convert", bad, tmp_path / "out", "--to", "specforge")
    assert r.exit_code == 7 and "[quant-scale-shape]" in r.stderr and not (tmp_path / "out").exists()


def test_a_one_element_weight_scale_2_is_a_scalar(tmp_path):
    d, expected = _nvfp4(tmp_path)
    one = edited(d, tmp_path, name="one", tensors={"fc.weight_scale_2": torch.tensor([0.125])})
    assert torch.equal(load_reference(open_drafter(str(one))).tensors["fc.weight"], expected)


@pytest.mark.parametrize("tensor,value,says", [
    ("fc.weight_scale", float("nan"), "is NaN"),
    ("fc.weight_scale", float("inf"), "is Inf"),
    ("layers.0.mlp.up_proj.weight_scale", 0.0, "is 0"),
    ("layers.0.mlp.down_proj.input_scale", -1.0, "is -1"),
    ("layers.0.mlp.down_proj.input_scale", float("nan"), "is NaN"),
])
def test_fp8_scales_are_finite_and_positive_without_scan(invoke, tmp_path, tensor, value, says):
    """Issue 30 item 12: NaN/Inf FP8 scales passed inspect (header-only): scales are tiny, inspect reads them."""
    bad = edited(FP8, tmp_path, name="bad", tensors={tensor: torch.tensor(value)})
    before = (bad / "model.safetensors").read_bytes()
    f = _finding(invoke, bad, "quant-scale-values", tensor)
    assert says in f["message"] and "finite and positive" in f["message"]
    # the reference refuses it too (input_scale included: vLLM would serve it), and nothing is written
    _refused(invoke("verify", bad, "--dtype", "bfloat16"), 4, tensor)
    r = invoke("convert", bad, tmp_path / "out", "--to", "specforge")
    assert r.exit_code == 7 and "[quant-scale-values]" in r.stderr and not (tmp_path / "out").exists()
    assert (bad / "model.safetensors").read_bytes() == before


def test_an_fp8_weight_scale_neither_per_tensor_nor_per_channel(invoke, tmp_path):
    bad = edited(FP8, tmp_path, name="bad", tensors={"fc.weight_scale": torch.ones(2)})
    f = _finding(invoke, bad, "quant-scale-shape", "fc.weight_scale")
    assert "per-tensor ([] or [1]), per-channel" in f["message"]
    _refused(invoke("verify", bad, "--dtype", "bfloat16"), 4, "fc.weight_scale")
    ints = edited(FP8, tmp_path, name="ints", tensors={"fc.weight_scale": torch.tensor(1, dtype=torch.int32)})
    assert "is I32 (a scale is a floating-point tensor)" in _finding(invoke, ints, "quant-scale-shape",
                                                                     "fc.weight_scale")["message"]


def test_fp8_per_channel_scales_dequantise_and_a_block_grid_is_incompatible(invoke, tmp_path):
    raw = load_file(FP8 / "model.safetensors")
    rows, cols = raw["fc.weight"].shape
    channel = torch.linspace(0.5, 1.5, rows)
    for name, scale in (("rows", channel), ("rows1", channel.reshape(rows, 1))):
        d = edited(FP8, tmp_path, name=name, tensors={"fc.weight_scale": scale})
        ids = {f["rule_id"] for f in _json(invoke("inspect", d, "--json"))["findings"]}
        assert not ids & {"quant-scale-shape", "quant-scale-values"}, ids
        assert torch.equal(load_reference(open_drafter(str(d))).tensors["fc.weight"],
                           raw["fc.weight"].float() * channel.reshape(rows, 1))
    grid = edited(FP8, tmp_path, name="grid", tensors={"fc.weight_scale": torch.ones(-(-rows // 16), -(-cols // 16))})
    assert "quant-scale-shape" not in {f["rule_id"] for f in _json(invoke("inspect", grid, "--json"))["findings"]}
    r = invoke("verify", grid, "--dtype", "bfloat16")
    assert r.exit_code == 13 and "'fc.weight'" in r.stderr and "block grid" in r.stderr, r.stderr


def _block_codes(d) -> torch.Tensor:
    return load_file(d / "model.safetensors")["fc.weight_scale"].view(torch.uint8).clone()


@pytest.mark.parametrize("code,says", [(0x7F, "1 NaN/Inf"), (0xFF, "1 NaN/Inf"), (0xB8, "1 negative")])
def test_nvfp4_block_scales_are_finite_under_scan(invoke, tmp_path, monkeypatch, code, says):
    """Issue 30 item 12: NVFP4 block scales holding E4M3 NaN (0x7F / 0xFF) or a negative scale passed --scan."""
    from eaglectl import limits

    d, _ = _nvfp4(tmp_path)
    codes = _block_codes(d)
    codes[1, 0] = code
    bad = edited(d, tmp_path, name="bad", tensors={"fc.weight_scale": _e4m3(codes)})
    f = _finding(invoke, bad, "quant-scale-values", "fc.weight_scale", "--scan")
    assert f"has {says} of {codes.numel()} values" in f["message"]
    scanned = _json(invoke("inspect", bad, "--json", "--scan"))["findings"]
    assert "nonfinite-values" not in {x["rule_id"] for x in scanned}  # one finding per scale, not two
    _refused(invoke("verify", bad, "--dtype", "bfloat16"), 4, "fc.weight_scale")
    # a block grid above quant_scale_bytes is read by --scan only: inspect without it says nothing of its values
    monkeypatch.setitem(limits.LIMITS, "quant_scale_bytes", limits.Limit(codes.numel() - 1, "test"))
    ids = {x["rule_id"] for x in _json(invoke("inspect", bad, "--json"))["findings"]}
    assert "quant-scale-values" not in ids
    _finding(invoke, bad, "quant-scale-values", "fc.weight_scale", "--scan")


def test_a_zero_block_scale_is_an_all_zero_block(invoke, tmp_path):
    d, _ = _nvfp4(tmp_path)
    codes = _block_codes(d)
    codes[0, :] = 0x80  # -0.0 and 0.0: what an all-zero block quantises to
    codes[1, :] = 0x00
    ok = edited(d, tmp_path, name="ok", tensors={"fc.weight_scale": _e4m3(codes)})
    doc = _json(invoke("inspect", ok, "--json", "--scan"))
    assert doc["exit_code"] == 0, doc["findings"]


@pytest.mark.parametrize("what", ["shape", "dtype", "weight"])
def test_nvfp4_block_scales_of_the_wrong_form(invoke, tmp_path, what):
    d, _ = _nvfp4(tmp_path)
    codes = _block_codes(d)
    rows, blocks = codes.shape
    tensors, tensor, says = {
        "shape": ({"fc.weight_scale": _e4m3(codes[:, : blocks // 2].contiguous())}, "fc.weight_scale",
                  f"expected {[rows, blocks]} (one FP8 scale per 16 inputs"),
        "dtype": ({"fc.weight_scale": torch.ones(rows, blocks)}, "fc.weight_scale",
                  "is F32 (NVFP4 block scales are F8_E4M3)"),
        "weight": ({"fc.weight": torch.zeros(rows, 4, dtype=torch.uint8)}, "fc.weight_scale",
                   "8 inputs, not a multiple of the NVFP4 block (16)"),
    }[what]
    bad = edited(d, tmp_path, name="bad", tensors=tensors)
    assert says in _finding(invoke, bad, "quant-scale-shape", tensor, "--scan")["message"]
    r = invoke("verify", bad, "--dtype", "bfloat16")
    if what == "weight":  # a narrower fc is another drafter: its spec is refused before any scale is read
        assert r.exit_code == 13 and "num_aux_hidden_states" in r.stderr, r.stderr
    else:
        _refused(r, 4, tensor)


def test_scan_reads_fp8_weights(invoke, tmp_path):
    """--scan read no F8 tensor at all: an FP8 weight with E4M3 NaN bytes passed it."""
    w = load_file(FP8 / "model.safetensors")["layers.0.mlp.gate_proj.weight"].view(torch.uint8).clone()
    w[0, :3] = torch.tensor([0x7F, 0xFF, 0x7E], dtype=torch.uint8)  # two NaN, one finite (448)
    bad = edited(FP8, tmp_path, name="bad", tensors={"layers.0.mlp.gate_proj.weight": _e4m3(w)})
    f = _finding(invoke, bad, "nonfinite-values", "layers.0.mlp.gate_proj.weight", "--scan")
    assert "has 2 NaN/Inf values" in f["message"]
    clean = _json(invoke("inspect", FP8, "--json", "--scan"))
    assert clean["exit_code"] == 0 and "no NaN/Inf" in next(
        x["message"] for x in clean["findings"] if x["rule_id"] == "scanned")


def test_scan_reads_fp8_in_a_pickle(invoke, tmp_path):
    """A .bin's FP8 tensor is counted from its bytes (torch has no isfinite for float8: no internal error)."""
    import shutil

    d = tmp_path / "bin"
    shutil.copytree(DRAFTERS / "eagle-3-bin", d)
    state = torch.load(d / "pytorch_model.bin", weights_only=True)
    state["fc.weight"] = state["fc.weight"].float().to(torch.float8_e4m3fn)
    state["fc.weight"].view(torch.uint8)[0, :2] = 0xFF
    torch.save(state, d / "pytorch_model.bin")
    f = _finding(invoke, d, "nonfinite-values", "fc.weight", "--scan", "--allow-pickle")
    assert "has 2 NaN/Inf values" in f["message"]


def test_a_weight_cut_short_after_opening_is_corrupt_not_a_crash(tmp_path):
    """raw_bytes' callers reshape what it reads: a file shortened under an open drafter is named as changed while
    it was read (exit 16), not a crash."""
    import os

    from eaglectl.errors import SourceChangedError
    from eaglectl.io.quant import dequantize

    d = open_drafter(str(edited(FP8, tmp_path, name="cut")))
    stored = d.view.stored["fc.weight"]
    wf = d.ckpt.tensor_file[stored]
    os.truncate(tmp_path / "cut" / "model.safetensors", wf.header.data_start + wf.header.tensors[stored].begin + 1)
    with pytest.raises(SourceChangedError, match="shrank"):
        dequantize(d, "fc.weight", layout_of(d))


def test_fuzzing_quantised_scales(invoke, tmp_path):
    """Random shapes, dtypes and values (NaN, Inf, 0, -0, negative, E4M3 NaN bytes) in the scales of the FP8 and
    NVFP4 drafters: no internal error, and inspect --scan and verify agree on every case (inspect passes exactly
    the drafters the reference dequantises). EAGLECTL_FUZZ_CASES runs more (400 passed when it was written)."""
    import random

    from .fuzzing import scale_cases

    nv, _ = _nvfp4(tmp_path)
    rows, k = load_file(DRAFTERS / "speculators-3" / "model.safetensors")["fc.weight"].shape
    block = load_file(nv / "model.safetensors")["fc.weight_scale"]
    sources = {nv: ["fc.weight_scale", "fc.weight_scale_2", "fc.input_scale"],
               FP8: [n for n in load_file(FP8 / "model.safetensors") if n.endswith(("_scale", "_scale_2"))]}
    rng = random.Random(0)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int32,
              torch.bool]
    values = [float("nan"), float("inf"), -1.0, 0.0, -0.0, 1e-30, 1.0, 0.125]
    shapes = [[], [1], [2], [0], [rows], [rows, 1], [1, rows], [rows, k // 16], [rows, k // 8], [3, 5], [rows, 0]]

    def hostile() -> torch.Tensor:
        if rng.random() < 0.3:  # a well-formed per-tensor scale (another value, shape or float dtype)
            return torch.full(rng.choice([[], [1]]), rng.choice([0.125, 1.0, 3.0])).to(rng.choice(dtypes[:3]))
        t = torch.full(rng.choice(shapes), rng.choice(values))
        if t.numel() and rng.random() < 0.5:
            t = torch.rand(t.shape)
            t.view(-1)[rng.randrange(t.numel())] = rng.choice(values)
        return t.to(rng.choice(dtypes))

    n = scale_cases(20)
    outcomes = set()
    for i in range(n):
        src = rng.choice(list(sources))
        tensors = {name: hostile() for name in rng.sample(sources[src], rng.randint(1, 2))}
        if src == nv and rng.random() < 0.5:  # one E4M3 block scale byte: NaN, negative, -0, 0
            codes = block.view(torch.uint8).clone()
            codes.view(-1)[rng.randrange(codes.numel())] = rng.choice([0x7F, 0xFF, 0xB8, 0x80, 0x00])
            tensors["fc.weight_scale"] = _e4m3(codes)
        (tmp_path / str(i)).mkdir()
        d = edited(src, tmp_path / str(i), name="d", tensors=tensors)
        scanned = invoke("inspect", d, "--json", "--scan").exit_code
        verified = invoke("verify", d, "--dtype", "bfloat16", "--tokens", "4").exit_code
        shown = {name: (str(t.dtype), list(t.shape)) for name, t in tensors.items()}
        assert scanned in (0, 1) and verified in (0, 4, 13), (i, shown, scanned, verified)
        assert (scanned == 0) == (verified == 0), (i, shown, scanned, verified)
        outcomes.add(verified)
    assert {0, 4} <= outcomes, outcomes
