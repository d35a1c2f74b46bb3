"""Interpret a checkpoint through a dialect: canonical tensor names and the DrafterSpec.

Reading never fails on an inconsistent config: a missing or ill-typed field becomes None (with its
source saying so) and the rules report it. Only the dialect tables decide names and defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .checkpoint import Checkpoint
from .formats import MISSING, Dialect, Probe, config_get
from .safetensors_io import FLOAT_DTYPES, TensorInfo
from .spec import FLAGS, DrafterSpec

# Where vLLM reads each flag, in order (formats.md §4.2): norm_before_fc from eagle_config first.
FLAG_PATHS: dict[str, tuple[str, ...]] = {
    "norm_before_residual": ("norm_before_residual",),
    "norm_before_fc": ("eagle_config.norm_before_fc", "norm_before_fc"),
    "fc_norm": ("fc_norm",),
    "norm_output": ("norm_output",),
}
# Aux ids: vLLM captures the top-level list first, then eagle_config's.
AUX_ID_PATHS = ("eagle_aux_hidden_state_layer_ids", "eagle_config.eagle_aux_hidden_state_layer_ids")

ARCH_MARKERS = (("mla", ("self_attn.q_a_proj.", "self_attn.kv_a_proj_with_mqa.")),
                ("qwen3", ("self_attn.q_norm.", "self_attn.k_norm.")))


def probe_of(ckpt: Checkpoint) -> Probe:
    return Probe(frozenset(ckpt.tensor_file), ckpt.config, ckpt.metadata, frozenset(ckpt.file_names))


@dataclass
class CanonicalView:
    """The checkpoint's tensors under canonical names."""

    ckpt: Checkpoint
    dialect: Dialect
    stored: dict[str, str] = field(default_factory=dict)  # canonical -> stored name
    collisions: list[tuple[str, str, str]] = field(default_factory=list)  # (canonical, first, second)

    def __post_init__(self) -> None:
        for name in self.ckpt.tensor_file:
            canon = self.dialect.to_canonical(name)
            if canon in self.stored:
                self.collisions.append((canon, self.stored[canon], name))
            else:
                self.stored[canon] = name

    def __contains__(self, canon: str) -> bool:
        return canon in self.stored

    def info(self, canon: str) -> TensorInfo:
        return self.ckpt.tensors[self.stored[canon]]

    def shape(self, canon: str) -> tuple[int, ...] | None:
        return self.info(canon).shape if canon in self.stored else None

    def read(self, canon: str) -> Any:
        return self.ckpt.read(self.stored[canon])

    def locate(self, canon: str) -> str:
        return self.ckpt.locate(self.stored[canon]) if canon in self.stored else canon

    def names(self) -> list[str]:
        return sorted(self.stored)

    def layer_indices(self) -> list[int]:
        found = set()
        for canon in self.stored:
            parts = canon.split(".")
            if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit():
                found.add(int(parts[1]))
        return sorted(found)


class _Fields:
    """Typed config lookups that record where each value came from."""

    def __init__(self, config: dict[str, Any] | None, arch_root: str | None) -> None:
        self.config = config or {}
        self.arch = config_get(self.config, arch_root) if arch_root else self.config
        if not isinstance(self.arch, dict):
            self.arch = {}
        self.prefix = f"{arch_root}." if arch_root else ""
        self.sources: dict[str, str] = {}
        self.invalid: list[tuple[str, str]] = []  # (key, message)

    def get(self, field_name: str, key: str, kind: type, *, arch: bool = True) -> Any:
        node = self.arch if arch else self.config
        path = (self.prefix if arch else "") + key
        value = config_get(node, key)
        if value is MISSING or value is None:
            self.sources[field_name] = f"absent: config '{path}'"
            return None
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            self.invalid.append((path, f"config '{path}' should be {kind.__name__}, got {value!r}"))
            self.sources[field_name] = f"invalid: config '{path}'"
            return None
        self.sources[field_name] = f"config: {path}"
        return value


def read_spec(ckpt: Checkpoint, dialect: Dialect, view: CanonicalView) -> tuple[DrafterSpec, list[tuple[str, str]]]:
    """The DrafterSpec of a checkpoint read through `dialect`, and config values of the wrong type."""
    f = _Fields(ckpt.config, dialect.arch_config)
    probe = probe_of(ckpt)

    arch, arch_source = "llama", "weights: no q_norm/k_norm or MLA projections"
    for name, markers in ARCH_MARKERS:
        if any(m in c for c in view.stored for m in markers):
            arch, arch_source = name, f"weights: {markers[0]}* present"
            break
    f.sources["arch"] = arch_source

    hidden = f.get("hidden_size", "hidden_size", int)
    heads = f.get("num_attention_heads", "num_attention_heads", int)
    kv_heads = f.get("num_key_value_heads", "num_key_value_heads", int)
    if kv_heads is None and heads is not None:
        kv_heads = heads
        f.sources["num_key_value_heads"] = "default: = num_attention_heads (HF)"
    head_dim = f.get("head_dim", "head_dim", int)
    if arch == "mla":
        nope, rope = f.get("qk_nope", "qk_nope_head_dim", int), f.get("qk_rope", "qk_rope_head_dim", int)
        head_dim = nope + rope if nope is not None and rope is not None else None
        f.sources["head_dim"] = "derived: qk_nope_head_dim + qk_rope_head_dim (MLA q/k head)"
    elif head_dim is None and hidden and heads and hidden % heads == 0:
        head_dim = hidden // heads
        f.sources["head_dim"] = "derived: hidden_size / num_attention_heads"

    target_hidden = f.get("target_hidden_size", "target_hidden_size", int, arch=False)
    if target_hidden is None and hidden is not None:
        target_hidden = hidden
        f.sources["target_hidden_size"] = "default: = hidden_size (vLLM)"
    num_aux = None
    fc = view.shape("fc.weight")
    if fc is not None and len(fc) == 2 and target_hidden and fc[1] % target_hidden == 0:
        num_aux = fc[1] // target_hidden
        f.sources["num_aux_hidden_states"] = "weights: fc.weight in-features / target_hidden_size"

    vocab = f.get("vocab_size", "vocab_size", int)
    draft_vocab = f.get("draft_vocab_size", "draft_vocab_size", int, arch=False)

    aux_ids, convention = _aux_ids(f, dialect, probe)

    rope_theta = f.get("rope_theta", "rope_theta", float)
    if rope_theta is None:
        rope_theta = f.get("rope_theta", "rope_parameters.rope_theta", float)
    rope_scaling = f.get("rope_scaling", "rope_scaling", dict)
    if rope_scaling is None:  # transformers 5 keeps scaling in rope_parameters
        params = f.get("rope_scaling", "rope_parameters", dict)
        rope_scaling = params if params and params.get("rope_type", "default") != "default" else None
        if rope_scaling is None:
            f.sources["rope_scaling"] = "absent: no rope_scaling, rope_parameters type default"

    flags = {}
    for flag in FLAGS:
        flags[flag] = _flag(f, dialect, flag)

    config_dtype = f.get("config_dtype", "torch_dtype", str, arch=False) or f.get("config_dtype", "dtype", str, arch=False)
    if config_dtype is None and dialect.arch_config:
        config_dtype = f.get("config_dtype", "torch_dtype", str)
    tie = f.get("tie_word_embeddings", "tie_word_embeddings", bool)
    if tie is None and dialect.arch_config:
        tie = f.get("tie_word_embeddings", "tie_word_embeddings", bool, arch=False)
    bias = bool(f.get("attention_bias", "attention_bias", bool))
    window = f.get("sliding_window", "sliding_window", int)
    layer_types = f.arch.get("layer_types")
    sliding_on = f.arch.get("use_sliding_window") is True or (
        isinstance(layer_types, list) and "sliding_attention" in layer_types)
    if not sliding_on:
        window = None
        f.sources["sliding_window"] = "off: no use_sliding_window / sliding layer_types"

    spec = DrafterSpec(
        arch=arch,
        hidden_size=hidden,
        target_hidden_size=target_hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=f.get("intermediate_size", "intermediate_size", int),
        num_hidden_layers=f.get("num_hidden_layers", "num_hidden_layers", int),
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        aux_layer_ids=aux_ids,
        aux_convention=convention,
        num_aux_hidden_states=num_aux,
        rms_norm_eps=f.get("rms_norm_eps", "rms_norm_eps", float),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=f.get("max_position_embeddings", "max_position_embeddings", int),
        has_embed_tokens="embed_tokens.weight" in view,
        has_lm_head="lm_head.weight" in view,
        tie_word_embeddings=tie,
        attention_bias=bias,
        sliding_window=window,
        config_dtype=config_dtype,
        tensor_dtypes=tuple(sorted({t.dtype for t in ckpt.tensors.values()})),
        sources=f.sources,
        **flags,
    )
    return spec, f.invalid


def _aux_ids(f: _Fields, dialect: Dialect, probe: Probe) -> tuple[tuple[int, ...] | None, str]:
    recorded = config_get(f.config, "eaglectl_provenance.aux_convention")
    if recorded in ("boundary", "output"):  # eaglectl wrote these ids and said what they mean
        convention = recorded
        f.sources["aux_convention"] = "recorded: eaglectl_provenance.aux_convention"
    else:
        convention, why = dialect.aux_convention_for(probe)
        f.sources["aux_convention"] = f"dialect: {why}"
    for path in dialect.aux_ids_paths or AUX_ID_PATHS:
        value = config_get(f.config, path)
        if value is MISSING or value is None:
            continue
        if not (isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)):
            f.invalid.append((path, f"config '{path}' should be a list of integers, got {value!r}"))
            f.sources["aux_layer_ids"] = f"invalid: config '{path}'"
            return None, convention
        f.sources["aux_layer_ids"] = f"config: {path}"
        return tuple(value), convention
    f.sources["aux_layer_ids"] = "absent: engines use their default"
    return None, convention


def _flag(f: _Fields, dialect: Dialect, flag: str) -> bool:
    for path in FLAG_PATHS[flag]:
        value = config_get(f.config, path)
        if value is MISSING or value is None:
            continue
        if not isinstance(value, bool):
            f.invalid.append((path, f"config '{path}' should be true or false, got {value!r}"))
            continue
        f.sources[flag] = f"config: {path}"
        return value
    value, why = dialect.flag_defaults.get(flag, (False, "vLLM default"))
    f.sources[flag] = f"default: {why}"
    return value


def float_dtypes(ckpt: Checkpoint) -> set[str]:
    return {t.dtype for t in ckpt.tensors.values() if t.dtype in FLOAT_DTYPES}
