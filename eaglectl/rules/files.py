"""Files: config presence and validity, shard index, pickles, metadata, dtypes, NaN/Inf scan."""

from __future__ import annotations

from ..io.dtypes import COMMON_DTYPES, CONFIG_NAMES, FLOAT_DTYPES
from . import ERROR, INFO, WARNING, Context, check, rule

CONFIG_MISSING = rule("config-missing", ERROR, "No config.json next to the weights", "add the drafter's config.json")
CONFIG_FIELD_INVALID = rule("config-field-invalid", ERROR, "A config field has the wrong type or is out of bounds",
                            "fix the value in config.json")
CONFIG_FIELD_MISSING = rule("config-field-missing", ERROR, "A config field the engines need is absent",
                            "add it to config.json (never guessed)")
PICKLE_FILE = rule("pickle-file", WARNING, "Weights are a pickle (.bin)",
                   "{convert} (writes safetensors)", repaired_by_convert=True)
METADATA_FORMAT = rule("metadata-format", WARNING,
                       "safetensors __metadata__ lacks format=pt (transformers refuses the file)",
                       "{convert} (writes metadata {{'format': 'pt'}})", repaired_by_convert=True)
SHARD_INDEX = rule("shard-index", ERROR, "The shard index disagrees with the shards",
                   "regenerate model.safetensors.index.json")
NONFINITE_VALUES = rule("nonfinite-values", ERROR, "A tensor holds NaN or Inf (--scan)",
                        "re-export from a healthy training checkpoint")
EXOTIC_DTYPE = rule("exotic-dtype", WARNING, "A tensor uses an F8/F6/F4/complex/unsigned dtype outside a recognised "
                    "quantised layout (the reference cannot run it)", "export it with its scales and a ModelOpt "
                    "quantization_config (FP8 / NVFP4: rule quantized), or dequantise it")
MIXED_DTYPES = rule("mixed-dtypes", WARNING, "Floating-point tensors come in more than one dtype",
                    "{convert} --dtype bfloat16 (or another: one dtype)")
DTYPE_MISMATCH = rule("dtype-mismatch", WARNING, "config torch_dtype disagrees with the tensors",
                      "set torch_dtype to the tensors' dtype")
SCANNED = rule("scanned", INFO, "What --scan read: every floating-point tensor, and how many hold NaN/Inf", None)


@check
def files(ctx: Context) -> None:
    if ctx.ckpt.config is None:
        ctx.emit(CONFIG_MISSING, f"{ctx.ckpt.root}: no config.json", f"{ctx.ckpt.root}/config.json")
    for locator, message in ctx.ckpt.index_problems:
        ctx.emit(SHARD_INDEX, message, locator)
    for wf in ctx.ckpt.files:
        if wf.pickled is not None:
            ctx.emit(PICKLE_FILE, f"{wf.name} is a pickle; safetensors is safer and loads lazily", wf.name)
        meta = wf.header.metadata
        if meta is not None and meta.get("format") not in ("pt", "tf", "flax", "mlx"):
            ctx.emit(METADATA_FORMAT, f"{wf.name}: __metadata__ has no format=pt ({len(meta)} keys)", wf.name)


def invalid_fields(ctx: Context) -> None:
    for path, message in ctx.config.problems.items():
        ctx.emit(CONFIG_FIELD_INVALID, message, ctx.at(path))


@check
def dtypes(ctx: Context) -> None:
    from ..io.quant import scale_of
    from .quant import recognised  # a recognised quantised layout's weights and scales are not exotic

    canon = ctx.dialect.to_canonical
    exotic = [(n, i) for n, i in ctx.ckpt.tensors.items() if i.dtype not in COMMON_DTYPES
              and not recognised(ctx, canon(n))]
    for name, info in exotic[:20]:
        ctx.emit(EXOTIC_DTYPE, f"'{name}' is {info.dtype}", ctx.ckpt.locate(name))
    floats = {i.dtype for n, i in ctx.ckpt.tensors.items() if i.dtype in FLOAT_DTYPES
              and not (scale_of(canon(n)) and recognised(ctx, canon(n)))}  # scales keep their own dtype
    if len(floats) > 1:
        ctx.emit(MIXED_DTYPES, f"floating tensors use {', '.join(sorted(floats))}")
    configured = ctx.spec.config_dtype
    want = CONFIG_NAMES.get((configured or "").removeprefix("torch."))
    if configured and floats and want not in floats:
        ctx.emit(DTYPE_MISMATCH, f"config says {configured}, tensors are {', '.join(sorted(floats))}",
                 ctx.at("torch_dtype"))


@check
def scan(ctx: Context) -> None:
    if not ctx.scan:
        return
    names = [n for n, i in ctx.ckpt.tensors.items() if i.dtype in FLOAT_DTYPES]
    total = sum(ctx.ckpt.tensors[n].nbytes for n in names)
    bad_any = 0
    for name in ctx.progress(names, label="scanning for NaN/Inf", total=len(names)):
        bad = ctx.ckpt.count_nonfinite(name)
        if bad:
            bad_any += 1
            ctx.emit(NONFINITE_VALUES, f"'{name}' has {bad} NaN/Inf values", ctx.ckpt.locate(name))
    found = f"{bad_any} with NaN/Inf (nonfinite-values)" if bad_any else "no NaN/Inf"
    ctx.emit(SCANNED, f"{len(names)} floating-point tensors ({total:,} bytes) read; {found}")
