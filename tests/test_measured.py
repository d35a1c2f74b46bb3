"""Issue 11: the weights say what the files cannot. The probe names each trained fixture's layers in every
dialect, convert and upgrade follow the measurement, the written output drafts like the source under its
engine's reading, and readings that lose acceptance are errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from eaglectl import formats
from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.commands import inspect as inspect
from eaglectl.measure.probe import measure
from eaglectl.measure.reading import engine_reading
from eaglectl.measure.target import Target
from eaglectl.measure.workload import heldout_prompts
from eaglectl.model.loader import load_reference

from .conftest import ROOT
from .helpers import convert_run, edited, inspect_checkpoint, run_json, smoke
from .specloop import speculative_generate

TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"
# fixture -> (numbering of its stored ids, the boundaries it was trained on)
TRUTH = {"eagle3": ("boundary", [2, 4, 5]), "eagle3.1": ("boundary", [2, 4, 5]), "eagle3-output": ("output", [3, 5, 6])}
# the writable dialects that record aux ids (eagle's layout cannot: its drafters run on the engines' default)
WITH_IDS = [n for n in formats.writable() if formats.get(n).writer.aux_ids_paths and formats.get(n).vllm_loads]
SHIFTED = {"eagle_aux_hidden_state_layer_ids": [3, 5, 6]}  # eagle3.1's ids, each one layer too deep


@pytest.fixture(scope="module")
def model():
    """The trained target, opened once for the module (its states and continuations are reused)."""
    return Target.open(str(TARGET))


def measured(path, **kw) -> dict:
    doc = inspect_checkpoint(str(path), target=str(TARGET), **kw).to_json()
    assert doc["measured"] is not None, doc["measured_note"]
    return doc


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_the_probe_names_each_trained_drafters_layers(model, name):
    m = measure(open_drafter(str(TRAINED / name)), model)
    convention, boundaries = TRUTH[name]
    assert m.convention == convention and list(m.boundary_ids) == boundaries
    aux = m.aux
    assert aux.p_value < 1e-6 and aux.margin >= 0.02  # decisive, not a coin toss
    by_ids = {tuple(c.boundary_ids): c for c in aux.candidates}
    best = by_ids[tuple(boundaries)]
    assert all(best.acceptance_length >= c.acceptance_length for c in aux.candidates)  # the loop agrees
    assert m.best_agreement > m.chance + 0.3


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Both EAGLE-3 fixture drafters written in every dialect that can hold them (no --target: the
    ids are translated by the dialect tables, which are right for these two)."""
    out = tmp_path_factory.mktemp("dialects")
    made = {}
    for name in ("eagle3", "eagle3-output"):
        for to in WITH_IDS:
            dest = out / f"{name}-{to}"
            convert_run(str(TRAINED / name), str(dest), to,
                        target=str(TARGET) if to == "speculators" else None, measure=False)
            made[(name, to)] = dest
    return made


@pytest.mark.parametrize("name", ["eagle3", "eagle3-output"])
@pytest.mark.parametrize("to", WITH_IDS)
def test_the_same_layers_are_measured_through_every_dialect(written, name, to):
    doc = measured(written[(name, to)])
    aux = doc["measured"]["aux_convention"]
    assert aux["boundary_ids"] == TRUTH[name][1], aux
    stored = doc["spec"]["aux_layer_ids"]
    # no ids stored: the engines' default is read whatever the numbering, so the declared one stands
    expected = aux["declared"] if stored is None else "boundary" if stored == TRUTH[name][1] else "output"
    assert aux["measured"] == expected and aux["p_value"] < 1e-6


def foreign_specforge(tmp_path):
    """A SpecForge-layout drafter trained on vLLM's numbering: the EAGLE-3 fixture (boundaries 2, 4, 5)
    with those ids written into a SpecForge config, as such drafters are published."""
    return edited(TRAINED / "eagle3", tmp_path, name="foreign", config={
        "architectures": ["LlamaForCausalLMEagle3"], "target_hidden_size": 128,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}})


def test_a_drafter_trained_on_vllm_numbering_in_specforge_layout(tmp_path, invoke):
    src = foreign_specforge(tmp_path)
    doc = measured(src)
    aux = doc["measured"]["aux_convention"]
    assert doc["dialect"] == "specforge" and aux["declared"] == "output"
    assert aux["measured"] == "boundary" and aux["boundary_ids"] == [2, 4, 5]
    # with the target, the measurement wins over the table and the ids are kept
    r = invoke("convert", src, tmp_path / "measured", "--to", "speculators", "--target", TARGET, "--json")
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    assert any("measurement wins" in n for n in res["plan"]["notes"])
    assert any("drafts exactly like the source" in c for c in res["checked"])
    assert json.loads((tmp_path / "measured" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [
        2, 4, 5]
    # without measuring, the table is assumed (and said to be): the ids move one layer
    r = invoke("convert", src, tmp_path / "assumed", "--to", "speculators", "--target", TARGET, "--no-measure", "--json")
    res = json.loads(r.stdout)
    assert r.exit_code == 0 and any("assumed" in n for n in res["plan"]["notes"])
    assert json.loads((tmp_path / "assumed" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [
        3, 5, 6]
    als = {}
    for name in ("measured", "assumed"):
        rep = smoke(str(tmp_path / name), str(TARGET), engine="reference", num_prompts=8, max_tokens=48)
        als[name] = rep.to_json()["mean_acceptance_length"]
    assert als["assumed"] < als["measured"] - 0.15  # the silent loss the measurement prevents


def test_convert_output_drafter_checks_behaviour_under_the_consumers_reading(tmp_path, invoke):
    src = TRAINED / "eagle3-output"
    for to in ("speculators", "modelopt"):
        r = invoke("convert", src, tmp_path / to, "--to", to, "--target", TARGET, "--json")
        assert r.exit_code == 0, r.stderr
        checked = json.loads(r.stdout)["checked"]
        assert any("drafts exactly like the source under vLLM v1 and vLLM v2 (boundaries [3, 5, 6])" in c
                   for c in checked), checked
    # SGLang 0.5.23's Llama target class adds 1 to eagle_config's output-numbered ids [2, 4, 5]: a SpecForge copy
    # drafts exactly like the source under vLLM (the top-level ids) and SGLang alike
    r = invoke("convert", src, tmp_path / "sf", "--to", "specforge", "--target", TARGET, "--json")
    assert r.exit_code == 0, r.stderr
    checked = json.loads(r.stdout)["checked"]
    assert any("drafts exactly like the source" in c and "sglang" in c for c in checked), checked
    # ids written as boundaries ([3, 5, 6]) in SGLang's field: it adds 1 and reads [4, 6, 7], one layer too deep
    boundary = edited(TRAINED / "eagle3-output", tmp_path, name="boundary",
                      config=lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[3, 5, 6]))
    r = invoke("convert", boundary, tmp_path / "sf2", "--to", "specforge", "--target", TARGET,
               "--source-aux-convention", "boundary")
    assert r.exit_code == 0, r.stderr  # convert writes SGLang's numbering, whatever the source's
    doc = json.loads(invoke("inspect", boundary, "--target", TARGET, "--json").stdout)
    found = {f["rule_id"]: f["message"] for f in doc["findings"]}
    assert "sglang" in found["aux-reading-mismatch"] and "[4, 6, 7]" in found["aux-reading-mismatch"]


def test_engines_that_read_other_layers_are_errors(tmp_path, invoke):
    doc = json.loads(invoke("inspect", TRAINED / "eagle3-output", "--target", TARGET, "--json").stdout)
    found = {f["rule_id"]: f["message"] for f in doc["findings"]}
    assert "aux-reading-mismatch" not in found  # SGLang, this layout's engine, adds 1: it reads the trained layers
    assert "vllm" in found["aux-ids-output-convention"] and "[3, 5, 6]" in found["aux-ids-output-convention"]
    shifted = edited(TRAINED / "eagle3.1", tmp_path, name="shifted", config=SHIFTED)
    _, doc = run_json(invoke, "check", shifted, "--target", TARGET, "--no-card", code=1)
    assert "aux-reading-mismatch" in {f["rule_id"] for f in doc["findings"]}
    _, doc = run_json(invoke, "check", TRAINED / "eagle3.1", "--target", TARGET, "--no-card", code=0)
    assert "measured-reading" in {f["rule_id"] for f in doc["findings"]}


def _with_tensor(tmp_path, name, tensor_name, make):
    def put(state):
        state[tensor_name] = make(state)

    return edited(TRAINED / "eagle3.1", tmp_path, name=name, tensors=put)


def test_a_shipped_random_embedding_or_head_is_caught(tmp_path):
    g = torch.Generator().manual_seed(0)
    emb = _with_tensor(tmp_path, "emb", "embed_tokens.weight",
                       lambda s: (torch.randn(320, 128, generator=g) * 0.02).to(torch.bfloat16))
    doc = measured(emb)
    assert doc["measured"]["embedding"]["measured"] == "target"
    assert "embedding-mismatch" in {f["rule_id"] for f in doc["findings"]}
    # a random head is no better than chance under every reading (the target's rows do not fit a head the
    # drafter trained on its own; lm-head-mismatch is for heads trained as copies of the target's)
    head = _with_tensor(tmp_path, "head", "lm_head.weight",
                        lambda s: torch.randn(*s["lm_head.weight"].shape, generator=g).to(torch.bfloat16))
    doc = measured(head)
    assert doc["measured"]["lm_head"]["measured"] != "own"
    assert "drafter-at-chance" in {f["rule_id"] for f in doc["findings"]}
    good = _with_tensor(tmp_path, "good", "embed_tokens.weight",
                        lambda s: load_file(TARGET / "model.safetensors")["model.embed_tokens.weight"])
    doc = measured(good)
    assert doc["measured"]["embedding"]["measured"] == "undecided"  # the very same table: nothing to tell apart
    assert not {"embedding-mismatch", "lm-head-mismatch"} & {f["rule_id"] for f in doc["findings"]}


def test_random_weights_agree_at_chance(tmp_path, invoke):
    g = torch.Generator().manual_seed(1)
    d = edited(TRAINED / "eagle3.1", tmp_path, name="random", tensors=lambda state: {
        k: (torch.randn(*v.shape, generator=g) * 0.05).to(v.dtype) if v.is_floating_point() and v.ndim == 2 else v
        for k, v in state.items()})
    _, doc = run_json(invoke, "check", d, "--target", TARGET, "--no-card", code=1)
    assert "drafter-at-chance" in {f["rule_id"] for f in doc["findings"]}


def test_a_specforge_flag_from_the_other_window_is_measured(tmp_path, invoke):
    """A SpecForge 3.1 file whose norm_output says false although the drafter was trained with it."""
    sf = tmp_path / "sf"
    assert invoke("convert", TRAINED / "eagle3.1", sf, "--to", "specforge", "--no-measure").exit_code == 0
    doc = measured(edited(sf, tmp_path, name="sf-declared-false", config={"norm_output": False}))
    fact = doc["measured"]["norm_output"]
    assert fact["declared"] == "false" and fact["measured"] == "true" and fact["steps"] == [1, 2]
    assert "flag-reading-mismatch" in {f["rule_id"] for f in doc["findings"]}


def test_engine_reading_names_the_reading_that_reproduces_the_counts(tmp_path, model):
    """What smoke does with vLLM's counts, fed here with the counts of the live speculative loop (an engine
    of its own, independent of the replay engine_reading uses) under a known reading."""
    shifted = edited(TRAINED / "eagle3.1", tmp_path, name="shifted", config=SHIFTED)
    hf = model.model()
    prompts = heldout_prompts(hf.tokenizer, 4, 64, seed=5)

    def served(path, ids, **flags):  # what an engine running this reading counts
        drafter = load_reference(open_drafter(str(path))).build(torch.float32, "cpu", **flags)
        c = speculative_generate(hf, drafter, prompts, k=3, max_tokens=32, aux_ids=ids, embed=hf.embedding().float())
        return {"num_drafts": c.num_drafts, "num_accepted_tokens": c.num_accepted_tokens,
                "accepted_per_pos": c.accepted_per_pos}

    d = open_drafter(str(shifted))
    er = engine_reading(d, model, prompts, k=3, max_tokens=32, engine_counts=served(shifted, (3, 5, 6)),
                        measured=measure(d, model))
    assert er.matched is not None and er.matched.boundary_ids == (3, 5, 6)
    assert er.intended.boundary_ids == (2, 4, 5)
    assert "reads boundaries [3, 5, 6]; the drafter was trained on [2, 4, 5]" in er.difference()
    plain = open_drafter(str(TRAINED / "eagle3.1"))
    straight = engine_reading(plain, model, prompts, k=3, max_tokens=32,
                              engine_counts=served(TRAINED / "eagle3.1", (2, 4, 5)), measured=measure(plain, model))
    assert straight.matched is not None and straight.difference() is None
    flipped = engine_reading(plain, model, prompts, k=3, max_tokens=32,
                             engine_counts=served(TRAINED / "eagle3.1", (2, 4, 5), norm_output=False), measured=None)
    assert "ran with norm_output off" in flipped.difference()


def test_upgrade_measures_layers_and_inits(tmp_path, invoke):
    r = invoke("upgrade", TRAINED / "eagle3-output", tmp_path / "u", "--to", "speculators", "--target", TARGET,
               "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["layers"]["boundary_ids"] == [3, 5, 6] and doc["layers"]["how"].startswith("measured")
    inits = [c["init"] for c in doc["init_candidates"]]
    assert sorted(inits) == ["calibrated", "fit", "harmonic", "ones", "refit"] and doc["init"] == inits[0]
    kept = {c["init"]: c["acceptance_kept"] for c in doc["init_candidates"]}  # on each init's worst kind of text
    assert kept[doc["init"]] == max(kept.values()) and kept[doc["init"]] > 0.8
    assert doc["init_candidates"][0]["by_kind"]["code"]["acceptance_kept"] > 0.9  # code, as ranked before kinds
    assert kept["ones"] < kept[doc["init"]]
    out = json.loads((tmp_path / "u" / "config.json").read_text())
    assert out["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6] and out["fc_norm"] and out["norm_output"]
    assert np.isfinite(doc["init_candidates"][0]["acceptance_length"])
