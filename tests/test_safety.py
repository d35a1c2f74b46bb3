"""Issue 9: no data loss under --force, no crash on hostile input, options checked at parse time, a
gate that never passes what it did not check. Each test reproduces a defect found from outside."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from eaglectl import errors
from eaglectl.io.atomic import lock_path, staged_output

from .conftest import DEFECTS, DRAFTERS, ROOT, TARGET
from .fuzzing import PATHOLOGICAL_S, clean, fuzz, scale_cases
from .helpers import edited

TRAINED = ROOT / "fixtures" / "trained"


def digest(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def source(tmp_path, name="speculators-3.1"):
    return edited(DRAFTERS / name, tmp_path, name="src")


# ---------------------------------------------------------------------------------- destinations

@pytest.mark.parametrize("command", ["convert", "upgrade"])
def test_source_through_a_symlink_is_not_replaced_by_force(invoke, tmp_path, command):
    src = source(tmp_path, "speculators-3")
    before = digest(src)
    link = tmp_path / "link"
    link.symlink_to(src)
    args = ["--to", "modelopt"] if command == "convert" else []
    r = invoke(command, link, src, *args, "--force")
    assert r.exit_code == 23 and "overlaps the source" in r.stderr
    assert digest(src) == before


def test_dest_under_a_symlinked_parent_into_the_source_is_refused(invoke, tmp_path):
    src = source(tmp_path)
    before = digest(src)
    (tmp_path / "parent").symlink_to(src)
    r = invoke("convert", src, tmp_path / "parent" / "out", "--to", "modelopt")
    assert r.exit_code == 23 and "overlaps" in r.stderr
    assert digest(src) == before and not (src / "out").exists()


def test_empty_dest_is_refused_not_the_current_directory(invoke, tmp_path, monkeypatch):
    src = source(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    (work / "precious.txt").write_text("keep")
    monkeypatch.chdir(work)
    r = invoke("convert", src, "", "--to", "modelopt", "--force")
    assert r.exit_code == 2 and "DEST is empty" in r.stderr
    assert (work / "precious.txt").read_text() == "keep"


@pytest.mark.parametrize("kind", ["file", "fifo", "symlink", "symlink-to-dir"])
def test_force_never_replaces_anything_but_a_folder(invoke, tmp_path, kind):
    src = source(tmp_path)
    dest = tmp_path / "dest"
    if kind == "file":
        dest.write_text("x")
    elif kind == "fifo":
        os.mkfifo(dest)
    elif kind == "symlink":
        (tmp_path / "elsewhere").write_text("y")
        dest.symlink_to(tmp_path / "elsewhere")
    else:
        (tmp_path / "elsewhere").mkdir()
        dest.symlink_to(tmp_path / "elsewhere")
    mode = os.lstat(dest).st_mode
    r = invoke("convert", src, dest, "--to", "modelopt", "--force")
    assert r.exit_code == 12 and "error[output-exists]" in r.stderr, r.stderr
    assert os.lstat(dest).st_mode == mode


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/null"), reason="needs root to replace a device")
def test_dev_null_is_never_replaced(invoke, tmp_path):
    r = invoke("convert", source(tmp_path), "/dev/null", "--to", "modelopt", "--force")
    assert r.exit_code == 12 and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_force_replaces_only_checkpoint_folders_and_names_the_foreign_file(invoke, tmp_path):
    src = source(tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    for name in ("config.json", "model.safetensors", "README.md", "tokenizer.json"):
        (dest / name).write_text("old")
    (dest / "train.log").write_text("mine")
    r = invoke("convert", src, dest, "--to", "modelopt", "--force")
    assert r.exit_code == 12 and "'train.log'" in r.stderr and (dest / "train.log").exists()
    (dest / "train.log").unlink()
    (dest / "sub").mkdir()
    r = invoke("convert", src, dest, "--to", "modelopt", "--force")
    assert r.exit_code == 12 and "'sub/'" in r.stderr
    (dest / "sub").rmdir()
    assert invoke("convert", src, dest, "--to", "modelopt", "--force").exit_code == 0
    assert (dest / "config.json").read_text() != "old"


def test_a_second_writer_fails_fast_while_the_first_holds_the_lock(invoke, tmp_path):
    src = source(tmp_path)
    dest = tmp_path / "dest"
    with staged_output(dest):
        r = invoke("convert", src, dest, "--to", "modelopt")
        assert r.exit_code == 14 and "error[output-busy]" in r.stderr
    assert not lock_path(dest).exists()


def test_two_concurrent_converts_never_both_succeed(tmp_path):
    src = source(tmp_path)
    cmd = [sys.executable, "-m", "eaglectl", "convert", str(src), str(tmp_path / "dest"), "--to", "modelopt"]
    for _ in range(3):
        shutil.rmtree(tmp_path / "dest", ignore_errors=True)
        procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        errs = [p.communicate(timeout=120)[1] for p in procs]
        codes = sorted(p.returncode for p in procs)
        assert codes[0] == 0 and codes[1] in (12, 14), errs


def test_the_final_rename_never_clobbers_a_dest_that_appeared_meanwhile(tmp_path):
    dest = tmp_path / "dest"
    with pytest.raises(errors.OutputExistsError, match="appeared"), staged_output(dest) as stage:
        (stage / "config.json").write_text("{}")
        dest.mkdir()  # another program (not eaglectl: it would hold the lock) creates DEST
        (dest / "theirs").write_text("x")
    assert (dest / "theirs").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["dest"]


def test_leftovers_of_killed_runs_are_removed_by_the_next_run(invoke, tmp_path):
    src = source(tmp_path)
    dead = 2**22 + 12345  # above pid_max on typical systems: no such process
    old = tmp_path / f".dest.eaglectl-old-{dead}-abc"
    staging = tmp_path / f".dest.eaglectl-staging-{dead}-def"
    (old / "x").mkdir(parents=True)
    (old / "x" / "model.safetensors").write_bytes(b"0" * 1000)
    staging.mkdir()
    assert invoke("convert", src, tmp_path / "dest", "--to", "modelopt").exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "src"]


def test_outputs_follow_the_umask(invoke, tmp_path):
    src = source(tmp_path)
    previous = os.umask(0o022)
    try:
        assert invoke("convert", src, tmp_path / "dest", "--to", "modelopt").exit_code == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(tmp_path / "dest").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(tmp_path / "dest" / "model.safetensors").st_mode) == 0o644


def test_a_source_that_changes_during_the_run_fails_it(invoke, tmp_path, monkeypatch):
    import eaglectl.commands.convert.command as conv

    src = source(tmp_path)
    real = conv.write_safetensors

    def touching(path, entries, metadata=None):
        written = real(path, entries, metadata)
        with (src / "model.safetensors").open("r+b") as f:  # someone rewrites the source meanwhile
            f.seek(100)
            f.write(b"\x01")
        return written

    monkeypatch.setattr(conv, "write_safetensors", touching)
    r = invoke("convert", src, tmp_path / "dest", "--to", "modelopt")
    assert r.exit_code == 16 and "error[source-changed]" in r.stderr and "model.safetensors" in r.stderr
    assert not (tmp_path / "dest").exists()


# ----------------------------------------------------------------------------- filesystem errors

def test_filesystem_errors_have_their_own_exit_code_and_name_the_path(invoke, tmp_path):
    src = source(tmp_path)
    (tmp_path / "afile").write_text("x")
    r = invoke("convert", src, tmp_path / "afile" / "out", "--to", "modelopt")
    assert r.exit_code == 15 and "afile" in r.stderr and r.stderr.count("\n") <= 2
    r = invoke("convert", src, "/proc/eaglectl-out", "--to", "modelopt")
    assert r.exit_code == 15 and "/proc" in r.stderr
    r = invoke("inspect", "x" * 5000)
    assert r.exit_code in (3, 15) and "internal" not in r.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes regardless of permissions")
def test_unreadable_and_read_only_paths(invoke, tmp_path):
    src = source(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    assert invoke("convert", src, ro / "out", "--to", "modelopt").exit_code == 15
    (src / "model.safetensors").chmod(0)
    assert invoke("inspect", src).exit_code == 15


def test_unreadable_weights_are_a_filesystem_error(invoke, tmp_path, monkeypatch):
    import eaglectl.io.safetensors as st

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "src" / "model.safetensors"))

    src = source(tmp_path)
    monkeypatch.setattr(st.os, "pread", denied)
    r = invoke("inspect", src)
    assert r.exit_code == 15 and "model.safetensors" in r.stderr and "Permission denied" in r.stderr


@pytest.mark.parametrize("args,code", [
    (["inspect", "~nosuchuser-eaglectl/x"], 3),
    (["inspect", "/"], 3),
    (["check", "fixtures/drafters/speculators-3", "--sarif", "no-such-folder/x.sarif"], 2),
    (["verify", "fixtures/drafters/speculators-3", "--seed", "1e23"], 2),
    (["verify", "fixtures/drafters/speculators-3", "--seed", str(10**23)], 2),
    (["smoke", "x", "--target", "y", "--timeout-s", "-1"], 2),
    (["smoke", "x", "--target", "y", "--timeout-s", "nan"], 2),
    (["smoke", "x", "--target", "y", "--min-acceptance", "nan"], 2),
    (["check", "x", "--min-acceptance", "inf"], 2),
    (["smoke", "x", "--target", "y", "--concurrency", "1,,4"], 2),
    (["smoke", "x", "--target", "y", "--baseline", "draft_model:"], 2),
    (["smoke", "x", "--target", "y", "--baseline", "ngarm"], 2),
    (["convert", "a", "b", "--to", "modelopt", "--max-shard-size", "0"], 2),
])
def test_bad_options_and_paths_are_refused_at_parse_time(invoke, monkeypatch, args, code):
    monkeypatch.chdir(ROOT)
    r = invoke(*args)
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert "internal error" not in r.stderr


def test_empty_calibration_text_is_a_usage_error(invoke, tmp_path):
    (tmp_path / "t.txt").write_text("  \n")
    r = invoke("upgrade", DRAFTERS / "speculators-3", tmp_path / "o", "--calibration-text", tmp_path / "t.txt")
    assert r.exit_code == 2 and "empty" in r.stderr


@pytest.mark.parametrize("content", [b"\xff\xfe{}\n", b"[" * 5000 + b"]" * 5000 + b"\n",
                                     b'{"source": "a", "dest": "b", "to": "nope"}\n',
                                     b'{"source": "a", "dest": "b", "taget": "t"}\n'])
def test_bad_manifests_are_manifest_errors(invoke, tmp_path, content):
    m = tmp_path / "m.jsonl"
    m.write_bytes(content)
    r = invoke("convert", "--manifest", m, "--to", "modelopt")
    assert r.exit_code == 21 and r.stderr.startswith("error[manifest]"), r.stderr


# ------------------------------------------------------------------------------------ hostile files

def test_hostile_headers_and_configs_give_their_own_errors(invoke, tmp_path):
    import struct

    def write(name, header, data=b""):
        folder = tmp_path / name
        folder.mkdir()
        raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data)
        shutil.copy(DRAFTERS / "speculators-3" / "config.json", folder)
        return folder

    cases = {
        "deep": (write("deep", b"{" + b'"a":[' * 20000 + b"1" + b"]" * 20000 + b"}"), 4),
        "superscript": (write("sup", {"layers.\u00b2.x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                              b"\0" * 4), 1),
        "digits": (write("digits", {"w": {"dtype": "F32", "shape": [10**400], "data_offsets": [0, 4]}}, b"\0" * 4), 4),
        "surrogate": (write("surrogate", {"\ud800x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                            b"\0" * 4), 1),
    }
    for name, (folder, code) in cases.items():
        for extra in ([], ["--json"]):
            r = invoke("inspect", folder, *extra)
            assert r.exit_code == code, (name, r.stderr)
            assert "internal error" not in r.stderr
    r = invoke("inspect", cases["surrogate"][0])
    assert "\\ud800x" in r.stdout  # escaped, not crashed


@pytest.mark.parametrize("field,value", [
    ("num_hidden_layers", 100_000_000), ("num_hidden_layers", 2**31), ("torch_dtype", [["x"]]),
    ("eagle_aux_hidden_state_layer_ids", "1,2"), ("eagle_aux_hidden_state_layer_ids", list(range(100_000))),
    ("eagle_aux_hidden_state_layer_ids", [float("inf"), 1]),
    ("rope_theta", "10000"), ("rope_theta", float("nan")), ("rms_norm_eps", 10**400), ("vocab_size", -3),
])
def test_ill_typed_or_huge_config_values_are_findings_not_crashes(invoke, tmp_path, field, value):
    def set_field(cfg):
        cfg[field] = value
        if field in ("num_hidden_layers", "rope_theta", "rms_norm_eps", "vocab_size"):
            cfg["transformer_layer_config"][field] = value

    folder = edited(DRAFTERS / "speculators-3", tmp_path, name="d", config=set_field)
    t = time.perf_counter()
    r = invoke("inspect", folder, "--json")
    assert time.perf_counter() - t < 1.0 and len(r.stdout) < 200_000
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and "config-field-invalid" in {f["rule_id"] for f in doc["findings"]}


@pytest.mark.parametrize("target_cfg,code", [({"num_hidden_layers": "8"}, 4), ({"text_config": [1]}, 4),
                                             ({"vocab_size": None}, 0),
                                             ({"num_hidden_layers": 2**40, "hidden_size": 10**40}, 4)])
def test_odd_target_configs(invoke, tmp_path, target_cfg, code):
    """A field of the wrong type or out of bounds is refused where the target is opened, naming it (issue 44)."""
    t = edited(TARGET, tmp_path, name="t", config=target_cfg)
    r = invoke("inspect", DRAFTERS / "speculators-3", "--target", t)
    assert r.exit_code == code and "internal error" not in r.stderr, r.output
    if code == 4:
        assert r.stderr.startswith(f"error[corrupt-checkpoint]: {t}/config.json: config '{next(iter(target_cfg))}'")


def test_index_metadata_that_is_not_an_object(invoke, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(DRAFTERS / "speculators-sharded", d)
    idx = d / "model.safetensors.index.json"
    obj = json.loads(idx.read_text())
    obj["metadata"] = [1]
    idx.write_text(json.dumps(obj))
    r = invoke("inspect", d)
    assert r.exit_code == 4 and "'metadata' must be an object" in r.stderr
    obj["metadata"] = {}
    obj["weight_map"]["d2t"] = "x" * 5000 + ".safetensors"
    idx.write_text(json.dumps(obj))
    assert invoke("inspect", d).exit_code == 4


def test_fuzzing_the_inspect_path_finds_no_internal_error(tmp_path):
    """Seeded, in process: 2,000 mutated headers and 1,000 mutated configs / indexes / target configs."""
    rep = fuzz(tmp_path, headers=2000, configs=1000, seed=0)
    clean(rep, "inspect", 3000)
    assert rep.seconds < 30 * PATHOLOGICAL_S


@pytest.mark.slow
def test_fuzzing_at_scale(tmp_path):
    """Another seed, more cases (EAGLECTL_FUZZ_CASES sets how many: 3/5 headers, 2/5 configs)."""
    n = scale_cases(6000)
    clean(fuzz(tmp_path, headers=n * 3 // 5, configs=n - n * 3 // 5, seed=1, render_every=10), "inspect (slow)", n)


# ------------------------------------------------------------------------------------ interrupts

# a command that runs long enough to be interrupted (minutes on 2 cores)
LONG_SMOKE = [sys.executable, "-m", "eaglectl", "smoke", str(TRAINED / "eagle3"), "--target", str(TRAINED / "target"),
              "--engine", "reference", "--num-prompts", "64", "--max-tokens", "256"]


@pytest.mark.parametrize("delay", [0.9, 1.6, 2.5, 4.0])  # after Python's own start-up (site), even on a busy machine
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_start_up_imports_is_one_line_and_the_exit_code(sig, code, delay):
    """Start-up imports torch and transformers: a signal there used to leave an importlib traceback (exit -2) or
    abort the process from torch's C++ (`terminate called after throwing ... KeyboardInterrupt`)."""
    proc = subprocess.Popen(LONG_SMOKE, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    assert err.strip().count("\n") == 0, err[-2000:]


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_and_terminate_exit_codes(tmp_path, sig, code):
    proc = subprocess.Popen(LONG_SMOKE, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err.strip().count("\n") == 0 and ("interrupted" in err or "terminated" in err), err


# ---------------------------------------------------------------------------------------- the gate

def test_needs_fine_tuning_is_a_warning_and_fails_the_strict_gate(invoke, tmp_path):
    assert invoke("upgrade", DRAFTERS / "speculators-3", tmp_path / "u").exit_code == 0
    r = invoke("check", tmp_path / "u", "--strict", "--no-card", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and "needs-fine-tuning" in {f["rule_id"] for f in doc["findings"]}
    hint = next(f["hint"] for f in doc["findings"] if f["rule_id"] == "needs-fine-tuning")
    assert "fine-tune" in hint


def test_serve_line_only_for_a_servable_drafter(invoke):
    r = invoke("inspect", DEFECTS / "fc-norm-weights-without-flag")
    assert "vllm serve" not in r.stdout and "no serve command" in r.stdout
    doc = json.loads(invoke("inspect", DEFECTS / "fc-norm-weights-without-flag", "--json").stdout)
    assert doc["serve_command"] is None and doc["speculative_config"] is None
    assert "vllm serve" in invoke("inspect", DRAFTERS / "speculators-3.1").stdout


def test_card_on_a_hub_repo_that_was_asked_for_fails(tmp_path):
    from .test_hub import _cache, _run

    cache = _cache(tmp_path, "acme/head", DRAFTERS / "speculators-3.1")
    r = _run(cache, "check", "acme/head", "--card", "--json")
    card = next(s for s in json.loads(r.stdout)["stages"] if s["name"] == "card")
    assert r.returncode == 1 and card["status"] == "fail" and card["requested"] is True
    assert "Hub repos" in card["detail"]


def test_threads_do_not_share_a_lock_by_accident(tmp_path):
    """The lock is per DEST: two writers to different DESTs in one folder both succeed."""
    results = []

    def write(name):
        with staged_output(tmp_path / name) as stage:
            (stage / "config.json").write_text("{}")
            time.sleep(0.2)
        results.append(name)

    threads = [threading.Thread(target=write, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["a", "b"]
