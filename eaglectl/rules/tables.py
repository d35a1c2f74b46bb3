"""Embedding and head tables, RoPE encodings, the served path, and eaglectl's own provenance."""

from __future__ import annotations

from . import catalogue as rule
from .base import Context, check


@check
def tables(ctx: Context) -> None:
    spec = ctx.spec
    V, Vd = spec.vocab_size, spec.draft_vocab_size
    if not spec.has_lm_head:
        if V is not None and Vd is not None and Vd < V:
            ctx.emit(rule.LM_HEAD_MISSING, f"draft vocab {Vd} < vocab {V} and no lm_head", "lm_head.weight")
        else:
            ctx.emit(rule.LM_HEAD_BORROWED, "no lm_head.weight", "lm_head.weight")
    if not spec.has_embed_tokens:
        H, Ht = spec.hidden_size, spec.target_hidden_size
        if H is not None and Ht is not None and Ht != H:
            ctx.emit(rule.EMBED_TOKENS_MISSING, f"hidden {H} != target hidden {Ht}", "embed_tokens.weight")
        else:
            ctx.emit(rule.EMBED_TOKENS_SHARED, "no embed_tokens.weight", "embed_tokens.weight")
    if spec.tie_word_embeddings:
        ctx.emit(rule.TIE_WORD_EMBEDDINGS, "tie_word_embeddings is true", ctx.at("tie_word_embeddings"))


@check
def rope(ctx: Context) -> None:
    if ctx.ckpt.config is None:
        return
    root = ctx.drafter.layer_config
    params = root.sub("rope_parameters") if root.dict("rope_parameters") is not None else None
    theta = root.float("rope_theta", lo=1e-9)
    if params is not None:
        p_theta = params.float("rope_theta", lo=1e-9)
        if theta is not None and p_theta is not None and p_theta != theta:
            ctx.emit(rule.ROPE_INCONSISTENT, f"rope_theta {theta:g} vs rope_parameters.rope_theta {p_theta:g}",
                     ctx.at(root.path("rope_theta")))
        scaling = root.sub("rope_scaling") if root.dict("rope_scaling") is not None else None
        ptype = params.str("rope_type") or "default"
        stype = (scaling.str("rope_type") or scaling.str("type") or "default") if scaling is not None else "default"
        if scaling is not None and ptype != stype:
            ctx.emit(rule.ROPE_INCONSISTENT, f"rope_scaling type {stype} vs rope_parameters type {ptype}",
                     ctx.at(root.path("rope_scaling")))
    if ctx.spec.rope_theta is None and ctx.spec.arch != "mla" and not ctx.spec.sources.get("rope_theta", "").startswith(
            "invalid"):
        ctx.emit(rule.ROPE_THETA_MISSING, "no rope_theta: base 10000", ctx.at("rope_theta"))


@check
def method_path(ctx: Context) -> None:
    text = ctx.ckpt.source.lower()
    if "eagle-" in text:  # vLLM tests 'eagle-' before 'eagle3' (speculative.py)
        ctx.emit(rule.METHOD_FROM_PATH, f"'{ctx.ckpt.source}'", ctx.ckpt.source)


@check
def provenance(ctx: Context) -> None:
    prov = ctx.config.sub("eaglectl_provenance")
    if prov.bool("needs_fine_tuning"):
        steps = prov.str_list("upgrade_steps") or ()
        init = prov.str("fc_norm_init")
        ctx.emit(rule.NEEDS_FINE_TUNING,
                 f"{prov.str('tool') or 'eaglectl'} ran upgrade ({', '.join(steps) or 'steps unknown'}"
                 + (f", fc_norm init {init}" if init else "") + ")", ctx.at("eaglectl_provenance.needs_fine_tuning"))
