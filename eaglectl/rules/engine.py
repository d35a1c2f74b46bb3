"""`--engine-version X.Y`: findings scoped to what that vLLM release serves (engines.FEATURES)."""

from __future__ import annotations

from ..engines import REFERENCE, needed_features, version_key
from . import ERROR, WARNING, Context, check, rule

ENGINE_VERSION_UNSERVED = rule("engine-version-unserved", ERROR,
                               "The given vLLM release does not serve a feature this drafter uses",
                               "serve it with the release named (docs/engines.md#features) or newer")
ENGINE_VERSION_UNCONFIRMED = rule("engine-version-unconfirmed", WARNING,
                                  "Whether the given vLLM release serves a feature this drafter uses is unconfirmed",
                                  f"serve it with vLLM {REFERENCE['vllm']} or newer (eaglectl's reference release)")


@check
def engine_version(ctx: Context) -> None:
    version = getattr(ctx, "engine_version", None)
    if version is None:
        return
    mine = version_key(version)
    for f in needed_features("vllm", ctx.spec, ctx.drafter.dialect.hf_style):
        if f.release is not None and mine < version_key(f.release):
            ctx.emit(ENGINE_VERSION_UNSERVED, f"vLLM {version} does not serve {f.feature} (from {f.release}): "
                     f"{f.note}", ctx.where)
        elif f.release is None and mine < version_key(REFERENCE["vllm"]):
            ctx.emit(ENGINE_VERSION_UNCONFIRMED, f"vLLM {version}: {f.feature} needs {f.since}, whose first release "
                     f"is unconfirmed ({REFERENCE['vllm']} has it): {f.note}", ctx.where)
