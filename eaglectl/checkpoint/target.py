"""A target's files: its config (typed), lazy access to its tables, its Hub identity (`TargetCheckpoint`).
Nothing here runs the target: `measure/target.py` loads it once for a command."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import counters as loads
from ..errors import CheckpointNotFoundError, CorruptCheckpointError, UnknownFormatError
from ..io.checkpoint import Checkpoint, open_checkpoint
from ..io.hub import parse_hub_id
from ..io.jsonio import ConfigView
from ..io.states import States
from ..limits import limit

if TYPE_CHECKING:
    pass

EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "model.language_model.embed_tokens.weight",
               "language_model.model.embed_tokens.weight")


def is_hub_id(name: str | None) -> bool:
    """`name` is a Hub identity (org/name[@rev]), not a local path: a folder that exists here, or any
    path-looking spelling, is never taken for one."""
    return bool(name) and parse_hub_id(name) is not None and not name.startswith(("/", ".", "~")) \
        and not Path(name).exists()  # type: ignore[arg-type]


@dataclass
class TargetCheckpoint:
    source: str
    ckpt: Checkpoint
    config: ConfigView  # the text config (multimodal targets nest it in `text_config`)
    known_hub_id: str | None = None  # recorded elsewhere (a capture's capture.json)

    @property
    def num_layers(self) -> int | None:
        return self.config.int("num_hidden_layers", lo=1, hi=limit("target_layers"))

    @property
    def hidden_size(self) -> int | None:
        return self.config.int("hidden_size", lo=1)

    @property
    def vocab_size(self) -> int | None:
        return self.config.int("vocab_size", lo=1)

    @property
    def rope_theta(self) -> float | None:
        theta = self.config.float("rope_theta", lo=1e-9)
        return theta if theta is not None else self.config.float("rope_parameters.rope_theta", lo=1e-9)

    @property
    def architectures(self) -> tuple[str, ...]:
        top = ConfigView(self.ckpt.config, self.config.where)
        return top.str_list("architectures") or ()

    @property
    def hub_id(self) -> str | None:
        """The target's Hub identity: its repo when opened from the Hub, else `_name_or_path` when that
        is a Hub id (never a local path)."""
        if self.known_hub_id is not None:
            return self.known_hub_id
        if self.ckpt.hub_ref is not None:
            return self.ckpt.hub_ref.repo_id
        name = ConfigView(self.ckpt.config, self.config.where).str("_name_or_path")
        return name if is_hub_id(name) else None

    def table_name(self, which: str) -> str | None:
        """The stored name of the target's `embed_tokens` or `lm_head` (a tied target's head is its embedding)."""
        names = self.ckpt.tensor_file
        embed = next((n for n in EMBED_NAMES if n in names), None)
        if which == "embed_tokens":
            return embed
        head = next((n for n in ("lm_head.weight", "language_model.lm_head.weight") if n in names), None)
        return head or embed

    def why_not_runnable(self) -> str | None:
        """Why the probe cannot run this target (None: it can): it needs weights and a tokenizer."""
        if not self.ckpt.tensor_file:
            return f"{self.source}: the target has no weights here (config only), so nothing could be measured"
        if not any(n in self.ckpt.file_names for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            return f"{self.source}: the target has no tokenizer, so no text can be given to it and nothing was measured"
        return None

    def summary(self) -> dict[str, Any]:
        c = self.config
        out: dict[str, Any] = {
            "architectures": list(self.architectures) or None, "model_type": c.str("model_type"),
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers, "vocab_size": self.vocab_size,
            "rope_theta": self.rope_theta, "tie_word_embeddings": c.bool("tie_word_embeddings"), "source": self.source,
        }
        if self.ckpt.hub_ref is not None:
            out["revision"] = self.ckpt.hub_ref.sha
        return out


def open_target(source: str) -> TargetCheckpoint:
    """A target model: its config (required) and lazy access to its weights when present."""
    loads.count("target_config")
    ckpt = open_checkpoint(source, weights_required=False)
    if ckpt.config is None:
        raise CheckpointNotFoundError(f"{source}: target has no config.json", path=source)
    why = looks_like_drafter(ckpt)
    if why:
        raise UnknownFormatError(f"{source}: this looks like an EAGLE drafter ({why}), not a target model",
                                 path=source, hint="give the target model as --target and this drafter as SOURCE")
    top = ckpt.config_view
    text = top.sub("text_config") if top.dict("text_config") is not None else top
    out = TargetCheckpoint(source, ckpt, text)
    validate(out)
    return out


def validate(target: TargetCheckpoint) -> None:
    """Refuse a target config whose fields eaglectl reads (or hands to transformers) are of the wrong type or out
    of bounds, naming the first such key: a depth of "8", 0 or 10**12 would otherwise size the aux ids or the run
    (limits.py bounds it)."""
    _ = target.num_layers, target.hidden_size, target.vocab_size, target.rope_theta
    target.config.str("model_type")  # transformers looks it up in its table: a list is unhashable there
    top = ConfigView(target.ckpt.config, target.config.where)
    top.str_list("architectures")
    bad = next(iter({**target.config.problems, **top.problems}.items()), None)
    if bad is not None:
        key, message = bad
        raise CorruptCheckpointError(f"{target.config.where}: {message}", path=target.source, key=key,
                                     hint="fix the value in the target's config.json")


def looks_like_drafter(ckpt: Checkpoint) -> str | None:
    """Why a --target is an EAGLE drafter rather than a model (the reverse of formats.looks_like_target):
    a speculators / EAGLE config, or an fc that fuses aux states beside one (rarely a few) decoder layers."""
    config = ckpt.config or {}
    for key in ("speculators_model_type", "speculators_config", "eagle_config"):
        if key in config:
            return f"its config has '{key}'"
    archs = config.get("architectures")
    if isinstance(archs, list) and any(isinstance(a, str) and "eagle" in a.lower() for a in archs):
        return f"architectures {archs[0]}"
    names = list(ckpt.tensor_file)
    if any(n == "fc.weight" or n.endswith((".fc.weight", "midlayer.hidden_norm.weight")) for n in names):
        layers = {m.group(1) for n in names if (m := re.search(r"(?:^|\.)layers\.(\d+)\.", n))}
        if len(layers) <= 2:
            return f"fc.weight and {len(layers) or 'no'} decoder layer(s)"
    return None


def target_of_capture(states: States) -> TargetCheckpoint:
    """The target a capture (`--states`, io/states.py) was taken from, as far as its capture.json records
    it: config and identity, no weights (so never runnable: its states stand in for running it)."""
    text = states.target_config
    ckpt = Checkpoint(states.target or str(states.root), str(states.root), "safetensors", [], {},
                      states.meta.get("target_config") if text.present else None, text.where)
    hub_id = states.meta.get("target_hub_id")
    return TargetCheckpoint(ckpt.source, ckpt, text, hub_id if isinstance(hub_id, str) else None)
