"""MLA drafters (Kimi / DeepSeek style): what vLLM 0.32's `Eagle3DeepseekV2ForCausalLM` can load and
the facts about them the files cannot settle (docs/math.md#mla)."""

from __future__ import annotations

from dataclasses import dataclass

from . import catalogue as rule
from .base import Context, check

HEAD_SIZES = (320, 512, 576)  # kv_lora_rank + qk_rope_head_dim vLLM 0.32's MLA backends accept (CPU_MLA: 576);
# mla-head-size's title in catalogue.toml names them


@dataclass(frozen=True)
class KimiDefault:
    """A Kimi target's default aux layers (every engine's (2, L//2, L-3) boundaries) in the two numberings
    published drafters of it carry; only the weights can tell which one a drafter was trained on."""

    target: str
    boundary: tuple[int, ...]
    output: tuple[int, ...]  # the same layers, output-of-layer numbering (one lower)
    seen: str  # which published configs write which numbering


# Keyed by the target's depth (num_hidden_layers).
KIMI_DEFAULTS: dict[int, KimiDefault] = {
    61: KimiDefault("Kimi-K2", (2, 30, 58), (1, 29, 57),
                    "boundary: k-l-lambda's Kimi-K2.5 drafter, Baseten's Megatron EAGLE-3.1 MLA recipe; output: "
                    "the card of lightseekorg's K2.7 coder 3.1 drafter (layers 1, 29, 57)"),
    93: KimiDefault("Kimi-K3", (2, 46, 90), (1, 45, 89),
                    "boundary: lightseekorg's K3 EAGLE-3.1 MLA drafter (per sglang's test of it); output: TorchSpec's "
                    "K3 EAGLE-3 config"),
}


def kimi_numbering(ids: tuple[int, ...], target_layers: int | None) -> tuple[int, KimiDefault, str] | None:
    """(the depth, its Kimi default, the numbering) that `ids` write, for a target of `target_layers` (None: a
    target of any depth in the table)."""
    for layers, d in KIMI_DEFAULTS.items():
        if target_layers in (None, layers):
            for numbering in ("boundary", "output"):
                if ids == getattr(d, numbering):
                    return layers, d, numbering
    return None


@check
def mla(ctx: Context) -> None:
    spec = ctx.spec
    if spec.arch != "mla" or ctx.ckpt.config is None:
        return
    dims = spec.mla or {}
    if spec.sources.get("q_lora_rank", "").startswith("config: q_lora_rank null"):
        ctx.emit(rule.MLA_Q_LORA_NULL, "q_lora_rank is null: vLLM 0.32 cannot load the drafter", ctx.at("q_lora_rank"))
    kv, rope = dims.get("kv_lora_rank"), dims.get("qk_rope_head_dim")
    if kv is not None and rope is not None and kv + rope not in HEAD_SIZES:
        ctx.emit(rule.MLA_HEAD_SIZE,
                 f"kv_lora_rank {kv} + qk_rope_head_dim {rope} = {kv + rope}", ctx.at("kv_lora_rank"))
    ids = spec.aux_layer_ids
    # a measured reading (rules/measured.py) settles which layers the weights were trained on
    decided = ctx.measured is not None and ctx.measured.boundary_ids is not None
    # or recorded by the conversion that wrote these ids, measured or as the user said (never the table's guess)
    decided = decided or ctx.config.str("eaglectl_provenance.aux_numbering") in ("measured", "given")
    target_layers = ctx.target.num_layers if ctx.target is not None else None
    found = kimi_numbering(tuple(ids), target_layers) if ids is not None and not decided else None
    if found is not None:
        layers, d, numbering = found
        ctx.emit(rule.KIMI_AUX_IDS_AMBIGUOUS,
                 f"aux ids {list(ids)} name different layers in the two numberings: boundaries {list(ids)} read as "
                 f"boundary ids, boundaries {[i + 1 for i in ids]} read as output-of-layer ids; {d.target}'s default "
                 f"(boundaries {list(d.boundary)} of a {layers}-layer target) is the {numbering} reading, and "
                 f"published drafters write both ({d.seen}); eaglectl reads them as {spec.aux_convention} ids "
                 f"(vLLM boundaries {list(spec.aux_layer_ids_vllm or ())}); what decides it is the target's "
                 "weights (measured with a runnable --target) or the trainer's record",
                 ctx.at(spec.sources.get("aux_layer_ids", "").removeprefix("config: ")))


@check
def exported_rope(ctx: Context) -> None:
    spec = ctx.spec
    exported = ctx.dialect.exported_rope_scaling
    scaling = spec.rope_scaling or {}
    if exported and all(scaling.get(k, scaling.get("type") if k == "rope_type" else None) == v
                        for k, v in exported.items()):
        ctx.emit(rule.EXPORTED_ROPE_SCALING,
                 f"rope_scaling {dict(exported)} is what {ctx.dialect.title} writes at export "
                 "when asked to (eagle_export_rope_scaling), also for drafters trained with default RoPE; verify and "
                 "smoke run it as exported, which is what vLLM serves", ctx.at(spec.sources.get(
                     "rope_scaling", "rope_scaling").removeprefix("config: ")))
