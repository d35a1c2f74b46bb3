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

    from eaglectl.cli.app import cli

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
    from eaglectl.checkpoint.drafter import open_drafter

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
    from eaglectl.checkpoint.drafter import open_drafter

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
    code = ("import sys\nfrom click.testing import CliRunner\nfrom eaglectl.cli.app import cli\n"
            "r = CliRunner().invoke(cli, ['--help'])\nassert r.exit_code == 0\nprint('gguf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_llama_cpp_loads_the_output(written, tmp_path):
    """llama.cpp's own loader (0c1e5709, the copy llama-cpp-python 0.3.36 vendors; make's test venv installs the CPU
    build from the ../shared/wheels cache) takes the file and reads the target layer ids eaglectl wrote. The
    accessors are looked up under their C name, then C++-mangled (how that build exports them)."""
    from .fuzzing import llama_cpp_available, llama_cpp_load

    if (why := llama_cpp_available()) is not None:
        pytest.skip(why)
    for name in ("eagle3", "eagle3-output"):
        path, doc = written[name]
        outcome, detail = llama_cpp_load(path)
        assert outcome == "loaded", detail
        _, n_embd, ids = detail.split(maxsplit=2)
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


# ------------------------------------------------------------------- hostile GGUF files (issue 30 items 5-7)
# Each case is eaglectl's own output with one thing changed that llama.cpp's loader refuses (ggml/src/gguf.cpp,
# src/llama-model-loader.cpp): refused with exit 4, one line naming the file, the tensor and the offset, and
# convert writes nothing.

def _image(written):
    from .fuzzing import GGUFImage

    return GGUFImage.parse(written["eagle3"][0].read_bytes())


def _tensor(img, name: str):
    return next(t for t in img.tensors if t["name"] == name.encode())


def _misaligned(img):
    _tensor(img, "blk.0.attn_q.weight")["offset"] += 2


def _overlapping(img):  # a tensor on its neighbour's bytes
    _tensor(img, "blk.0.attn_q.weight")["offset"] = _tensor(img, "blk.0.attn_k.weight")["offset"]


def _wrapped(img):  # an offset that wraps past 2^64 into the header
    _tensor(img, "blk.0.attn_q.weight")["offset"] = 2**64 - 4096


def _widened(img):  # d2t's I64 read as BF16 (smaller): its neighbours move
    _tensor(img, "fc.weight")["type"] = 0  # F32 over BF16 bytes: twice as long, over its neighbour


def _beyond(img):
    img.data = img.data[:-64]


def _gap(img):  # aligned, but not where the previous tensor's padded bytes end
    for t in img.tensors[5:]:
        t["offset"] += 32


def _alignment(img):  # general.alignment 1 and a header that ends off the 32-byte boundary llama.cpp maps tensors on
    from .fuzzing import gguf_value

    img.set("general.alignment", 4, 1)
    img.align = 1
    header = len(img.to_bytes()) - len(img.data)
    img.kvs.append((b"x.pad", gguf_value(8, "x" * (8 + (-header) % 32))))  # a string that moves the header end
    assert (len(img.to_bytes()) - len(img.data)) % 32


def _not_pow2(img):
    img.set("general.alignment", 4, 48)


def _five_dims(img):
    _tensor(img, "output_norm.weight")["dims"] = [128, 1, 1, 1, 1]


def _negative_dim(img):
    _tensor(img, "output_norm.weight")["dims"] = [-1]


def _unknown_type(img):
    _tensor(img, "output_norm.weight")["type"] = 43


def _duplicate_name(img):
    _tensor(img, "output_norm.weight")["name"] = b"blk.0.ffn_norm.weight"


def _duplicate_key(img):
    img.kvs.append(img.kvs[0])


def _huge_array(img):
    from .fuzzing import gguf_value

    img.kvs.append((b"x.many", gguf_value(9, (0, []))[:8] + (1 << 40).to_bytes(8, "little")))


@pytest.mark.parametrize("mutate,needle", [
    (_misaligned, "tensor 'blk.0.attn_q.weight': data offset"),
    (_overlapping, "tensor 'blk.0.attn_q.weight': data offset"),
    (_wrapped, "tensor 'blk.0.attn_q.weight': data offset 18446744073709547520"),
    (_widened, "tensor 'blk.0.attn_norm_2.weight': data offset"),
    (_beyond, "tensor 'd2t': data at offset"),
    (_gap, "is not where the previous tensor's padded data ends"),
    (_alignment, "not on the 32-byte boundary llama.cpp maps tensors on"),
    (_not_pow2, "general.alignment 48 is not a power of 2"),
    (_five_dims, "tensor 'output_norm.weight': 5 dimensions"),
    (_negative_dim, "tensor 'output_norm.weight': shape [-1]"),
    (_unknown_type, "tensor 'output_norm.weight': invalid ggml type 43"),
    (_duplicate_name, "tensor 'blk.0.ffn_norm.weight': duplicate tensor name"),
    (_duplicate_key, "is a duplicate of b'general.architecture'"),
    (_huge_array, "key 'x.many' is an array of 1099511627776 items, over the limit"),
], ids=lambda v: getattr(v, "__name__", "")[1:] or None)
def test_what_llama_cpp_refuses_is_refused(invoke, written, tmp_path, mutate, needle):
    img = _image(written)
    mutate(img)
    path = tmp_path / "bad.gguf"
    path.write_bytes(img.to_bytes())
    before = path.read_bytes()
    for args in (("inspect", path), ("inspect", path, "--scan"), ("convert", path, tmp_path / "out", "--to", "eagle",
                                                                     "--no-measure")):
        r = invoke(*args)
        assert r.exit_code == 4, (args, r.exit_code, r.stderr)
        assert r.stderr.startswith(f"error[corrupt-checkpoint]: {path}: ") and needle in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists() and path.read_bytes() == before


def test_llama_cpp_refuses_the_same_files(written, tmp_path):
    """The cases above, offered to llama.cpp's loader itself: it refuses each one's structure or tensor ranges (or
    aborts on them: the misaligned data section)."""
    from .fuzzing import llama_cpp_available, llama_cpp_load

    if (why := llama_cpp_available()) is not None:
        pytest.skip(why)
    for mutate in (_misaligned, _overlapping, _wrapped, _widened, _beyond, _gap, _alignment, _not_pow2, _five_dims,
                   _negative_dim, _unknown_type, _duplicate_name, _duplicate_key, _huge_array):
        img = _image(written)
        mutate(img)
        path = tmp_path / f"{mutate.__name__}.gguf"
        path.write_bytes(img.to_bytes())
        outcome, detail = llama_cpp_load(path)
        assert outcome == "range", (mutate.__name__, outcome, detail)


def test_a_zero_dim_d2t_is_refused(invoke, written, tmp_path):
    """Issue 30 item 7: a d2t of 0 dims exited 70 (draft_vocab_size = shape[0]); llama.cpp reads a 1-D d2t."""
    img = _image(written)
    d2t = _tensor(img, "d2t")
    d2t["dims"] = []  # one element, its bytes where the 128 were: the layout stays valid
    img.data = img.data[:d2t["offset"] + 32]
    path = tmp_path / "d2t.gguf"
    path.write_bytes(img.to_bytes())
    for args in (("inspect", path), ("convert", path, tmp_path / "out", "--to", "eagle", "--no-measure")):
        r = invoke(*args)
        assert r.exit_code == 4, (r.exit_code, r.stderr)
        assert f"{path}: tensor 'd2t': shape []: llama.cpp's eagle3 loader reads a 1-D 'd2t'" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_bool_head_count_is_no_count(invoke, written, tmp_path):
    """Found by the GGUF fuzzer: eagle3.attention.head_count_kv stored as a BOOL un-permuted k over True heads (70)."""
    img = _image(written)
    img.set("eagle3.attention.head_count_kv", 7, 1)
    path = tmp_path / "bool.gguf"
    path.write_bytes(img.to_bytes())
    r = invoke("inspect", path, "--scan")
    assert r.exit_code == 4, (r.exit_code, r.stderr)
    assert f"{path}: tensor 'blk.0.attn_k.weight': cannot un-permute 64 rows over True heads" in r.stderr


@pytest.mark.parametrize("target", [TARGET, FIXTURES / "target-llama"], ids=["runnable", "target-llama"])
def test_a_gguf_with_a_target_never_exits_70(invoke, written, tmp_path, target):
    """Issue 30 item 6: any GGUF with a runnable --target exited 70 (no aux reading for llama.cpp): inspect, check
    and convert now read it as llama.cpp does (boundaries, engines.ENGINE_AUX_CONVENTIONS), and convert --to gguf replays the
    written file under that reading. fixtures/target-llama (no tokenizer: not runnable) is another width: findings."""
    from eaglectl.engines.facts import engine_convention

    assert engine_convention("llama.cpp").rule == "boundary"
    path, _ = written["eagle3"]
    runnable = target == TARGET
    r = invoke("inspect", path, "--target", target, "--json")
    assert r.exit_code == (0 if runnable else 1), r.stderr
    found = {f["rule_id"]: f["message"] for f in _json(r)["findings"]}
    assert "aux-reading-mismatch" not in found
    if runnable:
        assert "trained on boundaries [2, 4, 5]" in found["measured-reading"]
    else:
        assert "target-hidden-mismatch" in found
    r = invoke("check", path, "--target", target)
    assert r.exit_code == (0 if runnable else 1), r.stderr
    dest = tmp_path / "out"
    r = invoke("convert", path, dest, "--to", "gguf", "--target", target, "--json")
    if not runnable:  # refused as for any drafter of another width, nothing written
        assert r.exit_code not in (0, 70) and not dest.exists(), (r.exit_code, r.stderr)
        return
    assert r.exit_code == 0, r.stderr
    checked = _json(r)["checked"]
    assert any("drafts exactly like the source under llama.cpp" in c and "[2, 4, 5]" in c for c in checked), checked
    assert not any("vLLM" in c for c in checked), checked  # vLLM loads no GGUF draft: its runners are not asked


def _fuzz_clean(rep, what: str, cases: int) -> None:
    from .fuzzing import clean

    clean(rep, what, cases, 0, 4)  # both outcomes were reached
    print(f"{what}: {rep.exit0} exit 0, {rep.read} read; llama.cpp on {len(rep.accepted)} of them: {rep.llama}")
    assert not rep.refused_by_llama, rep.refused_by_llama[:5]


def test_fuzzing_gguf_files(tmp_path):
    """Seeded, in process: 300 mutated GGUF headers, KV metadata, tensor infos and data (about 5 s); 12 of the files
    eaglectl reads are loaded by llama.cpp where it is installed."""
    from .fuzzing import fuzz_gguf

    _fuzz_clean(fuzz_gguf(tmp_path, cases=300, seed=0, llama_sample=12), "gguf", 300)


@pytest.mark.slow
def test_fuzzing_gguf_at_scale(tmp_path):
    """Another seed, more cases (EAGLECTL_FUZZ_CASES sets how many; 3,000 by hand: see the notes of issue 30)."""
    from .fuzzing import fuzz_gguf, scale_cases

    n = scale_cases(3000)
    _fuzz_clean(fuzz_gguf(tmp_path, cases=n, seed=1, llama_sample=60), "gguf (slow)", n)


def test_a_gguf_that_shrinks_while_its_header_is_read_is_a_changed_source(written):
    """The header is read with pread, not a memory map: a file shorter than when it was opened is exit 16, never a
    SIGBUS."""
    import os

    from eaglectl.errors import SourceChangedError
    from eaglectl.io import gguf

    path = written["eagle3"][0]
    with open(path, "rb") as f:
        grown = gguf._Pread(path, f.fileno(), os.fstat(f.fileno()).st_size + 4096)  # as opened, before it shrank
        with pytest.raises(SourceChangedError, match="shrank"):
            gguf._parse(path, grown)
