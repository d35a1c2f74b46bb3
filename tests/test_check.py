"""`eaglectl check`: the gate over fixtures and planted defects, the model card, SARIF, batches."""

from __future__ import annotations

import json

import pytest

from eaglectl.rules import RULES

from .conftest import CORRUPT, DEFECTS, DRAFTERS, TARGET
from .helpers import edited, run_json


# specforge-3 and modelopt-mla keep their ids only in eagle_config: vLLM's two runners capture different layers
@pytest.mark.parametrize("name,code", [("speculators-3.1", 0), ("specforge-3", 1), ("eagle-3", 0),
                                       ("modelopt-mla", 1), ("nemo-3.1", 1)])
def test_fixture_verdicts(invoke, name, code):
    r, doc = run_json(invoke, "check", DRAFTERS / name, "--target", TARGET)
    assert r.exit_code == code == doc["exit_code"]
    stages = {s["name"]: s for s in doc["stages"]}
    assert list(stages) == ["inspect", "parity", "smoke", "card", "publish"]
    assert stages["smoke"]["status"] == "skipped" and "--smoke" in stages["smoke"]["detail"]
    if code == 0:
        assert stages["parity"]["status"] == "pass"
    else:
        assert stages["parity"]["status"] == "skipped"  # never "passed" after inspect errors


SCAN_ONLY = {"random-weights"}  # reads every matrix: inspect --scan finds it (test_inspect); check does not scan


@pytest.mark.parametrize("rule", sorted(p.name for p in DEFECTS.iterdir() if p.name not in SCAN_ONLY))
def test_every_planted_defect_fails_the_strict_gate_with_its_rule(invoke, rule):
    with_target = ["--target", TARGET] if rule == "draft-context-cap" else []  # only a target reveals it
    r, doc = run_json(invoke, "check", DEFECTS / rule, "--strict", "--no-card", *with_target)
    from eaglectl.rules import RULES

    if RULES.get(rule) is not None and RULES[rule].engine == "sglang":  # sglang's advice: info for the vLLM gate
        assert r.exit_code == 0 and {f["severity"] for f in doc["findings"] if f["rule_id"] == rule} == {"info"}
        return
    assert r.exit_code == 1, doc["stages"]
    if rule != "nonfinite-values":  # found by inspect --scan, and here by the parity stage
        assert rule in {f["rule_id"] for f in doc["findings"]}
    else:
        assert any(s["status"] == "fail" for s in doc["stages"])


def test_card_is_written_then_lints_clean_and_contradictions_are_findings(invoke, tmp_path):
    d = edited(DRAFTERS / "speculators-3.1", tmp_path, name="drafter")
    r, doc = run_json(invoke, "check", d, "--target", TARGET, "--card")
    assert r.exit_code == 0 and doc["card_written"] == str(d / "README.md")
    text = (d / "README.md").read_text()
    assert "base_model: " in text and "eagle3.1" in text and '"method": "eagle3"' in text
    assert "<org>/<this-drafter>" in text  # a local path means nothing on the Hub
    bad = text.replace("- eagle3.1\n", "").replace('"num_speculative_tokens": 3', '"num_speculative_tokens": 5')
    bad = bad.replace("in the `speculators` layout", "in the `specforge` layout")
    assert "base_model: eaglectl-fixtures/target-llama" in text  # the verifier's Hub id; the local target is none
    (d / "README.md").write_text(bad.replace("base_model: eaglectl-fixtures/target-llama",
                                             "base_model: meta-llama/Other-8B"))
    r, doc = run_json(invoke, "check", d, "--target", TARGET)
    found = {f["rule_id"] for f in doc["findings"]}
    assert {"card-base-model", "card-eagle-version", "card-k", "card-dialect"} <= found
    assert r.exit_code == 1 and all(rid in RULES for rid in found)


def test_upgraded_drafter_card_says_it_needs_fine_tuning(invoke, tmp_path):
    assert invoke("upgrade", DRAFTERS / "speculators-3", tmp_path / "u").exit_code == 0
    r, doc = run_json(invoke, "check", tmp_path / "u", "--card")
    assert "needs EAGLE-3.1 fine-tuning" in (tmp_path / "u" / "README.md").read_text()
    (tmp_path / "u" / "README.md").write_text("---\ntags: [speculative-decoding, eagle3, eagle3.1]\n---\nA drafter.\n")
    r, doc = run_json(invoke, "check", tmp_path / "u")
    assert "card-provenance" in {f["rule_id"] for f in doc["findings"]}


def test_a_requested_smoke_that_cannot_run_fails_the_gate_or_leaves_it_undecided(invoke):
    r, doc = run_json(invoke, "check", DRAFTERS / "speculators-3", "--smoke")
    assert doc["stages"][2] == {**doc["stages"][2], "status": "fail", "requested": True,
                                "detail": "requested but cannot run: needs --target"}
    assert r.exit_code == 1 and "PASS" not in r.stdout
    for extra in (["--smoke"], ["--min-acceptance", "3.0", "--strict"]):
        r, doc = run_json(invoke, "check", DRAFTERS / "speculators-3", *extra, "--target", TARGET,
                          "--vllm-python", "/bin/false")
        assert doc["stages"][2]["status"] == "undecided" and "no vLLM" in doc["stages"][2]["detail"]
        assert r.exit_code == 10 and doc["passed"] is False  # this machine cannot run it: undecided, not failed
        assert doc["verdict"] == "UNDECIDED"
        # what the CPU runs still runs (a drafter that fails parity fails the gate anywhere): only smoke is undecided
        assert doc["stages"][1]["status"] == "pass"
    _, doc = run_json(invoke, "check", DRAFTERS / "speculators-3")
    assert doc["stages"][2]["status"] == "skipped" and doc["stages"][2]["requested"] is False


def test_sarif_lists_findings_with_rules_and_locations(invoke, tmp_path):
    sarif = tmp_path / "out.sarif"
    invoke("check", DEFECTS / "d2t-range", "--sarif", sarif)
    doc = json.loads(sarif.read_text())
    run0 = doc["runs"][0]
    assert doc["version"] == "2.1.0" and run0["tool"]["driver"]["name"] == "eaglectl"
    rules = [r["id"] for r in run0["tool"]["driver"]["rules"]]
    hit = next(r for r in run0["results"] if r["ruleId"] == "d2t-range")
    assert hit["level"] == "error" and rules[hit["ruleIndex"]] == "d2t-range"
    assert hit["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("model.safetensors")
    assert hit["locations"][0]["logicalLocations"][0]["name"] == "d2t"


def test_batch_manifest_of_mixed_checkpoints(invoke, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps({"source": str(p)}) for p in (
        DRAFTERS / "speculators-3", DEFECTS / "d2t-range", CORRUPT / "hole.safetensors", DRAFTERS / "speculators-qwen3")))
    r = invoke("check", "--manifest", manifest, "--json", "--no-card")
    doc = json.loads(r.stdout)
    assert [i["exit_code"] for i in doc["items"]] == [0, 1, 4, 0]
    assert doc["summary"] == {"total": 4, "ok": 2, "failed": 2} and r.exit_code == doc["exit_code"] == 4
    r = invoke("check", "--manifest", manifest, "--json", "--no-card", "--fail-fast")
    assert len(json.loads(r.stdout)["items"]) == 2


def test_convert_and_upgrade_manifests(invoke, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps(x) for x in (
        {"source": str(DRAFTERS / "specforge-3"), "dest": str(tmp_path / "a"), "to": "modelopt"},
        {"source": str(DEFECTS / "d2t-range"), "dest": str(tmp_path / "b"), "to": "modelopt"},
        {"source": str(DRAFTERS / "nemo-3.1"), "dest": str(tmp_path / "c")})))
    r = invoke("convert", "--manifest", manifest, "--to", "speculators", "--target", TARGET)
    assert r.exit_code == 7 and "1 ok" not in r.stdout and "2 ok, 1 failed" in r.stdout
    assert (tmp_path / "a").exists() and not (tmp_path / "b").exists() and (tmp_path / "c").exists()
    up = tmp_path / "u.jsonl"
    up.write_text(json.dumps({"source": str(tmp_path / "a"), "dest": str(tmp_path / "a31")}) + "\n")
    r = invoke("upgrade", "--manifest", up, "--json")
    line = json.loads(r.stdout)["items"][0]["summary_line"]
    # what was done, then (issue 34) that it is a warm start: the line -q and batch tables print
    assert r.exit_code == 0 and line.startswith("add-fc-norm, set-norm-output") and "warm start" in line, line


def test_batch_usage_errors(invoke, tmp_path):
    assert invoke("convert", DRAFTERS / "eagle-3").exit_code == 2
    assert invoke("check").exit_code == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"dest": "x"}\n')
    r = invoke("convert", "--manifest", bad, "--to", "modelopt")
    assert r.exit_code == 21 and "needs 'source' and 'dest'" in r.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts(invoke, shell):
    r = invoke("completion", shell)
    assert r.exit_code == 0 and "_EAGLECTL_COMPLETE" in r.stdout


def test_card_without_the_drafter_tags(invoke, tmp_path):
    d = edited(DRAFTERS / "speculators-3", tmp_path, name="d",
               files={"README.md": "---\nlicense: apache-2.0\n---\nMy drafter.\n"})
    _, doc = run_json(invoke, "check", d)
    assert "card-tags" in {f["rule_id"] for f in doc["findings"]}
    run_json(invoke, "check", d, "--card")  # rewriting keeps the license it found
    assert "license: apache-2.0" in (d / "README.md").read_text()


def test_a_local_path_is_never_a_model_identity(invoke, tmp_path):
    d = edited(DRAFTERS / "speculators-3.1", tmp_path, name="drafter")
    r, doc = run_json(invoke, "check", d, "--target", TARGET, "--card", "--base-model", "acme/target-llama")
    text = (d / "README.md").read_text()
    assert r.exit_code == 0 and "base_model: acme/target-llama" in text and str(TARGET) not in text
    (d / "README.md").write_text(text.replace("base_model: acme/target-llama", f"base_model: {TARGET}"))
    r, doc = run_json(invoke, "check", d, "--target", TARGET)
    assert r.exit_code == 1 and "card-local-path" in {f["rule_id"] for f in doc["findings"]}
    r = invoke("check", d, "--base-model", "./not/a/hub/id")
    assert r.exit_code == 2 and "not a Hub id" in r.stderr


def test_manifest_keys_take_effect_and_unknown_keys_say_which(invoke, tmp_path):
    def dtypes(folder):
        raw = (folder / "model.safetensors").read_bytes()
        header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        return {v["dtype"] for k, v in header.items() if k != "__metadata__"}

    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps(x) for x in (
        # eagle -> speculators names the verifier: fails without the per-line target
        {"source": str(DRAFTERS / "eagle-3"), "dest": str(tmp_path / "a"), "target": str(TARGET), "dtype": "float16"},
        {"source": str(DRAFTERS / "eagle-3"), "dest": str(tmp_path / "x")},
        {"source": str(DRAFTERS / "speculators-3"), "dest": str(tmp_path / "b")})))
    r = invoke("convert", "--manifest", manifest, "--to", "speculators", "--json")
    items = json.loads(r.stdout)["items"]
    assert [i["exit_code"] for i in items] == [0, 7, 0], r.stdout
    assert "--target" in items[1]["summary_line"]
    assert dtypes(tmp_path / "a") - {"BOOL", "I64"} == {"F16"} and "F16" not in dtypes(tmp_path / "b")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"source": "x", "dest": str(tmp_path / "c")}) + "\n"
                   + json.dumps({"source": "x", "dest": str(tmp_path / "d"), "taget": "t"}) + "\n")
    r = invoke("convert", "--manifest", bad, "--to", "modelopt")
    assert r.exit_code == 21 and f"{bad}:2: unknown key 'taget' (did you mean 'target'?" in r.stderr, r.stderr
    assert not (tmp_path / "c").exists()
    check_m = tmp_path / "c.jsonl"
    check_m.write_text(json.dumps({"source": str(DRAFTERS / "eagle-3"), "dest": "x"}) + "\n")
    r = invoke("check", "--manifest", check_m)
    assert r.exit_code == 21 and "unknown key 'dest'" in r.stderr


# ------------------------------------------------------------------ eaglectl's limits never fail a drafter

def test_a_sliding_window_drafter_passes_the_gate(invoke, tmp_path):
    """speculators 0.9.0 writes every layer sliding (layer_types): the reference runs the window as vLLM does,
    so parity runs and a good drafter passes; inspect names the window."""
    d = edited(DRAFTERS / "speculators-3.1", tmp_path, name="swa", config=lambda c: c["transformer_layer_config"].update(
        layer_types=["sliding_attention"], sliding_window=8))
    r, doc = run_json(invoke, "check", d, "--target", TARGET)
    stages = {s["name"]: s for s in doc["stages"]}
    assert r.exit_code == 0 and doc["verdict"] == "PASS" and stages["parity"]["status"] == "pass", doc["stages"]
    assert "sliding-window" in {f["rule_id"] for f in doc["findings"]}


def test_a_feature_the_reference_lacks_leaves_the_gate_undecided_and_upload_refuses_it(invoke, tmp_path):
    """A RoPE type the reference drafter does not implement: parity is undecided (exit 10, never FAIL / exit 1),
    the reason names eaglectl's limit and what lets it run; upload refuses an undecided gate as such."""
    d = edited(DRAFTERS / "speculators-3.1", tmp_path, name="yarn", config=lambda c: c["transformer_layer_config"].update(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}))
    r, doc = run_json(invoke, "check", d, "--target", TARGET)
    parity = {s["name"]: s for s in doc["stages"]}["parity"]
    assert r.exit_code == doc["exit_code"] == 10 and doc["verdict"] == "UNDECIDED", doc["stages"]
    assert parity["status"] == "undecided" and parity["environment"] is False
    assert "beyond eaglectl's reference drafter" in parity["detail"]
    assert f"eaglectl smoke {d} --target {TARGET} --engine vllm" in parity["detail"]  # it runs as printed
    r = invoke("check", d, "--target", TARGET)
    assert r.exit_code == 10 and "UNDECIDED" in r.stdout and "FAIL" not in r.stdout
    r, doc = run_json(invoke, "upload", d, "org/name", "--target", TARGET, "--dry-run")
    assert r.exit_code == 10 and doc["refused"].startswith("the gate is undecided: eaglectl could not run parity")
