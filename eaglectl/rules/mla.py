"""MLA drafters (Kimi-K2 / DeepSeek style): what vLLM 0.32's `Eagle3DeepseekV2ForCausalLM` can load and
the facts about them the files cannot settle (docs/math.md#mla)."""

from __future__ import annotations

from . import catalogue as rule
from .base import Context, check

HEAD_SIZES = (320, 512, 576)  # kv_lora_rank + qk_rope_head_dim vLLM 0.32's MLA backends accept (CPU_MLA: 576);
# mla-head-size's title in catalogue.toml names them


# Kimi-K2 has 61 layers: every engine's default (2, L//2, L-3) boundary ids, and the same layers in
# output-of-layer numbering. Published drafters carry either; only the weights can tell.
KIMI_LAYERS = 61
KIMI_IDS = {(2, 30, 58): "boundary", (1, 29, 57): "output"}


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
    decided = ctx.measured is not None and ctx.measured.boundary_ids is not None
    target_layers = ctx.target.num_layers if ctx.target is not None else None
    if ids is not None and tuple(ids) in KIMI_IDS and not decided and target_layers in (None, KIMI_LAYERS):
        meant = KIMI_IDS[tuple(ids)]
        other = [i + (1 if meant == "output" else -1) for i in ids]
        ctx.emit(rule.KIMI_AUX_IDS_AMBIGUOUS, f"aux ids {list(ids)} are Kimi-K2's default layers in {meant} numbering, "
                 f"or, if the trainer counted the other way, boundaries {other if meant == 'boundary' else list(ids)}; "
                 f"read here as {spec.aux_convention} ids (vLLM boundaries {list(spec.aux_layer_ids_vllm or ())})",
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
