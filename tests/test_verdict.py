"""One verdict across upgrade, verify and check (issue 23 §1): `upgrade && verify DEST --against SOURCE` agrees on
both flag sets, both output dialects, with and without --target, and a real regression still fails verify."""

from __future__ import annotations

import json

import pytest

from .conftest import FIXTURES
from .helpers import edited, inspect_checkpoint

TRAINED = FIXTURES / "trained"
SOURCE = TRAINED / "eagle3"
TARGET = TRAINED / "target"
FLAG_SETS = {"both": [], "fc_norm only": ["--no-norm-output"]}


@pytest.fixture(scope="module")
def upgrades(tmp_path_factory):
    """Each flag set x (--to speculators with the target, the default init | --to specforge without)."""
    from click.testing import CliRunner

    from eaglectl.cli.app import cli

    root, out = tmp_path_factory.mktemp("verdict"), {}
    for label, flags in FLAG_SETS.items():
        for how, extra in (("speculators+target", ["--to", "speculators", "--target", TARGET]),
                           ("specforge", ["--to", "specforge"])):
            dest = root / f"{label.replace(' ', '-')}-{how.replace('+', '-')}"
            r = CliRunner().invoke(cli, ["upgrade", str(SOURCE), str(dest), *map(str, extra), *flags, "--json"],
                                   catch_exceptions=False)
            assert r.exit_code == 0, r.output
            out[label, how] = dest, json.loads(r.stdout)
    return out


@pytest.mark.parametrize("flags", list(FLAG_SETS))
@pytest.mark.parametrize("how", ["speculators+target", "specforge"])
@pytest.mark.parametrize("with_target", [False, True])
def test_upgrade_then_verify_agree(invoke, upgrades, flags, how, with_target):
    dest, up = upgrades[flags, how]
    assert up["warm_start"] == "warm start: fine-tune before publishing"
    prov = json.loads((dest / "config.json").read_text())["eaglectl_provenance"]
    assert set(prov["upgrade_tensors"]) >= {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}
    args = ["verify", dest, "--against", SOURCE] + (["--target", TARGET] if with_target else [])
    r = invoke(*args, "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["passed"] is True and doc["regime"] == "upgrade", r.stdout
    warm = doc["warm_start"]
    assert warm["recorded"] and not warm["problems"] and warm["digests_checked"] == sorted(prov["upgrade_tensors"])
    assert warm["upgrade_steps"] == (["add-fc-norm"] if flags == "fc_norm only" else ["add-fc-norm", "set-norm-output"])
    recorded_on_target = how == "speculators+target"
    if with_target == recorded_on_target:  # verify's inputs are like the upgrade's: bounded by its own record
        assert warm["bounded_by"] == "record" and warm["judged_steps"] == [0, 1, 2]
        for row, bound in zip(doc["per_step"], warm["bounds"], strict=True):
            assert row["passed"] is True and row["kl_mean"] <= bound["kl_mean_max"]
    else:  # the upgrade measured on other inputs: reported, the tensors still checked
        assert warm["judged_steps"] == [] and all(row["passed"] is None for row in doc["per_step"])
        assert ("without --target" if with_target else "with --target") in warm["why"]
    human = invoke(*args)
    assert human.exit_code == 0 and "warm start" in human.stdout and human.stdout.rstrip().endswith("PASS")


@pytest.mark.parametrize("flags", list(FLAG_SETS))
def test_upgrade_ends_with_al_warm_start_and_next_and_check_agrees(invoke, upgrades, tmp_path, flags):
    """Issue 21's ending holds on both flag sets, in JSON and on the card check writes; check passes it."""
    import shutil

    dest, up = upgrades[flags, "speculators+target"]
    acc = up["acceptance"]
    assert up["acceptance_length_before"] == acc["before"] > 0 and up["acceptance_length_after"] == acc["after"] > 0
    assert acc["prompts"]["count"] == 16 and acc["prompts"]["source"] == "builtin:short"  # smoke's defaults
    assert acc["ranked_on"]["source"] == "bundled" and acc["ranked_on"]["digest"] != acc["prompts"]["digest"]
    assert up["next_command"] == f"eaglectl check {dest} --target {TARGET}"
    copy = tmp_path / "d"
    shutil.copytree(dest, copy)
    r = invoke("check", copy, "--target", TARGET, "--card")
    assert r.exit_code == 0, r.stdout + r.stderr
    card = (copy / "README.md").read_text()
    assert f"{acc['before']} -> {acc['after']}" in card and "Warm start: fine-tune before publishing." in card
    assert f"{acc['prompts']['count']} prompts" in card


@pytest.mark.parametrize("with_target", [False, True])
def test_a_corrupted_fc_norm_weight_still_fails(invoke, upgrades, tmp_path, with_target):
    import shutil

    from safetensors.torch import load_file, save_file

    dest, _ = upgrades["both", "specforge"]
    bad = tmp_path / "bad"
    shutil.copytree(dest, bad)
    files = sorted(bad.glob("*.safetensors"))
    for f in files:
        t = load_file(f)
        names = sorted(k for k in t if k.endswith("fc_norm.0.weight"))
        if names:
            t[names[0]] = t[names[0]] * 4.0
            save_file(t, f, metadata={"format": "pt"})
            break
    else:
        pytest.fail(f"no fc_norm tensor in {files}")
    args = ["verify", bad, "--against", SOURCE, "--json"] + (["--target", TARGET] if with_target else [])
    r = invoke(*args)
    doc = json.loads(r.stdout)
    assert r.exit_code == 8 and doc["passed"] is False and doc["regime"] == "upgrade", r.stdout
    assert doc["warm_start"]["mismatched_tensors"] == ["fc_norm.0.weight"]
    assert "not what the upgrade wrote" in r.stderr


# ------------------------------------------------------------------ the serve line never serves wrong layers

TARGET_LLAMA = FIXTURES / "target-llama"


@pytest.mark.parametrize("name, target", [(TRAINED / "eagle3-output", TARGET),
                                          (FIXTURES / "drafters" / "specforge-3", TARGET_LLAMA),
                                          (FIXTURES / "drafters" / "torchspec-3.1", TARGET_LLAMA)])
def test_serve_line_withheld_until_the_printed_fix_ran(invoke, tmp_path, name, target):
    r = invoke("inspect", name)
    assert "vllm serve" not in r.stdout and "no serve command" in r.stdout, r.stdout
    doc = json.loads(invoke("inspect", name, "--json").stdout)
    assert doc["serve_command"] is None and doc["serve_withheld"] and doc["serve_fix"].startswith("eaglectl convert")
    assert doc["serve_fix"] in r.stdout.replace("\n", " ") or doc["serve_fix"] in r.stdout
    # the fix, run as printed (DEST and TARGET filled), gives a report with a serve line that reads the right layers
    dest = tmp_path / "fixed"
    fix = doc["serve_fix"].replace("DEST", str(dest)).replace("TARGET", str(target)).split()
    assert fix[0] == "eaglectl"
    assert invoke(*fix[1:]).exit_code == 0
    after = json.loads(invoke("inspect", dest, "--json").stdout)
    assert after["serve_command"] and not after["serve_withheld"], after["findings"]


def test_the_card_withholds_it_too(tmp_path):
    from eaglectl.commands import card
    from eaglectl.commands import inspect as inspect

    rep = inspect_checkpoint(str(TRAINED / "eagle3-output"))
    assert "vllm serve" not in card._serve(rep, None) and "eaglectl convert" in card._serve(rep, None)


# ------------------------------------------------------------------------------- fixes, engines, provenance

def test_inspect_for_scopes_engine_advice(invoke, tmp_path):
    eagle = FIXTURES / "drafters" / "eagle-3"
    doc = json.loads(invoke("inspect", eagle, "--json").stdout)
    assert "sglang-not-a-draft" not in {f["rule_id"] for f in doc["findings"]}  # a report for vLLM alone
    assert [r["engine"] for r in doc["engine_readings"]] == ["vllm", "vllm"]
    tied = edited(eagle, tmp_path, name="tied", config={"tie_word_embeddings": True})
    other = json.loads(invoke("inspect", tied, "--json").stdout)["other_engine_findings"]
    assert {"rule_id": "tie-word-embeddings", "engine": "sglang", "rule_severity": "warning"} in other
    r = invoke("inspect", eagle, "--for", "sglang", "--json")
    doc = json.loads(r.stdout)
    ids = {f["rule_id"]: f for f in doc["findings"]}
    # SGLang loads a SafeAILab LlamaForCausalLM head as the whole Llama model: no drafter, no launch line
    assert doc["for"] == "sglang" and ids["sglang-not-a-draft"]["severity"] == "error" and r.exit_code == 1
    assert "loads as the model LlamaForCausalLM" in ids["sglang-not-a-draft"]["message"]
    assert ids["method-from-path"]["severity"] == "info" and doc["serve_command"] is None
    assert doc["sglang_serve_command"] is None
    assert [r["engine"] for r in doc["engine_readings"]] == ["vllm", "vllm", "sglang"]
    assert doc["recommendation"]["command"].endswith("--for sglang --target TARGET")
    assert invoke("inspect", eagle, "--for", "trt").exit_code == 2


def test_one_recommendation_per_engine(invoke, tmp_path):
    src = FIXTURES / "drafters" / "specforge-3.1"
    r = invoke("inspect", src)
    lines = r.stdout.splitlines()
    rec = next(i for i, x in enumerate(lines) if x.startswith("for vLLM: "))
    assert rec < next(i for i, x in enumerate(lines) if x == "findings")  # it leads the findings
    cmd = lines[rec].removeprefix("for vLLM: ").replace("DEST", str(tmp_path / "d"))
    cmd = cmd.replace("TARGET", str(TARGET_LLAMA))
    assert invoke(*cmd.split()[1:]).exit_code == 0
    after = invoke("inspect", tmp_path / "d", "--strict")
    assert after.exit_code == 0 and "for vLLM: " not in after.stdout, after.stdout


def test_upgrade_to_specforge_trusts_its_own_norm_output(invoke, tmp_path):
    assert invoke("upgrade", SOURCE, tmp_path / "up", "--to", "specforge").exit_code == 0
    ids = {f["rule_id"] for f in json.loads(invoke("inspect", tmp_path / "up", "--json").stdout)["findings"]}
    assert "specforge-norm-output-window" not in ids and "needs-fine-tuning" in ids
    # a SpecForge 3.1 checkpoint eaglectl did not write keeps the warning
    ids = {f["rule_id"] for f in json.loads(invoke("inspect", FIXTURES / "drafters" / "specforge-3.1",
                                                   "--json").stdout)["findings"]}
    assert "specforge-norm-output-window" in ids


def test_mla_fix_for_vllm_names_a_dialect_that_holds_mla():
    from eaglectl.checkpoint.drafter import open_drafter
    from eaglectl.rules import hint_values

    v = hint_values(open_drafter(str(FIXTURES / "drafters" / "modelopt-mla")))
    assert "--to modelopt" in v["to_vllm"] and "--to modelopt" in v["to_runners"]


def test_nothing_measured_says_why(invoke):
    r = invoke("inspect", FIXTURES / "drafters" / "modelopt-3", "--target", TARGET_LLAMA)
    text = " ".join(r.stdout.split())
    assert "measured nothing:" in text and "the target has no tokenizer" in text, r.stdout


# ------------------------------------------------------------------------------------ fix chains converge

def _chain_fixtures() -> list:
    out = []
    for group in ("drafters", "trained", "defects"):
        for p in sorted((FIXTURES / group).iterdir()):
            if p.is_dir() and (p / "config.json").exists() and not p.name.startswith("target"):
                out.append(p)
    return out


def _target_for(path) -> str:
    if path.parent.name == "trained":
        return str(TRAINED / ("target-mla" if "mla" in path.name else "target"))
    return str(TARGET_LLAMA)


def _first_fix(doc: dict) -> tuple[str, str] | None:
    """The first counting finding whose fix is an eaglectl command that writes DEST; None when the first counting
    finding is an error no conversion repairs (its fix is not a command: the chain ends there)."""
    from eaglectl.rules import RULES
    from eaglectl.text import COMMAND

    first = next((f for f in doc["findings"] if f["severity"] in ("error", "warning")), None)
    if first is not None and first["severity"] == "error" and not RULES[first["rule_id"]].repaired_by_convert:
        assert not (first["hint"] and COMMAND.search(first["hint"])) or " DEST" not in first["hint"], first
        return None
    for f in doc["findings"]:
        if f["severity"] in ("error", "warning") and f["hint"]:
            m = COMMAND.search(f["hint"])
            if m and " DEST" in m.group():
                return f["rule_id"], m.group()
    return None


@pytest.mark.parametrize("path", _chain_fixtures(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fix_chain_converges(invoke, tmp_path, path):
    """Run the printed fix (DEST a tmp folder, TARGET the fixture's target, ORG/NAME a Hub id) until no finding
    has a command that fixes it: at most 3 steps, never the same state twice."""
    target, here, seen, chain = _target_for(path), str(path), set(), []
    pickle = ["--allow-pickle"] if any(path.glob("*.bin")) else []
    for step in range(4):
        r = invoke("inspect", here, "--json", *pickle)
        doc = json.loads(r.stdout) if r.stdout.strip().startswith("{") else None
        if doc is None or "findings" not in doc:
            return  # not an inspectable drafter (the error says why): nothing to chain
        state = (doc["dialect"], tuple(sorted(f["rule_id"] for f in doc["findings"] if f["severity"] != "info")))
        assert state not in seen, f"cycle: {chain}"
        seen.add(state)
        fix = _first_fix(doc)
        if fix is None:
            return
        assert step < 3, f"more than 3 steps: {chain}"
        rule, cmd = fix
        dest = tmp_path / f"step{step}"
        argv = [a.replace("DEST", str(dest)).replace("TARGET", target).replace("ORG/NAME", "acme/target")
                for a in cmd.split()]
        chain.append((rule, " ".join(argv)))
        r = invoke(*argv[1:])
        assert r.exit_code == 0, f"{chain}: {r.stderr}"
        here, pickle = str(dest), []
