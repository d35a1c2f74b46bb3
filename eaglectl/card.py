"""Model cards for drafters: write README.md front-matter and body, and lint an existing card
against the checkpoint (claims that contradict the files are findings)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from . import __version__
from .inspection import InspectReport
from .rules import Finding, same_model

CARD = "README.md"


def _card_tags(rep: InspectReport, engine_tags: tuple[str, ...] = ("vllm",)) -> list[str]:
    tags = ["speculative-decoding", "eagle3"]
    if rep.spec.eagle_version.startswith("3.1"):
        tags.append("eagle3.1")
    if rep.dialect.name == "speculators":
        tags.append("speculators")
    return tags + list(engine_tags)


def _base_model(rep: InspectReport, target: str | None) -> str | None:
    from .formats import config_get

    if target:
        return target
    verifier = config_get(_config(rep), "speculators_config.verifier.name_or_path")
    return verifier if isinstance(verifier, str) else None


def _config(rep: InspectReport) -> dict[str, Any]:
    path = rep.inputs.get("config")
    return json.loads(Path(path).read_text()) if path and Path(path).is_file() else {}


def render_card(rep: InspectReport, *, target: str | None, smoke: dict[str, Any] | None, existing: Any | None) -> str:
    """README.md text: front-matter (base_model, tags, license kept) and a body generated from the files."""
    from huggingface_hub import ModelCard, ModelCardData

    data = existing.data.to_dict() if existing is not None else {}
    base = _base_model(rep, target)
    if base:
        data["base_model"] = base
    data["tags"] = sorted(set(data.get("tags") or []) | set(_card_tags(rep)))
    prov = _config(rep).get("eaglectl_provenance") or {}
    spec = rep.spec
    lines = [
        f"# EAGLE-{spec.eagle_version} drafter", "",
        f"Speculative-decoding drafter (EAGLE-{spec.eagle_version}, {spec.arch}) for `{base or 'its target'}`, "
        f"in the `{rep.dialect.name}` layout ({rep.dialect.title}).", "",
        "## Serve with vLLM", "", "```bash", _serve(rep, base), "```", "",
        "## Drafter", "",
        "| field | value |", "|---|---|",
        f"| EAGLE version | {spec.eagle_version} |",
        f"| dialect | {rep.dialect.name} |",
        f"| aux layer ids (vLLM convention) | {list(spec.aux_layer_ids_vllm) if spec.aux_layer_ids_vllm else 'engine default'} |",
        f"| draft vocab | {spec.draft_vocab_size or spec.vocab_size} of {spec.vocab_size} |",
        f"| flags | " + ", ".join(f"{f}={str(getattr(spec, f)).lower()}" for f in
                                  ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")) + " |",
        "",
    ]
    if smoke is not None:
        lines += ["## Acceptance", "",
                  f"Measured with `eaglectl smoke` ({smoke['engine']}, vLLM {smoke['versions'].get('vllm_version', '-')}, "
                  f"k={smoke['num_speculative_tokens']}, {smoke['dtype']}, greedy, {smoke['prompts']['description']}, "
                  f"{smoke['max_tokens']} new tokens):", "",
                  "| k | mean acceptance length | per-position acceptance |", "|---|---|---|",
                  f"| {smoke['num_speculative_tokens']} | {smoke['mean_acceptance_length']:.3f} | "
                  + " / ".join(f"{x:.2f}" for x in smoke["per_position_acceptance"]) + " |", ""]
    lines += ["## Provenance", "", f"Card written by eaglectl {__version__}."]
    if prov:
        lines.append(f"Converted by {prov.get('tool')} ({prov.get('operation')}) from `{prov.get('source')}` "
                     f"({prov.get('source_dialect')}, {prov.get('source_digest')}).")
        if prov.get("needs_fine_tuning"):
            lines.append(f"**Structurally upgraded (fc_norm init: {prov.get('fc_norm_init')}); it needs EAGLE-3.1 "
                         "fine-tuning before it is a true 3.1 drafter.**")
    card = ModelCard.from_template(ModelCardData(**data), template_str="---\n{{ card_data }}\n---\n\n{{ body }}\n",
                                   body="\n".join(lines))
    return str(card)


def _serve(rep: InspectReport, base: str | None) -> str:
    """The vLLM line for the published repo: a local folder's path means nothing on the Hub."""
    cfg = dict(rep.speculative_config)
    if not rep.inputs.get("repo_id"):
        cfg["model"] = "<org>/<this-drafter>"
    return f"vllm serve {base or '<target-model>'} --speculative-config '{json.dumps(cfg)}'"


def write_card(folder: Path, text: str) -> Path:
    path = folder / CARD
    fd, tmp = tempfile.mkstemp(prefix=".README.", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def load_card(folder: Path) -> Any | None:
    from huggingface_hub import ModelCard

    path = folder / CARD
    return ModelCard.load(path) if path.is_file() else None


def lint_card(card: Any, rep: InspectReport, target: str | None) -> list[Finding]:
    """Claims of an existing card that contradict the checkpoint."""
    where = f"{Path(rep.inputs['root']) / CARD}"
    out: list[Finding] = []
    data = card.data.to_dict()
    tags = set(data.get("tags") or [])
    base = _base_model(rep, target)
    claimed = data.get("base_model")
    if isinstance(claimed, list):
        claimed = claimed[0] if claimed else None
    if base and claimed and not same_model(claimed, base):
        out.append(Finding("card-base-model", f"card says base_model '{claimed}', the drafter's target is '{base}'",
                           f"{where}:base_model"))
    is31 = rep.spec.eagle_version.startswith("3.1")
    if "eagle3.1" in tags and not is31:
        out.append(Finding("card-eagle-version", f"card tags eagle3.1, the files are EAGLE-{rep.spec.eagle_version}",
                           f"{where}:tags"))
    if is31 and "eagle3.1" not in tags:
        out.append(Finding("card-eagle-version", f"the files are EAGLE-{rep.spec.eagle_version}, the card does not "
                           "say eagle3.1", f"{where}:tags"))
    if not {"speculative-decoding", "eagle3"} <= tags:
        out.append(Finding("card-tags", "card lacks the speculative-decoding / eagle3 tags", f"{where}:tags"))
    ks = {int(m) for m in re.findall(r'"num_speculative_tokens"\s*:\s*(\d+)', card.text)}
    k_files = rep.speculative_config.get("num_speculative_tokens")
    if rep.dialect.name == "speculators" and ks and k_files not in ks:
        out.append(Finding("card-k", f"card snippet uses num_speculative_tokens {sorted(ks)}, the speculators config "
                           f"says {k_files}", where))
    for name in ("eagle", "specforge", "speculators", "torchspec", "modelopt", "nemo"):
        if name != rep.dialect.name and re.search(rf"`{name}` layout", card.text):
            out.append(Finding("card-dialect", f"card claims the {name} layout, the files are {rep.dialect.name}", where))
    prov = _config(rep).get("eaglectl_provenance") or {}
    if prov.get("needs_fine_tuning") and "fine-tun" not in card.text.lower():
        out.append(Finding("card-provenance", "the drafter was structurally upgraded and needs fine-tuning; the card "
                           "does not say so", where))
    return out

