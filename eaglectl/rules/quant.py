"""Quantised drafters (ModelOpt FP8 / NVFP4): vLLM's loading rules for the config and the scales
(docs/inspect.md#quantised-drafters; the layout and vLLM's matching are in io/quant.py)."""

from __future__ import annotations

from ..io.quant import SCHEMES, QuantLayout, dialect_names, excluded, layout_of, matches_any, vllm_module, vllm_modules
from . import ERROR, INFO, WARNING, Context, check, rule

QUANTIZED = rule("quantized", INFO, "A quantised drafter: its scheme, what is quantised and what vLLM leaves "
                 "unquantised; the reference dequantises it (weight x scale)", None)
QUANT_CONFIG_MISSING = rule("quant-config-missing", ERROR, "Scale tensors but no quantization_config (config.json) "
                            "or hf_quant_config.json: vLLM loads the drafter unquantised and fails on the scales",
                            "add the quantization_config the drafter was exported with (quant_method, quant_algo, "
                            "ignore)")
QUANT_METHOD_MISSING = rule("quant-method-missing", ERROR, "quantization_config has no quant_method: vLLM cannot "
                            "tell how the drafter is quantised", "set quant_method (modelopt for FP8, modelopt_fp4 "
                            "for NVFP4)")
QUANT_UNSUPPORTED = rule("quant-unsupported", WARNING, "A quantisation scheme eaglectl does not check or dequantise "
                         "(ModelOpt FP8 and NVFP4 only)", "check the drafter with its producer's tools; verify and "
                         "smoke --engine reference cannot run it")
QUANT_EXCLUDE_IGNORED = rule("quant-exclude-modules-ignored", ERROR, "quantization_config lists exclude_modules but "
                             "no ignore: vLLM reads only ignore there, so it quantises every layer",
                             "name the exclusions under ignore (vLLM's module names, e.g. lm_head, *fc, *self_attn*)")
QUANT_MODULE_MISMATCH = rule("quant-module-mismatch", ERROR, "The exclusions disagree with the tensors under vLLM's "
                             "module names: a quantised layer is excluded, an unquantised one is not, or only some "
                             "shards of a fused layer are listed", "list unquantised layers by vLLM's names: lm_head, "
                             "*fc, *qkv_proj / *self_attn*, *gate_up_proj / *mlp* (fused shards together)")
QUANT_IGNORE_UNMATCHED = rule("quant-ignore-unmatched", WARNING, "An exclusion entry names no layer of this drafter "
                              "under vLLM's module names (e.g. a training-time name)", "rename it to vLLM's module "
                              "name (lm_head, *fc, *qkv_proj, *gate_up_proj) or drop it")
QUANT_EMBED_TOKENS = rule("quant-embed-tokens", ERROR, "embed_tokens is quantised: vLLM never quantises the "
                          "embedding and fails (KeyError: 'embed_tokens.weight_scale')",
                          "keep embed_tokens unquantised (export it in bf16, or exclude it)")
QUANT_SCALE_MISSING = rule("quant-scale-missing", ERROR, "A quantised weight lacks a scale its scheme needs, or a "
                           "scale has no weight: vLLM leaves the scale uninitialised or rejects the key",
                           "re-export the scales with their weights")
QUANT_CONFIG_DISAGREE = rule("quant-config-disagree", WARNING, "config.json quantization_config and "
                             "hf_quant_config.json disagree (vLLM reads the first, TensorRT-LLM and older readers "
                             "the second)", "make both say the same (quant_algo, ignore = exclude_modules)")


def quant_layout(ctx: Context) -> QuantLayout | None:
    """The drafter's quantised layout, read once per inspection."""
    key = "__quant_layout__"
    if key not in ctx._arrays:
        ctx._arrays[key] = layout_of(ctx.drafter)
    return ctx._arrays[key]


def recognised(ctx: Context, canon: str) -> bool:
    """A tensor that belongs to a quantised layout eaglectl recognises (a quantised weight or a scale):
    its dtype is the scheme's, not an exotic one (rule exotic-dtype)."""
    from ..io.quant import scale_of

    q = quant_layout(ctx)
    if q is None or q.effective is None or q.scheme is None:
        return False
    return canon in q.quantized or scale_of(canon) is not None


def _linears(ctx: Context) -> list[str]:
    return [c for c in ctx.view.names() if vllm_module(c) is not None]


@check
def quantization(ctx: Context) -> None:
    q = quant_layout(ctx)
    if q is None:
        return
    eff = q.effective
    if eff is None:
        ctx.emit(QUANT_CONFIG_MISSING, f"{len(q.scales)} weight(s) carry scales (e.g. "
                 f"'{ctx.view.stored[next(iter(q.scales))] if q.scales else q.orphans[0]}') and no config says how",
                 ctx.where)
        return
    where = ctx.at("quantization_config") if q.config is not None else eff.where
    for cfg in (q.config, q.side):
        for problem in (cfg.problems if cfg is not None else ()):
            ctx.emit(QUANT_MODULE_MISMATCH, f"{cfg.where}: {problem}", where)
    if q.config is not None and q.config.style == "flat" and q.config.quant_method is None:
        ctx.emit(QUANT_METHOD_MISSING, f"quantization_config has quant_algo {q.config.quant_algo or 'absent'} and no "
                 "quant_method", ctx.at("quantization_config.quant_method"))
    supported = eff.scheme is not None and (eff.quant_method or "").lower().startswith("modelopt")
    if not supported and not (q.config is not None and q.config.quant_method is None):
        ctx.emit(QUANT_UNSUPPORTED, f"quant_method {eff.quant_method or 'absent'}, quant_algo "
                 f"{eff.quant_algo or 'absent'} ({eff.where})", where)
    if q.config is not None and q.config.style == "flat" and q.config.exclusions is None and q.config.exclude_modules:
        ctx.emit(QUANT_EXCLUDE_IGNORED, f"exclude_modules {list(q.config.exclude_modules)[:4]} and no ignore",
                 ctx.at("quantization_config.exclude_modules"))
    _disagree(ctx, q)
    _embed(ctx, q)
    _scales(ctx, q)
    if eff.scheme is not None:
        _modules(ctx, q, eff.exclusions or (), where)


def _disagree(ctx: Context, q: QuantLayout) -> None:
    if q.config is None or q.side is None:
        return
    a, b = q.config, q.side
    differs = []
    if a.quant_algo != b.quant_algo:
        differs.append(f"quant_algo {a.quant_algo} vs {b.quant_algo}")
    if set(a.exclusions or a.exclude_modules or ()) != set(b.exclusions or ()):
        differs.append(f"exclusions {sorted(a.exclusions or a.exclude_modules or ())[:4]} vs "
                       f"{sorted(b.exclusions or ())[:4]}")
    if differs:
        ctx.emit(QUANT_CONFIG_DISAGREE, "; ".join(differs), b.where)


def _embed(ctx: Context, q: QuantLayout) -> None:
    canon = "embed_tokens.weight"
    if canon in ctx.view and (canon in q.quantized or canon in q.scales):
        ctx.emit(QUANT_EMBED_TOKENS, f"'{ctx.view.stored[canon]}' is {ctx.view.info(canon).dtype}"
                 + (f" with {', '.join(s.lstrip('.') for s in q.scales.get(canon, {}))}" if canon in q.scales else ""),
                 ctx.view.locate(canon))


def _scales(ctx: Context, q: QuantLayout) -> None:
    eff = q.effective
    needed = SCHEMES[eff.quant_algo][1] if eff is not None and eff.quant_algo in SCHEMES else ()
    missing = []
    for canon in q.quantized:
        lacks = [s for s in needed if s not in q.scales.get(canon, {})]
        if lacks:
            missing.append((canon, lacks))
    for canon, lacks in missing[:20]:
        ctx.emit(QUANT_SCALE_MISSING, f"'{ctx.view.stored[canon]}' ({ctx.view.info(canon).dtype}) has no "
                 f"{', '.join(s.lstrip('.') for s in lacks)}", ctx.view.locate(canon))
    for canon in q.orphans[:20]:
        ctx.emit(QUANT_SCALE_MISSING, f"'{ctx.view.stored[canon]}' scales a weight the checkpoint does not have",
                 ctx.view.locate(canon))


def _modules(ctx: Context, q: QuantLayout, entries: tuple[str, ...], where: str) -> None:
    modules = vllm_modules(_linears(ctx))
    quantised, plain, bad = [], [], []
    for prefix, weights in sorted(modules.items()):
        if prefix == "model.embed_tokens":
            continue  # never quantised by vLLM (quant-embed-tokens)
        states = {w in q.quantized for w in weights}
        out = excluded(prefix, entries)
        if len(states) > 1:
            bad.append(f"{prefix}: some of {', '.join(ctx.view.stored[w] for w in weights)} are quantised, not all "
                       "(vLLM fuses them into one layer)")
        elif out is None:
            bad.append(f"{prefix}: only some of its shards are listed exactly (vLLM refuses the list)")
        elif states == {True} and out:
            bad.append(f"{prefix} is quantised but excluded: vLLM builds it unquantised and rejects its scales")
        elif states == {False} and not out:
            bad.append(f"{prefix} is not quantised and no entry excludes it: vLLM builds it {q.scheme} and loads "
                       f"{ctx.view.info(weights[0]).dtype} values into it")
        (quantised if states == {True} else plain).append(prefix)
    for message in bad[:20]:
        ctx.emit(QUANT_MODULE_MISMATCH, message, where)
    prefixes = [p for p in modules if p != "model.embed_tokens"]
    own = dialect_names(prefixes, ctx.dialect)  # a midlayer layout's own engine (sglang) names them so
    unmatched = [e for e in entries if not matches_any(e, prefixes) and not matches_any(e, own)]
    for e in unmatched[:20]:
        ctx.emit(QUANT_IGNORE_UNMATCHED, f"entry '{e}' excludes none of vLLM's modules for this drafter "
                 f"({', '.join(sorted(prefixes)[:6])})", where)
    eff = q.effective
    assert eff is not None
    ctx.emit(QUANTIZED, f"{eff.quant_algo} ({eff.quant_method or 'no quant_method'}, {eff.where}): "
             f"{len(quantised)} of {len(quantised) + len(plain)} linear layers quantised"
             + (f"; unquantised: {', '.join(plain[:6])}" if plain else "")
             + "; the reference drafter dequantises the weights (activation scales are not simulated)", where)

