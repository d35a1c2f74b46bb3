"""NVIDIA ModelOpt export and the vLLM-native HF layout (`layers.0.*` + `eagle_config`).

`LlamaForCausalLMEagle3` (or `Eagle3DeepseekV2ForCausalLM` for MLA), `eagle_config` with
ModelOpt's own keys (`next_layer_regular`, `use_mtp_layernorm`, `parallel_draft_step`), no `t2d`,
no `embed_tokens`, `d2t` in frequency order (not monotone). The aux-id convention depends on how
the training data was generated (HF hooks: output-of-layer; vLLM dumps: boundary), so it is
reported as unverifiable (formats.md §5.5, H13, H21).
"""

from ._base import Dialect, Signal

DIALECT = Dialect(
    name="modelopt",
    title="ModelOpt / vLLM-native",
    producers="NVIDIA Model-Optimizer `export_hf_checkpoint`, hand-made vLLM-native drafts",
    required=(Signal("tensor-prefix", "layers.0.", weight=1),),
    supporting=(
        Signal("config-key", "eagle_config.next_layer_regular"),
        Signal("config-key", "eagle_config.use_mtp_layernorm"),
        Signal("config-key", "eagle_config.parallel_draft_step"),
        Signal("config-key", "eagle_config"),
        Signal("config-value", "architectures", "LlamaForCausalLMEagle3", weight=0.5),
        Signal("config-value", "architectures", "Eagle3LlamaForCausalLM", weight=0.5),
        Signal("config-value", "architectures", "Eagle3DeepseekV2ForCausalLM", weight=0.5),
        Signal("config-value", "architectures", "Eagle3Qwen3ForCausalLM", weight=0.5),
    ),
    forbidden=(
        Signal("config-key", "speculators_config"),
        Signal("config-key", "_torchspec_version"),
        Signal("metadata-key", "torchspec_version"),
        Signal("tensor-prefix", "model."),
        Signal("tensor-prefix", "midlayer."),
    ),
    aux_ids_paths=("eagle_aux_hidden_state_layer_ids", "eagle_config.eagle_aux_hidden_state_layer_ids"),
    aux_convention="output",
    aux_convention_note=(
        "ModelOpt ids are output-of-layer when the training data came from HF hooks and boundary when it "
        "came from a vLLM dump; the files do not say which"
    ),
    flag_fields=frozenset({"norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"}),
    flag_defaults={
        "norm_before_residual": (False, "vLLM default for HF-style configs"),
        "norm_before_fc": (False, "vLLM default"),
        "fc_norm": (False, "vLLM default"),
        "norm_output": (False, "vLLM default"),
    },
)
