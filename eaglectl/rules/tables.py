"""Embedding and head tables, RoPE encodings, the served path, and eaglectl's own provenance."""

from __future__ import annotations

from . import ERROR, INFO, WARNING, Context, check, rule

LM_HEAD_MISSING = rule("lm-head-missing", ERROR, "No lm_head with a reduced vocab: vLLM substitutes the target's full "
                       "head", "{convert_t} (takes the target's rows at the mapped ids)",
                       repaired_by_convert=True)
LM_HEAD_BORROWED = rule("lm-head-borrowed", WARNING, "No lm_head: vLLM borrows the target head, sglang starts a random one",
                        "{convert_t} (materialises it)", repaired_by_convert=True)
EMBED_TOKENS_MISSING = rule("embed-tokens-missing", ERROR, "No embed_tokens and target_hidden_size != hidden_size: vLLM "
                            "cannot share the target's", "export the drafter's embed_tokens", repaired_by_convert=True)
EMBED_TOKENS_SHARED = rule("embed-tokens-shared", INFO, "No embed_tokens: engines share the target's embedding", None)
TIE_WORD_EMBEDDINGS = rule("tie-word-embeddings", WARNING, "tie_word_embeddings is true: sglang ties lm_head to "
                           "embed_tokens, vLLM ignores it", "{convert} (sets tie_word_embeddings: false)",
                           repaired_by_convert=True, engine="sglang")
ROPE_INCONSISTENT = rule("rope-inconsistent", ERROR, "rope_theta / rope_scaling disagree with rope_parameters",
                         "write both encodings with the values the drafter was trained with")
ROPE_THETA_MISSING = rule("rope-theta-missing", INFO, "No rope_theta: engines use base 10000 (right if the drafter was "
                          "trained so)", None)
METHOD_FROM_PATH = rule("method-from-path", WARNING, "The path contains 'eagle-': vLLM without an explicit method runs "
                        "it as EAGLE-1 (checked before 'eagle3')",
                        "always pass method: eagle3 (as the printed speculative config does)", engine="vllm")
NEEDS_FINE_TUNING = rule("needs-fine-tuning", WARNING, "eaglectl upgraded this drafter structurally; it has not been "
                         "trained with its new EAGLE-3.1 features", "fine-tune it (training-time test) before publishing "
                         "it as a 3.1 drafter, or publish the source drafter")


@check
def tables(ctx: Context) -> None:
    spec = ctx.spec
    V, Vd = spec.vocab_size, spec.draft_vocab_size
    if not spec.has_lm_head:
        if V is not None and Vd is not None and Vd < V:
            ctx.emit(LM_HEAD_MISSING, f"draft vocab {Vd} < vocab {V} and no lm_head", "lm_head.weight")
        else:
            ctx.emit(LM_HEAD_BORROWED, "no lm_head.weight", "lm_head.weight")
    if not spec.has_embed_tokens:
        H, Ht = spec.hidden_size, spec.target_hidden_size
        if H is not None and Ht is not None and H != Ht:
            ctx.emit(EMBED_TOKENS_MISSING, f"hidden {H} != target hidden {Ht}", "embed_tokens.weight")
        else:
            ctx.emit(EMBED_TOKENS_SHARED, "no embed_tokens.weight", "embed_tokens.weight")
    if spec.tie_word_embeddings:
        ctx.emit(TIE_WORD_EMBEDDINGS, "tie_word_embeddings is true", ctx.at("tie_word_embeddings"))


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
            ctx.emit(ROPE_INCONSISTENT, f"rope_theta {theta:g} vs rope_parameters.rope_theta {p_theta:g}",
                     ctx.at(root.path("rope_theta")))
        scaling = root.sub("rope_scaling") if root.dict("rope_scaling") is not None else None
        ptype = params.str("rope_type") or "default"
        stype = (scaling.str("rope_type") or scaling.str("type") or "default") if scaling is not None else "default"
        if scaling is not None and ptype != stype:
            ctx.emit(ROPE_INCONSISTENT, f"rope_scaling type {stype} vs rope_parameters type {ptype}",
                     ctx.at(root.path("rope_scaling")))
    if ctx.spec.rope_theta is None and ctx.spec.arch != "mla" and not ctx.spec.sources.get("rope_theta", "").startswith(
            "invalid"):
        ctx.emit(ROPE_THETA_MISSING, "no rope_theta: base 10000", ctx.at("rope_theta"))


@check
def method_path(ctx: Context) -> None:
    text = ctx.ckpt.source.lower()
    if "eagle-" in text:  # vLLM tests 'eagle-' before 'eagle3' (speculative.py)
        ctx.emit(METHOD_FROM_PATH, f"'{ctx.ckpt.source}'", ctx.ckpt.source)


@check
def provenance(ctx: Context) -> None:
    prov = ctx.config.sub("eaglectl_provenance")
    if prov.bool("needs_fine_tuning"):
        steps = prov.str_list("upgrade_steps") or ()
        init = prov.str("fc_norm_init")
        ctx.emit(NEEDS_FINE_TUNING, f"{prov.str('tool') or 'eaglectl'} ran upgrade ({', '.join(steps) or 'steps unknown'}"
                 + (f", fc_norm init {init}" if init else "") + ")", ctx.at("eaglectl_provenance.needs_fine_tuning"))
