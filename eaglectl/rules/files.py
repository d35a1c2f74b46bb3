"""Files: config presence and validity, shard index, pickles, metadata, dtypes, NaN/Inf scan."""

from __future__ import annotations

from ..io.dtypes import COMMON_DTYPES, CONFIG_NAMES, FLOAT_DTYPES
from ..io.quant import scale_of
from ..io.safetensors import NONFINITE_MASK
from . import catalogue as rule
from .base import Context, check
from .quant import (
    recognised,  # a recognised quantised layout's weights and scales are not exotic
    values_read,
)


@check
def files(ctx: Context) -> None:
    if ctx.ckpt.config is None:
        ctx.emit(rule.CONFIG_MISSING, f"{ctx.ckpt.root}: no config.json", f"{ctx.ckpt.root}/config.json")
    for locator, message in ctx.ckpt.index_problems:
        ctx.emit(rule.SHARD_INDEX, message, locator)
    for wf in ctx.ckpt.files:
        if wf.pickled is not None:
            ctx.emit(rule.PICKLE_FILE, f"{wf.name} is a pickle; safetensors is safer and loads lazily", wf.name)
        meta = wf.header.metadata
        if meta is not None and meta.get("format") not in ("pt", "tf", "flax", "mlx"):
            ctx.emit(rule.METADATA_FORMAT, f"{wf.name}: __metadata__ has no format=pt ({len(meta)} keys)", wf.name)


@check
def dtypes(ctx: Context) -> None:

    canon = ctx.dialect.to_canonical
    exotic = [(n, i) for n, i in ctx.ckpt.tensors.items() if i.dtype not in COMMON_DTYPES
              and not recognised(ctx, canon(n))]
    for name, info in exotic[:20]:
        ctx.emit(rule.EXOTIC_DTYPE, f"'{name}' is {info.dtype}", ctx.ckpt.locate(name))
    floats = {i.dtype for n, i in ctx.ckpt.tensors.items() if i.dtype in FLOAT_DTYPES
              and not (scale_of(canon(n)) and recognised(ctx, canon(n)))}  # scales keep their own dtype
    if len(floats) > 1:
        ctx.emit(rule.MIXED_DTYPES, f"floating tensors use {', '.join(sorted(floats))}")
    configured = ctx.spec.config_dtype
    want = CONFIG_NAMES.get((configured or "").removeprefix("torch."))
    if configured and floats and want not in floats:
        ctx.emit(rule.DTYPE_MISMATCH, f"config says {configured}, tensors are {', '.join(sorted(floats))}",
                 ctx.at("torch_dtype"))


@check
def scan(ctx: Context) -> None:
    if not ctx.scan:
        return

    # the scales rule quant-scale-values reads are its own: NaN, Inf, 0 or a negative value mean what their scheme says
    scales = {ctx.view.stored[s.canon] for s in values_read(ctx)}
    names = [n for n, i in ctx.ckpt.tensors.items() if (i.dtype in FLOAT_DTYPES or i.dtype in NONFINITE_MASK)
             and n not in scales]
    total = sum(ctx.ckpt.tensors[n].nbytes for n in names)
    bad_any = 0
    for name in ctx.progress(names, label="scanning for NaN/Inf", total=len(names)):
        bad = ctx.ckpt.count_nonfinite(name)
        if bad:
            bad_any += 1
            ctx.emit(rule.NONFINITE_VALUES, f"'{name}' has {bad} NaN/Inf values", ctx.ckpt.locate(name))
    found = f"{bad_any} with NaN/Inf (nonfinite-values)" if bad_any else "no NaN/Inf"
    ctx.emit(rule.SCANNED, f"{len(names)} floating-point tensors ({total:,} bytes) read; {found}")
