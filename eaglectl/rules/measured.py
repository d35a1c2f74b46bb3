"""What the weights say (`--target`): the layers the drafter was trained on against the layers its
serving engine will read, its embedding and head, flags the files cannot settle, and whether it
predicts this target at all (docs/math.md#reading-probe, docs/engines.md#aux-ids)."""

from __future__ import annotations

from ..engines.readings import EngineReading, layers_read
from ..engines.target_support import said
from . import catalogue as rule
from .base import Context, check


@check
def measured(ctx: Context) -> None:
    m = ctx.measured
    if m is None or ctx.target is None:
        return
    spec = ctx.spec
    if m.at_chance:
        ctx.emit(rule.DRAFTER_AT_CHANCE,
                 f"best top-1 agreement {m.best_agreement:.1%} against {m.chance:.1%} for always "
                 f"guessing the most frequent token ({m.inputs})", ctx.target.source)
        return
    trained = m.boundary_ids
    L = ctx.target.num_layers
    if trained is not None and L is not None:
        by_ids = {c.boundary_ids: c for c in m.aux.candidates}
        for engine in dict.fromkeys([ctx.dialect.consumer, "vllm"]):
            r = _reading(ctx, engine, L)
            if r is None or r.boundary_ids is None or r.boundary_ids == trained:
                continue
            reads = r.boundary_ids
            stake = ""
            if reads in by_ids and by_ids[reads].acceptance_length and m.aux.winner and \
                    m.aux.winner.acceptance_length:
                stake = (f": acceptance length {by_ids[reads].acceptance_length:.2f} instead of "
                         f"{m.aux.winner.acceptance_length:.2f} under the reference loop")
            how = said(r.basis, r.version, f"assumed: eaglectl's table of {engine}" +
                       (f" {r.version}" if engine == "vllm" else f", since {r.version}"))
            message = (f"{engine} reads boundaries {list(reads)} ({how}); the drafter was trained on {list(trained)}"
                       f"{stake}")
            if engine == ctx.dialect.consumer:
                ctx.emit(rule.AUX_READING_MISMATCH, message, ctx.where)
            else:
                ctx.emit(rule.AUX_IDS_OUTPUT_CONVENTION, message, ctx.where)
    for name, r in (("embedding", rule.EMBEDDING_MISMATCH), ("lm_head", rule.LM_HEAD_MISMATCH)):
        fact = m.facts.get(name)
        if fact is not None and fact.measured == "target":
            ctx.emit(r, fact.reason, ctx.view.locate(f"{'embed_tokens' if name == 'embedding' else 'lm_head'}.weight"))
    for name, fact in m.facts.items():
        if name in ("aux_convention", "embedding", "lm_head"):
            continue
        if fact.measured not in ("undecided", fact.declared):
            ctx.emit(rule.FLAG_READING_MISMATCH, f"'{name}' is {fact.declared} in the config; the drafter was trained "
                     f"with {fact.measured}: {fact.reason}", ctx.at(name))
    if trained is not None:
        how = (f"{m.convention} numbering of the stored ids {list(spec.aux_layer_ids)}" if spec.aux_layer_ids is not None
               else "no ids stored: every engine's default for this target")
        winner = m.aux.winner
        al = (f"; acceptance length {winner.acceptance_length:.2f} under the reference loop on held-out prompts "
              "(smoke --engine reference's figure, an estimate without vLLM)"
              if winner is not None and winner.acceptance_length else "")
        ctx.emit(rule.MEASURED_READING, f"trained on boundaries {list(trained)} ({how}; {m.aux.reason}){al}",
                 ctx.where)


def _reading(ctx: Context, engine: str, L: int) -> EngineReading | None:
    """What `engine` reads of this config on the target: the readings inspect computed (vLLM's runners, SGLang's:
    asked, else their tables), or None where vLLM's runners read different layers (aux-ids-runner-split names which
    is right); else eaglectl's table of the engine (readings.layers_read)."""
    if engine == "vllm" and ctx.readings is not None:
        read = {r.boundary_ids: r for r in ctx.readings.runners if not r.error and r.boundary_ids is not None}
        return next(iter(read.values())) if len(read) == 1 else None
    if ctx.readings is not None and ctx.readings.engine(engine) is not None:
        return ctx.readings.engine(engine)
    arch = ctx.target.architectures[0] if ctx.target is not None and ctx.target.architectures else None
    return layers_read(engine, ctx.ckpt.config, L, declared=ctx.spec.aux_layer_ids, view=ctx.config, target_arch=arch)
