"""NVIDIA ModelOpt export and the vLLM-native HF layout (`layers.0.*` + `eagle_config`).

`LlamaForCausalLMEagle3` (or `Eagle3DeepseekV2ForCausalLM` for MLA), `eagle_config` with
ModelOpt's own keys (`next_layer_regular`, `use_mtp_layernorm`, `parallel_draft_step`), no `t2d`,
no `embed_tokens`, `d2t` in frequency order (not monotone). The aux-id convention depends on how
the training data was generated (HF hooks: output-of-layer; vLLM dumps: boundary), so it is
reported as unverifiable unless measured (docs/hazards.md#aux-ids).
"""

from ._base import BOTH_AUX_KEYS, BOTH_NUMBERINGS, FLAGS, Dialect, Signal, Writer, architectures, flag_defaults

DIALECT = Dialect(
    name="modelopt",
    title="ModelOpt / vLLM-native",
    producers="NVIDIA Model-Optimizer `export_hf_checkpoint`, hand-made vLLM-native drafts",
    required=(Signal("tensor-prefix", "layers.0.", weight=1),),
    supporting=(
        Signal("config-key", "eagle_config.use_mtp_layernorm"),
        Signal("config-key", "eagle_config.parallel_draft_step"),
        Signal("config-key", "eagle_config"),
        *architectures("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3DeepseekV2ForCausalLM",
                       "Eagle3Qwen3ForCausalLM", weight=0.5),
    ),
    forbidden=(Signal("tensor-prefix", "model."), Signal("tensor-prefix", "midlayer.")),
    markers=(Signal("config-key", "eagle_config.next_layer_regular"),),
    aux_ids_paths=BOTH_AUX_KEYS,
    aux_convention="output",
    aux_convention_note=(
        "ModelOpt ids are output-of-layer when the training data came from HF hooks and boundary when it "
        "came from a vLLM dump; the files do not say which"
    ),
    writer=Writer(
        architectures={"llama": "LlamaForCausalLMEagle3", "qwen3": "Eagle3Qwen3ForCausalLM",
                       "mla": "Eagle3DeepseekV2ForCausalLM"},
        # vLLM's key at the top level in vLLM's numbering (Model Runner V2, the GPU default, never reads
        # eagle_config's ids: docs/engines.md#runners), and ModelOpt's own field in ModelOpt's numbering: its
        # HF EAGLE module hooks the output of decoder layer k for id k (`register_forward_hook` on
        # `layers[k]`; default ids (1, L//2-1, L-4)), one layer later than vLLM reads the same number
        # (docs/convert.md#aux-ids). The provenance records each field's numbering.
        aux_ids_paths=BOTH_AUX_KEYS,
        aux_convention="boundary",
        aux_conventions=BOTH_NUMBERINGS,
        flag_paths={"norm_before_residual": ("norm_before_residual",),
                    "norm_before_fc": ("norm_before_fc", "eagle_config.norm_before_fc"),  # both places (docs/hazards.md#flags)
                    "fc_norm": ("fc_norm",), "norm_output": ("norm_output",)},
        extra_config={"eagle_config.use_aux_hidden_state": True, "eagle_config.use_input_layernorm_in_first_layer": True,
                      "eagle_config.use_last_layernorm": True, "eagle_config.use_mtp_layernorm": False,
                      "eagle_config.next_layer_regular": True, "eagle_config.parallel_draft_step": 1,
                      "eagle_config.parallel_draft_heads_num_layers": 1},
        t2d=False,  # the ModelOpt allow-list has no t2d (vLLM ignores it anyway)
        # ModelOpt 0.47.0's exporter checks the drafter's keys against an allow-list without fc_norm
        # (modelopt/torch/export/plugins/hf_spec_export.py, EagleExporter._check_valid_sd) and ModelOpt has no
        # loader of exported drafters; vLLM reads the weights (docs/engines.md#clients)
        warnings=(({"fc_norm": True}, "ModelOpt 0.47.0 has no fc_norm: its exporter's key check raises 'Unexpected "
                   "key: fc_norm.0.weight' on these files (vLLM serves them; ModelOpt tools do not take them)"),),
    ),
    owned_config_keys=("eagle_config",),
    d2t_order="frequency",
    # `eagle_export_rope_scaling`: ModelOpt writes this into the exported config even when training used
    # default RoPE (docs/hazards.md#rope)
    exported_rope_scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 2048},
    flag_fields=frozenset(FLAGS),
    flag_defaults=flag_defaults("vLLM", norm_before_residual="vLLM default for HF-style configs"),
)
