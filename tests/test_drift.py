"""Issue 13: `eaglectl drift` (attention masses, state RMS and acceptance by draft depth) and the
long-context workloads of `smoke` (--context-lengths, SPEED-Bench folders, AL both ways, 1/TPOT)."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch

from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.commands import drift
from eaglectl.io.states import open_states
from eaglectl.measure import workload
from eaglectl.model.hf import forward, load_model
from eaglectl.model.loader import load_reference
from eaglectl.model.reference import ChainCache, chain_step, prefill

from .conftest import ROOT
from .helpers import capture_run, edited

TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"
PNG = b"\x89PNG\r\n\x1a\n"


def _json(result):
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


# ----------------------------------------------------------------------------------- definitions

def test_masses_on_a_hand_built_attention_row():
    """Anchor t = 5; keys 0..7 are context (6, 7 are masked future: 0), keys 8, 9 the chain's own entries."""
    row = torch.zeros(1, 2, 10, dtype=torch.float64)
    row[0, 0, [0, 2, 3, 5, 8]] = torch.tensor([0.1, 0.15, 0.25, 0.1, 0.4], dtype=torch.float64)
    row[0, 1, [0, 4, 9]] = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    self_cols = torch.zeros(1, 10, dtype=torch.bool)
    self_cols[0, 8:] = True
    m = drift.masses(row, torch.tensor([5]), sink_tokens=1, recent_window=3, ctx_len=8, self_cols=self_cols)
    # head 0: sink = key 0; recent = keys 3..5; self = key 8; the rest (key 2) is prompt, not recent
    assert m["sink_mass"][0].tolist() == pytest.approx([0.1, 0.5])
    assert m["recent_mass"][0].tolist() == pytest.approx([0.35, 0.25])
    assert m["self_mass"][0].tolist() == pytest.approx([0.4, 0.25])
    assert m["prompt_mass"][0].tolist() == pytest.approx([0.5, 0.25])
    h0 = -sum(p * math.log(p) for p in (0.1, 0.15, 0.25, 0.1, 0.4))
    assert m["entropy"][0, 0] == pytest.approx(h0)
    # a window reaching back to the sink never counts the sink twice
    wide = drift.masses(row, torch.tensor([5]), sink_tokens=1, recent_window=100, ctx_len=8, self_cols=self_cols)
    assert wide["recent_mass"][0].tolist() == pytest.approx([0.5, 0.25])
    two = drift.masses(row, torch.tensor([5]), sink_tokens=3, recent_window=3, ctx_len=8, self_cols=self_cols)
    assert two["sink_mass"][0].tolist() == pytest.approx([0.25, 0.5])


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_data():
    rng = np.random.default_rng(1)
    few = [rng.normal(1.0, 0.5, 4) for _ in range(4)]
    many = [rng.normal(1.0, 0.5, 40) for _ in range(40)]
    m1, lo1, hi1 = drift.bootstrap(few, 500)
    m2, lo2, hi2 = drift.bootstrap(many, 500)
    assert lo1 <= m1 <= hi1 and lo2 <= m2 <= hi2
    assert hi2 - lo2 < hi1 - lo1
    assert m1 == pytest.approx(np.mean([v.mean() for v in few]))
    assert math.isnan(drift.bootstrap([np.array([np.nan])], 100)[0])


@pytest.fixture(scope="module")
def fixture_sequence():
    tgt = load_model(str(TARGET))
    d = load_reference(open_drafter(str(TRAINED / "eagle3")))
    ids = d.spec.capture_ids(tgt.num_layers)
    tokens = tgt.tokenizer((ROOT / "eaglectl" / "data" / "calibration.txt").read_text()[:3000]).input_ids[:160]
    _, aux = forward(tgt, torch.tensor([tokens]), ids)
    return tgt, d, tokens, aux


def test_batched_chains_equal_one_chain_at_a_time(fixture_sequence):
    """The batched mask (context ≤ t plus the chain's own entries) drafts what the incremental cache does."""
    tgt, d, tokens, aux = fixture_sequence
    model = d.build(torch.float32, "cpu")
    embed = tgt.embedding().float()
    anchors = [20, 57, 58, 100, 157]
    depth = 6
    chains = drift.measure_chains(model, aux, torch.tensor([tokens]), anchors, depth, sink_tokens=1,
                                  recent_window=16, embed=embed, chunk=64, group=2)
    for a, t in enumerate(anchors):
        cache = ChainCache()
        with torch.no_grad():
            out = prefill(model, aux[:, : t + 1], torch.tensor([tokens[1: t + 2]]), torch.arange(t + 1)[None], cache,
                          embed)
            ids, rms = [int(out.target_ids[0, -1])], [float(out.feedback[0, -1].pow(2).mean().sqrt())]
            fb = out.feedback[:, -1:]
            for j in range(1, depth):
                out = chain_step(model, fb, torch.tensor([[ids[-1]]]), torch.tensor([[t + j]]), cache, embed)
                ids.append(int(out.target_ids[0, -1]))
                rms.append(float(out.feedback[0, -1].pow(2).mean().sqrt()))
                fb = out.feedback
        assert chains.drafts[a].tolist() == ids, t
        assert chains.state_rms[a] == pytest.approx(rms, rel=1e-4), t


def test_masses_are_proportions_and_self_is_zero_at_depth_zero(fixture_sequence):
    tgt, d, tokens, aux = fixture_sequence
    chains = drift.measure_chains(d.build(torch.float32, "cpu"), aux, torch.tensor([tokens]), list(range(8, 158, 5)),
                                  8, sink_tokens=1, recent_window=16, embed=tgt.embedding().float())
    m = chains.masses
    assert np.all(m["self_mass"][:, 0] == 0)
    for name in ("sink_mass", "self_mass", "recent_mass"):
        assert np.all((m[name] >= 0) & (m[name] <= 1 + 1e-9)), name
    total = m["sink_mass"] + m["self_mass"] + m["recent_mass"]
    assert np.all(total <= 1 + 1e-6) and np.all(m["prompt_mass"] >= -1e-6)  # fp32 softmax rows
    assert np.all(m["self_mass"][:, 1:] > 0)  # a chain always sees its own entries
    assert np.all(m["entropy"] >= 0)


# ----------------------------------------------------------------------------------------- command

@pytest.fixture(scope="module")
def drift_doc(tmp_path_factory):
    from click.testing import CliRunner

    from eaglectl.cli.app import cli

    png = tmp_path_factory.mktemp("plot") / "drift.png"
    res = CliRunner().invoke(cli, ["drift", str(TRAINED / "eagle3"), str(TRAINED / "eagle3.1"), "--target",
                                   str(TARGET), "--num-prompts", "6", "--json", "--plot", str(png)],
                             catch_exceptions=False)
    return _json(res), png


def test_drift_json_plot_and_the_same_acceptance_as_smoke_reference(drift_doc, invoke):
    doc, png = drift_doc
    assert doc["schema"] == "eaglectl.drift/1" and doc["protocol"] == "paper-v1"
    assert "not published" in doc["protocol_note"]
    assert len(doc["depths"]) == 8 and [d["depth"] for d in doc["depths"]] == list(range(8))
    for run in doc["runs"]:
        depths = run["depths"]
        assert depths[0]["self_mass"] == 0
        for d in depths:
            for key in ("sink_mass", "self_mass", "recent_mass"):
                assert 0 <= d[key] <= 1 and d[f"{key}_ci"][0] <= d[key] <= d[f"{key}_ci"][1]
            assert d["sink_mass"] + d["self_mass"] + d["recent_mass"] <= 1 + 1e-6
            assert len(d["sink_mass_by_head"]) == 2  # one layer, two heads
        assert [d["acceptance_rate"] is not None for d in depths] == [True] * 3 + [False] * 5
        smoke = _json(invoke("smoke", run["drafter"], "--target", TARGET, "--engine", "reference", "--num-prompts",
                             6, "--json"))
        assert run["mean_acceptance_length"] == smoke["mean_acceptance_length"]
        assert run["mean_acceptance_length_per_request"] == pytest.approx(smoke["mean_acceptance_length_per_request"])
        assert [d["acceptance_rate"] for d in depths[:3]] == pytest.approx(smoke["per_position_acceptance"], abs=1e-6)
    assert doc["mean_acceptance_length"] == doc["runs"][0]["mean_acceptance_length"]
    # the mechanism 3.1 fixes: the 3.0 state fed back grows with depth, the post-norm one does not
    rms30 = [d["state_rms"] for d in doc["runs"][0]["depths"]]
    rms31 = [d["state_rms"] for d in doc["runs"][1]["depths"]]
    assert rms30[-1] > 1.5 * rms30[0]
    assert max(rms31) / min(rms31) < 1.02
    assert png.read_bytes().startswith(PNG) and doc["plot"] == str(png)


def test_drift_human_report_names_drafters_and_protocol(invoke):
    res = invoke("drift", TRAINED / "eagle3.1", "--target", TARGET, "--num-prompts", 2, "--depth", 4,
                 "--bootstrap", 100)
    assert res.exit_code == 0, res.stderr
    assert "paper-v1" in res.stdout and "not published" in res.stdout and "eagle3.1" in res.stdout
    assert "AL pooled" in res.stdout


def test_context_length_axis_builds_prompts_of_exactly_those_lengths(invoke):
    doc = _json(invoke("drift", TRAINED / "eagle3.1", "--target", TARGET, "--num-prompts", 3, "--depth", 3,
                       "--context-lengths", "96,320", "--bootstrap", 100, "--json"))
    assert [(r["context_length"], r["prompts"]) for r in doc["runs"]] == [(96, 3), (320, 3)]
    tok = load_model(str(TARGET)).tokenizer
    for n in (96, 320):
        ps = workload.load_prompts("builtin:short", tok, count=3, max_tokens=64, max_model_len=1024, k=3, seed=0,
                                   length=n)
        assert [len(p) for p in ps.prompts] == [n] * 3


def test_template_axis_needs_and_uses_the_chat_template(tmp_path, invoke):
    tok = json.loads((TARGET / "tokenizer_config.json").read_text())
    tok["chat_template"] = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                            "{% if add_generation_prompt %}<assistant>{% endif %}")
    chat_target = edited(TARGET, tmp_path, name="target", files={"tokenizer_config.json": json.dumps(tok)})
    prompts = tmp_path / "chat.jsonl"
    lines = [{"messages": [{"role": "system", "content": "You write Python."},
                           {"role": "user", "content": f"def f{i}(x):\n    return x * {i}\n"}]} for i in range(3)]
    prompts.write_text("\n".join(json.dumps(x) for x in lines))
    doc = _json(invoke("drift", TRAINED / "eagle3.1", "--target", chat_target, "--prompts", prompts, "--templates",
                       "training,changed,none", "--depth", 3, "--bootstrap", 100, "--json"))
    assert [r["template"] for r in doc["runs"]] == ["training", "changed", "none"]
    tok = load_model(str(chat_target)).tokenizer
    variants = [workload.template_prompts(str(prompts), tok, t, "Be brief.", 3) for t in workload.TEMPLATES]
    assert variants[0] != variants[1] != variants[2]
    assert all(len(a) > len(c) for a, c in zip(variants[0], variants[2], strict=True))  # no system prompt: shorter
    # the plain fixture tokenizer has no chat template: one line, a stable code, nothing run
    res = invoke("drift", TRAINED / "eagle3.1", "--target", TARGET, "--prompts", prompts, "--templates", "none")
    assert res.exit_code != 0 and "chat template" in res.stderr and len(res.stderr.strip().splitlines()) <= 2


def test_drift_on_a_capture_has_masses_but_no_loop(tmp_path, invoke):
    states = tmp_path / "states"
    capture_run(str(TARGET), str(states), engine="hf", drafter=str(TRAINED / "eagle3"), num_prompts=4, length=128)
    doc = _json(invoke("drift", TRAINED / "eagle3", "--states", states, "--max-tokens", 48, "--depth", 4,
                       "--bootstrap", 100, "--json"))
    assert doc["mean_acceptance_length"] is None and "--target" in doc["acceptance_note"]
    assert doc["depths"][0]["self_mass"] == 0 and doc["runs"][0]["prompts"] == 4
    assert all(0 <= d["sink_mass"] <= 1 for d in doc["depths"])
    # the same anchors through the running target give the same masses: the capture stands in for it
    tgt = load_model(str(TARGET))
    d = load_reference(open_drafter(str(TRAINED / "eagle3")))
    req = next(iter(open_states(str(states)).requests()))
    tokens = req.token_ids.tolist()
    _, aux = forward(tgt, torch.tensor([tokens]), d.spec.capture_ids(8))
    anchors = drift.anchor_positions(len(tokens) - 49, len(tokens) - 2, 8)
    ran = drift.measure_chains(d.build(torch.float32, "cpu"), aux, torch.tensor([tokens]), anchors, 4, sink_tokens=1,
                               recent_window=16, embed=tgt.embedding().float())
    run = drift._states_run(d, open_states(str(states)), drift.PROTOCOLS["paper-v1"], 4, 48, 1, 100, 0)
    assert run.depths[1]["self_mass"] == pytest.approx(float(ran.masses["self_mass"][:, 1].mean()), abs=1e-5)


def test_drift_refuses_bad_combinations_in_one_line(invoke, tmp_path):
    for args, needle in [(("--target", TARGET, "--states", tmp_path), "--target"),
                         ((), "--target"),
                         (("--target", TARGET, "--context-lengths", "1k,,2k"), "no empty item"),
                         (("--target", TARGET, "--templates", "training,bogus"), "training"),
                         (("--target", TARGET, "--context-lengths", "128", "--templates", "none"), "one at a time")]:
        res = invoke("drift", TRAINED / "eagle3", *args)
        assert res.exit_code == 2, (args, res.stderr)
        assert needle in res.stderr


def test_plot_without_matplotlib_fails_before_any_work(invoke, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    res = invoke("drift", TRAINED / "eagle3", "--target", TARGET, "--plot", tmp_path / "x.png")
    assert res.exit_code != 0 and "eaglectl-cli[plot]" in res.stderr and not (tmp_path / "x.png").exists()


# ----------------------------------------------------------------------------------------- workloads

def test_at_length_cuts_or_continues_with_the_following_prompts():
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    assert workload.at_length(prompts, 3) == [[1, 2, 3], [5, 6, 7], [7, 8, 9]]
    assert workload.at_length(prompts, 6) == [[1, 2, 3, 4, 5, 6], [5, 6, 7, 8, 9, 1], [7, 8, 9, 1, 2, 3]]


def test_smoke_context_lengths_and_al_both_ways(invoke):
    doc = _json(invoke("smoke", TRAINED / "eagle3.1", "--target", TARGET, "--engine", "reference", "--num-prompts", 4,
                       "--context-lengths", "128,384", "--json"))
    rows = doc["by_context_length"]
    assert [r["context_length"] for r in rows] == [128, 384]
    for r in rows:
        assert r["requests"] == 4 and 1 <= r["mean_acceptance_length"] <= 4
        assert len(r["per_position_acceptance"]) == 3
    reqs = doc["requests"]
    assert sum(r["num_drafts"] for r in reqs) == doc["num_drafts"]
    assert sum(r["num_accepted_tokens"] for r in reqs) == doc["num_accepted_tokens"]
    per = [1 + r["num_accepted_tokens"] / r["num_drafts"] for r in reqs]
    assert doc["mean_acceptance_length_per_request"] == pytest.approx(sum(per) / len(per))


def _speed_bench(folder, rows, name="qualitative/test-00000.parquet"):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"question_id": [r[0] for r in rows], "category": [r[1] for r in rows],
                             "turns": [r[2] for r in rows]}), path)


def test_smoke_reads_a_local_speed_bench_folder_per_category(tmp_path, invoke):
    text = (ROOT / "eaglectl" / "data" / "calibration.txt").read_text()
    cats = ("coding", "math", "writing")
    _speed_bench(tmp_path, [(f"q{i}", cats[i % 3], [text[i * 300: i * 300 + 200], "a second turn"]) for i in range(9)])
    doc = _json(invoke("smoke", TRAINED / "eagle3.1", "--target", TARGET, "--engine", "reference", "--prompts",
                       tmp_path, "--num-prompts", 6, "--json"))
    by = doc["by_category"]
    assert [r["category"] for r in by] == list(cats) and [r["requests"] for r in by] == [2, 2, 2]
    pooled = sum(r["num_accepted_tokens"] for r in by) / sum(r["num_drafts"] for r in by) + 1
    assert pooled == pytest.approx(doc["mean_acceptance_length"])
    assert "SPEED-Bench" in doc["prompts"]["description"]


def test_speed_bench_placeholders_and_bad_files_are_one_line_errors(tmp_path, invoke):
    _speed_bench(tmp_path, [("q1", "qa", [workload.SPEED_PLACEHOLDER + " USING SPECDEC_BENCH"])])
    res = invoke("smoke", TRAINED / "eagle3.1", "--target", TARGET, "--engine", "reference", "--prompts", tmp_path)
    assert res.exit_code != 0 and "q1" in res.stderr and "placeholder" in res.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.parquet").write_bytes(b"not parquet")
    res = invoke("smoke", TRAINED / "eagle3.1", "--target", TARGET, "--engine", "reference", "--prompts", bad)
    assert res.exit_code != 0 and "x.parquet" in res.stderr and "Traceback" not in res.output + res.stderr


def test_smoke_plot_is_a_png(tmp_path, invoke):
    png = tmp_path / "smoke.png"
    doc = _json(invoke("smoke", TRAINED / "eagle3.1", "--target", TARGET, "--engine", "reference", "--num-prompts", 2,
                       "--context-lengths", "128", "--plot", png, "--json"))
    assert doc["plot"] == str(png) and png.read_bytes().startswith(PNG)


def test_drift_reads_mla_attention(invoke):
    """The MLA drafter's heads (non-absorbed scores) give proportions too, and the same AL as smoke."""
    mla, target = TRAINED / "eagle3.1-mla", TRAINED / "target-mla"
    doc = _json(invoke("drift", mla, "--target", target, "--num-prompts", 3, "--depth", 4, "--bootstrap", 100,
                       "--json"))
    assert doc["depths"][0]["self_mass"] == 0
    assert all(0 <= d["sink_mass"] <= 1 and 0 < d["self_mass"] <= 1 for d in doc["depths"][1:])
    smoke = _json(invoke("smoke", mla, "--target", target, "--engine", "reference", "--num-prompts", 3, "--runner",
                         "v1", "--json"))  # V1: the runner that can load it (V2 captures 2 layers of the 4)
    assert doc["mean_acceptance_length"] == smoke["mean_acceptance_length"]


def test_speed_bench_throughput_buckets_report_by_context_length(tmp_path, invoke):
    text = (ROOT / "eaglectl" / "data" / "calibration.txt").read_text()
    for n, name in ((300, "throughput_1k/test.parquet"), (900, "throughput_2k/test.parquet")):
        _speed_bench(tmp_path, [(f"{name[:13]}-{i}", "mixed", [text[i * 50: i * 50 + n]]) for i in range(2)], name)
    doc = _json(invoke("smoke", TRAINED / "eagle3.1", "--target", TARGET, "--engine", "reference", "--prompts",
                       tmp_path, "--num-prompts", 4, "--json"))
    rows = doc["by_context_length"]
    assert [r["bucket"] for r in rows] == ["1k", "2k"] and [r["requests"] for r in rows] == [2, 2]
    assert rows[0]["context_length"] < rows[1]["context_length"]
    assert sum(r["num_drafts"] for r in rows) == doc["num_drafts"]
