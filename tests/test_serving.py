"""`convert --for vllm`: the dialect is chosen from the registry and the engine table, the output
inspects clean against its target, and the printed serve line serves the output folder."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from .conftest import DEFECTS, DRAFTERS, TARGET
from .helpers import edited

# source fixture -> the dialect vLLM serves it from best (3.1 flags: HF-style from 0.22, the speculators
# format from 0.25; MLA: only modelopt among vLLM's dialects holds it)
CASES = [("eagle-3", "speculators"), ("specforge-3", "speculators"), ("speculators-qwen3", "speculators"),
         ("specforge-3.1", "modelopt"), ("nemo-3.1", "modelopt"), ("torchspec-3.1", "modelopt"),
         ("modelopt-mla", "modelopt")]


def _serve_args(line: str) -> tuple[str, dict]:
    args = shlex.split(line)
    assert args[:2] == ["vllm", "serve"] and args[3] == "--speculative-config" and len(args) == 5, line
    return args[2], json.loads(args[4])


@pytest.mark.parametrize("fixture,dialect", CASES)
def test_for_vllm_picks_translates_and_prints_the_serve_line(invoke, tmp_path, fixture, dialect):
    out = tmp_path / "served"
    r = invoke("convert", DRAFTERS / fixture, out, "--for", "vllm", "--target", TARGET, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    serve = doc["serve"]
    assert serve["engine"] == "vllm" and serve["dialect"] == dialect == doc["plan"]["dest_dialect"]
    assert all(c["dialect"] in ("eagle", "speculators", "modelopt") for c in serve["candidates"])
    insp = json.loads(invoke("inspect", out, "--target", TARGET, "--json").stdout)
    assert insp["dialect"] == dialect
    warned = {f["rule_id"] for f in insp["findings"] if f["severity"] == "warning"}
    # without --base-model the verifier stays null, which speculators' own loader refuses (a warning for it)
    assert insp["summary"]["error"] == 0 and warned <= {"verifier-unnamed"}, insp["findings"]
    served, spec = _serve_args(serve["command"])
    assert served == os.path.abspath(TARGET)
    assert spec == insp["speculative_config"]  # the same config inspect gives for the written folder
    assert spec["model"] == str(out) and spec["method"] == "eagle3"
    # the human view prints the same line, unbroken, for copying
    human = invoke("convert", DRAFTERS / fixture, tmp_path / "again", "--for", "vllm", "--target", TARGET,
                   "--no-measure").stdout
    line = next(x for x in human.splitlines() if x.startswith("vllm serve "))
    assert _serve_args(line)[1]["model"] == str(tmp_path / "again")


def test_3_1_flags_survive_the_chosen_dialect(invoke, tmp_path):
    out = tmp_path / "o"
    assert invoke("convert", DRAFTERS / "speculators-3.1", out, "--for", "vllm", "--target", TARGET).exit_code == 0
    spec = json.loads(invoke("inspect", out, "--json").stdout)["spec"]
    assert spec["fc_norm"] is True and spec["norm_output"] is True


def test_dry_run_prints_the_line_and_writes_nothing(invoke, tmp_path):
    out = tmp_path / "o"
    r = invoke("convert", DRAFTERS / "eagle-3", out, "--for", "vllm", "--dry-run")
    assert r.exit_code == 0 and not out.exists()
    assert "once written, serve it with:" in r.stdout
    served, spec = _serve_args(next(x for x in r.stdout.splitlines() if x.startswith("vllm serve ")))
    assert served == "<target-model>" and spec["model"] == str(out)


def test_base_model_names_the_served_target_without_one(invoke, tmp_path):
    r = invoke("convert", DRAFTERS / "eagle-3", tmp_path / "o", "--for", "vllm", "--base-model", "org/target",
               "--json")
    assert _serve_args(json.loads(r.stdout)["serve"]["command"])[0] == "org/target"


@pytest.mark.parametrize("args,message", [(["--to", "speculators", "--for", "vllm"], "not both"),
                                          ([], "--to DIALECT or --for ENGINE is required")])
def test_to_or_for(invoke, tmp_path, args, message):
    r = invoke("convert", DRAFTERS / "eagle-3", tmp_path / "o", *args)
    assert r.exit_code == 2 and message in r.output
    assert not (tmp_path / "o").exists()


def test_the_release_a_dialect_needs_is_judged_on_what_its_writer_writes(invoke, tmp_path):
    """A source holding norm_before_fc only in eagle_config needs vLLM 0.22 as it stands; modelopt's writer puts
    the flag at the top level too, which every release with the flag reads, so its output does not."""
    def move(c: dict) -> None:
        c["eagle_config"]["norm_before_fc"] = c.pop("norm_before_fc")

    src = edited(DEFECTS / "norm-before-fc-placement", tmp_path, config=move)
    doc = json.loads(invoke("inspect", src, "--engine-version", "0.21", "--json").stdout)
    assert any("norm_before_fc read from eagle_config" in f["message"] for f in doc["findings"])
    r = invoke("convert", src, tmp_path / "o", "--for", "vllm", "--target", TARGET, "--dry-run", "--json")
    rows = {c["dialect"]: c for c in json.loads(r.stdout)["serve"]["candidates"]}
    assert "norm_before_fc (input_norm before fc)" in rows["modelopt"]["features"]
    assert "norm_before_fc read from eagle_config" not in rows["modelopt"]["features"]


@pytest.mark.parametrize("fixture", ["eagle-3", "specforge-3.1", "modelopt-mla"])
def test_the_pick_does_not_flip_on_base_model_or_target(invoke, tmp_path, fixture):
    """Issue 34: --base-model / --target name the verifier and the served model, never the dialect."""
    picked = set()
    for n, extra in enumerate([[], ["--base-model", "org/target"], ["--target", TARGET]]):
        r = invoke("convert", DRAFTERS / fixture, tmp_path / str(n), "--for", "vllm", "--dry-run", "--json", *extra)
        assert r.exit_code == 0, r.stderr
        serve = json.loads(r.stdout)["serve"]
        picked.add(serve["dialect"])
        assert "chosen on the drafter's features alone" in serve["why"]
    assert len(picked) == 1, picked
