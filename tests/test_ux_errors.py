"""Issue 15: diagnoses that name the real mistake, and hints that work when followed."""

from __future__ import annotations

import json
import re
import shlex
import struct

import pytest

from eaglectl.rules import RULES

from .conftest import DEFECTS, DRAFTERS, FIXTURES, TARGET

TRAINED = FIXTURES / "trained"


def _empty_safetensors(path):
    header = b"{}"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


# ------------------------------------------------------------------------------ diagnoses (item 5)

@pytest.mark.parametrize("command", ["inspect", "check", "verify"])
@pytest.mark.parametrize("model", ["target", "target-mla"])
def test_a_target_given_as_the_drafter_is_named_so(invoke, command, model):
    args = [command, TRAINED / model] + (["--no-card"] if command == "check" else [])
    r = invoke(*args)
    assert r.exit_code == 5, (r.stdout, r.stderr)
    assert "this looks like a target model" in r.stderr and "not an EAGLE drafter" in r.stderr
    assert "nemo" not in r.stderr and "--target" in r.stderr  # the hint says where it goes


def test_a_drafter_is_never_taken_for_a_target(invoke):
    for d in DRAFTERS.iterdir():
        r = invoke("inspect", d, "--json", *(["--allow-pickle"] if d.name.endswith("-bin") else []))
        assert "looks like a target" not in r.stderr, d


@pytest.mark.parametrize("source", ["./drafters/eagle3", "fixtures/drafers/eagle-3", "~/no-such-head/x",
                                    "no-such-head", "/no/such/model.safetensors"])
def test_a_mistyped_path_is_no_such_file(invoke, source, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = invoke("inspect", source)
    assert r.exit_code == 3 and "no such file or directory" in r.stderr and "cache" not in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_empty_weights_say_no_tensors(invoke, tmp_path, command):
    f = _empty_safetensors(tmp_path / "model.safetensors")
    args = [command, f] + ([tmp_path / "out", "--to", "speculators"] if command == "convert" else [])
    r = invoke(*args)
    assert r.exit_code == 5 and f"{f}: no tensors" in r.stderr and "no known dialect" not in r.stderr, r.stderr


def test_a_mistyped_baseline_is_named(invoke):
    r = invoke("smoke", DRAFTERS / "eagle-3", "--target", TRAINED / "target", "--baseline", "none,ngarm")
    assert r.exit_code == 2 and "unknown baseline 'ngarm'" in r.stderr and "no such file" not in r.stderr


# ------------------------------------------------------------------------- hints that run (item 1)

COMMAND = re.compile(r"eaglectl ([^(;]*)")
BLOCKED = re.compile(r"source has error \[([a-z0-9-]+)\]")
PAIRS = [(d, TARGET) for d in sorted(DEFECTS.iterdir())] + [(d, TARGET) for d in sorted(DRAFTERS.iterdir())] + [
    (TRAINED / "eagle3-output", TRAINED / "target"), (TRAINED / "eagle3.1-mla", TRAINED / "target-mla")]


def _commands(hint):
    return [c.strip() for c in COMMAND.findall(hint or "")]


def _run_hint(invoke, command, dest):
    args = [dest if a == "DEST" else a for a in shlex.split(command)]
    assert "TARGET" not in args and "SOURCE" not in args and "DIALECT" not in args, command
    return invoke(*args)


@pytest.mark.parametrize("source,target", PAIRS, ids=[d.name for d, _ in PAIRS])
def test_every_finding_hint_runs_as_printed(invoke, tmp_path, source, target):
    pickle = ["--allow-pickle"] if source.name.endswith("-bin") else []
    r = invoke("inspect", source, "--target", target, "--json", *pickle)
    assert r.exit_code in (0, 1), r.stderr
    findings = json.loads(r.stdout)["findings"]
    found = {f["rule_id"] for f in findings}
    ran = 0
    for f in findings:
        for n, command in enumerate(_commands(f["hint"])):
            dest = tmp_path / f"{f['rule_id']}-{n}"
            if "--allow-pickle" not in command and pickle and command.startswith("convert"):
                raise AssertionError(f"{f['rule_id']}: a .bin source needs --allow-pickle in {command}")
            out = _run_hint(invoke, command, dest)
            ran += 1
            if command.startswith("convert"):
                blocked = BLOCKED.search(out.stderr)
                if blocked:  # another finding convert cannot repair stops it, and is named: fix that first
                    assert blocked.group(1) in found and blocked.group(1) != f["rule_id"], out.stderr
                    assert not RULES[blocked.group(1)].repaired_by_convert
                    continue
                assert out.exit_code == 0, (f["rule_id"], command, out.stderr)
                after = invoke("inspect", dest, "--target", target, "--json")
                assert f["rule_id"] not in {g["rule_id"] for g in json.loads(after.stdout)["findings"]}, \
                    (f["rule_id"], command)
            else:  # inspect --target: it ran and reported (0 or findings), not a usage or input error
                assert out.exit_code in (0, 1), (f["rule_id"], command, out.stderr)
    if any(_commands(f["hint"]) for f in findings):
        assert ran


def test_the_aux_count_unsized_hint_says_convert_repairs_it(invoke):
    r = invoke("inspect", DEFECTS / "aux-count-unsized", "--json")
    hint = next(f["hint"] for f in json.loads(r.stdout)["findings"] if f["rule_id"] == "aux-count-unsized")
    assert hint.startswith(f"eaglectl convert {DEFECTS / 'aux-count-unsized'} DEST --to ")


@pytest.mark.parametrize("source", ["eagle-3", "nemo-3.1", "eagle-3-bin"])
@pytest.mark.parametrize("with_target", [False, True])
def test_upgrade_hints_run_as_printed(invoke, tmp_path, source, with_target):
    """SafeAILab heads (the most common EAGLE-3 source) cannot hold the 3.1 flags in their own layout."""
    extra = ["--target", TARGET] if with_target else []
    extra += ["--allow-pickle"] if source.endswith("-bin") else []
    r = invoke("upgrade", DRAFTERS / source, tmp_path / "out", "--no-fidelity", *extra)
    assert r.exit_code == 7, r.stderr
    hint = r.stderr.split("hint: ", 1)[1]
    # a given target is used; without one, speculators is named by --base-model (no target to download)
    assert ("TARGET" in hint or "ORG/NAME" in hint) is not with_target
    (command,) = _commands(hint)[:1]
    out = invoke(*shlex.split(command), "--no-fidelity")
    assert out.exit_code == 0, (command, out.stderr)
    assert json.loads((tmp_path / "out" / "config.json").read_text())  # written
    assert invoke("inspect", tmp_path / "out").exit_code == 0


# ------------------------------------------------------------------------------- defaults (item 7)

def test_verify_alone_is_a_precision_check_that_can_fail(invoke):
    r = invoke("verify", DRAFTERS / "speculators-3", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["candidate"]["dtype"] == "bfloat16" and doc["reference"]["dtype"] == "float32"
    assert doc["regime"] == "low-precision" and any(m["logits_max_abs"] > 0 for m in doc["per_step"])
    r = invoke("verify", DRAFTERS / "speculators-3", "--dtype", "float32")
    assert r.exit_code == 2 and "with itself" in r.stderr and "--against" in r.stderr


def test_verify_of_an_upgrade_uses_the_upgrade_regime(invoke, tmp_path):
    src = DRAFTERS / "speculators-3"
    assert invoke("upgrade", src, tmp_path / "up", "--no-fidelity").exit_code == 0
    r = invoke("verify", tmp_path / "up", "--against", src)
    assert r.exit_code == 0 and "verify (conversion)" in r.stdout and "tolerance  upgrade" in r.stdout, r.stdout
    assert "added by the upgrade" in r.stdout and "exact" not in r.stdout
    # a carried tensor that changed is not an upgrade: exact, and it fails
    from safetensors.torch import load_file, save_file

    t = load_file(tmp_path / "up" / "model.safetensors")
    t["fc.weight"] = t["fc.weight"] * 1.5
    save_file(t, tmp_path / "up" / "model.safetensors", metadata={"format": "pt"})
    r = invoke("verify", tmp_path / "up", "--against", src, "--json")
    assert r.exit_code == 8 and json.loads(r.stdout)["regime"] == "exact"


def test_scan_says_what_it_read(invoke):
    r = invoke("inspect", DRAFTERS / "speculators-3", "--scan")
    assert r.exit_code == 0 and re.search(r"^scan +\d+ floating-point tensors \([\d,]+ bytes\) read; no NaN/Inf$",
                                          r.stdout, re.M), r.stdout
    r = invoke("inspect", DEFECTS / "nonfinite-values", "--scan")
    assert r.exit_code == 1 and re.search(r"^scan .* read; 1 with NaN/Inf", r.stdout, re.M), r.stdout
    assert "scan " not in invoke("inspect", DRAFTERS / "speculators-3").stdout


# ------------------------------------------------------------------------------ docs agree (item 10)

ROOT = FIXTURES.parent


def test_install_lines_name_the_distribution_we_publish():
    assert re.search(r'^name = "eaglectl-cli"', (ROOT / "pyproject.toml").read_text(), re.M)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in page.read_text().splitlines():
            if "pip install" in line and "eaglectl" in line:
                assert re.search(r"eaglectl-cli\b", line) and not re.search(r"install[^#]*\beaglectl\b(?!-cli)", line), \
                    (page.name, line)


def test_ci_workflow_scopes_the_token_and_uploads_what_passed():
    text = (ROOT / "docs" / "ci.md").read_text()
    steps = text.split("      - name: ")
    with_token = [s.splitlines()[0] for s in steps if "HF_TOKEN" in s and "secrets." in s]
    assert with_token == ["Upload only what passed"], with_token
    upload = next(s for s in steps if s.startswith("Upload only what passed"))
    assert "!cancelled()" in upload and "steps.gate.outcome" in upload
    assert "eaglectl upload " in upload and "HfApi" not in text and "<<'PY'" not in text  # no inline Python
    assert "runs-on: ubuntu-latest\n    env:" not in text and "--states" in text


def test_generated_help_pages_name_the_command_once(invoke):
    assert "eaglectl eaglectl" not in (ROOT / "docs" / "cli.md").read_text()
    assert '"dest"' not in invoke("check", "--help").stdout
    assert '"dest"' in invoke("convert", "--help").stdout


@pytest.mark.parametrize("command", ["verify", "upgrade"])
def test_another_targets_states_are_named_not_a_crash(invoke, tmp_path, command):
    args = [tmp_path / "out", "--to", "speculators"] if command == "upgrade" else []
    r = invoke(command, DRAFTERS / "eagle-3", *args, "--target", TRAINED / "target")
    assert r.exit_code == 13 and "aux states are 384 wide, the drafter's fc takes 96" in r.stderr, r.stderr
    assert "internal error" not in r.stderr and not (tmp_path / "out").exists()


def test_every_incompatible_drafter_error_names_what_would_let_it_run():
    """Each place that raises incompatible-drafter (exit 13) gives a hint: the missing piece, or, for a limit of
    eaglectl's reference drafter (ReferenceLimitError), the engine that runs it."""
    import ast

    missing = []
    for path in sorted((ROOT / "eaglectl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "IncompatibleDrafterError":
                if not any(k.arg == "hint" for k in node.keywords):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing


# --------------------------------------------------------------------- what to do next (issue 34, item 6)

@pytest.mark.parametrize("corrupt", ["truncated.safetensors", "header-length-lie.safetensors"])
def test_a_truncated_file_says_to_fetch_it_again(invoke, tmp_path, corrupt):
    d = tmp_path / "d"
    d.mkdir()
    (d / "model.safetensors").write_bytes((FIXTURES / "corrupt" / corrupt).read_bytes())
    (d / "config.json").write_text((DRAFTERS / "eagle-3" / "config.json").read_text())
    r = invoke("inspect", d)
    assert r.exit_code == 4 and "hint: the file is shorter than its header says" in r.stderr, r.stderr


@pytest.mark.parametrize("code,says", [("EROFS", "read-only"), ("EACCES", "choose a folder you own"),
                                       ("ENOSPC", "disk is full")])
def test_a_refused_write_names_what_to_do(code, says):
    import errno

    from eaglectl.errors import filesystem_error

    e = filesystem_error(OSError(getattr(errno, code), "refused", "/x/dest"), "create a staging folder in")
    assert e.message.startswith("/x/dest: cannot create a staging folder in it") and says in e.hint


# ------------------------------------------------------- every printed command runs (issue 34, item 4)

FAMILIES, TRAINED_TARGETS = FIXTURES / "families", {"target": TRAINED / "target", "target-mla": TRAINED / "target-mla"}


def _target_for(d):
    if d.parent == TRAINED:
        return TRAINED / ("target-mla" if "mla" in d.name else "target")
    return TARGET


def _sources():
    return [d for base in (DRAFTERS, DEFECTS, FAMILIES, TRAINED) for d in sorted(base.iterdir())
            if d.is_dir() and d.name not in TRAINED_TARGETS]


def _printed(text):
    """Every `eaglectl ...` command in printed output, one per match (a command never breaks across lines)."""
    from eaglectl.text import COMMAND

    return [m.group() for line in text.splitlines() for m in COMMAND.finditer(line)]


def _filled(command, source, target, tmp):
    """The command's words with its placeholders filled from the fixtures, as a user would."""
    fill = {"DEST": str(tmp / "dest"), "TARGET": str(target), "SOURCE": str(source), "ORG/NAME": "org/name",
            "DIR": str(tmp / "states"), "DIALECT": "speculators", "boundary|output": "boundary"}
    return [fill.get(a, a) for a in shlex.split(command)][1:]


def _conversion(command):
    """A printed conversion up to the options a fix adds to it (`--dtype bfloat16`, `--source-aux-convention`):
    its source, dialect and target, which make it one conversion or another."""
    words = shlex.split(command)
    keep = words[:4]
    for option, value in zip(words[4::2], words[5::2], strict=False):
        if option not in ("--to", "--for", "--target", "--base-model"):
            break
        keep += [option, value]
    return " ".join(keep)


def _parse(args):
    """Click's own parse of a command line (group options, then the subcommand's): None, or why it fails."""
    import click

    from eaglectl.cli.app import cli

    try:
        ctx = cli.make_context("eaglectl", list(args))
        name, *rest = [*ctx._protected_args, *ctx.args]
        cli.get_command(ctx, name).make_context(name, rest, parent=ctx)
    except click.ClickException as e:
        return e.format_message()
    return None


def test_every_printed_command_parses_and_runs(invoke, tmp_path):
    """inspect (with and without --target), check and upgrade over every fixture print commands: each one parses
    as printed once its placeholders are filled, inspect / convert ones run without a usage error (exit 2), no
    fix names the command just run, and a report offers at most one conversion."""
    seen: dict[tuple[str, ...], str] = {}
    (tmp_path / "states").mkdir()  # DIR: a folder (--states checks it exists; a capture would fill it)
    for d in _sources():
        target, pickle = _target_for(d), (["--allow-pickle"] if d.name.endswith("-bin") else [])
        runs = [["inspect", d, *pickle], ["inspect", d, "--target", target, *pickle]]
        if d.parent in (DRAFTERS, TRAINED):
            runs += [["check", d, "--target", target, "--no-card", *pickle],
                     ["upgrade", d, tmp_path / "up", "--dry-run", "--no-fidelity", *pickle]]
        for run in runs:
            r = invoke(*run)
            just_run = f"eaglectl {run[0]} {d} --target" if "--target" in run else None
            printed = _printed(r.stdout + r.stderr)
            converts = {_conversion(c) for c in printed if c.startswith("eaglectl convert") and " DEST " in c + " "}
            if run[0] == "inspect":
                assert len(converts) <= 1, (run, converts)
            for command in printed:
                assert just_run is None or not command.startswith(just_run), (run, command)  # not the one just run
                args = _filled(command, d, target, tmp_path)
                assert _parse(args) is None, (run, command, _parse(args))
                seen.setdefault(tuple(args), " ".join(map(str, run)))
    ran = 0
    for args, where in seen.items():
        if args[0] in ("inspect", "convert") and "--force" not in args:
            out = invoke(*(a if a != str(tmp_path / "dest") else tmp_path / f"dest{ran}" for a in args))
            assert out.exit_code != 2, (where, args, out.stderr)
            ran += 1
    assert ran > 20
