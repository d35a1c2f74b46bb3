"""The registry: detection with evidence, key renames both ways, one source for CLI and docs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eaglectl import formats
from eaglectl.io.checkpoint import open_checkpoint
from eaglectl.cli import inspect_cmd
from eaglectl.formats import Probe, Signal
from eaglectl.drafter import probe_of
from eaglectl.rules.layout import CANONICAL

from .conftest import DRAFTERS

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
    assert formats.names() == ["eagle", "specforge", "speculators", "torchspec", "modelopt", "nemo"]


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
