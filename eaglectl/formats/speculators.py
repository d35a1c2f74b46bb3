"""vLLM speculators format (`Eagle3Speculator`, served by vLLM without a target argument).

No top-level `model_type`, a `speculators_config`, the decoder config in
`transformer_layer_config`, `layers.N.*` keys, top-level flags and boundary-convention aux ids.
vLLM's reader treats a missing `norm_before_residual` as **True** (the speculators class default
is False), so that default is the one recorded here (docs/hazards.md#flags).
"""

from ._base import FLAGS, Dialect, Signal, Writer, flag_defaults

_MARKER = Signal("config-key", "speculators_config", weight=3)

DIALECT = Dialect(
    name="speculators",
    title="vLLM speculators",
    producers="vllm-project/speculators training and `speculators convert`",
    required=(_MARKER,),
    supporting=(
        Signal("config-value", "speculators_model_type", "eagle3"),
        Signal("config-key", "transformer_layer_config"),
        Signal("tensor-prefix", "layers.", weight=0.5),
    ),
    forbidden=(Signal("config-key", "model_type"),),  # vLLM's speculators-format test
    markers=(_MARKER,),
    owned_config_keys=("speculators_config", "speculators_model_type", "speculators_version",
                       "transformer_layer_config", "auto_map", "has_no_defaults_at_init"),
    layer_config_path="transformer_layer_config",
    aux_ids_paths=("eagle_aux_hidden_state_layer_ids",),
    aux_convention="boundary",
    flag_fields=frozenset(FLAGS),
    flag_defaults=flag_defaults("vLLM") | {
        "norm_before_residual": (True, "vLLM's speculators reader assumes True when absent")},
    writer=Writer(
        architectures={"llama": "Eagle3Speculator", "qwen3": "Eagle3Speculator"},
        aux_ids_paths=("eagle_aux_hidden_state_layer_ids",),
        flag_paths={f: (f,) for f in FLAGS},
        # speculators 0.9.0's PEagleSpeculatorConfig; vLLM reads it with its own reader (engines/facts.py
        # SPECULATORS_READERS: the mask token at the top level, the 3.1 flags only inside transformer_layer_config)
        family_forms={"peagle": ("peagle", "PEagleSpeculator")},
        ranks={"mask_hidden": 3},
    ),
    config_style="speculators",
    notes=("norm_before_fc together with fc_norm is rejected by speculators",),
)
