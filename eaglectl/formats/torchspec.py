"""TorchSpec (lightseekorg) `convert_to_hf` exports, the origin of EAGLE-3.1 (PR #97).

Marked by `_torchspec_version` in the config and `torchspec_version` in the safetensors metadata
(which lacks `format`). `midlayer.*` natively, `layers.0.*` with `--vllm`; aux ids in
`eagle_config`, output-of-layer, except `--vllm` exports of `kimi_k2` drafters, whose ids were
shifted +1 to vLLM's boundary convention (docs/hazards.md#dialects, TorchSpec commit ec1eeab2).
"""

from ._base import BOTH_AUX_KEYS, BOTH_NUMBERINGS, MIDLAYER_KEYS, Dialect, Signal, Writer, flag_defaults

_MARKERS = (Signal("config-key", "_torchspec_version", weight=3), Signal("metadata-key", "torchspec_version", weight=3))

# ModelOpt's eagle_config keys, which TorchSpec's draft-model templates (configs/draft_models/*.json, the Kimi ones too)
# carry and SpecForge never writes: with TorchSpec's native `midlayer.*` names (ModelOpt's are `layers.0.*`), a
# checkpoint trained from a template without a marker is TorchSpec's
TEMPLATE = Signal("config-key", "eagle_config.use_input_layernorm_in_first_layer")

DIALECT = Dialect(
    name="torchspec",
    title="TorchSpec",
    producers="lightseekorg/TorchSpec `tools/convert_to_hf.py`",
    required=(),
    required_any=(*_MARKERS, TEMPLATE),
    # the eagle_config keys TorchSpec's configs (its Kimi template too) carry and SpecForge's do not
    supporting=(Signal("config-key", "eagle_config.use_aux_hidden_state"),),
    markers=_MARKERS,
    owned_config_keys=("_torchspec_version", "eagle_config"),
    consumer="sglang",
    key_rules=MIDLAYER_KEYS,
    aux_ids_paths=BOTH_AUX_KEYS,
    aux_convention="output",
    aux_convention_when=(
        (
            (Signal("tensor-prefix", "layers.0."), Signal("config-value", "model_type", "kimi_k2")),
            "boundary",
            "TorchSpec --vllm export of a kimi_k2 drafter shifts ids +1",
        ),
    ),
    writer=Writer(
        architectures={"llama": "LlamaForCausalLMEagle3", "mla": "Eagle3DeepseekV2ForCausalLM"},
        # vLLM's key in vLLM's numbering, and TorchSpec's own field in its post-layer numbering
        aux_ids_paths=BOTH_AUX_KEYS,
        aux_conventions=BOTH_NUMBERINGS,
        flag_paths={"fc_norm": ("fc_norm",), "norm_output": ("norm_output",)},
        explicit_false=("norm_before_residual", "norm_before_fc"),
        extra_config={"eagle_config.use_aux_hidden_state": True, "_torchspec_version": "eaglectl"},
        max_layers=1,
        allowed_tensors=(r"(?!input_norm).*",),
    ),
    flag_fields=frozenset({"fc_norm", "norm_output"}),
    flag_defaults=flag_defaults("TorchSpec", raw_residual=True),
)
