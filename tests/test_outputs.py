"""Outputs never land on inputs: every path a command writes (DEST, --out, --profile, --sarif, --plot, the model
card) is refused, before anything is measured, when it is, holds, lies inside or hard-links anything the command
reads (drafter, target, capture, prompts, manifest), however the path is spelled. Each case was found from outside
with exit 0 and the user's own file replaced."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .conftest import ROOT
from .fuzzing import make_capture

TRAINED = ROOT / "fixtures" / "trained"


def digest(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def pair(tmp_path):
    """Copies of the trained drafter and target the commands may not touch."""
    d, t = tmp_path / "drafter", tmp_path / "target"
    shutil.copytree(TRAINED / "eagle3", d)
    shutil.copytree(TRAINED / "target", t)
    return d, t


def spellings(tmp_path: Path, d: Path, t: Path) -> dict[str, Path]:
    """One input file under many names: itself, through `..`, through a symlinked folder, a hard link."""
    (tmp_path / "via").symlink_to(d)
    os.link(d / "config.json", tmp_path / "hard.json")
    return {"weights": d / "model.safetensors", "config": d / "config.json", "target-config": t / "config.json",
            "dotdot": d / ".." / d.name / "config.json", "symlinked-folder": tmp_path / "via" / "config.json",
            "hard-link": tmp_path / "hard.json", "new-file-inside": d / "profile.json"}


def refused(r, before: dict[str, bytes], *folders: Path) -> None:
    assert r.exit_code == 23, r.output  # output-overlaps-input, whatever the command (it was conversion-failed)
    lines = [line for line in r.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and ("overlaps the source/input" in lines[0] or "hard link of the input" in lines[0])
    assert "loading the target" not in r.stderr  # refused before any measuring
    assert {f: digest(f) for f in folders} == before


@pytest.mark.parametrize("spelling", ["weights", "config", "target-config", "dotdot", "symlinked-folder",
                                      "hard-link", "new-file-inside"])
def test_smoke_profile_never_replaces_an_input(invoke, tmp_path, pair, spelling):
    d, t = pair
    out = spellings(tmp_path, d, t)[spelling]
    before = {f: digest(f) for f in pair}
    r = invoke("smoke", d, "--target", t, "--engine", "reference", "--num-prompts", "1", "--max-tokens", "4",
               "--profile", out)
    refused(r, before, *pair)
    assert not (d / "profile.json").exists()


def test_smoke_plot_and_prompts(invoke, tmp_path, pair):
    d, t = pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello there"}\n')
    before = {f: digest(f) for f in pair}
    r = invoke("smoke", d, "--target", t, "--engine", "reference", "--prompts", prompts, "--profile", prompts)
    refused(r, before, *pair)
    assert prompts.read_text() == '{"prompt": "hello there"}\n'


@pytest.mark.parametrize("spelling", ["weights", "config", "target-config", "hard-link"])
def test_check_sarif_never_replaces_an_input(invoke, tmp_path, pair, spelling):
    d, t = pair
    out = spellings(tmp_path, d, t)[spelling]
    before = {f: digest(f) for f in pair}
    r = invoke("check", d, "--target", t, "--no-card", "--sarif", out)
    refused(r, before, *pair)


def test_check_sarif_on_a_later_manifest_item_is_refused_before_the_first_runs(invoke, tmp_path, pair):
    d, t = pair
    other = tmp_path / "other"
    shutil.copytree(d, other)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"source": str(d)}) + "\n" + json.dumps({"source": str(other)}) + "\n")
    before = {f: digest(f) for f in (*pair, other)}
    r = invoke("check", "--manifest", manifest, "--target", t, "--no-card", "--sarif", other / "config.json")
    refused(r, before, *pair, other)
    r = invoke("check", "--manifest", manifest, "--no-card", "--sarif", manifest)
    assert r.exit_code == 23 and "overlaps the source/input" in r.stderr
    assert json.loads(manifest.read_text().splitlines()[0]) == {"source": str(d)}


def test_the_card_never_lands_in_the_target(invoke, tmp_path, pair):
    """A drafter kept inside its target's folder: its card would be written into the target's tree."""
    d, t = pair
    inner = t / "eagle"
    shutil.copytree(d, inner)
    before = {t: digest(t)}
    r = invoke("check", inner, "--target", t, "--card")
    refused(r, before, t)


def test_drift_plot_never_replaces_an_input(invoke, tmp_path, pair):
    pytest.importorskip("matplotlib")
    d, t = pair
    before = {f: digest(f) for f in pair}
    r = invoke("drift", d, "--target", t, "--num-prompts", "1", "--plot", t / "config.json")
    refused(r, before, *pair)


@pytest.fixture(scope="module")
def capture_folder(tmp_path_factory):
    return make_capture(tmp_path_factory.mktemp("outputs") / "cap")


@pytest.mark.parametrize("command", ["convert", "upgrade"])
@pytest.mark.parametrize("where", ["the-capture", "inside-the-capture"])
def test_dest_never_replaces_or_enters_the_capture(invoke, tmp_path, pair, capture_folder, command, where):
    d, t = pair
    states = tmp_path / "states"
    shutil.copytree(capture_folder, states)
    before = {f: digest(f) for f in (*pair, states)}
    dest = states if where == "the-capture" else states / "out"
    args = ["--to", "speculators"] if command == "convert" else ["--to", "speculators", "--init", "ones"]
    r = invoke(command, d, dest, *args, "--states", states, "--target", t, "--force")
    refused(r, before, *pair, states)
    assert not (states / "out").exists()


def test_upgrade_dest_never_replaces_its_prompts(invoke, tmp_path, pair):
    d, t = pair
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "config.json").write_text("{}")  # a folder --force would otherwise replace
    r = invoke("upgrade", d, prompts, "--target", t, "--prompts", prompts, "--force")
    assert r.exit_code == 23 and "overlaps the source/input" in r.stderr
    assert (prompts / "config.json").read_text() == "{}"


def test_capture_out_never_lands_in_the_target_or_the_drafter(invoke, tmp_path, pair):
    d, t = pair
    before = {f: digest(f) for f in pair}
    for out in (t / "states", d / "states"):
        r = invoke("capture", t, "--drafter", d, "--out", out, "--num-prompts", "1", "--length", "8")
        refused(r, before, *pair)


def test_a_server_never_moves_a_dump_outside_its_storage_folder(tmp_path):
    """`capture --engine server`: a reply naming an earlier capture's dump (same tokens) is refused and the file
    stays; a dump in the storage folder is moved into OUT."""
    from eaglectl.commands import capture
    from eaglectl.errors import CaptureFailedError
    from eaglectl.progress import passthrough

    from .fuzzing import VOCAB, HostileServer

    srv = HostileServer(tmp_path)
    try:
        srv.start({"mode": "capture", "fault": "none", "where": "nowhere", "rng": None, "timeout": 5})
        stage = tmp_path / "stage"
        stage.mkdir()
        # the server dumps into tmp_path/storage: named as the storage folder, the dumps are moved
        capture._server(srv.url, stage, (2, 4, 5), [[1, 2, 3, 4]], 5, passthrough, 128, VOCAB,
                        storage=str(tmp_path / "storage"))
        assert (stage / "00000.safetensors").is_file() and not any((tmp_path / "storage").glob("*.safetensors"))
        # the same server, told to dump elsewhere: its files are the user's, neither read nor removed
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        with pytest.raises(CaptureFailedError, match="outside the storage folder"):
            capture._server(srv.url, stage, (2, 4, 5), [[1, 2, 3, 4]], 5, passthrough, 128, VOCAB,
                            storage=str(elsewhere))
        assert len(list((tmp_path / "storage").glob("*.safetensors"))) == 1
    finally:
        srv.close()
