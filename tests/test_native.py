"""A plain Llama target eaglectl runs itself (model/native.py) computes exactly what transformers computes, and
the readings printed with it are the same; other targets still go to transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from eaglectl.checkpoint.drafter import open_drafter
from eaglectl.checkpoint.target import open_target
from eaglectl.measure import probe
from eaglectl.measure.target import Target
from eaglectl.measure.workload import heldout_prompts, measurement_text, text_token_ids
from eaglectl.model import hf
from eaglectl.model.native import KVCache, Llama, load_native, why_not_native

from .conftest import FIXTURES, ROOT

TRAINED = FIXTURES / "trained"


@pytest.mark.parametrize("name", ["trained/target", "target-llama"])
def test_the_native_run_is_transformers_bit_for_bit(name):
    source = str(FIXTURES / name)
    native = hf.load_model(source, checkpoint=open_target(source))
    theirs = hf.load_model(source)
    assert isinstance(native.model, Llama) and not isinstance(theirs.model, Llama)
    head, tail, _ = measurement_text()
    ids = text_token_ids(theirs.tokenizer, theirs.vocab_size, head + tail)[:300]
    assert text_token_ids(native.tokenizer, native.vocab_size, head + tail)[:300] == ids
    if theirs.tokenizer is not None:
        assert heldout_prompts(native.tokenizer, 3, 40, 1) == heldout_prompts(theirs.tokenizer, 3, 40, 1)
    every = tuple(range(native.num_layers + 1))
    for a, b in zip(hf.forward(native, torch.tensor([ids]), every), hf.forward(theirs, torch.tensor([ids]), every),
                    strict=True):
        assert torch.equal(a, b)
    prompts = torch.tensor([ids[:40], ids[50:90]])
    assert torch.equal(hf.greedy(native, prompts, 30), hf.greedy(theirs, prompts, 30))
    assert torch.equal(native.embedding(), theirs.embedding()) and torch.equal(native.head(), theirs.head())
    # the cached steps of the live speculative loop: a prefix, then several tokens at once, then a crop
    outs = []
    for m in (native, theirs):
        cache = hf.new_cache(m)
        hf.forward(m, prompts[:1, :30], (2,), cache=cache, positions=torch.arange(30)[None])
        step = hf.forward(m, prompts[:1, 30:34], (2, 5), cache=cache, positions=torch.arange(30, 34)[None])
        assert hf.croppable(cache)
        hf.crop_cache(cache, 32)
        again = hf.forward(m, prompts[:1, 32:35], (2, 5), cache=cache, positions=torch.arange(32, 35)[None])
        outs.append((*step, *again))
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))


def test_the_readings_are_the_same_without_transformers(monkeypatch):
    d = open_drafter(str(TRAINED / "eagle3-output"))
    ours = probe.measure(d, Target.open(str(TRAINED / "target")))
    monkeypatch.setattr(hf, "load_native", lambda checkpoint, dtype: None)
    theirs_target = Target.open(str(TRAINED / "target"))
    theirs = probe.measure(d, theirs_target)
    assert not isinstance(theirs_target.model().model, Llama)

    def facts(m):
        return {name: (f.declared, f.measured, f.reason, [(c.reading, c.boundary_ids, c.agreement, c.loglik,
                                                           c.acceptance_length) for c in f.candidates])
                for name, f in m.facts.items()}

    assert facts(ours) == facts(theirs) and ours.chance == theirs.chance


def test_inspect_with_a_plain_llama_target_never_imports_transformers():
    code = ("import sys\nfrom eaglectl.cli.app import cli\n"
            "try:\n    cli(['inspect', sys.argv[1], '--target', sys.argv[2], '--json'])\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted(m for m in ('transformers', 'torch._dynamo') if m in sys.modules)))\n")
    r = subprocess.run([sys.executable, "-c", "import json\n" + code, str(TRAINED / "eagle3-output"),
                        str(TRAINED / "target")], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [], r.stderr[-2000:]
    assert '"aux_convention"' in r.stdout  # it did measure


@pytest.mark.parametrize(("change", "why"), [
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope_parameters"),
    ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, "architectures"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_what_eaglectl_does_not_implement_goes_to_transformers(change, why):
    config = {**json.loads((TRAINED / "target" / "config.json").read_text()), **change}
    assert why in why_not_native(config, torch.float32)
    assert why_not_native(json.loads((TRAINED / "target" / "config.json").read_text()), torch.bfloat16)
    assert load_native(open_target(str(TRAINED / "target-mla")), torch.float32) is None


def test_a_crop_keeps_the_first_positions():
    cache = KVCache(1)
    cache.append(0, torch.arange(10.0).view(1, 1, 10, 1), torch.arange(10.0).view(1, 1, 10, 1))
    cache.crop(-3)
    assert cache.get_seq_length() == 7 and cache.k[0].flatten().tolist() == list(range(7))


def test_only_a_tokenizer_that_is_tokenizer_json_alone_is_read_without_transformers(tmp_path):
    from eaglectl.model.tokens import PlainTokenizer, plain_tokenizer

    plain = plain_tokenizer(TRAINED / "target")
    assert isinstance(plain, PlainTokenizer) and plain.bos_token_id == 1 and plain.pad_token_id == 0
    settings = json.loads((TRAINED / "target" / "tokenizer_config.json").read_text())
    for name, change in (("chat", {"chat_template": "{{ messages }}"}),
                         ("llama", {"tokenizer_class": "LlamaTokenizer"})):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tokenizer.json").write_bytes((TRAINED / "target" / "tokenizer.json").read_bytes())
        (folder / "tokenizer_config.json").write_text(json.dumps({**settings, **change}))
        assert plain_tokenizer(folder) is None  # transformers reads it: a chat template, or a class's own rules
