"""What publishing the folder would do (`check`'s publish stage, and `upload`, which refuses on it): no local
path in any file that would be uploaded, and the loaders a published drafter meets can load it."""

from __future__ import annotations

from pathlib import Path

from ..checkpoint.drafter import DrafterCheckpoint
from ..checkpoint.publish import is_local_path, local_paths
from . import catalogue as rule
from .base import Context, Finding, hint_values


def local_path_findings(folder: Path, values: dict[str, str] | None = None) -> list[Finding]:
    """A `local-path` finding for every path of this machine in a file an upload of `folder` would send (`values`:
    the drafter's hint placeholders)."""
    return [Finding(rule.LOCAL_PATH, f"{p.file} {p.where}: '{p.value}' is a local path; on the Hub it names nothing",
                    f"{p.file}:{p.where}", values) for p in local_paths(folder)]


def lint_publish(drafter: DrafterCheckpoint, folder: Path) -> list[Finding]:
    """Findings about publishing `folder` (the drafter's local root) as it is."""
    ctx = Context(drafter)
    ctx.findings.extend(local_path_findings(folder, hint_values(drafter)))
    if drafter.dialect.config_style == "speculators" and not drafter.spec.has_embed_tokens:
        name = (drafter.config.dict("speculators_config.verifier") or {}).get("name_or_path")
        if name is None or (isinstance(name, str) and is_local_path(name)):
            ctx.emit(rule.SPECULATORS_NULL_VERIFIER, "no embed_tokens.weight and the verifier is "
                     + ("null" if name is None else f"the local path '{name}'")
                     + ": the speculators library fetches the verifier for the missing embeddings and "
                     "fails (vLLM serves it with --speculative-config)",
                     "config.json:speculators_config.verifier.name_or_path")
    return ctx.findings
