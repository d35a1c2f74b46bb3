"""Issue 15: diagnoses that name the real mistake, and hints that work when followed."""

from __future__ import annotations

import json
import struct

import pytest

from .conftest import DRAFTERS, FIXTURES

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
