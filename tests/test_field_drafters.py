"""The drafters the field ships now (speculators 0.9.0 `train`): sliding-window layers, several decoder layers, more
than three aux states. Trained once on the committed target (fixtures/train_fixtures.py --only field), never tuned
for these tests. Every command that runs the reference runs them; the verdict follows the engine's reading; real
vLLM's counts equal the reference loop's per request (slow, in CI)."""

from __future__ import annotations

import pytest

from eaglectl.commands.requests import Baseline

from .conftest import ROOT
from .helpers import edited, run_json, smoke

TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"
SWA, LAYERS2, AUX4 = (TRAINED / f"field-{n}" for n in ("swa", "layers2", "aux4"))
COUNTED = ("num_drafts", "num_accepted_tokens", "accepted_per_pos")


def full_attention(config: dict) -> None:
    """The same weights with every layer attending fully (what a reader that ignores the window serves)."""
    config["transformer_layer_config"].pop("layer_types")
    config["transformer_layer_config"].pop("sliding_window")


def all_sliding(config: dict) -> None:
    layer = config["transformer_layer_config"]
    layer["layer_types"] = ["sliding_attention"] * layer["num_hidden_layers"]


def counts(doc: dict) -> list[dict]:
    return [{c: r[c] for c in COUNTED} for r in doc["requests"]]


def test_a_sliding_window_drafter_runs_and_passes_the_gate(invoke, tmp_path):
    """inspect names the window; verify and check run the reference (check passes: exit 0); the reference smoke
    runs, and the window bites: the same weights without it accept differently over 64 + 64 tokens."""
    r, doc = run_json(invoke, "inspect", SWA, "--target", TARGET, code=0)
    assert doc["spec"]["sliding_window"] == 24 and "sliding-window" in {f["rule_id"] for f in doc["findings"]}
    assert "window" in invoke("inspect", SWA).stdout
    run_json(invoke, "verify", SWA, "--target", TARGET, code=0)
    r, doc = run_json(invoke, "check", SWA, "--target", TARGET, code=0)
    assert doc["verdict"] == "PASS" and {s["name"]: s["status"] for s in doc["stages"]}["parity"] == "pass"
    windowed = smoke(str(SWA), str(TARGET), engine="reference", k=3, num_prompts=6, max_tokens=64).to_json()
    full = edited(SWA, tmp_path, name="full", config=full_attention)
    plain = smoke(str(full), str(TARGET), engine="reference", k=3, num_prompts=6, max_tokens=64).to_json()
    assert windowed["mean_acceptance_length"] > 1.5  # trained with its window: it drafts well under it
    assert counts(windowed) != counts(plain)


def test_draft_layers_of_mixed_kinds_are_an_error_for_vllm(invoke, tmp_path):
    """speculators `train --num-layers 2 --full-attention-indices 0`: vLLM 0.32's proposer refuses to start
    ("All drafting layers should belong to the same kv cache group"). The reference still runs it (verify), the
    gate fails on the engine's reading, and the same layers all of one kind pass."""
    r, doc = run_json(invoke, "inspect", LAYERS2, "--target", TARGET)
    assert r.exit_code == 1 and "layer-types-mixed" in {f["rule_id"] for f in doc["findings"]}
    assert doc["serve_command"] is None
    run_json(invoke, "verify", LAYERS2, "--target", TARGET, code=0)
    assert run_json(invoke, "check", LAYERS2, "--target", TARGET)[1]["verdict"] == "FAIL"
    sliding = edited(LAYERS2, tmp_path, name="slide", config=all_sliding)
    r, doc = run_json(invoke, "check", sliding, "--target", TARGET, code=0)
    assert doc["verdict"] == "PASS"


def test_drift_and_upgrade_run_a_sliding_window_drafter(invoke, tmp_path):
    d = edited(LAYERS2, tmp_path, name="slide", config=all_sliding)
    r, doc = run_json(invoke, "drift", d, "--target", TARGET, "--num-prompts", "2", "--max-tokens", "32")
    assert r.exit_code in (0, 1), r.stderr  # a verdict on the drafter, not a refusal of it
    out = tmp_path / "up"
    run_json(invoke, "upgrade", d, out, "--target", TARGET, "--init", "calibrated", code=0)
    r, doc = run_json(invoke, "inspect", out, code=0)
    assert doc["spec"]["sliding_layers"] == [0, 1] and doc["spec"]["fc_norm"] is True


def test_a_single_norm_sliding_window_drafter_is_not_upgraded_to_a_double_norm(invoke, tmp_path):
    r = invoke("upgrade", SWA, tmp_path / "up", "--target", TARGET)
    assert r.exit_code == 7 and "norm_before_fc" in r.stderr


def test_a_four_aux_drafter_never_gets_an_ok_the_engine_cannot_load(invoke, tmp_path):
    """fc.weight holds 4 aux states, and the speculators config names the count only where vLLM's speculators
    reader drops it (the top level): vLLM builds fc for 3. inspect errs and prints no serve line; the printed fix
    writes the count where vLLM reads it (transformer_layer_config), and then both runners build fc for 4."""
    r, doc = run_json(invoke, "inspect", AUX4, "--target", TARGET)
    assert r.exit_code == 1 and "aux-count-unsized" in {f["rule_id"] for f in doc["findings"]}
    assert doc["serve_command"] is None and all(x["num_aux"] == 3 for x in doc["engine_readings"])
    r, doc = run_json(invoke, "check", AUX4, "--target", TARGET)
    assert r.exit_code == 1 and doc["verdict"] == "FAIL"
    fix = next(f["hint"] for f in doc["findings"] if f["rule_id"] == "aux-count-unsized")
    to = fix.split("--to ")[1].split()[0]
    run_json(invoke, "convert", AUX4, tmp_path / "fixed", "--to", to, code=0)
    r, doc = run_json(invoke, "inspect", tmp_path / "fixed", "--target", TARGET, code=0)
    assert all(x["num_aux"] == 4 for x in doc["engine_readings"]) and doc["serve_command"]
    run_json(invoke, "check", tmp_path / "fixed", "--target", TARGET, code=0)


def test_the_post_write_check_refuses_a_count_the_engine_would_misread(tmp_path):
    """The backstop behind every conversion: a written config vLLM would build fc wrongly for is refused."""
    import json

    from eaglectl.checkpoint.drafter import open_drafter
    from eaglectl.commands.convert.command import execute, plan_conversion
    from eaglectl.commands.convert.write import check_readings
    from eaglectl.errors import ConversionError

    src = open_drafter(str(AUX4))
    plan = plan_conversion(src, tmp_path / "out", "speculators")
    execute(plan, src)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    del config["transformer_layer_config"]["num_aux_hidden_states"]
    (tmp_path / "out" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match="builds fc for 3 aux states .* but fc.weight holds 4"):
        check_readings(open_drafter(str(tmp_path / "out")), plan, None)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_counts_equal_the_reference_loop_on_the_field_drafters(tmp_path, vllm_py, invoke):
    """One vLLM worker: the single-norm sliding-window drafter, the two-layer one with both layers attending fully
    and with both sliding, and the four-aux one as the printed fix converts it. vLLM 0.32 applies each layer's
    window (llama.py reads layer_types) and builds fc for the count the converted config carries
    (transformer_layer_config.num_aux_hidden_states): its counts equal the reference loop's per request."""
    fixed = tmp_path / "aux4"
    run_json(invoke, "convert", AUX4, fixed, "--to", "speculators", code=0)  # the printed fix
    drafters = {"swa": SWA, "layers2-full": edited(LAYERS2, tmp_path, name="full", config=full_attention),
                "layers2-sliding": edited(LAYERS2, tmp_path, name="slide", config=all_sliding), "aux4": fixed}
    first, *rest = drafters
    rep = smoke(str(drafters[first]), str(TARGET), engine="vllm", k=3, num_prompts=8, max_tokens=64,
                concurrency=(1,), vllm_python=vllm_py,
                baselines=[Baseline(n, "eagle3", str(drafters[n])) for n in rest]).to_json()
    ref = smoke(str(drafters[first]), str(TARGET), engine="reference", k=3, num_prompts=8, max_tokens=64,
                baselines=[Baseline(n, "eagle3", str(drafters[n])) for n in rest]).to_json()
    served = {first: rep, **{b["name"]: b for b in rep["baselines"]}}
    looped = {first: ref, **{b["name"]: b for b in ref["baselines"]}}
    assert set(served) == set(looped) == set(drafters)
    for name in drafters:
        assert counts(served[name]) == counts(looped[name]), name
    # the windows bite: the same two layers accept differently with and without them
    assert counts(looped["layers2-full"]) != counts(looped["layers2-sliding"])


def test_layer_types_shorter_than_the_layers_is_an_error_for_vllm(invoke, tmp_path):
    """vLLM's Llama drafter indexes layer_types by the draft layer and asserts past its end."""
    d = edited(LAYERS2, tmp_path, name="short", config=lambda c: c["transformer_layer_config"].update(
        layer_types=["full_attention"]))
    r, doc = run_json(invoke, "inspect", d)
    assert r.exit_code == 1 and "layer-types-short" in {f["rule_id"] for f in doc["findings"]}
