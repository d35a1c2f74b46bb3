"""Drafter families that are not EAGLE-3, declared as data: what the files show, who serves them, why
eaglectl refuses them.

EAGLE-3 / 3.1 is one drafter layer fed fused target states and its own state. These families draft
differently, so no EAGLE-3 dialect can hold them and eaglectl's reference drafter cannot run them.
Detection runs before the dialect registry (formats.detect): an EAGLE-4 checkpoint has `layers.0.*`
keys and would otherwise be read as ModelOpt, an MTP head's `model.` prefix as NeMo. A family matches
when the weights of its signals that hold reach `threshold`. Public sources: vLLM's model registry
(architecture names), z-lab / ModelOpt DFlash exports (`dflash_config`), eagle-harness 0.1.3's config
keys (names only: its code is source-available, not OSI, and none of it is copied), vLLM's MedusaConfig.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._base import Probe, Signal
from ._base import architectures as _archs


@dataclass(frozen=True)
class Family:
    name: str
    signals: tuple[Signal, ...]
    served_by: str
    why: str
    threshold: float = 1.0

    def evidence(self, probe: Probe) -> tuple[str, ...] | None:
        held = [s for s in self.signals if s.holds(probe)]
        return tuple(s.describe() for s in held) if sum(s.weight for s in held) >= self.threshold else None


# vLLM 0.32's registered MTP architectures (model_executor/models/registry.py), and other MTP markers
_MTP_ARCHS = ("DeepSeekMTPModel", "DeepseekV32MTPModel", "DeepSeekV4MTPModel", "EagleDeepSeekMTPModel", "MiMoMTPModel",
              "MiMoV2MTPModel", "Glm4MoeMTPModel", "Glm4MoeLiteMTPModel", "Glm5NextMTPModel", "ErnieMTPModel",
              "LongCatFlashMTPModel", "NemotronHMTPModel", "OpenPanguMTPModel", "Qwen3NextMTP", "Qwen3_5MTP",
              "Qwen3_5MoeMTP", "Step3p5MTP", "Step5MTP", "KimiK3MTPModel", "MiniMaxM3MTP", "Gemma4MTPModel",
              "BailingMoeV25MTPModel", "BailingMoeV3MTPModel", "HYV3MTPModel", "HYV4MTPModel", "ExaoneMoeMTP",
              "TransformersForMTP", "ParseAuxMTPModel")

FAMILIES: tuple[Family, ...] = (
    Family(
        "EAGLE-4",
        (*_archs("LlamaForCausalLMEagle4"),
         Signal("config-key", "efficient_lm_head_config", weight=1.0),
         Signal("config-key", "attn_norm", weight=0.5), Signal("config-key", "use_rope", weight=0.5),
         Signal("config-key", "enable_post_mlp_norm", weight=0.5), Signal("config-key", "input_fuse_type", weight=0.5),
         Signal("config-key", "enable_fc_norm", weight=0.5),
         Signal("config-key", "share_draft_embedding_from_target", weight=0.5),
         Signal("config-key", "moe_architecture", weight=0.5)),
        "eagle-harness (source-available licence, not OSI; SGLang --speculative-algorithm EAGLE_HARNESS, and vLLM "
        "/ TokenSpeed through the harness)",
        "its drafter layer (attention norm, optional RoPE, post-MLP norm, MoE, a low-rank candidate head) has no "
        "EAGLE-3 equivalent: every EAGLE-3 dialect and the reference drafter would drop part of it",
    ),
    Family(
        "DFlash",
        (*_archs("DFlashDraftModel", "DFlash2DraftModel", "DFlashLagunaForCausalLM", "Qwen3XPressModel",
                 "DFlash2BeamDraftModel"),
         Signal("config-key", "dflash_config"), Signal("config-value", "speculators_model_type", "dflash"),
         Signal("config-value", "speculators_model_type", "dflash2"),
         Signal("config-value", "speculators_model_type", "xpress")),
        "vLLM (method dflash), sglang / SpecForge",
        "a block-parallel drafter (a whole block of tokens per pass from several target layers), not the EAGLE-3 "
        "chain of one layer fed its own state",
    ),
    Family(
        "DSpark",
        (*_archs("DSparkDraftModel", "DSparkV41DraftModel", "Qwen3DSparkModel", "Qwen3OmniDSparkModel",
                 "K3DSparkModel", "Gemma4DSparkModel", "MuseSparkDSparkModel"),
         Signal("config-key", "dspark_target_layer_ids"), Signal("config-value", "speculators_model_type", "dspark")),
        "vLLM (method dspark), SpecForge",
        "a block-parallel drafter with a Markov head over target layers (dspark_target_layer_ids), not EAGLE-3",
    ),
    Family(
        "MTP head",
        (*_archs(*_MTP_ARCHS), Signal("config-value", "speculators_model_type", "mtp"),
         Signal("tensor-contains", ".eh_proj.", weight=0.5), Signal("tensor-contains", ".enorm.", weight=0.5),
         Signal("tensor-contains", ".hnorm.", weight=0.5), Signal("tensor-prefix", "mtp.", weight=0.5),
         Signal("tensor-contains", "pre_fc_norm_embedding", weight=0.5)),
        "vLLM (method mtp, with the target's own MTP module), sglang",
        "a multi-token-prediction head of the target (embedding and hidden-state projections eh_proj / enorm / "
        "hnorm), not an EAGLE-3 drafter over fused aux states",
    ),
    Family(
        "Medusa",
        (*_archs("MedusaModel"), Signal("config-value", "model_type", "medusa"),
         Signal("config-key", "medusa_num_heads"), Signal("tensor-prefix", "medusa_head.", weight=0.5),
         Signal("tensor-prefix", "lm_heads.", weight=0.5), Signal("tensor-prefix", "blocks.", weight=0.5)),
        "vLLM <= 0.32 (method medusa; removed in 0.33), TensorRT-LLM",
        "independent heads on the target's last hidden state: no drafter layer, no aux states, no EAGLE feedback",
    ),
)


def identify(probe: Probe) -> tuple[Family, tuple[str, ...]] | None:
    """The non-EAGLE-3 family these files belong to, with the evidence; None for anything else."""
    for family in FAMILIES:
        evidence = family.evidence(probe)
        if evidence is not None:
            return family, evidence
    return None
