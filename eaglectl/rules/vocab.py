"""The draft vocabulary: draft_vocab_size, lm_head rows, the d2t offsets and the t2d mask."""

from __future__ import annotations

from . import ERROR, WARNING, Context, check, rule

DRAFT_VOCAB_SIZE_MISSING = rule("draft-vocab-size-missing", ERROR,
                                "draft_vocab_size is absent while lm_head is smaller than the vocab",
                                "set draft_vocab_size to lm_head's row count")
DRAFT_VOCAB_SIZE_MISMATCH = rule("draft-vocab-size-mismatch", ERROR, "draft_vocab_size, lm_head rows and len(d2t) "
                                 "disagree", "make them equal")
D2T_MISSING = rule("d2t-missing", ERROR, "Reduced draft vocab without d2t: vLLM maps draft id i to target id i",
                   "export d2t from the training run")
D2T_DTYPE = rule("d2t-dtype", ERROR, "d2t is not an integer tensor", "store int64 offsets")
D2T_SHAPE = rule("d2t-shape", ERROR, "d2t is not one-dimensional", "store d2t with shape [draft_vocab_size]")
D2T_RANGE = rule("d2t-range", ERROR, "i + d2t[i] falls outside the target vocab",
                 "rebuild d2t as offsets: target_id - draft_id")
D2T_DUPLICATE = rule("d2t-duplicate", ERROR, "Two draft ids map to the same target id",
                     "rebuild d2t from the unique selected ids")
D2T_UNFILLED = rule("d2t-unfilled", ERROR, "d2t is all zeros with a reduced vocab (the mapping was never filled in)",
                    "export the trained mapping")
D2T_ORDER = rule("d2t-order", WARNING, "d2t is not increasing (only ModelOpt writes frequency order)",
                 "check the producer; sorted ids are expected")
D2T_FULL_VOCAB = rule("d2t-full-vocab", ERROR, "d2t present although draft vocab == vocab (vLLM 0.32 has no "
                      "parameter for it)", "{convert} (drops d2t/t2d)", repaired_by_convert=True)
T2D_DTYPE = rule("t2d-dtype", ERROR, "t2d is not a bool mask", "store t2d as bool")
T2D_SHAPE = rule("t2d-shape", ERROR, "t2d length differs from the target vocab", "rebuild t2d with length vocab_size")
T2D_COUNT = rule("t2d-count", ERROR, "t2d.sum() differs from the draft vocab size", "rebuild t2d from d2t")
T2D_D2T_MISMATCH = rule("t2d-d2t-mismatch", ERROR, "t2d is false at a target id d2t maps to", "rebuild t2d from d2t")

_INT_DTYPES = ("I64", "I32", "I16", "U8", "I8")
_MAX_VOCAB = 1 << 26  # larger than any tokenizer; a bigger d2t/t2d is not read into memory


@check
def vocab(ctx: Context) -> None:
    spec, view = ctx.spec, ctx.view
    V, Vd = spec.vocab_size, spec.draft_vocab_size
    head_rows = view.shape("lm_head.weight")[0] if spec.has_lm_head and view.shape("lm_head.weight") else None
    d2t_len = view.shape("d2t")[0] if "d2t" in view and len(view.shape("d2t") or ()) == 1 else None
    if Vd is None and head_rows is not None and V is not None and head_rows < V:
        ctx.emit(DRAFT_VOCAB_SIZE_MISSING, f"lm_head has {head_rows} rows, vocab_size is {V}", ctx.at("draft_vocab_size"))
    sizes = {k: v for k, v in (("draft_vocab_size", Vd), ("lm_head rows", head_rows), ("len(d2t)", d2t_len))
             if v is not None}
    if len(set(sizes.values())) > 1:
        ctx.emit(DRAFT_VOCAB_SIZE_MISMATCH, ", ".join(f"{k} {v}" for k, v in sizes.items()), ctx.at("draft_vocab_size"))
    Vd_eff = d2t_len or head_rows or Vd  # the tensors decide; a disagreeing config is reported above
    reduced = V is not None and Vd_eff is not None and Vd_eff < V
    if "d2t" not in view:
        if reduced:
            ctx.emit(D2T_MISSING, f"draft vocab {Vd_eff} < vocab {V} and no d2t", "d2t")
    else:
        _check_d2t(ctx, V, Vd_eff, reduced)
    if "t2d" in view:
        _check_t2d(ctx, V, Vd_eff)


def _check_d2t(ctx: Context, V: int | None, Vd: int | None, reduced: bool) -> None:
    import numpy as np

    view, loc = ctx.view, ctx.view.locate("d2t")
    info = view.info("d2t")
    if not reduced and V is not None and Vd == V:
        ctx.emit(D2T_FULL_VOCAB, f"draft vocab == vocab ({V}) but d2t is present", loc)
    if info.dtype not in _INT_DTYPES:
        ctx.emit(D2T_DTYPE, f"d2t is {info.dtype}, expected I64", loc)
        return
    if len(info.shape) != 1 or info.numel > _MAX_VOCAB:
        ctx.emit(D2T_SHAPE, f"d2t has shape {list(info.shape)}", loc)
        return
    d2t = ctx.array("d2t").astype(np.int64)
    if reduced and not d2t.any():
        ctx.emit(D2T_UNFILLED, f"all {len(d2t)} offsets are zero with vocab {V}", loc)
        return
    target_ids = np.arange(len(d2t)) + d2t
    if V is not None:
        bad = np.flatnonzero((target_ids < 0) | (target_ids >= V))
        if bad.size:
            i = int(bad[0])
            ctx.emit(D2T_RANGE, f"{bad.size} ids out of [0, {V}), first: draft {i} -> {int(target_ids[i])}", loc)
    uniq, counts = np.unique(target_ids, return_counts=True)
    if (counts > 1).any():
        dup = int(uniq[counts > 1][0])
        ctx.emit(D2T_DUPLICATE, f"{int((counts > 1).sum())} target ids repeat, e.g. {dup}", loc)
    elif ctx.dialect.d2t_order == "sorted" and len(target_ids) > 1 and not (np.diff(target_ids) > 0).all():
        ctx.emit(D2T_ORDER, "arange + d2t is not increasing", loc)


def _check_t2d(ctx: Context, V: int | None, Vd: int | None) -> None:
    import numpy as np

    view, loc = ctx.view, ctx.view.locate("t2d")
    info = view.info("t2d")
    if info.dtype not in ("BOOL", "U8"):
        ctx.emit(T2D_DTYPE, f"t2d is {info.dtype}, expected BOOL", loc)
        return
    if len(info.shape) != 1 or (V is not None and info.shape[0] != V) or info.numel > _MAX_VOCAB:
        ctx.emit(T2D_SHAPE, f"t2d has shape {list(info.shape)}, vocab_size is {V}", loc)
        return
    t2d = ctx.array("t2d").astype(bool)
    if Vd is not None and int(t2d.sum()) != Vd:
        ctx.emit(T2D_COUNT, f"t2d has {int(t2d.sum())} true entries, draft vocab is {Vd}", loc)
    d2t_info = view.info("d2t") if "d2t" in view else None
    if d2t_info is not None and d2t_info.dtype in _INT_DTYPES and len(d2t_info.shape) == 1 and \
            d2t_info.numel <= _MAX_VOCAB:
        ids = np.arange(d2t_info.shape[0]) + ctx.array("d2t").astype(np.int64)
        ids = ids[(ids >= 0) & (ids < len(t2d))]
        if not t2d[ids].all():
            ctx.emit(T2D_D2T_MISMATCH, f"{int((~t2d[ids]).sum())} mapped target ids are false in t2d", loc)
