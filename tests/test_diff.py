"""`eaglectl diff A B`: meaning across dialects; exit 0 equivalent, 1 different."""

from __future__ import annotations

import json

import pytest

from .conftest import DRAFTERS, TARGET
from .helpers import edited


def diff(invoke, a, b, *args):
    r = invoke("diff", a, b, *args, "--json")
    doc = json.loads(r.stdout)
    assert doc["schema"] == "eaglectl.diff/1" and doc["exit_code"] == r.exit_code
    return r.exit_code, doc


def _perturb(src, dest, stored, row=-1, delta=0.5):
    """A copy of `src` with one element of tensor `stored` moved by `delta`."""
    import torch

    def move(tensors):
        t = tensors[stored].clone()
        t.view(-1)[row] = (t.view(-1)[row].float() + delta).to(t.dtype)
        tensors[stored] = t
        assert torch.is_tensor(t)

    edited(src, dest.parent, name=dest.name, tensors=move)


@pytest.mark.parametrize("to", ["specforge", "torchspec", "modelopt", "speculators"])
def test_a_conversion_is_equivalent(invoke, tmp_path, to):
    out = tmp_path / "c"
    assert invoke("convert", DRAFTERS / "speculators-3.1", out, "--to", to, "--target", TARGET,
                  "--no-measure").exit_code == 0
    code, doc = diff(invoke, DRAFTERS / "speculators-3.1", out)
    assert code == 0 and doc["equivalent"], doc
    assert doc["a"]["dialect"] == "speculators" and doc["b"]["dialect"] == to
    assert doc["tensors_compared"] >= 18 and doc["values_compared"]


def test_default_aux_ids_equal_the_default_written_out_given_the_target(invoke, tmp_path):
    out = tmp_path / "c"
    assert invoke("convert", DRAFTERS / "eagle-3", out, "--to", "speculators", "--target", TARGET).exit_code == 0
    code, doc = diff(invoke, DRAFTERS / "eagle-3", out)
    assert code == 1 and [f["field"] for f in doc["spec"]] == ["aux_layer_ids_vllm"]
    assert doc["spec"][0]["a"] is None and doc["spec"][0]["b"] == [2, 4, 5]
    code, doc = diff(invoke, DRAFTERS / "eagle-3", out, "--target", TARGET)
    assert code == 0 and doc["equivalent"]


def test_a_dialect_that_leaves_out_t2d_is_still_equivalent(invoke, tmp_path):
    out = tmp_path / "m"
    assert invoke("convert", DRAFTERS / "speculators-3.1", out, "--to", "modelopt", "--no-measure").exit_code == 0
    code, doc = diff(invoke, DRAFTERS / "speculators-3.1", out)
    assert code == 0 and doc["derived_only"] == [{"name": "t2d", "in": "a", "derived_from": "d2t"}]


def test_an_upgrade_differs_in_flags_and_fc_norm(invoke, tmp_path):
    up = tmp_path / "up"
    assert invoke("upgrade", DRAFTERS / "speculators-3", up, "--no-fidelity").exit_code == 0
    code, doc = diff(invoke, DRAFTERS / "speculators-3", up)
    assert code == 1
    assert doc["only_in_b"] == ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"] and doc["only_in_a"] == []
    spec = {f["field"]: (f["a"], f["b"]) for f in doc["spec"]}
    assert spec["fc_norm"] == (False, True) and spec["norm_output"] == (False, True)
    assert spec["eagle_version"] == ("3", "3.1")
    assert doc["tensors"] == []  # the weights it kept are untouched
    human = invoke("diff", DRAFTERS / "speculators-3", up)
    assert human.exit_code == 1 and "only in B: fc_norm.0.weight" in human.stdout and "DIFFERENT" in human.stdout


def test_one_perturbed_tensor_is_named_across_dialects(invoke, tmp_path):
    conv = tmp_path / "conv"
    assert invoke("convert", DRAFTERS / "speculators-3.1", conv, "--to", "specforge", "--no-measure").exit_code == 0
    bad = tmp_path / "bad"
    _perturb(conv, bad, "midlayer.mlp.down_proj.weight")
    code, doc = diff(invoke, DRAFTERS / "speculators-3.1", bad)
    assert code == 1 and doc["spec"] == [] and doc["only_in_a"] == doc["only_in_b"] == []
    assert [t["name"] for t in doc["tensors"]] == ["layers.0.mlp.down_proj.weight"]
    t = doc["tensors"][0]
    assert t["differs"] == ["values"] and 0.4 <= t["max_abs_diff"] <= 0.6
    # within --atol it is equal; headers alone cannot see it
    assert diff(invoke, DRAFTERS / "speculators-3.1", bad, "--atol", "0.6")[0] == 0
    code, doc = diff(invoke, DRAFTERS / "speculators-3.1", bad, "--no-values")
    assert code == 0 and not doc["values_compared"]


def test_values_are_streamed_in_row_blocks(invoke, tmp_path, monkeypatch):
    from eaglectl.commands import diff as diff_mod

    monkeypatch.setattr(diff_mod, "BLOCK_BYTES", 64)  # one 32-wide BF16 row per block
    bad = tmp_path / "bad"
    _perturb(DRAFTERS / "speculators-3.1", bad, "lm_head.weight", row=-1, delta=2.0)  # the last row only
    code, doc = diff(invoke, DRAFTERS / "speculators-3.1", bad)
    assert code == 1 and [t["name"] for t in doc["tensors"]] == ["lm_head.weight"]
    assert doc["tensors"][0]["max_abs_diff"] >= 1.0


def test_dtype_and_shape_differences(invoke, tmp_path):
    half = tmp_path / "half"
    assert invoke("convert", DRAFTERS / "speculators-3.1", half, "--to", "speculators", "--dtype", "float16",
                  "--no-measure").exit_code == 0
    code, doc = diff(invoke, DRAFTERS / "speculators-3.1", half)
    assert code == 1 and doc["tensors"]
    assert all("dtype" in t["differs"] and t["b"]["dtype"] == "F16" for t in doc["tensors"])
    code, doc = diff(invoke, DRAFTERS / "speculators-3.1", DRAFTERS / "speculators-qwen3")
    assert code == 1 and doc["spec"]


def test_a_missing_side_is_a_one_line_error(invoke, tmp_path):
    r = invoke("diff", DRAFTERS / "speculators-3.1", tmp_path / "nope")
    assert r.exit_code not in (0, 1, 70) and "nope" in r.output and "Traceback" not in r.output
