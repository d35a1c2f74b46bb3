"""Issue 48: the norm arrangement a drafter was trained with is measured, not declared. Every drafter is scored
under both values of the flags no tensor settles (norm_output, norm_before_residual); a config that declares
another arrangement than the weights were trained with is an error naming the flag, never OK."""

from __future__ import annotations

import json

import pytest

from .conftest import FIXTURES
from .helpers import edited, smoke

TRAINED = FIXTURES / "trained"
TARGET = TRAINED / "target"


def _inspect(invoke, drafter):
    r = invoke("inspect", drafter, "--target", TARGET, "--json")
    doc = json.loads(r.stdout)
    return r.exit_code, doc, {f["rule_id"]: f for f in doc["findings"]}


def test_the_declared_arrangement_of_a_trained_drafter_is_the_measured_one(invoke):
    code, doc, found = _inspect(invoke, TRAINED / "eagle3.1")
    facts = doc["measured"]
    assert facts["norm_output"]["measured"] in ("true", "undecided")
    assert facts["norm_before_residual"]["measured"] in ("false", "undecided")
    assert "flag-reading-mismatch" not in found and code == 0, found


@pytest.mark.parametrize(("drafter", "flag", "declared", "trained"), [
    ("eagle3.1", "norm_output", False, "true"),  # a 3.1 drafter whose config lost norm_output
    ("eagle3-output", "norm_output", True, "false"),  # a 3.0 drafter (SpecForge) declared 3.1's feedback
])
def test_a_config_that_declares_another_arrangement_is_an_error(invoke, tmp_path, drafter, flag, declared, trained):
    d = edited(TRAINED / drafter, tmp_path, name=f"wrong-{flag}", config={flag: declared})
    code, doc, found = _inspect(invoke, d)
    fact = doc["measured"][flag]
    assert fact["declared"] == str(declared).lower() and fact["measured"] == trained, fact
    assert code == 1 and "flag-reading-mismatch" in found and found["flag-reading-mismatch"]["severity"] == "error"
    assert f"'{flag}' is {str(declared).lower()} in the config" in found["flag-reading-mismatch"]["message"]


def test_a_flag_the_weights_cannot_tell_is_undecided_not_an_error(invoke, tmp_path):
    """norm_before_residual changes little in a one-layer drafter: flipped, the fixture's agreement barely moves, so
    the answer is undecided (with its numbers), and no finding claims a mismatch."""
    d = edited(TRAINED / "eagle3.1", tmp_path, name="nbr", config={"norm_before_residual": True})
    code, doc, found = _inspect(invoke, d)
    fact = doc["measured"]["norm_before_residual"]
    assert fact["measured"] in ("undecided", "true") and "sign test" in fact["reason"]
    assert "flag-reading-mismatch" not in found


def _pre_879(state):
    """What SpecForge between PRs #568 and #879 trains with `norm_output: false`: lm_head on the pre-norm state,
    so the final norm never reaches the loss and keeps its init. Made from the trained drafter exactly, for greedy
    decoding: the norm's weight folded into lm_head's columns (lm_head(w * x) on the unnormed state), the norm reset
    to ones."""
    w = state["norm.weight"].float()
    state["lm_head.weight"] = (state["lm_head.weight"].float() * w[None, :]).to(state["lm_head.weight"].dtype)
    state["norm.weight"] = state["norm.weight"].new_ones(state["norm.weight"].shape)


def test_specforge_norm_output_false_is_settled_by_the_final_norms_weights(invoke, tmp_path):
    """SpecForge's explicit `norm_output: false` meant "no final norm before lm_head" before PR #879. The weights
    tell which: trained that way, norm.weight keeps one value; trained after #879, it varies and nothing is said.
    The untrained one is served with the norm by every engine, which scales each token's logits only: greedy
    acceptance is what the drafter was trained for (the reference loop's counts are equal), as the error says;
    sampled acceptance is not, so the verdict is never OK."""
    ids = {"norm_output": False, "eagle_aux_hidden_state_layer_ids": [3, 5, 6]}  # vLLM's key: no reading to doubt
    after = edited(TRAINED / "eagle3-output", tmp_path, name="after-879", config=ids)
    before = edited(TRAINED / "eagle3-output", tmp_path, name="before-879", config=ids, tensors=_pre_879)
    r = invoke("inspect", after, "--json")
    assert not {"specforge-norm-output-window", "final-norm-untrained"} & {
        f["rule_id"] for f in json.loads(r.stdout)["findings"]} and r.exit_code == 0
    r = invoke("inspect", before, "--json")
    found = {f["rule_id"]: f for f in json.loads(r.stdout)["findings"]}
    message = found["final-norm-untrained"]["message"]
    assert "norm.weight is 1 everywhere" in message and "greedy tokens are unchanged" in message, message
    assert found["final-norm-untrained"]["severity"] == "error" and r.exit_code == 1
    # measured past the gate that refuses it (smoke's pre-flight): the reference loop serves it as engines do
    x, y = (smoke(str(d), str(TARGET), engine="reference", num_prompts=4, max_tokens=32, preflight=False).to_json()
            for d in (after, before))
    assert x["num_drafts"] > 0 and (x["num_accepted_tokens"], x["per_position_acceptance"]) == \
        (y["num_accepted_tokens"], y["per_position_acceptance"])


# ------------------------------------------------------------------------------ drafters inside their target

DSPARK_KEYS = {"dspark_target_layer_ids": [1, 3, 5], "dspark_markov_rank": 8, "dspark_block_size": 7}


def _with_mtp(tmp_path, name, parts, config=None, prefix="mtp.0.", files=None):
    """The fixture target with a block of tiny tensors under a prefix of its own (DeepSeek-V4's `mtp.0.`)."""
    import torch

    def add(state):
        for part in parts:
            state[f"{prefix}{part}.weight"] = torch.zeros(4, 4, dtype=state["lm_head.weight"].dtype)

    return edited(TARGET, tmp_path, name=name, tensors=add if parts else None, config=config, files=files)


@pytest.mark.parametrize(("parts", "said", "unsaid", "method"), [
    (("markov_head", "fc", "layers.0.mlp.up_proj", "norm"), "a DSpark drafter under mtp.*", "MTP block", "dspark"),
    (("enorm", "hnorm", "eh_proj", "shared_head.norm"), "an MTP block under mtp.*", "DSpark", "mtp"),
])
def test_a_drafter_inside_its_target_is_named_from_the_headers(invoke, tmp_path, parts, said, unsaid, method):
    """Issue 48: DeepSeek-V4-Flash-0731 ships a DSpark drafter under the target's `mtp.*` names (markov_head, no
    enorm / hnorm), which method=mtp half-loads; a true MTP block has enorm, hnorm and eh_proj. They are told
    apart from the tensor names alone: `inspect TARGET` reads the drafter where vLLM reads it (the serve line's
    method is the right one), and a command that wants a drafter refuses the target in one line naming it."""
    t = _with_mtp(tmp_path, parts[0], parts, config=DSPARK_KEYS)
    r = invoke("inspect", t, "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["in_target"]["name"] in said and doc["in_target"]["where"] == "mtp.*", doc
    assert doc["speculative_config"]["method"] == method and unsaid not in json.dumps(doc["findings"])
    assert doc["findings"][0]["rule_id"] == "in-target-drafter" and doc["summary"]["error"] == 0
    r = invoke("convert", t, tmp_path / "out", "--to", "speculators")
    text = " ".join(r.stderr.split())
    assert r.exit_code == 5 and "looks like a target model" in text and said in text and unsaid not in text, text
    assert len(r.stderr.strip().splitlines()) <= 4 and not (tmp_path / "out").exists()
    plain = invoke("inspect", TARGET)
    assert plain.exit_code == 5 and "looks like a target model" in plain.stderr and "mtp" not in plain.stderr


def _in_target(invoke, path):
    r = invoke("inspect", path, "--json")
    doc = json.loads(r.stdout)
    return r.exit_code, doc, {f["locator"]: f for f in doc["findings"] if f["rule_id"] == "in-target-config"}


def test_deepseek_v4_dspark_needs_the_targets_dspark_keys(invoke, tmp_path):
    """vLLM's method dspark builds DeepSeek-V4's in-target drafter from the target's dspark_target_layer_ids and
    dspark_markov_rank: without them it cannot, and ids past the target's last layer (+1, as vLLM captures them;
    as they are for V4.1) are named."""
    parts = ("markov_head.markov_w1", "main_proj")
    code, doc, bad = _in_target(invoke, _with_mtp(tmp_path, "none", parts))
    assert code == 1 and {k.rsplit(":", 1)[1] for k in bad} == {"dspark_target_layer_ids", "dspark_markov_rank"}
    assert doc["serve_command"] is None
    deep = DSPARK_KEYS | {"dspark_target_layer_ids": [1, 3, 8]}  # the fixture target has 8 layers
    code, _, bad = _in_target(invoke, _with_mtp(tmp_path, "deep", parts, config=deep))
    assert code == 1 and "captures boundaries [9]" in " ".join(f["message"] for f in bad.values())
    v4 = _with_mtp(tmp_path, "v4", parts, config=DSPARK_KEYS | {"model_type": "deepseek_v4"})
    sglang = json.loads(invoke("inspect", v4, "--for", "sglang", "--json").stdout)
    disagree = [f for f in sglang["findings"] if f["rule_id"] == "in-target-engines-disagree"]
    assert [f["severity"] for f in disagree] == ["warning"] and "boundaries [2, 4, 6]" in disagree[0]["message"]
    code, doc, _ = _in_target(invoke, _with_mtp(tmp_path, "v41", parts, config=deep | {"model_type": "deepseek_v41"}))
    assert not [f for f in doc["findings"] if f["rule_id"] == "in-target-engines-disagree"]
    assert code == 0 and "'num_speculative_tokens': 7" not in doc["serve_command"]
    assert json.loads(doc["serve_command"].split("--speculative-config ")[1].strip("'")) == {
        "method": "dspark", "num_speculative_tokens": 7}


MISTRAL = {"dspark": {"markov_rank": 8}, "n_layers": 1, "depth": 4, "target_activation_layers": "1,3,5"}
MISTRAL_BAD = {
    "order": MISTRAL | {"target_activation_layers": "5,3"},
    "head": MISTRAL | {"dspark": {"markov_rank": 8, "head_type": "gated"}},
    "extra": MISTRAL | {"dspark": {"markov_rank": 8, "bonus": 1}},
    "depth": {k: v for k, v in MISTRAL.items() if k != "depth"},
}


def _mistral(tmp_path, name, mtp):
    return _with_mtp(tmp_path, name, ("backbone.layers.0.attention.wq", "autoregressive_head.embedding"),
                     prefix="mtp_dspark.", files={"params.json": json.dumps({"mtp": mtp})})


def test_mistral_large_4_dspark_is_read_from_params_mtp(invoke, tmp_path):
    """vLLM 0.34 builds Mistral Large 4's DSpark drafter (`mtp_dspark.*`) from params.json's `mtp` (its mtp_config):
    the block, its keys and values are checked where they are written, and the drafts per step are its depth."""
    code, doc, _ = _in_target(invoke, _mistral(tmp_path, "good", MISTRAL))
    assert code == 0 and "Mistral Large 4" in doc["in_target"]["name"]
    assert doc["speculative_config"] == {"method": "dspark", "num_speculative_tokens": 4}
    for name, mtp in MISTRAL_BAD.items():
        code, doc, bad = _in_target(invoke, _mistral(tmp_path, name, mtp))
        assert code == 1 and bad and all(":mtp." in k and "params.json" in k for k in bad), (name, bad)


def _minimax(tmp_path, name, sub):
    files = {"dspark/config.json": json.dumps(sub)} if sub is not None else None
    return _with_mtp(tmp_path, name, (), config={"model_type": "minimax_m3_text"}, files=files)


MINIMAX = {"architectures": ["DSparkMiniMaxDraftModel"], "dspark_markov_rank": 8, "dspark_use_dense_ffn": True}


def test_minimax_m3_dspark_is_read_from_its_subfolder(invoke, tmp_path):
    """vLLM 0.34 reads MiniMax-M3's DSpark drafter from the target's dspark/ subfolder (method dspark, no draft
    model): inspect of the target checks that it is there and what vLLM requires of its config."""
    code, doc, _ = _in_target(invoke, _minimax(tmp_path, "good", MINIMAX))
    assert code == 0 and doc["in_target"]["where"] == "dspark/" and doc["speculative_config"] == {"method": "dspark"}
    for name, sub in (("none", None), ("arch", MINIMAX | {"architectures": ["Qwen3DSparkModel"]}),
                      ("ffn", MINIMAX | {"dspark_use_dense_ffn": False}),
                      ("rank", {k: v for k, v in MINIMAX.items() if k != "dspark_markov_rank"})):
        code, doc, bad = _in_target(invoke, _minimax(tmp_path, name, sub))
        assert code == 1 and bad and doc["serve_command"] is None, (name, doc["findings"])


_ASK_IN_TARGET = """
import json, sys
from types import SimpleNamespace
from transformers import PretrainedConfig
from vllm.config.speculative import _get_minimax_m3_dspark_draft
from vllm.transformers_utils.configs.mistral import get_mistral_large_4_dspark_config
req = json.load(sys.stdin)
out = {"mistral": [], "minimax": []}
for mtp in req["mistral"]:
    try:
        c = get_mistral_large_4_dspark_config(PretrainedConfig(mtp_config=mtp, vocab_size=320, hidden_size=128))
        out["mistral"].append({"block": c.dspark_block_size, "ids": c.dflash_config["target_layer_ids"]})
    except Exception as e:
        out["mistral"].append({"error": repr(e)[:200]})
for path in req["minimax"]:
    try:
        out["minimax"].append(_get_minimax_m3_dspark_draft(SimpleNamespace(model=path, revision=None), None))
    except Exception as e:
        out["minimax"].append({"error": repr(e)[:200]})
print(json.dumps(out))
"""


@pytest.mark.engines
def test_the_in_target_readings_are_vllm_034s(tmp_path, invoke, vllm034_py):
    """The checks above against vLLM 0.34's own functions on the same files: its Mistral Large 4 DSpark config
    builder refuses exactly the mtp blocks inspect refuses (and builds a block of the depth inspect serves), and its
    MiniMax-M3 subfolder lookup finds the draft exactly where inspect does."""
    import subprocess

    mistral = [MISTRAL, *MISTRAL_BAD.values()]
    minimax = [_minimax(tmp_path, "good", MINIMAX), _minimax(tmp_path, "none", None)]
    r = subprocess.run([vllm034_py, "-c", _ASK_IN_TARGET], capture_output=True, text=True, timeout=300,
                       input=json.dumps({"mistral": mistral, "minimax": [str(p) for p in minimax]}))
    assert r.returncode == 0, r.stderr[-2000:]
    asked = json.loads(r.stdout.strip().splitlines()[-1])
    for i, (mtp, got) in enumerate(zip(mistral, asked["mistral"], strict=True)):
        code, doc, _ = _in_target(invoke, _mistral(tmp_path, f"m{i}", mtp))
        assert (code == 1) == ("error" in got), (mtp, got, doc["findings"])
        if code == 0:
            assert got == {"block": doc["speculative_config"]["num_speculative_tokens"], "ids": [1, 3, 5]}
    assert asked["minimax"][0] == str(minimax[0] / "dspark") and "error" in asked["minimax"][1]


def test_the_acceptance_inspect_prints_is_smokes_figure(invoke):
    """Issue 48: inspect --target prints an acceptance estimate without vLLM: the reference loop's acceptance length
    on held-out prompts (smoke's first four builtin:short prompts, 64 tokens, k = 3), which is the figure smoke
    --engine reference gives on them (and vLLM's counts equal the loop's: tests/test_smoke.py). The teacher-forced
    agreement per step is not printed as one: it reads natural text, harder than the target's own continuation."""
    r = invoke("inspect", TRAINED / "eagle3.1", "--target", TARGET, "--json")
    doc = json.loads(r.stdout)
    aux = doc["measured"]["aux_convention"]
    winner = next(c for c in aux["candidates"] if c["reading"] == aux["measured"])
    said = next(f["message"] for f in doc["findings"] if f["rule_id"] == "measured-reading")
    assert f"acceptance length {winner['acceptance_length']:.2f} under the reference loop" in said, said
    s = invoke("smoke", TRAINED / "eagle3.1", "--target", TARGET, "--engine", "reference", "--num-prompts", 4,
               "--max-tokens", 64, "-k", 3, "--json")
    assert s.exit_code == 0, s.stderr
    assert json.loads(s.stdout)["mean_acceptance_length"] == pytest.approx(winner["acceptance_length"], abs=1e-4)


_SGLANG_CAPTURE = """
import ast, sys, sglang
src = open(sglang.__path__[0] + "/srt/models/deepseek_v4.py").read()
fn = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)
          and n.name == "set_dspark_layers_to_capture")
print(ast.unparse(fn))
"""


@pytest.mark.engines
def test_sglang_captures_deepseek_v4s_ids_as_they_are(sglang_py):
    """in-target-engines-disagree rests on SGLang 0.5.23's DeepSeek-V4 capturing the configured ids unchanged (the
    attention input of each layer) for V4 and V4.1 alike, where vLLM adds one for V4 (tests/test_families.py asks
    vLLM's selection code)."""
    import subprocess

    r = subprocess.run([sglang_py, "-c", _SGLANG_CAPTURE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "self.model.dspark_layers_to_capture = list(layer_ids)" in r.stdout and "+ 1" not in r.stdout, r.stdout


_WILD = [None, True, -1, 0, 2**63, 1.5, "", "1,,3", "9" * 5000, "a,b", [], [1, "2"], [3, 1], {"x": 1}, [[1]],
         list(range(1000)), "5,3", "0,1,2"]


def test_hostile_in_target_configs_never_break_inspect(invoke, tmp_path):
    """Seeded: any value at every key the in-target reader reads (DeepSeek-V4's dspark_* keys, Mistral's mtp block
    and its parts, MiniMax-M3's subfolder config) gives a report, exit 0 or 1, never an internal error."""
    import random

    rng = random.Random(48)
    dsv4 = _with_mtp(tmp_path, "dsv4", ("markov_head.markov_w1", "main_proj"))
    mistral = _mistral(tmp_path, "mistral", MISTRAL)
    minimax = _minimax(tmp_path, "minimax", MINIMAX)
    cases = [(dsv4 / "config.json", k) for k in (*DSPARK_KEYS, "model_type", "num_hidden_layers")]
    cases += [(mistral / "params.json", k) for k in ("mtp", "mtp.dspark", "mtp.dspark.markov_rank",
                                                      "mtp.dspark.head_type", "mtp.n_layers", "mtp.depth",
                                                      "mtp.target_activation_layers")]
    cases += [(minimax / "dspark" / "config.json", k) for k in ("architectures", "dspark_markov_rank",
                                                                "dspark_use_dense_ffn", "text_config")]
    for path, key in cases:
        original = path.read_text()
        for value in rng.sample(_WILD, 6):
            doc = json.loads(original)
            node = doc
            *parents, last = key.split(".")
            for part in parents:
                node = node[part]  # the clean files hold every parent as an object
            node[last] = value
            path.write_text(json.dumps(doc))
            r = invoke("inspect", path.parent if path.parent.name != "dspark" else path.parent.parent, "--json")
            assert r.exit_code in (0, 1), (key, value, r.stderr[-400:], r.exception)
            assert json.loads(r.stdout)["in_target"]["name"], (key, value)
        path.write_text(original)
