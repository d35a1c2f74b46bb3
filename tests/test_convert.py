"""`eaglectl convert`: round trips, the conversion hazards of docs/hazards.md, safe writes, dry runs."""

from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pytest

from eaglectl import formats
from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.checkpoint.target import open_target
from eaglectl.commands.convert.command import execute, plan_conversion
from eaglectl.errors import ConversionError, FilesystemError
from eaglectl.io.checkpoint import open_checkpoint

from .conftest import DEFECTS, DRAFTERS, FIXTURES, TARGET
from .helpers import edited, inspect_checkpoint
from .helpers import verify_run as verify

WRITABLE = [n for n in formats.writable() if formats.get(n).vllm_loads]  # GGUF: tests/test_gguf.py
# the writable dialects that can say fc_norm: an EAGLE-3.1 drafter goes there and back (the rest refuse it)
WRITABLE_31 = [n for n in WRITABLE if "fc_norm" in formats.get(n).writer.flag_paths]


def convert(src, dest, to, **kw):
    target = kw.pop("target", None)
    tgt = open_target(str(target)) if target else None
    s = open_drafter(str(src), from_dialect=kw.pop("from_dialect", None), allow_pickle=True)
    plan = plan_conversion(s, dest, to, target=tgt, **kw)
    return execute(plan, s, target=tgt)


def tensors(path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    ck = open_checkpoint(str(path), allow_pickle=True)
    from eaglectl.checkpoint.drafter import CanonicalView, probe_of
    from eaglectl.formats import detect

    view = CanonicalView(ck, detect(probe_of(ck))[0])
    return {c: (view.info(c).dtype, view.info(c).shape, view.read(c).tobytes()) for c in view.names()}


def files_digest(path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------- round trips

ROUND_TRIPS = [("speculators-3.1", a, b) for a, b in itertools.permutations(WRITABLE_31, 2)] + [
    ("eagle-3", a, b) for a, b in itertools.permutations(WRITABLE, 2)]


@pytest.mark.parametrize("fixture,a,b", ROUND_TRIPS)
def test_a_to_b_to_a_is_bit_identical(tmp_path, fixture, a, b):
    first = tmp_path / "a"
    convert(DRAFTERS / fixture, first, a, target=TARGET)
    convert(first, tmp_path / "b", b, target=TARGET)
    convert(tmp_path / "b", tmp_path / "a2", a, target=TARGET)
    assert tensors(tmp_path / "a2") == tensors(first)
    ra, rb = inspect_checkpoint(str(first)), inspect_checkpoint(str(tmp_path / "a2"))
    assert ra.drafter.spec.to_json() | {"sources": 0} == rb.drafter.spec.to_json() | {"sources": 0}
    cfg1 = json.loads((first / "config.json").read_text())
    cfg2 = json.loads((tmp_path / "a2" / "config.json").read_text())
    cfg1.pop("eaglectl_provenance"), cfg2.pop("eaglectl_provenance")
    for cfg in (cfg1, cfg2):  # HF-style dialects cannot hold the verifier's Hub id; a local target adds none
        cfg.get("speculators_config", {}).get("verifier", {}).pop("name_or_path", None)
    assert cfg1 == cfg2


@pytest.mark.parametrize("fixture", ["eagle-3", "specforge-3.1", "speculators-3.1", "torchspec-3.1", "modelopt-3",
                                     "nemo-3.1", "speculators-sharded", "eagle-3-bin"])
@pytest.mark.parametrize("to", WRITABLE)
def test_converted_drafters_compute_exactly_what_the_source_does(tmp_path, fixture, to):
    try:
        convert(DRAFTERS / fixture, tmp_path / "out", to, target=TARGET,
                source_aux_convention="output" if fixture.startswith("modelopt") else None)
    except ConversionError as e:
        # SafeAILab's layout has no 3.1 flags and fixed aux ids: these refusals are the right answer
        assert to == "eagle" and ("fc_norm=true" in e.message or "cannot record aux ids" in e.message), e.message
        return
    rep = verify(str(tmp_path / "out"), against=str(DRAFTERS / fixture), tokens=24, allow_pickle=True)
    assert rep.regime == "exact" and rep.passed, rep.differing_tensors
    assert inspect_checkpoint(str(tmp_path / "out")).drafter.dialect.name == to


def test_dry_run_plan_is_the_executed_plan(invoke, tmp_path):
    args = ["convert", DRAFTERS / "nemo-3.1", tmp_path / "out", "--to", "modelopt", "--json"]
    dry = json.loads(invoke(*args, "--dry-run").stdout)
    assert dry["dry_run"] is True and not (tmp_path / "out").exists()
    real = json.loads(invoke(*args).stdout)
    assert real["dry_run"] is False and real["plan"] == dry["plan"]
    assert real["checked"] == [f"{len(real['plan']['tensors'])} tensors equal their source or documented transform "
                               "(re-read after writing)", "detected as modelopt", "inspect finds no errors",
                               "vLLM's runners read the written config as the drafter means it (declared (the files)): "
                               "v1 = v2 capture the target's default (2, L//2, L-3), same flags; assumed (eaglectl's "
                               "table of vLLM 0.32/0.33)",
                               "the source did not change while it was read"]


# ------------------------------------------------------------------------------------- hazards

def config(path):
    return json.loads((path / "config.json").read_text())


def test_h1_model_prefix_is_stripped_and_h18_architecture_renamed(tmp_path):
    convert(DRAFTERS / "nemo-3.1", tmp_path / "o", "speculators", target=TARGET)
    names = open_checkpoint(str(tmp_path / "o")).tensor_file
    assert not any(n.startswith("model.") for n in names)
    assert config(tmp_path / "o")["architectures"] == ["Eagle3Speculator"]
    convert(DRAFTERS / "nemo-3.1", tmp_path / "m", "modelopt")
    assert config(tmp_path / "m")["architectures"] == ["LlamaForCausalLMEagle3"]


def _two_layers(tmp_path):
    def second_layer(t):
        for name in list(t):
            if name.startswith("layers.0.") and "hidden_norm" not in name:
                w = t[name]
                if "self_attn" in name and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                    w = w[:, : w.shape[1] // 2].clone()  # layers >= 1 take H, not 2H
                t[name.replace("layers.0.", "layers.1.")] = w.clone()

    def two(cfg):
        cfg["transformer_layer_config"]["num_hidden_layers"] = 2

    return edited(DRAFTERS / "speculators-3", tmp_path, name="two", config=two, tensors=second_layer)


def test_h2_multi_layer_drafters_keep_layers_n_and_refuse_single_layer_dialects(tmp_path):
    two = _two_layers(tmp_path)
    assert inspect_checkpoint(str(two)).exit_code == 0
    for to in ("specforge", "eagle", "torchspec"):
        with pytest.raises(ConversionError, match="1 decoder layer"):
            convert(two, tmp_path / to, to, target=TARGET)
    convert(two, tmp_path / "m", "modelopt")
    names = set(open_checkpoint(str(tmp_path / "m")).tensor_file)
    assert "layers.1.mlp.up_proj.weight" in names and not any(n.startswith("layers.0.1") for n in names)
    assert verify(str(tmp_path / "m"), against=str(two), tokens=16).passed


def test_h3_aux_ids_are_translated_between_conventions(tmp_path):
    convert(DRAFTERS / "specforge-3.1", tmp_path / "s", "speculators", target=TARGET)
    assert config(tmp_path / "s")["eagle_aux_hidden_state_layer_ids"] == [1, 4, 7]  # output [0,3,6] + 1
    convert(tmp_path / "s", tmp_path / "f", "specforge")
    assert config(tmp_path / "f")["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 3, 6]
    convert(DRAFTERS / "speculators-3", tmp_path / "o", "modelopt", aux_layer_ids=(2, 5, 8))
    cfg = config(tmp_path / "o")  # vLLM's key in vLLM's numbering, ModelOpt's own field in ModelOpt's; the file says so
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 5, 8]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 4, 7]
    assert cfg["eaglectl_provenance"]["aux_convention"] == "boundary"
    assert cfg["eaglectl_provenance"]["aux_id_fields"] == {"eagle_aux_hidden_state_layer_ids": "boundary",
                                                           "eagle_config.eagle_aux_hidden_state_layer_ids": "output"}
    assert inspect_checkpoint(str(tmp_path / "o")).drafter.spec.aux_layer_ids_vllm == (2, 5, 8)


def test_h3_unverifiable_convention_must_be_stated(tmp_path):
    with pytest.raises(ConversionError, match="--source-aux-convention"):
        convert(DRAFTERS / "modelopt-3", tmp_path / "x", "speculators", target=TARGET)
    convert(DRAFTERS / "modelopt-3", tmp_path / "y", "speculators", target=TARGET, source_aux_convention="boundary")
    assert config(tmp_path / "y")["eagle_aux_hidden_state_layer_ids"] == [0, 3, 6]


def test_h3_safeailab_records_no_ids_and_refuses_non_default_ones(tmp_path):
    with pytest.raises(ConversionError, match=r"cannot record aux ids \[1, 4, 7\]"):
        convert(DRAFTERS / "speculators-3", tmp_path / "e", "eagle", target=TARGET)
    convert(DRAFTERS / "eagle-3", tmp_path / "s", "speculators", target=TARGET)  # defaults made explicit
    assert config(tmp_path / "s")["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    convert(tmp_path / "s", tmp_path / "e", "eagle", target=TARGET)  # and back: they are the default


def test_h4_unsorted_ids_are_refused(tmp_path):
    with pytest.raises(ConversionError, match="aux-ids-unsorted"):
        convert(DEFECTS / "aux-ids-unsorted", tmp_path / "x", "modelopt")


def test_h5_four_aux_states_are_sized_explicitly(tmp_path):
    convert(DEFECTS / "aux-count-not-3", tmp_path / "o", "modelopt")
    cfg = config(tmp_path / "o")
    assert cfg["num_aux_hidden_states"] == 4 and cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5, 7]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4, 6]  # ModelOpt's numbering
    convert(DEFECTS / "aux-count-not-3", tmp_path / "s", "speculators")
    assert config(tmp_path / "s")["num_aux_hidden_states"] == 4


def test_h6_every_flag_is_written_explicitly(tmp_path):
    convert(DRAFTERS / "specforge-3", tmp_path / "s", "speculators", target=TARGET)
    cfg = config(tmp_path / "s")
    assert {f: cfg[f] for f in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")} == dict.fromkeys(
        ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"), False)
    convert(DRAFTERS / "specforge-3.1", tmp_path / "f", "specforge")
    assert config(tmp_path / "f")["norm_output"] is True  # written, never left to a default (docs/hazards.md#flags)


def test_h6_norm_before_residual_true_cannot_go_where_it_cannot_be_said(tmp_path):
    src = edited(DRAFTERS / "speculators-3", tmp_path, name="nbr", config={"norm_before_residual": True})
    with pytest.raises(ConversionError, match="norm_before_residual=true"):
        convert(src, tmp_path / "f", "specforge")
    convert(src, tmp_path / "m", "modelopt")
    assert config(tmp_path / "m")["norm_before_residual"] is True


def test_h7_double_norm_is_refused(tmp_path):
    with pytest.raises(ConversionError, match="double-norm"):
        convert(DEFECTS / "double-norm", tmp_path / "x", "modelopt")


def test_h8_norm_before_fc_goes_to_both_places_and_h11_its_weight_is_kept(tmp_path):
    convert(DRAFTERS / "speculators-norm-before-fc", tmp_path / "m", "modelopt")
    cfg = config(tmp_path / "m")
    assert cfg["norm_before_fc"] is True and cfg["eagle_config"]["norm_before_fc"] is True
    assert "input_norm.weight" in open_checkpoint(str(tmp_path / "m")).tensor_file
    for to in ("specforge", "torchspec", "eagle"):
        with pytest.raises(ConversionError, match="norm_before_fc=true"):
            convert(DRAFTERS / "speculators-norm-before-fc", tmp_path / to, to)


def test_h11_fc_norm_weights_survive_every_3_1_destination(tmp_path):
    for to in WRITABLE_31:
        convert(DRAFTERS / "torchspec-3.1", tmp_path / to, to, target=TARGET)
        names = set(open_checkpoint(str(tmp_path / to)).tensor_file)
        assert {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"} <= names


def test_a_bf16_to_fp32_to_bf16_round_trip_gives_the_same_bytes(tmp_path):
    """The trained EAGLE-3 drafter (bf16) through fp32 and back, as the engine-parity test converts it: the same
    tensors bit for bit and the same config but for the provenance, so an engine reads what it read before."""
    trained = FIXTURES / "trained"
    convert(trained / "eagle3", tmp_path / "fp32", "eagle", target=trained / "target", dtype="float32")
    assert {dtype for dtype, _, _ in tensors(tmp_path / "fp32").values()} - {"BOOL", "I64"} == {"F32"}  # d2t, t2d kept
    convert(tmp_path / "fp32", tmp_path / "bf16", "eagle", dtype="bfloat16")
    assert tensors(tmp_path / "bf16") == tensors(trained / "eagle3")
    back = config(tmp_path / "bf16")
    source = config(trained / "eagle3")  # written explicitly: what vLLM assumes when it is absent (hidden_size)
    assert back.pop("eaglectl_provenance") and back == source | {"target_hidden_size": source["hidden_size"]}


def test_h12_missing_head_comes_from_target_rows_at_arange_plus_d2t(tmp_path):
    with pytest.raises(ConversionError, match="pass --target"):
        convert(DEFECTS / "lm-head-missing", tmp_path / "x", "modelopt")
    convert(DEFECTS / "lm-head-missing", tmp_path / "o", "modelopt", target=TARGET)
    out = open_checkpoint(str(tmp_path / "o"))
    d2t = out.read("d2t")
    want = open_checkpoint(str(TARGET)).read("lm_head.weight")[np.arange(len(d2t)) + d2t]
    np.testing.assert_array_equal(out.read("lm_head.weight"), want)


def test_h13_frequency_ordered_d2t_is_kept_and_t2d_derived(tmp_path):
    convert(DRAFTERS / "modelopt-3", tmp_path / "s", "speculators", target=TARGET, source_aux_convention="output")
    out, src = open_checkpoint(str(tmp_path / "s")), open_checkpoint(str(DRAFTERS / "modelopt-3"))
    np.testing.assert_array_equal(out.read("d2t"), src.read("d2t"))
    t2d = out.read("t2d")
    assert t2d.sum() == 64 and t2d[np.arange(64) + src.read("d2t")].all()


def test_h14_full_vocab_drops_d2t_and_t2d(tmp_path):
    result = convert(DEFECTS / "d2t-full-vocab", tmp_path / "o", "modelopt")
    names = set(open_checkpoint(str(tmp_path / "o")).tensor_file)
    assert "d2t" not in names and "t2d" not in names
    assert {n for n, _ in result.plan.dropped} == {"d2t", "t2d"}


def test_h15_head_is_separate_and_untied(tmp_path):
    convert(DEFECTS / "tie-word-embeddings", tmp_path / "o", "speculators")
    assert config(tmp_path / "o")["transformer_layer_config"]["tie_word_embeddings"] is False


def test_h16_embed_tokens_are_materialised_when_widths_differ(tmp_path):
    with pytest.raises(ConversionError, match="embed_tokens"):
        convert(DEFECTS / "embed-tokens-missing", tmp_path / "x", "modelopt")


def test_h17_rope_encodings_agree_and_safeailab_base_is_explicit(tmp_path):
    convert(DRAFTERS / "eagle-3", tmp_path / "o", "modelopt", target=TARGET)
    assert config(tmp_path / "o")["rope_theta"] == 10000.0


def test_h19_unsupported_combinations_are_refused(tmp_path):
    with pytest.raises(ConversionError, match="cannot hold a mla drafter"):
        convert(DRAFTERS / "modelopt-mla", tmp_path / "x", "speculators", target=TARGET, source_aux_convention="output")
    with pytest.raises(ConversionError, match="cannot hold a qwen3 drafter"):
        convert(DRAFTERS / "speculators-qwen3", tmp_path / "y", "specforge")


def test_speculators_needs_a_verifier(tmp_path):
    with pytest.raises(ConversionError, match="verifier"):
        convert(DRAFTERS / "specforge-3", tmp_path / "x", "speculators")
    convert(DRAFTERS / "specforge-3", tmp_path / "y", "speculators", target=TARGET)
    assert config(tmp_path / "y")["speculators_config"]["verifier"]["name_or_path"] is None  # a local path names nothing


def test_source_errors_block_conversion(tmp_path):
    for rule in ("d2t-range", "t2d-count", "tensor-shape", "missing-tensor", "fc-norm-flag-without-weights"):
        with pytest.raises(ConversionError, match=rule):
            convert(DEFECTS / rule, tmp_path / rule, "modelopt")
        assert not (tmp_path / rule).exists()


# ------------------------------------------------------------------------------ writes, dtypes

def test_dtype_cast_is_within_tolerance(tmp_path):
    result = convert(DRAFTERS / "speculators-3.1", tmp_path / "h", "speculators", dtype="float16")
    assert {a.action for a in result.plan.tensors if a.dtype == "F16"} == {"cast"}
    assert {i.dtype for i in open_checkpoint(str(tmp_path / "h")).tensors.values()} == {"F16", "I64", "BOOL"}
    assert config(tmp_path / "h")["transformer_layer_config"]["torch_dtype"] == "float16"
    rep = verify(str(tmp_path / "h"), against=str(DRAFTERS / "speculators-3.1"), tokens=24)
    assert rep.regime == "low-precision" and rep.passed


def test_sharded_output(tmp_path):
    convert(DRAFTERS / "speculators-3.1", tmp_path / "s", "modelopt", max_shard_size=12_000)
    ck = open_checkpoint(str(tmp_path / "s"))
    assert ck.layout == "sharded" and len(ck.files) > 2 and not ck.index_problems
    assert verify(str(tmp_path / "s"), against=str(DRAFTERS / "speculators-3.1"), tokens=8).passed


def test_sharded_source_keeps_sharding(tmp_path):
    convert(DRAFTERS / "speculators-sharded", tmp_path / "s", "specforge")
    assert open_checkpoint(str(tmp_path / "s")).layout == "sharded"


def test_existing_destination_needs_force_and_source_is_untouched(invoke, tmp_path):
    src = edited(DRAFTERS / "specforge-3.1", tmp_path, name="src")
    before = files_digest(src)
    for p in [*src.iterdir(), src]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        dest = tmp_path / "out"
        dest.mkdir()
        (dest / "config.json").write_text("{}")
        r = invoke("convert", src, dest, "--to", "modelopt")
        assert r.exit_code == 12 and "error[output-exists]" in r.stderr and (dest / "config.json").read_text() == "{}"
        r = invoke("convert", src, dest, "--to", "modelopt", "--force")
        assert r.exit_code == 0 and (dest / "model.safetensors").exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]
    finally:
        for p in [src, *src.iterdir()]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert files_digest(src) == before


def test_a_failure_while_writing_leaves_nothing(monkeypatch, tmp_path):
    import eaglectl.commands.convert.command as conv

    calls = []

    def failing(path, entries, metadata=None):
        calls.append(path)
        raise OSError("disk full")

    monkeypatch.setattr(conv, "write_safetensors", failing)
    with pytest.raises(FilesystemError, match="disk full"):
        convert(DRAFTERS / "speculators-3.1", tmp_path / "out", "modelopt")
    assert calls and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dtype", [None, "float32"])  # copied tensors (compared with the source), cast ones (CRC)
def test_a_write_that_lands_wrong_is_caught_by_the_re_read(monkeypatch, tmp_path, dtype):
    import eaglectl.commands.convert.command as conv

    real = conv.write_safetensors

    def corrupting(path, entries, metadata=None):
        written = real(path, entries, metadata)
        r = written.ranges["lm_head.weight"]  # the bytes on disk differ from what the writer was given
        with r.path.open("r+b") as f:
            f.seek(r.offset + r.length // 2)
            byte = f.read(1)
            f.seek(r.offset + r.length // 2)
            f.write(bytes([byte[0] ^ 1]))
        return written

    monkeypatch.setattr(conv, "write_safetensors", corrupting)
    with pytest.raises(ConversionError, match="tensor 'lm_head.weight' does not equal its source"):
        convert(DRAFTERS / "eagle-3", tmp_path / "out", "modelopt", dtype=dtype)
    assert list(tmp_path.iterdir()) == []


def test_destination_inside_the_source_is_refused(invoke, tmp_path):
    src = edited(DRAFTERS / "speculators-3", tmp_path, name="src")
    r = invoke("convert", src, src / "out", "--to", "modelopt", "--force")
    assert r.exit_code == 23 and "overlaps the source" in r.stderr
    r = invoke("convert", src, src, "--to", "modelopt", "--force")
    assert r.exit_code == 23 and (src / "model.safetensors").exists()


def test_cli_choices_and_human_output(invoke, tmp_path):
    assert invoke("convert", DRAFTERS / "eagle-3", tmp_path / "x", "--to", "nemo").exit_code == 2
    r = invoke("convert", DRAFTERS / "nemo-3.1", tmp_path / "o", "--to", "modelopt")
    assert r.exit_code == 0 and "checked inspect finds no errors" in r.stdout
    assert "model.fc.weight" in r.stdout and "+ eagle_config" in r.stdout
    assert r.stderr == ""  # no progress bar when stderr is not a terminal


def test_provenance_is_recorded(tmp_path):
    convert(DRAFTERS / "nemo-3.1", tmp_path / "o", "modelopt")
    prov = config(tmp_path / "o")["eaglectl_provenance"]
    assert prov["source_dialect"] == "nemo" and prov["aux_convention"] == "boundary"
    meta = open_checkpoint(str(tmp_path / "o")).metadata
    assert meta["format"] == "pt" and json.loads(meta["eaglectl"]) == prov


def independent_digest(folder) -> str:
    """The provenance digest of a one-file safetensors drafter, computed here from its bytes."""
    ck = open_checkpoint(str(folder))
    raw = (folder / "model.safetensors").read_bytes()
    start = ck.files[0].header.data_start
    h = hashlib.sha256()
    for name in sorted(ck.tensor_file):
        info = ck.tensors[name]
        sha = hashlib.sha256(raw[start + info.begin: start + info.end]).hexdigest()
        h.update(f"{name}|{info.dtype}|{list(info.shape)}|{sha}\n".encode())
    return "sha256:" + h.hexdigest()


def test_source_digest_is_the_sources_whatever_is_written(invoke, tmp_path):
    """Hashed from the moment the source is opened (copies and casts alike), the digest names the source's bytes:
    the same with and without a cast, and a refused conversion stops the hashing and leaves nothing."""
    src = DRAFTERS / "speculators-3.1"
    runs = [json.loads(invoke("convert", src, tmp_path / name, "--to", "modelopt", *extra, "--json").stdout)
            for name, extra in (("copy", []), ("cast", ["--dtype", "float16"]))]
    assert {a["action"] for a in runs[1]["plan"]["tensors"]} >= {"cast"}
    assert runs[0]["source_digest"] == runs[1]["source_digest"] == independent_digest(src)
    refused = invoke("convert", src, tmp_path / "refused", "--to", "eagle")  # planning refuses fc_norm: the digest ran
    assert refused.exit_code != 0 and not (tmp_path / "refused").exists()


def test_source_digest_identifies_tensors_not_layout(tmp_path):
    """The digest streamed while writing equals an independent hash, and ignores sharding."""
    a = convert(DRAFTERS / "speculators-3.1", tmp_path / "a", "modelopt", max_shard_size=10_000)
    b = convert(DRAFTERS / "speculators-sharded", tmp_path / "b", "modelopt")
    assert a.source_digest == b.source_digest == independent_digest(DRAFTERS / "speculators-3.1")
    for shard in sorted((tmp_path / "a").glob("*.safetensors")):
        meta = json.loads(open_checkpoint(str(shard)).metadata["eaglectl"])
        assert meta["source_digest"] == a.source_digest == config(tmp_path / "a")["eaglectl_provenance"]["source_digest"]
