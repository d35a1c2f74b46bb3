"""`--engine-version X.Y`: findings scoped to what that vLLM release serves (engines.FEATURES)."""

from __future__ import annotations

from ..engines.facts import REFERENCE, needed_features, version_key
from . import catalogue as rule
from .base import Context, check

# RoPE types whose rotary table vLLM may resize (>= 0.33 `_CACHE_ONLY_ROPE_TYPES`); any other type keeps the
# drafter's max_position_embeddings, and under Model Runner V2 the server's max_model_len follows it.
CACHE_ONLY_ROPE = ("default", "linear", "llama3", "ntk", "proportional")


@check
def engine_version(ctx: Context) -> None:
    version = ctx.engine_version
    if version is None:
        return
    mine = version_key(version)
    for f in needed_features("vllm", ctx.spec, ctx.dialect.config_style):
        if f.release is not None and mine < version_key(f.release):
            ctx.emit(rule.ENGINE_VERSION_UNSERVED, f"vLLM {version} does not serve {f.feature} (from {f.release}): "
                     f"{f.note}", ctx.where)
        elif f.release is None and mine < version_key(REFERENCE["vllm"]):
            ctx.emit(rule.ENGINE_VERSION_UNCONFIRMED,
                     f"vLLM {version}: {f.feature} needs {f.since}, whose first release "
                     f"is unconfirmed ({REFERENCE['vllm']} has it): {f.note}", ctx.where)


@check
def draft_context_cap(ctx: Context) -> None:
    """vLLM >= 0.33 (`_limit_max_model_len_to_draft`, V2 only): a draft whose RoPE is not cache-only keeps its own
    length, and the target's max_model_len is lowered to it. Without --engine-version: the current release's
    behaviour; with one older than 0.33: nothing (0.32 raised the draft's length to the target's instead)."""
    version = ctx.engine_version
    if ctx.target is None or (version is not None and version_key(version) < (0, 33)):
        return
    spec = ctx.spec
    scaling = spec.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if kind in CACHE_ONLY_ROPE or spec.max_position_embeddings is None:
        return
    factor = scaling.get("factor") if kind == "dynamic" else 1
    draft_len = int(spec.max_position_embeddings * (factor if isinstance(factor, (int, float)) and factor else 1))
    target_len = ctx.target.config.int("max_position_embeddings", lo=1)
    if target_len is not None and draft_len < target_len:
        ctx.emit(rule.DRAFT_CONTEXT_CAP, f"{kind} RoPE, max_position_embeddings {spec.max_position_embeddings} "
                 f"< the target's {target_len}: a GPU server (Model Runner V2) on vLLM "
                 f"{version or '0.33'} serves at most {draft_len} tokens of context", ctx.at("max_position_embeddings"))
