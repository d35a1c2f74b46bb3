"""The draft vocabulary: draft_vocab_size, lm_head rows, the d2t offsets and the t2d mask."""

from __future__ import annotations

import numpy as np

from . import catalogue as rule
from .base import Context, check

_INT_DTYPES = ("I64", "I32", "I16", "U8", "I8")
_MAX_VOCAB = 1 << 26  # larger than any tokenizer; a bigger d2t/t2d is not read into memory


@check
def vocab(ctx: Context) -> None:
    spec, view = ctx.spec, ctx.view
    V, Vd = spec.vocab_size, spec.draft_vocab_size
    head_rows = view.shape("lm_head.weight")[0] if spec.has_lm_head and view.shape("lm_head.weight") else None
    d2t_len = view.shape("d2t")[0] if "d2t" in view and len(view.shape("d2t") or ()) == 1 else None
    if Vd is None and head_rows is not None and V is not None and head_rows < V:
        ctx.emit(rule.DRAFT_VOCAB_SIZE_MISSING,
                 f"lm_head has {head_rows} rows, vocab_size is {V}", ctx.at("draft_vocab_size"))
    sizes = {k: v for k, v in (("draft_vocab_size", Vd), ("lm_head rows", head_rows), ("len(d2t)", d2t_len))
             if v is not None}
    if len(set(sizes.values())) > 1:
        ctx.emit(rule.DRAFT_VOCAB_SIZE_MISMATCH,
                 ", ".join(f"{k} {v}" for k, v in sizes.items()), ctx.at("draft_vocab_size"))
    Vd_eff = d2t_len or head_rows or Vd  # the tensors decide; a disagreeing config is reported above
    reduced = V is not None and Vd_eff is not None and Vd_eff < V
    if "d2t" not in view:
        if reduced:
            ctx.emit(rule.D2T_MISSING, f"draft vocab {Vd_eff} < vocab {V} and no d2t", "d2t")
    else:
        _check_d2t(ctx, V, Vd_eff, reduced)
    if "t2d" in view:
        _check_t2d(ctx, V, Vd_eff)


def _check_d2t(ctx: Context, V: int | None, Vd: int | None, reduced: bool) -> None:
    view, loc = ctx.view, ctx.view.locate("d2t")
    info = view.info("d2t")
    if not reduced and V is not None and Vd == V:
        ctx.emit(rule.D2T_FULL_VOCAB, f"draft vocab == vocab ({V}) but d2t is present", loc)
    if info.dtype not in _INT_DTYPES:
        ctx.emit(rule.D2T_DTYPE, f"d2t is {info.dtype}, expected I64", loc)
        return
    if len(info.shape) != 1 or info.numel > _MAX_VOCAB:
        ctx.emit(rule.D2T_SHAPE, f"d2t has shape {list(info.shape)}", loc)
        return
    d2t = ctx.array("d2t").astype(np.int64)
    if reduced and not d2t.any():
        ctx.emit(rule.D2T_UNFILLED, f"all {len(d2t)} offsets are zero with vocab {V}", loc)
        return
    target_ids = np.arange(len(d2t)) + d2t
    if V is not None:
        bad = np.flatnonzero((target_ids < 0) | (target_ids >= V))
        if bad.size:
            i = int(bad[0])
            ctx.emit(rule.D2T_RANGE, f"{bad.size} ids out of [0, {V}), first: draft {i} -> {int(target_ids[i])}", loc)
    uniq, counts = np.unique(target_ids, return_counts=True)
    if (counts > 1).any():
        dup = int(uniq[counts > 1][0])
        ctx.emit(rule.D2T_DUPLICATE, f"{int((counts > 1).sum())} target ids repeat, e.g. {dup}", loc)
    elif ctx.dialect.d2t_order == "sorted" and len(target_ids) > 1 and not (np.diff(target_ids) > 0).all():
        ctx.emit(rule.D2T_ORDER, "arange + d2t is not increasing", loc)


def _check_t2d(ctx: Context, V: int | None, Vd: int | None) -> None:
    view, loc = ctx.view, ctx.view.locate("t2d")
    info = view.info("t2d")
    if info.dtype not in ("BOOL", "U8"):
        ctx.emit(rule.T2D_DTYPE, f"t2d is {info.dtype}, expected BOOL", loc)
        return
    if len(info.shape) != 1 or (V is not None and info.shape[0] != V) or info.numel > _MAX_VOCAB:
        ctx.emit(rule.T2D_SHAPE, f"t2d has shape {list(info.shape)}, vocab_size is {V}", loc)
        return
    t2d = ctx.array("t2d").astype(bool)
    if Vd is not None and int(t2d.sum()) != Vd:
        ctx.emit(rule.T2D_COUNT, f"t2d has {int(t2d.sum())} true entries, draft vocab is {Vd}", loc)
    d2t_info = view.info("d2t") if "d2t" in view else None
    if d2t_info is not None and d2t_info.dtype in _INT_DTYPES and len(d2t_info.shape) == 1 and \
            d2t_info.numel <= _MAX_VOCAB:
        ids = np.arange(d2t_info.shape[0]) + ctx.array("d2t").astype(np.int64)
        ids = ids[(ids >= 0) & (ids < len(t2d))]
        if not t2d[ids].all():
            ctx.emit(rule.T2D_D2T_MISMATCH, f"{int((~t2d[ids]).sum())} mapped target ids are false in t2d", loc)
