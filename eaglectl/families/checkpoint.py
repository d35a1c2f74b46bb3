"""A drafter of a family eaglectl reads beside EAGLE-3 (formats/families.py): its files, the family named with the
evidence, and its canonical spec, all from the config and the safetensors headers (no tensor data is read).

DFlash and DSpark are opened here (`open_any`); a P-EAGLE drafter is an EAGLE-3 drafter (checkpoint/drafter.py)
whose family rules view it through this class too (families/rules.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..checkpoint.drafter import DrafterCheckpoint, interpret, open_files, probe_of
from ..errors import UnknownFormatError
from ..formats.families import DSPARK_ANCHOR, AnchorReading, Family, Layout, identify, layout_of
from ..io.checkpoint import Checkpoint
from ..io.jsonio import MISSING, config_get

HEAD = "lm_head.weight"


@dataclass
class FamilyCheckpoint:
    ckpt: Checkpoint
    family: Family
    evidence: tuple[str, ...]

    @property
    def eagle3_layout(self) -> bool:
        """EAGLE-3's dialects read these files (P-EAGLE); else only this package does (DFlash, DSpark)."""
        return self.family.reading is not None and self.family.reading.eagle3_layout

    @functools.cached_property
    def layout(self) -> Layout | None:
        """The producer's layout these files are in (formats/families.LAYOUTS; None: the family has none)."""
        return layout_of(self.family, probe_of(self.ckpt))

    @property
    def source(self) -> str:
        return self.ckpt.source

    @property
    def config(self) -> dict[str, Any]:
        return self.ckpt.config or {}

    def field(self, name: str) -> tuple[Any, str | None]:
        """The spec field `name` (Reading.fields) and the config key it was read from; (None, None) when absent."""
        assert self.family.reading is not None
        keys = dict(self.family.reading.fields).get(name, (name,))
        for key in keys:
            value = config_get(self.config, key)
            if value is not MISSING and value is not None:
                return value, key
        return None, None

    def int_field(self, name: str) -> int | None:
        value, _ = self.field(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def tensor(self, name: str) -> str | None:
        """The stored name of tensor `name` (exact, or under a prefix such as NeMo's `model.`)."""
        names = self.ckpt.tensor_file
        return name if name in names else next((n for n in names if n.endswith("." + name)), None)

    def shape(self, name: str) -> tuple[int, ...] | None:
        stored = self.tensor(name)
        return tuple(self.ckpt.tensor_file[stored].header.tensors[stored].shape) if stored is not None else None

    @property
    def own_head(self) -> bool:
        """The drafter ships its own lm_head; without one vLLM uses the target's (has_own_lm_head)."""
        return self.tensor(HEAD) is not None

    @property
    def draft_vocab(self) -> int | None:
        """The vocabulary vLLM sizes the draft's head and d2t by: draft_vocab_size, else vocab_size."""
        return self.int_field("draft_vocab_size") or self.int_field("vocab_size")

    @property
    def anchor_style(self) -> str:
        """The config style DSpark's engines read sample_from_anchor from (formats/families.DSPARK_ANCHOR)."""
        return "speculators" if self.config.get("speculators_model_type") == "dspark" else "hf"

    def anchor_reads(self) -> list[tuple[AnchorReading, bool | None]]:
        """What each engine reads of DSpark's sample_from_anchor here: the config's value when it holds a boolean,
        else the engine's default (None: the engine loads no config of this style). Empty for other families."""
        if self.family.id != "dspark":
            return []
        raw = self.config.get("sample_from_anchor")
        return [(r, r.default if r.default is None or not isinstance(raw, bool) else raw)
                for r in DSPARK_ANCHOR if r.style == self.anchor_style]

    def spec(self) -> dict[str, Any]:
        """The canonical spec: each declared field with the key it came from, then what the weights say."""
        reading = self.family.reading
        assert reading is not None
        out: dict[str, Any] = {"family": self.family.id, "method": reading.method}
        archs = self.config.get("architectures")
        out["architecture"] = archs[0] if isinstance(archs, list) and archs else None
        for name, _ in reading.fields:
            value, key = self.field(name)
            out[name] = value
            if key is not None and name in ("layer_ids", "mask_token_id", "block_size"):
                out[f"{name}_key"] = key
        if "layer_ids" in dict(reading.fields):
            out["layer_numbering"] = reading.numbering
        head = self.shape(HEAD)
        out["head"] = "own" if head is not None else "target's"
        out["head_rows"] = head[0] if head else None
        out["embed_tokens"] = "own" if self.tensor("embed_tokens.weight") is not None else "target's"
        out["d2t"] = self.tensor("d2t") is not None
        reads = {f"{r.engine} {r.releases}": value for r, value in self.anchor_reads()}
        if reads:
            out["sample_from_anchor"] = reads
        if reading.mask_hidden:
            out["mask_hidden_shape"] = list(self.shape("mask_hidden") or []) or None
        return out


def open_any(source: str, *, from_dialect: str | None = None, allow_pickle: bool = False,
             revision: str | None = None) -> DrafterCheckpoint | FamilyCheckpoint:
    """SOURCE as an EAGLE-3 drafter (P-EAGLE among them), else as a drafter of a family read in its own layout
    (DFlash, DSpark: the refusal names its `family_id`); anything else is refused as open_drafter refuses it."""
    return interpret_any(open_files(source, allow_pickle=allow_pickle, revision=revision), from_dialect)


def interpret_any(ckpt: Checkpoint, from_dialect: str | None = None) -> DrafterCheckpoint | FamilyCheckpoint:
    """Opened files as open_any reads them (the files are opened once, whichever reading holds)."""
    try:
        return interpret(ckpt, from_dialect)
    except UnknownFormatError as e:
        if "family_id" not in e.context:
            raise
        found = of_checkpoint(ckpt, own_layout=True)
        if found is None:
            raise
        return found


def of_checkpoint(ckpt: Checkpoint, *, own_layout: bool = False) -> FamilyCheckpoint | None:
    """The read family these opened files belong to (own_layout: only one outside the EAGLE-3 layout)."""
    found = identify(probe_of(ckpt))
    if found is None or found[0].reading is None or (own_layout and found[0].reading.eagle3_layout):
        return None
    return FamilyCheckpoint(ckpt, found[0], found[1])


def family_of(opened: DrafterCheckpoint | FamilyCheckpoint) -> FamilyCheckpoint | None:
    """The family view of what a command opened: itself for a family in its own layout, the family an EAGLE-3-layout
    drafter belongs to (P-EAGLE), or None for a plain EAGLE-3 drafter."""
    return opened if isinstance(opened, FamilyCheckpoint) else of_checkpoint(opened.ckpt)
