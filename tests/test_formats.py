"""The registry: detection with evidence, key renames both ways, one source for CLI and docs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eaglectl import formats
from eaglectl.checkpoint.drafter import probe_of
from eaglectl.cli.table import inspect_cmd
from eaglectl.formats import Probe, Signal
from eaglectl.io.checkpoint import open_checkpoint
from eaglectl.rules.layout import CANONICAL

from .conftest import DRAFTERS, ROOT, TARGET
from .helpers import edited

CANONICAL_SAMPLE = [
    "embed_tokens.weight", "fc.weight", "fc_norm.0.weight", "fc_norm.2.weight", "input_norm.weight", "norm.weight",
    "lm_head.weight", "d2t", "t2d", "layers.0.self_attn.q_proj.weight", "layers.0.hidden_norm.weight",
    "layers.0.mlp.down_proj.weight", "layers.1.input_layernorm.weight", "layers.0.self_attn.q_norm.weight",
]
canonical_names = st.sampled_from(CANONICAL_SAMPLE)


@pytest.mark.parametrize("name", formats.names())
@given(canon=canonical_names)
def test_key_rules_round_trip(name, canon):
    d = formats.get(name)
    assert d.to_canonical(d.from_canonical(canon)) == canon


def test_canonical_patterns_cover_the_sample():
    assert all(any(p.match(n) for p in CANONICAL) for n in CANONICAL_SAMPLE)
    assert not any(p.match("layers.0.1.mlp.up_proj.weight") for p in CANONICAL)


def test_cli_choices_come_from_the_registry():
    choice = next(p for p in inspect_cmd.params if p.name == "from_dialect")
    assert list(choice.type.choices) == formats.names()
    # every registered dialect has a fixture drafter detected as it, and every fixture's dialect is registered
    # (gguf, one llama.cpp file, is written from the trained fixtures and detected in tests/test_gguf.py)
    fixtures = [open_checkpoint(str(p), allow_pickle=True) for p in DRAFTERS.iterdir()]
    assert {formats.detect(probe_of(ck))[0].name for ck in fixtures} == set(formats.names()) - {"gguf"}


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match="twice"):
        formats.register(formats.get("eagle"))


def test_detection_returns_evidence_and_scores():
    probe = probe_of(open_checkpoint(str(DRAFTERS / "specforge-3.1")))
    dialect, detections = formats.detect(probe)
    assert dialect.name == "specforge"
    by = {d.dialect: d for d in detections}
    assert "config has 'eagle_config.eagle_aux_hidden_state_layer_ids'" in by["specforge"].evidence
    assert by["eagle"].score is None and by["eagle"].evidence[0].startswith("excluded:")
    assert by["torchspec"].score is None and by["torchspec"].evidence[0].startswith("missing:")


def test_torchspec_aux_convention_depends_on_layout_and_model_type():
    ts = formats.get("torchspec")
    base = dict(tensors=frozenset({"layers.0.mlp.up_proj.weight"}), metadata=None, files=frozenset())
    kimi = Probe(config={"model_type": "kimi_k2"}, **base)
    llama = Probe(config={"model_type": "llama"}, **base)
    assert ts.aux_convention_for(kimi)[0] == "boundary"
    assert ts.aux_convention_for(llama)[0] == "output"


def test_signal_kinds():
    p = Probe(frozenset({"midlayer.x", "d2t"}), {"a": {"b": [1, 2]}, "n": None}, {"format": "pt"},
              frozenset({"sub/pytorch_model.bin"}))
    assert Signal("tensor-prefix", "midlayer.").holds(p)
    assert Signal("tensor", "d2t").holds(p) and not Signal("tensor", "t2d").holds(p)
    assert Signal("config-key", "a.b").holds(p) and not Signal("config-key", "n").holds(p)
    assert Signal("config-value", "a.b", 2).holds(p)
    assert Signal("metadata-key", "format").holds(p)
    assert Signal("file", "pytorch_model.bin").holds(p)


# ---------------------------------------------------------------------- a dialect is one module of data

def toy_dialect():
    from eaglectl.formats import Dialect, Writer

    return Dialect(
        name="toy", title="Toy trainer", producers="tests/test_formats.py",
        required=(Signal("tensor-prefix", "toy_block.", weight=2),),
        markers=(Signal("config-key", "toy_version", weight=2),),
        key_rules=(("layers.0.", "toy_block."),),
        aux_ids_paths=("toy_aux_ids",), aux_convention="output",
        flag_fields=frozenset({"fc_norm", "norm_output"}),
        flag_defaults={f: (False, "toy default") for f in ("norm_before_residual", "norm_before_fc", "fc_norm",
                                                            "norm_output")},
        owned_config_keys=("toy_version", "toy_aux_ids"),
        # vLLM's top-level key in vLLM's numbering too: both vLLM runners must read the drafter's layers
        writer=Writer(architectures={"llama": "LlamaForCausalLMEagle3"},
                      aux_ids_paths=("eagle_aux_hidden_state_layer_ids", "toy_aux_ids"),
                      aux_conventions={"eagle_aux_hidden_state_layer_ids": "boundary"},
                      flag_paths={"fc_norm": ("fc_norm",), "norm_output": ("norm_output",)},
                      explicit_false=("norm_before_residual", "norm_before_fc"), extra_config={"toy_version": 1},
                      max_layers=1),
    )


def test_a_dialect_registered_at_run_time_is_everywhere(invoke, tmp_path):
    """CLI choices, detection, conversion both ways, card lint and the docs table all come from the registry."""
    import sys

    from .helpers import verify_run as verify

    formats.register(toy_dialect())
    try:
        assert "toy" in formats.names() and "toy" in formats.writable()
        r = invoke("convert", DRAFTERS / "speculators-3.1", tmp_path / "toy", "--to", "toy", "--json")
        assert r.exit_code == 0, r.stderr
        cfg = json.loads((tmp_path / "toy" / "config.json").read_text())
        assert cfg["toy_aux_ids"] == [0, 3, 6] and cfg["toy_version"] == 1  # boundary [1, 4, 7] as output ids
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 4, 7]
        assert cfg["eaglectl_provenance"]["aux_id_fields"] == {"eagle_aux_hidden_state_layer_ids": "boundary",
                                                               "toy_aux_ids": "output"}
        assert cfg["norm_before_residual"] is False and cfg["fc_norm"] is True
        doc = json.loads(invoke("inspect", tmp_path / "toy", "--json").stdout)
        assert doc["dialect"] == "toy" and doc["spec"]["aux_layer_ids_vllm"] == [1, 4, 7]
        assert invoke("inspect", DRAFTERS / "speculators-3.1", "--from", "toy").exit_code in (0, 1)
        assert verify(str(tmp_path / "toy"), against=str(DRAFTERS / "speculators-3.1"), tokens=16).passed
        r = invoke("convert", tmp_path / "toy", tmp_path / "back", "--to", "speculators", "--target", TARGET)
        assert r.exit_code == 0, r.stderr
        assert verify(str(tmp_path / "back"), against=str(DRAFTERS / "speculators-3.1"), tokens=16).passed
        card = edited(DRAFTERS / "speculators-3.1", tmp_path, name="card", files={
            "README.md": "---\ntags: [speculative-decoding, eagle3, eagle3.1]\n---\nA drafter in the `toy` layout.\n"})
        found = {f["rule_id"] for f in json.loads(invoke("check", card, "--json").stdout)["findings"]}
        assert "card-dialect" in found
        sys.path.insert(0, str(ROOT / "docs"))
        import generate

        assert "| `toy` | Toy trainer |" in generate.formats_page()
        assert "toy" in invoke("convert", "--help").stdout
    finally:
        formats.DIALECTS.pop("toy", None)
    assert "toy" not in formats.names()


def test_a_torchspec_template_without_its_marker_is_named_in_the_evidence(invoke, tmp_path):
    """Issue 34: TorchSpec's Kimi template (midlayer names, eagle_config.use_aux_hidden_state, no _torchspec_version)
    reads as SpecForge; the evidence names TorchSpec as fitting but for its marker, in the report too."""
    from .helpers import edited

    def template(c: dict) -> None:
        c["eagle_config"]["use_aux_hidden_state"] = True

    d = edited(DRAFTERS / "specforge-3", tmp_path, name="tmpl", config=template)
    doc = json.loads(invoke("inspect", d, "--json").stdout)
    assert doc["dialect"] == "specforge"
    near = [e for e in doc["dialect_evidence"] if e.startswith("also fits torchspec")]
    assert near and "_torchspec_version" in near[0], doc["dialect_evidence"]
    assert "also fits torchspec" in invoke("inspect", d).stdout
    plain = json.loads(invoke("inspect", DRAFTERS / "specforge-3", "--json").stdout)["dialect_evidence"]
    assert not any(e.startswith("also fits") for e in plain)  # SpecForge's own config: nothing else fits


def test_a_torchspec_template_with_modelopts_keys_is_torchspec(invoke, tmp_path):
    """Issue 47: TorchSpec's Kimi templates (configs/draft_models/kimi_k*_eagle3_*.json) carry ModelOpt's
    eagle_config keys, which SpecForge never writes; with TorchSpec's midlayer names and no marker the checkpoint is
    TorchSpec's (its raw-residual flag defaults), not SpecForge's. ModelOpt's own layout (layers.0) stays ModelOpt."""
    from .helpers import edited

    def template(c: dict) -> None:
        c["eagle_config"].update(use_aux_hidden_state=True, use_input_layernorm_in_first_layer=True,
                                 use_last_layernorm=True, use_mtp_layernorm=False)

    d = edited(DRAFTERS / "specforge-3", tmp_path, name="kimi-template", config=template)
    doc = json.loads(invoke("inspect", d, "--json").stdout)
    assert doc["dialect"] == "torchspec", doc["dialect_evidence"]
    assert "config has 'eagle_config.use_input_layernorm_in_first_layer'" in doc["dialect_evidence"]
    assert json.loads(invoke("inspect", DRAFTERS / "modelopt-3", "--json").stdout)["dialect"] == "modelopt"
