"""`convert` between the producers' layouts of DFlash (docs/families.md#converting-between-dflash-layouts): z-lab /
vLLM's `dflash_config`, the speculators format, TorchSpec's training names. The meaning travels as vLLM reads it (the
layers each runner captures, the mask token, each layer's attention, the sizes), every tensor byte for byte, and a
value the destination cannot carry stops the conversion before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from eaglectl.errors import ConversionError, UsageError
from eaglectl.families.reading import reading

from .conftest import FIXTURES, ROOT
from .helpers import edited

DFLASH = ROOT / "fixtures" / "trained" / "dflash-untrained"  # z-lab layout, ids [1, 4, 6] of an 8-layer target
TARGET = ROOT / "fixtures" / "trained" / "target"


def _tensors(folder: Path) -> dict[str, bytes]:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k).view(-1).view(torch.uint8).numpy().tobytes()
                for k in f.keys()}  # noqa: SIM118 (a safe_open handle)


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _torchspec(tmp_path: Path, source: Path = DFLASH) -> Path:
    """A DFlash drafter as TorchSpec's DFlash export writes it: its training names, the target's embedding kept, and
    its config class's fields (a top-level target_layer_ids, num_target_layers = how many)."""
    names = {"fc.": "context_proj.", "hidden_norm.": "context_norm.", "norm.": "final_norm."}
    with safe_open(str(TARGET / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight")

    def rename(state: dict) -> dict:
        out = {next((new + k[len(old):] for old, new in names.items() if k.startswith(old)), k): v
               for k, v in state.items()}
        out["embed_tokens.weight"] = embed
        return out

    def config(c: dict) -> None:
        dc = c.pop("dflash_config")
        c.update(target_layer_ids=dc["target_layer_ids"], mask_token_id=dc["mask_token_id"], num_target_layers=3,
                 target_num_hidden_layers=8, target_hidden_size=128)

    return edited(source, tmp_path, name="torchspec", tensors=rename, config=config)


def test_dflash_round_trips_through_speculators_with_every_layer_kept(invoke, tmp_path):
    """z-lab -> speculators -> z-lab: every tensor byte for byte, vLLM's reading unchanged at each step. The last
    target layer (id 7 of 8) stays: speculators' own converter drops it (it counts it as the implicit last layer) and
    slices fc to match, which loses a trained input."""
    src = edited(DFLASH, tmp_path, name="src", config=lambda c: c["dflash_config"].update(target_layer_ids=[1, 4, 7]))
    spec, back = tmp_path / "spec", tmp_path / "back"
    r = invoke("convert", src, spec, "--to", "dflash-speculators", "--base-model", "org/target", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["plan"]["source_dialect"] == "dflash" and doc["plan"]["dest_dialect"] == "dflash-speculators"
    assert any(line.startswith("vLLM reads the written config as the source's") for line in doc["checked"])
    written = _config(spec)
    assert written["speculators_model_type"] == "dflash"
    assert written["aux_hidden_state_layer_ids"] == [2, 5, 8]  # boundaries: vLLM reads each - 1, all three kept
    assert written["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3  # block_size 4 - 1
    assert written["speculators_config"]["verifier"]["name_or_path"] == "org/target"
    assert written["sliding_window_non_causal"] is True  # full attention, non-causal: vLLM reads causal = not it
    assert reading(written) == reading(_config(src))
    r = invoke("convert", spec, back, "--to", "dflash", "--json")
    assert r.exit_code == 0, r.stderr
    assert _config(back)["dflash_config"]["target_layer_ids"] == [1, 4, 7]
    assert reading(_config(back)) == reading(_config(src))
    assert _tensors(back) == _tensors(spec) == _tensors(src)
    assert json.loads(invoke("inspect", back, "--json").stdout)["family"]["id"] == "dflash"


def test_torchspec_names_are_an_error_vllm_would_raise_and_convert_renames_them(invoke, tmp_path):
    src = _torchspec(tmp_path)
    doc = json.loads(invoke("inspect", src, "--json").stdout)
    layout = [f for f in doc["findings"] if f["rule_id"] == "family-layout"]
    assert layout and layout[0]["severity"] == "error" and "context_proj.*" in layout[0]["message"]
    assert doc["spec"]["layer_ids"] == [1, 4, 6]
    out = tmp_path / "out"
    r = invoke("convert", src, out, "--to", "dflash", "--json")
    assert r.exit_code == 0, r.stderr
    names = set(_tensors(out))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "embed_tokens.weight"} <= names
    assert not any(n.startswith(("context_", "final_norm")) for n in names)
    cfg = _config(out)
    assert cfg["dflash_config"] == {"target_layer_ids": [1, 4, 6], "mask_token_id": 319}
    assert cfg["num_target_layers"] == 8  # z-lab's meaning: the target's depth (TorchSpec's 3 counted the ids)
    assert "target_num_hidden_layers" not in cfg and "target_layer_ids" not in cfg
    assert reading(cfg) == reading(_config(DFLASH)) | {"target_hidden_size": 128}
    src_bytes = _tensors(src)
    assert _tensors(out)["fc.weight"] == src_bytes["context_proj.weight"]
    assert json.loads(invoke("inspect", out, "--json").stdout)["summary"]["error"] == 0


def test_torchspec_is_read_not_written(invoke, tmp_path):
    r = invoke("convert", DFLASH, tmp_path / "out", "--to", "dflash-torchspec")
    assert r.exit_code == 2 and "dflash-torchspec" in r.stderr  # not a choice: click's usage error
    assert not (tmp_path / "out").exists()


def test_mixed_causality_cannot_be_written_as_speculators(invoke, tmp_path):
    """vLLM makes z-lab's sliding layers causal and its full ones not; the speculators format has one switch."""
    src = edited(FIXTURES / "families" / "dflash", tmp_path, config={
        "layer_types": ["sliding_attention", "full_attention"] * 2 + ["full_attention"], "sliding_window": 64})
    r = invoke("convert", src, tmp_path / "out", "--to", "dflash-speculators", "--base-model", "org/t")
    assert r.exit_code == ConversionError.exit_code, r.stderr
    assert "differ in causality" in r.stderr and not (tmp_path / "out").exists()


def test_a_value_speculators_cannot_carry_is_named(invoke, tmp_path):
    """vLLM's speculators reader rebuilds dflash_config from four fields: any other key it reads is lost."""
    src = edited(FIXTURES / "families" / "dflash", tmp_path,
                 config=lambda c: c["dflash_config"].update(attention_value_scale=0.5))
    r = invoke("convert", src, tmp_path / "out", "--to", "dflash-speculators", "--base-model", "org/t")
    assert r.exit_code == ConversionError.exit_code, r.stderr
    assert "dflash_config.attention_value_scale as None" in r.stderr and "not 0.5" in r.stderr
    assert not (tmp_path / "out").exists()
    ok = invoke("convert", src, tmp_path / "hf", "--to", "dflash")  # the same layout carries every key
    assert ok.exit_code == 0, ok.stderr and _config(tmp_path / "hf")["dflash_config"]["attention_value_scale"] == 0.5


@pytest.mark.parametrize("args, error, says", [
    (["--to", "speculators", "--base-model", "o/t"], ConversionError, "not a layout of DFlash drafters"),
    (["--to", "dflash", "--aux-layer-ids", "1,2,3"], UsageError, "--aux-layer-ids is for EAGLE-3 drafters"),
    (["--to", "dflash-speculators"], ConversionError, "pass --base-model ORG/NAME or --target"),
])
def test_what_a_dflash_conversion_refuses(invoke, tmp_path, args, error, says):
    r = invoke("convert", DFLASH, tmp_path / "out", *args)
    assert r.exit_code == error.exit_code, r.stderr
    assert says in r.stderr and not (tmp_path / "out").exists()


def test_an_eagle3_drafter_is_not_written_as_dflash(invoke, tmp_path):
    r = invoke("convert", ROOT / "fixtures" / "trained" / "eagle3", tmp_path / "out", "--to", "dflash")
    assert r.exit_code == ConversionError.exit_code, r.stderr
    assert "layout of DFlash drafters" in r.stderr and not (tmp_path / "out").exists()


def test_dspark_has_no_layouts_to_convert_between(invoke, tmp_path):
    r = invoke("convert", FIXTURES / "families" / "dspark", tmp_path / "out", "--to", "dflash")
    assert r.exit_code == ConversionError.exit_code and "converts no DSpark layouts" in r.stderr, r.stderr


def test_dfash2_is_refused_by_name(invoke, tmp_path):
    src = edited(FIXTURES / "families" / "dflash", tmp_path, config={"architectures": ["DFlash2DraftModel"]})
    r = invoke("convert", src, tmp_path / "out", "--to", "dflash")
    assert r.exit_code == ConversionError.exit_code and "DFlash2" in r.stderr, r.stderr


def test_dry_run_shows_the_reading_it_keeps(invoke, tmp_path):
    r = invoke("convert", DFLASH, tmp_path / "out", "--to", "dflash-speculators", "--base-model", "o/t", "--dry-run",
               "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    kept = plan["intended"]["reading"]
    assert kept["layers vLLM's v1 runner captures"] == kept["layers vLLM's v2 runner captures"] == [2, 5, 7]
    assert kept["mask_token_id"] == 319 and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------- the reading against vLLM's own code

_ASK = """
import json, sys
from types import SimpleNamespace
from vllm.model_executor.models.qwen3_dflash import _dflash_layer_causal, _resolve_layer_attention
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
out = []
for cfg in json.load(sys.stdin):
    view = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(cfg))) \\
        if "speculators_model_type" in cfg else cfg
    c = SimpleNamespace(**view)
    n, types = view["num_hidden_layers"], view.get("layer_types") or []
    mixed = 0 < types.count("sliding_attention") < len(types)  # V2 only: vLLM's V1 check needs a running config
    out.append({"view": view, "attention": None if mixed else [list(_resolve_layer_attention(c, i)) for i in range(n)],
                "causal": [_dflash_layer_causal(c, i) for i in range(n)]})
print(json.dumps(out))
"""


@pytest.mark.vllm
@pytest.mark.slow
def test_the_dflash_reading_is_what_vllms_code_builds(tmp_path, vllm_py, invoke):
    """vLLM 0.32's speculators reader, DFlash layer-attention resolution and causality, called on the configs a
    conversion reads and writes: eaglectl's view and per-layer attention are theirs."""
    import subprocess

    from eaglectl.families.reading import family_view, layer_attention

    src = _config(DFLASH)
    swa = dict(src, layer_types=["sliding_attention"], sliding_window=64)
    mixed = dict(_config(FIXTURES / "families" / "dflash"), sliding_window=32,
                 layer_types=["sliding_attention", "full_attention"] * 2 + ["full_attention"])
    forced = dict(src, dflash_config={**src["dflash_config"], "use_swa": True, "swa_window_size": 16, "causal": True})
    spec = tmp_path / "spec"
    assert invoke("convert", DFLASH, spec, "--to", "dflash-speculators", "--base-model", "o/t").exit_code == 0
    written = _config(spec)
    non_causal_default = {k: v for k, v in written.items() if k != "sliding_window_non_causal"}  # absent: true
    cases = [src, swa, mixed, forced, written, non_causal_default, dict(written, sliding_window_non_causal=False)]
    r = subprocess.run([vllm_py, "-c", _ASK], input=json.dumps(cases), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for config, got in zip(cases, json.loads(r.stdout.strip().splitlines()[-1]), strict=True):
        view = family_view(config)
        assert view == got["view"], config
        ours = layer_attention(view)
        assert [c for _, c in ours] == got["causal"], config
        if got["attention"] is not None:
            assert ours == got["attention"], config


def test_a_source_error_stops_the_conversion_before_writing(invoke, tmp_path):
    """A mask token the target lacks stays lacking in any layout: refused with the rule, nothing written."""
    src = edited(DFLASH, tmp_path, config=lambda c: c["dflash_config"].update(mask_token_id=4000))
    r = invoke("convert", src, tmp_path / "out", "--to", "dflash", "--target", TARGET)
    assert r.exit_code == ConversionError.exit_code, r.stderr
    assert "[family-mask-token]" in r.stderr and not (tmp_path / "out").exists()
