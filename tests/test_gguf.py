"""llama.cpp GGUF EAGLE-3 drafts: header-only inspect, convert --to gguf, and a bit-exact round trip."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from .conftest import FIXTURES

gguf = pytest.importorskip("gguf")

TRAINED = FIXTURES / "trained"
TARGET = TRAINED / "target"
# HF canonical name -> llama.cpp name (gguf-py constants.py MODEL_TENSOR names, llama.cpp 0c1e5709)
NAMES = {"fc.weight": "fc.weight", "norm.weight": "output_norm.weight", "lm_head.weight": "output.weight",
         "d2t": "d2t", "input_layernorm.weight": "blk.0.attn_norm.weight",
         "hidden_norm.weight": "blk.0.attn_norm_2.weight", "self_attn.q_proj.weight": "blk.0.attn_q.weight",
         "self_attn.k_proj.weight": "blk.0.attn_k.weight", "self_attn.v_proj.weight": "blk.0.attn_v.weight",
         "self_attn.o_proj.weight": "blk.0.attn_output.weight",
         "post_attention_layernorm.weight": "blk.0.ffn_norm.weight", "mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
         "mlp.up_proj.weight": "blk.0.ffn_up.weight", "mlp.down_proj.weight": "blk.0.ffn_down.weight"}


def llama_cpp_permute(weights: torch.Tensor, n_head: int, n_head_kv: int | None) -> torch.Tensor:
    """Verbatim from llama.cpp conversion/llama.py (LlamaModel.permute)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def _json(r):
    return json.loads(r.stdout)


def _source(name: str) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in load_file(str(TRAINED / name / "model.safetensors")).items():
        for prefix in ("midlayer.", "layers.0."):
            k = k.removeprefix(prefix)
        out[k] = v
    return out


def _stored(t) -> np.ndarray:
    data = np.asarray(t.data)
    if t.tensor_type.name == "BF16":
        data = data.view(np.uint16)
    return data.reshape(tuple(int(n) for n in reversed(t.shape.tolist())))


def _bits(t: torch.Tensor) -> np.ndarray:
    return (t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy())


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each trained fixture converted once, through the CLI, with the target's default aux ids."""
    from click.testing import CliRunner

    from eaglectl.cli import cli

    outs = {}
    for name in ("eagle3", "eagle3-output"):
        dest = tmp_path_factory.mktemp("gguf") / name
        r = CliRunner().invoke(cli, ["convert", str(TRAINED / name), str(dest), "--to", "gguf", "--target", str(TARGET),
                                     "--no-measure", "--json"], catch_exceptions=False)
        assert r.exit_code == 0, r.stderr
        outs[name] = (dest / "model.gguf", _json(r))
    return outs


@pytest.mark.parametrize("name", ["eagle3", "eagle3-output"])
def test_round_trip_is_bit_identical(written, name):
    path, doc = written[name]
    assert doc["plan"]["files"] == ["model.gguf"] and sorted(p.name for p in path.parent.iterdir()) == ["model.gguf"]
    src = _source(name)
    cfg = json.loads((TRAINED / name / "config.json").read_text())
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "eagle3"
    assert reader.fields["tokenizer.ggml.model"].contents() == "none"  # llama.cpp's vocab loader requires the key
    assert reader.fields["eagle3.target_layers"].types[-1] == gguf.GGUFValueType.INT32
    stored = {t.name: t for t in reader.tensors}
    assert set(stored) == {NAMES[k] for k in src if k != "t2d"}  # t2d is left out, as llama.cpp's converter does
    for canon, tensor in src.items():
        if canon == "t2d":
            continue
        t = stored[NAMES[canon]]
        got = _stored(t)
        if canon == "d2t":  # absolute target ids, I64
            assert t.tensor_type.name == "I64"
            assert np.array_equal(got, tensor.numpy().astype(np.int64) + np.arange(len(tensor)))
            continue
        if canon in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
            expect = llama_cpp_permute(tensor, heads, heads if canon.startswith("self_attn.q") else kv)
            assert got.tobytes() == _bits(expect.contiguous()).tobytes(), canon
            assert not np.array_equal(got, _bits(tensor)), canon  # the permutation really moved rows
        # read back through eaglectl (un-permuted) is the source, bit for bit
        assert t.tensor_type.name == "BF16" and tensor.dtype == torch.bfloat16
    from eaglectl.drafter import open_drafter

    d = open_drafter(str(path))
    g = d.ckpt.files[0].source.gguf
    for canon, tensor in src.items():
        if canon != "t2d":
            assert g.raw(NAMES[canon]).tobytes() == _bits(tensor.contiguous()).astype(
                np.int64 if canon == "d2t" else np.uint16).tobytes(), canon
    assert d.view.read("d2t").tolist() == src["d2t"].tolist()


@pytest.mark.parametrize("name", ["eagle3", "eagle3-output"])
def test_inspect_reports_the_same_spec(invoke, written, name):
    path, doc = written[name]
    r = invoke("inspect", path, "--json")
    assert r.exit_code == 0, r.stderr
    out = _json(r)
    ids = doc["plan"]["config"]["eagle_aux_hidden_state_layer_ids"]
    assert len(ids) == 3 and out["dialect"] == "gguf"
    s = out["spec"]
    assert s["aux_layer_ids"] == ids and s["aux_convention"] == "boundary"
    src = _json(invoke("inspect", TRAINED / name, "--json"))["spec"]
    for field in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                  "vocab_size", "draft_vocab_size", "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
                  "rms_norm_eps", "rope_theta", "max_position_embeddings", "arch", "has_lm_head",
                  "num_aux_hidden_states"):
        assert s[field] == src[field], field
    assert out["eagle_version"] == "3"
    # the folder holding the one .gguf opens the same way; --scan reads every tensor (all finite)
    assert _json(invoke("inspect", path.parent, "--json"))["spec"] == s
    assert invoke("inspect", path, "--scan").exit_code == 0
    # vLLM loads no GGUF drafter: no serve line, and the way to one
    assert out["speculative_config"] is None
    human = invoke("inspect", path).stdout
    assert "vllm serve" not in human and "does not load llama.cpp GGUF files" in human and "--for vllm" in human


@pytest.mark.parametrize("name", ["eagle3", "eagle3-output"])
def test_the_gguf_drafts_exactly_like_its_source(invoke, written, name):
    """The reference drafter reads the GGUF (un-permuted q/k, relative d2t) and drafts bit-exactly as the source."""
    path, _ = written[name]
    r = invoke("verify", path, "--against", TRAINED / name, "--json")
    assert r.exit_code == 0, r.stderr
    doc = _json(r)
    assert doc["passed"] is True and doc["regime"] == "exact"
    d = _json(invoke("diff", path, TRAINED / name, "--target", TARGET, "--json"))  # values compared, atol 0
    assert d["equivalent"] is True and d["spec"] == [] and d["tensors"] == [] and d["tensors_compared"] >= 13, d


def test_a_gguf_converts_back_to_safetensors(invoke, written, tmp_path):
    """GGUF -> modelopt streams the un-permuted tensors; the result equals the original fixture, values compared."""
    path, _ = written["eagle3"]
    r = invoke("convert", path, tmp_path / "back", "--to", "modelopt", "--no-measure")
    assert r.exit_code == 0, r.stderr
    d = _json(invoke("diff", tmp_path / "back", TRAINED / "eagle3", "--target", TARGET, "--json"))
    assert d["equivalent"] is True and d["tensors"] == [] and d["tensors_compared"] >= 13, d


def test_detection_and_registry(written):
    from eaglectl import formats

    assert "gguf" in formats.names() and "gguf" in formats.writable()
    from eaglectl.drafter import open_drafter

    d = open_drafter(str(written["eagle3"][0]))
    assert d.dialect.name == "gguf" and d.ckpt.layout == "gguf"
    assert [x.dialect for x in d.detections if x.score is not None] == ["gguf"]


@pytest.mark.parametrize("source,args,needle", [
    ("eagle3.1", ("--target", str(TARGET)), "fc_norm"),  # 3.1's fc_norm: llama.cpp's loader has no such tensor
    ("eagle3.1-mla", ("--target", str(FIXTURES / "trained" / "target-mla")), "llama.cpp GGUF"),
    ("eagle3", (), "exactly 3 ids in eagle3.target_layers"),  # no ids and no target: the loader requires them
    ("eagle3", ("--target", str(TARGET), "--aux-layer-ids", "1,2"), "exactly 3"),
])
def test_refuses_what_llama_cpp_cannot_load(invoke, tmp_path, source, args, needle):
    dest = tmp_path / "out"
    r = invoke("convert", TRAINED / source, dest, "--to", "gguf", "--no-measure", *args)
    assert r.exit_code == 7, (r.exit_code, r.stderr)
    assert needle in r.stderr and not dest.exists() and list(tmp_path.iterdir()) == []


def test_help_does_not_import_gguf():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom eaglectl.cli import cli\n"
            "r = CliRunner().invoke(cli, ['--help'])\nassert r.exit_code == 0\nprint('gguf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


_LOAD = """
import ctypes, sys
import llama_cpp
llama_cpp.llama_backend_init()
params = llama_cpp.llama_model_default_params()
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), params)
assert model, "llama.cpp refused the file"
lib = llama_cpp._lib
lib.llama_model_target_layer_ids.restype = ctypes.POINTER(ctypes.c_int32)
lib.llama_model_target_layer_ids.argtypes = [ctypes.c_void_p]
lib.llama_model_target_layer_ids_n.restype = ctypes.c_uint32
lib.llama_model_target_layer_ids_n.argtypes = [ctypes.c_void_p]
ids = lib.llama_model_target_layer_ids(model)
print(llama_cpp.llama_model_n_embd(model), [ids[i] for i in range(lib.llama_model_target_layer_ids_n(model))])
"""


@pytest.mark.slow
def test_llama_cpp_loads_the_output(written):
    """llama.cpp's own loader (0c1e5709, built from llama-cpp-python 0.3.36's vendored copy) takes the file.
    EAGLECTL_LLAMA_CPP_LIB: the folder holding libllama.so; EAGLECTL_LLAMA_CPP_PY: the folder holding the
    `llama_cpp` Python package (the sdist's own)."""
    import os

    lib, py = os.environ.get("EAGLECTL_LLAMA_CPP_LIB"), os.environ.get("EAGLECTL_LLAMA_CPP_PY")
    if not lib or not py:
        pytest.skip("no llama.cpp build: set EAGLECTL_LLAMA_CPP_LIB and EAGLECTL_LLAMA_CPP_PY")
    path, doc = written["eagle3"]
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": lib, "PYTHONPATH": py}
    out = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    n_embd, ids = out.stdout.split(maxsplit=1)
    assert int(n_embd) == doc["plan"]["config"]["hidden_size"]
    assert json.loads(ids) == doc["plan"]["config"]["eagle_aux_hidden_state_layer_ids"]


def test_hostile_gguf_files_fail_cleanly(invoke, written, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 60)
    r = invoke("inspect", junk)
    assert r.exit_code == 4 and "not a readable GGUF file" in r.stderr, (r.exit_code, r.stderr)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(written["eagle3"][0].read_bytes()[:5000])
    assert invoke("inspect", truncated).exit_code == 4
    other = tmp_path / "llama.gguf"  # a GGUF of another architecture: not an EAGLE-3 draft
    w = gguf.GGUFWriter(other, "llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = invoke("inspect", other)
    assert r.exit_code == 5 and "not an EAGLE-3 draft" in r.stderr, (r.exit_code, r.stderr)
