"""Issue 23 §4 (check as a CI gate) and §5 (conventions): each item through the CLI."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys

import click
import pytest

from eaglectl.cli.app import cli

from .conftest import DEFECTS, DRAFTERS, FIXTURES, ROOT, TARGET

TRAINED = FIXTURES / "trained"


# --------------------------------------------------------------------------------- §4 check as a CI gate

def test_a_smoke_stage_this_machine_cannot_run_exits_10_not_1(invoke, tmp_path):
    for python in ("/bin/false", str(tmp_path / "no-such-python")):
        r = invoke("check", DRAFTERS / "speculators-3", "--target", TARGET, "--smoke", "--vllm-python", python,
                   "--json")
        doc = json.loads(r.stdout)
        smoke = doc["stages"][2]
        assert r.exit_code == doc["exit_code"] == 10 and not doc["passed"], doc["stages"]
        assert smoke["status"] == "undecided" and smoke["environment"] is True and "cannot run here" in smoke["detail"]
    assert "no such interpreter" in smoke["detail"]
    # the drafter's own failure still decides: a defect is exit 1 whatever the machine lacks
    r = invoke("check", DEFECTS / "d2t-range", "--target", TARGET, "--smoke", "--vllm-python", "/bin/false")
    assert r.exit_code == 1


def test_the_smoke_options_pass_through_and_a_cpu_runner_gates_on_the_reference_loop(invoke, tmp_path):
    import shutil

    d = tmp_path / "eagle3.1"
    shutil.copytree(TRAINED / "eagle3.1", d)
    args = ["check", d, "--target", TRAINED / "target", "--engine", "reference", "-k", "2", "--num-prompts", "2",
            "--prompts", "builtin:short", "--timeout-s", "60", "--card", "--json"]
    r = invoke(*args)
    doc = json.loads(r.stdout)
    smoke = doc["stages"][2]
    assert r.exit_code == 0 and smoke["status"] == "pass" and smoke["requested"], doc["stages"]
    assert smoke["data"]["engine"] == "reference" and smoke["data"]["num_speculative_tokens"] == 2
    assert smoke["data"]["prompts"]["count"] == 2 and "reference loop" in smoke["detail"]
    assert "eaglectl's reference loop, which counts as vLLM does, k=2" in (d / "README.md").read_text()
    r = invoke("check", TRAINED / "eagle3.1", "--target", TRAINED / "target", "--engine", "reference",
               "--num-prompts", "1", "--min-acceptance", "64", "--no-card", "--json")
    assert r.exit_code == 1 and json.loads(r.stdout)["stages"][2]["status"] == "fail"  # a red flag is the drafter's
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"source": str(TRAINED / "eagle3.1"), "target": str(TRAINED / "target"),
                                    "engine": "reference", "num_prompts": 1, "num_speculative_tokens": 2}) + "\n")
    r = invoke("check", "--manifest", manifest, "--no-card", "--json")
    item = json.loads(r.stdout)["items"][0]
    assert r.exit_code == 0 and item["result"]["stages"][2]["data"]["num_speculative_tokens"] == 2, item


@pytest.mark.vllm
@pytest.mark.slow
def test_the_gate_smokes_under_real_vllm_with_the_options_given(invoke, vllm_py):
    """The same options under vLLM: its counts equal the reference loop's gate exactly."""
    python = vllm_py
    stage = {}
    for engine in ("vllm", "reference"):
        r = invoke("check", TRAINED / "eagle3.1", "--target", TRAINED / "target", "--engine", engine, "-k", "2",
                   "--num-prompts", "4", "--timeout-s", "600", "--no-card", "--vllm-python", python, "--json")
        assert r.exit_code == 0, r.stdout[-2000:]
        stage[engine] = json.loads(r.stdout)["stages"][2]["data"]
    assert stage["vllm"]["engine"] == "vllm" and stage["vllm"]["versions"]["vllm_version"]
    for key in ("num_speculative_tokens", "num_drafts", "num_accepted_tokens", "per_position_acceptance"):
        assert stage["vllm"][key] == stage["reference"][key], key
    assert stage["vllm"]["prompts"]["count"] == 4


@pytest.mark.parametrize("command", ["inspect", "check", "convert", "upgrade", "verify", "smoke", "diff"])
def test_a_drafter_given_as_the_target_is_exit_5(invoke, tmp_path, command):
    extra = {"convert": [tmp_path / "o", "--to", "modelopt"], "upgrade": [tmp_path / "o"],
             "diff": [TRAINED / "eagle3"]}.get(command, [])
    r = invoke(command, TRAINED / "eagle3", *extra, "--target", TRAINED / "eagle3.1")
    assert r.exit_code == 5, (command, r.stdout, r.stderr)
    assert "looks like an EAGLE drafter" in r.stderr and "--target" in r.stderr
    assert "None" not in r.stdout + r.stderr and not (tmp_path / "o").exists()


def _human_runs(tmp):
    """Every command's human output on the fixtures (cheap options)."""
    yield ["inspect", TRAINED / "eagle3", "--target", TRAINED / "target"]
    yield ["inspect", DRAFTERS / "modelopt-mla", "--target", TRAINED / "target-mla", "-v"]
    for d in sorted(DEFECTS.iterdir()):
        yield ["inspect", d, "--target", TARGET, "-v"]
    yield ["convert", DRAFTERS / "specforge-3", tmp / "c", "--to", "speculators", "--target", TARGET]
    yield ["convert", DRAFTERS / "eagle-3", tmp / "f", "--for", "vllm", "--target", TARGET, "--dry-run"]
    yield ["upgrade", DRAFTERS / "speculators-3", tmp / "u", "--target", TARGET, "--init", "calibrated"]
    yield ["verify", tmp / "c", "--against", DRAFTERS / "specforge-3", "--tokens", "8"]
    yield ["diff", DRAFTERS / "specforge-3", tmp / "c"]
    yield ["smoke", TRAINED / "eagle3", "--target", TRAINED / "target", "--engine", "reference", "--num-prompts", "1",
           "--max-tokens", "8", "--baseline", f"none,eagle3:{TRAINED / 'eagle3.1'}"]
    yield ["check", tmp / "u", "--target", TARGET, "--card", "--base-model", "acme/t"]
    yield ["upload", tmp / "u", "acme/u", "--dry-run"]
    yield ["capture", TRAINED / "target", "--out", tmp / "cap", "--num-prompts", "1", "--length", "8"]
    yield ["drift", TRAINED / "eagle3", "--target", TRAINED / "target", "--num-prompts", "1", "--max-tokens", "8",
           "--depth", "2", "--bootstrap", "100"]
    yield ["formats"]
    yield ["rules"]


def test_none_never_appears_in_human_output(invoke, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    for args in _human_runs(tmp_path):
        r = invoke(*args)
        assert r.exit_code in (0, 1), (args, r.stderr)
        bad = [line for line in (r.stdout + r.stderr).splitlines() if re.search(r"\bNone\b", line)]
        assert not bad, (args, bad)


# ------------------------------------------------------------------------------------ §5 interruptions

def _signalled(sig):
    """A real eaglectl process with --json, stopped by `sig` while it waits on a server that accepted its connection
    and never answers (its signal handlers are installed by then; eaglectl refuses a FIFO before opening it, so a
    FIFO no longer blocks it)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(120)
        proc = subprocess.Popen([sys.executable, "-m", "eaglectl", "smoke", str(TRAINED / "eagle3"), "--target",
                                 str(TRAINED / "target"), "--server", f"http://127.0.0.1:{server.getsockname()[1]}",
                                 "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            conn, _ = server.accept()
        except TimeoutError:
            proc.kill()
            raise
        with conn:
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


@pytest.mark.parametrize("sig,code,reference", [(signal.SIGTERM, 143, "terminated"),
                                                (signal.SIGINT, 130, "interrupted")])
def test_json_prints_the_envelope_under_sigterm_and_ctrl_c(sig, code, reference):
    rc, out, err = _signalled(sig)
    doc = json.loads(out)  # one document, nothing else on stdout
    assert rc == code == doc["exit_code"] == doc["error"]["exit_code"], (rc, out, err)
    assert doc["schema"] == "eaglectl.error/1" and doc["command"] == "smoke" and doc["error"]["reference"] == reference
    assert "no output was left behind" in err


def test_an_interrupt_mid_command_and_mid_write_prints_one_envelope(invoke, tmp_path, monkeypatch):
    import eaglectl.commands.inspect

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(eaglectl.commands.inspect, "run", interrupted)
    r = invoke("inspect", DRAFTERS / "speculators-3", "--json")
    assert r.exit_code == 130 and json.loads(r.stdout)["error"]["reference"] == "interrupted"
    monkeypatch.undo()
    import eaglectl.commands.convert.command

    def terminated(*a, **k):  # what io/atomic.py's SIGTERM handler raises inside a staged write
        raise SystemExit(143)

    monkeypatch.setattr(eaglectl.commands.convert.command, "write_safetensors", terminated)
    r = invoke("convert", DRAFTERS / "speculators-3", tmp_path / "o", "--to", "modelopt", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 143 and doc["error"]["reference"] == "terminated" and not (tmp_path / "o").exists()
    assert r.stdout.count('"schema"') == 1


# ---------------------------------------------------------------------------------- §5 -q / -v and errors

def test_quiet_and_verbose_work_after_the_subcommand_too(invoke):
    src = TRAINED / "eagle3"
    assert invoke("inspect", src, "-q").stdout == invoke("-q", "inspect", src).stdout
    assert "hidden_size" in invoke("inspect", src, "-v").stdout and "hidden_size" in invoke("inspect", src,
                                                                                            "--verbose").stdout
    assert invoke("-q", "inspect", src, "-v").exit_code == 2 and invoke("inspect", src, "-q", "-v").exit_code == 2
    r = invoke("inspect", DEFECTS / "d2t-range", "-q")
    assert r.exit_code == 1 and r.stdout.strip().endswith("[d2t-range]")  # the failing rule ids
    r = invoke("check", DEFECTS / "d2t-range", "--no-card", "-q")
    assert r.exit_code == 1 and "[d2t-range]" in r.stdout and len(r.stdout.splitlines()) == 1


def test_an_engine_given_as_a_dialect_points_at_for_in_eaglectls_error_style(invoke, tmp_path):
    r = invoke("convert", DRAFTERS / "speculators-3", tmp_path / "o", "--to", "vllm")
    assert r.exit_code == 2 and r.stderr.startswith("error[usage]: ") and "Error:" not in r.stderr
    assert f"hint: eaglectl convert {DRAFTERS / 'speculators-3'} {tmp_path / 'o'} --for vllm" in r.stderr
    doc = json.loads(invoke("convert", DRAFTERS / "speculators-3", tmp_path / "o", "--to", "vllm", "--json").stdout)
    assert "--for vllm" in doc["error"]["hint"]
    r = invoke("upgrade", DRAFTERS / "speculators-3", tmp_path / "o", "--to", "sglang")
    assert r.exit_code == 2 and "engine, not a dialect" in r.stderr and "specforge" in r.stderr
    for args in (["inspect", DRAFTERS / "speculators-3", "--bogus"], ["nope"], ["smoke", DRAFTERS / "eagle-3"]):
        r = invoke(*args)
        assert r.exit_code == 2 and r.stderr.startswith("error[usage]: ") and "\nhint: eaglectl " in r.stderr, args


def test_the_four_messages(invoke, tmp_path, monkeypatch):
    r = invoke("inspect", DRAFTERS / "speculators-3" / "config.json")
    assert r.exit_code == 2 and "config.json is not a weights file" in r.stderr and "pass its folder" in r.stderr
    assert "header length" not in r.stderr
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = invoke("inspect", "fixtures/drafters/speculator-3")
    assert r.exit_code == 3 and "did you mean fixtures/drafters/speculators-3?" in r.stderr
    r = invoke("inspect", "nosuchorg/drafter")
    assert r.exit_code == 3 and "no such local file or folder, and as a Hub id" in r.stderr
    import tempfile

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    r = invoke("convert", DRAFTERS / "speculators-3", tmp_path / "o", "--to", "modelopt")
    assert r.exit_code == 15 and "cannot create the destination in it (Read-only file system)" in r.stderr
    assert " in (" not in r.stderr
    monkeypatch.undo()
    r = invoke("smoke", TRAINED / "eagle3", "--target", TRAINED / "target", "--vllm-python", tmp_path / "nope")
    assert r.exit_code == 10 and "no such interpreter" in r.stderr and "no vLLM in this" not in r.stderr


# ------------------------------------------------------------------------------------------- §5 help

def test_help_marks_what_is_required_and_shares_option_definitions(invoke):
    conv = invoke("convert", "--help").stdout
    assert " convert [OPTIONS] SOURCE DEST\n" in conv and "required unless --for" in conv
    assert " upgrade [OPTIONS] SOURCE DEST\n" in invoke("upgrade", "--help").stdout
    assert " check [OPTIONS] SOURCE...\n" in invoke("check", "--help").stdout
    seen_tp, seen_dtype = set(), set()
    for name, cmd in cli.commands.items():
        text = " ".join(invoke(name, "--help").stdout.split())
        assert "9223372036854775807" not in text, name
        for p in cmd.params:
            if p.name == "seed":
                assert "0 to 2**63-1" in text
            if p.name == "tensor_parallel_size":
                seen_tp.add((p.type.min, p.type.max))
            if p.name == "dtype":
                assert isinstance(p.type, click.Choice) and p.show_default, name
                seen_dtype.add(tuple(p.type.choices))
    assert len(seen_tp) == 1 and len(seen_dtype) == 1


# ------------------------------------------------------------------------------------ §5 config diffs

def test_config_diffs_are_key_level_with_moves(invoke, tmp_path):
    r = invoke("convert", DRAFTERS / "specforge-3", tmp_path / "o", "--to", "speculators", "--base-model", "acme/t",
               "--dry-run", "--json")
    changes = json.loads(r.stdout)["plan"]["config_changes"]
    by_key = {c["key"]: c for c in changes}
    assert by_key["transformer_layer_config.hidden_size"] == {
        "key": "transformer_layer_config.hidden_size", "change": "moved", "from": "hidden_size", "new": 32}
    assert by_key["speculators_config.verifier.name_or_path"] == {
        "key": "speculators_config.verifier.name_or_path", "change": "added", "new": "acme/t"}
    assert "hidden_size" not in by_key and not any(isinstance(c.get("new"), dict) and c["new"] for c in changes)
    human = invoke("convert", DRAFTERS / "specforge-3", tmp_path / "o", "--to", "speculators", "--base-model",
                   "acme/t", "--dry-run").stdout
    assert "> moved into transformer_layer_config: " in human and "hidden_size" in human
    assert '+ speculators_config.verifier.name_or_path = "acme/t"' in human and "..." not in human


def test_a_renamed_setting_and_a_remote_code_map_are_one_change_each():
    """Issue 47: transformers' `dtype` written as `torch_dtype` is the one setting moved, not a removal and an
    addition; `auto_map` (remote-code classes, never run) is removed as one value, not entry by entry."""
    from eaglectl.checkpoint.plan import config_diff

    got = config_diff({"dtype": "bfloat16", "auto_map": {"AutoConfig": "c.C", "AutoModel": "m.M"},
                       "eagle_config": {"dtype": "float32"}},
                      {"torch_dtype": "bfloat16", "eagle_config": {"torch_dtype": "float32"}})
    assert got == [{"key": "auto_map", "change": "removed", "old": {"AutoConfig": "c.C", "AutoModel": "m.M"}},
                   {"key": "eagle_config.torch_dtype", "change": "moved", "from": "eagle_config.dtype",
                    "new": "float32"},
                   {"key": "torch_dtype", "change": "moved", "from": "dtype", "new": "bfloat16"}]


# ---------------------------------------------------------------------------------------- §5 smoke

def test_smoke_has_one_headline_al_and_labels_baselines_by_path(invoke, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    old = os.umask(0o022)
    try:
        r = invoke("smoke", "fixtures/trained/eagle3", "--target", "fixtures/trained/target", "--engine", "reference",
                   "--num-prompts", "1", "--max-tokens", "8", "--baseline", "none,eagle3:fixtures/trained/eagle3.1",
                   "--plot", tmp_path / "s.png")
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    headline = [line for line in lines if line.startswith("AL ")]
    assert len(headline) == 1 and "vLLM's metric" in r.stdout and "accepted draft length" in r.stdout
    assert "SPEED-Bench's way" not in r.stdout
    assert any(line.startswith("eagle3:fixtures/trained/eagle3.1") for line in lines), r.stdout
    assert (tmp_path / "s.png").stat().st_mode & 0o777 == 0o644  # the umask's mode, not mkstemp's 0600


def test_info_findings_are_shown_only_with_verbose(invoke):
    src = DRAFTERS / "specforge-3.1"
    normal, verbose = invoke("inspect", src).stdout, invoke("inspect", src, "-v").stdout
    assert "embed-tokens-shared" not in normal and "info finding(s) not shown: -v shows them" in normal
    assert "embed-tokens-shared" in verbose and "not shown" not in verbose
