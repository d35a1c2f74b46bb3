"""Open once, load once, run once: the replayed loop equals the live one, and every command with a target
loads it once, reads the drafter into fp32 once, and decodes each prompt once."""

from __future__ import annotations

import json
import time

import pytest
import torch

from eaglectl import counters as loads
from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.measure.target import Target
from eaglectl.measure.workload import heldout_prompts
from eaglectl.model.loader import load_reference
from eaglectl.model.replay import replay

from .conftest import ROOT
from .specloop import speculative_generate

TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"


@pytest.mark.parametrize(("name", "target"), [("eagle3", "target"), ("eagle3-output", "target"),
                                              ("eagle3.1", "target"), ("eagle3.1-mla", "target-mla")])
def test_replay_on_greedy_continuations_equals_the_live_loop(name, target):
    """The replay (one decode, then teacher-forced chains walked as vLLM counts) and the live speculative loop
    (draft, verify, advance) are two implementations of the same counts: drafts, accepted, per position, per
    request and the outputs, for every reading (here also one with the ids one layer early)."""
    t = Target.open(str(TRAINED / target))
    hf = t.model()
    prompts = heldout_prompts(hf.tokenizer, 3, 48, seed=11) + heldout_prompts(hf.tokenizer, 2, 40, seed=12)
    loaded = load_reference(open_drafter(str(TRAINED / name)))
    drafter = loaded.build(torch.float32, "cpu")
    embed = None if loaded.has_embed else hf.embedding().float()
    ids = loaded.spec.capture_ids(hf.num_layers)
    for reading in (ids, tuple(i - 1 for i in ids)):
        live = speculative_generate(hf, drafter, prompts, k=3, max_tokens=40, aux_ids=reading, embed=embed)
        conts = t.continuations(prompts, max_tokens=40, k=3, boundaries=reading)
        replayed = replay(drafter, conts, aux_ids=reading, embed=embed)
        assert [r.row() for r in replayed.per_request] == [r.row() for r in live.per_request], reading
        assert replayed.outputs == live.outputs  # the loop's output is the target's greedy continuation
        assert (replayed.num_drafts, replayed.num_accepted_tokens, replayed.accepted_per_pos) == \
            (live.num_drafts, live.num_accepted_tokens, live.accepted_per_pos)
        assert replayed.num_drafts > 0


def test_a_chain_window_drafts_what_the_whole_run_drafts():
    """`Drafter.run(anchors=...)` gives exactly the rows of the full run for the anchors it keeps."""
    loaded = load_reference(open_drafter(str(TRAINED / "eagle3.1")))
    drafter = loaded.build(torch.float32, "cpu")
    g = torch.Generator().manual_seed(0)
    aux = torch.randn(1, 40, loaded.args.num_aux * loaded.args.target_hidden_size, generator=g)
    tokens = torch.randint(3, 300, (1, 43), generator=g)
    embed = torch.randn(320, loaded.args.hidden_size, generator=g)
    full = drafter.run(aux, tokens, 3, embed=embed)
    part = drafter.run(aux, tokens, 3, embed=embed, anchors=slice(17, 29))
    for a, b in zip(full, part, strict=True):
        assert torch.equal(a.target_ids[:, 17:29], b.target_ids)
        torch.testing.assert_close(a.logits[:, 17:29], b.logits, rtol=0, atol=1e-5)


def test_continuations_are_decoded_once_and_reused(tmp_path):
    t = Target.open(str(TARGET))
    tok = t.model().tokenizer
    prompts = heldout_prompts(tok, 4, 64, seed=0)
    loads.reset()
    t.continuations(prompts, max_tokens=64, k=3, boundaries=(2, 4, 5))
    t.continuations(prompts[:2], max_tokens=32, k=3, boundaries=(2, 4, 5))  # shorter: a cut of the same decode
    t.continuations(prompts, max_tokens=64, k=3, boundaries=(3, 5, 6))  # new boundaries: states, no decoding
    assert loads.COUNTS["target_continuations"] == 1 and loads.COUNTS["target_prompts_decoded"] == 4
    assert loads.COUNTS["target_continuation_states"] == 1 and loads.COUNTS["target_model"] == 0  # loaded above


def _loads(invoke, *args, exit_code=0):
    loads.reset()
    started = time.perf_counter()
    r = invoke(*[str(a) for a in args], "--json")
    assert r.exit_code == exit_code, (r.stdout[-2000:], r.stderr[-2000:])
    return dict(loads.COUNTS), json.loads(r.stdout), time.perf_counter() - started


def test_each_command_loads_the_target_once(invoke, tmp_path):
    """Counted per command: drafters interpreted, fp32 reads, target configs opened, HF loads, forward passes
    over the text, continuation batches and the prompts decoded in them (a prompt is decoded once)."""
    src = TRAINED / "eagle3-output"
    # output-numbered ids: SGLang (the consumer of this SpecForge layout) reads them right, vLLM one layer early
    counts, doc, _ = _loads(invoke, "inspect", src, "--target", TARGET)
    assert doc["measured"]["aux_convention"]["boundary_ids"] == [3, 5, 6]
    assert counts == {"drafter": 1, "drafter_fp32": 1, "target_config": 1, "target_model": 1, "target_text": 1,
                      "target_continuations": 1, "target_prompts_decoded": 4}

    counts, doc, _ = _loads(invoke, "convert", src, tmp_path / "c", "--to", "speculators", "--target", TARGET)
    assert any("drafts exactly like the source" in line for line in doc["checked"])
    # the output is interpreted once (checked, then replayed) and read into fp32 once
    assert counts == {"drafter": 2, "drafter_fp32": 2, "target_config": 1, "target_model": 1, "target_text": 1,
                      "target_continuations": 1, "target_prompts_decoded": 4}

    counts, doc, _ = _loads(invoke, "upgrade", TRAINED / "eagle3", tmp_path / "u", "--to", "speculators",
                            "--target", TARGET)
    assert doc["init_candidates"] and doc["fidelity"] is not None and doc["acceptance_length_after"]
    # 32 ranking prompts (8 of each kind of text), the 16 reported on (smoke's default prompts), the 32 of the
    # by-kind report (its 8 code windows are smoke's first 8) and the 32 that calibration and `fit` read, decoded
    # together: 104 distinct prompts
    assert counts == {"drafter": 2, "drafter_fp32": 2, "target_config": 1, "target_model": 1, "target_text": 1,
                      "target_continuations": 1, "target_prompts_decoded": 104}

    counts, doc, _ = _loads(invoke, "check", TRAINED / "eagle3", "--target", TARGET, "--no-card")
    assert [s["status"] for s in doc["stages"]][:2] == ["pass", "pass"]
    assert counts == {"drafter": 1, "drafter_fp32": 1, "target_config": 1, "target_model": 1, "target_text": 1,
                      "target_continuations": 1, "target_prompts_decoded": 4}

    counts, doc, _ = _loads(invoke, "smoke", TRAINED / "eagle3.1", "--target", TARGET, "--engine", "reference",
                            "--baseline", f"none,{TRAINED / 'eagle3'}")
    assert doc["num_drafts"] and doc["baselines"][1]["num_drafts"]
    assert counts == {"drafter": 2, "drafter_fp32": 2, "target_config": 1, "target_model": 1,
                      "target_continuations": 1, "target_prompts_decoded": 16}

    counts, doc, _ = _loads(invoke, "verify", TRAINED / "eagle3.1", "--target", TARGET)
    assert counts == {"drafter": 1, "drafter_fp32": 1, "target_config": 1, "target_model": 1, "target_text": 1}


def test_a_refused_destination_costs_no_measurement(invoke, tmp_path):
    """Everything that needs no measurement is refused before the target is touched."""
    link = tmp_path / "link"
    link.symlink_to(TRAINED / "eagle3")
    for cmd in (["convert", link, TRAINED / "eagle3", "--to", "speculators"],
                ["upgrade", link, TRAINED / "eagle3", "--to", "speculators"]):
        loads.reset()
        started = time.perf_counter()
        r = invoke(*[str(a) for a in cmd], "--target", str(TARGET), "--force")
        assert r.exit_code == 23 and "overlaps the source" in r.stderr, r.stderr
        assert loads.COUNTS["target_model"] == 0 and time.perf_counter() - started < 5
