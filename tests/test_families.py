"""DFlash, DSpark and P-EAGLE (formats/families.py, eaglectl/families/, docs/families.md): inspect names each family
on its fixture (published configs, fixtures/families/README.md) with the evidence, and each trap rule fires on a
defect variant of that fixture and not on the clean one, in the JSON report."""

from __future__ import annotations

import json

import pytest
import torch

from .conftest import FIXTURES, TARGET
from .helpers import edited

FAM = FIXTURES / "families"
MASK = 120  # make_fixtures.MASK: V - 8
H = 32


def _doc(invoke, path, *args) -> dict:
    r = invoke("inspect", path, "--json", *args)
    assert r.exit_code in (0, 1), r.stderr
    return json.loads(r.stdout)


def _rules(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in doc["findings"]:
        out.setdefault(f["rule_id"], []).append(f)
    return out


def _target(tmp_path, **config):
    return edited(TARGET, tmp_path, name="target", config=config)


# ------------------------------------------------------------------------------------------ reading

@pytest.mark.parametrize("name,family,evidence,dialect", [
    ("dflash", "DFlash", "config has 'dflash_config'", None),
    ("dspark", "DSpark", "tensor names start with 'markov_head.'", None),
    ("peagle", "P-EAGLE", "a tensor name contains 'mask_hidden'", "modelopt"),
])
def test_inspect_names_the_family_with_evidence(invoke, name, family, evidence, dialect):
    doc = _doc(invoke, FAM / name, "--target", TARGET)
    assert doc["exit_code"] == 0 and doc["family"]["name"] == family and doc["family"]["id"] == name
    assert evidence in doc["family"]["evidence"] and doc["dialect"] == dialect
    assert not [f for f in doc["findings"] if f["severity"] != "info" and f["rule_id"].startswith(("family", "peagle"))]


def test_human_report_names_the_family(invoke):
    r = invoke("inspect", FAM / "dspark")
    assert r.exit_code == 0 and "family   DSpark" in r.stdout and "Qwen3DSparkModel" in r.stdout
    r = invoke("inspect", FAM / "peagle")
    assert "family   P-EAGLE" in r.stdout and '"parallel_drafting": true' in r.stdout


def test_dflash_spec_and_serve_line(invoke):
    doc = _doc(invoke, FAM / "dflash", "--target", TARGET)
    spec = doc["spec"]
    assert spec["layer_ids"] == [1, 2, 3, 4, 5] and spec["layer_ids_key"] == "dflash_config.target_layer_ids"
    assert spec["mask_token_id"] == MASK and spec["mask_token_id_key"] == "dflash_config.mask_token_id"
    assert spec["head"] == "target's" and spec["d2t"] is False and spec["block_size"] == 16
    assert doc["speculative_config"]["method"] == "dflash"
    assert "--speculative-config" in doc["serve_command"]


def test_other_commands_refuse_dflash_and_point_at_inspect_and_its_layouts(invoke, tmp_path):
    r = invoke("upgrade", FAM / "dflash", tmp_path / "out")
    assert r.exit_code == 5 and not (tmp_path / "out").exists()
    assert "eaglectl inspect" in r.stderr and "--to dflash-speculators (between its layouts" in r.stderr
    r = invoke("convert", FAM / "dflash", tmp_path / "out", "--to", "speculators")  # an EAGLE-3 dialect
    assert r.exit_code == 7 and "not a layout of DFlash drafters" in r.stderr and not (tmp_path / "out").exists()


def test_peagle_converts_like_eagle3_and_fails_closed_where_its_token_is_lost(invoke, tmp_path):
    r = invoke("convert", FAM / "peagle", tmp_path / "out", "--to", "modelopt", "--target", TARGET)
    assert r.exit_code == 0, r.stderr
    assert "peagle-mask-hidden" not in _rules(_doc(invoke, tmp_path / "out"))
    # speculators writes P-EAGLE in its own form: speculators_model_type peagle, the mask token at the top level
    # (where vLLM's peagle reader requires it), no HF-style mask token or parallel_drafting inside the layer config
    spec = tmp_path / "spec"
    r = invoke("convert", FAM / "peagle", spec, "--to", "speculators", "--target", TARGET,
               "--source-aux-convention", "boundary")
    assert r.exit_code == 0, r.stderr
    config = json.loads((spec / "config.json").read_text())
    assert (config["speculators_model_type"], config["speculators_config"]["algorithm"]) == ("peagle", "peagle")
    assert config["mask_token_id"] == MASK and config["architectures"] == ["PEagleSpeculator"]
    assert not {"mask_token_id", "parallel_drafting"} & set(config["transformer_layer_config"])
    from safetensors import safe_open

    def mask_shape(folder) -> list[int]:
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            return list(f.get_slice("mask_hidden").get_shape())

    assert mask_shape(spec) == [1, 1, 3 * H]  # speculators' PEagleDraftModel holds [1, 1, n]; vLLM takes either
    doc = _doc(invoke, spec)
    assert doc["family"]["id"] == "peagle" and doc["exit_code"] == 0
    assert all(r["flags"] is not None and not r["error"] for r in doc["engine_readings"])
    back = tmp_path / "back"  # and back to the HF layout: the token where the EAGLE-3 dialects keep it
    assert invoke("convert", spec, back, "--to", "modelopt").exit_code == 0
    assert json.loads((back / "config.json").read_text())["mask_token_id"] == MASK and mask_shape(back) == [1, 3 * H]
    # a P-EAGLE whose mask token is lost: speculators' form requires one, so nothing is written
    lost = edited(FAM / "peagle", tmp_path, name="lost", config=lambda c: c.pop("mask_token_id"))
    r = invoke("convert", lost, tmp_path / "none", "--to", "speculators", "--target", TARGET,
               "--source-aux-convention", "boundary")
    assert r.exit_code == 7 and "mask_token_id" in r.stderr and not (tmp_path / "none").exists()


def test_an_eagle31_peagle_keeps_its_flags_where_vllm_reads_them(invoke, tmp_path):
    """speculators' P-EAGLE form, EAGLE-3.1: the flags at the top level (the speculators library's config) and inside
    transformer_layer_config (vLLM's peagle reader copies neither fc_norm nor norm_output from the top): vLLM's
    reading applies both, and inspect finds no flag difference."""
    def to_peagle(c: dict) -> None:
        c.update(parallel_drafting=True, mask_token_id=MASK)

    src = edited(FIXTURES / "drafters" / "specforge-3.1", tmp_path, name="peagle31", config=to_peagle,
                 tensors={"mask_hidden": torch.full((1, 3 * H), 0.01, dtype=torch.bfloat16)})
    out = tmp_path / "spec"
    r = invoke("convert", src, out, "--to", "speculators", "--target", TARGET)
    assert r.exit_code == 0, r.stderr
    config = json.loads((out / "config.json").read_text())
    layer = config["transformer_layer_config"]
    assert config["fc_norm"] and config["norm_output"] and layer["fc_norm"] and layer["norm_output"]
    doc = _doc(invoke, out)
    assert doc["eagle_version"] == "3.1" and "engine-flags-differ" not in _rules(doc)
    assert all(r["flags"]["fc_norm"] and r["flags"]["norm_output"] for r in doc["engine_readings"])


def test_formats_lists_the_families(invoke):
    doc = json.loads(invoke("formats", "--json").stdout)
    by_id = {f["id"]: f for f in doc["families"]}
    assert {"dflash", "dspark", "peagle", "eagle-4", "mtp", "medusa"} <= set(by_id)
    assert by_id["dspark"]["read"]["method"] == "dspark" and by_id["medusa"]["read"] is None
    assert by_id["peagle"]["read"]["runners"]["v1"] == "serves" and by_id["peagle"]["read"]["runners"]["v2"] != "serves"
    assert {d["id"] for d in doc["dialects"]} >= {"speculators", "modelopt"}  # the dialects stay


# ----------------------------------------------------------------------------------------- layers

def test_both_runners_read_dflash_ids_plus_one(invoke):
    doc = _doc(invoke, FAM / "dflash", "--target", TARGET)
    readings = {r["runner"]: r for r in doc["engine_readings"]}
    assert readings["v1"]["boundary_ids"] == readings["v2"]["boundary_ids"] == [2, 3, 4, 5, 6]
    assert readings["v2"]["shift"] == 1 and "assumed" in readings["v2"]["basis"]
    assert "V2 captures [2, 3, 4, 5, 6]" in _rules(doc)["family-layers"][0]["message"]


def test_dspark_is_v2_only_and_deepseek_v41_is_read_as_is(invoke, tmp_path):
    doc = _doc(invoke, FAM / "dspark", "--target", TARGET)
    readings = {r["runner"]: r for r in doc["engine_readings"]}
    assert readings["v1"]["error"] and "refuses method dspark" in readings["v1"]["error"]
    assert readings["v2"]["boundary_ids"] == [2, 3, 4, 5, 6]
    assert "V2 runner only" in _rules(doc)["family-runner"][0]["message"]
    v41 = edited(FAM / "dspark", tmp_path, config={"model_type": "deepseek_v41", "dspark_target_layer_ids": [1, 2, 3]})
    readings = {r["runner"]: r for r in _doc(invoke, v41, "--target", TARGET)["engine_readings"]}
    assert readings["v2"]["boundary_ids"] == [1, 2, 3] and readings["v2"]["shift"] == 0


def test_ids_beyond_the_target_are_an_error(invoke, tmp_path):
    def last(cfg):
        cfg["dflash_config"]["target_layer_ids"] = [1, 3, 5, 7, 8]  # 8 is no output of an 8-layer target

    bad = edited(FAM / "dflash", tmp_path, config=last)
    hit = _rules(_doc(invoke, bad, "--target", TARGET))["family-layers-range"][0]
    assert hit["severity"] == "error" and "[9]" in hit["message"] and "--target" in hit["message"]
    # without --target, the drafter's own num_target_layers stands in
    shallow = edited(FAM / "dflash", tmp_path, name="shallow", config={"num_target_layers": 4})
    hit = _rules(_doc(invoke, shallow))["family-layers-range"][0]
    assert "num_target_layers" in hit["message"] and "[5, 6]" in hit["message"]
    assert "family-layers-range" not in _rules(_doc(invoke, FAM / "dflash", "--target", TARGET))


def test_speculators_dflash_ids_are_boundaries(invoke, tmp_path):
    cfg = {"speculators_model_type": "dflash", "architectures": ["DFlashDraftModel"], "mask_token_id": MASK,
           "aux_hidden_state_layer_ids": [2, 3, 4, 5, 6], "transformer_layer_config": {"num_hidden_layers": 5},
           "speculators_config": {"algorithm": "dflash"}}
    d = edited(FAM / "dflash", tmp_path, config=lambda c: (c.clear(), c.update(cfg)))
    doc = _doc(invoke, d, "--target", TARGET)
    assert doc["family"]["id"] == "dflash"
    assert {r["runner"]: r["boundary_ids"] for r in doc["engine_readings"]} == {"v1": [2, 3, 4, 5, 6],
                                                                                "v2": [2, 3, 4, 5, 6]}


# -------------------------------------------------------------------------------------- mask token

@pytest.mark.parametrize("name", ["dflash", "dspark", "peagle"])
def test_a_missing_mask_token_is_an_error(invoke, tmp_path, name):
    def drop(cfg):
        cfg.pop("mask_token_id", None)
        cfg.get("dflash_config", {}).pop("mask_token_id", None)

    hit = _rules(_doc(invoke, edited(FAM / name, tmp_path, config=drop)))["family-mask-token"][0]
    assert hit["severity"] == "error" and "no mask token id" in hit["message"]


def test_the_mask_token_must_exist_in_the_target(invoke, tmp_path):
    def far(cfg):  # within the drafter's own vocabulary, beyond the target's
        cfg["dflash_config"]["mask_token_id"] = 200
        cfg["vocab_size"] = 256

    bad = edited(FAM / "dflash", tmp_path, config=far)
    msgs = [f["message"] for f in _rules(_doc(invoke, bad, "--target", TARGET))["family-mask-token"]]
    assert any("not in the target's vocabulary (vocab_size 128)" in m for m in msgs)
    # a target whose config claims more tokens than its embedding holds: the embedding decides too
    wide = _target(tmp_path, vocab_size=256)
    msgs = [f["message"] for f in _rules(_doc(invoke, bad, "--target", wide))["family-mask-token"]]
    assert msgs == ["config 'dflash_config.mask_token_id' 200 has no row in the target's embedding "
                    "model.embed_tokens.weight (128 rows)"]
    assert "family-mask-token" not in _rules(_doc(invoke, FAM / "dflash", "--target", TARGET))


# ----------------------------------------------------------------------------------------- head/d2t

def test_a_reduced_head_without_d2t_is_an_error(invoke, tmp_path):
    d = edited(FAM / "dflash", tmp_path, config={"draft_vocab_size": 64},
               tensors={"lm_head.weight": torch.zeros(64, H, dtype=torch.bfloat16)})
    hit = _rules(_doc(invoke, d, "--target", TARGET))["family-head-d2t"][0]
    assert hit["severity"] == "error" and "no d2t ships" in hit["message"]
    ok = edited(FAM / "dflash", tmp_path, name="with-d2t", config={"draft_vocab_size": 64},
                tensors={"lm_head.weight": torch.zeros(64, H, dtype=torch.bfloat16),
                         "d2t": torch.zeros(64, dtype=torch.int64)})
    assert "family-head-d2t" not in _rules(_doc(invoke, ok, "--target", TARGET))


def test_d2t_without_its_head_is_an_error(invoke, tmp_path):
    d = edited(FAM / "dflash", tmp_path, config={"draft_vocab_size": 64},
               tensors={"d2t": torch.zeros(64, dtype=torch.int64)})
    hit = _rules(_doc(invoke, d, "--target", TARGET))["family-head-d2t"][0]
    assert "target's head" in hit["message"] and "#11374" in hit["message"]


def test_a_padded_target_vocab_is_said(invoke, tmp_path):
    padded = _target(tmp_path, vocab_size=160)
    hit = _rules(_doc(invoke, FAM / "dflash", "--target", padded))["family-padded-vocab"][0]
    assert hit["severity"] == "info" and "draft vocab 128, target vocab 160" in hit["message"]
    assert "family-padded-vocab" not in _rules(_doc(invoke, FAM / "dflash", "--target", TARGET))
    # DSpark builds a d2t only for a smaller draft vocabulary: a draft as wide as the padded target's needs none
    wide = edited(FAM / "dspark", tmp_path, config={"vocab_size": 160})
    assert "family-padded-vocab" not in _rules(_doc(invoke, wide, "--target", padded))


# ------------------------------------------------------------------------------------------ P-EAGLE

def test_peagle_mask_hidden_shape(invoke, tmp_path):
    clean = _rules(_doc(invoke, FAM / "peagle"))
    assert "peagle-mask-hidden" not in clean and "[1, 96]" in clean["peagle-parallel-drafting"][0]["message"]
    bad = edited(FAM / "peagle", tmp_path, tensors={"mask_hidden": torch.zeros(1, 2 * H, dtype=torch.bfloat16)})
    hit = _rules(_doc(invoke, bad))["peagle-mask-hidden"][0]
    assert hit["severity"] == "error" and "[1, 64]" in hit["message"] and "[1, 96]" in hit["message"]


def test_peagle_declared_without_mask_hidden(invoke, tmp_path):
    bad = edited(FAM / "peagle", tmp_path, tensors={"mask_hidden": None})
    hit = _rules(_doc(invoke, bad))["peagle-mask-hidden"][0]
    assert "parallel_drafting" in hit["message"] and "mask_hidden not found" in hit["message"]


def test_a_peagle_is_measured_and_gated_on_the_chain_its_reference_drafts(invoke, tmp_path):
    """P-EAGLE is EAGLE-3's chain plus mask_hidden for its parallel slots. The reference drafter drafts the chain, so
    it leaves mask_hidden out instead of refusing the drafter: `inspect --target` measures its aux reading from the
    weights, and check's parity stage passes on the chain, says mask_hidden was not run, and checks its values (a NaN
    in it fails the stage)."""
    trained = FIXTURES / "trained"
    doc = _doc(invoke, trained / "peagle", "--target", trained / "target")
    assert doc["measured"]["aux_convention"]["measured"] == "boundary" and doc["measured_note"] is None
    r = invoke("check", trained / "peagle", "--target", trained / "target", "--json")
    report = json.loads(r.stdout)
    parity = next(s for s in report["stages"] if s["name"] == "parity")
    assert r.exit_code == 0 and report["verdict"] == "PASS", r.stdout
    assert parity["status"] == "pass" and parity["detail"].endswith(
        "not run by the reference (it drafts the chain): mask_hidden, finite"), parity
    nan = torch.full((1, 384), 0.01, dtype=torch.bfloat16)
    nan[0, 7] = float("nan")
    bad = edited(trained / "peagle", tmp_path, name="nan", tensors={"mask_hidden": nan})
    report = json.loads(invoke("check", bad, "--target", trained / "target", "--json").stdout)
    parity = next(s for s in report["stages"] if s["name"] == "parity")
    assert parity["status"] == "fail" and "'mask_hidden' has 1 NaN/Inf values" in parity["detail"]
    assert report["verdict"] == "FAIL"


def test_verify_judges_a_peagle_conversion_on_mask_hidden_too(invoke, tmp_path):
    """verify runs the chain and compares mask_hidden, which the chain does not read, by its values: the speculators
    form (mask_hidden at [1, 1, n]) is identical to its source, a cast stays within the rounding, and a changed
    mask_hidden fails although every output is bit-identical."""
    from eaglectl.errors import ParityMismatchError

    trained = FIXTURES / "trained"

    def verified(folder) -> tuple[int, dict]:
        r = invoke("verify", folder, "--against", trained / "peagle", "--json")
        return r.exit_code, json.loads(r.stdout)

    same, cast = tmp_path / "same", tmp_path / "cast"
    for out, extra in ((same, ()), (cast, ("--dtype", "float16"))):
        r = invoke("convert", trained / "peagle", out, "--to", "speculators", "--base-model", "org/target", *extra)
        assert r.exit_code == 0, r.stderr
    code, doc = verified(same)
    assert code == 0 and doc["identical_tensors"] and doc["regime"] == "exact"
    code, doc = verified(cast)
    assert code == 0 and doc["regime"] == "low-precision" and doc["unrun_differences"] == []
    nudged = edited(same, tmp_path, name="nudged", tensors=lambda state: {  # another dtype, within BF16's rounding
        **state, "mask_hidden": (state["mask_hidden"].float() * (1 + 2 ** -10)).to(torch.float16)})
    code, doc = verified(nudged)
    assert code == 0 and "mask_hidden" in doc["differing_tensors"] and doc["unrun_differences"] == []
    doubled = edited(same, tmp_path, name="doubled", tensors=lambda state: {
        **state, "mask_hidden": state["mask_hidden"] * 2})
    code, doc = verified(doubled)
    assert code == ParityMismatchError.exit_code and doc["unrun_differences"] == [
        "'mask_hidden' changed while its stored dtype (BF16) did not"]
    assert all(m["logits_max_abs"] == 0 and m["passed"] for m in doc["per_step"])  # the chain cannot show it


def test_peagle_runs_on_v1_only(invoke):
    hit = _rules(_doc(invoke, FAM / "peagle"))["family-runner"][0]
    assert "V1 runner only" in hit["message"] and "parallel_drafting: true" in hit["message"]


def test_plain_eagle3_has_no_family(invoke):
    doc = _doc(invoke, FIXTURES / "drafters" / "speculators-3")
    assert doc["family"] is None and not any(f["rule_id"].startswith(("family", "peagle")) for f in doc["findings"])


# ------------------------------------------------------------------------- the tables against vLLM's code

_ASK = """
import json, sys
from types import SimpleNamespace
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
out = []
for cfg in json.load(sys.stdin):
    spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(**cfg)))
    v1 = GPUModelRunner._get_eagle3_aux_layers_from_config(SimpleNamespace(speculative_config=spec))
    out.append({"v1": list(v1) if v1 else None, "v2": list(get_eagle3_aux_layers_from_config(spec) or []) or None})
print(json.dumps(out))
"""


@pytest.mark.vllm
@pytest.mark.slow
def test_family_layer_tables_give_what_vllms_selection_code_gives(tmp_path, vllm_py):
    """Both runners' own selection functions, called on the families' configs as vLLM builds them: the ids they
    choose are the ones family_readings reports (sorted, de-duplicated, as the model then captures them)."""
    import subprocess

    from eaglectl.families.reading import family_readings, family_view
    from eaglectl.formats.families import by_id

    configs = [json.loads((FAM / "dflash" / "config.json").read_text()),
               json.loads((FAM / "dspark" / "config.json").read_text())]
    v41 = dict(configs[1], model_type="deepseek_v41", dspark_target_layer_ids=[1, 2, 3])
    shadowed = dict(configs[0], eagle_config={"use_aux_hidden_state": True})  # V1: eagle_config replaces the ids
    spec_dflash = {"speculators_model_type": "dflash", "mask_token_id": MASK, "aux_hidden_state_layer_ids": [2, 4, 6],
                   "transformer_layer_config": {"model_type": "qwen3"}}
    cases = [("dflash", configs[0]), ("dspark", configs[1]), ("dspark", v41), ("dflash", shadowed),
             ("dflash", spec_dflash)]
    views = [family_view(c) for _, c in cases]
    r = subprocess.run([vllm_py, "-c", _ASK], input=json.dumps(views), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    asked = json.loads(r.stdout.strip().splitlines()[-1])
    for (family, config), got in zip(cases, asked, strict=True):
        ours = family_readings(config, {"v1": None, "v2": None}, 8)  # every runner's selection, served or not
        for runner in ("v1", "v2"):
            mine = ours.get(runner)
            vllm_ids = sorted(set(got[runner])) if got[runner] else None
            assert (list(mine.boundary_ids) if mine.source != "model default" else None) == vllm_ids, \
                (family, config, runner, got)
        assert by_id(family).reading is not None


_ASK_V2 = """
import json, sys
from types import SimpleNamespace
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
out = []
for cfg in json.load(sys.stdin):
    spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(**cfg)))
    out.append(list(get_eagle3_aux_layers_from_config(spec) or []) or None)
print(json.dumps(out))
"""


@pytest.mark.engines
def test_family_layer_tables_hold_for_vllm_034(vllm034_py):
    """vLLM 0.34 (no V1 runner) selects the layers of the same DFlash / DSpark configs as the table's V2 reading
    says: the family readings, checked on 0.32, hold for the release `VLLM_PACKAGE=vllm` installs."""
    import subprocess

    from eaglectl.families.reading import family_readings, family_view

    dspark = json.loads((FAM / "dspark" / "config.json").read_text())
    cases = [json.loads((FAM / "dflash" / "config.json").read_text()), dspark,
             dict(dspark, model_type="deepseek_v41", dspark_target_layer_ids=[1, 2, 3]),
             {"speculators_model_type": "dspark", "aux_hidden_state_layer_ids": [2, 4, 6], "mask_token_id": MASK,
              "transformer_layer_config": {"model_type": "qwen3"}}]
    r = subprocess.run([vllm034_py, "-c", _ASK_V2], input=json.dumps([family_view(c) for c in cases]),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    for config, got in zip(cases, json.loads(r.stdout.strip().splitlines()[-1]), strict=True):
        v2 = family_readings(config, {"v1": None, "v2": None}, 8).get("v2")
        assert (list(v2.boundary_ids) if v2.source != "model default" else None) == (
            sorted(set(got)) if got else None), (config, got)


# ------------------------------------------------------------------------- DSpark's anchor convention, per engine

_SPECULATORS_ONLY = ("architectures", "block_size", "markov_rank", "markov_head_type", "mask_token_id",
                     "target_layer_ids", "num_anchors", "num_target_layers", "enable_confidence_head",
                     "confidence_head_with_markov")


def _speculators_dspark(config: dict, **extra) -> dict:
    """The DSpark fixture's config as speculators' converter writes it (its PR #737): the decoder nested, the ids in
    boundary numbering, the DSpark fields at the top level, no model_type."""
    out = {"architectures": ["DSparkSpeculator"], "speculators_model_type": "dspark",
           "transformer_layer_config": {k: v for k, v in config.items() if k not in _SPECULATORS_ONLY},
           "aux_hidden_state_layer_ids": [i + 1 for i in config["target_layer_ids"]],
           "speculators_config": {"algorithm": "dspark", "verifier": {"name_or_path": "org/target"},
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 6}]}}
    out.update({k: config[k] for k in _SPECULATORS_ONLY[1:6] + _SPECULATORS_ONLY[8:]})
    return out | extra


@pytest.mark.parametrize(("layout", "anchor", "vllm_reads", "tokens", "warned"), [
    ("hf", None, True, 7, False),  # both runtimes' default: the anchor is a query, a token per query
    ("hf", False, False, 6, False),  # the anchor is the bonus token: block_size - 1 drafts
    ("speculators", None, False, 6, True),  # vLLM's speculators reader fills false; speculators writes true
    ("speculators", True, True, 7, False),
])
def test_dspark_anchor_convention_as_each_engine_reads_it(invoke, tmp_path, layout, anchor, vllm_reads, tokens,
                                                          warned):
    """Issue 48: DSpark's sample_from_anchor decides which slot predicts which token; read the other way than
    trained, a drafter accepts almost nothing (sglang PR #30982). inspect says what vLLM and SGLang read from these
    files, warns where an absent key is filled differently by the readers, sizes the serve line's drafts by vLLM's
    reading, and names that SGLang 0.5.23 cannot load the speculators layout (an error for --for sglang)."""
    src = FAM / "dspark"
    config = json.loads((src / "config.json").read_text())
    extra = {} if anchor is None else {"sample_from_anchor": anchor}
    new = _speculators_dspark(config, **extra) if layout == "speculators" else config | extra
    d = edited(src, tmp_path, name=layout, config=lambda c: (c.clear(), c.update(new)))
    doc = _doc(invoke, d)
    found = {f["rule_id"]: f for f in doc["findings"]}
    reads = doc["spec"]["sample_from_anchor"]
    assert reads["vllm 0.32-0.34"] is vllm_reads
    assert reads["sglang 0.5.23"] is (None if layout == "speculators" else True if anchor is None else anchor)
    assert ("family-anchor-absent" in found) is warned and ("family-anchor" in found) is not warned
    assert (found.get("family-anchor-absent") or found["family-anchor"])["locator"].endswith(":sample_from_anchor")
    if not warned:
        assert doc["speculative_config"]["num_speculative_tokens"] == tokens, doc["speculative_config"]
    sglang = _doc(invoke, d, "--for", "sglang")
    engine_layout = [f for f in sglang["findings"] if f["rule_id"] == "family-engine-layout"]
    assert [f["severity"] for f in engine_layout] == (["error"] if layout == "speculators" else [])


_ASK_ANCHOR = """
import ast, json, sys
import vllm
from vllm.transformers_utils.configs.speculators import algos
root = vllm.__path__[0]
src = open(root + "/v1/worker/gpu/spec_decode/dspark/speculator.py").read()
defaults = [c.args[2].value for c in ast.walk(ast.parse(src)) if isinstance(c, ast.Call) and getattr(c.func, "id", "")
            == "getattr" and len(c.args) == 3 and getattr(c.args[1], "value", None) == "sample_from_anchor"]
out = {"runtime_default": defaults, "speculators": [], "types": sorted(algos.SUPPORTED_SPECULATORS_TYPES)}
for cfg in json.load(sys.stdin):
    pre = {}
    algos.update_dspark(cfg, pre)
    out["speculators"].append({k: pre.get(k) for k in ("sample_from_anchor", "architectures", "target_layer_ids",
                                                        "eagle_aux_hidden_state_layer_ids", "markov_rank")})
print(json.dumps(out))
"""

_ASK_ANCHOR_SGLANG = """
import importlib.util, json, sys
from types import SimpleNamespace
spec = importlib.util.spec_from_file_location("worker", sys.argv[1])  # its torchvision placeholder, as it reads
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
worker._placeholder_torchvision()
from sglang.srt.speculative.dspark_components.dspark_config import get_dspark_sample_from_anchor
print(json.dumps([get_dspark_sample_from_anchor(SimpleNamespace(**cfg)) for cfg in json.load(sys.stdin)]))
"""


@pytest.mark.engines
@pytest.mark.vllm
def test_the_anchor_table_is_what_the_engines_code_reads(vllm_py, vllm034_py, sglang_py):
    """formats/families.DSPARK_ANCHOR against the engines' own code: vLLM 0.32's and 0.34's speculators reader
    (update_dspark, called) and their DSpark runtime's default (read from its source), SGLang 0.5.23's reader
    (called). eaglectl's view of a speculators DSpark config is what update_dspark builds."""
    import subprocess

    from eaglectl.families.reading import family_view
    from eaglectl.formats.families import DSPARK_ANCHOR, VLLM_SPECULATORS_TYPES

    config = json.loads((FAM / "dspark" / "config.json").read_text())
    cases = [_speculators_dspark(config), _speculators_dspark(config, sample_from_anchor=True),
             _speculators_dspark(config, sample_from_anchor=False)]
    table = {(r.engine, r.style): r.default for r in DSPARK_ANCHOR}
    for python in (vllm_py, vllm034_py):
        r = subprocess.run([python, "-c", _ASK_ANCHOR], input=json.dumps(cases), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        asked = json.loads(r.stdout.strip().splitlines()[-1])
        assert asked["runtime_default"] == [table["vllm", "hf"]]
        assert asked["types"] == sorted(VLLM_SPECULATORS_TYPES)  # speculators' "mtp" is none of them
        assert asked["speculators"][0]["sample_from_anchor"] is table["vllm", "speculators"]
        for case, got in zip(cases, asked["speculators"], strict=True):
            view = family_view(case)
            assert {k: view.get(k) for k in got} == got, (case, got)
    hf = [config, config | {"sample_from_anchor": False}, config | {"sample_from_anchor": True}]
    from eaglectl.engines.engine_process import WORKERS

    r = subprocess.run([sglang_py, "-c", _ASK_ANCHOR_SGLANG, str(WORKERS / "sglang_reading.py")], input=json.dumps(hf), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [table["sglang", "hf"], False, True]


def test_speculators_mtp_format_is_refused_as_no_engine_loads_it(invoke, tmp_path):
    """speculators' MTP and FastMTP converters write `speculators_model_type: mtp` (FastMTPSpeculator, its
    `mtp_layers.0.*`): no engine loads that format (vLLM's speculators reader builds other types, SGLang has no
    reader), so the refusal says so instead of naming the target's own MTP method as where it is served."""
    from safetensors.torch import save_file

    d = tmp_path / "fast-mtp"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["FastMTPSpeculator"], "speculators_model_type": "mtp", "num_nextn_predict_layers": 1,
        "transformer_layer_config": {"model_type": "qwen3_next"}, "speculators_config": {"algorithm": "mtp"}}))
    save_file({"mtp_layers.0.input_proj.weight": torch.zeros(4, 8), "embed_tokens.weight": torch.zeros(8, 4)},
              str(d / "model.safetensors"))
    r = invoke("inspect", d)
    text = " ".join(r.stderr.split())
    assert r.exit_code == 5 and "MTP head" in text and "in speculators' 'mtp' format no engine loads it" in text, text
