"""What a dialect is: detection signals, key renames and config placement, all declared as data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..io.jsonio import MISSING, config_get
from ..spec import FLAGS

# vLLM's own key for a drafter's aux ids: both of its model runners read it first, as boundary ids
# (docs/engines.md#runners), so every dialect that can carry it gets it, in that numbering (docs/convert.md#aux-ids).
VLLM_AUX_KEY = "eagle_aux_hidden_state_layer_ids"
# The training frameworks' own field for them (ModelOpt, SpecForge, TorchSpec, NeMo), in their own numbering
EAGLE_CONFIG_AUX_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"
# A writer that gives vLLM its key in vLLM's numbering and the framework its own field in the framework's
# (output-of-layer) numbering: the provenance records each field's numbering (docs/convert.md#aux-ids)
BOTH_AUX_KEYS = (VLLM_AUX_KEY, EAGLE_CONFIG_AUX_KEY)
BOTH_NUMBERINGS = {VLLM_AUX_KEY: "boundary", EAGLE_CONFIG_AUX_KEY: "output"}

# How a dialect's config.json is laid out: "hf", the decoder fields at the top level (read by vLLM's EAGLEConfig,
# sglang, TRT-LLM), or "speculators", the speculators format (decoder config nested in transformer_layer_config)
ConfigStyle = Literal["hf", "speculators"]


@dataclass(frozen=True)
class Probe:
    """What detection looks at: tensor names, config, safetensors metadata, file names."""

    tensors: frozenset[str]
    config: dict[str, Any] | None
    metadata: dict[str, str] | None
    files: frozenset[str]


@dataclass(frozen=True)
class Signal:
    """One observable fact. `kind` is one of KINDS; `value` only for config-value."""

    kind: str
    arg: str
    value: Any = None
    weight: float = 1.0

    def holds(self, p: Probe) -> bool:
        if self.kind == "tensor-prefix":
            return any(t.startswith(self.arg) for t in p.tensors)
        if self.kind == "tensor":
            return self.arg in p.tensors
        if self.kind == "tensor-contains":
            return any(self.arg in t for t in p.tensors)
        if self.kind == "config-key":
            return config_get(p.config, self.arg) not in (MISSING, None)
        if self.kind == "config-value":
            v = config_get(p.config, self.arg)
            return v == self.value or (isinstance(v, list) and self.value in v)
        if self.kind == "metadata-key":
            return self.arg in (p.metadata or {})
        if self.kind == "file":
            return any(f == self.arg or f.endswith("/" + self.arg) for f in p.files)
        raise ValueError(f"unknown signal kind {self.kind}")

    def describe(self) -> str:
        return {
            "tensor-prefix": f"tensor names start with '{self.arg}'",
            "tensor": f"tensor '{self.arg}' present",
            "tensor-contains": f"a tensor name contains '{self.arg}'",
            "config-key": f"config has '{self.arg}'",
            "config-value": f"config '{self.arg}' is {self.value!r}",
            "metadata-key": f"safetensors metadata has '{self.arg}'",
            "file": f"file '{self.arg}' present",
        }[self.kind]


def renamed(name: str, key_rules: tuple[tuple[str, str], ...], *, to_canonical: bool) -> str:
    """`name` under the first (canonical prefix, layout prefix) rule it starts with, in either direction; a name
    matching none is kept as is."""
    for canonical, ours in key_rules:
        old, new = (ours, canonical) if to_canonical else (canonical, ours)
        if name.startswith(old):
            return new + name[len(old):]
    return name


def architectures(*names: str, weight: float = 1.0) -> tuple[Signal, ...]:
    """One signal per class name: config `architectures` names it."""
    return tuple(Signal("config-value", "architectures", n, weight) for n in names)


# SafeAILab's naming of the one decoder layer, kept by SpecForge and TorchSpec: its detection signal and its rename
MIDLAYER = Signal("tensor-prefix", "midlayer.", weight=2)
MIDLAYER_KEYS = (("layers.0.", "midlayer."),)


def flag_defaults(producer: str, *, raw_residual: bool = False, **why: str) -> dict[str, tuple[bool, str]]:
    """Every flag off when absent, each with why: "<producer> default", or (`raw_residual`) the producer has no
    option for norm_before_residual and no input_norm; `why` overrides one flag's reason."""
    out = {f: (False, f"{producer} default") for f in FLAGS}
    if raw_residual:
        out["norm_before_residual"] = (False, f"{producer} has no such option: raw residual")
        out["norm_before_fc"] = (False, f"{producer} has no input_norm")
    return out | {f: (False, reason) for f, reason in why.items()}


@dataclass(frozen=True)
class Writer:
    """How eaglectl writes a dialect. What is absent here the dialect cannot represent, and a
    conversion that needs it fails with the reason (never a silent default)."""

    architectures: dict[str, str]  # arch family -> `architectures` entry; a missing family cannot be written
    aux_ids_paths: tuple[str, ...] = ()  # where aux ids go; () = cannot record
    aux_convention: str | None = None  # convention of the ids written (None: the dialect's own)
    # path -> its own convention, where it differs from `aux_convention` (vLLM's top-level key: boundary;
    # a training framework's own field: the numbering that framework reads it in)
    aux_conventions: dict[str, str] = field(default_factory=dict)
    flag_paths: dict[str, tuple[str, ...]] = field(default_factory=dict)  # flag -> paths; absent = must be False
    # flags the layout cannot express as true but writes as an explicit false, because engines
    # default an absent flag differently (vLLM's speculators reader: norm_before_residual true)
    explicit_false: tuple[str, ...] = ()
    # flags written only when true: the dialect's own loader reads an explicit false differently from an
    # absent key (SpecForge 0.2.0: norm_output false = no final norm before lm_head)
    omit_false: tuple[str, ...] = ()
    # (spec field values that all hold, message): said at write time, in the plan's warnings
    warnings: tuple[tuple[dict[str, Any], str], ...] = ()
    extra_config: dict[str, Any] = field(default_factory=dict)  # constant keys (dotted paths)
    max_layers: int | None = None
    exactly_3_aux: bool = False
    t2d: bool = True  # write t2d (derived from d2t if needed) for reduced vocabularies
    require_embed_tokens: bool = False
    allowed_tensors: tuple[str, ...] | None = None  # regexes of canonical names it can hold (None: all)
    # a read family in the EAGLE-3 layout (formats/families.py) that this writer writes in a form of its own: family id
    # -> (model type, architecture); others are written as EAGLE-3 (speculators: P-EAGLE is its `peagle` type)
    family_forms: dict[str, tuple[str, str]] = field(default_factory=dict)
    # canonical tensor -> the rank it is stored at, leading ones added or dropped (the bytes unchanged): P-EAGLE's
    # mask_hidden is [1, n] in the HF layouts and [1, 1, n] in speculators' PEagleDraftModel (vLLM takes either)
    ranks: dict[str, int] = field(default_factory=lambda: {"mask_hidden": 2})

    def aux_fields(self, dialect_convention: str) -> tuple[tuple[str, str], ...]:
        """(path, convention) of every aux-id field written, in order."""
        default = self.aux_convention or dialect_convention
        return tuple((p, self.aux_conventions.get(p, default)) for p in self.aux_ids_paths)


@dataclass(frozen=True)
class Caveat:
    """A fact the files cannot settle for this dialect: rule `rule` fires, about spec field `subject`,
    when every spec field in `when` has the given value (e.g. SpecForge's norm_output window)."""

    rule: str
    when: dict[str, Any]
    subject: str
    message: str
    explicit: tuple[str, ...] = ()  # spec fields that must be set by the config (not defaulted)
    # a norm weight that settles the caveat from the weights (rules/norms.py): trained (its values vary), the later
    # meaning holds and nothing is said; constant, it was never trained: rule `untrained_rule` says `untrained`
    settled_by: str | None = None
    untrained: str = ""
    untrained_rule: str = ""


@dataclass(frozen=True)
class Dialect:
    """A checkpoint dialect. Every field is data; `formats/__init__.py` interprets them."""

    name: str  # stable id used in the CLI and JSON
    title: str
    producers: str
    # detection: all `required` hold, at least one of `required_any` (if given), none of its own
    # `forbidden` and none of another dialect's `markers`; the score is the summed weight of the
    # required and supporting signals that hold.
    required: tuple[Signal, ...]
    supporting: tuple[Signal, ...] = ()
    forbidden: tuple[Signal, ...] = ()  # what this layout cannot contain
    required_any: tuple[Signal, ...] = ()
    markers: tuple[Signal, ...] = ()  # signals only this dialect writes: they exclude every other dialect
    # (canonical prefix, dialect prefix): renames in both directions, first match wins, and a
    # name matching none is kept as is.
    key_rules: tuple[tuple[str, str], ...] = ()
    layer_config_path: str | None = None  # sub-dict holding the decoder-layer config (speculators)
    aux_ids_paths: tuple[str, ...] = ()  # where ids are stored, in reading order
    aux_convention: str = "boundary"
    # (signals that all hold, convention, why): overrides `aux_convention`
    aux_convention_when: tuple[tuple[tuple[Signal, ...], str, str], ...] = ()
    aux_convention_note: str | None = None  # why the convention cannot be known from the files
    # path -> (convention, why) for a field read in another numbering than the dialect's (overrides
    # `aux_convention` and `aux_convention_when` for that path)
    aux_path_conventions: dict[str, tuple[str, str]] = field(default_factory=dict)
    flag_fields: frozenset[str] = frozenset()  # flags this dialect's config can record
    flag_defaults: dict[str, tuple[bool, str]] = field(default_factory=dict)  # when absent: value, why
    # (signals that all hold, defaults): override `flag_defaults` (a speculators config's type has its own reader)
    flag_defaults_when: tuple[tuple[tuple[Signal, ...], dict[str, tuple[bool, str]]], ...] = ()
    writer: Writer | None = None  # None: eaglectl reads this dialect but does not write it
    config_style: ConfigStyle = "hf"  # how it reads and eaglectl writes config.json
    owned_config_keys: tuple[str, ...] = ()  # top-level keys of this dialect's wrapping (not decoder config)
    d2t_order: str = "sorted"  # sorted (ids ascending) | frequency (ModelOpt: most frequent first)
    caveats: tuple[Caveat, ...] = ()
    # the engine that serves this dialect's files and reads their aux ids (engines/facts.py)
    consumer: str = "vllm"
    vllm_loads: bool = True  # vLLM can load these files as they are (a `vllm serve` line is printed for them)
    notes: tuple[str, ...] = ()
    # rope scaling this producer can inject into exported configs whatever training used (rules/mla.py)
    exported_rope_scaling: dict[str, Any] = field(default_factory=dict)

    def to_canonical(self, name: str) -> str:
        return renamed(name, self.key_rules, to_canonical=True)

    def from_canonical(self, name: str) -> str:
        return renamed(name, self.key_rules, to_canonical=False)

    def flag_defaults_for(self, probe: Probe) -> dict[str, tuple[bool, str]]:
        for signals, defaults in self.flag_defaults_when:
            if all(s.holds(probe) for s in signals):
                return defaults
        return self.flag_defaults

    def aux_convention_for(self, probe: Probe) -> tuple[str, str]:
        for signals, convention, why in self.aux_convention_when:
            if all(s.holds(probe) for s in signals):
                return convention, why
        return self.aux_convention, f"{self.title} convention"


@dataclass(frozen=True)
class Detection:
    dialect: str
    score: float | None  # None: excluded
    evidence: tuple[str, ...]  # signals that held (or, when excluded, why)
