"""Hub ids through huggingface_hub's cache and offline mode (the Hub itself is unreachable here).

These run the CLI in a subprocess so that huggingface_hub reads HF_HUB_CACHE / HF_HUB_OFFLINE /
HF_ENDPOINT from the environment exactly as it does for users.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from eaglectl.io.hub import parse_hub_id

from .conftest import DRAFTERS, ROOT, TARGET

SHA = "0123456789abcdef0123456789abcdef01234567"


def _cache(tmp_path, repo: str, src, sub: str | None = None):
    cache = tmp_path / "hub"
    folder = cache / f"models--{repo.replace('/', '--')}"
    snap = folder / "snapshots" / SHA
    shutil.copytree(src, snap / sub if sub else snap)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(SHA)
    return cache


def _run(cache, *args, offline=True):
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    else:
        env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens: the Hub is unreachable
        env["HF_HUB_ETAG_TIMEOUT"] = "2"
    return subprocess.run([sys.executable, "-m", "eaglectl", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)


@pytest.mark.parametrize("text,expected", [
    ("org/name", ("org/name", None, None)),
    ("org/name@v1.0", ("org/name", "v1.0", None)),
    ("hf://org/name@abc/sub/dir", ("org/name", "abc", "sub/dir")),
    ("hf://org/name", ("org/name", None, None)),
    ("org/name/sub", None),  # a subfolder needs hf://
    ("./local", None),
    ("name", None),
])
def test_parse_hub_id(text, expected):
    ref = parse_hub_id(text)
    assert (None if ref is None else (ref.repo_id, ref.revision, ref.subfolder)) == expected


def test_cached_repo_inspects_offline_and_reports_the_sha(tmp_path):
    cache = _cache(tmp_path, "acme/drafter-eagle3", DRAFTERS / "speculators-3.1")
    r = _run(cache, "inspect", "acme/drafter-eagle3", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["dialect"] == "speculators" and doc["inputs"]["sha"] == SHA
    assert doc["speculative_config"]["model"] == "acme/drafter-eagle3"
    assert doc["speculative_config"]["revision"] == SHA


def test_revision_and_subfolder_forms(tmp_path):
    cache = _cache(tmp_path, "acme/heads", DRAFTERS / "speculators-3.1", sub="llama")
    r = _run(cache, "inspect", f"hf://acme/heads@{SHA}/llama", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["dialect"] == "speculators" and doc["speculative_config"]["model"] == "acme/heads/llama"
    r = _run(cache, "inspect", "acme/heads", "--revision", "main", "--json")
    assert r.returncode == 3  # the snapshot root holds no weights, only the subfolder does


def test_hub_target(tmp_path):
    cache = _cache(tmp_path, "acme/tiny-llama", TARGET)
    r = _run(cache, "inspect", str(DRAFTERS / "speculators-3.1"), "--target", "acme/tiny-llama", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["target"]["revision"] == SHA
    assert any(f["rule_id"] == "target-embeddings" for f in doc["findings"])


def test_not_cached_offline_is_one_line_exit_3(tmp_path):
    (tmp_path / "hub").mkdir()
    r = _run(tmp_path / "hub", "inspect", "acme/missing")
    assert r.returncode == 3
    assert r.stderr.startswith("error[checkpoint-not-found]: acme/missing: no such local file or folder, and as a Hub "
                               "id: acme/missing@main: not in the local Hugging Face cache")
    assert "Traceback" not in r.stderr


def test_unreachable_hub_falls_back_to_the_cache(tmp_path):
    cache = _cache(tmp_path, "acme/drafter", DRAFTERS / "speculators-3")
    r = _run(cache, "inspect", "acme/drafter", "--json", offline=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["inputs"]["sha"] == SHA
    r = _run(cache, "inspect", "acme/other", offline=False)
    assert r.returncode == 3 and "unreachable" in r.stderr


def test_base_model_alone_names_the_verifiers_architectures_from_the_cache(tmp_path):
    """Issue 47: `--base-model ORG/NAME` without --target records the verifier's architectures from its cached
    config (offline); a base model not in the cache is written without them, and a warning says so."""
    cache = _cache(tmp_path, "acme/tiny-llama", TARGET)
    r = _run(cache, "convert", str(DRAFTERS / "eagle-3"), str(tmp_path / "a"), "--to", "speculators",
             "--base-model", "acme/tiny-llama")
    assert r.returncode == 0, r.stderr
    verifier = json.loads((tmp_path / "a" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": "acme/tiny-llama",
                        "architectures": json.loads((TARGET / "config.json").read_text())["architectures"]}
    r = _run(cache, "convert", str(DRAFTERS / "eagle-3"), str(tmp_path / "b"), "--to", "speculators",
             "--base-model", "acme/not-cached")
    assert r.returncode == 0, r.stderr
    assert "written with no architectures" in " ".join(r.stdout.split())


def test_minimax_m3s_dspark_subfolder_is_read_from_the_hub_cache(tmp_path):
    """Issue 48: vLLM 0.34 reads MiniMax-M3's DSpark drafter from the target repository's dspark/ subfolder.
    inspect ORG/TARGET reads it there (a cached snapshot), and hf://ORG/TARGET/dspark reads the subfolder as the
    DSpark drafter it is; a snapshot fetched without the subfolder is not called broken: the next command is named."""
    from .conftest import FIXTURES

    cache = _cache(tmp_path, "acme/minimax-m3", TARGET)
    snap = cache / "models--acme--minimax-m3" / "snapshots" / SHA
    config = json.loads((snap / "config.json").read_text())
    (snap / "config.json").write_text(json.dumps(config | {"model_type": "minimax_m3_text"}))
    r = _run(cache, "inspect", "acme/minimax-m3", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["in_target"]["where"] == "dspark/", r.stderr
    assert "eaglectl inspect hf://acme/minimax-m3/dspark" in json.dumps(doc["findings"])
    shutil.copytree(FIXTURES / "families" / "dspark", snap / "dspark")
    draft = json.loads((snap / "dspark" / "config.json").read_text())
    (snap / "dspark" / "config.json").write_text(json.dumps(
        draft | {"architectures": ["DSparkMiniMaxDraftModel"], "dspark_markov_rank": 8, "dspark_use_dense_ffn": True}))
    r = _run(cache, "inspect", "acme/minimax-m3", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["summary"]["error"] == 0, r.stdout
    r = _run(cache, "inspect", "hf://acme/minimax-m3/dspark", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["family"]["id"] == "dspark", r.stderr
