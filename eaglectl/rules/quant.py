"""Quantised drafters (ModelOpt FP8 / NVFP4): vLLM's loading rules for the config and the scales
(docs/inspect.md#quantised-drafters; the layout and vLLM's matching are in io/quant.py)."""

from __future__ import annotations

from ..io.quant import (
    SCHEMES,
    QuantLayout,
    Scale,
    config_problem,
    decode,
    dialect_names,
    excluded,
    layout_of,
    matches_any,
    scale_of,
    scales_of,
    value_problem,
    vllm_module,
    vllm_modules,
)
from ..limits import limit
from . import catalogue as rule
from .base import Context, check


def quant_layout(ctx: Context) -> QuantLayout | None:
    """The drafter's quantised layout, read once per inspection."""
    key = "__quant_layout__"
    if key not in ctx._arrays:
        ctx._arrays[key] = layout_of(ctx.drafter)
    return ctx._arrays[key]


def scale_forms(ctx: Context) -> list[Scale]:
    """Every FP8 / NVFP4 scale of a quantised weight, with its role and any shape or dtype problem (headers only),
    read once per inspection; none when the layout's scheme is not one eaglectl checks."""
    key = "__quant_scales__"
    if key not in ctx._arrays:
        q = quant_layout(ctx)
        ctx._arrays[key] = [s for w in q.quantized for s in scales_of(ctx.view, w, q.scales.get(w, {}))] if (
            q is not None and q.scheme is not None) else []
    return ctx._arrays[key]


def values_read(ctx: Context) -> list[Scale]:
    """The well-formed scales whose values rule quant-scale-values reads: every one under --scan, else those of
    at most quant_scale_bytes (per-tensor scales always; a large block grid waits for --scan)."""
    return [s for s in scale_forms(ctx) if s.problem is None
            and (ctx.scan or ctx.view.info(s.canon).nbytes <= limit("quant_scale_bytes"))]


def recognised(ctx: Context, canon: str) -> bool:
    """A tensor that belongs to a quantised layout eaglectl recognises (a quantised weight or a scale):
    its dtype is the scheme's, not an exotic one (rule exotic-dtype)."""

    q = quant_layout(ctx)
    if q is None or q.effective is None or q.scheme is None:
        return False
    return canon in q.quantized or scale_of(canon) is not None


@check
def quantization(ctx: Context) -> None:
    config_problem(ctx.config)  # a quantization_config vLLM cannot read: config-field-invalid (run_checks reports it)
    q = quant_layout(ctx)
    if q is None:
        return
    eff = q.effective
    if eff is None:
        ctx.emit(rule.QUANT_CONFIG_MISSING, f"{len(q.scales)} weight(s) carry scales (e.g. "
                 f"'{ctx.view.stored[next(iter(q.scales))] if q.scales else q.orphans[0]}') and no config says how",
                 ctx.where)
        return
    where = ctx.at("quantization_config") if q.config is not None else eff.where
    for cfg in (q.config, q.side):
        for problem in (cfg.problems if cfg is not None else ()):
            ctx.emit(rule.QUANT_MODULE_MISMATCH, f"{cfg.where}: {problem}", where)
    if q.config is not None and q.config.style == "flat" and q.config.quant_method is None:
        ctx.emit(rule.QUANT_METHOD_MISSING,
                 f"quantization_config has quant_algo {q.config.quant_algo or 'absent'} and no "
                 "quant_method", ctx.at("quantization_config.quant_method"))
    supported = eff.scheme is not None and (eff.quant_method or "").lower().startswith("modelopt")
    if not supported and not (q.config is not None and q.config.quant_method is None):
        ctx.emit(rule.QUANT_UNSUPPORTED, f"quant_method {eff.quant_method or 'absent'}, quant_algo "
                 f"{eff.quant_algo or 'absent'} ({eff.where})", where)
    if q.config is not None and q.config.style == "flat" and q.config.exclusions is None and q.config.exclude_modules:
        ctx.emit(rule.QUANT_EXCLUDE_MODULES_IGNORED,
                 f"exclude_modules {list(q.config.exclude_modules)[:4]} and no ignore",
                 ctx.at("quantization_config.exclude_modules"))
    _disagree(ctx, q)
    _embed(ctx, q)
    _scales(ctx, q)
    _scale_values(ctx)
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
        ctx.emit(rule.QUANT_CONFIG_DISAGREE, "; ".join(differs), b.where)


def _embed(ctx: Context, q: QuantLayout) -> None:
    canon = "embed_tokens.weight"
    if canon in ctx.view and (canon in q.quantized or canon in q.scales):
        ctx.emit(rule.QUANT_EMBED_TOKENS, f"'{ctx.view.stored[canon]}' is {ctx.view.info(canon).dtype}"
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
        ctx.emit(rule.QUANT_SCALE_MISSING, f"'{ctx.view.stored[canon]}' ({ctx.view.info(canon).dtype}) has no "
                 f"{', '.join(s.lstrip('.') for s in lacks)}", ctx.view.locate(canon))
    for canon in q.orphans[:20]:
        ctx.emit(rule.QUANT_SCALE_MISSING, f"'{ctx.view.stored[canon]}' scales a weight the checkpoint does not have",
                 ctx.view.locate(canon))


def _scale_values(ctx: Context) -> None:
    bad = [s for s in scale_forms(ctx) if s.problem is not None]
    for s in bad[:20]:
        ctx.emit(rule.QUANT_SCALE_SHAPE, f"'{ctx.view.stored[s.canon]}' {s.problem}", ctx.view.locate(s.canon))
    wrong = 0
    for s in values_read(ctx):
        stored = ctx.view.stored[s.canon]
        problem = value_problem(s, decode(ctx.ckpt, stored))
        if problem is not None:
            wrong += 1
            if wrong <= 20:
                ctx.emit(rule.QUANT_SCALE_VALUES, f"'{stored}' {problem}", ctx.view.locate(s.canon))


def _modules(ctx: Context, q: QuantLayout, entries: tuple[str, ...], where: str) -> None:
    modules = vllm_modules([c for c in ctx.view.names() if vllm_module(c) is not None])
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
        ctx.emit(rule.QUANT_MODULE_MISMATCH, message, where)
    prefixes = [p for p in modules if p != "model.embed_tokens"]
    own = dialect_names(prefixes, ctx.dialect)  # a midlayer layout's own engine (sglang) names them so
    unmatched = [e for e in entries if not matches_any(e, prefixes) and not matches_any(e, own)]
    for e in unmatched[:20]:
        ctx.emit(rule.QUANT_IGNORE_UNMATCHED, f"entry '{e}' excludes none of vLLM's modules for this drafter "
                 f"({', '.join(sorted(prefixes)[:6])})", where)
    eff = q.effective
    assert eff is not None
    ctx.emit(rule.QUANTIZED, f"{eff.quant_algo} ({eff.quant_method or 'no quant_method'}, {eff.where}): "
             f"{len(quantised)} of {len(quantised) + len(plain)} linear layers quantised"
             + (f"; unquantised: {', '.join(plain[:6])}" if plain else "")
             + "; the reference drafter dequantises the weights (activation scales are not simulated)", where)

