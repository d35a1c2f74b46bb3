"""SpecForge (sgl-project) training exports and sglang serving layout, EAGLE-3 and 3.1.

`midlayer.*` keys, `LlamaForCausalLMEagle3`, aux ids in `eagle_config` in the output-of-layer
convention, top-level `fc_norm` / `norm_output` (PR #568), `d2t`/`t2d` always present. No
`norm_before_fc` and no `norm_before_residual` (raw residual). `norm_output` changed meaning at
PR #879 (2026-09-15): absent means False from then on; before it, absent meant True with plain
EAGLE-3 feedback — `inspect` warns on 3.1 checkpoints (docs/hazards.md#norm-output-window).
"""

from ._base import VLLM_AUX_KEY, Caveat, Dialect, Signal, Writer

_EC_IDS = "eagle_config.eagle_aux_hidden_state_layer_ids"

DIALECT = Dialect(
    name="specforge",
    title="SpecForge / sglang",
    producers="sgl-project/SpecForge `specforge export`, sglang drafts",
    required=(Signal("tensor-prefix", "midlayer.", weight=2),),
    supporting=(
        Signal("config-value", "architectures", "LlamaForCausalLMEagle3"),
        Signal("config-key", "eagle_config.eagle_aux_hidden_state_layer_ids", weight=2),
        Signal("config-key", "fc_norm", weight=0.5),
    ),
    key_rules=(("layers.0.", "midlayer."),),
    # SpecForge writes its ids in eagle_config only; the top-level key is vLLM's, added for vLLM (by eaglectl
    # or by hand), and read first, as vLLM reads it
    aux_ids_paths=(VLLM_AUX_KEY, _EC_IDS),
    aux_convention="output",
    aux_path_conventions={VLLM_AUX_KEY: ("boundary", "vLLM's own key (SpecForge never writes it): vLLM's numbering")},
    flag_fields=frozenset({"fc_norm", "norm_output"}),
    flag_defaults={
        "norm_before_residual": (False, "SpecForge has no such option: raw residual"),
        "norm_before_fc": (False, "SpecForge has no input_norm"),
        "fc_norm": (False, "SpecForge default"),
        "norm_output": (False, "SpecForge default since PR #879 (True in the #568..#879 window)"),
    },
    owned_config_keys=("eagle_config",),
    caveats=(Caveat("specforge-norm-output-window", {"fc_norm": True}, "norm_output",
                    "its meaning depends on the SpecForge commit that trained it"),),
    consumer="sglang",
    writer=Writer(
        architectures={"llama": "LlamaForCausalLMEagle3"},
        # vLLM's key in vLLM's numbering (both runners read it; V2 never reads eagle_config's ids), and
        # SpecForge's own field in its numbering (sglang and SpecForge read it as output-of-layer ids)
        aux_ids_paths=(VLLM_AUX_KEY, _EC_IDS),
        aux_conventions={VLLM_AUX_KEY: "boundary", _EC_IDS: "output"},
        flag_paths={"fc_norm": ("fc_norm",), "norm_output": ("norm_output",)},
        explicit_false=("norm_before_residual", "norm_before_fc"),
        max_layers=1,
        exactly_3_aux=True,
        allowed_tensors=(r"(?!input_norm).*",),
    ),
    notes=("one decoder layer only", "exactly 3 aux ids"),
)
