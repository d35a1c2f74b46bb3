"""vLLM speculators format (`Eagle3Speculator`, served by vLLM without a target argument).

No top-level `model_type`, a `speculators_config`, the decoder config in
`transformer_layer_config`, `layers.N.*` keys, top-level flags and boundary-convention aux ids.
vLLM's reader treats a missing `norm_before_residual` as **True** (the speculators class default
is False), so that default is the one recorded here (docs/hazards.md#flags); a P-EAGLE config
(`speculators_model_type: peagle`) has a reader of its own, whose defaults apply to it
(`SPECULATORS_READERS`, the one table of how vLLM reads each type).
"""

from dataclasses import dataclass, field
from typing import Any

from ._base import FLAGS, Dialect, Signal, Writer


@dataclass(frozen=True)
class SpeculatorsReader:
    """How vLLM's speculators reader builds the config of one `speculators_model_type`
    (transformers_utils/configs/speculators/algos.py): transformer_layer_config, then the `copied` keys taken from
    the top level over it (their defaults when absent: a key not listed keeps transformer_layer_config's value), the
    architecture by its model_type, and the `renamed` top-level keys, which vLLM requires (KeyError when absent)."""

    copied: dict[str, Any]
    archs: dict[str, str]  # transformer_layer_config's model_type (default llama) -> the architecture it sets
    renamed: dict[str, str] = field(default_factory=dict)
    until: str | None = None  # the first vLLM release whose reader refuses this type (X.Y), with `refusal`
    refusal: str = ""


SPECULATORS_READERS: dict[str, SpeculatorsReader] = {
    "eagle3": SpeculatorsReader(
        {"draft_vocab_size": None, "norm_before_residual": True, "norm_before_fc": False, "fc_norm": False,
         "norm_output": False},
        {"qwen3": "Eagle3Qwen3ForCausalLM", "llama": "Eagle3LlamaForCausalLM"}),
    # P-EAGLE (update_peagle): norm_before_residual defaults to false, and the EAGLE-3.1 flags are not copied: only
    # an fc_norm / norm_output inside transformer_layer_config reaches the draft model
    "peagle": SpeculatorsReader(
        {"draft_vocab_size": None, "norm_before_residual": False, "norm_before_fc": False},
        {"qwen3": "PeagleQwen3ForCausalLM", "llama": "PeagleLlamaForCausalLM"},
        {"mask_token_id": "pard_token"}, until="0.34",
        # vLLM 0.34.0 transformers_utils/configs/speculators/algos.py update_peagle (and speculators/base.py)
        refusal="P-EAGLE (parallel drafting EAGLE-3) is not supported."),
}


def _defaults(kind: str) -> dict[str, tuple[bool, str]]:
    """A flag absent from a config of this type, as vLLM's reader of it fills it in."""
    reader = SPECULATORS_READERS[kind]
    who = f"vLLM's speculators {kind} reader"
    return {f: (bool(reader.copied[f]), f"{who} assumes {bool(reader.copied[f])} when absent") if f in reader.copied
            else (False, f"{who} reads it only inside transformer_layer_config") for f in FLAGS}


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
    flag_defaults=_defaults("eagle3"),
    flag_defaults_when=tuple(((Signal("config-value", "speculators_model_type", kind),), _defaults(kind))
                             for kind in SPECULATORS_READERS if kind != "eagle3"),
    writer=Writer(
        architectures={"llama": "Eagle3Speculator", "qwen3": "Eagle3Speculator"},
        aux_ids_paths=("eagle_aux_hidden_state_layer_ids",),
        flag_paths={f: (f,) for f in FLAGS},
        # speculators 0.9.0's PEagleSpeculatorConfig; vLLM reads it with its own reader (SPECULATORS_READERS above:
        # the mask token at the top level, the 3.1 flags only inside transformer_layer_config)
        family_forms={"peagle": ("peagle", "PEagleSpeculator")},
        ranks={"mask_hidden": 3},
    ),
    config_style="speculators",
    notes=("norm_before_fc together with fc_norm is rejected by speculators",),
)
