"""Target pre-flight (issue 32, item 5): does vLLM capture EAGLE-3 aux states from the target's architecture?

A target whose vLLM class lacks `SupportsEagle3` loads its weights and then stops `vllm serve` with "Model does
not support EAGLE3 interface" (vllm #25134, #25927, #33329). `inspect --target` / `check --target` say so before a
deploy: asked of vLLM's own registry where an interpreter is at hand, else from eaglectl's table, labelled assumed.
The targets here are config folders only: vLLM resolves a class from the config, no weights are read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglectl.engines import asking
from eaglectl.engines.asking import Request, read_batch
from eaglectl.engines.facts import TARGET_CAPTURE
from eaglectl.engines.facts import release_key

from .conftest import FIXTURES

TRAINED = FIXTURES / "trained"
DRAFTER = TRAINED / "eagle3"  # trained on trained/target (Llama, 8 layers, hidden 128, vocab 320)
_SHAPE = {"hidden_size": 128, "intermediate_size": 384, "num_attention_heads": 2, "num_key_value_heads": 1,
          "head_dim": 64, "num_hidden_layers": 8, "vocab_size": 320, "rms_norm_eps": 1e-5,
          "max_position_embeddings": 1024, "tie_word_embeddings": False}
# vLLM 0.32's GraniteMoeForCausalLM has no SupportsEagle3 (0.33.0 adds it); Qwen3-Next is a hybrid it captures from
GRANITE = {"architectures": ["GraniteMoeForCausalLM"], "model_type": "granitemoe", "num_local_experts": 2,
           "num_experts_per_tok": 1}
QWEN3_NEXT = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}
UNKNOWN = {"architectures": ["AcmeForCausalLM"], "model_type": "acme"}


def _target(tmp: Path, name: str, config: dict) -> Path:
    folder = tmp / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**_SHAPE, **config}))
    return folder


def _preflight(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["rule_id"].startswith("target-eagle3")]


def _inspect(invoke, target, *extra):
    r = invoke("inspect", DRAFTER, "--target", target, "--no-measure", "--json", *extra)
    return r, json.loads(r.stdout)


# --------------------------------------------------------------------------- without vLLM: the table

def test_without_vllm_an_unsupported_target_fails_with_the_tables_answer_labelled_assumed(invoke, tmp_path,
                                                                                           monkeypatch):
    monkeypatch.delenv("EAGLECTL_VLLM_PYTHON", raising=False)
    granite = _target(tmp_path, "granite", GRANITE)
    r, doc = _inspect(invoke, granite)
    assert r.exit_code == doc["exit_code"] == 1
    [f] = _preflight(doc)
    assert f["rule_id"] == "target-eagle3-unsupported" and f["severity"] == "error" and f["locator"] == str(granite)
    assert f["message"].startswith("in vLLM 0.32 (assumed: eaglectl's table of vLLM 0.8.5–0.34.0, not asked), "
                                   "GraniteMoeForCausalLM (its class, model_executor/models/granitemoe.py) does not "
                                   "implement SupportsEagle3")
    assert "'Model does not support EAGLE3 interface'" in f["message"] and "from vLLM 0.33.0 it does" in f["message"]
    s = doc["target_support"]
    assert s["basis"].startswith("assumed") and s["supports_eagle3"] is False and s["since"] == "0.33.0"
    assert s["num_layers"] is None  # only vLLM counts its layers
    human = invoke("inspect", DRAFTER, "--target", granite, "--no-measure")
    assert human.exit_code == 1 and "target-eagle3-unsupported" in human.stdout
    assert "vLLM class GraniteMoeForCausalLM: no EAGLE-3 capture (no SupportsEagle3), from vLLM 0.33.0" in \
        " ".join(human.stdout.split())
    # the bundled target: Llama, which vLLM captures from (since 0.8): no finding
    r, doc = _inspect(invoke, TRAINED / "target")
    assert r.exit_code == 0 and not _preflight(doc)
    assert doc["target_support"]["supports_eagle3"] is True and doc["target_support"]["basis"].startswith("assumed")
    # no target: no pre-flight
    doc = json.loads(invoke("inspect", DRAFTER, "--json").stdout)
    assert doc["target_support"] is None and not _preflight(doc)


def test_an_architecture_the_table_does_not_know_is_undecided_not_an_error(invoke, tmp_path, monkeypatch):
    monkeypatch.delenv("EAGLECTL_VLLM_PYTHON", raising=False)
    r, doc = _inspect(invoke, _target(tmp_path, "acme", UNKNOWN))
    assert r.exit_code == 0
    [f] = _preflight(doc)
    assert f["rule_id"] == "target-eagle3-undecided" and f["severity"] == "info"
    assert "AcmeForCausalLM is not in eaglectl's table" in f["message"] and "--vllm-python" in f["hint"]
    assert doc["target_support"]["supports_eagle3"] is None


def test_engine_version_reads_the_release_that_added_the_capture(invoke, tmp_path, monkeypatch):
    monkeypatch.delenv("EAGLECTL_VLLM_PYTHON", raising=False)
    hybrid = _target(tmp_path, "qwen3-next", QWEN3_NEXT)
    r, doc = _inspect(invoke, hybrid)
    assert r.exit_code == 0 and not _preflight(doc)  # a hybrid vLLM 0.32 captures from: nothing to say
    assert doc["target_support"]["kind"] == "hybrid"
    r, doc = _inspect(invoke, hybrid, "--engine-version", "0.23")
    [f] = _preflight(doc)
    assert r.exit_code == 1 and f["rule_id"] == "target-eagle3-unsupported"
    assert f["message"].startswith("in vLLM 0.23 (assumed: eaglectl's table of vLLM 0.8.5–0.34.0, not asked), "
                                   "Qwen3NextForCausalLM (its class, "
                                   "model_executor/models/qwen3_next.py; hybrid attention/recurrent)")
    assert "from vLLM 0.24.0 it does" in f["message"]
    r, doc = _inspect(invoke, hybrid, "--engine-version", "0.24")
    assert r.exit_code == 0 and not _preflight(doc)
    r, doc = _inspect(invoke, _target(tmp_path, "granite", GRANITE), "--engine-version", "0.33")
    assert r.exit_code == 0 and not _preflight(doc)  # the release that added it


def test_check_runs_the_pre_flight_with_a_target(invoke, tmp_path, monkeypatch):
    monkeypatch.delenv("EAGLECTL_VLLM_PYTHON", raising=False)
    r = invoke("check", DRAFTER, "--target", _target(tmp_path, "granite", GRANITE), "--no-card", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["stages"][0]["status"] == "fail"
    assert [f["rule_id"] for f in _preflight(doc)] == ["target-eagle3-unsupported"]


def test_the_table_rows_are_releases_and_unique():
    archs = [t.architecture for t in TARGET_CAPTURE]
    assert len(archs) == len(set(archs))
    assert all(t.since is None or release_key(t.since) for t in TARGET_CAPTURE)
    assert all(t.kind in ("attention", "hybrid", "recurrent") for t in TARGET_CAPTURE)


# ------------------------------------------------------------------------------ vLLM's own registry

@pytest.mark.vllm
def test_vllm_is_asked_in_the_drafters_worker_run(invoke, tmp_path, monkeypatch, vllm_py):
    """One worker run answers three targets (filling the reading cache); the CLI then reads vLLM's answers."""
    monkeypatch.setenv("EAGLECTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EAGLECTL_ASK_VLLM", "1")  # vLLM's own code, not the tables verified by hash
    monkeypatch.setattr(asking, "_MEMO", {})
    targets = {"granite": _target(tmp_path, "granite", GRANITE), "bundled": TRAINED / "target",
               "hybrid": _target(tmp_path, "qwen3-next", QWEN3_NEXT)}
    cfg = json.loads((DRAFTER / "config.json").read_text())
    asked = read_batch([Request(str(DRAFTER), cfg, 8, str(t), json.loads((t / "config.json").read_text()))
                        for t in targets.values()], vllm_python=vllm_py)
    assert all(a.target is not None and a.target.asked for a in asked), [a.target for a in asked]
    monkeypatch.setattr(asking, "ask_engine", lambda *a, **k: pytest.fail("asked vLLM again"))
    version = asking.vllm_version(vllm_py)

    r, doc = _inspect(invoke, targets["granite"], "--vllm-python", vllm_py)
    assert r.exit_code == 1
    [f] = _preflight(doc)
    assert f["rule_id"] == "target-eagle3-unsupported"
    assert f["message"].startswith(f"in vLLM {version} (asked of vLLM {version}), GraniteMoeForCausalLM (its "
                                   "class, model_executor/models/granitemoe.py) does not implement SupportsEagle3")
    assert "from vLLM 0.33.0 it does" in f["message"]
    s = doc["target_support"]
    assert s["basis"] == f"asked vLLM {version} (its own code)" and s["num_layers"] == 8 and s["kind"] == "attention"

    r, doc = _inspect(invoke, targets["bundled"], "--vllm-python", vllm_py)
    assert r.exit_code == 0 and not _preflight(doc)
    assert (doc["target_support"]["model_class"], doc["target_support"]["supports_eagle3"]) == ("LlamaForCausalLM",
                                                                                                True)
    r, doc = _inspect(invoke, targets["hybrid"], "--vllm-python", vllm_py)
    assert r.exit_code == 0 and not _preflight(doc)
    s = doc["target_support"]
    assert (s["model_class"], s["kind"], s["supports_eagle3"]) == ("Qwen3NextForCausalLM", "hybrid", True)
    assert s["basis"].startswith("asked")
