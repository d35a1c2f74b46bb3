"""Model-card claims that contradict the checkpoint (`check` lints an existing README.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import formats
from ..checkpoint.drafter import DrafterCheckpoint
from ..checkpoint.speculation_profile import FILE, read, validate
from ..errors import EaglectlError
from . import catalogue as rule
from .base import Context, Finding
from .target import same_model

if TYPE_CHECKING:
    from huggingface_hub import ModelCard


def lint_profile(folder: Path, drafter: DrafterCheckpoint) -> tuple[dict[str, Any] | None, list[Finding]]:
    """The profile found beside the drafter when it is valid and measured (for the card), and the findings."""

    path = folder / FILE
    if not path.exists():  # a FIFO or device is reported by read, never opened
        return None, []
    ctx = Context(drafter)
    try:
        profile = read(path)
    except EaglectlError as e:
        ctx.emit(rule.PROFILE_INVALID, e.message, str(path))
        return None, ctx.findings
    problems = validate(profile)
    if problems:
        ctx.emit(rule.PROFILE_INVALID, f"{FILE}: {problems[0]}"
                 + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""), str(path))
    elif profile.get("measured") is False:
        ctx.emit(rule.PROFILE_UNMEASURED, f"{FILE} says measured: false", str(path))
    return (None if ctx.findings else profile), ctx.findings


def lint_card(card: ModelCard, drafter: DrafterCheckpoint, base_model: str | None, k: int | None) -> list[Finding]:
    """Claims of an existing card that contradict the checkpoint. `base_model` is the drafter's target
    as a Hub id (None when unknown), `k` the speculators config's proposal length."""
    where = f"{Path(drafter.root) / 'README.md'}"
    ctx = Context(drafter)
    data = card.data.to_dict()
    tags = {t for t in (data.get("tags") or []) if isinstance(t, str)}
    claimed = data.get("base_model")
    if isinstance(claimed, list):
        claimed = claimed[0] if claimed else None
    if isinstance(claimed, str) and claimed.startswith(("/", "./", "../", "~")):
        ctx.emit(rule.CARD_LOCAL_PATH, f"card says base_model '{claimed}', a local path", f"{where}:base_model")
    elif base_model and isinstance(claimed, str) and not same_model(claimed, base_model):
        ctx.emit(rule.CARD_BASE_MODEL, f"card says base_model '{claimed}', the drafter's target is '{base_model}'",
                 f"{where}:base_model")
    version = drafter.spec.eagle_version
    is31 = version.startswith("3.1")
    if "eagle3.1" in tags and not is31:
        ctx.emit(rule.CARD_EAGLE_VERSION, f"card tags eagle3.1, the files are EAGLE-{version}", f"{where}:tags")
    if is31 and "eagle3.1" not in tags:
        ctx.emit(rule.CARD_EAGLE_VERSION, f"the files are EAGLE-{version}, the card does not say eagle3.1",
                 f"{where}:tags")
    if not {"speculative-decoding", "eagle3"} <= tags:
        ctx.emit(rule.CARD_TAGS, "card lacks the speculative-decoding / eagle3 tags", f"{where}:tags")
    ks = {int(m) for m in re.findall(r'"num_speculative_tokens"\s*:\s*(\d{1,3})', card.text)}
    if drafter.dialect.config_style == "speculators" and ks and k not in ks:
        ctx.emit(rule.CARD_K, f"card snippet uses num_speculative_tokens {sorted(ks)}, the speculators config "
                 f"says {k}", where)
    for name in formats.names():
        if name != drafter.dialect.name and re.search(rf"`{re.escape(name)}` layout", card.text):
            ctx.emit(rule.CARD_DIALECT, f"card claims the {name} layout, the files are {drafter.dialect.name}", where)
    if drafter.config.bool("eaglectl_provenance.needs_fine_tuning") and "fine-tun" not in card.text.lower():
        ctx.emit(rule.CARD_PROVENANCE, "the drafter was structurally upgraded and needs fine-tuning; the card "
                 "does not say so", where)
    return ctx.findings
