"""Issue 46 item 4: acceptance from a capture. `capture --max-tokens N` records each prompt's greedy continuation
(prompt and continuation captured in one prefill, with the token ids); `smoke --engine reference --states`,
`upgrade --states` and `inspect --states` replay acceptance from it, count for count what the same commands
measure with the target running."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest

from eaglectl import counters as loads
from eaglectl.measure.target import Target
from eaglectl.measure.workload import heldout_prompts, tokenizer_of

from .conftest import FIXTURES

TRAINED = FIXTURES / "trained"
SOURCE, TARGET = TRAINED / "eagle3", TRAINED / "target"


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """24 prompts of held-out code at a seed nothing else reads, and the target's greedy continuations of them."""
    from click.testing import CliRunner

    from eaglectl.cli.app import cli

    root = tmp_path_factory.mktemp("conts")
    prompts = root / "p.jsonl"
    ps = heldout_prompts(tokenizer_of(str(TARGET)), 24, 48, seed=47)
    prompts.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in ps))
    r = CliRunner().invoke(cli, ["capture", str(TARGET), "--prompts", str(prompts), "--num-prompts", "24",
                                 "--max-tokens", "40", "--drafter", str(SOURCE), "--out", str(root / "c"), "--json"])
    assert r.exit_code == 0, r.output
    return root / "c", prompts, ps


def test_a_capture_holds_the_targets_greedy_continuation_of_each_prompt(captured):
    out, _, ps = captured
    meta = json.loads((out / "capture.json").read_text())
    assert meta["continuation"] == {"max_tokens": 40, "k": 3, "prompt_lengths": [len(p) for p in ps]}
    from_capture = Target.open(None, str(out))
    live = Target.open(str(TARGET))
    ids = (2, 4, 5)
    a = from_capture.continuations(ps[:3], max_tokens=40, k=3, boundaries=ids)
    b = live.continuations(ps[:3], max_tokens=40, k=3, boundaries=ids)
    for x, y in zip(a, b, strict=True):
        assert x.prompt_length == y.prompt_length and x.tokens.tolist() == y.tokens.tolist()
        assert x.aux(ids).shape == y.aux(ids).shape
        assert float((x.aux(ids) - y.aux(ids)).abs().max()) < 1e-4  # one prefill vs the decode's: the same states


def test_smoke_replays_from_the_capture_what_it_measures_with_the_target(captured, invoke):
    out, prompts, _ = captured
    common = ("--engine", "reference", "--num-prompts", 8, "--max-tokens", 40, "--json")
    a = invoke("smoke", SOURCE, "--states", out, *common)
    b = invoke("smoke", SOURCE, "--target", TARGET, "--prompts", prompts, *common)
    assert a.exit_code == 0 and b.exit_code == 0, (a.stderr, b.stderr)
    x, y = json.loads(a.stdout), json.loads(b.stdout)
    assert x["num_drafts"] > 0
    assert [q["num_accepted_tokens"] for q in x["requests"]] == [q["num_accepted_tokens"] for q in y["requests"]]
    assert (x["num_drafts"], x["num_accepted_tokens"], x["per_position_acceptance"]) == \
        (y["num_drafts"], y["num_accepted_tokens"], y["per_position_acceptance"])


def test_upgrade_from_the_capture_prints_the_before_and_after_of_the_target(captured, invoke, tmp_path):
    """Done when: with the same init, `upgrade --states` of a capture of greedy continuations prints the same
    before -> after as `upgrade --target` with the same prompts (the first third reported on)."""
    out, prompts, _ = captured
    common = ("--to", "speculators", "--init", "ones", "--num-prompts", 8, "--max-tokens", 40, "--no-fidelity",
              "--dry-run", "--json")
    a = invoke("upgrade", SOURCE, tmp_path / "a", "--states", out, *common)
    b = invoke("upgrade", SOURCE, tmp_path / "b", "--target", TARGET, "--prompts", prompts, *common)
    assert a.exit_code == 0 and b.exit_code == 0, (a.stderr, b.stderr)
    x, y = json.loads(a.stdout)["acceptance"], json.loads(b.stdout)["acceptance"]
    assert (x["before"], x["after"]) == (y["before"], y["after"]) and x["after"] < x["before"]
    assert x["counts_after"] == y["counts_after"] and x["prompts"]["digest"] == y["prompts"]["digest"]


def test_the_upgrade_from_a_capture_ranks_calibrates_and_reports_on_its_parts(captured, invoke, tmp_path):
    """auto from a capture: every init (fit too) ranked by acceptance on the second third of the requests,
    calibrated and fitted on the last, reported on the first; the printed command replays the figure; the
    capture's continuations are read once."""
    out, _, _ = captured
    dest = tmp_path / "up"
    loads.reset()
    r = invoke("upgrade", SOURCE, dest, "--to", "speculators", "--states", out, "--num-prompts", 8, "--no-fidelity",
               "--json")
    assert r.exit_code == 0, r.stderr
    assert loads.COUNTS["capture_continuations"] == 1 and loads.COUNTS["target_model"] == 0
    doc = json.loads(r.stdout)
    acc = doc["acceptance"]
    assert {c["init"] for c in doc["init_candidates"]} == {"ones", "harmonic", "calibrated", "refit", "fit"}
    assert acc["prompts"]["count"] == 8 and acc["ranked_on"]["count"] == 8
    assert acc["ranked_on"]["digest"] != acc["prompts"]["digest"]
    assert "after the first 16" in doc["statistics"]["text_source"] and "after its first 16" in doc["fit"]["data"]
    again = invoke(*shlex.split(acc["reproduce"])[1:], "--json")
    assert again.exit_code == 0, again.stderr
    got = json.loads(again.stdout)
    assert (got["num_drafts"], got["num_accepted_tokens"]) == (acc["counts_after"]["num_drafts"],
                                                              acc["counts_after"]["num_accepted_tokens"])


def test_inspect_replays_the_loop_on_the_captures_continuations(captured, invoke):
    out, _, _ = captured
    r = invoke("inspect", SOURCE, "--states", out, "--json")
    assert r.exit_code == 0, r.stderr
    candidates = json.loads(r.stdout)["measured"]["aux_convention"]["candidates"]
    assert all(c["acceptance_length"] > 1 for c in candidates)


def test_a_broken_capture_of_continuations_is_refused(captured, invoke, tmp_path):
    out, _, _ = captured
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    meta = json.loads((bad / "capture.json").read_text())
    meta["continuation"]["prompt_lengths"] = meta["continuation"]["prompt_lengths"][:-1]
    (bad / "capture.json").write_text(json.dumps(meta))
    r = invoke("smoke", SOURCE, "--states", bad, "--engine", "reference")
    assert r.exit_code == 19 and "prompt_lengths" in r.stderr and len(r.stderr.strip().splitlines()) <= 2
    meta["continuation"]["prompt_lengths"] = [p - 3 for p in json.loads((out / "capture.json").read_text())[
        "continuation"]["prompt_lengths"]]  # the recorded prompts end early: the rest is not a continuation
    (bad / "capture.json").write_text(json.dumps(meta))
    r = invoke("smoke", SOURCE, "--states", bad, "--engine", "reference")  # as many tokens as the capture holds
    assert r.exit_code == 19 and "capture.json records" in r.stderr
    r = invoke("smoke", SOURCE, "--states", out, "--engine", "reference", "--max-tokens", 64)
    assert r.exit_code == 13 and "--max-tokens 64" in r.stderr
    from safetensors.numpy import load_file, save_file

    shutil.rmtree(bad)
    shutil.copytree(out, bad)
    dump = load_file(str(bad / "00000.safetensors"))
    P = json.loads((out / "capture.json").read_text())["continuation"]["prompt_lengths"][0]
    dump["token_ids"][P + 4: P + 30] = (dump["token_ids"][P + 4: P + 30] + 1) % 300  # not what the target chose
    save_file(dump, str(bad / "00000.safetensors"))
    r = invoke("smoke", SOURCE, "--states", bad, "--engine", "reference")
    assert r.exit_code == 19 and "not a greedy continuation" in r.stderr and "00000.safetensors" in r.stderr


def test_what_a_capture_cannot_do_is_said(captured, invoke, tmp_path):
    out, prompts, _ = captured
    r = invoke("smoke", SOURCE, "--states", out)  # real vLLM cannot run from states
    assert r.exit_code == 2 and "--engine reference" in r.stderr
    r = invoke("capture", TARGET, "--engine", "server", "--server-url", "http://127.0.0.1:9", "--max-tokens", 8,
               "--out", tmp_path / "v")
    assert r.exit_code == 2 and "--engine vllm" in r.stderr and not (tmp_path / "v").exists()
    plain = tmp_path / "plain"
    assert invoke("capture", TARGET, "--prompts", prompts, "--num-prompts", 2, "--out", plain).exit_code == 0
    r = invoke("smoke", SOURCE, "--states", plain, "--engine", "reference")
    assert r.exit_code == 2 and "--max-tokens" in r.stderr


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_captures_its_own_greedy_continuations(captured, invoke, tmp_path, vllm_py):
    """`capture --engine vllm --max-tokens N`: the engine decodes each prompt's continuation itself (its first
    pass's dumps discarded), then captures prompt + continuation; the loop replayed from that capture counts what
    it counts with the target running here (fp32, greedy: vLLM's continuation is the target's)."""
    _, prompts, ps = captured
    out = tmp_path / "v"
    r = invoke("capture", TARGET, "--engine", "vllm", "--vllm-python", vllm_py, "--prompts", prompts,
               "--num-prompts", 3, "--max-tokens", 24, "--layers", "0,2,4,5", "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    meta = json.loads((out / "capture.json").read_text())
    assert meta["continuation"]["prompt_lengths"] == [len(p) for p in ps[:3]]
    assert sorted(f.name for f in out.iterdir()) == ["00000.safetensors", "00001.safetensors", "00002.safetensors",
                                                     "capture.json"]  # nothing of the decoding pass left
    common = ("--engine", "reference", "--num-prompts", 3, "--max-tokens", 24, "--json")
    a = invoke("smoke", SOURCE, "--states", out, *common)
    b = invoke("smoke", SOURCE, "--target", TARGET, "--prompts", prompts, *common)
    assert a.exit_code == 0 and b.exit_code == 0, (a.stderr, b.stderr)
    x, y = json.loads(a.stdout), json.loads(b.stdout)
    assert (x["num_drafts"], x["num_accepted_tokens"]) == (y["num_drafts"], y["num_accepted_tokens"])


def test_the_gate_smokes_a_capture_of_continuations_with_the_reference_loop(captured, invoke):
    """check --states DIR --smoke --engine reference replays the capture (as many tokens as it holds); the engine
    itself cannot run from a capture: undecided (exit 10), never a failure of the drafter."""
    out, _, _ = captured
    r = invoke("check", SOURCE, "--states", out, "--smoke", "--engine", "reference", "--no-card", "--json")
    smoke = next(s for s in json.loads(r.stdout)["stages"] if s["name"] == "smoke")
    alone = json.loads(invoke("smoke", SOURCE, "--states", out, "--engine", "reference", "--json").stdout)
    assert smoke["status"] == "pass" and smoke["data"]["mean_acceptance_length"] == alone["mean_acceptance_length"]
    assert smoke["data"]["max_tokens"] == 40
    r = invoke("check", SOURCE, "--states", out, "--smoke", "--no-card", "--json")
    smoke = next(s for s in json.loads(r.stdout)["stages"] if s["name"] == "smoke")
    assert r.exit_code == 10 and smoke["status"] == "undecided" and "reference loop" in smoke["detail"]
