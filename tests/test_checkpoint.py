"""Opening every layout lazily, shard-index integrity, pickle policy, atomic output."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from eaglectl.errors import CheckpointNotFoundError, CorruptCheckpointError, OutputExistsError, PickleNotAllowedError
from eaglectl.io.atomic import remove_stale_staging, staged_output
from eaglectl.io.checkpoint import open_checkpoint

from .conftest import CORRUPT, DRAFTERS, ROOT


def test_folder_file_and_index_open_the_same_tensors():
    by_dir = open_checkpoint(str(DRAFTERS / "speculators-3.1"))
    by_file = open_checkpoint(str(DRAFTERS / "speculators-3.1" / "model.safetensors"))
    sharded = open_checkpoint(str(DRAFTERS / "speculators-sharded"))
    by_index = open_checkpoint(str(DRAFTERS / "speculators-sharded" / "model.safetensors.index.json"))
    assert by_dir.layout == by_file.layout == "safetensors"
    assert sharded.layout == by_index.layout == "sharded" and len(sharded.files) == 2
    assert by_file.config == by_dir.config and sharded.index_problems == []
    assert set(by_dir.tensors) == set(sharded.tensors) == set(by_index.tensors)
    reference = load_file(DRAFTERS / "speculators-3.1" / "model.safetensors")
    for name, t in reference.items():
        want = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        np.testing.assert_array_equal(sharded.read(name), want)


def test_pickle_needs_permission_and_loads_weights_only():
    path = str(DRAFTERS / "eagle-3-bin")
    with pytest.raises(PickleNotAllowedError, match="pytorch_model.bin"):
        open_checkpoint(path)
    ckpt = open_checkpoint(path, allow_pickle=True)
    safe = open_checkpoint(str(DRAFTERS / "eagle-3"))
    assert ckpt.layout == "pickle" and set(ckpt.tensors) == set(safe.tensors)
    for name in safe.tensors:
        np.testing.assert_array_equal(ckpt.read(name), safe.read(name))


def test_pickle_with_code_is_refused_even_when_allowed(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch pwned",))

    import pickle

    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(pickle.dumps({"w": Evil()}))
    with pytest.raises(CorruptCheckpointError, match="weights-only"):
        open_checkpoint(str(path), allow_pickle=True)
    assert not (tmp_path / "pwned").exists()


def test_a_raw_pickle_is_refused_in_one_line(tmp_path):
    """torch.load warns about a raw (non-zip) pickle before refusing it: the user sees only our error line."""
    import pickle
    import subprocess
    import sys

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "pytorch_model.bin").write_bytes(pickle.dumps({"w": [1, 2, 3]}))
    r = subprocess.run([sys.executable, "-m", "eaglectl", "inspect", str(tmp_path / "d"), "--allow-pickle"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == CorruptCheckpointError.exit_code, r.stderr
    assert "Warning" not in r.stderr and r.stderr.count("eaglectl") <= 1, r.stderr


def test_escaping_weight_map_is_refused():
    with pytest.raises(CorruptCheckpointError, match="escapes the checkpoint folder"):
        open_checkpoint(str(CORRUPT / "escaping-index"))


@pytest.mark.parametrize("shard", ["/etc/passwd", "C:evil.safetensors", "a/../../b.safetensors", "..\\x"])
def test_every_escape_form_is_refused(tmp_path, shard):
    shutil.copytree(DRAFTERS / "speculators-sharded", tmp_path / "c")
    index = tmp_path / "c" / "model.safetensors.index.json"
    obj = json.loads(index.read_text())
    obj["weight_map"]["d2t"] = shard
    index.write_text(json.dumps(obj))
    with pytest.raises(CorruptCheckpointError, match="escapes"):
        open_checkpoint(str(tmp_path / "c"))


def test_missing_shard_names_the_file():
    with pytest.raises(CorruptCheckpointError, match="model-00002-of-00002.safetensors"):
        open_checkpoint(str(CORRUPT / "missing-shard"))


def test_index_inconsistencies_are_listed(tmp_path):
    shutil.copytree(DRAFTERS / "speculators-sharded", tmp_path / "c")
    index = tmp_path / "c" / "model.safetensors.index.json"
    obj = json.loads(index.read_text())
    obj["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    del obj["weight_map"]["d2t"]
    obj["metadata"]["total_size"] = 1
    index.write_text(json.dumps(obj))
    problems = [m for _, m in open_checkpoint(str(tmp_path / "c")).index_problems]
    assert any("ghost.weight" in m for m in problems)
    assert any("'d2t'" in m and "not in the weight_map" in m for m in problems)
    assert any("total_size" in m for m in problems)


def test_missing_paths_and_bad_ids():
    with pytest.raises(CheckpointNotFoundError, match="no such file"):
        open_checkpoint("./definitely/not/here")
    with pytest.raises(CheckpointNotFoundError, match="pins revision"):
        open_checkpoint("org/name@v1", revision="v2")


def test_folder_with_several_unindexed_files_is_refused(tmp_path):
    for n in ("a.safetensors", "b.safetensors"):
        shutil.copy(DRAFTERS / "speculators-3" / "model.safetensors", tmp_path / n)
    with pytest.raises(CorruptCheckpointError, match="no index"):
        open_checkpoint(str(tmp_path))


def test_read_only_source_opens(tmp_path):
    src = tmp_path / "ro"
    shutil.copytree(DRAFTERS / "speculators-3", src)
    for p in [*src.iterdir(), src]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        assert open_checkpoint(str(src)).config is not None
    finally:
        for p in [src, *src.iterdir()]:
            p.chmod(0o755 if p.is_dir() else 0o644)


# ------------------------------------------------------------------------------------- atomic

def test_staged_output_appears_only_on_success(tmp_path):
    dest = tmp_path / "out"
    with pytest.raises(RuntimeError), staged_output(dest) as stage:
        (stage / "half.safetensors").write_bytes(b"partial")
        raise RuntimeError("boom")
    assert not dest.exists() and list(tmp_path.iterdir()) == []
    with staged_output(dest) as stage:
        (stage / "config.json").write_text("{}")
    assert (dest / "config.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_staged_output_refuses_existing_unless_forced(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "config.json").write_text("{}")
    (dest / "model.safetensors").write_text("x")
    with pytest.raises(OutputExistsError), staged_output(dest):
        pass
    with staged_output(dest, force=True) as stage:
        (stage / "model.safetensors").write_text("y")
    assert sorted(p.name for p in dest.iterdir()) == ["model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="notes.txt"), staged_output(dest, force=True):
        pass
    assert (dest / "notes.txt").exists()


def test_killed_run_leaves_nothing_the_next_run_trips_over(tmp_path):
    dest = tmp_path / "out"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from eaglectl.io.atomic import staged_output
        with staged_output(Path({str(dest)!r})) as s:
            (s / "part").write_bytes(b"x" * 100)
            print("ready", flush=True)
            time.sleep(60)
    """)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout.readline().strip() == "ready"
            proc.send_signal(sig)
            proc.wait(timeout=30)
        assert not dest.exists()
    remove_stale_staging(dest)
    assert list(tmp_path.iterdir()) == []


def test_a_pickle_is_loaded_from_a_private_snapshot_that_cannot_shrink(tmp_path, monkeypatch):
    """torch.load maps the file it reads; eaglectl maps a copy it owns (unlinked once loaded). A source that is
    shorter than when it was opened is exit 16, and no copy is left behind."""
    import os
    import tempfile

    from eaglectl.errors import SourceChangedError
    from eaglectl.io import checkpoint

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    src = next((DRAFTERS / "eagle-3-bin").glob("*.bin"))
    copy = checkpoint._snapshot(src)
    assert copy.read_bytes() == src.read_bytes() and copy.parent == tmp_path
    copy.unlink()
    real = os.fstat

    def as_opened(fd):  # the size the file had when it was opened, before it shrank
        st = real(fd)
        return os.stat_result((*st[:6], st.st_size + 4096, *st[7:10]))

    monkeypatch.setattr(checkpoint.os, "fstat", as_opened)
    with pytest.raises(SourceChangedError, match="shrank"):
        checkpoint._snapshot(src)
    monkeypatch.setattr(checkpoint.os, "fstat", real)
    assert not list(tmp_path.glob("eaglectl-pickle-*"))
    d = checkpoint.open_checkpoint(str(DRAFTERS / "eagle-3-bin"), allow_pickle=True)
    assert d.layout == "pickle" and not list(tmp_path.glob("eaglectl-pickle-*"))  # loaded, the copy's name gone
