"""Every engine users deploy, from eaglectl's tables of each one's code (no engine here: these are what a user without
an interpreter sees, labelled assumed; tests/test_engines_asked.py holds the tables to each engine's own answers):
SGLang 0.5.23's reading (`--for sglang`), vLLM 0.34's single runner and its removal of P-EAGLE (`--engine-version`),
one file both engines read right (`convert --for vllm,sglang`), and a reading that cannot be had is undecided."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from eaglectl.commands.smoke.runner import choose
from eaglectl.engines import asking, sglang
from eaglectl.engines.asking import Request, read_batch
from eaglectl.engines.readings import layers_read, table_readings
from eaglectl.errors import UsageError

from .conftest import DRAFTERS, FIXTURES, TARGET
from .helpers import edited

TRAINED = FIXTURES / "trained"


def _doc(invoke, *args, code=None):
    r = invoke("inspect", *args, "--json")
    doc = json.loads(r.stdout)
    if code is not None:
        assert r.exit_code == code, (r.exit_code, doc["findings"])
    return doc


def _sglang(doc):
    found = [r for r in doc["engine_readings"] if r["engine"] == "sglang"]
    assert len(found) == 1, doc["engine_readings"]
    return found[0]


def _rules(doc):
    return {f["rule_id"]: f for f in doc["findings"]}


# ------------------------------------------------------------------------------------------ SGLang's reading

def test_sglang_reads_eagle_config_ids_through_its_llama_class(invoke):
    """SpecForge's layout: eagle_config's ids [0, 3, 6] (output numbering), the Llama target class adds 1."""
    doc = _doc(invoke, DRAFTERS / "specforge-3.1", "--target", TARGET, "--for", "sglang", "--no-measure", code=0)
    r = _sglang(doc)
    assert r["boundary_ids"] == [1, 4, 7] and r["source"] == sglang.IDS_KEY and r["shift"] == 1
    assert r["model_class"] == "llama_eagle3.LlamaForCausalLMEagle3" and r["version"] == "0.5.23"
    assert r["flags"] == {"fc_norm": True, "norm_output": True, "norm_before_fc": False,
                          "norm_before_residual": False} and r["num_aux"] == 3
    assert r["basis"].startswith("assumed (eaglectl's table of SGLang 0.5.23")
    assert not {k for k in _rules(doc) if k.startswith("sglang-")}
    assert doc["sglang_serve_command"].startswith("python -m sglang.launch_server --model-path ")
    assert "--speculative-algorithm EAGLE3 --speculative-draft-model-path" in doc["sglang_serve_command"]
    assert doc["serve_command"] is None  # the report is for SGLang alone


@pytest.mark.parametrize("fixture,said", [
    ("speculators-3", "refused at launch: a speculators config carries no model_type"),
    ("eagle-3", "loads as the model LlamaForCausalLM, not as an EAGLE-3 draft class"),
    ("nemo-3.1", "refused at load: 'LlamaEagle3DraftModel' is no SGLang class"),
    ("speculators-qwen3", "refused at launch"),
])
def test_sglang_builds_no_drafter_from_these_and_withholds_its_line(invoke, fixture, said):
    doc = _doc(invoke, DRAFTERS / fixture, "--for", "sglang", "--allow-pickle", code=1)
    found = _rules(doc)["sglang-not-a-draft"]
    assert found["severity"] == "error" and said in found["message"]
    assert doc["sglang_serve_command"] is None
    assert "--for sglang" in doc["recommendation"]["command"]
    again = _doc(invoke, DRAFTERS / fixture, "--allow-pickle")  # for vLLM alone: SGLang is not judged
    assert "sglang-not-a-draft" not in _rules(again)


def test_ids_sglang_does_not_read_or_reads_past_the_target(invoke, tmp_path):
    top = edited(DRAFTERS / "modelopt-3", tmp_path, name="top", config=lambda c: (
        c.update(eagle_aux_hidden_state_layer_ids=[1, 4, 7]),
        c["eagle_config"].pop("eagle_aux_hidden_state_layer_ids")))
    found = _rules(_doc(invoke, top, "--target", TARGET, "--for", "sglang", "--no-measure"))
    assert "[2, 4, 5] (model default)" in found["sglang-aux-ids"]["message"]  # top-level ids: vLLM's only
    deep = edited(DRAFTERS / "specforge-3", tmp_path, name="deep",
                  config=lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 5, 7]))
    found = _rules(_doc(invoke, deep, "--target", TARGET, "--for", "sglang", "--no-measure", code=1))
    assert "[8] past its last layer" in found["sglang-ids-beyond-target"]["message"]


def test_sglang_never_applies_norm_before_residual_and_drops_what_it_has_no_parameter_for(invoke, tmp_path):
    nbr = edited(DRAFTERS / "specforge-3", tmp_path, name="nbr", config={"norm_before_residual": True})
    found = _rules(_doc(invoke, nbr, "--target", TARGET, "--for", "sglang", "--no-measure"))
    assert "norm_before_residual=false" in found["sglang-flags-differ"]["message"]
    peagle = _doc(invoke, FIXTURES / "families" / "peagle", "--for", "sglang")
    assert "mask_hidden" in _rules(peagle)["sglang-skips-weights"]["message"]


def test_sglang_numbers_ids_by_the_target_class(tmp_path):
    """The same eagle_config ids, three target classes (SGLang 0.5.23's set_eagle3_layers_to_capture)."""
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 4, 6]}}
    got = {arch: layers_read("sglang", cfg, 8, target_arch=arch).boundary_ids
           for arch in ("LlamaForCausalLM", "DeepseekV3ForCausalLM", "GptOssForCausalLM")}
    assert got == {"LlamaForCausalLM": (2, 5, 7), "DeepseekV3ForCausalLM": (2, 5, 7), "GptOssForCausalLM": (2, 5, 7)}
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 4, 8]
    assert layers_read("sglang", cfg, 8, target_arch="DeepseekV3ForCausalLM").boundary_ids == (2, 4, 8)  # as is
    assert layers_read("sglang", cfg, 8, target_arch="GptOssForCausalLM").boundary_ids == (2, 4, 8)  # max is L
    assert layers_read("sglang", cfg, 8, target_arch="LlamaForCausalLM").boundary_ids == (3, 5, 9)
    assert layers_read("sglang", cfg, 8, target_arch="MambaForCausalLM").error  # no EAGLE-3 capture
    for arch in ("LlamaForCausalLM", "DeepseekV3ForCausalLM", "GptOssForCausalLM"):  # the numbering convert writes
        capture = sglang.capture_of(arch)
        assert capture is not None
        for bounds in ((2, 4, 5), (3, 5, 8)):
            ids = capture.ids_for(bounds, 8)
            assert ids is not None and capture.boundaries(ids, 8) == bounds, (arch, bounds)
    assert sglang.capture_of("DeepseekV3ForCausalLM").ids_for((1, 4, 6), 8) is None  # no list says it


def test_a_sliding_drafter_needs_sglangs_window_flag(invoke, tmp_path):
    """SGLang reads no window from a draft's config: its launch line carries --speculative-draft-window-size."""
    out = tmp_path / "swa"
    r = invoke("convert", TRAINED / "field-swa", out, "--for", "vllm,sglang", "--target", TRAINED / "target",
               "--no-measure", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["serve"]["sglang_command"].endswith("--speculative-draft-window-size 24")
    doc = _doc(invoke, out, "--target", TRAINED / "target", "--for", "sglang", "--no-measure")
    assert "sliding-window-sglang" in _rules(doc)
    assert doc["sglang_serve_command"].endswith("--speculative-draft-window-size 24")


# ------------------------------------------------------------------------------------------ vLLM 0.34

def test_vllm_034_has_model_runner_v2_alone(invoke):
    doc = _doc(invoke, DRAFTERS / "specforge-3", "--engine-version", "0.34.0", "--target", TARGET, "--no-measure")
    assert [(r["runner"], r["version"]) for r in doc["engine_readings"]] == [("v2", "0.34")]
    found = _rules(doc)
    assert "aux-ids-not-read" in found and "aux-ids-runner-split" not in found
    assert "vLLM 0.34 has Model Runner V2 alone" in found["aux-ids-not-read"]["message"]
    r = invoke("inspect", DRAFTERS / "specforge-3", "--engine-version", "0.34.0", "--target", TARGET, "--no-measure")
    assert "v1:" not in r.stdout and "v1 = v2" not in r.stdout and "v2: [2, 4, 5]" in r.stdout
    # 0.33 still has both runners, and they split on eagle_config-only ids
    doc = _doc(invoke, DRAFTERS / "specforge-3", "--engine-version", "0.33", "--target", TARGET, "--no-measure")
    assert [r["runner"] for r in doc["engine_readings"]] == ["v1", "v2"] and "aux-ids-runner-split" in _rules(doc)


def test_vllm_034_serves_no_peagle_and_prints_no_serve_line(invoke):
    for release, code in (("0.33", 0), ("0.34.0", 1)):
        doc = _doc(invoke, TRAINED / "peagle", "--engine-version", release)
        assert ("peagle-unsupported" in _rules(doc)) == (code == 1) and doc["exit_code"] == code, release
        assert (doc["serve_command"] is None) == (code == 1)
    r = invoke("inspect", TRAINED / "peagle", "--engine-version", "0.34.0")
    assert '"parallel_drafting"' not in r.stdout and "vllm serve" not in r.stdout and "peagle-unsupported" in r.stdout
    speculators = table_readings(json.loads((FIXTURES / "families" / "peagle" / "config.json").read_text()), 8,
                                 release="0.34.0")
    assert [r.runner for r in speculators.runners] == ["v2"]


def test_smoke_refuses_a_runner_the_release_lacks():
    cfg = json.loads((DRAFTERS / "specforge-3" / "config.json").read_text())
    v034 = table_readings(cfg, 8, release="0.34.0")
    assert choose(None, v034) == ["v2"]
    for option in ("v1", "both"):
        with pytest.raises(UsageError, match="vLLM 0.34 has no V1 runner.*Model Runner V1 has been removed"):
            choose(option, v034)
    assert choose(None, table_readings(cfg, 8)) == ["v1", "v2"]  # 0.32: a split measures both


def test_engine_version_names_each_engine_and_only_ascii_releases(invoke):
    ok = invoke("inspect", DRAFTERS / "specforge-3", "--engine-version", "vllm@0.34.0,sglang@0.5.23", "--json")
    assert ok.exit_code in (0, 1) and json.loads(ok.stdout)["engine_readings"][0]["version"] == "0.34"
    for bad in ("٠.٨", "trt@1.0", "vllm@0.34,vllm@0.33", "0.34.x"):
        r = invoke("inspect", DRAFTERS / "specforge-3", "--engine-version", bad)
        assert r.exit_code == 2 and "--engine-version" in r.stderr, bad


# ------------------------------------------------------------------------------------------ one file, both engines

def test_convert_for_vllm_and_sglang_writes_one_file_both_read_right(invoke, tmp_path):
    out = tmp_path / "both"
    r = invoke("convert", TRAINED / "eagle3", out, "--for", "vllm,sglang", "--target", TRAINED / "target", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    config = json.loads((out / "config.json").read_text())
    assert doc["plan"]["dest_dialect"] == "modelopt" and doc["plan"]["engines"] == ["vllm", "sglang"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # vLLM: boundaries, at the top level
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang's Llama class adds 1
    assert any(c.startswith("SGLang 0.5.23 drafts with the written files") and "[2, 4, 5]" in c
               for c in doc["checked"]), doc["checked"]
    assert doc["serve"]["sglang_command"].endswith(f"--speculative-draft-model-path {out}")
    both = _doc(invoke, out, "--target", TRAINED / "target", "--for", "vllm,sglang", "--no-measure", code=0)
    assert [r["boundary_ids"] for r in both["engine_readings"]] == [[2, 4, 5]] * 3
    assert both["serve_command"] and both["sglang_serve_command"]
    v034 = _doc(invoke, out, "--target", TRAINED / "target", "--engine-version", "0.34.0", "--no-measure", code=0)
    assert [r["boundary_ids"] for r in v034["engine_readings"]] == [[2, 4, 5]]
    alone = json.loads(invoke("convert", TRAINED / "eagle3", tmp_path / "sg", "--for", "sglang", "--target",
                              TRAINED / "target", "--dry-run", "--json").stdout)
    assert alone["plan"]["dest_dialect"] == "specforge"


def test_inspect_recommends_the_file_both_engines_read(invoke):
    doc = _doc(invoke, DRAFTERS / "specforge-3.1", "--target", TARGET, "--for", "vllm,sglang", "--no-measure")
    assert doc["recommendation"]["command"].startswith(f"eaglectl convert {DRAFTERS / 'specforge-3.1'} DEST "
                                                       "--for vllm,sglang")


def test_no_list_of_ids_serves_both_engines_and_nothing_is_written(invoke, tmp_path):
    """A DeepSeek target class adds 1 only when the first id is 1: boundaries that start at 1 have no ids."""
    r = invoke("convert", TRAINED / "eagle3.1-mla", tmp_path / "x", "--for", "vllm,sglang", "--target",
               TRAINED / "target-mla", "--aux-layer-ids", "1,2,3", "--no-measure")
    assert r.exit_code == 7 and "captures boundaries [1, 2, 3] from no list of ids" in r.stderr
    assert not (tmp_path / "x").exists()
    r = invoke("convert", DRAFTERS / "speculators-qwen3", tmp_path / "q", "--for", "vllm,sglang")
    assert r.exit_code == 7 and "no dialect eaglectl writes is loaded as a drafter by vllm and sglang" in r.stderr


# ------------------------------------------------------------------------------------------ undecided, never OK

def _fake_engine(tmp_path: Path, version: str, engine: str = "vllm") -> Path:
    """An interpreter whose engine package is a release eaglectl's tables may not know, and whose worker cannot
    run (the package raises on import)."""
    site = tmp_path / "site"
    (site / engine).mkdir(parents=True)
    (site / engine / "__init__.py").write_text(f"raise ImportError('this {engine} cannot be imported')\n")
    (site / engine / "version.py").write_text(f"__version__ = '{version}'\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


def test_an_engine_that_cannot_be_asked_is_undecided_never_another_releases_table(invoke, tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLECTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(asking, "_MEMO", {})
    asking.location.cache_clear()
    python = _fake_engine(tmp_path, "0.35.0")
    cfg = json.loads((DRAFTERS / "specforge-3" / "config.json").read_text())
    got = read_batch([Request(str(DRAFTERS / "specforge-3"), cfg, 8)], vllm_python=str(python))[0]
    assert got.runners and all(r.error and r.error.startswith("undecided: vLLM 0.35.0 could not be asked")
                               for r in got.runners)
    doc = _doc(invoke, DRAFTERS / "specforge-3", "--vllm-python", python)
    found = _rules(doc)["engine-reading-undecided"]
    assert found["severity"] == "warning" and "0.35.0" in found["message"] and doc["serve_command"] is None
    assert not list((tmp_path / "cache").glob("*.json"))  # a failure is never cached
    gate = invoke("check", DRAFTERS / "specforge-3", "--vllm-python", python, "--json")
    stages = {s["name"]: s["status"] for s in json.loads(gate.stdout)["stages"]}
    assert gate.exit_code == 10 and stages["inspect"] == "undecided", gate.stdout  # eaglectl's limit: never PASS
    known = _fake_engine(tmp_path / "k", "0.34.0")  # a release the tables know: its tables, said so
    asking.location.cache_clear()
    got = read_batch([Request(str(DRAFTERS / "specforge-3"), cfg, 8)], vllm_python=str(known))[0]
    assert [r.runner for r in got.runners] == ["v2"] and "vLLM 0.34.0 was not asked" in (got.note or "")
    asking.location.cache_clear()


def test_an_sglang_that_cannot_be_asked_is_undecided_and_gets_no_launch_line(invoke, tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLECTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(asking, "_MEMO", {})
    asking.location.cache_clear()
    python = _fake_engine(tmp_path, "0.6.0", "sglang")
    doc = _doc(invoke, DRAFTERS / "specforge-3.1", "--target", TARGET, "--for", "sglang", "--sglang-python", python)
    found = _rules(doc)["sglang-reading-undecided"]
    assert found["severity"] == "warning" and "0.6.0" in found["message"]
    assert doc.get("sglang_serve_command") is None and "sglang-not-a-draft" not in _rules(doc)
    r = [x for x in doc["engine_readings"] if x["engine"] == "sglang"][0]
    assert r["boundary_ids"] is None and r["error"].startswith("undecided")
    gate = invoke("check", DRAFTERS / "specforge-3.1", "--target", TARGET, "--for", "sglang", "--sglang-python",
                  python, "--json")
    assert gate.exit_code == 10 and json.loads(gate.stdout)["verdict"] == "UNDECIDED", gate.stdout
    asking.location.cache_clear()
