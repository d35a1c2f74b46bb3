"""Issue 12: target states at scale. `eaglectl capture` writes vLLM's dump layout through HF transformers, vLLM
or a running `vllm serve`; `--states DIR` stands in for running the target everywhere (probe, calibration,
fidelity, parity), with statistics streamed from the files."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.commands import capture
from eaglectl.commands.upgrade import calibration, inits
from eaglectl.io.states import open_states
from eaglectl.measure import probe
from eaglectl.measure.target import Target
from eaglectl.model.hf import forward, load_model

from .conftest import ROOT, vllm_server
from .helpers import capture_run, upgrade_run

TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"
TRUTH = {"eagle3": [2, 4, 5], "eagle3.1": [2, 4, 5], "eagle3-output": [3, 5, 6]}  # boundaries trained on


@pytest.fixture(scope="module")
def hf_states(tmp_path_factory):
    out = tmp_path_factory.mktemp("cap") / "hf"
    capture_run(str(TARGET), str(out), engine="hf", drafter=str(TRAINED / "eagle3"))
    return out


# ------------------------------------------------------------------------------------------ layout

def test_hf_capture_is_vllms_dump_layout_with_the_targets_tokens(hf_states):
    meta = json.loads((hf_states / "capture.json").read_text())
    assert meta["schema"] == "eaglectl.capture/1" and meta["convention"] == "boundary"
    assert meta["layer_ids"] == list(range(0, 9))  # auto: the readings ± their neighbours, plus 0 and L (= 8)
    assert meta["target_config"]["num_hidden_layers"] == 8 and meta["versions"]["transformers"]
    st = open_states(str(hf_states))
    assert len(st.files) == 16 and st.labels_are == "target"
    model = load_model(str(TARGET))
    req = next(st.requests((2, 5)))
    logits, aux = forward(model, torch.tensor([req.token_ids.tolist()]), (2, 5))
    assert req.hidden.shape == (256, 2, model.hidden_size)
    assert np.array_equal(req.hidden.reshape(256, -1), aux[0].numpy())  # layers in the order asked
    assert np.array_equal(req.target_argmax, logits[0].argmax(-1).numpy())


def test_workers_shadow_no_standard_module():
    """Workers run with their folder on sys.path: a file there named like a stdlib module breaks vLLM."""
    names = {p.stem for p in (ROOT / "eaglectl" / "workers").glob("*.py")}
    assert not names & set(sys.stdlib_module_names)


# ------------------------------------------------------------------------------------ statistics

def test_streamed_moments_equal_the_direct_formulas():
    """Block-wise float64 sufficient statistics give the same fits as the whole matrix at once."""
    rng = np.random.default_rng(0)
    n, Ht, H, T = 3, 16, 24, 5000
    seqs = [rng.normal(size=(T // 2, n * Ht)) * np.repeat([1.0, 3.0, 10.0], Ht) for _ in range(2)]
    W = rng.normal(size=(H, n * Ht))
    m = calibration.accumulate(W, n, Ht, 1e-6, seqs)
    c = np.concatenate([s[1:] for s in seqs])  # position 0 of each sequence left out
    chunks = c.reshape(len(c), n, Ht)
    rms = np.sqrt((chunks ** 2).mean(-1) + 1e-6)
    u = (chunks / rms[..., None]).reshape(len(c), -1)
    assert m.tokens == len(c) and np.allclose(m.summary()["rms_harmonic_mean"], 1 / (1 / rms).mean(0))
    for init in ("calibrated", "refit", "harmonic"):
        gammas, new_fc, stats = calibration.fit(init, n, Ht, m)
        A = new_fc if new_fc is not None else W * np.concatenate(gammas)
        direct = np.linalg.norm(u @ A.T - c @ W.T) / np.linalg.norm(c @ W.T)
        assert stats["fc_output_relative_error"] == pytest.approx(direct, rel=1e-6), init
    M = W.T @ W  # calibrated: the normal equations of the direct least squares
    g = np.concatenate(calibration.fit("calibrated", n, Ht, m)[0]).astype(np.float64)
    lam = 1e-6 * np.trace(M * (u.T @ u)) / len(g)
    assert np.allclose((M * (u.T @ u) + lam * np.eye(len(g))) @ g, (M * (c.T @ u)).sum(0), rtol=1e-4)


def test_calibration_from_states_equals_calibration_from_the_target(hf_states, tmp_path, invoke):
    """`upgrade --init calibrated --states DIR` without --target: the same fc_norm as the target's own
    states over the same windows would give."""
    r = invoke("upgrade", TRAINED / "eagle3", tmp_path / "up", "--init", "calibrated", "--states", hf_states,
               "--to", "speculators", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["init"] == "calibrated" and doc["layers"]["boundary_ids"] == [2, 4, 5]
    assert doc["layers"]["how"].startswith("measured")
    assert doc["statistics"]["tokens"] == 16 * 255 and doc["statistics"]["states"] == str(hf_states)
    assert doc["fidelity"]["inputs"].startswith("capture")
    src = open_drafter(str(TRAINED / "eagle3"))
    model = load_model(str(TARGET))
    seqs = [forward(model, torch.tensor([r.token_ids.tolist()]), (2, 4, 5))[1][0].double().numpy()
            for r in open_states(str(hf_states)).requests()]
    W = src.view.read("fc.weight").astype(np.float64)
    want = calibration.fit("calibrated", 3, src.spec.aux_width,
                           calibration.accumulate(W, 3, src.spec.aux_width, src.spec.rms_norm_eps or 1e-6, seqs))[0]
    got = open_drafter(str(tmp_path / "up"))
    verifier = got.ckpt.config["speculators_config"]["verifier"]
    assert got.spec.fc_norm and verifier == {"name_or_path": None, "architectures": ["LlamaForCausalLM"]}  # a path is no id
    for j in range(3):
        stored = got.view.read(f"fc_norm.{j}.weight").astype(np.float64)
        assert np.abs(stored - want[j]).max() <= 0.01 * np.abs(want[j]).max()  # bf16 rounding at most


def test_auto_init_from_states_ranks_on_held_out_requests(hf_states, tmp_path):
    r = upgrade_run(str(TRAINED / "eagle3"), str(tmp_path / "up"), states=str(hf_states), to="speculators",
                    fidelity=False)
    errors = [c["heldout_fc_output_relative_error"] for c in r.init_candidates]
    assert [c["init"] for c in r.init_candidates][0] == r.init and errors == sorted(errors)
    assert {c["init"] for c in r.init_candidates} == set(inits.CLOSED_FORM)  # `fit` needs a runnable target
    assert r.init_candidates[0]["heldout_tokens"] == 4 * 255  # the last quarter of the 16 requests
    assert "12 captured requests (4 more held out" in r.statistics["text_source"]
    assert errors[-1] > 2 * errors[0]  # the ranking separates them (ones is far worse than a fitted init)


# ------------------------------------------------------------------------------------------- probe

@pytest.mark.parametrize("name", sorted(TRUTH))
def test_the_probe_reads_each_fixture_from_a_capture(hf_states, name):
    m = probe.measure(open_drafter(str(TRAINED / name)), Target.open(None, str(hf_states)))
    assert list(m.boundary_ids) == TRUTH[name] and m.aux.p_value < 1e-6
    assert "labels the target's greedy next tokens" in m.inputs


def test_convert_with_states_follows_the_measured_numbering(hf_states, tmp_path, invoke):
    """The wave's 28 % failure, caught without running the target: ids stored in output numbering."""
    r = invoke("convert", TRAINED / "eagle3-output", tmp_path / "o", "--to", "speculators", "--states", hf_states,
               "--json")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "o" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]
    r = invoke("inspect", TRAINED / "eagle3-output", "--states", hf_states, "--json")
    doc = json.loads(r.stdout)
    assert doc["measured"]["aux_convention"]["measured"] == "output"


def test_verify_and_check_run_on_states(hf_states, invoke):
    r = invoke("verify", TRAINED / "eagle3", "--against", TRAINED / "eagle3", "--states", hf_states, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["inputs"].startswith(f"capture {hf_states}")
    r = invoke("check", TRAINED / "eagle3.1", "--states", hf_states, "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0, r.output
    parity = next(s for s in doc["stages"] if s["name"] == "parity")
    assert parity["status"] == "pass" and "capture" in parity["detail"]


# ------------------------------------------------------------------------------------------ bad input

def test_bad_states_folders_are_one_line_errors(hf_states, tmp_path, invoke):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = invoke("upgrade", TRAINED / "eagle3", tmp_path / "a", "--states", empty, "--init", "calibrated", "--to",
               "speculators")
    assert r.exit_code == 3 and "no capture.json" in r.stderr and not (tmp_path / "a").exists()
    few = tmp_path / "few"
    shutil.copytree(hf_states, few)
    meta = json.loads((few / "capture.json").read_text())
    meta["layer_ids"] = [0, 1, 8]
    (few / "capture.json").write_text(json.dumps(meta))
    r = invoke("verify", TRAINED / "eagle3", "--states", few)
    assert r.exit_code == 13 and "not [2, 4, 5]" in r.stderr and "--layers 0,1,2,4,5,8" in r.stderr
    meta["layer_ids"] = [0, 1, 2, 4, 5, 8]
    (few / "capture.json").write_text(json.dumps(meta))
    r = invoke("verify", TRAINED / "eagle3", "--states", few)
    assert r.exit_code == 19 and "does not fit" in r.stderr  # the dumps hold 9 layers, capture.json says 6
    meta["layer_ids"] = [5, 1]
    (few / "capture.json").write_text(json.dumps(meta))
    r = invoke("inspect", TRAINED / "eagle3", "--states", few)
    assert r.exit_code == 19 and "ascending" in r.stderr
    (few / "00000.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    meta["layer_ids"] = list(range(9))
    (few / "capture.json").write_text(json.dumps(meta))
    r = invoke("verify", TRAINED / "eagle3", "--states", few)
    assert r.exit_code == 19 and "not a hidden-states dump" in r.stderr


def test_capture_refuses_bad_options_before_any_work(tmp_path, invoke):
    r = invoke("capture", TARGET, "--out", tmp_path / "o", "--layers", "2,99")
    assert r.exit_code == 2 and "outside 0..8" in r.stderr and not (tmp_path / "o").exists()
    r = invoke("capture", TARGET, "--out", tmp_path / "o", "--engine", "server")
    assert r.exit_code == 2 and "--server-url" in r.stderr
    r = invoke("capture", TARGET, "--out", tmp_path / "o", "--vllm-arg", "no-equals")
    assert r.exit_code == 2 and "KEY=VALUE" in r.stderr


def test_print_recipe_names_the_servers_flags(tmp_path, invoke):
    r = invoke("capture", TARGET, "--drafter", TRAINED / "eagle3-output", "--out", tmp_path / "s", "--print-recipe",
               "--num-prompts", "64", "--tensor-parallel-size", "8")
    assert r.exit_code == 0 and not (tmp_path / "s").exists()
    assert '"eagle_aux_hidden_state_layer_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8]' in r.stdout
    assert "--tensor-parallel-size 8" in r.stdout and "ExampleHiddenStatesConnector" in r.stdout
    assert "--engine server --server-url" in r.stdout and "--num-prompts 64" in r.stdout


# ------------------------------------------------------------------------------------------- vLLM

def _agree(a: Path, b: Path) -> float:
    worst = 0.0
    for ra, rb in zip(open_states(str(a)).requests(), open_states(str(b)).requests(), strict=True):
        assert np.array_equal(ra.token_ids, rb.token_ids)
        assert np.array_equal(ra.target_argmax, rb.target_argmax)
        worst = max(worst, float(np.abs(ra.hidden - rb.hidden).max() / np.abs(ra.hidden).max()))
    return worst


def _gammas(states: Path) -> np.ndarray:
    src = open_drafter(str(TRAINED / "eagle3"))
    seqs = (r.hidden.reshape(r.hidden.shape[0], -1) for r in open_states(str(states)).requests((2, 4, 5)))
    m = calibration.accumulate(src.view.read("fc.weight"), 3, src.spec.aux_width, 1e-6, seqs)
    return np.concatenate(calibration.fit("calibrated", 3, src.spec.aux_width, m)[0])


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_capture_equals_the_hf_capture(hf_states, tmp_path, invoke, vllm_py):
    python = vllm_py
    r = invoke("capture", TARGET, "--engine", "vllm", "--drafter", TRAINED / "eagle3", "--out", tmp_path / "v",
               "--vllm-python", python, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["capture"]["versions"]["vllm"]
    assert _agree(hf_states, tmp_path / "v") <= 1e-3
    ga, gb = _gammas(hf_states), _gammas(tmp_path / "v")
    assert np.abs(ga - gb).max() <= 1e-2 * np.abs(ga).max()


@pytest.mark.vllm
@pytest.mark.slow
def test_a_users_vllm_serve_started_from_the_recipe(hf_states, tmp_path, invoke, vllm_py, vllm_default_processes):
    """The recipe's server flags (CPU connector variant) on a real `vllm serve`, driven by --engine server."""
    python = vllm_py
    storage = tmp_path / "raw"
    args = ["--model", str(TARGET), "--dtype", "float32", "--enforce-eager", "--max-model-len", "300",
            *capture.server_args(tuple(range(9)), str(storage), cpu=True)]
    with vllm_server(python, args, tmp_path, {"PYTHONPATH": str(ROOT / "eaglectl" / "workers")}) as (port, log):
        r = invoke("capture", TARGET, "--engine", "server", "--server-url", f"http://127.0.0.1:{port}",
                   "--layers", "0,1,2,3,4,5,6,7,8", "--out", tmp_path / "s", "--timeout-s", "600",
                   "--server-storage", storage)
        assert r.exit_code == 0, r.output + log.read_text()[-3000:]
    assert _agree(hf_states, tmp_path / "s") <= 1e-3
    assert not any(storage.glob("*.safetensors"))  # the server's dumps were moved, not copied and left
