"""`eaglectl verify`: parity of the same drafter across dialects, precisions, and a perturbed copy."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from safetensors.torch import load_file

from eaglectl.model.hf import forward, load_model

from .conftest import DRAFTERS, ROOT, TARGET
from .helpers import edited, same_weights
from .helpers import verify_run as verify

# the same weights written in several dialects by fixtures/make_fixtures.py (its DIALECT_FIXTURES table)
SAME_31 = same_weights("d31")
SAME_3 = same_weights("d3")


@pytest.mark.parametrize("name", sorted(p.name for p in DRAFTERS.iterdir()))
def test_every_dialect_against_itself_is_exact(invoke, name):
    r = invoke("verify", DRAFTERS / name, "--against", DRAFTERS / name, "--allow-pickle", "--json", "--tokens", "16")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["regime"] == "exact" and doc["passed"] is True
    assert all(s["logits_max_abs"] == 0 and s["state_max_abs"] == 0 for s in doc["per_step"])


@pytest.mark.parametrize("a,b", [*itertools.combinations(SAME_31, 2), *itertools.combinations(SAME_3, 2)])
def test_the_same_checkpoint_in_two_dialects_is_bit_identical(a, b):
    rep = verify(str(DRAFTERS / a), against=str(DRAFTERS / b), tokens=24, steps=3, allow_pickle=True)
    assert rep.regime == "exact" and rep.identical_tensors and rep.passed


def test_a_single_perturbed_tensor_fails_with_the_report(invoke, tmp_path):
    w = load_file(DRAFTERS / "speculators-3.1" / "model.safetensors")["layers.0.mlp.up_proj.weight"].clone()
    w[3, 5] += 0.25
    dest = edited(DRAFTERS / "speculators-3.1", tmp_path, name="perturbed", tensors={"layers.0.mlp.up_proj.weight": w})
    r = invoke("verify", dest, "--against", DRAFTERS / "speculators-3.1", "--json")
    assert r.exit_code == 8
    doc = json.loads(r.stdout)  # the report is printed, then the error
    assert doc["passed"] is False and doc["differing_tensors"] == ["layers.0.mlp.up_proj.weight"]
    assert doc["regime"] == "exact" and doc["per_step"][0]["logits_max_abs"] > 0
    assert r.stderr.startswith("error[parity-mismatch]:")
    human = invoke("verify", dest, "--against", DRAFTERS / "speculators-3.1")
    assert human.exit_code == 8 and "FAIL" in human.stdout and "up_proj" in human.stdout


def test_a_dtype_change_is_held_to_the_precision_tolerance(tmp_path):
    dest = edited(DRAFTERS / "speculators-3.1", tmp_path, name="fp16",
                  tensors=lambda t: {k: (v.half() if v.is_floating_point() else v) for k, v in t.items()})
    rep = verify(str(dest), against=str(DRAFTERS / "speculators-3.1"), tokens=32)
    assert rep.regime == "low-precision" and not rep.identical_tensors and rep.passed
    assert rep.metrics[0].logits_max_abs > 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_precision_parity_against_fp32_cpu(dtype):
    rep = verify(str(DRAFTERS / "speculators-3.1"), dtype=dtype, tokens=32, steps=4)
    assert rep.mode == "precision" and rep.regime == "low-precision" and rep.passed
    assert rep.reference["dtype"] == "float32" and rep.candidate["dtype"] == dtype
    assert all(0 < m.kl_mean < 1e-3 for m in rep.metrics)


def test_fidelity_is_a_measurement():
    rep = verify(str(DRAFTERS / "speculators-3"), against=str(DRAFTERS / "speculators-3.1"), fidelity=True, tokens=16)
    assert rep.mode == "fidelity" and rep.passed is None and rep.exit_code == 0
    assert rep.metrics[0].kl_mean > 0


def test_target_inputs(invoke):
    r = invoke("verify", DRAFTERS / "specforge-3.1", "--target", TARGET, "--json", "--tokens", "16")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["inputs"].startswith(f"target {TARGET}: ") and doc["inputs"].endswith(
        "aux ids [1, 4, 7]")


def test_cuda_without_a_gpu_is_missing_dependency(invoke):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    r = invoke("verify", DRAFTERS / "speculators-3", "--device", "cuda", "--dtype", "bfloat16")
    assert r.exit_code == 10 and "error[missing-dependency]" in r.stderr


def test_different_architectures_are_refused(invoke):
    r = invoke("verify", DRAFTERS / "speculators-qwen3", "--against", DRAFTERS / "speculators-3")
    assert r.exit_code == 13 and "head_dim differs" in r.stderr


def test_verify_json_keys_are_documented():
    page = (ROOT / "docs" / "verify.md").read_text()
    doc = verify(str(DRAFTERS / "speculators-3"), tokens=8).to_json()
    for key in [*doc, *doc["per_step"][0], *doc["candidate"]]:
        assert f"`{key}`" in page, key


# ------------------------------------------------------------------------------------ capture

def test_capture_uses_vllm_boundary_semantics():
    target = load_model(str(TARGET))
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(0))
    L = target.num_layers
    aux = forward(target, ids, (0, 3, L))[1]
    hs = target.model(input_ids=ids, output_hidden_states=True).hidden_states
    H = target.hidden_size
    assert torch.equal(aux[..., :H], hs[0]) and torch.equal(aux[..., H: 2 * H], hs[3])
    final = aux[..., 2 * H:]
    assert not torch.allclose(final, hs[L])  # HF's last entry is post-norm
    torch.testing.assert_close(target.model.model.norm(final), hs[L])


def test_gpu_script_runs_on_cpu(tmp_path):
    """The prepared GPU check works end to end (here on the CPU, without the 8B-class drafter)."""
    import subprocess
    import sys

    out = tmp_path / "gpu.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_parity.py"), "--device", "cpu", "--skip-8b",
                    "--dtypes", "bfloat16", "--out", str(out)], check=True, cwd=ROOT, capture_output=True)
    doc = json.loads(out.read_text())
    assert doc["runs"] and all(r["passed"] for r in doc["runs"])
