"""The field moved: hazards from new producers and engines (rules/hazards.py), and drafters that are not EAGLE-3
(formats/families.py), each on a fixture written by fixtures/make_fixtures.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.checkpoint.target import open_target
from eaglectl.commands.convert.command import plan_conversion
from eaglectl.formats.families import FAMILIES
from eaglectl.rules import RULES
from eaglectl.rules.hazards import TYPED_TEMPLATE_FIELDS, init_match

from .conftest import DEFECTS, DRAFTERS, FIXTURES, ROOT, TARGET
from .helpers import edited

FAMILY_FIXTURES = FIXTURES / "families"
TRAINED = ROOT / "fixtures" / "trained"
# fixture -> (family name, a word of the engine that serves it)
FAMILY = {"eagle4": ("EAGLE-4", "eagle-harness"), "dflash": ("DFlash", "method dflash"),
          "dspark": ("DSpark", "method dspark"), "mtp": ("MTP head", "method mtp"),
          "medusa": ("Medusa", "removed in 0.33"), "peagle": ("P-EAGLE", "parallel_drafting")}
_BY_NAME = {f.name: f for f in FAMILIES}
# refused by every command; read by inspect alone (tests/test_families.py); the EAGLE-3 layout (read everywhere)
REFUSED = sorted(k for k, (name, _) in FAMILY.items() if _BY_NAME[name].reading is None)
NOT_EAGLE3 = sorted(k for k, (name, _) in FAMILY.items()
                    if _BY_NAME[name].reading is None or not _BY_NAME[name].reading.eagle3_layout)


def _json(r) -> dict:
    return json.loads(r.stdout)


def _ids(invoke, path, *args) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in _json(invoke("inspect", path, "--json", *args))["findings"]:
        out.setdefault(f["rule_id"], []).append(f)
    return out


# ------------------------------------------------------------------------------------ not EAGLE-3

def test_every_family_has_a_fixture():
    assert {p.name for p in FAMILY_FIXTURES.iterdir() if p.is_dir()} == set(FAMILY)
    assert {name for name, _ in FAMILY.values()} == {f.name for f in FAMILIES}


@pytest.mark.parametrize("name", REFUSED)
def test_inspect_names_the_family_and_who_serves_it(invoke, name):
    family, served = FAMILY[name]
    r = invoke("inspect", FAMILY_FIXTURES / name, "--json")
    assert r.exit_code == 5, r.stderr
    err = _json(r)["error"]
    assert err["reference"] == "unknown-format" and err["context"]["family"] == family
    assert f"{family}, not EAGLE-3" in err["message"] and served in err["message"]
    assert "no known dialect" not in err["message"]  # named, not "unknown"


@pytest.mark.parametrize("name", NOT_EAGLE3)
@pytest.mark.parametrize("command", ["convert", "upgrade"])
def test_convert_and_upgrade_refuse_it_with_the_reason(invoke, tmp_path, name, command):
    family, _ = FAMILY[name]
    to = ["--to", "speculators"] if command == "convert" else []
    args = [command, FAMILY_FIXTURES / name, tmp_path / "out", *to]
    r = invoke(*args)
    assert not (tmp_path / "out").exists()
    if command == "convert" and name not in REFUSED:  # read in its own layout: convert moves it between its layouts
        assert r.exit_code == 7 and family in r.stderr and "layout" in r.stderr, r.stderr
    else:
        assert r.exit_code == 5 and f"{family}, not EAGLE-3" in r.stderr


def test_from_does_not_force_a_family_into_an_eagle3_dialect(invoke):
    r = invoke("inspect", FAMILY_FIXTURES / "eagle4", "--from", "modelopt")
    assert r.exit_code == 5 and "EAGLE-4" in r.stderr


def test_eagle4_is_named_even_without_its_architecture(invoke, tmp_path):
    def as_eagle3(cfg):
        cfg["architectures"] = ["LlamaForCausalLMEagle3"]
        del cfg["efficient_lm_head_config"]

    d = edited(FAMILY_FIXTURES / "eagle4", tmp_path, name="e4", config=as_eagle3)
    r = invoke("inspect", d)
    assert r.exit_code == 5 and "EAGLE-4" in r.stderr and "attn_norm" in r.stderr


def test_no_eagle3_fixture_is_taken_for_another_family(invoke):
    for d in [*DRAFTERS.iterdir(), TRAINED / "eagle3", TRAINED / "eagle3.1", TRAINED / "eagle3.1-mla"]:
        r = invoke("inspect", d, "--json", *(["--allow-pickle"] if d.name.endswith("-bin") else []))
        assert r.exit_code in (0, 1), (d, r.stderr)


def test_smoke_offers_no_medusa_baseline(invoke):
    r = invoke("smoke", DRAFTERS / "speculators-3", "--target", TRAINED / "target", "--baseline", "none,medusa:x")
    assert r.exit_code == 2 and "vLLM 0.33 removed method medusa" in r.stderr


# ------------------------------------------------------------------------------------------ hazards

def test_nemo_named_31_without_its_weights_is_plain_eagle3(invoke):
    hit = _ids(invoke, DEFECTS / "nemo-claims-3.1")["nemo-claims-3.1"][0]
    assert "nemo-org/Qwen3-8B-EAGLE3.1" in hit["message"] and hit["severity"] == "warning"


def test_a_model_version_is_no_eagle_version_claim(invoke, tmp_path):
    d = edited(DEFECTS / "nemo-claims-3.1", tmp_path, name="Llama-3.1-8B-eagle3-1b-draft",
               config={"_name_or_path": "meta-llama/Llama-3.1-8B"})
    assert "nemo-claims-3.1" not in _ids(invoke, d)
    assert "nemo-claims-3.1" not in _ids(invoke, DRAFTERS / "nemo-3.1")  # a real 3.1 NeMo drafter


def test_untrained_norms_are_read_without_scan_and_random_matrices_with_it(invoke):
    assert "untrained-norms" in _ids(invoke, DEFECTS / "untrained-norms")
    assert "random-weights" not in _ids(invoke, DEFECTS / "random-weights")  # header-only: matrices unread
    hit = _ids(invoke, DEFECTS / "random-weights", "--scan")["random-weights"][0]
    assert "layers.0.mlp.down_proj.weight" in hit["message"] and "N(0, 0.02)" in hit["message"]


@pytest.mark.parametrize("name", ["eagle3", "eagle3.1", "eagle3-output", "eagle3.1-mla"])
def test_trained_weights_never_look_random(invoke, name):
    assert not {"random-weights", "untrained-norms"} & set(_ids(invoke, TRAINED / name, "--scan"))


def test_initialiser_statistics():
    g = np.random.default_rng(0)
    assert init_match(g.normal(0, 0.02, (256, 128)).astype(np.float32), 128, 0.02)
    bound = 1 / np.sqrt(384)
    assert init_match(g.uniform(-bound, bound, (128, 384)).astype(np.float32), 384, 0.02).startswith("U(")
    assert init_match(g.normal(0, 0.05, (256, 128)).astype(np.float32), 128, 0.02) is None
    assert init_match(g.standard_t(4, (256, 128)).astype(np.float32) * 0.014, 128, 0.02) is None  # heavy tails
    assert init_match(np.zeros((64, 64), dtype=np.float32), 64, 0.02) is None


def test_an_upgraded_drafter_s_unit_fc_norm_is_not_untrained(invoke, tmp_path):
    r = invoke("upgrade", DRAFTERS / "speculators-3", tmp_path / "up", "--init", "ones")
    assert r.exit_code == 0, r.stderr
    assert "untrained-norms" not in _ids(invoke, tmp_path / "up")


@pytest.mark.parametrize("rule,says", [("moe-drafter", "use_moe is true (2 routed experts), 6 expert tensors"),
                                       ("mla-k3-variant", "mla_use_nope is true"),
                                       ("mla-k3-variant", "mla_use_output_gate is true")])
def test_drafters_vllm_cannot_build(invoke, rule, says):
    hits = _ids(invoke, DEFECTS / rule)[rule]
    assert any(says in f["message"] for f in hits) and hits[0]["severity"] == "error"


def test_a_typed_null_is_flagged_and_never_written(invoke, tmp_path):
    assert "transformer_layer_config.use_cache" in _ids(invoke, DEFECTS / "null-template-field")[
        "null-template-field"][0]["message"]
    r = invoke("convert", DEFECTS / "null-template-field", tmp_path / "out", "--to", "speculators")
    assert r.exit_code == 0, r.stderr
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "use_cache" not in written["transformer_layer_config"]


@pytest.mark.parametrize("to", ["speculators", "modelopt", "specforge", "torchspec", "eagle"])
def test_no_writer_emits_a_typed_null(tmp_path, to):
    src = open_drafter(str(DEFECTS / "null-template-field"))
    for field in TYPED_TEMPLATE_FIELDS:
        layer = src.config.data["transformer_layer_config"]
        layer.setdefault(field, None)
    plan = plan_conversion(src, tmp_path / "x", to, base_model="org/target", target=open_target(str(TARGET)),
                           aux_layer_ids=(2, 4, 5))  # the target's default: every layout can hold it
    stack = [plan.config]
    while stack:
        node = stack.pop()
        for key, value in node.items():
            assert not (key in TYPED_TEMPLATE_FIELDS and value is None), (to, key)
            if isinstance(value, dict):
                stack.append(value)


def test_tokenspeed_warning_names_its_engine(invoke):
    hit = _ids(invoke, DEFECTS / "tokenspeed-target-hidden")["tokenspeed-target-hidden"][0]
    assert "fc and fc_norm" in hit["message"] and RULES["tokenspeed-target-hidden"].engine == "tokenspeed"
    listed = _json(invoke("rules", "tokenspeed-target-hidden", "--json"))["rules"][0]
    assert listed["engine"] == "tokenspeed" and listed["severity"] == "warning"
    assert "tokenspeed-target-hidden" not in _ids(invoke, DRAFTERS / "speculators-3.1")  # equal widths
