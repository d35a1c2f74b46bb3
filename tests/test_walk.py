"""The fourth new-user walk (issue 47): a command printed after a run runs as printed, a failed stage names its
number, nothing slow runs before a check that could come first, and no warning on stderr is another library's."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from eaglectl.measure.parity import StepMetrics, breaches

from .conftest import DRAFTERS, FIXTURES, ROOT
from .helpers import edited
from .test_ux_errors import _filled, _parse, _printed

TRAINED = FIXTURES / "trained"
SMALL = FIXTURES / "target-llama"


def _longrope(tmp_path: Path) -> Path:
    """A clean drafter whose RoPE type the reference drafter does not run (vLLM does): eaglectl's limit."""
    return edited(DRAFTERS / "speculators-3.1", tmp_path, name="longrope", config=lambda c: c[
        "transformer_layer_config"].update(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 4,
                                                          "long_factor": [1.0] * 4,
                                                          "original_max_position_embeddings": 128}))


def test_an_upgrade_note_reruns_onto_the_dest_it_wrote(invoke, tmp_path):
    """The no-target upgrade says how to measure: each re-run line names the DEST it has just written, so it carries
    --force, and no command has punctuation glued to it."""
    out = tmp_path / "out"
    r = invoke("upgrade", TRAINED / "eagle3", out, "--to", "specforge", "--no-fidelity")
    assert r.exit_code == 0, r.stderr
    text = r.stdout + r.stderr
    again = [c for c in _printed(text) if c.startswith("eaglectl upgrade")]
    assert len(again) == 2 and "TARGET;" not in text and "DIR;" not in text, text
    (tmp_path / "states").mkdir()
    for command in again:
        args = _filled(command, TRAINED / "eagle3", TRAINED / "target", tmp_path)
        assert "--force" in args and str(out) in args, command
        assert _parse(args) is None, (command, _parse(args))
    (with_target,) = [c for c in again if "TARGET" in c]
    args = _filled(with_target, TRAINED / "eagle3", TRAINED / "target", tmp_path)
    rerun = invoke(*args, "--no-fidelity", "--init", "ones")  # as printed, where DEST now exists
    assert rerun.exit_code == 0, rerun.stderr


def test_a_reference_limit_names_the_command_that_measures_this_drafter(invoke, tmp_path):
    src = _longrope(tmp_path)
    r = invoke("verify", src, "--target", SMALL)
    assert r.exit_code == 13 and f"eaglectl smoke {src} --target {SMALL} --engine vllm" in r.stderr, r.stderr
    r = invoke("check", src, "--target", SMALL, "--no-card", "--json")
    parity = {s["name"]: s for s in json.loads(r.stdout)["stages"]}["parity"]
    assert r.exit_code == 10 and parity["status"] == "undecided", r.stdout
    assert f"eaglectl smoke {src} --target {SMALL} --engine vllm" in parity["detail"]


def test_a_to_engine_hint_keeps_the_paths_given(invoke, tmp_path):
    r = invoke("convert", DRAFTERS / "eagle-3", tmp_path / "out dir", "--to", "vllm")
    want = f"eaglectl convert {DRAFTERS / 'eagle-3'} {shlex.quote(str(tmp_path / 'out dir'))} --for vllm"
    assert r.exit_code == 2 and want in r.stderr, r.stderr
    assert "SOURCE" not in r.stderr and "DEST" not in r.stderr.split("hint:", 1)[1]


def test_a_failed_parity_stage_names_the_metric_its_limit_and_the_step(invoke, tmp_path):
    def nan(state: dict) -> None:
        name = next(k for k in state if "down_proj" in k)
        state[name] = state[name].clone()
        state[name][0, 0] = float("nan")

    src = edited(DRAFTERS / "speculators-3.1", tmp_path, name="nan", tensors=nan)
    r = invoke("check", src, "--target", SMALL, "--no-card", "--json")
    parity = {s["name"]: s for s in json.loads(r.stdout)["stages"]}["parity"]
    assert r.exit_code == 1 and parity["status"] == "fail"
    assert re.search(r"failed step 0: logits_max_abs nan > 0", parity["detail"]), parity["detail"]
    m = StepMetrics(2, 0.1, 0.1, 0.1, 0.1, 0.0, 0.0, 1e-4, 1e-3, 1.0, 32, 0, None, passed=False)
    assert breaches(m, "low-precision") == ["state_cos_mean 0.000 < 0.999"]
    assert breaches(StepMetrics(0, 0, 0, 0, 0, 1, 1, float("nan"), 0, 1, 1, 0, None, False), "upgrade") == [
        "KL mean nan > 1e-01"]


def test_identical_states_agree_even_when_zero(invoke, tmp_path):
    """Both runs feed back the same all-zero state (a zero final norm): parity passes; the defect is not a
    difference between bf16 and fp32."""
    src = edited(DRAFTERS / "speculators-3.1", tmp_path, name="zero", tensors=lambda s: s.update(
        {"norm.weight": s["norm.weight"] * 0}))
    r = invoke("check", src, "--target", SMALL, "--no-card", "--json")
    assert {s["name"]: s["status"] for s in json.loads(r.stdout)["stages"]}["parity"] == "pass", r.stdout


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs sysfs, where no one creates folders")
@pytest.mark.parametrize("command", ["upgrade", "convert"])
def test_a_dest_that_cannot_be_created_is_refused_before_any_measurement(invoke, command):
    extra = ["--to", "speculators"] if command == "convert" else []
    r = invoke(command, TRAINED / "eagle3", "/sys/eaglectl-out", *extra, "--target", TRAINED / "target", "-v")
    assert r.exit_code == 15 and "cannot create the destination in it" in r.stderr, r.stderr
    assert "target loads" not in r.stderr and "forward" not in r.stderr.split("error[")[0]  # nothing ran first


def test_check_smoke_without_vllm_still_runs_parity(invoke):
    r = invoke("check", DRAFTERS / "speculators-3.1", "--target", SMALL, "--smoke", "--no-card", "--vllm-python",
               sys.executable, "--json")  # this interpreter has no vLLM
    stages = {s["name"]: s["status"] for s in json.loads(r.stdout)["stages"]}
    assert r.exit_code == 10 and stages["parity"] == "pass" and stages["smoke"] == "undecided", r.stdout


# ------------------------------------------------------------------- stderr holds eaglectl's words only

@pytest.fixture(scope="module")
def float32_target(tmp_path_factory) -> Path:
    """The trained target with its weights stored as float32 (many published targets are): the bytes read from it
    are a read-only buffer torch warns about, where bf16 ones are converted (a copy) first."""
    out = tmp_path_factory.mktemp("fp32") / "target"
    shutil.copytree(TRAINED / "target", out)
    weights = {k: v.float() for k, v in load_file(out / "model.safetensors").items()}
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}))
    return out


FOREIGN_WARNING = re.compile(r"\w+Warning\b|warnings\.warn|FutureWarning|DeprecationWarning")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bfloat16", "float32"])
def test_no_warning_on_stderr_is_another_librarys(kind, float32_target, tmp_path):
    target = TRAINED / "target" if kind == "bfloat16" else float32_target
    drafter = TRAINED / "eagle3.1"
    runs = [["inspect", drafter, "--target", target], ["verify", drafter, "--target", target],
            ["check", drafter, "--target", target, "--no-card"],
            ["smoke", drafter, "--target", target, "--engine", "reference", "--num-prompts", 2, "--max-tokens", 8],
            ["upgrade", TRAINED / "eagle3", tmp_path / "up", "--to", "speculators", "--target", target, "--init",
             "ones", "--no-fidelity"]]
    for args in runs:
        r = subprocess.run([sys.executable, "-m", "eaglectl", *map(str, args)], capture_output=True, text=True,
                           cwd=ROOT)
        assert r.returncode in (0, 1), (args, r.stderr[-2000:])
        assert not FOREIGN_WARNING.search(r.stderr), (args, r.stderr[-2000:])


def test_the_words_say_what_the_engine_does(invoke, tmp_path):
    """use_sliding_window alone says vLLM reads a window only from layer_types; the 4-aux hint names SGLang's
    release; a weaker detection reads as weaker."""
    src = edited(DRAFTERS / "specforge-3.1", tmp_path, name="w", config={"use_sliding_window": True,
                                                                          "sliding_window": 64})
    doc = json.loads(invoke("inspect", src, "--json").stdout)
    (f,) = [f for f in doc["findings"] if f["rule_id"] == "sliding-window-ignored"]
    assert "vLLM applies a window only through layer_types" in f["message"] and ": off" not in f["message"]
    from eaglectl.rules import RULES

    assert "SGLang 0.5.23" in (RULES["aux-count-not-3"].hint() or "")
