"""Issue 46: the upgrade learns, ranks and reports on more than one kind of text (chat, prose, math, code), keeps
the init that keeps most where it keeps least, and reports each kind on prompts it never ranked or fitted on, in a
form smoke (and so vLLM) measures to the count."""

from __future__ import annotations

import hashlib
import json

import pytest

from eaglectl.commands.upgrade.fidelity import per_kind
from eaglectl.measure import kinds
from eaglectl.measure.workload import load_prompts, tokenizer_of

from .conftest import FIXTURES

TRAINED = FIXTURES / "trained"
SOURCE, TARGET = TRAINED / "eagle3", TRAINED / "target"


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory):
    from click.testing import CliRunner

    from eaglectl.cli.app import cli

    out = tmp_path_factory.mktemp("kinds") / "up"
    r = CliRunner().invoke(cli, ["upgrade", str(SOURCE), str(out), "--to", "speculators", "--target", str(TARGET),
                                 "--no-fidelity", "--json"])
    assert r.exit_code == 0, r.output
    return out, json.loads(r.stdout)


def test_the_roles_of_each_kind_never_overlap():
    tok = tokenizer_of(str(TARGET))
    for kind in kinds.SEEDED:
        roles = {role: {tuple(p) for p in kinds.seed_prompts(tok, kind, role, 99, 64)} for role in kinds.ROLES}
        assert all(roles.values()) and not (roles["calibration"] & roles["ranking"] or
                                            roles["ranking"] & roles["report"] or
                                            roles["calibration"] & roles["report"]), kind


def test_the_init_kept_is_the_best_on_its_worst_kind(upgraded):
    _, doc = upgraded
    ranked = doc["init_candidates"]
    assert {c["init"] for c in ranked} == {"ones", "harmonic", "calibrated", "refit", "fit"}
    for c in ranked:
        assert set(c["by_kind"]) == set(kinds.KINDS)
        worst = min(c["by_kind"], key=lambda k: c["by_kind"][k]["acceptance_kept"])
        assert c["worst_kind"] == worst and c["acceptance_kept"] == c["by_kind"][worst]["acceptance_kept"]
    assert [c["acceptance_kept"] for c in ranked] == sorted((c["acceptance_kept"] for c in ranked), reverse=True)
    assert doc["init"] == ranked[0]["init"]
    stats = doc["calibration"] if "calibration" in doc else None
    assert stats is None or "every kind" in json.dumps(stats)


def test_each_kind_is_reported_with_its_interval_on_prompts_smoke_loads(upgraded):
    _, doc = upgraded
    by_kind = doc["acceptance"]["by_kind"]
    assert list(by_kind["kinds"]) == list(kinds.KINDS)
    tok = tokenizer_of(str(TARGET))
    prompts = []
    for kind, v in by_kind["kinds"].items():
        lo, hi = v["interval"]["kept"]
        assert lo <= v["kept"] <= hi and v["prompts"] == per_kind(16)  # upgrade's default --num-prompts
        assert v["smoke_prompts"] == ("builtin:short" if kind == "code" else f"builtin:{kind}")
        prompts += load_prompts(v["smoke_prompts"], tok, count=v["prompts"], max_tokens=64, max_model_len=1024, k=3,
                                seed=0).prompts
    # smoke's loader gives exactly the tokens the upgrade reported on
    digest = hashlib.sha256(json.dumps(prompts, separators=(",", ":")).encode()).hexdigest()
    assert by_kind["prompts"]["digest"] == f"sha256:{digest}"
    assert by_kind["worst_kind"] == min(by_kind["kinds"], key=lambda k: by_kind["kinds"][k]["kept"])


def test_the_reference_loop_counts_each_kind_as_reported(upgraded, invoke):
    out, doc = upgraded
    for kind, v in doc["acceptance"]["by_kind"]["kinds"].items():
        r = invoke("smoke", out, "--target", TARGET, "--engine", "reference", "--prompts", v["smoke_prompts"],
                   "--num-prompts", v["prompts"], "--max-tokens", 64, "--json")
        assert r.exit_code == 0, r.stderr
        assert round(json.loads(r.stdout)["mean_acceptance_length"], 4) == v["after"], kind


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_measures_each_kind_as_the_upgrade_printed_it(upgraded, invoke, tmp_path, vllm_py):
    """One vLLM run over every kind's report prompts (as token ids): per kind, vLLM's AL equals the printed one,
    inside its printed interval."""
    out, doc = upgraded
    by_kind = doc["acceptance"]["by_kind"]["kinds"]
    tok = tokenizer_of(str(TARGET))
    labels, lines = [], []
    for kind, v in by_kind.items():
        got = load_prompts(v["smoke_prompts"], tok, count=v["prompts"], max_tokens=64, max_model_len=1024, k=3,
                           seed=0).prompts
        labels += [kind] * len(got)
        lines += [json.dumps({"prompt_token_ids": p}) for p in got]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    r = invoke("smoke", out, "--target", TARGET, "--prompts", tmp_path / "p.jsonl", "--num-prompts", len(lines),
               "--max-tokens", 64, "--concurrency", 1, "--vllm-python", vllm_py, "--json")
    assert r.exit_code == 0, r.stderr
    requests = json.loads(r.stdout)["requests"]
    for kind, rows in kinds.grouped(labels, requests).items():
        al = 1 + sum(q["num_accepted_tokens"] for q in rows) / sum(q["num_drafts"] for q in rows)
        v = by_kind[kind]
        assert round(al, 4) == v["after"], (kind, al, v)
        assert v["interval"]["after"][0] <= al <= v["interval"]["after"][1]
