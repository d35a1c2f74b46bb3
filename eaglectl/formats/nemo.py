"""NVIDIA NeMo Automodel EAGLE-3 / 3.1 drafts (PR #2322).

Every key but `lm_head`, `d2t`, `t2d` (and P-EAGLE's `mask_hidden`) carries a `model.` prefix,
which vLLM cannot load (it adds its own `model.`: docs/hazards.md#names-and-architectures); `architectures` is
`LlamaEagle3DraftModel`, registered in no engine; aux ids are not saved (runtime default,
output-of-layer). Source: NVIDIA-NeMo/Automodel `components/speculative/` (docs/hazards.md#dialects).
"""

from ._base import BOTH_AUX_KEYS, Dialect, Signal, architectures, flag_defaults

DIALECT = Dialect(
    name="nemo",
    title="NeMo Automodel",
    producers="NVIDIA-NeMo/Automodel `train_eagle3` recipes",
    required=(Signal("tensor-prefix", "model.", weight=2),),
    supporting=(*architectures("LlamaEagle3DraftModel", weight=2), Signal("file", "eagle_meta.pt")),
    key_rules=(
        ("lm_head.", "lm_head."),
        ("d2t", "d2t"),
        ("t2d", "t2d"),
        ("mask_hidden", "mask_hidden"),
        ("", "model."),
    ),
    aux_ids_paths=BOTH_AUX_KEYS,
    aux_convention="output",
    flag_fields=frozenset({"fc_norm", "norm_output"}),
    flag_defaults=flag_defaults("NeMo", raw_residual=True),
)
