"""SGLang's reading of the drafter (`Context.readings.engine("sglang")`: asked of SGLang's own code where an
interpreter is given, else eaglectl's table of SGLang 0.5.23, engines/sglang.py) against what the drafter is: a class
it drafts with, the layers it captures, the flags it applies, the tensors it drops. Run for a report that is for
SGLang (`--for sglang`, `--for vllm,sglang`), or on files in SGLang's own layouts (advice, info, for vLLM alone)."""

from __future__ import annotations

from ..engines import sglang
from ..engines.target_support import said
from ..spec import FLAGS
from . import catalogue as rule
from .base import Context, check


@check
def sglang_reading(ctx: Context) -> None:
    r = ctx.readings.engine("sglang") if ctx.readings is not None else None
    if r is None or ("sglang" not in ctx.for_engines and ctx.dialect.consumer != "sglang"):
        return  # a report for vLLM alone says nothing of SGLang, unless the files are SGLang's own layout
    how = said(r.basis, r.version, f"assumed: eaglectl's table of SGLang {sglang.RELEASE}", engine="SGLang")
    if (r.error or "").startswith("undecided"):
        return  # rules/runners.py says so (sglang-reading-undecided)
    if r.error or r.model_error:
        ctx.emit(rule.SGLANG_NOT_A_DRAFT, f"SGLang {r.version}: {r.error or r.model_error} ({how})",
                 ctx.at("architectures"))
        return
    spec, L = ctx.spec, ctx.target.num_layers if ctx.target is not None else None
    declared = spec.aux_layer_ids_vllm
    if declared is None and L is not None:
        declared = spec.capture_ids(L)
    trained = ctx.measured.boundary_ids if ctx.measured is not None else None
    want = tuple(trained) if trained is not None else tuple(sorted(set(declared))) if declared is not None else None
    got = r.boundary_ids
    came = f"{r.source} +{r.shift}" if r.shift else r.source
    if want is not None and got is not None and got != want:
        ctx.emit(rule.SGLANG_AUX_IDS, f"SGLang {r.version} captures boundaries {list(got)} ({came}); the drafter "
                 f"{'was trained on' if trained is not None else 'declares'} {list(want)} ({how})", ctx.where)
    elif want is not None and got is None and r.default:
        ctx.emit(rule.SGLANG_AUX_IDS, f"SGLang {r.version} captures the target's default (2, L//2, L-3): it reads no "
                 f"ids from this config (only {sglang.IDS_KEY}); the drafter declares {list(want)} ({how})", ctx.where)
    if got is not None and L is not None and any(b >= L for b in got):
        ctx.emit(rule.SGLANG_IDS_BEYOND_TARGET, f"SGLang {r.version} captures boundaries {list(got)} on a "
                 f"{L}-layer target: {[b for b in got if b >= L]} past its last layer ({how})", ctx.where)
    if r.flags is not None:
        differ = [f for f in FLAGS if bool(r.flags.get(f)) != bool(getattr(spec, f))]
        if differ:
            ctx.emit(rule.SGLANG_FLAGS_DIFFER, f"SGLang {r.version}'s draft class applies "
                     + ", ".join(f"{f}={str(bool(r.flags.get(f))).lower()}" for f in differ)
                     + "; the drafter has " + ", ".join(f"{f}={str(bool(getattr(spec, f))).lower()}" for f in differ)
                     + f" ({how})", ctx.at(differ[0]))
    if r.skipped:
        ctx.emit(rule.SGLANG_SKIPS_WEIGHTS, f"SGLang {r.version} drops {', '.join(r.skipped[:5])}"
                 + (f" and {len(r.skipped) - 5} more" if len(r.skipped) > 5 else "") + f" ({how})", ctx.where)
