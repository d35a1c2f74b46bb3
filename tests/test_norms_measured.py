"""Issue 48: the norm arrangement a drafter was trained with is measured, not declared. Every drafter is scored
under both values of the flags no tensor settles (norm_output, norm_before_residual); a config that declares
another arrangement than the weights were trained with is an error naming the flag, never OK."""

from __future__ import annotations

import json

import pytest

from .conftest import FIXTURES
from .helpers import edited

TRAINED = FIXTURES / "trained"
TARGET = TRAINED / "target"


def _inspect(invoke, drafter):
    r = invoke("inspect", drafter, "--target", TARGET, "--json")
    doc = json.loads(r.stdout)
    return r.exit_code, doc, {f["rule_id"]: f for f in doc["findings"]}


def test_the_declared_arrangement_of_a_trained_drafter_is_the_measured_one(invoke):
    code, doc, found = _inspect(invoke, TRAINED / "eagle3.1")
    facts = doc["measured"]
    assert facts["norm_output"]["measured"] in ("true", "undecided")
    assert facts["norm_before_residual"]["measured"] in ("false", "undecided")
    assert "flag-reading-mismatch" not in found and code == 0, found


@pytest.mark.parametrize(("drafter", "flag", "declared", "trained"), [
    ("eagle3.1", "norm_output", False, "true"),  # a 3.1 drafter whose config lost norm_output
    ("eagle3-output", "norm_output", True, "false"),  # a 3.0 drafter (SpecForge) declared 3.1's feedback
])
def test_a_config_that_declares_another_arrangement_is_an_error(invoke, tmp_path, drafter, flag, declared, trained):
    d = edited(TRAINED / drafter, tmp_path, name=f"wrong-{flag}", config={flag: declared})
    code, doc, found = _inspect(invoke, d)
    fact = doc["measured"][flag]
    assert fact["declared"] == str(declared).lower() and fact["measured"] == trained, fact
    assert code == 1 and "flag-reading-mismatch" in found and found["flag-reading-mismatch"]["severity"] == "error"
    assert f"'{flag}' is {str(declared).lower()} in the config" in found["flag-reading-mismatch"]["message"]


def test_a_flag_the_weights_cannot_tell_is_undecided_not_an_error(invoke, tmp_path):
    """norm_before_residual changes little in a one-layer drafter: flipped, the fixture's agreement barely moves, so
    the answer is undecided (with its numbers), and no finding claims a mismatch."""
    d = edited(TRAINED / "eagle3.1", tmp_path, name="nbr", config={"norm_before_residual": True})
    code, doc, found = _inspect(invoke, d)
    fact = doc["measured"]["norm_before_residual"]
    assert fact["measured"] in ("undecided", "true") and "sign test" in fact["reason"]
    assert "flag-reading-mismatch" not in found


# ------------------------------------------------------------------------------ drafters inside their target

def _with_mtp(tmp_path, name, parts):
    """The fixture target with a block of tiny tensors under its own `mtp.0.` prefix (DeepSeek-V4's layout)."""
    import torch

    def add(state):
        for part in parts:
            state[f"mtp.0.{part}.weight"] = torch.zeros(4, 4, dtype=state["lm_head.weight"].dtype)

    return edited(TARGET, tmp_path, name=name, tensors=add)


@pytest.mark.parametrize(("parts", "said", "unsaid"), [
    (("markov_head", "fc", "layers.0.mlp.up_proj", "norm"), "a DSpark drafter under mtp.*", "MTP block"),
    (("enorm", "hnorm", "eh_proj", "shared_head.norm"), "an MTP block under mtp.*", "DSpark"),
])
def test_a_drafter_inside_its_target_is_named_from_the_headers(invoke, tmp_path, parts, said, unsaid):
    """Issue 48: DeepSeek-V4-Flash-0731 ships a DSpark drafter under the target's `mtp.*` names (markov_head, no
    enorm / hnorm), which method=mtp half-loads; a true MTP block has enorm, hnorm and eh_proj. inspect tells them
    apart from the tensor names alone, in the one-line refusal of a target given as a drafter."""
    t = _with_mtp(tmp_path, parts[0], parts)
    r = invoke("inspect", t)
    text = " ".join(r.stderr.split())
    assert r.exit_code != 0 and "looks like a target model" in text and said in text and unsaid not in text, text
    assert len(r.stderr.strip().splitlines()) <= 4
    plain = " ".join(invoke("inspect", TARGET).stderr.split())
    assert "looks like a target model" in plain and "mtp" not in plain
