"""Load eaglectl outputs with speculators' own loader and run its own forward pass (test-only worker).

Runs in the speculators interpreter (EAGLECTL_SPECULATORS_PYTHON), never in eaglectl's:

    python speculators_worker.py JOB.json

JOB.json: {"target": DIR, "steps": S, "items": [{"name", "folder", "inputs", "output"}]}. `inputs` is a
safetensors file with `hidden` (1, T, n_aux * H_t) fp32 target states and `input_ids` (1, T) (the step-0
token of each anchor); `output` receives `logits.J` (1, T, V_draft) fp32 for steps J = 0..S-1, read off
`lm_head` while speculators' own `Eagle3DraftModel.forward` runs its TTT loop. Prints one JSON line:
what each load did (the plain `SpeculatorModel.from_pretrained`, the load with the local target as
verifier, keys the checkpoint has that the model lacks and the reverse, where `embed_tokens` came from).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched: the verifier is the local target
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # eager: speculators compiles its forward on GPU only anyway


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]


def main(job_path: str) -> int:
    import importlib.metadata

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from speculators import SpeculatorModel
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    with open(job_path) as fh:
        job = json.load(fh)
    target = job["target"]
    with safe_open(os.path.join(target, "model.safetensors"), "pt") as f:
        target_embed = f.get_tensor("model.embed_tokens.weight").float()
    out = {"client": "speculators", "version": importlib.metadata.version("speculators"), "torch": torch.__version__,
           "items": []}
    for item in job["items"]:
        r: dict = {"name": item["name"]}
        out["items"].append(r)
        folder = item["folder"]
        try:  # what a user gets from the files alone
            SpeculatorModel.from_pretrained(folder, dtype=torch.float32)
            r["plain_load"] = "ok"
        except Exception as e:  # noqa: BLE001 - the loader's own failure is the finding
            r["plain_load"] = _short(e)
        with open(os.path.join(folder, "config.json")) as fh:
            r["verifier"] = json.load(fh)["speculators_config"]["verifier"].get("name_or_path")
        try:
            config = Eagle3SpeculatorConfig.from_pretrained(folder)
            config.speculators_config.verifier.name_or_path = target  # the local target, given explicitly
            # its dense-mask attention: the default flex attention's block masks are built for 128-token blocks
            # and, uncompiled on a CPU, refuse the TTT steps' shorter lengths
            config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001
            model = SpeculatorModel.from_pretrained(folder, config=config, dtype=torch.float32).eval()
        except Exception as e:  # noqa: BLE001
            r["load"] = _short(e)
            continue
        r["load"] = "ok"
        r["class"] = type(model).__name__
        shipped: set[str] = set()
        for name in sorted(os.listdir(folder)):
            if name.endswith(".safetensors"):
                with safe_open(os.path.join(folder, name), "pt") as f:
                    shipped |= set(f.keys())
        state = set(model.state_dict())
        verifier_owned = {"verifier_lm_head.weight", "verifier_norm.weight"}
        r["unexpected"] = sorted(shipped - state)
        r["missing"] = sorted(state - shipped - verifier_owned - {"embed_tokens.weight"})
        embed = model.embed_tokens.weight.detach().float()
        r["embed_shipped"] = "embed_tokens.weight" in shipped
        r["embed_is_target"] = bool(torch.equal(embed, target_embed))
        if not r["embed_shipped"] and not r["embed_is_target"]:
            # speculators fills a missing embed_tokens from the verifier only when it reads as NaN; after a
            # from_pretrained that allocated it uninitialised it holds whatever memory held. The forward below
            # needs the target's table (what vLLM shares), so it is copied in and the load is recorded as such.
            r["embed_state"] = "nan" if bool(embed.isnan().all()) else "uninitialised"
            with torch.no_grad():
                model.embed_tokens.weight.copy_(target_embed)
        inputs = load_file(item["inputs"])
        captured: list = []
        hook = model.lm_head.register_forward_hook(lambda m, a, o, got=captured: got.append(o.detach().float()))
        try:
            with torch.no_grad():
                model(hidden_states=inputs["hidden"].float(), input_ids=inputs["input_ids"].long(),
                      document_ids=torch.zeros_like(inputs["input_ids"].long()), ttt_steps=int(job["steps"]))
        except Exception as e:  # noqa: BLE001
            r["forward"] = _short(e)
            continue
        finally:
            hook.remove()
        r["forward"] = "ok"
        r["attention"] = model._attn_impl  # noqa: SLF001
        save_file({f"logits.{j}": c.contiguous() for j, c in enumerate(captured)}, item["output"])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
