"""vLLM's two model runners (`Context.readings`, engines/readings.py): V1 (every CPU build) and Model Runner V2 (the GPU
default) pick the target layers with different code (docs/engines.md#runners). The rules run only where the
readings were computed (`inspect`, `check`)."""

from __future__ import annotations

from ..checkpoint.drafter import flag_alias
from ..engines.target_support import said
from ..formats.speculators import SPECULATORS_READERS
from ..spec import FLAGS
from . import catalogue as rule
from .base import Context, check

_ROLE = {"v1": "V1 (CPU)", "v2": "V2 (GPU default)"}


def _names(r) -> str:  # type: ignore[no-untyped-def]
    ids = r.ids_text() if r.boundary_ids is not None or not r.default else "(2, L//2, L-3)"
    where = "the target's default" if r.default else f"from {r.source}" + (f" +{r.shift}" if r.shift else "")
    return f"{_ROLE.get(r.runner, r.runner)} {ids} ({where})"


@check
def runners(ctx: Context) -> None:
    r = ctx.readings
    if r is None or not r.runners:
        return
    undecided = [x for x in (*r.runners, *r.others) if (x.error or "").startswith("undecided")]
    for x in {x.engine: x for x in undecided}.values():
        ctx.emit(rule.ENGINE_READING_UNDECIDED if x.engine == "vllm" else rule.SGLANG_READING_UNDECIDED, x.error or "",
                 ctx.where)
    v1, v2 = r.get("v1"), r.get("v2")
    if v1 is None and v2 is not None and not v2.error:
        _only_runner(ctx, v2)
        return
    if v1 is None or v2 is None or v1.error or v2.error:
        return
    basis = said(v1.basis, v1.version, "assumed: eaglectl's table of vLLM")
    if r.split:
        message = f"{_names(v1)}; {_names(v2)}; {basis}"
        trained = ctx.measured.boundary_ids if ctx.measured is not None else None
        if trained is not None:
            right = [x.runner.upper() for x in (v1, v2) if x.boundary_ids == tuple(trained)]
            message += f"; measured: trained on {list(trained)}, " + (
                f"{' and '.join(right)} right" if right else "neither runner captures them")
        ctx.emit(rule.AUX_IDS_RUNNER_SPLIT, message, ctx.where)
    fc = ctx.spec.num_aux_hidden_states or v1.num_aux
    if fc is None:
        return
    for x, other in ((v2, v1), (v1, v2)):
        if x.boundary_ids is not None and len(x.boundary_ids) != fc and (
                other.boundary_ids is None or len(other.boundary_ids) == fc):
            ctx.emit(rule.AUX_IDS_RUNNER_COUNT, f"{_ROLE[x.runner]} captures {len(x.boundary_ids)} layers "
                     f"{list(x.boundary_ids)} ({_where(x)}) but fc takes {fc} aux states", ctx.where)
        elif x.boundary_ids is None and x.default and fc != 3 and (
                other.boundary_ids is None or len(other.boundary_ids) == fc):
            ctx.emit(rule.AUX_IDS_RUNNER_COUNT, f"{_ROLE[x.runner]} captures the target's 3 default layers but fc "
                     f"takes {fc} aux states", ctx.where)


def _where(r) -> str:  # type: ignore[no-untyped-def]
    return "the target's default" if r.default else r.source


@check
def engine_flags(ctx: Context) -> None:
    """The flags vLLM's draft model class applies (each runner's reading) against the drafter's, where no rule
    with a more precise fix names the difference already (`_named_elsewhere`)."""
    r = ctx.readings
    if r is None:
        return
    spec, config = ctx.spec, ctx.ckpt.config or {}
    kind = config.get("speculators_model_type")
    reader = SPECULATORS_READERS.get(kind) if isinstance(kind, str) else None
    for name in FLAGS:
        if _named_elsewhere(ctx, name):
            continue
        declared = bool(getattr(spec, name))
        differ = [x for x in r.runners if not x.error and x.flags is not None and x.flags.get(name) != declared]
        if not differ:
            continue
        where = ""
        if reader is not None and name not in reader.copied:
            where = (f"; vLLM's {kind} reader takes {name} from transformer_layer_config "
                     "only, not from the top level")
        applied = str(differ[0].flags.get(name)).lower()  # type: ignore[union-attr]
        runners = " and ".join(x.runner.upper() for x in differ) + (" runners apply" if len(differ) > 1 else
                                                                       " runner applies")
        ctx.emit(rule.ENGINE_FLAGS_DIFFER, f"vLLM's {runners} {name} = {applied}, "
                 f"the drafter declares {str(declared).lower()} ({spec.sources.get(name, 'default')}){where}; "
                 f"{said(differ[0].basis, differ[0].version, 'assumed: eaglectl table of vLLM')}", ctx.at(name))


def _named_elsewhere(ctx: Context, flag: str) -> bool:
    """fc_norm declared by an alias only (fc-norm-alias), norm_before_fc on an MLA drafter, whose vLLM class builds
    no input norm (mla-norm-before-fc)."""
    if flag == "fc_norm":
        return flag_alias(ctx.spec, flag) is not None
    return flag == "norm_before_fc" and ctx.spec.arch == "mla"


def _only_runner(ctx: Context, v2) -> None:  # type: ignore[no-untyped-def]
    """A release with Model Runner V2 alone (vLLM 0.34 and later): its reading against the ids the config declares,
    where they differ (no V1 reads them instead)."""
    declared = ctx.spec.aux_layer_ids_vllm
    if declared is None:
        return
    want = tuple(sorted(set(declared)))
    if v2.boundary_ids == want:
        return
    ids = list(v2.boundary_ids) if v2.boundary_ids is not None else "the target's default (2, L//2, L-3)"
    basis = said(v2.basis, v2.version, f"assumed: eaglectl's table of vLLM {v2.version}")
    ctx.emit(rule.AUX_IDS_NOT_READ, f"vLLM {v2.version} has Model Runner V2 alone; it captures {ids} "
             f"({_where(v2)}); the config declares {list(want)} ({ctx.spec.sources.get('aux_layer_ids', 'config')}); "
             f"{basis}", ctx.where)
