"""One invariant for every writer, one interpretation everywhere (issue 20 items 2 and 5).

Every dialect eaglectl writes, from each trained fixture drafter (boundary-numbered `eagle3`, output-numbered
`eagle3-output`, the MLA `eagle3.1-mla`), must be read by vLLM's V1 and V2 runners at the boundaries the drafter
was measured to read: the top-level `eagle_aux_hidden_state_layer_ids` in vLLM's numbering, the dialect's own
field in its own. The vLLM test asks vLLM's own selection code (one worker run for every output); its twin asks
eaglectl's table of that code. The post-write check fails closed; upgrade, verify --target and drift take the
layers from the one measured reading.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eaglectl import formats
from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.engines.asking import Request, read_batch
from eaglectl.engines.readings import FLAG_NAMES
from eaglectl.errors import ConversionError

from .conftest import FIXTURES
from .helpers import convert_run, edited

TRAINED = FIXTURES / "trained"
# fixture -> (its target, the boundaries its weights were trained on: tests/test_measured.py measures them)
CASES = {"eagle3": ("target", (2, 4, 5)), "eagle3-output": ("target", (3, 5, 6)),
         "eagle3.1-mla": ("target-mla", (2, 3, 4))}
# the dialects written here: a GGUF draft has no config.json for vLLM's runners to read (tests/test_gguf.py)
WRITTEN = [d for d in formats.writable() if d != "gguf"]
# (fixture, dialect) -> the reason eaglectl refuses to write it (the rest are written)
REFUSED = {("eagle3-output", "eagle"): "cannot record aux ids [3, 5, 6]",
           ("eagle3.1-mla", "eagle"): "cannot hold a mla drafter",
           ("eagle3.1-mla", "specforge"): "cannot hold a mla drafter",
           ("eagle3.1-mla", "speculators"): "cannot hold a mla drafter"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Every (fixture, dialect) output, written by `convert --target` at the measured boundaries: the measured path
    itself (the probe decides, the written files are replayed) for modelopt, which holds every family; the others
    with the measured ids given (--aux-layer-ids), which is what the measured path writes. {(name, dialect): dir}"""
    from click.testing import CliRunner

    from eaglectl.cli.app import cli

    root = tmp_path_factory.mktemp("writers")
    out: dict[tuple[str, str], Path] = {}
    refused: dict[tuple[str, str], str] = {}
    for name, (target, ids) in CASES.items():
        for dialect in WRITTEN:
            dest = root / f"{name}-{dialect}"
            args = ["convert", str(TRAINED / name), str(dest), "--to", dialect, "--target", str(TRAINED / target),
                    "--base-model", "eaglectl-fixtures/target"]
            if dialect != "modelopt":
                args += ["--no-measure", "--aux-layer-ids", ",".join(map(str, ids))]
            r = CliRunner().invoke(cli, args, catch_exceptions=False)
            if r.exit_code == 0:
                out[(name, dialect)] = dest
            else:
                refused[(name, dialect)] = r.output
                assert not dest.exists()  # fail closed: nothing at DEST
    return out, refused


def _requests(out: dict[tuple[str, str], Path]) -> list[tuple[tuple[str, str], Request]]:
    return [(key, Request(str(d), json.loads((d / "config.json").read_text()), 8 if CASES[key[0]][0] == "target" else 4,
                          str(TRAINED / CASES[key[0]][0]))) for key, d in sorted(out.items())]


def _assert_invariant(out, got) -> list[str]:
    rows = ["| fixture | dialect | vLLM V1 | vLLM V2 | intended (measured) |", "|---|---|---|---|---|"]
    for (key, _), readings in zip(_requests(out), got, strict=True):
        name, dialect = key
        want = CASES[name][1]
        v1, v2 = readings.get("v1"), readings.get("v2")
        rows.append(f"| {name} | {dialect} | {v1.ids_text()} | {v2.ids_text()} | {list(want)} |")
        assert not v1.error and not v2.error, (key, v1.error, v2.error)
        assert v1.boundary_ids == v2.boundary_ids == want, (key, v1.boundary_ids, v2.boundary_ids, want)
        spec = open_drafter(str(out[key])).spec
        flags = {f: bool(getattr(spec, f)) for f in FLAG_NAMES}
        assert v1.flags == v2.flags == flags, (key, v1.flags, flags)
    return rows


def test_every_written_dialect_is_read_alike_by_both_runners_table(written):
    out, refused = written
    assert set(out) | set(refused) == {(n, d) for n in CASES for d in WRITTEN}
    for key, why in REFUSED.items():
        assert key in refused and why in refused[key], (key, refused.get(key))
    assert set(refused) == set(REFUSED), refused
    got = read_batch([r for _, r in _requests(out)], ask=False)
    assert all(not g.asked for g in got)
    _assert_invariant(out, got)
    for (name, dialect), d in out.items():
        cfg = json.loads((d / "config.json").read_text())
        assert "target_layer_ids" not in cfg  # V2 would read it +1
        fields = cfg["eaglectl_provenance"].get("aux_id_fields", {})
        if dialect == "eagle":
            assert not fields and "eagle_aux_hidden_state_layer_ids" not in cfg  # the layout stores none: the default
            continue
        want = list(CASES[name][1])
        assert cfg["eagle_aux_hidden_state_layer_ids"] == want
        assert fields["eagle_aux_hidden_state_layer_ids"] == "boundary"
        if dialect in ("specforge", "torchspec", "modelopt"):  # the dialect's own field in its own numbering
            assert fields["eagle_config.eagle_aux_hidden_state_layer_ids"] == "output"
            assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in want]
        # and eaglectl reads its own output back as it meant it
        assert open_drafter(str(d)).spec.capture_ids(8) == CASES[name][1]


@pytest.mark.vllm
@pytest.mark.slow
def test_every_written_dialect_is_read_alike_by_vllms_own_runner_code(written, tmp_path, monkeypatch, vllm_py):
    python = vllm_py
    monkeypatch.setenv("EAGLECTL_CACHE_DIR", str(tmp_path / "cache"))
    out, _ = written
    monkeypatch.setenv("EAGLECTL_ASK_VLLM", "1")  # vLLM's own code, not the tables verified by hash
    got = read_batch([r for _, r in _requests(out)], vllm_python=python)  # one worker run for every output
    assert all(g.asked for g in got), [g.note for g in got]
    rows = _assert_invariant(out, got)
    report = os.environ.get("EAGLECTL_WRITERS_TABLE")
    if report:
        Path(report).write_text("\n".join(rows) + "\n")
    # the post-write check itself asks vLLM when its interpreter is at hand
    monkeypatch.setenv("EAGLECTL_VLLM_PYTHON", python)
    result = convert_run(str(TRAINED / "eagle3-output"), str(tmp_path / "asked"), "specforge",
                         target=str(TRAINED / "target"), measure=False, aux_layer_ids=(3, 5, 6))
    line = next(c for c in result.checked if c.startswith("vLLM's runners read"))
    assert "v1 = v2 capture [3, 5, 6]" in line and "asked vLLM" in line, line


def test_the_measured_path_writes_the_measured_layers_and_replays_them(written):
    out, _ = written
    for name in CASES:
        plan = json.loads((out[(name, "modelopt")] / "config.json").read_text())
        assert plan["eagle_aux_hidden_state_layer_ids"] == list(CASES[name][1])


# ------------------------------------------------------------------------------------ fail closed

def test_the_post_write_check_fails_closed_naming_runner_key_and_both_lists(tmp_path, monkeypatch):
    """A writer whose own field is all V2 could read (eagle_config only: V2 takes the target's default) is refused
    after writing: nothing at DEST, the runner, the key and both lists named."""
    import dataclasses

    real = formats.get("specforge")
    broken = dataclasses.replace(real, writer=dataclasses.replace(
        real.writer, aux_ids_paths=("eagle_config.eagle_aux_hidden_state_layer_ids",), aux_conventions={}))
    monkeypatch.setitem(formats.DIALECTS, "specforge", broken)
    dest = tmp_path / "out"
    with pytest.raises(ConversionError) as e:
        convert_run(str(TRAINED / "eagle3-output"), str(dest), "specforge", target=str(TRAINED / "target"),
                    measure=False, aux_layer_ids=(3, 5, 6))
    assert not dest.exists()
    msg = e.value.message
    assert "vLLM's v1 runner reads eagle_config.eagle_aux_hidden_state_layer_ids as boundaries [2, 4, 5]" in msg, msg
    assert "the drafter reads [3, 5, 6]" in msg
    assert e.value.context["runner"] == "v1" and e.value.context["intended"] == [3, 5, 6]


def test_a_flag_the_runners_would_not_apply_fails_closed(tmp_path, monkeypatch):
    """A speculators writer that left norm_before_residual out: vLLM's speculators reader takes it as true."""
    import dataclasses

    real = formats.get("speculators")
    flags = {k: v for k, v in real.writer.flag_paths.items() if k != "norm_before_residual"}
    monkeypatch.setitem(formats.DIALECTS, "speculators",
                        dataclasses.replace(real, writer=dataclasses.replace(real.writer, flag_paths=flags)))
    dest = tmp_path / "out"
    with pytest.raises(ConversionError) as e:
        convert_run(str(TRAINED / "eagle3"), str(dest), "speculators", target=str(TRAINED / "target"),
                    measure=False)
    assert not dest.exists()
    assert "vLLM's v1 runner applies norm_before_residual=true, but the drafter has norm_before_residual=false" in \
        e.value.message, e.value.message


# ------------------------------------------------------------------------------------ upgrade keeps ids

def _with_ids(tmp_path: Path, top: list[int] | None, ec: list[int]) -> Path:
    def ids(cfg):
        if top is not None:
            cfg["eagle_aux_hidden_state_layer_ids"] = top
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ec

    return edited(TRAINED / "eagle3-output", tmp_path, name="src", config=ids)


def test_upgrade_keeps_the_sources_top_level_ids(invoke, tmp_path):
    """The reported bug: a SpecForge-layout drafter with its ids at the top level and in eagle_config (both
    runners read the top level) lost the top-level ids on upgrade, so V2 fell back to the target's default."""
    src = _with_ids(tmp_path, [3, 5, 6], [3, 5, 6])
    before = read_batch([Request(str(src), json.loads((src / "config.json").read_text()), 8)], ask=False)[0]
    assert before.get("v1").boundary_ids == before.get("v2").boundary_ids == (3, 5, 6)
    r = invoke("upgrade", src, tmp_path / "up", "--init", "ones", "--json")
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "up" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # SpecForge's own numbering
    assert "target_layer_ids" not in cfg
    after = read_batch([Request(str(tmp_path / "up"), cfg, 8)], ask=False)[0]
    assert after.get("v1").boundary_ids == after.get("v2").boundary_ids == (3, 5, 6)
    doc = json.loads(r.stdout)
    assert any("v1 = v2 capture [3, 5, 6]" in line for line in doc["checked"]), doc["checked"]


# ------------------------------------------------------------------------------------ one interpretation

@pytest.fixture
def mislabelled(tmp_path):
    """The output-numbered fixture with its output ids [2, 4, 5] copied to vLLM's top-level key: the files (and
    every table) say boundaries [2, 4, 5]; the weights were trained on [3, 5, 6]."""
    return _with_ids(tmp_path, [2, 4, 5], [2, 4, 5])


def test_verify_target_takes_the_measured_layers(invoke, mislabelled):
    assert open_drafter(str(mislabelled)).spec.capture_ids(8) == (2, 4, 5)  # the table's reading
    r = invoke("verify", mislabelled, "--target", TRAINED / "target", "--json")
    doc = json.loads(r.stdout)
    assert doc["layers"]["boundary_ids"] == [3, 5, 6] and doc["layers"]["how"].startswith("measured"), doc["layers"]
    assert doc["inputs"].endswith("aux ids [3, 5, 6]"), doc["inputs"]


def test_upgrade_fidelity_and_written_ids_take_the_measured_layers(invoke, mislabelled, tmp_path):
    r = invoke("upgrade", mislabelled, tmp_path / "up", "--target", TRAINED / "target", "--init", "ones",
               "--no-fc-norm", "--json")  # norm_output only: no calibration, the fidelity step still measures
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["layers"]["boundary_ids"] == [3, 5, 6] and doc["layers"]["how"].startswith("measured")
    assert doc["fidelity"]["inputs"].endswith("aux ids [3, 5, 6]"), doc["fidelity"]["inputs"]
    cfg = json.loads((tmp_path / "up" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]  # the measured layers are what is written
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert any("(measured): v1 = v2 capture [3, 5, 6]" in line for line in doc["checked"]), doc["checked"]
