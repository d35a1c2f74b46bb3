"""Aux hidden states: the ids, their count against fc, their convention, and the widths."""

from __future__ import annotations

from .. import formats
from ..checkpoint.drafter import AUX_ID_PATHS
from ..engines.readings import Readings, table_readings
from ..limits import limit
from ..spec import default_aux_ids
from . import catalogue as rule
from .base import Context, check


def _in_vllm_numbering(ctx: Context, lists: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Each list as boundary ids, by the numbering its field is in: as eaglectl recorded it per field, else as
    the dialect reads that field. Two fields that hold the same layers in two numberings do not conflict."""
    recorded = ctx.config.dict("eaglectl_provenance.aux_id_fields") or {}
    out = {}
    for path, ids in lists.items():
        convention = recorded.get(path) or ctx.dialect.aux_path_conventions.get(path, (ctx.dialect.aux_convention,))[0]
        out[path] = tuple(i + (1 if convention == "output" else 0) for i in ids)
    return out


# dialects whose layout stores no aux ids: their drafters mean the engines' default layers
_NO_IDS = frozenset(d.name for d in formats.DIALECTS.values() if not d.aux_ids_paths)


@check
def aux(ctx: Context) -> None:
    spec, cfg = ctx.spec, ctx.config
    ids, n = spec.aux_layer_ids, spec.num_aux_hidden_states
    Ht = spec.aux_width
    fc = ctx.view.shape("fc.weight")
    if fc is not None and len(fc) == 2 and Ht and fc[1] % Ht:
        ctx.emit(rule.TARGET_HIDDEN_SIZE, f"fc.weight has {fc[1]} in-features, not a multiple of "
                 f"target_hidden_size {Ht}", ctx.view.locate("fc.weight"))
    lists = {p: v for p in AUX_ID_PATHS if (v := cfg.int_list(p, lo=-limit("target_layers"), hi=limit("target_layers")))
             is not None}
    if len(lists) == 2 and len(set(lists.values())) == 2 and len(set(_in_vllm_numbering(ctx, lists).values())) == 2:
        ctx.emit(rule.AUX_IDS_CONFLICT, " vs ".join(f"{p} {list(v)}" for p, v in lists.items()), ctx.where)
    if ids is None:
        if spec.sources.get("aux_layer_ids", "").startswith("invalid"):
            return
        heuristics = ("engines use the default layers: vLLM (2, L//2, L-3) boundary = sglang/TRT-LLM (1, L//2-1, L-4) "
                      "output-of-layer, the same physical states; right only if the drafter was trained on them")
        L = ctx.target.num_layers if ctx.target is not None else None
        if L is not None:
            heuristics = (f"for this {L}-layer target vLLM captures {list(default_aux_ids(L, 'boundary'))} "
                          f"(= sglang {list(default_aux_ids(L, 'output'))} output-of-layer); right only if the "
                          "drafter was trained on them")
        # converted by eaglectl from a layout that stores no ids (SafeAILab): the engines' default is what the source
        # meant, so the output is no worse than its source (the same info; `--target` writes the ids explicitly)
        came_from = ctx.config.str("eaglectl_provenance.source_dialect")
        implicit = not ctx.dialect.aux_ids_paths or (came_from is not None and came_from in _NO_IDS)
        r = rule.AUX_IDS_IMPLICIT if implicit else rule.AUX_IDS_MISSING
        like_source = f" (as in its {came_from} source)" if implicit and ctx.dialect.aux_ids_paths else ""
        ctx.emit(r, f"no aux layer ids{like_source}; {heuristics}", ctx.where)
    else:
        loc = ctx.at(spec.sources.get("aux_layer_ids", "").removeprefix("config: "))
        if len(set(ids)) != len(ids):
            ctx.emit(rule.AUX_IDS_DUPLICATE, f"aux ids {list(ids)} repeat", loc)
        elif list(ids) != sorted(ids):
            ctx.emit(rule.AUX_IDS_UNSORTED, f"aux ids {list(ids)} are not ascending", loc)
        if any(i < 0 for i in ids):
            ctx.emit(rule.AUX_IDS_RANGE, f"aux ids {list(ids)} include a negative id", loc)
        if n is not None and len(ids) != n:
            ctx.emit(rule.AUX_IDS_COUNT, f"{len(ids)} aux ids but fc.weight takes {n} states of {Ht}", loc)
    declared = cfg.int("num_aux_hidden_states", lo=1, hi=limit("aux_ids"))
    if declared is not None and n is not None and declared != n:
        ctx.emit(rule.AUX_IDS_COUNT, f"num_aux_hidden_states is {declared} but fc.weight takes {n} states of {Ht}",
                 ctx.at("num_aux_hidden_states"))
    decided = ctx.measured is not None and ctx.measured.boundary_ids is not None  # measured: rules/measured.py
    if ids is not None and spec.aux_convention == "output" and not ctx.dialect.aux_convention_note and not decided:
        # the runners that read the stored ids as they are (one layer early); none: rules/runners.py says what
        # they read instead
        literal = [r.runner.upper() for r in _readings(ctx).runners if not r.error and r.shift == 0
                   and r.boundary_ids == tuple(sorted(set(ids)))]
        if literal:
            ctx.emit(rule.AUX_IDS_OUTPUT_CONVENTION,
                     f"stored {list(ids)} mean vLLM ids {list(spec.aux_layer_ids_vllm or ())}; vLLM's "
                     f"{' and '.join(literal)} runner{'s' if len(literal) > 1 else ''} would capture {list(ids)}",
                     ctx.where)
    if ctx.measured is not None and not decided and not ctx.measured.at_chance:
        ctx.emit(rule.AUX_CONVENTION_UNVERIFIABLE, f"measured but undecided: {ctx.measured.aux.reason}", ctx.where)
    elif ctx.dialect.aux_convention_note and ids is not None and spec.sources["aux_convention"].startswith(
            "dialect") and not decided:
        ctx.emit(rule.AUX_CONVENTION_UNVERIFIABLE, ctx.dialect.aux_convention_note, ctx.where)
    count = n if n is not None else (len(ids) if ids else None)
    built, basis = _built(ctx)
    if count is None:
        return
    wrong = {runner: b for runner, b in built.items() if b != count}
    if wrong:  # the engine's own reading decides (asked of vLLM where it is installed, else its table)
        said = ", ".join(f"{runner.upper()} builds fc for {b}" for runner, b in wrong.items())
        ctx.emit(rule.AUX_COUNT_UNSIZED, f"fc.weight holds {count} aux states; vLLM's reading: {said} ({basis}): "
                 "its weight loader fails on fc", ctx.where)
    elif count != 3:
        ctx.emit(rule.AUX_COUNT_NOT_3, f"{count} aux states", ctx.where)


def _readings(ctx: Context) -> Readings:
    """The readings the command computed, else vLLM's tables read on the config (engines/readings.table_readings)."""
    return ctx.readings if ctx.readings is not None else table_readings(ctx.ckpt.config, None,
                                                                         release=ctx.engine_version)


def _built(ctx: Context) -> tuple[dict[str, int], str]:
    """How many aux states each vLLM runner builds fc for, and on what basis."""
    readings = _readings(ctx)
    return {r.runner: r.num_aux for r in readings.runners if r.num_aux is not None and not r.error}, readings.basis
