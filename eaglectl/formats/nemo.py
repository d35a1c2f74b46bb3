"""NVIDIA NeMo Automodel EAGLE-3 / 3.1 drafts (PR #2322).

Every key but `lm_head`, `d2t`, `t2d` (and P-EAGLE's `mask_hidden`) carries a `model.` prefix,
which vLLM cannot load (it adds its own `model.`: docs/hazards.md#names-and-architectures); `architectures` is
`LlamaEagle3DraftModel`, registered in no engine; aux ids are not saved (runtime default,
output-of-layer). Source: NVIDIA-NeMo/Automodel `components/speculative/` (docs/hazards.md#dialects).
"""

from ._base import Dialect, Signal

DIALECT = Dialect(
    name="nemo",
    title="NeMo Automodel",
    producers="NVIDIA-NeMo/Automodel `train_eagle3` recipes",
    required=(Signal("tensor-prefix", "model.", weight=2),),
    supporting=(
        Signal("config-value", "architectures", "LlamaEagle3DraftModel", weight=2),
        Signal("file", "eagle_meta.pt"),
    ),
    key_rules=(
        ("lm_head.", "lm_head."),
        ("d2t", "d2t"),
        ("t2d", "t2d"),
        ("mask_hidden", "mask_hidden"),
        ("", "model."),
    ),
    aux_ids_paths=("eagle_aux_hidden_state_layer_ids", "eagle_config.eagle_aux_hidden_state_layer_ids"),
    aux_convention="output",
    flag_fields=frozenset({"fc_norm", "norm_output"}),
    flag_defaults={
        "norm_before_residual": (False, "NeMo has no such option: raw residual"),
        "norm_before_fc": (False, "NeMo has no input_norm"),
        "fc_norm": (False, "NeMo default"),
        "norm_output": (False, "NeMo default"),
    },
)
