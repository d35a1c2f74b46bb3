"""Real clients read what eaglectl writes (issue 22 §1): speculators 0.9.0 and SpecForge 0.2.0 load every
`--to speculators` / `--to specforge` output (and `upgrade --to specforge`) of every trained fixture with
their own loaders, and their own forward passes match eaglectl's reference drafter in fp32 on the same
target states and ids. ModelOpt 0.47.0 has no loader: its own exporter writes the same drafter again and
the two folders are compared key by key and field by field.

Each client lives in its own interpreter, as vLLM does (`make clients`; docs/ci.md):
EAGLECTL_SPECULATORS_PYTHON, EAGLECTL_SPECFORGE_PYTHON, EAGLECTL_MODELOPT_PYTHON, defaulting to
.venv-speculators, .venv-specforge and .venv-modelopt at the repository root. A missing one skips its
test with the reason; EAGLECTL_REQUIRE_CLIENTS=1 (CI) makes that a failure. One worker call per test.
The matrix and every difference found: docs/engines.md#clients.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.cli.app import cli as eaglectl_cli
from eaglectl.measure.parity import TOLERANCES
from eaglectl.model.hf import forward, load_model
from eaglectl.model.loader import load_reference

pytestmark = [pytest.mark.slow, pytest.mark.clients]

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"
WORKERS = Path(__file__).resolve().parent / "clients"
DRAFTERS = ("eagle3", "eagle3-output", "eagle3.1")  # every trained llama drafter; eagle3.1-mla: see below
STEPS = 3
TOL = TOLERANCES["fp32"]
TEXT = ("The drafter reads the target's hidden states and proposes the next few tokens; the target checks "
        "them all in one pass and keeps the longest prefix it agrees with.")


def client_python(name: str) -> str:
    var = f"EAGLECTL_{name.upper()}_PYTHON"
    path = os.environ.get(var) or str(ROOT / f".venv-{name}" / "bin" / "python")
    if not os.access(path, os.X_OK):
        why = f"no {name} interpreter at {path} (make clients, or set {var})"
        if os.environ.get("EAGLECTL_REQUIRE_CLIENTS"):
            pytest.fail(f"EAGLECTL_REQUIRE_CLIENTS is set but there is {why}")
        pytest.skip(why)
    return path


def run_worker(python: str, worker: str, job: dict, folder: Path) -> dict:
    path = folder / f"{worker}.json"
    path.write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)  # the client's interpreter sees its own packages only, not eaglectl
    proc = subprocess.run([python, str(WORKERS / f"{worker}.py"), str(path)], capture_output=True, text=True,
                          env=env, timeout=1200, cwd=folder)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cli(*args: object) -> int:
    r = CliRunner().invoke(eaglectl_cli, [str(a) for a in args], catch_exceptions=False)
    assert r.exit_code in (0, BEHAVIOUR_CHANGED), (args, r.output)
    return r.exit_code


# convert --target replays the written drafter the way the destination's serving engine reads it and refuses
# when that engine would capture other layers (sglang reads output-of-layer ids not starting at 1 as
# boundaries): the files are still what the client's loader reads, so they are written without the replay
BEHAVIOUR_CHANGED = 17


@pytest.fixture(scope="module")
def target():
    return load_model(str(TARGET))


@pytest.fixture(scope="module")
def tokens(target):
    ids = target.tokenizer(TEXT, return_tensors="pt").input_ids[:, :40]
    assert ids.shape[1] >= 24
    return ids


def prepare(folder: Path, tokens: torch.Tensor, target, work: Path) -> tuple[Path, list[torch.Tensor]]:
    """The inputs file a worker reads (real target states at the output's own capture ids) and eaglectl's
    reference logits per step on it (fp32; the target's table where the drafter ships none)."""
    d = open_drafter(str(folder))
    loaded = load_reference(d)
    drafter = loaded.build(torch.float32, "cpu")
    T = tokens.shape[1] - STEPS
    aux = forward(target, tokens[:, :T], d.spec.capture_ids(target.num_layers))[1].float()
    with torch.no_grad():
        outs = drafter.run(aux, tokens, STEPS, embed=None if loaded.has_embed else target.embedding().float())
    inputs = work / f"{folder.name}.inputs.safetensors"
    save_file({"hidden": aux.contiguous(), "input_ids": tokens[:, 1:1 + T].contiguous()}, str(inputs))
    return inputs, [o.logits for o in outs]


def deltas(ours: list[torch.Tensor], theirs_file: Path) -> list[float]:
    """max |Δ logits| per step, over the anchors whose step-j input exists (the client pads the rest)."""
    theirs = load_file(str(theirs_file))
    out = []
    for j, ref in enumerate(ours):
        T = ref.shape[1]
        got = theirs[f"logits.{j}"][:, : T - j]
        assert got.shape == ref[:, : T - j].shape, (j, got.shape, ref.shape)
        out.append(float((got - ref[:, : T - j]).abs().max()))
    return out


def close(ours: list[torch.Tensor], theirs_file: Path, j: int) -> bool:
    ref = ours[j]
    got = load_file(str(theirs_file))[f"logits.{j}"][:, : ref.shape[1] - j]
    return torch.allclose(got, ref[:, : ref.shape[1] - j], **TOL)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Every writable speculators / specforge output of every trained llama fixture, written through the CLI
    with the fixture target (measured aux reading, behaviour-checked)."""
    base = tmp_path_factory.mktemp("client-outputs")
    made: dict[str, tuple[str, Path]] = {}
    for name in DRAFTERS:
        for to, extra in (("speculators", ()), ("specforge", ()), ("modelopt", ()),
                          ("speculators", ("--embed-from-target",))):
            out = base / f"{name}.{to}{'-embed' if extra else ''}"
            if cli("convert", TRAINED / name, out, "--to", to, "--target", TARGET, *extra) == BEHAVIOUR_CHANGED:
                print(f"{out.name}: refused for the serving engine's reading; written without the replay")
                assert cli("convert", TRAINED / name, out, "--to", to, "--target", TARGET, "--no-measure", *extra) == 0
            made[out.name] = (to, out)
        if name != "eagle3.1":  # already 3.1: upgrade changes nothing
            out = base / f"{name}.upgrade-specforge"
            if cli("upgrade", TRAINED / name, out, "--to", "specforge", "--target", TARGET, "--init", "calibrated",
                   "--no-fidelity") == 0:
                made[out.name] = ("specforge", out)
            else:
                print(f"{out.name}: refused for the serving engine's reading (exit 17); not in the matrix")
    assert sum(to == "specforge" for to, _ in made.values()) >= 4
    return made


def test_mla_fixture_cannot_be_written_for_either_training_client(invoke, tmp_path):
    """Neither speculators nor SpecForge has an MLA EAGLE-3 draft model: eaglectl refuses, naming the reason."""
    for to in ("speculators", "specforge"):
        r = invoke("convert", TRAINED / "eagle3.1-mla", tmp_path / to, "--to", to)
        assert r.exit_code not in (0, 70) and "cannot hold a mla drafter" in r.stderr, r.stderr
        assert not (tmp_path / to).exists()


PEAGLE_LOAD = """
import json, sys, torch
from safetensors import safe_open
from speculators import SpeculatorModel, SpeculatorModelConfig
folder, target = sys.argv[1], sys.argv[2]
config = SpeculatorModelConfig.from_pretrained(folder)
config.speculators_config.verifier.name_or_path = target  # the local target, given explicitly
model = SpeculatorModel.from_pretrained(folder, config=config, dtype=torch.float32)
with safe_open(folder + "/model.safetensors", "pt") as f:
    shipped = {k: f.get_tensor(k) for k in f.keys()}
state = model.state_dict()
print(json.dumps({"config": type(config).__name__, "model": type(model).__name__, "mask_token_id": config.mask_token_id,
                  "unexpected": sorted(set(shipped) - set(state)),
                  "mask_hidden": bool(torch.equal(state["mask_hidden"], shipped["mask_hidden"].float()))}))
"""


def test_speculators_loads_eaglectls_peagle_form(invoke, tmp_path):
    """`convert --to speculators` of a P-EAGLE writes speculators' own P-EAGLE form, which speculators 0.9.0 loads as
    its PEagleDraftModel: every tensor placed (mask_hidden at the [1, 1, n] shape its module holds, equal to the
    source's), the mask token in its config."""
    python = client_python("speculators")
    out = tmp_path / "peagle"
    r = invoke("convert", TRAINED / "peagle", out, "--to", "speculators", "--target", TARGET, "--base-model",
               "org/target")
    assert r.exit_code == 0, r.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONNOUSERSITE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([python, "-c", PEAGLE_LOAD, str(out), str(TARGET)], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"config": "PEagleSpeculatorConfig", "model": "PEagleDraftModel", "mask_token_id": 319,
                   "unexpected": [], "mask_hidden": True}


def _load_and_forward(client, outputs, tokens, target, tmp_path):
    """CLIENT's worker run on every output written `--to CLIENT` (inputs prepared): its report, and eaglectl's
    reference logits per output."""
    python = client_python(client)  # skips (or fails) first, before any work
    items, refs = [], {}
    for key, (dialect, folder) in outputs.items():
        if dialect != client:
            continue
        inputs, refs[key] = prepare(folder, tokens, target, tmp_path)
        items.append({"name": key, "folder": str(folder), "inputs": str(inputs),
                      "output": str(tmp_path / f"{key}.logits.safetensors")})
    job = {"target": str(TARGET), "steps": STEPS, "items": items}
    return run_worker(python, f"{client}_worker", job, tmp_path), refs


def test_speculators_loads_every_output_and_its_forward_matches(outputs, tokens, target, tmp_path):
    rep, refs = _load_and_forward("speculators", outputs, tokens, target, tmp_path)
    assert rep["version"] == "0.9.0"
    for r in rep["items"]:
        key = r["name"]
        d = deltas(refs[key], tmp_path / f"{key}.logits.safetensors") if r.get("forward") == "ok" else None
        print(f"speculators {rep['version']} {key}: plain load {r['plain_load']!r}, load {r['load']}, "
              f"embed {'shipped' if r.get('embed_shipped') else r.get('embed_state', 'from the verifier')}, "
              f"max |Δ logits| per step {d}")
        assert r["load"] == "ok" and r["forward"] == "ok", r
        assert r["unexpected"] == [] and r["missing"] == [], r
        for j in range(STEPS):
            assert close(refs[key], tmp_path / f"{key}.logits.safetensors", j), (key, j, d)
        if r["verifier"] is None:  # rule verifier-unnamed says this: the loader cannot take a null verifier
            assert r["plain_load"].startswith("OSError"), r
        if key.endswith("-embed"):  # shipped from the target: loaded from the file, right on every load
            assert r["embed_shipped"] and r["embed_is_target"], r


def test_specforge_loads_every_output_and_its_forward_matches(outputs, tokens, target, tmp_path):
    rep, refs = _load_and_forward("specforge", outputs, tokens, target, tmp_path)
    assert rep["version"] == "0.2.0"
    for r in rep["items"]:
        key = r["name"]
        folder = outputs[key][1]
        cfg = json.loads((folder / "config.json").read_text())
        three_one = bool(cfg.get("norm_output"))
        d = deltas(refs[key], tmp_path / f"{key}.logits.safetensors") if r.get("forward") == "ok" else None
        print(f"specforge {rep['version']} {key}: load {r['load']}, norm_output {r.get('norm_output')}, "
              f"fc_norm {r.get('fc_norm')}, max |Δ logits| per step {d}")
        assert r["load"] == "ok" and r["forward"] == "ok", r
        assert r["unexpected"] == [], r
        assert set(r["missing"]) <= {"embed_tokens.weight"}, r  # SpecForge's loader expects the target's table
        assert close(refs[key], tmp_path / f"{key}.logits.safetensors", 0), (key, d)  # step 0: every output
        for j in range(1, STEPS):
            # 0.2.0 always feeds back the pre-norm state: plain EAGLE-3 matches at every step, a 3.1 drafter
            # only at step 0 (convert and upgrade warn about it when they write one)
            assert close(refs[key], tmp_path / f"{key}.logits.safetensors", j) != three_one, (key, j, d)


def test_modelopt_exporter_writes_what_eaglectl_writes(outputs, tmp_path):
    python = client_python("modelopt")
    items = []
    for key, (to, folder) in outputs.items():
        if to != "modelopt":
            continue
        cfg = json.loads((folder / "config.json").read_text())
        # ModelOpt hooks the output of each listed layer: the same states as eaglectl's boundary ids are the
        # layers one below them
        ids = [i - 1 for i in cfg["eagle_aux_hidden_state_layer_ids"]]
        items.append({"name": key, "folder": str(folder), "export": str(tmp_path / f"{key}.export"),
                      "aux_ids": ids})
    rep = run_worker(python, "modelopt_worker", {"target": str(TARGET), "items": items}, tmp_path)
    assert rep["version"] == "0.47.0"
    for r in rep["items"]:
        key = r["name"]
        folder, export = outputs[key][1], tmp_path / f"{key}.export"
        print(f"modelopt {rep['version']} {key}: convert {r['convert']}, key check {r['key_check']!r}, "
              f"unexpected {r['unexpected']}, missing {r['missing']}, export {r['export']}")
        assert r["convert"] == "ok" and r["export"] == "ok" and r["missing"] == [], r
        ours = tensors(folder)
        theirs = tensors(export)
        fc_norm = sorted(k for k in ours if k.startswith("fc_norm."))
        # EAGLE-3.1's fc_norm is the only difference in names: ModelOpt 0.47.0 has none, its key check rejects it
        # (convert warns when it writes these files)
        assert sorted(set(ours) - set(theirs)) == fc_norm and r["unexpected"] == fc_norm, (sorted(ours), sorted(theirs))
        assert (r["key_check"] == "ok") == (not fc_norm), r
        assert not fc_norm or "Unexpected key: fc_norm" in r["key_check"], r
        assert set(theirs) <= set(ours), sorted(set(theirs) - set(ours))
        for k in theirs:
            assert ours[k][0] == theirs[k][0] and torch.equal(ours[k][1], theirs[k][1]), k  # dtype and values
        compare_configs(json.loads((folder / "config.json").read_text()),
                        json.loads((export / "config.json").read_text()))


def tensors(folder: Path) -> dict[str, tuple[str, torch.Tensor]]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():  # noqa: SIM118 - a safe_open handle is not a dict
                t = st.get_tensor(k)
                out[k] = (str(t.dtype), t)
    return out


# Every field where ModelOpt's exporter and eaglectl differ, with why (docs/engines.md#clients); anything not
# named here must be equal, so a new difference fails the test.
MODELOPT_DIFFERENCES = {
    # ids: ModelOpt hooks the output of each listed layer, vLLM (V1) reads them as boundaries; eaglectl writes
    # vLLM's numbering into eagle_config too (the writers' aux-id work owns this; checked below: one apart)
    "eagle_config.eagle_aux_hidden_state_layer_ids": "numbering",
    # ModelOpt injects its eagle_export_rope_scaling (YaRN x32 over 2048) whenever training used default RoPE;
    # eaglectl keeps the RoPE the drafter was trained with (docs/hazards.md#rope)
    "rope_scaling": "export-time RoPE",
    "transformers_version": "provenance (ModelOpt's from the target's config, eaglectl its own provenance)",
    "initializer_range": "training only (ModelOpt's default_eagle_config)",
}
# keys ModelOpt's template fills from the target's config where eaglectl, copying the drafter's config, leaves
# them out: each must hold the value transformers' LlamaConfig assumes when the key is absent
MODELOPT_HF_DEFAULTS = ("attention_bias", "attention_dropout", "mlp_bias", "pretraining_tp", "use_cache")
# keys eaglectl writes that ModelOpt's template has no slot for: what vLLM reads (the flags, the top-level ids
# its V2 runner reads), the width of the aux states, the provenance
EAGLECTL_ONLY = {"eagle_aux_hidden_state_layer_ids", "norm_before_residual", "norm_before_fc", "fc_norm",
                 "norm_output", "eagle_config.norm_before_fc", "target_hidden_size", "eaglectl_provenance"}


def flat(obj: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in obj.items():
        if isinstance(v, dict) and k == "eagle_config":
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def compare_configs(ours: dict, theirs: dict) -> None:
    from transformers import LlamaConfig

    a, b = flat(ours), flat(theirs)
    defaults = LlamaConfig()
    unexpected = []
    for key in sorted(set(a) | set(b)):
        if key in MODELOPT_DIFFERENCES:
            continue
        if key in EAGLECTL_ONLY:
            assert key not in b, key  # ModelOpt writes no such key
            continue
        if key in MODELOPT_HF_DEFAULTS and key not in a:
            assert b[key] == getattr(defaults, key), (key, b[key])
            continue
        if b.get(key) is None and key not in a:
            continue  # a template slot ModelOpt left null: not written by eaglectl either
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            unexpected.append((key, a.get(key, "<absent>"), b.get(key, "<absent>")))
    assert not unexpected, unexpected
    ids = "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert a[ids] == b[ids]  # eagle_config's ids in ModelOpt's own numbering (output of layer), as its exporter writes
    assert b["rope_scaling"]["rope_type"] == "yarn" and "rope_scaling" not in a
