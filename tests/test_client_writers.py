"""What the client libraries read in eaglectl's files (issue 22 §1): the writer defects their own loaders showed,
each tested on the files as written. The loaders themselves run in tests/test_clients.py."""

from __future__ import annotations

import json

import torch
from safetensors import safe_open

from .conftest import DRAFTERS, TARGET
from .helpers import edited


def _config(folder):
    return json.loads((folder / "config.json").read_text())


def _rules(invoke, folder) -> dict[str, dict]:
    doc = json.loads(invoke("inspect", folder, "--json").stdout)
    return {f["rule_id"]: f for f in doc["findings"]}


def test_specforge_output_leaves_a_false_norm_output_out(invoke, tmp_path):
    """SpecForge 0.2.0 reads an explicit `norm_output: false` as "no final norm before lm_head" (logits off by up
    to 26 on a fixture); SpecForge's own configs leave the key out, and so does eaglectl."""
    for source in ("specforge-3", "speculators-3", "eagle-3"):
        out = tmp_path / source
        r = invoke("convert", DRAFTERS / source, out, "--to", "specforge", "--allow-pickle")
        assert r.exit_code == 0, r.stderr
        cfg = _config(out)
        assert "norm_output" not in cfg, cfg
        assert cfg["fc_norm"] is False and cfg["norm_before_residual"] is False  # other flags stay explicit
        doc = json.loads(invoke("inspect", out, "--json").stdout)
        assert doc["spec"]["norm_output"] is False  # read back as plain EAGLE-3
        assert "specforge-norm-output-window" not in {f["rule_id"] for f in doc["findings"]}


def test_specforge_3_1_output_is_written_with_a_warning(invoke, tmp_path):
    """SpecForge 0.2.0 always feeds back the pre-norm state: a 3.1 file matches its forward at step 0 only."""
    out = tmp_path / "sf31"
    r = invoke("convert", DRAFTERS / "speculators-3.1", out, "--to", "specforge")
    assert r.exit_code == 0, r.stderr
    assert _config(out)["norm_output"] is True
    assert "warning:" in r.stdout and "SpecForge 0.2.0" in r.stdout
    r = invoke("convert", DRAFTERS / "speculators-3.1", tmp_path / "j", "--to", "specforge", "--json")
    warnings = json.loads(r.stdout)["plan"]["warnings"]
    assert len(warnings) == 1 and "pre-norm state" in warnings[0]
    # plain EAGLE-3 for SpecForge: nothing to warn about
    r = invoke("convert", DRAFTERS / "speculators-3", tmp_path / "p", "--to", "specforge", "--json")
    assert json.loads(r.stdout)["plan"]["warnings"] == []
    # upgrade --to specforge writes 3.1: the same warning
    r = invoke("upgrade", DRAFTERS / "speculators-3", tmp_path / "u", "--to", "specforge", "--no-fidelity")
    assert r.exit_code == 0, r.stderr
    assert "warning:" in r.stdout and "SpecForge 0.2.0" in r.stdout


def test_an_explicit_norm_output_false_in_a_specforge_checkpoint_is_settled_by_its_final_norm(invoke, tmp_path):
    """An explicit norm_output false meant "no final norm before lm_head" in SpecForge 0.2.0 and before PR #879. The
    final norm's weight settles which: one that varies was trained (after #879: nothing said); one that holds one
    value never reached the loss (before #879: final-norm-untrained, an error); without one, the caveat warns."""
    cfg = _config(DRAFTERS / "specforge-3")
    assert "norm_output" not in cfg and not cfg.get("fc_norm")
    assert "specforge-norm-output-window" not in _rules(invoke, DRAFTERS / "specforge-3")
    src = edited(DRAFTERS / "specforge-3", tmp_path, name="after", config={"norm_output": False})
    assert not {"specforge-norm-output-window", "final-norm-untrained"} & set(_rules(invoke, src))
    old = edited(DRAFTERS / "specforge-3", tmp_path, name="before", config={"norm_output": False},
                 tensors=lambda state: state.update({"norm.weight": state["norm.weight"] * 0 + 1}))
    assert _rules(invoke, old)["final-norm-untrained"]["severity"] == "error"
    bare = edited(DRAFTERS / "specforge-3", tmp_path, name="bare", config={"norm_output": False},
                  tensors={"norm.weight": None})
    found = _rules(invoke, bare)["specforge-norm-output-window"]
    assert found["severity"] == "warning" and "explicit false" in found["message"]
    # a 3.1 checkpoint: the caveat once, not twice
    doc = json.loads(invoke("inspect", DRAFTERS / "specforge-3.1", "--json").stdout)
    assert [f["rule_id"] for f in doc["findings"]].count("specforge-norm-output-window") == 1


def test_verifier_unnamed_names_the_speculators_loader(invoke, tmp_path):
    out = tmp_path / "s"
    r = invoke("convert", DRAFTERS / "specforge-3", out, "--to", "speculators", "--target", TARGET, "--no-measure")
    assert r.exit_code == 0, r.stderr
    assert _config(out)["speculators_config"]["verifier"]["name_or_path"] is None
    assert "warning:" in r.stdout and "OSError" in r.stdout
    found = _rules(invoke, out)["verifier-unnamed"]
    # speculators 0.9.0's loader raises OSError on it: another tool misreads the file, a warning by the policy
    assert found["severity"] == "warning" and "speculators" in found["message"] and "OSError" in found["message"]
    assert invoke("inspect", out).exit_code == 0 and invoke("inspect", out, "--strict").exit_code == 1


def test_embed_from_target_ships_the_targets_table(invoke, tmp_path):
    """speculators fills a missing embed_tokens from its verifier only when the fresh tensor reads as NaN; in
    most loads it does not, and the drafter embeds with uninitialised memory. --embed-from-target ships the
    target's table (what vLLM shares into the drafter anyway)."""
    out = tmp_path / "e"
    r = invoke("convert", DRAFTERS / "specforge-3", out, "--to", "speculators", "--target", TARGET,
               "--embed-from-target", "--json")
    assert r.exit_code == 0, r.stderr
    with safe_open(str(out / "model.safetensors"), "pt") as f, \
            safe_open(str(TARGET / "model.safetensors"), "pt") as t:
        ours, theirs = f.get_tensor("embed_tokens.weight"), t.get_tensor("model.embed_tokens.weight")
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    plan = json.loads(r.stdout)["plan"]
    assert any(a["dest"] == "embed_tokens.weight" and a["action"] == "from-target" for a in plan["tensors"])
    # it needs the target, and says so (a usage of the files, not a crash)
    r = invoke("convert", DRAFTERS / "specforge-3", tmp_path / "n", "--to", "speculators", "--base-model", "org/t",
               "--embed-from-target")
    assert r.exit_code not in (0, 70) and "--target" in r.stderr and not (tmp_path / "n").exists()
    # a drafter that ships its own table keeps it
    own = tmp_path / "own"
    assert invoke("convert", out, own, "--to", "speculators", "--target", TARGET, "--embed-from-target",
                  "--no-measure").exit_code == 0
    with safe_open(str(own / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("embed_tokens.weight"), theirs)


def test_modelopt_3_1_output_warns_that_modelopt_takes_no_fc_norm(invoke, tmp_path):
    r = invoke("convert", DRAFTERS / "speculators-3.1", tmp_path / "m", "--to", "modelopt", "--json")
    assert r.exit_code == 0, r.stderr
    warnings = json.loads(r.stdout)["plan"]["warnings"]
    assert len(warnings) == 1 and "Unexpected key: fc_norm.0.weight" in warnings[0]
    r = invoke("convert", DRAFTERS / "speculators-3", tmp_path / "p", "--to", "modelopt", "--json")
    assert json.loads(r.stdout)["plan"]["warnings"] == []
