"""What ModelOpt's own exporter writes for the drafter eaglectl wrote with `--to modelopt` (test-only worker).

ModelOpt 0.47.0 has no loader of exported EAGLE drafters, so the comparison goes the other way: the target is
converted with ModelOpt's own `mtsp.convert(model, [("eagle", config)])` (its `HFEagleModel`, `EagleModule`),
eaglectl's tensors are loaded into that `eagle_module`, and ModelOpt's exporter
(`modelopt/torch/export/plugins/hf_spec_export.py`, `EagleExporter`, through `export_speculative_decoding`)
writes the drafter again. Runs in the ModelOpt interpreter (EAGLECTL_MODELOPT_PYTHON):

    python modelopt_worker.py JOB.json

JOB.json: {"target": DIR, "items": [{"name", "folder", "export", "aux_ids"}]}: `aux_ids` are the ids ModelOpt
is configured with (it hooks the *output* of each listed layer). Prints one JSON line: what the load into
`eagle_module` left missing or unexpected, what the exporter's own key check says of eaglectl's tensors, and
whether the export ran; the test compares `export` with `folder` key by key.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]


def main(job_path: str) -> int:
    import importlib.metadata

    import modelopt.torch.speculative as mtsp
    import torch
    from modelopt.torch.export.plugins.hf_spec_export import EagleExporter
    from modelopt.torch.export.unified_export_hf import export_speculative_decoding
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    with open(job_path) as fh:
        job = json.load(fh)
    out = {"client": "modelopt", "version": importlib.metadata.version("nvidia-modelopt"), "torch": torch.__version__,
           "items": []}
    for item in job["items"]:
        r: dict = {"name": item["name"]}
        out["items"].append(r)
        with open(os.path.join(item["folder"], "config.json")) as fh:
            ours = json.load(fh)
        ours_sd = {}
        for name in sorted(os.listdir(item["folder"])):
            if name.endswith(".safetensors"):
                ours_sd.update(load_file(os.path.join(item["folder"], name)))
        arch = {  # the drafter's decoder sizes; everything else is ModelOpt's default_eagle_config
            k: ours[k] for k in ("num_hidden_layers", "intermediate_size", "num_attention_heads",
                                 "num_key_value_heads", "head_dim", "rms_norm_eps", "hidden_act") if k in ours}
        arch.update({"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": list(item["aux_ids"]),
                     "use_last_layernorm": True, "use_input_layernorm_in_first_layer": True,
                     "draft_vocab_size": ours["draft_vocab_size"], "has_lm_head": True,
                     "rope_theta": ours.get("rope_theta", 10000.0),
                     "rope_scaling": {"rope_type": "default", "rope_theta": ours.get("rope_theta", 10000.0)},
                     "torch_dtype": ours.get("torch_dtype", "bfloat16")})
        try:
            # the drafter's own dtype, so that the exported tensors' dtypes can be compared with eaglectl's
            dtype = getattr(torch, ours.get("torch_dtype") or "float32")
            base = AutoModelForCausalLM.from_pretrained(job["target"], dtype=dtype)
            mtsp.convert(base, [("eagle", {"eagle_decoder_type": "llama", "eagle_architecture_config": arch,
                                            "eagle_use_torch_compile": False})])
        except Exception as e:  # noqa: BLE001 - ModelOpt's own failure is the finding
            r["convert"] = _short(e)
            continue
        r["convert"] = "ok"
        try:  # the exporter's own key check, on eaglectl's tensors as written
            EagleExporter(base)._check_valid_sd(dict(ours_sd))  # noqa: SLF001
            r["key_check"] = "ok"
        except AssertionError as e:
            r["key_check"] = _short(e)
        module_sd = base.eagle_module.state_dict()
        r["module_keys"] = sorted(module_sd)
        loadable = {k: v for k, v in ours_sd.items() if k in module_sd}
        res = base.eagle_module.load_state_dict({k: v.to(module_sd[k].dtype) for k, v in loadable.items()},
                                                strict=False)
        r["unexpected"] = sorted(set(ours_sd) - set(module_sd))
        r["missing"] = sorted(res.missing_keys)
        try:
            export_speculative_decoding(base, dtype=None, export_dir=item["export"])
            r["export"] = "ok"
        except Exception as e:  # noqa: BLE001
            r["export"] = _short(e)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
