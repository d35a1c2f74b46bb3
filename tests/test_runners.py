"""vLLM's two model runners: the readings asked of vLLM's own code, and the table that stands in for it.

The vLLM test asks vLLM (one worker run) for every fixture drafter, every planted defect whose config parses
and the published layouts the field notes name, and checks that eaglectl's table gives exactly what vLLM's
own V1 and V2 selection code and its draft model classes give, for every one.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pytest

from eaglectl.engines import asking
from eaglectl.engines.asking import Request, read_batch
from eaglectl.engines.facts import RUNNERS
from eaglectl.engines.readings import select, table_readings, vllm_view

from .conftest import DEFECTS, DRAFTERS, FIXTURES, TARGET
from .helpers import edited

TRAINED = FIXTURES / "trained"

_LLAMA = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
          "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
          "num_hidden_layers": 1, "vocab_size": 256, "draft_vocab_size": 64, "target_hidden_size": 64,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096, "hidden_act": "silu",
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
_MLA = json.loads((TRAINED / "eagle3.1-mla" / "config.json").read_text())
for _k in ("fc_norm", "norm_output", "norm_before_residual", "norm_before_fc", "eagle_config"):
    _MLA.pop(_k)


def _llama(**extra):
    return {**copy.deepcopy(_LLAMA), **extra}


def _mla(**extra):
    return {**copy.deepcopy(_MLA), **extra}


_SPECULATORS = json.loads((FIXTURES / "drafters" / "speculators-3" / "config.json").read_text())
for _k in ("fc_norm", "norm_output", "norm_before_residual", "eaglectl_provenance"):
    _SPECULATORS.pop(_k, None)


def _peagle(layer: dict | None = None, **extra):
    """A speculators-format P-EAGLE config (speculators 0.9.0's PEagleSpeculatorConfig): `layer` goes into its
    transformer_layer_config."""
    cfg = {**copy.deepcopy(_SPECULATORS), "speculators_model_type": "peagle", "mask_token_id": 127, **extra}
    cfg["transformer_layer_config"].update(layer or {})
    return cfg


# The published layouts the field notes name (their aux-id layout; small sizes), with the target depth their ids
# imply, and what each runner captures there (V1, V2). The first six keep their ids only in eagle_config.
PUBLISHED = {
    "lmsys gpt-oss-120b EAGLE-3": (_llama(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 17, 33]}), 36,
                                   (1, 17, 33), (2, 18, 33)),
    "lmsys Qwen3-235B EAGLE-3": (_llama(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 46, 90]}), 94,
                                 (1, 46, 90), (2, 47, 91)),
    "TorchSpec Kimi-K2.5 template": (_mla(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 29, 57],
                                                        "use_aux_hidden_state": True}), 61, (1, 29, 57), (2, 30, 58)),
    "Step-3.5 SpecForge drafter": (_llama(eagle_config={"eagle_aux_hidden_state_layer_ids": [4, 20, 40]}), 45,
                                   (4, 20, 40), (2, 22, 42)),
    "k-l-lambda Kimi-K2.5-Eagle3": (_mla(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 30, 58],
                                                       "use_aux_hidden_state": True}), 61, (2, 30, 58), (2, 30, 58)),
    "AQ-MedAI Kimi-K2.5 drafter": (_mla(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}), 61,
                                   (2, 30, 58), (2, 30, 58)),
    # ids at the top level: both runners read them
    "NVIDIA gpt-oss-120b-Eagle3-v3": (_llama(eagle_aux_hidden_state_layer_ids=[24, 30, 36], norm_before_fc=True,
                                             eagle_config={"eagle_aux_hidden_state_layer_ids": [24, 30, 36],
                                                           "norm_before_fc": True}), 36, (24, 30, 36), (24, 30, 36)),
    # the other keys the runners read (synthetic, one each)
    "top-level target_layer_ids (DSpark style)": (_llama(target_layer_ids=[1, 17, 33]), 36, (2, 18, 33),
                                                  (2, 18, 34)),
    "eagle_config.layer_ids": (_llama(eagle_config={"layer_ids": [3, 10, 20]}), 36, (2, 18, 33), (3, 10, 20)),
    "eagle_config with ids and norm_before_fc": (_llama(eagle_config={"eagle_aux_hidden_state_layer_ids": [5, 9, 30],
                                                                      "norm_before_fc": True}), 36, (5, 9, 30),
                                                 (2, 18, 33)),
    "N = 4 ids only in eagle_config": (_llama(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 9, 17, 33]}), 36,
                                       (1, 9, 17, 33), (2, 18, 33)),
    "fc_norm alias only (enable_fc_norm)": (_llama(enable_fc_norm=True, eagle_aux_hidden_state_layer_ids=[2, 18, 33]),
                                            36, (2, 18, 33), (2, 18, 33)),
    # speculators-format P-EAGLE: vLLM's peagle reader copies neither 3.1 flag from the top level, and defaults
    # norm_before_residual to false (the eagle3 reader: true)
    "speculators P-EAGLE, 3.1 flags at the top level": (_peagle(fc_norm=True, norm_output=True), 8, (1, 4, 7),
                                                        (1, 4, 7)),
    "speculators P-EAGLE, 3.1 flags in transformer_layer_config": (_peagle({"fc_norm": True, "norm_output": True}),
                                                                   8, (1, 4, 7), (1, 4, 7)),
    "speculators P-EAGLE, Qwen3": (_peagle({"model_type": "qwen3"}, norm_before_residual=True), 8, (1, 4, 7),
                                   (1, 4, 7)),
}


def _published(tmp: Path) -> list[tuple[str, Request]]:
    out = []
    for name, (cfg, L, _v1, _v2) in PUBLISHED.items():
        folder = tmp / name.replace(" ", "_").replace("(", "").replace(")", "").replace("=", "")
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        out.append((name, Request(str(folder), cfg, L)))
    return out


def _fixtures() -> list[tuple[str, Request]]:
    out = []
    trained = {"eagle3": "target", "eagle3-output": "target", "eagle3.1": "target", "eagle3.1-mla": "target-mla"}
    for name, target in trained.items():
        cfg = json.loads((TRAINED / name / "config.json").read_text())
        target_cfg = json.loads((TRAINED / target / "config.json").read_text())
        out.append((f"trained/{name}", Request(str(TRAINED / name), cfg, target_cfg["num_hidden_layers"],
                                               str(TRAINED / target), target_cfg)))
    target_config = json.loads((TARGET / "config.json").read_text())
    for base in (DRAFTERS, DEFECTS):
        for folder in sorted(p for p in base.iterdir() if (p / "config.json").is_file()):
            try:
                cfg = json.loads((folder / "config.json").read_text())
            except ValueError:
                continue
            out.append((f"{base.name}/{folder.name}", Request(str(folder), cfg, 8, str(TARGET), target_config)))
    return out


def _ids(r):
    return None if r is None or r.boundary_ids is None else tuple(r.boundary_ids)


# ------------------------------------------------------------------------------------ the table alone

@pytest.mark.parametrize("name", list(PUBLISHED))
def test_the_table_gives_the_published_layouts_readings(name):
    cfg, L, v1, v2 = PUBLISHED[name]
    got = table_readings(cfg, L)
    assert (_ids(got.get("v1")), _ids(got.get("v2"))) == (v1, v2)
    assert got.split == (v1 != v2) and got.basis.startswith("assumed")


def test_the_four_split_published_layouts_are_the_ones_the_issue_names():
    split = [n for n, (cfg, L, *_) in PUBLISHED.items() if table_readings(cfg, L).split]
    assert split[:4] == ["lmsys gpt-oss-120b EAGLE-3", "lmsys Qwen3-235B EAGLE-3", "TorchSpec Kimi-K2.5 template",
                         "Step-3.5 SpecForge drafter"]


def test_without_a_target_depth_the_default_is_named_not_guessed():
    cfg = PUBLISHED["Step-3.5 SpecForge drafter"][0]
    got = table_readings(cfg, None)
    assert got.get("v2").boundary_ids is None and got.get("v2").default and got.split
    assert "the target's default" in got.get("v2").ids_text()
    kimi = table_readings(PUBLISHED["k-l-lambda Kimi-K2.5-Eagle3"][0], None)
    assert not kimi.split  # [2, 30, 58] is the default of a 61-layer target


def test_speculators_configs_are_read_as_vllm_converts_them():
    cfg = json.loads((DRAFTERS / "speculators-3.1" / "config.json").read_text())
    view = vllm_view(cfg)
    assert view["architectures"] == ["Eagle3LlamaForCausalLM"] and view["fc_norm"] is True
    assert view["eagle_aux_hidden_state_layer_ids"] == [1, 4, 7]
    del cfg["norm_before_residual"]
    assert vllm_view(cfg)["norm_before_residual"] is True  # vLLM's speculators reader defaults it to True
    assert select(view, RUNNERS[1]) == ((1, 4, 7), "eagle_aux_hidden_state_layer_ids", 0)


def test_a_speculators_peagle_config_is_read_as_vllms_peagle_reader_reads_it():
    """speculators 0.9.0 writes P-EAGLE's flags at the top level (its config class is EAGLE-3's); vLLM's peagle reader
    copies neither 3.1 flag from there, defaults norm_before_residual to false, and requires the mask token."""
    view = vllm_view(_peagle(fc_norm=True, norm_output=True))
    assert view["architectures"] == ["PeagleLlamaForCausalLM"] and view["pard_token"] == 127
    assert "fc_norm" not in view and "norm_output" not in view and view["norm_before_residual"] is False
    got = table_readings(_peagle(fc_norm=True, norm_output=True), 8)
    assert got.get("v1").flags == {"fc_norm": False, "norm_output": False, "norm_before_residual": False,
                                   "norm_before_fc": False} and got.get("v1").num_aux == 3
    assert table_readings(_peagle({"fc_norm": True}), 8).get("v2").flags["fc_norm"] is True
    assert vllm_view(_peagle({"model_type": "qwen3"}))["architectures"] == ["PeagleQwen3ForCausalLM"]
    unmasked = _peagle()
    del unmasked["mask_token_id"]
    with pytest.raises(ValueError, match="mask_token_id"):
        vllm_view(unmasked)
    assert table_readings(unmasked, 8).get("v1").error


def test_a_flag_vllm_does_not_apply_is_an_error_and_withholds_the_serve_line(invoke, tmp_path):
    """A speculators P-EAGLE trained as EAGLE-3.1 (fc_norm weights, the flags where speculators writes them): vLLM
    builds no fc_norm, so inspect says so as an error and prints no serve line; with the flags also inside
    transformer_layer_config vLLM applies them, and the finding goes."""
    import torch

    def peagle(layer: dict) -> dict:
        def edit(cfg: dict) -> None:
            cfg.update(speculators_model_type="peagle", mask_token_id=127)
            cfg["transformer_layer_config"].update(layer)
        return edit

    mask = {"mask_hidden": torch.full((1, 96), 0.01, dtype=torch.bfloat16)}
    top = edited(DRAFTERS / "speculators-3.1", tmp_path, name="top", config=peagle({}), tensors=mask)
    doc = json.loads(invoke("inspect", top, "--json").stdout)
    found = [f for f in doc["findings"] if f["rule_id"] == "engine-flags-differ"]
    assert [f["severity"] for f in found] == ["error", "error"], found  # fc_norm and norm_output
    assert "transformer_layer_config only" in found[0]["message"] and doc["exit_code"] != 0
    r = invoke("inspect", top)
    assert "engine-flags-differ" in r.stdout and "vllm serve" not in r.stdout
    inner = edited(DRAFTERS / "speculators-3.1", tmp_path, name="inner",
                   config=peagle({"fc_norm": True, "norm_output": True}), tensors=mask)
    doc = json.loads(invoke("inspect", inner, "--json").stdout)
    assert not [f for f in doc["findings"] if f["rule_id"] == "engine-flags-differ"]
    assert all(r["flags"]["fc_norm"] and r["flags"]["norm_output"] for r in doc["engine_readings"])
    # an absent norm_before_residual reads as the peagle reader fills it in (false; the eagle3 reader: true)
    absent = edited(inner, tmp_path, name="absent", config=lambda c: c.pop("norm_before_residual"))
    doc = json.loads(invoke("inspect", absent, "--json").stdout)
    assert doc["spec"]["norm_before_residual"] is False
    assert doc["spec_sources"]["norm_before_residual"] == \
        "default: vLLM's speculators peagle reader assumes False when absent"
    assert not [f for f in doc["findings"] if f["rule_id"] == "engine-flags-differ"]


def test_v1_lets_a_non_empty_eagle_config_shadow_dflash_ids():
    cfg = _llama(dflash_config={"target_layer_ids": [1, 2, 3]}, eagle_config={"use_aux_hidden_state": True})
    v1, v2 = RUNNERS
    assert select(cfg, v1)[0] is None  # eagle_config replaces dflash's ids even without ids of its own
    assert select(cfg, v2)[0] == (2, 3, 4)


def test_no_vllm_interpreter_means_assumed_readings(monkeypatch):
    monkeypatch.delenv("EAGLECTL_VLLM_PYTHON", raising=False)
    got = read_batch([Request(str(TRAINED / "eagle3-output"), None, 8)])[0]
    assert got.note and not got.runners  # no config given: nothing to read
    cfg = json.loads((TRAINED / "eagle3-output" / "config.json").read_text())
    got = read_batch([Request(str(TRAINED / "eagle3-output"), cfg, 8)])[0]
    assert not got.asked and got.basis.startswith("assumed") and "no vLLM interpreter" in got.note
    monkeypatch.setenv("EAGLECTL_VLLM_PYTHON", "/nonexistent/python")
    got = read_batch([Request(str(TRAINED / "eagle3-output"), cfg, 8)])[0]
    assert not got.asked and "names no interpreter" in got.note
    got = read_batch([Request(str(TRAINED / "eagle3-output"), cfg, 8)], vllm_python="/bin/false")[0]
    assert not got.asked and "no vLLM in this interpreter" in got.note  # readings never fail a command


def test_the_cache_is_keyed_by_config_target_interpreter_version_and_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLECTL_CACHE_DIR", str(tmp_path / "c"))
    a = asking.cache_key(str(TRAINED / "eagle3"), str(TRAINED / "target"), 8, "/usr/bin/python3", "0.32.0")
    assert a == asking.cache_key(str(TRAINED / "eagle3"), str(TRAINED / "target"), 8, "/usr/bin/python3", "0.32.0")
    assert a != asking.cache_key(str(TRAINED / "eagle3.1"), str(TRAINED / "target"), 8, "/usr/bin/python3", "0.32.0")
    assert a != asking.cache_key(str(TRAINED / "eagle3"), None, 8, "/usr/bin/python3", "0.32.0")
    assert a != asking.cache_key(str(TRAINED / "eagle3"), str(TRAINED / "target"), 9, "/usr/bin/python3", "0.32.0")
    assert a != asking.cache_key(str(TRAINED / "eagle3"), str(TRAINED / "target"), 8, "/other/python", "0.32.0")
    assert a != asking.cache_key(str(TRAINED / "eagle3"), str(TRAINED / "target"), 8, "/usr/bin/python3", "0.33.0")
    answer = {"build": None, "error": None, "runners": {}, "model": None, "version": "0.32.0"}
    asking._to_cache(a, answer)
    asking._MEMO.clear()
    assert asking._from_cache(a) == answer
    assert [p.name for p in (tmp_path / "c").iterdir()] == [f"{a}.json"]  # no temporary file left
    # an entry that is not an answer (edited, cut short, another release's shape) is asked again, never used
    for bad in ('{"runners": {}, "x": 1}', '{"build": null, "error": null, "runners": {"v1": 5}, "model": null}',
                '{"build": null', "[]"):
        (tmp_path / "c" / f"{a}.json").write_text(bad)
        asking._MEMO.clear()
        assert asking._from_cache(a) is None


# ------------------------------------------------------------------------------------- real vLLM (slow)

def _row(name, got, table):
    def cell(r):
        if r is None:
            return "-"
        if r.error:
            return "refused"
        return str(list(r.boundary_ids)) if r.boundary_ids is not None else "default"

    return (f"| {name} | {cell(got.get('v1'))} | {cell(got.get('v2'))} | {cell(table.get('v1'))} / "
            f"{cell(table.get('v2'))} |")


@pytest.mark.vllm
@pytest.mark.slow
def test_the_table_gives_exactly_what_vllm_gives(tmp_path, monkeypatch, invoke, vllm_py):
    python = vllm_py
    monkeypatch.setenv("EAGLECTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EAGLECTL_ASK_VLLM", "1")  # vLLM itself, not the tables this test verifies
    monkeypatch.setattr(asking, "_MEMO", {})  # readings an earlier test of this worker asked are not in this cache
    unmasked = _peagle()
    del unmasked["mask_token_id"]
    (tmp_path / "peagle-unmasked").mkdir()
    (tmp_path / "peagle-unmasked" / "config.json").write_text(json.dumps(unmasked))
    cases = _fixtures() + _published(tmp_path) + [
        ("speculators P-EAGLE without mask_token_id", Request(str(tmp_path / "peagle-unmasked"), unmasked, 8))]
    asked = read_batch([r for _, r in cases], vllm_python=python)  # one worker run (the cache starts empty)
    lines = ["| drafter | vLLM V1 | vLLM V2 | table V1 / V2 |", "|---|---|---|---|"]
    mismatches = []
    for (name, req), got in zip(cases, asked, strict=True):
        table = table_readings(req.config, req.target_layers)
        lines.append(_row(name, got, table))
        assert got.asked, (name, got.note)
        for runner in ("v1", "v2"):
            a, t = got.get(runner), table.get(runner)
            if a.error:
                continue  # vLLM refuses the config: nothing to compare (the table cannot know every refusal)
            if (_ids(a), a.source, a.shift) != (_ids(t), t.source, t.shift):
                mismatches.append((name, runner, "ids", _ids(a), a.source, _ids(t), t.source))
            if not a.model_error and (a.flags, a.num_aux) != (t.flags, t.num_aux):
                mismatches.append((name, runner, "model", a.flags, a.num_aux, t.flags, t.num_aux))
    report = os.environ.get("EAGLECTL_READINGS_TABLE")
    if report:
        Path(report).write_text("\n".join(lines) + "\n")
    assert not mismatches, mismatches
    # the installed vLLM's deciding code is the code this test verified the tables against: its fingerprint is
    # listed, and where the tables answer for it (no refusal, known classes) they give what vLLM gave
    where, version = asking.vllm_location(python)
    fingerprint = asking.code_fingerprint(where, asking.ENGINES["vllm"].files(version))
    assert fingerprint in asking.ENGINES["vllm"].verified.get(version, ()), (version, fingerprint)
    answered = 0
    for (name, req), got in zip(cases, asked, strict=True):
        fast = asking.from_verified_code(req, version)
        if fast is None:  # the tables decline what they do not model (a refusal, a quantized class): vLLM is asked
            continue
        assert not any(r.error or r.model_error for r in got.runners), name  # never an answer where vLLM refuses
        answered += 1
        for runner in ("v1", "v2"):
            a, f = got.get(runner), fast.get(runner)
            assert (_ids(a), a.source, a.shift, a.flags, a.num_aux) == (_ids(f), f.source, f.shift, f.flags,
                                                                        f.num_aux), (name, runner)
        assert fast.asked and fast.basis == asking.verified_basis(version)
    assert answered >= 0.8 * len(cases), (answered, len(cases))
    by_name = dict(zip((n for n, _ in cases), asked, strict=True))
    for name, (_cfg, _L, v1, v2) in PUBLISHED.items():
        got = by_name[name]
        assert (_ids(got.get("v1")), _ids(got.get("v2"))) == (v1, v2), name
        assert got.get("v1").basis == f"asked vLLM {got.get('v1').version} (its own code)"
    top, inner = by_name["speculators P-EAGLE, 3.1 flags at the top level"], by_name[
        "speculators P-EAGLE, 3.1 flags in transformer_layer_config"]
    assert top.get("v1").flags == {"fc_norm": False, "norm_output": False, "norm_before_residual": False,
                                   "norm_before_fc": False}
    assert inner.get("v1").flags["fc_norm"] and inner.get("v1").flags["norm_output"]
    refused = by_name["speculators P-EAGLE without mask_token_id"]  # vLLM's KeyError, and the table's refusal
    assert refused.get("v1").error and table_readings(unmasked, 8).get("v1").error
    mla = by_name["trained/eagle3.1-mla"]
    assert _ids(mla.get("v1")) == (2, 3, 4) and _ids(mla.get("v2")) == (1, 2)  # V2: the 4-layer default, deduplicated
    assert mla.get("v1").flags == {"fc_norm": True, "norm_output": True, "norm_before_residual": False,
                                   "norm_before_fc": False} and mla.get("v1").num_aux == 3
    assert "target's ModelConfig" in mla.get("v1").build and "meta device" in mla.get("v1").build
    assert by_name["drafters/nemo-3.1"].get("v1").error  # an unregistered architecture: vLLM's own refusal
    # asked once: the same requests again come from the cache, without a worker run
    python_version = asking.vllm_version(python)
    keys = {asking.cache_key(r.drafter_dir, r.target_dir, r.target_layers, python, python_version) for _, r in cases}
    assert len(list((tmp_path / "cache").glob("*.json"))) == len(keys)  # same config bytes: asked once
    monkeypatch.setattr(asking, "ask_engine", lambda *a, **k: pytest.fail("asked vLLM again"))
    asking._MEMO.clear()
    again = read_batch([r for _, r in cases[:3]], vllm_python=python)
    assert [g.to_json() for g in again] == [g.to_json() for g in asked[:3]] and all(g.asked for g in again)
    # inspect shows the split vLLM itself reports (from the same cache: no second vLLM import)
    r = invoke("inspect", DRAFTERS / "specforge-3.1", "--target", TARGET, "--vllm-python", python, "--no-measure")
    for part in ("vLLM     v1: [0, 3, 6] from eagle_config.eagle_aux_hidden_state_layer_ids",
                 "         v2: [2, 4, 5] the target's default", f"asked vLLM {python_version} (its own code)",
                 "aux-ids-runner-split"):
        assert part in r.stdout, (part, r.stdout)


# ------------------------------------------------------------------------------------ fc_norm aliases

@pytest.mark.parametrize("alias", ["enable_fc_norm", "use_aux_norm"])
def test_fc_norm_aliases_are_read_on_input_and_vllm_reads_only_fc_norm(invoke, tmp_path, alias):
    src = edited(DEFECTS / "fc-norm-alias", tmp_path, name="alias",
                 config=lambda cfg: cfg.update({alias: cfg.pop("enable_fc_norm")}))
    doc = json.loads(invoke("inspect", src, "--json").stdout)
    assert doc["spec"]["fc_norm"] is True and doc["spec"]["eagle_version"] == "3.1"  # what it was trained with
    assert doc["spec_sources"]["fc_norm"] == f"config: {alias} (an alias vLLM does not read)"
    assert all(r["flags"]["fc_norm"] is False for r in doc["engine_readings"])  # what vLLM's class builds
    found = {f["rule_id"]: f for f in doc["findings"]}
    assert found["fc-norm-alias"]["severity"] == "error" and alias in found["fc-norm-alias"]["message"]
    assert "fc-norm-weights-without-flag" not in found  # one finding, the one that names the alias
    out = tmp_path / "fixed"
    assert invoke("convert", src, out, "--to", "speculators").exit_code == 0
    written = json.loads((out / "config.json").read_text())
    assert written["fc_norm"] is True  # the plain key vLLM reads
    after = json.loads(invoke("inspect", out, "--json").stdout)
    assert after["exit_code"] == 0 and all(r["flags"]["fc_norm"] for r in after["engine_readings"])


@pytest.mark.vllm
def test_verified_vllm_code_answers_without_importing_vllm(tmp_path, monkeypatch, invoke, vllm_py):
    """The installed vLLM's deciding files hash to a verified fingerprint: inspect answers from the tables
    labelled as that code's, and no worker imports vLLM; a fingerprint that is not listed asks vLLM."""
    monkeypatch.setenv("EAGLECTL_CACHE_DIR", str(tmp_path / "cache"))  # nothing cached: only the hash can answer
    monkeypatch.setattr(asking, "_MEMO", {})
    monkeypatch.setattr(asking, "ask_engine", lambda *a, **k: pytest.fail("vLLM was imported"))
    version = asking.code_verified(vllm_py)
    assert version is not None
    def config(folder: Path) -> dict:
        return json.loads((folder / "config.json").read_text())

    target = TRAINED / "target"
    req = Request(str(TRAINED / "eagle3"), config(TRAINED / "eagle3"), 8, str(target), config(target))
    got = read_batch([req], vllm_python=vllm_py)[0]
    assert got.asked and got.basis == asking.verified_basis(version) and got.target.supports_eagle3
    assert _ids(got.get("v1")) == (2, 4, 5) and got.get("v1").num_aux == 3
    r = invoke("inspect", TRAINED / "eagle3", "--target", target, "--vllm-python", vllm_py, "--no-measure")
    assert r.exit_code == 0 and f"vLLM {version}'s code, verified by hash" in r.stdout
    # other code (a fingerprint not listed), or EAGLECTL_ASK_VLLM=1: vLLM is asked
    verified = asking.ENGINES["vllm"].verified
    monkeypatch.setitem(verified, version, ("0" * 64,))
    assert asking.code_verified(vllm_py) is None
    installed = asking.code_fingerprint(asking.vllm_location(vllm_py)[0], asking.ENGINES["vllm"].files(version))
    monkeypatch.setitem(verified, version, (installed,))
    assert asking.code_verified(vllm_py) == version
    monkeypatch.setenv("EAGLECTL_ASK_VLLM", "1")
    assert asking.code_verified(vllm_py) is None


def test_a_vllm_whose_deciding_code_differs_is_asked(tmp_path, monkeypatch):
    """A fake vLLM package (its version file and deciding files) behind a real interpreter: with its fingerprint
    listed the tables answer and no worker runs; one byte changed in one deciding file and vLLM is asked."""
    import stat

    from eaglectl.errors import MissingDependencyError

    site = tmp_path / "site"
    fake = site / "vllm"
    for name in asking.ENGINES["vllm"].files("0.32.0"):
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_text(f"# {name}\n")
    (fake / "__init__.py").write_text("")
    (fake / "_version.py").write_text("__version__ = version = '0.32.0'\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("EAGLECTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("EAGLECTL_ASK_VLLM", raising=False)
    monkeypatch.setattr(asking, "_MEMO", {})
    asked: list[int] = []

    def ask(_engine, requests, _python):  # noqa: ANN001, ANN202 - stands in for the worker run
        asked.append(len(requests))
        raise MissingDependencyError("the fake vLLM cannot be imported")

    monkeypatch.setattr(asking, "ask_engine", ask)
    req = Request(str(TRAINED / "eagle3"), json.loads((TRAINED / "eagle3" / "config.json").read_text()), 8)
    for cached in (asking.location, asking.code_fingerprint):
        getattr(cached, "cache_clear", lambda: None)()
    monkeypatch.setitem(asking.ENGINES["vllm"].verified, "0.32.0", (asking.code_fingerprint(fake),))
    got = read_batch([req], vllm_python=str(python))[0]
    assert asked == [] and got.basis == asking.verified_basis("0.32.0") and _ids(got.get("v1")) == (2, 4, 5)
    with (fake / "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py").open("a") as f:
        f.write("# a change in the selection code\n")
    asking.code_fingerprint.cache_clear()
    got = read_batch([req], vllm_python=str(python))[0]
    assert asked == [1] and not got.asked and "vLLM 0.32.0 was not asked" in (got.note or "")
    asking.code_fingerprint.cache_clear()


# ------------------------------------------------------------------------------------ one worker per process


@pytest.mark.vllm
def test_one_reading_worker_answers_a_whole_manifest(tmp_path, monkeypatch, invoke, vllm_py):
    """Asked for every config (EAGLECTL_ASK_VLLM=1, an empty cache), a manifest of three conversions starts one
    vLLM worker, and every output's readings are vLLM's own. The same worker reads a config changed in place as it
    is now; a worker that died is replaced."""
    from eaglectl import counters

    monkeypatch.setenv("EAGLECTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EAGLECTL_ASK_VLLM", "1")
    monkeypatch.setenv("EAGLECTL_VLLM_PYTHON", vllm_py)
    monkeypatch.setattr(asking, "_MEMO", {})
    asking.close_workers()  # one an earlier test of this process left running
    counters.reset()
    lines = [{"source": str(TRAINED / "eagle3"), "dest": str(tmp_path / "a"), "to": "speculators",
              "base_model": "org/target"},
             {"source": str(TRAINED / "eagle3.1"), "dest": str(tmp_path / "b"), "to": "modelopt"},
             {"source": str(TRAINED / "eagle3"), "dest": str(tmp_path / "c"), "to": "specforge"}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    r = invoke("convert", "--manifest", tmp_path / "m.jsonl", "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert [i["exit_code"] for i in json.loads(r.stdout)["items"]] == [0, 0, 0]
    answers = [json.loads(f.read_text()) for f in (tmp_path / "cache").glob("*.json")]
    assert len(answers) == 3  # each written config asked of vLLM, not answered by the verified tables
    assert {a["version"] for a in answers} == {asking.vllm_version(vllm_py)}
    assert counters.COUNTS["engine_worker"] == 1
    # a config changed in place between two questions of one worker: read as it is now
    folder = edited(TRAINED / "eagle3", tmp_path, name="edited")

    def asked() -> tuple[int, ...] | None:
        config = json.loads((folder / "config.json").read_text())
        got = read_batch([Request(str(folder), config, 8)], vllm_python=vllm_py)[0]
        assert got.asked
        assert _ids(got.get("v1")) == _ids(table_readings(config, 8).get("v1"))
        return _ids(got.get("v1"))

    before = asked()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [0, 3, 6]}))
    assert asked() != before and counters.COUNTS["engine_worker"] == 1
    from eaglectl.engines import engine_process

    engine_process._SESSIONS[(vllm_py, asking.WORKER)].proc.kill()  # a worker that died (killed, OOM) is replaced
    (folder / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [1, 3, 5]}))
    assert asked() not in (before, None) and counters.COUNTS["engine_worker"] == 2
    asking.close_workers()
