"""Issue 18: hostile input, second round. Captures (--states), prompt files, manifests and server replies go
through bounded readers: each surface has its own error and exit code (19 invalid-states, 20 prompt-file,
21 manifest, 22 server-reply), degenerate numbers are refused, and seeded fuzzing finds no internal error."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from eaglectl.commands.upgrade import calibration
from eaglectl.errors import InvalidStatesError

from .conftest import ROOT
from .fuzzing import (
    VOCAB,
    clean,
    fuzz_captures,
    fuzz_manifests,
    fuzz_prompt_files,
    fuzz_server,
    make_capture,
    read_dump,
    scale_cases,
    write_dump,
)
from .helpers import drift_run, edited, run_json, unreadable

TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"
DRAFTER = TRAINED / "eagle3"


@pytest.fixture(scope="module")
def small_capture(tmp_path_factory):
    """A valid capture of the trained target: 2 requests of 32 tokens, boundaries 0..8."""
    return make_capture(tmp_path_factory.mktemp("hostile") / "cap")


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def first_line(text: str) -> str:
    return text.strip().splitlines()[0]


# ------------------------------------------------------------------------------------------ captures

def test_an_all_nan_capture_is_refused_by_upgrade_and_nothing_is_written(small_capture, tmp_path, invoke):
    cap = _copy(small_capture, tmp_path / "nan")
    for f in sorted(cap.glob("*.safetensors")):
        t = read_dump(f)
        t["hidden_states"] = ("F32", np.full_like(t["hidden_states"][1], np.nan))
        write_dump(f, t)
    dest = tmp_path / "up"
    r = invoke("upgrade", DRAFTER, dest, "--states", cap, "--to", "speculators")
    assert r.exit_code == 19, r.output
    assert first_line(r.stderr) == (f"error[invalid-states]: {cap}/00000.safetensors: hidden_states holds a "
                                    "non-finite value (nan) at token 0, boundary 0: a broken capture, refused")
    assert not dest.exists() and "fidelity" not in r.stdout


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_capture_with_an_out_of_vocabulary_token_is_refused(small_capture, tmp_path, invoke, command):
    cap = _copy(small_capture, tmp_path / "oov")
    f = cap / "00000.safetensors"
    t = read_dump(f)
    t["token_ids"][1][5] = VOCAB
    write_dump(f, t)
    r = invoke(command, DRAFTER, "--states", cap)
    assert r.exit_code == 19, r.output
    assert first_line(r.stderr) == (f"error[invalid-states]: {f}: token_ids[5] = 320 is outside the vocabulary "
                                    "[0, 320)")


def test_capture_json_fields_are_typed(small_capture, tmp_path, invoke):
    cap = _copy(small_capture, tmp_path / "meta")
    meta = json.loads((cap / "capture.json").read_text())
    for change, expected in (
            ({"target_config": [1]}, "'target_config' must be an object"),
            ({"target_config": {**meta["target_config"], "num_hidden_layers": "8"}},
             "config 'target_config.num_hidden_layers' should be an integer in [1, 4096], got \"8\""),
            ({"target_config": {**meta["target_config"], "num_hidden_layers": 4}}, "go beyond boundary 4"),
            ({"layer_ids": [0, 1, 2, 99999]}, "'layer_ids' must be ascending")):
        (cap / "capture.json").write_text(json.dumps({**meta, **change}))
        r = invoke("verify", DRAFTER, "--states", cap, "--tokens", "16")
        assert r.exit_code == 19 and expected in r.stderr, (change, r.stderr)


def test_a_huge_token_id_never_sizes_an_array(small_capture, tmp_path):
    """drift --states once sized a lookup table by the largest token id (numpy.full of 2**62 entries)."""

    cap = _copy(small_capture, tmp_path / "huge")
    meta = json.loads((cap / "capture.json").read_text())
    del meta["target_config"]["vocab_size"]  # the drafter's vocab still bounds the ids
    (cap / "capture.json").write_text(json.dumps(meta))
    f = cap / "00001.safetensors"
    t = read_dump(f)
    t["token_ids"][1][0] = 2**62
    write_dump(f, t)
    with pytest.raises(InvalidStatesError, match=r"token_ids\[0\] = 4611686018427387904 is outside the vocabulary"):
        drift_run([str(TRAINED / "eagle3.1")], states=str(cap), max_tokens=8, num_prompts=2, bootstrap_reps=100)


def test_requests_too_short_for_the_fidelity_check_are_refused_before_writing(small_capture, tmp_path, invoke):
    cap = _copy(small_capture, tmp_path / "short")
    for f in cap.glob("*.safetensors"):
        t = read_dump(f)
        write_dump(f, {k: (d, a[:3]) for k, (d, a) in t.items()})
    r = invoke("upgrade", DRAFTER, tmp_path / "up", "--states", cap, "--to", "speculators", "--init", "ones")
    assert r.exit_code == 19 and "longer than 4 tokens: too few states" in r.stderr, r.output
    assert not (tmp_path / "up").exists()


def test_a_capture_shorter_than_the_fidelity_window_is_measured_on_fewer_anchors(small_capture, tmp_path, invoke):
    r = invoke("upgrade", DRAFTER, tmp_path / "up", "--states", small_capture, "--to", "speculators", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["statistics"]["solver"] == "ridge 1e-06" and "29 tokens" not in doc["fidelity"]["inputs"]
    assert doc["fidelity"]["per_step"][0]["top1_agreement"] is not None


# --------------------------------------------------------------------------------------- calibration

def _moments(aux: np.ndarray) -> calibration.Moments:
    W = np.random.default_rng(0).standard_normal((8, 12))
    return calibration.accumulate(W, 3, 4, 1e-6, [aux])


def test_degenerate_states_are_refused_with_a_reason():
    rng = np.random.default_rng(1)
    aux = rng.standard_normal((40, 12))
    aux[:, 4:8] = 0.0  # chunk 1 is zero on every token
    with pytest.raises(InvalidStatesError, match="aux chunk 1 is zero on all 39 calibration tokens"):
        calibration.fit("calibrated", 3, 4, _moments(aux))
    with pytest.raises(InvalidStatesError, match="no calibration tokens"):
        calibration.fit("harmonic", 3, 4, _moments(aux[:1]))
    aux[7, 2] = np.nan
    with pytest.raises(InvalidStatesError, match="non-finite value at token 7"):
        _moments(aux)


def test_duplicated_states_calibrate_with_the_stated_ridge():
    aux = np.repeat(np.random.default_rng(2).standard_normal((1, 12)), 50, axis=0)  # U has rank 1
    for init in ("calibrated", "refit"):
        gammas, fc, stats = calibration.fit(init, 3, 4, _moments(aux))
        assert stats["solver"] == "ridge 1e-06" and all(np.isfinite(g).all() for g in gammas)
        assert fc is None or np.isfinite(fc).all()


def test_a_singular_system_falls_back_to_a_larger_ridge_and_says_so():
    y = -1e-6
    for _ in range(100):  # the fixed point where A + 1e-6·tr(A)/D·I is exactly singular
        y = -(1e-6 * (2.0 + y) / 2)
    A = np.diag([2.0, y])
    assert (A + 1e-6 * float(np.trace(A)) / 2 * np.eye(2))[1, 1] == 0.0
    x, how = calibration._ridge_solve(A, np.array([1.0, 1.0]))
    assert how == "ridge 0.001 (the 1e-06 solve was singular)" and np.isfinite(x).all()
    with pytest.raises(InvalidStatesError, match="degenerate"):
        calibration._ridge_solve(np.zeros((3, 3)), np.ones(3))


# ------------------------------------------------------------------------------------------ prompt files

def test_a_prompt_line_that_is_not_an_object_is_a_prompt_file_error(tmp_path, invoke):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt_token_ids": [5, 6, 7]}\n[1, 2]\n')
    expected = (f"error[prompt-file]: {p}:2: a prompt line must be a JSON object ({{\"prompt\": ...}}, "
                "{\"messages\": ...} or {\"prompt_token_ids\": ...}), not an array")
    r = invoke("smoke", DRAFTER, "--target", TARGET, "--engine", "reference", "--prompts", p, "--max-tokens", "4")
    assert r.exit_code == 20 and first_line(r.stderr) == expected, r.output
    out = tmp_path / "cap"
    r = invoke("capture", TARGET, "--prompts", p, "--out", out, "--layers", "2,4,5")
    assert r.exit_code == 20 and first_line(r.stderr) == expected, r.output
    assert not out.exists()


@pytest.mark.parametrize("content,expected", [
    (b"", "the prompt file is empty"),
    (b'{"prompt_token_ids": [5, 320]}\n', "token id 320 is outside the target's vocabulary [0, 320)"),
    (b'{"prompt": 5}\n', "'prompt' must be a string, not a number"),
    (b'{"prompt": "ok\xff"}\n', "not UTF-8"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}\n', "chat 'messages' need a target tokenizer with a chat "
                                                             "template"),
    (b'{"messages": [{"role": "user"}]}\n', "messages[0] must be an object with 'role' and 'content'"),
    (b'{"prompt_token_ids": []}\n', "a prompt of 0 tokens"),
])
def test_bad_prompt_files_name_the_file_and_line(tmp_path, invoke, content, expected):
    p = tmp_path / "p.jsonl"
    p.write_bytes(content)
    r = invoke("smoke", DRAFTER, "--target", TARGET, "--engine", "reference", "--prompts", p, "--max-tokens", "4")
    assert r.exit_code == 20 and r.stderr.startswith(f"error[prompt-file]: {p}") and expected in r.stderr, r.stderr


def test_a_missing_prompt_file_is_a_prompt_file_error(tmp_path, invoke):
    r = invoke("smoke", DRAFTER, "--target", TARGET, "--engine", "reference", "--prompts", tmp_path / "none.jsonl")
    assert r.exit_code == 20 and "prompt file not found" in r.stderr


def test_a_speed_bench_folder_of_the_wrong_schema(tmp_path, invoke):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "speed"
    folder.mkdir()
    pq.write_table(pa.table({"category": ["code"], "turns": pa.array([[1]], pa.list_(pa.int64()))}),
                   folder / "x.parquet")
    r = invoke("smoke", DRAFTER, "--target", TARGET, "--engine", "reference", "--prompts", folder)
    assert r.exit_code == 20 and f"{folder}/x.parquet: 'turns' is list<" in r.stderr, r.stderr
    assert "int64>, not a list of strings (SPEED-Bench schema)" in r.stderr


# ---------------------------------------------------------------------------------------------- manifests

def test_manifest_values_that_no_path_can_hold(tmp_path, invoke):
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"source": "a\u0000b", "dest": str(tmp_path / "d")}) + "\n")
    r = invoke("convert", "--manifest", m, "--to", "modelopt")
    assert r.exit_code == 21 and first_line(r.stderr) == (f"error[manifest]: {m}:1: 'source' holds a NUL character "
                                                          "(not a usable path or value)")
    m.write_text(json.dumps({"source": "x", "dest": "y", "aux_layer_ids": {"a": 1}}) + "\n")
    r = invoke("convert", "--manifest", m, "--to", "modelopt")
    assert r.exit_code == 21 and "'aux_layer_ids' must be a string" in r.stderr
    m.write_text(json.dumps({"source": "x", "dest": "y", "measure": 1.5}) + "\n")
    r = invoke("convert", "--manifest", m, "--to", "modelopt")
    assert r.exit_code == 21 and "'measure' must be true or false" in r.stderr


# ------------------------------------------------------------------------------------------ server replies

def test_a_server_that_never_answers_is_cut_off_at_the_timeout(invoke):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections (the kernel's backlog) and never answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        t = time.perf_counter()
        r = invoke("smoke", DRAFTER, "--target", TARGET, "--server", url, "--timeout-s", "1", "--num-prompts", "2")
        elapsed = time.perf_counter() - t
    finally:
        listener.close()
    assert r.exit_code == 22, r.output
    assert first_line(r.stderr) == f"error[server-reply]: {url}/v1/models: no complete reply within 1 s"
    assert elapsed < 10  # the inspect pre-flight plus one bounded wait


# --------------------------------------------------------------- issue 30: no hang, no unbounded read

def test_a_speed_bench_folder_1500_levels_deep_is_refused(tmp_path, invoke):
    """The walk was rglob (recursive): a RecursionError, exit 70. It is iterative and stops at tree_depth."""
    folder = tmp_path / "speed"
    here = str(folder)
    os.mkdir(here)
    for _ in range(1500):  # one by one: pathlib's and os.makedirs' own parents=True recurse
        here = os.path.join(here, "d")
        os.mkdir(here)
    try:
        r = invoke("smoke", DRAFTER, "--target", TARGET, "--engine", "reference", "--prompts", folder)
    finally:  # deepest first: pytest's own cleanup of old temp folders recurses, and would fail on this tree
        while here != str(folder):
            os.rmdir(here)
            here = os.path.dirname(here)
    below = folder.joinpath(*["d"] * 33)
    assert r.exit_code == 20, r.output
    assert first_line(r.stderr) == (f"error[prompt-file]: {below}: a folder 33 levels below {folder}; at most 32 "
                                    "are read")


def test_a_fifo_named_parquet_is_refused_without_opening_it(tmp_path, invoke):
    folder = tmp_path / "speed"
    folder.mkdir()
    os.mkfifo(folder / "x.parquet")  # opening it for reading would block until a writer came
    r = invoke("smoke", DRAFTER, "--target", TARGET, "--engine", "reference", "--prompts", folder)
    assert r.exit_code == 20, r.output
    assert first_line(r.stderr) == (f"error[prompt-file]: {folder}/x.parquet: not a regular file (a FIFO); it is "
                                    "not read")


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_manifest_that_is_no_regular_file_is_refused_unread(tmp_path, invoke, kind):
    """A FIFO as --manifest hung; /dev/zero (size 0 by stat) was read until MemoryError at 3.4 GB (exit 70)."""
    m = tmp_path / "m.jsonl"
    if kind == "fifo":
        os.mkfifo(m)
    else:
        m.symlink_to(kind)
    r = invoke("convert", "--manifest", m, "--to", "modelopt")
    assert r.exit_code == 21, r.output
    what = "a FIFO" if kind == "fifo" else "a device"
    assert first_line(r.stderr) == f"error[manifest]: {m}: not a regular file ({what}); it is not read"


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "big"])
def test_a_calibration_text_that_is_no_regular_file_or_too_big_is_refused(tmp_path, invoke, kind):
    text = tmp_path / "text.txt"
    says = unreadable(text, kind, "calibration_text_bytes")
    dest = tmp_path / "up"
    r = invoke("upgrade", DRAFTER, dest, "--target", TARGET, "--calibration-text", text)
    assert r.exit_code == 2 and f"Invalid value for '--calibration-text': {text}: {says}" in r.stderr, r.stderr
    assert not dest.exists()
    r = invoke("verify", DRAFTER, "--target", TARGET, "--text", text)
    assert r.exit_code == 2 and f"{text}: {says}" in r.stderr, r.stderr


def test_a_prompt_too_long_for_max_model_len_is_refused_before_tokenizing(tmp_path, invoke, monkeypatch):
    """A 5 MB prompt line was tokenized (1.2-1.4 GB) before its length was checked."""
    from eaglectl.measure import workload

    def never(*args, **kwargs):
        raise AssertionError("tokenized")

    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt": "word " * 20_000}) + "\n")  # 100,000 bytes: over 64 x the 1,021 tokens left
    monkeypatch.setattr(workload.PlainTokenizer, "__call__", never)
    r = invoke("smoke", DRAFTER, "--target", TARGET, "--engine", "reference", "--prompts", p, "--max-tokens", "8",
               "--max-model-len", "1034")
    assert r.exit_code == 20, r.output
    assert first_line(r.stderr) == (f"error[prompt-file]: {p}:1: a prompt of 100000 bytes has more than the 1021 "
                                    "tokens it may have here (no token spans more than 64 bytes); refused before "
                                    "tokenizing")


def test_reads_of_2_gib_or_more_loop_until_done(tmp_path, monkeypatch):
    """One pread returns at most 2 GiB - 4 KiB on Linux: a tensor of 2 GiB or more read as "data truncated".
    Stand-in: a pread (and preadv) that returns at most 1,000 bytes at a time."""
    from eaglectl.io import bounded
    from eaglectl.io.safetensors import LocalFile

    data = bytes(range(256)) * 40
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    real_pread, real_preadv = os.pread, os.preadv
    monkeypatch.setattr(bounded.os, "pread", lambda fd, n, off: real_pread(fd, min(n, 1000), off))
    monkeypatch.setattr(bounded.os, "preadv", lambda fd, bufs, off: real_preadv(fd, [bufs[0][:1000]], off))
    f = LocalFile(path)
    assert bytes(f.read(5, 9000)) == data[5:9005]
    assert bytes(f.read(10_000, 500)) == data[10_000:] and bytes(f.read(20_000, 10)) == b""


@pytest.mark.slow
def test_a_sparse_file_read_of_2_gib_is_whole(tmp_path):
    from eaglectl.io.safetensors import LocalFile

    path = tmp_path / "sparse.bin"
    with path.open("wb") as f:
        f.truncate(2**31 + 16)
        f.seek(2**31 + 8)
        f.write(b"12345678")
    raw = LocalFile(path).read(8, 2**31 + 8)
    assert len(raw) == 2**31 + 8 and bytes(raw[-8:]) == b"12345678"


def test_200000_quantisation_exclusions_are_refused_in_seconds(tmp_path, invoke):
    """200,000 ignore patterns kept convert running past 120 s (each matched against every module, renamed with
    a quadratic duplicate check): beyond quant_exclusions the list is a finding and convert refuses."""
    src = _copy(ROOT / "fixtures" / "drafters" / "speculators-fp8", tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"]["ignore"] += [f"*layers.{i}.mlp.x*" for i in range(200_000)]
    (src / "config.json").write_text(json.dumps(cfg))
    r = invoke("convert", src, tmp_path / "out", "--to", "modelopt")
    assert r.exit_code == 7, r.output
    assert "'ignore' holds 200002 entries, more than the limit of 10000" in first_line(r.stderr)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ fuzzing

def test_fuzzing_captures(small_capture, tmp_path):
    """Seeded, in process: 1,000 mutated captures through the reader and the --states consumers."""
    clean(fuzz_captures(tmp_path, small_capture, cases=1000, seed=0), "captures", 1000, 0, 19)  # both outcomes


def test_fuzzing_prompt_files(tmp_path):
    clean(fuzz_prompt_files(tmp_path, cases=500, seed=0), "prompt files", 500, 0, 20)


def test_fuzzing_manifests(tmp_path):
    clean(fuzz_manifests(tmp_path, cases=300, seed=0), "manifests", 300, 21)


def test_fuzzing_server_replies(tmp_path):
    clean(fuzz_server(tmp_path, cases=240, seed=0), "server replies", 240, 0, 22)


@pytest.mark.slow
def test_fuzzing_captures_at_scale(small_capture, tmp_path):
    """Another seed, more cases (EAGLECTL_FUZZ_CASES sets how many)."""
    n = scale_cases(2000)
    clean(fuzz_captures(tmp_path, small_capture, cases=n, seed=1, full_share=0.15), "captures (slow)", n)


# ------------------------------------------------------------- issue 44: hostile input, fourth round

SPECULATORS = ROOT / "fixtures" / "drafters" / "speculators-3.1"


def test_a_list_model_type_in_a_speculators_config_is_a_refusal_not_a_crash(tmp_path, invoke):
    """vLLM's reader table looked a list up in a dict (TypeError: unhashable type, exit 70)."""
    src = edited(SPECULATORS, tmp_path, config=lambda c: c["transformer_layer_config"].update(model_type=["llama"]))
    r, doc = run_json(invoke, "inspect", src, code=1)
    errors = {f["rule_id"]: f for f in doc["findings"] if f["severity"] == "error"}
    assert errors["config-field-invalid"]["locator"].endswith("config.json:transformer_layer_config.model_type")
    assert [x["error"] for x in doc["engine_readings"]] == [
        "ValueError: Unsupported model_type ['llama'] for eagle3 speculator"] * 2, doc["engine_readings"]


def test_a_problem_recorded_while_reporting_is_reported_once(tmp_path, invoke):
    """Reporting one invalid field read the config again (the hint's placeholders) and recorded another: the
    dictionary changed size during iteration (exit 70)."""
    def edit(c):
        c["speculators_config"]["verifier"]["name_or_path"] = ["x"]
        c["transformer_layer_config"]["head_dim"] = "\ud800"

    src = edited(SPECULATORS, tmp_path, config=edit)
    r, doc = run_json(invoke, "inspect", src, code=1)
    invalid = sorted(f["locator"].rsplit(":", 1)[1] for f in doc["findings"] if f["rule_id"] == "config-field-invalid")
    assert invalid == ["speculators_config.verifier.name_or_path", "transformer_layer_config.head_dim"], invalid


@pytest.mark.parametrize("depth", [-1, 0, 10**12, "8", 8.5])
def test_a_target_depth_that_is_no_layer_count_is_refused_by_name(tmp_path, invoke, depth):
    """check --target crashed in the aux-id default (None // 2, exit 70)."""
    target = edited(TARGET, tmp_path, config={"num_hidden_layers": depth})
    for args in (("check", DRAFTER, "--target", target, "--no-card"), ("inspect", DRAFTER, "--target", target)):
        r = invoke(*args)
        assert r.exit_code == 4, r.output
        assert first_line(r.stderr) == (f"error[corrupt-checkpoint]: {target}/config.json: config 'num_hidden_layers' "
                                        f"should be an integer in [1, 4096], got {json.dumps(depth)}")


def test_a_target_model_type_transformers_cannot_build_is_eaglectls_error(tmp_path, invoke):
    target = edited(TARGET, tmp_path, name="listed", config={"model_type": ["llama"]})
    r = invoke("check", DRAFTER, "--target", target, "--no-card")
    assert r.exit_code == 4 and "config 'model_type' should be a string" in first_line(r.stderr), r.output
    target = edited(TARGET, tmp_path, name="unknown", config={"model_type": "nope"})
    r, doc = run_json(invoke, "check", DRAFTER, "--target", target, "--no-card", code=1)
    parity = next(s for s in doc["stages"] if s["name"] == "parity")
    assert parity["status"] == "fail" and parity["detail"] == (
        f"[unknown-format] {target}/config.json: model_type 'nope' is not a model transformers knows, so the target "
        "cannot be run"), parity
    r, doc = run_json(invoke, "inspect", DRAFTER, "--target", target, code=0)
    assert "model_type 'nope' is not a model transformers knows" in doc["measured_note"], doc["measured_note"]


def test_check_no_card_refuses_the_profile_upload_refuses(invoke, tmp_path):
    """check --no-card never read speculation_profile.json, which upload sends and refuses when broken."""
    for content in ("{not json", json.dumps({"schema_version": "1.0", "measured": "yes"})):
        d = edited(DRAFTER, tmp_path, name="d", files={"speculation_profile.json": content})
        r, doc = run_json(invoke, "check", d, "--no-card", code=1)
        card = next(s for s in doc["stages"] if s["name"] == "card")
        assert card["status"] == "fail" and card["detail"].startswith("--no-card; [profile-invalid] "), card
        r = invoke("upload", d, "org/name", "--no-card", "--dry-run")
        assert r.exit_code == 1 and "not uploaded: the gate failed" in r.output, r.output
        import shutil

        shutil.rmtree(d)


def test_a_hard_link_to_a_file_outside_the_folder_is_never_uploaded(invoke, tmp_path):
    d = edited(DRAFTER, tmp_path, name="d")
    outside = tmp_path / "secrets.json"
    outside.write_text('{"token": "x"}')
    os.link(outside, d / "notes.json")
    r = invoke("upload", d, "org/name", "--no-card", "--dry-run")  # as a link out of the folder: the gate fails
    assert r.exit_code == 1 and "0 file(s) to org/name" in r.output, r.output
    said = " ".join(r.output.split())  # the view wraps lines
    assert f"not uploaded: {d}/notes.json: a hard link: the file has 2 names and 1 of them" in said
    r, doc = run_json(invoke, "check", d, "--no-card", code=1)
    assert next(s for s in doc["stages"] if s["name"] == "publish")["status"] == "fail"
    os.unlink(outside)  # both names inside the folder: one file sent twice, as before
    os.link(d / "notes.json", d / "notes-2.json")
    r = invoke("upload", d, "org/name", "--no-card", "--dry-run")
    assert r.exit_code == 0 and "notes-2.json" in r.output, r.output


@pytest.mark.parametrize("version", ["٠.٨", "0.٨", "０.８"])
def test_a_release_number_takes_ascii_digits_only(invoke, version):
    """'٠.٨' (Arabic-Indic digits) read as 0.8: Python's \\d and int() take any Unicode digit."""
    r = invoke("inspect", DRAFTER, "--engine-version", version)
    assert r.exit_code == 2 and "is not a release number like 0.34" in r.stderr, r.output


@pytest.mark.parametrize("args", [("smoke", DRAFTER, "--target", TARGET, "--engine", "reference", "--num-prompts", "1",
                                   "--max-tokens", "4", "--profile", "{d}/config.json"),
                                  ("check", DRAFTER, "--target", TARGET, "--no-card", "--sarif", "{t}/config.json"),
                                  ("capture", TARGET, "--out", "{t}/cap", "--layers", "2,4,5")])
def test_an_output_on_an_input_is_output_overlaps_input_not_a_conversion(invoke, args):
    import hashlib

    def files():  # every input file, by its bytes: a refusal that still wrote (in a `finally`) changes one
        return {f: hashlib.sha256(f.read_bytes()).hexdigest() for root in (DRAFTER, TARGET)
                for f in sorted(Path(root).rglob("*")) if f.is_file()}

    before = files()
    argv = [str(a).format(d=DRAFTER, t=TARGET) for a in args]
    r = invoke(*argv, "--json")
    assert r.exit_code == 23, r.output
    error = json.loads(r.stdout)["error"]
    assert error["reference"] == "output-overlaps-input" and "overlaps the source/input" in error["message"], error
    assert files() == before and not (Path(TARGET) / "cap").exists()


def test_a_full_disk_under_capture_is_a_filesystem_error(invoke, tmp_path, monkeypatch):
    """capture --out on a full disk printed a raw traceback (exit 1); convert and upgrade said exit 15."""
    import errno

    from eaglectl.commands import capture
    from eaglectl.io import safetensors

    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(safetensors, "_write_all", full)
    out = tmp_path / "cap"
    r = invoke("capture", TARGET, "--out", out, "--layers", "2,4,5", "--num-prompts", "1", "--length", "8")
    assert r.exit_code == 15, r.output
    assert "cannot write the capture in it (No space left on device)" in first_line(r.stderr)
    assert "hint: the disk is full" in r.stderr and not out.exists()
    assert capture.write_safetensors is safetensors.write_safetensors


# --------------------------------------------------------- a source that shrinks while it is read (exit 16)



@pytest.mark.parametrize("reader", ["sha256_range", "same_bytes", "copy_range", "LocalFile.read"])
def test_a_range_that_shrank_is_source_changed_not_sigbus(tmp_path, reader):
    """Read through mmap, a shrunk source killed convert with SIGBUS (rc 135, no message) in 8 of 15 tries."""
    from eaglectl.errors import SourceChangedError
    from eaglectl.io import safetensors as st

    size = 1 << 20
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(size))
    opened = st.LocalFile(path)
    r = st.ByteRange(path, 0, size)
    with path.open("r+b") as f:  # shrinks after it was opened and its ranges taken
        f.truncate(1000)
    with pytest.raises(SourceChangedError, match=r"ends before byte \d+: the (file|source) changed \(shrank\)"):
        if reader == "sha256_range":
            st.sha256_range(r)
        elif reader == "same_bytes":
            st.same_bytes(r, r)
        elif reader == "copy_range":
            fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
            try:
                st.copy_range(r, fd, 0)
            finally:
                os.close(fd)
        else:
            opened.read(0, size)


def test_a_source_truncated_while_convert_copies_it_is_exit_16(invoke, tmp_path, monkeypatch):
    from eaglectl.commands.convert import command

    src = edited(ROOT / "fixtures" / "drafters" / "speculators-3.1", tmp_path, name="src")
    real = command.write_safetensors

    def truncate_then_write(*args, **kwargs):
        with (src / "model.safetensors").open("r+b") as f:
            f.truncate(4096)
        return real(*args, **kwargs)

    monkeypatch.setattr(command, "write_safetensors", truncate_then_write)
    out = tmp_path / "out"
    r = invoke("convert", src, out, "--to", "modelopt")
    assert r.exit_code == 16 and first_line(r.stderr).startswith("error[source-changed]: "), r.output
    assert "changed (shrank) while it was" in first_line(r.stderr) and not out.exists()
