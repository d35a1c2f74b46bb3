"""`--engine-version X.Y`: findings scoped to what that vLLM release serves (engines.FEATURES), and the draft's
length against the target's, which vLLM treated three ways over its releases (`draft_lengths` feeds both rules)."""

from __future__ import annotations

from typing import Any

from ..engines.facts import DRAFT_CONTEXT_RAISE, REFERENCE, needed_features, version_key
from . import catalogue as rule
from .base import Context, check

# RoPE types whose rotary table vLLM may resize (>= 0.33 `_CACHE_ONLY_ROPE_TYPES`); any other type keeps the
# drafter's max_position_embeddings, and under Model Runner V2 the server's max_model_len follows it.
CACHE_ONLY_ROPE = ("default", "linear", "llama3", "ntk", "proportional")
# RoPE types whose max_position_embeddings already holds the scaled length: vLLM multiplies every other type's
# factor in when it derives a model's length (config/model.py _get_and_verify_max_len, 0.32).
PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


@check
def engine_version(ctx: Context) -> None:
    version = ctx.engine_version
    if version is None:
        return
    needed = needed_features("vllm", ctx.spec, ctx.dialect.config_style)
    unserved = [f for f in needed if f.unserved_on(version)]
    # a release that refuses the drafter never gets to serve it wrong: the silent rows then say "also"
    refused = any(f.before == "loud" for f in unserved)
    for f in unserved:
        what = ("refuses to load it" if f.before == "loud" else
                "would also serve it wrong silently" if refused else "serves it wrong silently")
        ctx.emit(rule.ENGINE_VERSION_UNSERVED, f"vLLM {version} {what}: {f.feature} is served from {f.release}; "
                 f"{f.note}", ctx.where)
    for f in needed:
        if f.release is None and version_key(version) < version_key(REFERENCE["vllm"]):
            ctx.emit(rule.ENGINE_VERSION_UNCONFIRMED,
                     f"vLLM {version}: {f.feature} needs {f.since}, whose first release "
                     f"is unconfirmed ({REFERENCE['vllm']} has it): {f.note}", ctx.where)


def _rope_kind(scaling: Any) -> str:
    if not isinstance(scaling, dict):
        return "default"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def positions(max_position_embeddings: int | None, scaling: Any) -> int | None:
    """The length vLLM derives from a config: max_position_embeddings times the RoPE factor, except for the
    types that hold the scaled length already (PRESCALED_ROPE)."""
    if max_position_embeddings is None:
        return None
    factor = scaling.get("factor") if isinstance(scaling, dict) and _rope_kind(scaling) not in PRESCALED_ROPE else 1
    return int(max_position_embeddings * (factor if isinstance(factor, (int, float)) and factor > 0 else 1))


def draft_lengths(ctx: Context) -> tuple[str, int, int] | None:
    """(the draft's RoPE type, its length, the target's length), both derived as vLLM derives them; None without
    a target or either length."""
    if ctx.target is None:
        return None
    spec, config = ctx.spec, ctx.target.config
    draft = positions(spec.max_position_embeddings, spec.rope_scaling)
    scaling = config.dict("rope_scaling") or config.dict("rope_parameters")
    target = positions(config.int("max_position_embeddings", lo=1), scaling)
    if draft is None or target is None:
        return None
    return _rope_kind(spec.rope_scaling), draft, target


def _at_length(ctx: Context) -> str:
    source = ctx.spec.sources.get("max_position_embeddings", "")
    return ctx.at(source.removeprefix("config: ") if source.startswith("config: ") else "max_position_embeddings")


@check
def draft_context_cap(ctx: Context) -> None:
    """vLLM >= 0.33 (`_limit_max_model_len_to_draft`, V2 only): a draft whose RoPE is not cache-only keeps its own
    length, and the target's max_model_len is lowered to it. Without --engine-version: the current release's
    behaviour; with one older than 0.33: nothing here (0.27 to 0.32 raise the draft's length to the target's;
    older releases overrun it: `draft_context_overrun`)."""
    version = ctx.engine_version
    lengths = draft_lengths(ctx)
    if lengths is None or (version is not None and version_key(version) < (0, 33)):
        return
    kind, draft_len, target_len = lengths
    if kind not in CACHE_ONLY_ROPE and draft_len < target_len:
        ctx.emit(rule.DRAFT_CONTEXT_CAP, f"{kind} RoPE, max_position_embeddings {ctx.spec.max_position_embeddings} "
                 f"< the target's {target_len}: a GPU server (Model Runner V2) on vLLM "
                 f"{version or '0.33'} serves at most {draft_len} tokens of context", _at_length(ctx))


@check
def draft_context_overrun(ctx: Context) -> None:
    """vLLM before 0.27 (--engine-version): the draft's rotary table holds its own length whatever the RoPE type,
    and the proposer feeds it positions up to the target's (vLLM issue #48894)."""
    version = ctx.engine_version
    lengths = draft_lengths(ctx)
    if version is None or lengths is None or not DRAFT_CONTEXT_RAISE.unserved_on(version):
        return
    kind, draft_len, target_len = lengths
    if draft_len < target_len:
        ctx.emit(rule.DRAFT_CONTEXT_OVERRUN,
                 f"vLLM {version} crashes or reads out of bounds past {draft_len} positions (fixed in "
                 f"{DRAFT_CONTEXT_RAISE.release}): the draft's length ({kind} RoPE, max_position_embeddings "
                 f"{ctx.spec.max_position_embeddings}) < the target's {target_len}; compiled, the server stops on a "
                 "device-side assert, under --enforce-eager it reads past the rotary table with no error",
                 _at_length(ctx))
