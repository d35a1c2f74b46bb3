"""`eaglectl upgrade`: EAGLE-3 -> 3.1 layout, idempotence, conflicts, calibration, provenance."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eaglectl.errors import ConversionError
from eaglectl.io.checkpoint import open_checkpoint

from .conftest import DRAFTERS, TARGET
from .helpers import inspect_checkpoint, smoke
from .helpers import upgrade_run as upgrade


def _canonical_tensors(path):
    from eaglectl.checkpoint.drafter import CanonicalView, probe_of
    from eaglectl.formats import detect

    ck = open_checkpoint(str(path))
    view = CanonicalView(ck, detect(probe_of(ck))[0])
    return {c: view.read(c).tobytes() for c in view.names()}


def test_ones_upgrade_gives_a_clean_3_1_drafter_that_says_it_needs_training(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "speculators-3", tmp_path / "o", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["changed"] and doc["steps"] == ["add-fc-norm", "set-norm-output"] and doc["needs_fine_tuning"]
    rep = inspect_checkpoint(str(tmp_path / "o"))
    assert rep.drafter.spec.eagle_version == "3.1" and rep.exit_code == 0
    assert [f.rule_id for f in rep.findings] == ["needs-fine-tuning"]  # said by inspect too, and fails --strict
    out = open_checkpoint(str(tmp_path / "o"))
    for j in range(3):
        np.testing.assert_array_equal(out.read(f"fc_norm.{j}.weight"), np.ones(32, dtype=np.float32))
    prov = json.loads((tmp_path / "o" / "config.json").read_text())["eaglectl_provenance"]
    assert prov["operation"] == "upgrade" and prov["fc_norm_init"] == "ones" and prov["needs_fine_tuning"] is True
    assert json.loads(out.metadata["eaglectl"]) == prov
    fid = doc["fidelity"]["per_step"]
    assert len(fid) == 3 and all(s["kl_mean"] > 0 for s in fid)  # measured, not assumed


def test_upgrade_is_idempotent(tmp_path):
    first = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "a"))
    again = upgrade(str(tmp_path / "a"), str(tmp_path / "b"))
    assert first.changed and not again.changed and again.steps == [] and again.fidelity is None
    assert "nothing to change" in again.notes[0]
    assert _canonical_tensors(tmp_path / "a") == _canonical_tensors(tmp_path / "b")
    a = json.loads((tmp_path / "a" / "config.json").read_text())
    b = json.loads((tmp_path / "b" / "config.json").read_text())
    a.pop("eaglectl_provenance"), b.pop("eaglectl_provenance")
    assert a == b


def test_3_1_source_changes_nothing(tmp_path):
    res = upgrade(str(DRAFTERS / "specforge-3.1"), str(tmp_path / "o"))
    assert not res.changed
    assert _canonical_tensors(tmp_path / "o") == _canonical_tensors(DRAFTERS / "specforge-3.1")


def test_flags_one_at_a_time(tmp_path):
    res = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "o"), fc_norm=False)
    assert res.steps == ["set-norm-output"]
    assert inspect_checkpoint(str(tmp_path / "o")).drafter.spec.eagle_version == "3.1-norm-output-only"
    # norm_output never touches step 0: the first draft position is unchanged
    assert res.fidelity.metrics[0].kl_mean == 0 and res.fidelity.metrics[1].kl_mean > 0
    res = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "p"), norm_output=False)
    assert res.steps == ["add-fc-norm"]


def test_norm_before_fc_conflict_is_refused_with_a_way_out(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "speculators-norm-before-fc", tmp_path / "o")
    assert r.exit_code == 7 and "normalise twice" in r.stderr and "--no-fc-norm" in r.stderr
    assert invoke("upgrade", DRAFTERS / "speculators-norm-before-fc", tmp_path / "o", "--no-fc-norm").exit_code == 0


def test_safeailab_source_needs_a_3_1_capable_destination(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "eagle-3", tmp_path / "o")
    assert r.exit_code == 7 and "cannot record fc_norm" in r.stderr and "--to speculators" in r.stderr
    r = invoke("upgrade", DRAFTERS / "eagle-3", tmp_path / "s", "--to", "speculators", "--target", TARGET, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["plan"]["dest_dialect"] == "speculators"


@pytest.mark.parametrize("init", ["harmonic", "calibrated", "refit"])
def test_calibrated_inits_need_a_target(tmp_path, init):
    with pytest.raises(ConversionError, match="--target"):
        upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "o"), init=init)


def test_calibration_preserves_the_fc_output_better_than_ones(tmp_path):
    cal = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "c"), init="calibrated", target=str(TARGET))
    ref = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "r"), init="refit", target=str(TARGET))
    har = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "h"), init="harmonic", target=str(TARGET))
    s = cal.statistics
    assert s["tokens"] > 1000 and s["sink_excluded"] and len(s["rms_mean"]) == 3
    # least squares over gamma can only beat gamma = 1; a free refit of fc can only beat a diagonal
    assert s["fc_output_relative_error"] < 0.5 * s["fc_output_relative_error_ones"]
    assert ref.statistics["fc_output_relative_error"] <= s["fc_output_relative_error"] + 1e-9
    gamma = open_checkpoint(str(tmp_path / "h")).read("fc_norm.0.weight")
    assert np.allclose(gamma, har.statistics["rms_harmonic_mean"][0], rtol=1e-2)
    # refit changes fc.weight and keeps fc_norm at one
    out = open_checkpoint(str(tmp_path / "r"))
    assert np.all(out.read("fc_norm.1.weight") == 1)
    assert not np.array_equal(out.read("fc.weight"), open_checkpoint(str(DRAFTERS / "speculators-3")).read("fc.weight"))
    # calibrated step-0 output stays closer to the source than ones does (fc_norm only touches step 0 inputs)
    ones = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "o"), norm_output=False)
    cal0 = upgrade(str(DRAFTERS / "speculators-3"), str(tmp_path / "c0"), norm_output=False, init="calibrated",
                   target=str(TARGET))
    assert cal0.fidelity.metrics[0].kl_mean < ones.fidelity.metrics[0].kl_mean


def test_dry_run_writes_nothing(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "speculators-3", tmp_path / "o", "--dry-run", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["dry_run"] and not (tmp_path / "o").exists()
    assert [t["dest"] for t in doc["plan"]["tensors"] if t["action"] == "derive"] == [
        "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"]


def test_human_output(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "specforge-3", tmp_path / "o", "--init", "calibrated", "--target", TARGET)
    assert r.exit_code == 0
    for part in ("add-fc-norm, set-norm-output", "fine-tune", "FC output relative error", "fidelity to the source"):
        assert part in r.stdout


# ------------------------------------------------------------------ acceptance before / after, prompts, fit

TRAINED = DRAFTERS.parent / "trained"
TRAINED_TARGET = TRAINED / "target"


def _prompt_file(tmp_path, count=6, length=48, seed=41):
    """Prompts the tool never ranks, fits or calibrates on (held-out code windows at another seed)."""
    from eaglectl.measure.workload import heldout_prompts, tokenizer_of

    path = tmp_path / "prompts.jsonl"
    ps = heldout_prompts(tokenizer_of(str(TRAINED_TARGET)), count, length, seed=seed)
    path.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in ps))
    return path


def test_with_prompts_the_reported_al_is_the_loop_on_those_prompts(invoke, tmp_path):
    """`--prompts P`: the AL before / after is the reference loop's on the first part of P with each checkpoint
    read as vLLM reads its files, which is what `smoke --prompts P --num-prompts N` (the printed next command)
    measures on the source and on DEST, count for count; the inits are ranked on the next part of P and
    calibrated on the rest, never on what is reported."""
    prompts = _prompt_file(tmp_path, count=18)
    dest = tmp_path / "up"
    r = invoke("upgrade", TRAINED / "eagle3", dest, "--to", "speculators", "--target", TRAINED_TARGET, "--init",
               "auto", "--prompts", prompts, "--num-prompts", "6", "--max-tokens", "40", "--no-fidelity", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    acc = doc["acceptance"]
    assert acc["prompts"]["given"] and acc["prompts"]["count"] == 6 and acc["prompts"]["digest"].startswith("sha256:")
    lines = prompts.read_text().splitlines()
    assert acc["prompts"]["digest"] == _digest(lines[:6]) and acc["ranked_on"]["digest"] == _digest(lines[6:12])
    assert acc["ranked_on"]["given"] and {c["worst_kind"] for c in doc["init_candidates"]} == {None}
    assert "and 6 of your prompts" in doc["statistics"]["text_source"]  # calibration: the rest of P
    assert "and 6 of your prompts" in doc["fit"]["data"]
    assert acc["interval"] is None  # the user's own prompts: the figure itself, not an estimate of it
    assert doc["acceptance_length_before"] == acc["before"] and doc["acceptance_length_after"] == acc["after"]
    assert acc["source_boundary_ids"] == acc["dest_boundary_ids"] == [2, 4, 5]
    assert any("replay to AL" in c for c in doc["checked"])  # the written files, read back
    assert doc["next_command"] == (f"eaglectl smoke {dest} --target {TRAINED_TARGET} --prompts {prompts} "
                                   "--num-prompts 6 --max-tokens 40")
    import shlex

    after = invoke(*shlex.split(doc["next_command"])[1:], "--engine", "reference", "--json")
    before = invoke("smoke", TRAINED / "eagle3", "--target", TRAINED_TARGET, "--prompts", prompts, "--num-prompts",
                    "6", "--max-tokens", "40", "--engine", "reference", "--json")
    assert after.exit_code == 0 and before.exit_code == 0, (after.stderr, before.stderr)
    a, b = json.loads(after.stdout), json.loads(before.stdout)
    assert (a["num_drafts"], a["num_accepted_tokens"]) == (acc["counts_after"]["num_drafts"],
                                                           acc["counts_after"]["num_accepted_tokens"])
    assert (b["num_drafts"], b["num_accepted_tokens"]) == (acc["counts_before"]["num_drafts"],
                                                           acc["counts_before"]["num_accepted_tokens"])
    assert round(a["mean_acceptance_length"], 4) == acc["after"]
    assert round(b["mean_acceptance_length"], 4) == acc["before"]
    prov = json.loads((dest / "config.json").read_text())["eaglectl_provenance"]
    assert prov["needs_fine_tuning"] is True and prov["acceptance"]["after"] == acc["after"]
    assert prov["acceptance"]["prompts"]["digest"] == acc["prompts"]["digest"]


def _digest(lines):
    import hashlib

    ids = [json.loads(line)["prompt_token_ids"] for line in lines]
    return "sha256:" + hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode()).hexdigest()


def test_too_few_prompts_of_yours_are_reported_on_and_the_ranking_says_where_it_ran(invoke, tmp_path):
    """Two prompts cannot be split three ways: both are reported on, the inits are ranked on the bundled kinds,
    and the report says so."""
    prompts = _prompt_file(tmp_path, count=2)
    r = invoke("upgrade", TRAINED / "eagle3", tmp_path / "up", "--to", "speculators", "--target", TRAINED_TARGET,
               "--init", "calibrated", "--prompts", prompts, "--max-tokens", "24", "--no-fidelity", "--dry-run",
               "--json")
    assert r.exit_code == 0, r.stderr
    acc = json.loads(r.stdout)["acceptance"]
    assert acc["prompts"]["count"] == 2 and "too few to hold any out" in acc["prompts"]["description"]
    assert not acc["ranked_on"]["given"] and acc["ranked_on"]["source"] == "bundled"
    assert json.loads(r.stdout)["next_command"].endswith(f"--prompts {prompts} --max-tokens 24")  # both of them


def test_default_upgrade_ends_with_al_interval_warm_start_and_a_next_command_that_runs(invoke, tmp_path):
    """Without --prompts: the bundled prompts are named, with a bootstrap interval; the output ends with
    AL before -> after, 'warm start' and the next command; `fit` is a measured candidate; the card that
    `check --card` writes carries the same figures."""
    dest = tmp_path / "up"
    r = invoke("upgrade", TRAINED / "eagle3", dest, "--to", "speculators", "--target", TRAINED_TARGET,
               "--no-norm-output", "--no-fidelity")
    assert r.exit_code == 0, r.stderr
    tail = r.stdout.strip().splitlines()
    text = " ".join(r.stdout.split())  # the human view wraps at the terminal width
    assert "acceptance length" in text and "->" in text and "smoke's default prompts, never ranked on" in text
    assert "95% bootstrap interval" in text and "warm start: fine-tune before publishing" in text
    reproduce = f"eaglectl smoke {dest} --target {TRAINED_TARGET}"  # the command that measures it, whole
    assert reproduce in [t.strip() for t in tail]
    assert tail[-2] == "next:" and tail[-1].strip() == f"eaglectl check {dest} --target {TRAINED_TARGET}"
    # the figure is for the bundled text: the same upgrade, on the user's own prompts, as it runs when pasted
    assert (f"eaglectl upgrade {TRAINED / 'eagle3'} {dest} --no-norm-output --target {TRAINED_TARGET} --prompts "
            "YOUR.jsonl --to speculators --no-fidelity --force") in [t.strip() for t in tail]
    prov = json.loads((dest / "config.json").read_text())["eaglectl_provenance"]
    acc = prov["acceptance"]
    lo, hi = acc["interval"]["after"]
    assert lo <= acc["after"] <= hi and acc["interval"]["kept"][0] <= acc["kept"] <= acc["interval"]["kept"][1]
    assert acc["prompts"]["given"] is False and acc["prompts"]["count"] == 16
    assert acc["prompts"]["source"] == "builtin:short"  # reported on smoke's default prompts ...
    r2 = invoke("upgrade", TRAINED / "eagle3", tmp_path / "again", "--to", "speculators", "--target", TRAINED_TARGET,
                "--no-norm-output", "--no-fidelity", "--dry-run", "--json")
    doc = json.loads(r2.stdout)
    ranked, reported = doc["acceptance"]["ranked_on"], doc["acceptance"]["prompts"]
    assert ranked["digest"] != reported["digest"] == acc["prompts"]["digest"]  # ... not on those that ranked
    fit = next(c for c in doc["init_candidates"] if c["init"] == "fit")
    assert fit["acceptance_kept"] > 0 and doc["fit"]["steps"] > 0 and doc["fit"]["tokens"] > 500
    assert doc["fit"]["heldout_chain_after"] >= doc["fit"]["heldout_chain_before"]  # fit keeps its best check
    best_closed = max(c["acceptance_kept"] for c in doc["init_candidates"] if c["init"] != "fit")
    assert (doc["init"] == "fit") == (fit["acceptance_kept"] > best_closed)  # fit only when it beats them
    assert doc["acceptance_length_after"] == acc["after"]  # deterministic: the same run, the same figure
    card = invoke("check", dest, "--card")
    assert card.exit_code in (0, 1), card.stderr
    readme = (dest / "README.md").read_text()
    assert f"{acc['before']} -> {acc['after']}" in readme and "Warm start: fine-tune before publishing" in readme
    assert "prompts bundled with eaglectl" in readme and "needs EAGLE-3.1" in readme


def test_ranking_calibration_and_report_read_disjoint_windows():
    """What an upgrade reports on (smoke's default prompts) is never what it ranked the inits on or calibrated
    and fitted on: the held-out windows of the three roles do not overlap, at any prompt count; with nothing to
    avoid the windows are the ones they always were (smoke's prompts unchanged)."""
    import random

    from eaglectl.commands.upgrade.fidelity import SMOKE_SEED, ranking_spans, reserved_spans, smoke_spans
    from eaglectl.measure.workload import _heldout_text, heldout_spans

    size = len(_heldout_text())
    rng = random.Random(SMOKE_SEED)
    assert smoke_spans(16) == [(s, s + 512) for s in (rng.randrange(0, size - 512) for _ in range(16))]
    for n in (1, 16, 40):
        rep, rank = smoke_spans(n), ranking_spans(n)
        cal = heldout_spans(32, 64, 5, avoid=reserved_spans(n))
        for a, b in ((rep, rank), (rep, cal), (rank, cal)):
            assert not [(x, y) for x in a for y in b if x[0] < y[1] and y[0] < x[1]]
        assert len(rank) == n and len(cal) == 32


def test_prompts_need_a_runnable_target(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "speculators-3", tmp_path / "o", "--prompts", "builtin:short")
    assert r.exit_code == 2 and "--prompts" in r.stderr and "--target" in r.stderr
    assert not (tmp_path / "o").exists()


def test_fit_is_deterministic_and_moves_only_fc_norm():
    """Two fits on the same states give the same bytes; only the fc_norm weights change (fc.weight only with
    fit_fc); the kept parameters never have a worse held-out loss than the start."""
    import torch

    from eaglectl.checkpoint.drafter import open_drafter
    from eaglectl.commands.upgrade import fitting
    from eaglectl.measure.target import Target
    from eaglectl.measure.workload import heldout_prompts
    from eaglectl.model.loader import load_reference

    t = Target.open(str(TRAINED_TARGET))
    loaded = load_reference(open_drafter(str(TRAINED / "eagle3")))
    conts = t.continuations(heldout_prompts(t.model().tokenizer, 4, 32, seed=77), max_tokens=32, k=3,
                            boundaries=(2, 4, 5))
    seqs = fitting.from_continuations(conts, (2, 4, 5))
    assert seqs[0].soft is not None and seqs[0].labels.shape == (3, 32)
    start = ([np.ones(128, dtype=np.float32)] * 3, None)
    table = t.model().embedding().float()
    runs = [fitting.fit_fc_norm(loaded, start, {"fc_norm": True, "norm_output": True}, seqs, embed=table,
                                start_name="ones", data="test", max_steps=9) for _ in range(2)]
    (g1, fc1, rep1), (g2, fc2, rep2) = runs
    assert all(np.array_equal(a, b) for a, b in zip(g1, g2, strict=True)) and fc1 is None and fc2 is None
    assert rep1.heldout_loss_after <= rep1.heldout_loss_before and rep1.parameters == 3 * 128
    assert any(not np.array_equal(g, np.ones(128)) for g in g1) or rep1.best_step == 0
    assert torch.equal(loaded.tensors["fc.weight"], load_reference(open_drafter(str(TRAINED / "eagle3"))).tensors[
        "fc.weight"])  # the loaded drafter is untouched
    _, fc3, rep3 = fitting.fit_fc_norm(loaded, start, {"fc_norm": True, "norm_output": True}, seqs, embed=table,
                                       start_name="ones", data="test", fit_fc=True, max_steps=3)
    assert fc3 is not None and rep3.parameters == 3 * 128 + 128 * 384 and rep3.fc


@pytest.mark.vllm
@pytest.mark.slow
def test_upgrade_figure_is_what_vllm_measures_on_prompts_the_ranking_never_saw(tmp_path, vllm_py):
    """A default upgrade (no --prompts) ranks the inits on one set of held-out windows and reports the AL on
    smoke's default prompts; real vLLM running the printed `reproduce` command on DEST measures exactly the
    reported AL after the upgrade (and, on the source, the AL before), inside the printed interval."""
    import shlex

    dest = tmp_path / "up"
    res = upgrade(str(TRAINED / "eagle3"), str(dest), target=str(TRAINED_TARGET), to="speculators",
                  fidelity=False).to_json()
    acc = res["acceptance"]
    assert acc["ranked_on"]["digest"] != acc["prompts"]["digest"]
    args = shlex.split(acc["reproduce"])
    assert args == ["eaglectl", "smoke", str(dest), "--target", str(TRAINED_TARGET)]  # smoke's defaults
    for drafter, counts, al in ((str(dest), acc["counts_after"], acc["after"]),
                                (str(TRAINED / "eagle3"), acc["counts_before"], acc["before"])):
        rep = smoke(drafter, str(TRAINED_TARGET), engine="vllm", concurrency=(1,), vllm_python=vllm_py).to_json()
        assert (rep["num_drafts"], rep["num_accepted_tokens"]) == (counts["num_drafts"],
                                                                   counts["num_accepted_tokens"])
        assert round(rep["mean_acceptance_length"], 4) == al
    lo, hi = acc["interval"]["after"]
    assert lo <= acc["after"] <= hi


@pytest.mark.vllm
@pytest.mark.slow
def test_upgrade_with_prompts_prints_exactly_what_vllm_measures_on_them(tmp_path, vllm_py):
    """`upgrade --prompts P` then real vLLM on DEST with P: the AL after the upgrade that upgrade printed is
    vLLM's, count for count (greedy fp32; the reference loop's counts equal vLLM's)."""
    
    python = vllm_py
    prompts = _prompt_file(tmp_path, count=24, length=64, seed=43)  # 8 reported on, 8 ranked on, 8 calibrated on
    dest = tmp_path / "up"
    res = upgrade(str(TRAINED / "eagle3"), str(dest), target=str(TRAINED_TARGET), to="speculators",
                  prompts=str(prompts), num_prompts=8, max_tokens=48, fidelity=False).to_json()
    rep = smoke(str(dest), str(TRAINED_TARGET), engine="vllm", k=3, prompts=str(prompts), num_prompts=8,
                max_tokens=48, concurrency=(1,), vllm_python=python).to_json()
    after = res["acceptance"]["counts_after"]
    assert (rep["num_drafts"], rep["num_accepted_tokens"]) == (after["num_drafts"], after["num_accepted_tokens"])
    assert round(rep["mean_acceptance_length"], 4) == res["acceptance_length_after"]
    assert not rep["red_flags"]


def test_a_safeailab_upgrade_is_no_worse_on_strict_and_says_how_to_measure(invoke, tmp_path):
    """Issue 34: the upgrade of a SafeAILab head adds no warning its source lacked but the warm start's own (the
    source stores no aux ids: still the info it was); without a target, `ones` says which commands measure a
    better init, as they run; -q prints the acceptance length kept and "warm start"."""
    src = DRAFTERS / "eagle-3"

    def severities(path):
        return {f["rule_id"]: f["severity"] for f in json.loads(invoke("inspect", path, "--json").stdout)["findings"]}

    out = tmp_path / "u"
    r = invoke("upgrade", src, out, "--to", "speculators", "--base-model", "org/name", "--no-fidelity")
    assert r.exit_code == 0, r.stderr
    before, after = severities(src), severities(out)
    assert after.get("aux-ids-implicit") == "info" and "aux-ids-missing" not in after, after
    added = {k for k, v in after.items() if v == "warning"} - {k for k, v in before.items() if v == "warning"}
    assert added <= {"needs-fine-tuning"}, added
    assert "eaglectl capture TARGET --out DIR," in r.stdout
    assert f"eaglectl upgrade {src} {out} --to speculators --base-model org/name --force --states DIR" in r.stdout
    q = invoke("-q", "upgrade", TRAINED / "eagle3", tmp_path / "q", "--to", "speculators", "--base-model", "org/n",
               "--target", TRAINED / "target", "--init", "ones", "--no-fidelity")
    assert q.exit_code == 0 and "acceptance length" in q.stdout and "kept" in q.stdout, q.stdout
    assert "warm start" in q.stdout
