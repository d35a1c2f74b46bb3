"""Load eaglectl outputs with SpecForge's own draft-model loader and run its own modules (test-only worker).

Runs in the SpecForge interpreter (EAGLECTL_SPECFORGE_PYTHON), never in eaglectl's:

    python specforge_worker.py JOB.json

JOB.json as for speculators_worker.py. The draft is loaded the way SpecForge's training loads one
(`AutoDraftModelConfig.from_file`, then `AutoDraftModel.from_pretrained`, specforge/modeling/auto.py), and
the steps run its own methods in the order of its training loop (specforge/algorithms/eagle3/model.py:
`project_hidden_states` once, then per step `embed_input_ids`, `backbone` with the cached-hidden SDPA path,
`compute_logits`, the backbone's output fed back, the ids shifted by `specforge.utils.padding`). Writes
`logits.J` per step; prints one JSON line per job.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # its RoPE forward is torch.compile'd: run it eagerly


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]


def main(job_path: str) -> int:
    import importlib.metadata

    import torch
    from safetensors.torch import load_file, save_file
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig
    from specforge.modeling.draft.llama3_eagle import LlamaAttention
    from specforge.utils import padding

    with open(job_path) as fh:
        job = json.load(fh)
    out = {"client": "specforge", "version": importlib.metadata.version("specforge"), "torch": torch.__version__,
           "items": []}
    steps = int(job["steps"])
    for item in job["items"]:
        r: dict = {"name": item["name"]}
        out["items"].append(r)
        folder = item["folder"]
        try:
            config = AutoDraftModelConfig.from_file(os.path.join(folder, "config.json"))
            model, info = AutoDraftModel.from_pretrained(folder, config=config, dtype=torch.float32,
                                                         output_loading_info=True)
        except Exception as e:  # noqa: BLE001 - the loader's own failure is the finding
            r["load"] = _short(e)
            continue
        model = model.float().eval()
        r["load"] = "ok"
        r["class"] = type(model).__name__
        r["unexpected"] = sorted(info.get("unexpected_keys") or [])
        r["missing"] = sorted(info.get("missing_keys") or [])
        r["norm_output"] = bool(model.norm_output)
        r["fc_norm"] = model.fc_norm is not None
        if "embed_tokens.weight" in r["missing"]:  # what SpecForge's training does: the target's table
            with torch.no_grad():
                model.load_embedding(job["target"])
            r["embed"] = "load_embedding(target)"
        # SpecForge's RoPE tables are non-persistent buffers built in __init__; from_pretrained builds the
        # model without running that, so they hold uninitialised memory until SpecForge's own init runs again
        for m in model.modules():
            if isinstance(m, LlamaAttention):
                m._init_rope()  # noqa: SLF001
        inputs = load_file(item["inputs"])
        hidden, ids = inputs["hidden"].float(), inputs["input_ids"].long()
        B, T = ids.shape
        logits = []
        try:
            with torch.no_grad():
                h = model.project_hidden_states(hidden)
                positions = torch.arange(T).unsqueeze(0)
                mask = model.prepare_decoder_attention_mask(attention_mask=torch.ones(B, T, dtype=torch.bool),
                                                            hidden_states=h, batch_size=B, seq_length=T,
                                                            past_key_values_length=0)
                cache_hidden: list = [[], []]
                for j in range(steps):
                    embeds = model.embed_input_ids(ids).to(h.dtype)
                    h = model.backbone(input_embeds=embeds, hidden_states=h, cache_hidden=cache_hidden,
                                       attention_mask=mask, position_ids=positions, past_key_values=None,
                                       use_cache=True)
                    logits.append(model.compute_logits(h).float())
                    if j < steps - 1:
                        ids = padding(ids, left=False)
        except Exception as e:  # noqa: BLE001
            r["forward"] = _short(e)
            continue
        r["forward"] = "ok"
        save_file({f"logits.{j}": c.contiguous() for j, c in enumerate(logits)}, item["output"])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
