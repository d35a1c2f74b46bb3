"""Model cards for drafters: README.md front-matter and body generated from the files.

The card names models by Hub identity only: `--base-model`, else the target's Hub repo (or its
config's `_name_or_path` when that is a Hub id), else the speculators verifier when that is one.
A local path is never written as an identity. Linting an existing card lives in `rules/card.py`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import __version__
from ..checkpoint.speculation_profile import number
from ..checkpoint.target import is_hub_id
from ..engines.serving import serve_line, speculative_config
from ..errors import CorruptCheckpointError
from ..io.bounded import read_regular
from ..limits import limit
from .inspect import InspectReport

CARD = "README.md"


def base_model(rep: InspectReport, explicit: str | None = None) -> str | None:
    """The drafter's target as a Hub id, or None when no Hub identity is known."""
    if explicit:
        return explicit
    if rep.target is not None and rep.target.hub_id:
        return rep.target.hub_id
    verifier = rep.drafter.config.str("speculators_config.verifier.name_or_path")
    if verifier and rep.target is not None and rep.target.ckpt.hub_ref is None \
            and os.path.abspath(verifier) == os.path.abspath(rep.target.source):
        return None  # the verifier spells the local --target folder: a path, not an identity
    return verifier if is_hub_id(verifier) else None


def render_card(rep: InspectReport, *, base: str | None, smoke: dict[str, Any] | None, existing: Any | None,
                profile: dict[str, Any] | None = None) -> str:
    """README.md text: front-matter (base_model, tags; license and other keys kept) and a generated body."""
    from huggingface_hub import ModelCard, ModelCardData

    data = existing.data.to_dict() if existing is not None else {}
    if base:
        data["base_model"] = base
    elif isinstance(data.get("base_model"), str) and not is_hub_id(data["base_model"]):
        data.pop("base_model")  # a local path is no identity
    tags = {"speculative-decoding", "eagle3", "vllm"}
    if rep.drafter.spec.eagle_version.startswith("3.1"):
        tags.add("eagle3.1")
    if rep.drafter.dialect.config_style == "speculators":
        tags.add("speculators")
    data["tags"] = sorted({t for t in (data.get("tags") or []) if isinstance(t, str)} | tags)
    prov = rep.drafter.config.sub("eaglectl_provenance")
    spec = rep.drafter.spec
    lines = [
        f"# EAGLE-{spec.eagle_version} drafter", "",
        f"Speculative-decoding drafter (EAGLE-{spec.eagle_version}, {spec.arch}) for `{base or 'its target'}`, "
        f"in the `{rep.drafter.dialect.name}` layout ({rep.drafter.dialect.title}).", "",
        "## Serve with vLLM", "", "```bash", _serve(rep, base), "```", "",
        "## Drafter", "",
        "| field | value |", "|---|---|",
        f"| EAGLE version | {spec.eagle_version} |",
        f"| dialect | {rep.drafter.dialect.name} |",
        f"| aux layer ids (vLLM convention) | "
        f"{list(spec.aux_layer_ids_vllm) if spec.aux_layer_ids_vllm else 'engine default'} |",
        f"| draft vocab | {spec.draft_vocab_size or spec.vocab_size} of {spec.vocab_size} |",
        "| flags | " + ", ".join(f"{f}={str(getattr(spec, f)).lower()}" for f in
                                 ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")) + " |",
        "",
    ]
    if smoke is not None and smoke.get("mean_acceptance_length") is not None:
        lines += ["## Acceptance", "",
                  "Measured with `eaglectl smoke` ("
                  + (f"vLLM {smoke['versions'].get('vllm_version', '-')}" if smoke["engine"] == "vllm" else
                     "eaglectl's reference loop, which counts as vLLM does") + ", "
                  f"k={smoke['num_speculative_tokens']}, {smoke['dtype']}, greedy, {smoke['prompts']['description']}, "
                  f"{smoke['max_tokens']} new tokens):", "",
                  "| k | mean acceptance length | per-position acceptance |", "|---|---|---|",
                  f"| {smoke['num_speculative_tokens']} | {smoke['mean_acceptance_length']:.3f} | "
                  + " / ".join(f"{x:.2f}" for x in smoke["per_position_acceptance"]) + " |", ""]
    if profile is not None:
        lines += profile_section(profile)
    lines += ["## Provenance", "", f"Card written by eaglectl {__version__}."]
    if prov.present:
        source = prov.str("source") or "?"
        shown = source if is_hub_id(source.split("@")[0]) else Path(source).name or source
        lines.append(f"Converted by {prov.str('tool')} ({prov.str('operation')}) from `{shown}` "
                     f"({prov.str('source_dialect')}, {prov.str('source_digest')}).")
        if prov.bool("needs_fine_tuning"):
            lines.append(f"**Structurally upgraded (fc_norm init: {prov.str('fc_norm_init')}); it needs EAGLE-3.1 "
                         "fine-tuning before it is a true 3.1 drafter.**")
            lines += _upgrade_acceptance(prov.dict("acceptance"))
    card = ModelCard.from_template(ModelCardData(**data), template_str="---\n{{ card_data }}\n---\n\n{{ body }}\n",
                                   body="\n".join(lines))
    return str(card)


def profile_section(p: dict[str, Any]) -> list[str]:
    """The measured figures of a (validated, measured) speculation_profile.json, as card lines."""

    cond = p.get("measurement_conditions") or {}
    said = ", ".join(f"{k} {cond[k]}" for k in ("engine", "engine_version", "runner", "dtype", "dataset", "num_samples",
                                                 "osl") if cond.get(k) is not None)
    rows = [f"| {i + 1} | {c:.3f} | {m:.3f} |" for i, (c, m) in
            enumerate(zip(p["conditional_accept_rates"], p["marginal_accept_rates"], strict=True))]
    per_request = p.get("mean_accept_length_per_request")
    return ["## Measured acceptance (speculation_profile.json)", "",
            f"k = {p['num_speculative_tokens']}, mean acceptance length {p['mean_accept_length']:.3f} per decode step"
            + (f" ({per_request:.3f} averaged per request)" if number(per_request) else "")
            + (f"; {said}" if said else "") + ".", "",
            "| draft position | conditional acceptance | marginal acceptance |", "|---|---|---|", *rows, ""]
def _upgrade_acceptance(acc: dict[str, Any] | None) -> list[str]:
    """The upgrade's measured acceptance lengths before and after, and on which prompts (provenance)."""
    if not isinstance(acc, dict) or not isinstance(acc.get("prompts"), dict):
        return ["", "Acceptance before and after the upgrade was not measured (no runnable target).", "",
                "Warm start: fine-tune before publishing."]
    p, i = acc["prompts"], acc.get("interval")
    where = ("the user's prompts `" + str(p.get("source")) + "`") if p.get("given") else "prompts bundled with eaglectl"
    line = (f"Acceptance length before -> after the upgrade: {acc.get('before')} -> {acc.get('after')} "
            f"(k={p.get('k')}, greedy, {p.get('count')} prompts x {p.get('max_tokens')} tokens from {where}: "
            f"{p.get('description')}; {acc.get('reading')} reading, eaglectl's reference loop, whose counts equal "
            f"vLLM's; prompts {p.get('digest')})")
    if isinstance(i, dict):
        line += (f"; 95% bootstrap interval over the prompts: before {i['before'][0]}-{i['before'][1]}, after "
                 f"{i['after'][0]}-{i['after'][1]}")
    return ["", line + ".", "", "Warm start: fine-tune before publishing."]


def _serve(rep: InspectReport, base: str | None) -> str:
    """The vLLM line for the published repo: a local folder's path means nothing on the Hub."""

    if rep.wrong_layers():  # the line would serve other layers than the drafter reads: say what to run instead
        fix = rep.serve_fix()
        return ("# no serve line: vLLM would serve this drafter on other target layers than it reads"
                + (f"; run first:\n# {fix}" if fix else ""))
    cfg = speculative_config(rep.drafter)
    if rep.drafter.ckpt.hub_ref is None:
        cfg["model"] = "<org>/<this-drafter>"
    return serve_line(base or "<target-model>", cfg)


def load_card(folder: Path) -> Any | None:
    """README.md as huggingface_hub's ModelCard (None when there is none): read whole only within `card_bytes`
    (a larger card, or a FIFO or device, is a CorruptCheckpointError naming it), parsed as ModelCard.load does."""
    from huggingface_hub import ModelCard


    path = folder / CARD
    if not path.exists():
        return None
    raw = read_regular(path, lambda p, why: CorruptCheckpointError(f"{p}: {why} (the model card)", file=p),
                       limit("card_bytes"), doing="read the model card")
    try:
        return ModelCard(raw.decode("utf-8-sig"))
    except Exception as e:  # noqa: BLE001 - a malformed card (YAML, not UTF-8) is the user's file: report it
        raise CorruptCheckpointError(f"{path}: the model card cannot be parsed ({type(e).__name__})",
                                     file=str(path)) from None
