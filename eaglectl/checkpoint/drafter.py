"""One opened and interpreted drafter checkpoint: files → dialect → canonical names → DrafterSpec.

`open_drafter` is the single way every command reads a drafter (inspect, convert, upgrade,
verify, smoke, check), so the interpretation is computed once per run. Reading never fails on an
inconsistent config: a missing, ill-typed or out-of-bounds field becomes None (its source says
so) and the rules report it. Only the dialect tables decide names and defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .. import counters as loads
from .. import formats
from ..errors import UnknownFormatError
from ..formats import FITS, Detection, Dialect, Probe
from ..io.checkpoint import Checkpoint, local_path, open_checkpoint
from ..io.gguf import gguf_entry, open_gguf
from ..io.jsonio import ConfigView
from ..io.safetensors import TensorInfo
from ..limits import limit
from ..spec import FLAGS, DrafterSpec

if TYPE_CHECKING:
    import numpy as np

# Where vLLM reads each flag, in order (docs/engines.md): norm_before_fc from eagle_config first.
FLAG_PATHS: dict[str, tuple[str, ...]] = {
    "norm_before_residual": ("norm_before_residual",),
    "norm_before_fc": ("eagle_config.norm_before_fc", "norm_before_fc"),
    "fc_norm": ("fc_norm", "enable_fc_norm", "use_aux_norm"),
    "norm_output": ("norm_output",),
}
# Names for a flag found in the wild that vLLM does not read (it reads `fc_norm` only): read on input, so the
# spec says what the drafter was trained with; the rule `fc-norm-alias` says vLLM would not see it.
FLAG_ALIASES: dict[str, str] = {"enable_fc_norm": "the EAGLE-4 harness's name for fc_norm",
                                "use_aux_norm": "an sglang fork's legacy name for fc_norm"}


def flag_alias(spec: DrafterSpec, flag: str) -> str | None:
    """The alias key (FLAG_ALIASES) `flag` was read from, None when its own key or a default gave it."""
    key = spec.sources.get(flag, "").removeprefix("config: ").split(" ")[0]
    return key if key in FLAG_ALIASES else None


# k when the files record none: what the serve line's num_speculative_tokens and a written speculators config say
DEFAULT_SPECULATIVE_TOKENS = 3
# Aux ids: vLLM captures the top-level list first, then eagle_config's.
AUX_ID_PATHS = ("eagle_aux_hidden_state_layer_ids", "eagle_config.eagle_aux_hidden_state_layer_ids")

# vLLM reads an MLA drafter's config through transformers' DeepseekV3Config, whose defaults fill absent
# keys silently (docs/math.md#mla); the spec records them the same way, so the shape rules see what vLLM builds.
MLA_DEFAULTS = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128}

FAMILY_MARKERS = (("mla", ("self_attn.kv_a_proj_with_mqa.", "self_attn.q_a_proj.", "self_attn.kv_b_proj.")),
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
        """The tensor's logical shape: an NVFP4 weight (uint8 with a weight_scale_2) packs two values per byte."""
        if canon not in self.stored:
            return None
        info = self.info(canon)
        if info.dtype == "U8" and len(info.shape) == 2 and canon.endswith(".weight") and f"{canon}_scale_2" in self:
            return (info.shape[0], info.shape[1] * 2)
        return info.shape

    def read(self, canon: str) -> np.ndarray:
        return self.ckpt.read(self.stored[canon])

    def locate(self, canon: str) -> str:
        return self.ckpt.locate(self.stored[canon]) if canon in self.stored else canon

    def names(self) -> list[str]:
        return sorted(self.stored)


@dataclass
class DrafterCheckpoint:
    """A drafter read through its dialect: the files, the dialect decision, canonical names, spec."""

    # what commands ask of whatever they opened (families/checkpoint.FamilyCheckpoint answers too): EAGLE-3's
    # dialects, the reference drafter and the runner readings read it
    eagle3_layout: ClassVar[bool] = True

    ckpt: Checkpoint
    dialect: Dialect
    detections: list[Detection]
    forced: bool
    view: CanonicalView
    spec: DrafterSpec
    config: ConfigView  # typed access to config.json; its `problems` are the invalid fields
    # what a layer above computes once per checkpoint and keeps here (model/loader.py's load_reference: the fp32
    # tensors of the reference drafter), so that this module needs none of them
    memo: dict[str, object] = field(default_factory=dict, repr=False, compare=False)

    @property
    def source(self) -> str:
        return self.ckpt.source

    @property
    def root(self) -> str:
        return self.ckpt.root

    def set_by_upgrade(self, flag: str) -> bool:
        """eaglectl's own upgrade set this flag (its provenance says so): the warm start's arrangement, which it is
        fine-tuned to next, not the one its weights were trained with."""
        prov = self.config.raw("eaglectl_provenance")
        steps = prov.get("upgrade_steps") if isinstance(prov, dict) and prov.get("operation") == "upgrade" else None
        return isinstance(steps, list) and f"set-{flag.replace('_', '-')}" in steps

    @property
    def layer_config(self) -> ConfigView:
        """The decoder-layer part of the config (speculators nests it)."""
        return self.config.sub(self.dialect.layer_config_path) if self.dialect.layer_config_path else self.config

    @property
    def evidence(self) -> tuple[str, ...]:
        if self.forced:
            return ("--from given",)

        own = next(d.evidence for d in self.detections if d.dialect == self.dialect.name)
        # another dialect whose layout fits but whose marker is absent: named, so that a TorchSpec template
        # read as SpecForge says so
        near = tuple(f"also fits {d.dialect} ({', '.join(e.removeprefix(FITS) for e in d.evidence[1:])}), "
                     f"without its marker ({d.evidence[0].removeprefix('missing: ')})" for d in self.detections
                     if d.score is None and any(e.startswith(FITS) for e in d.evidence[1:]))
        return own + near

    @property
    def speculative_tokens(self) -> int:
        """k, the draft tokens per step: what the files record (speculators' `proposal_methods[0].speculative_tokens`,
        an integer in 1..64), else DEFAULT_SPECULATIVE_TOKENS. Every reader of k asks here."""
        methods = self.config.raw("speculators_config.proposal_methods")
        k = methods[0].get("speculative_tokens") if isinstance(methods, list) and methods and \
            isinstance(methods[0], dict) else None
        return k if isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 64 else DEFAULT_SPECULATIVE_TOKENS


def open_drafter(source: str, *, from_dialect: str | None = None, allow_pickle: bool = False,
                 revision: str | None = None) -> DrafterCheckpoint:
    """Open SOURCE (folder, file, index, .bin with allow_pickle, Hub id) and interpret it."""
    return interpret(open_files(source, allow_pickle=allow_pickle, revision=revision), from_dialect)


def open_files(source: str, *, allow_pickle: bool = False, revision: str | None = None) -> Checkpoint:
    """SOURCE's files, opened (headers and config) and not yet interpreted: a GGUF draft or any other checkpoint."""
    path = local_path(source)
    if path is not None and not revision and (entry := gguf_entry(path)) is not None:  # llama.cpp's one-file draft
        return open_gguf(source, entry)
    return open_checkpoint(source, allow_pickle=allow_pickle, revision=revision)


def interpret(ckpt: Checkpoint, from_dialect: str | None = None) -> DrafterCheckpoint:
    loads.count("drafter")
    probe = probe_of(ckpt)
    if not probe.tensors:
        raise UnknownFormatError(f"{ckpt.source}: no tensors (the weights files are empty)", path=ckpt.source,
                                 hint="point at the drafter's exported weights")
    dialect, detections = formats.detect(probe, from_dialect, where=ckpt.root)
    view = CanonicalView(ckpt, dialect)
    config = ckpt.config_view
    spec = read_spec(ckpt, dialect, view, config)
    return DrafterCheckpoint(ckpt, dialect, detections, from_dialect is not None, view, spec, config)


class _Fields:
    """Typed config lookups through ConfigView that record where each spec value came from."""

    def __init__(self, config: ConfigView, arch_root: str | None) -> None:
        self.top = config
        self.arch = config.sub(arch_root) if arch_root else config
        self.sources: dict[str, str] = {}

    def get(self, field_name: str, key: str, kind: str, *, arch: bool = True, **bounds: Any) -> Any:
        view = self.arch if arch else self.top
        path = view.path(key)
        if not view.has(key):
            self.sources[field_name] = f"absent: config '{path}'"
            return None
        value = getattr(view, kind)(key, **bounds)
        self.sources[field_name] = f"invalid: config '{path}'" if value is None else f"config: {path}"
        return value


def read_spec(ckpt: Checkpoint, dialect: Dialect, view: CanonicalView, config: ConfigView) -> DrafterSpec:
    """The DrafterSpec of a checkpoint read through `dialect` (invalid fields land in config.problems)."""
    f = _Fields(config, dialect.layer_config_path)
    probe = probe_of(ckpt)
    arch = _family(f, view)
    hidden, heads, kv_heads, head_dim, mla = _attention_sizes(f, arch)
    target_hidden, num_aux = _aux_width(f, view, hidden)
    vocab = f.get("vocab_size", "vocab_size", "int", lo=1)
    draft_vocab = f.get("draft_vocab_size", "draft_vocab_size", "int", arch=False, lo=1)
    aux_ids, convention = _aux_ids(f, dialect, probe)
    rope_theta, rope_scaling = _rope(f)
    defaults = dialect.flag_defaults_for(probe)
    flags = {flag: _flag(f, defaults, flag) for flag in FLAGS}
    config_dtype, tie = _dtype_and_tie(f, dialect)
    bias = bool(f.get("attention_bias", "attention_bias", "bool"))
    window, sliding_layers = _sliding_window(f, arch)

    return DrafterSpec(
        arch=arch,
        hidden_size=hidden,
        target_hidden_size=target_hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=f.get("intermediate_size", "intermediate_size", "int", lo=1),
        num_hidden_layers=f.get("num_hidden_layers", "num_hidden_layers", "int", lo=1, hi=limit("drafter_layers")),
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        aux_layer_ids=aux_ids,
        aux_convention=convention,
        num_aux_hidden_states=num_aux,
        rms_norm_eps=f.get("rms_norm_eps", "rms_norm_eps", "float", lo=0.0, hi=1.0),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=f.get("max_position_embeddings", "max_position_embeddings", "int", lo=1),
        has_embed_tokens="embed_tokens.weight" in view,
        has_lm_head="lm_head.weight" in view,
        tie_word_embeddings=tie,
        attention_bias=bias,
        sliding_window=window,
        sliding_layers=sliding_layers,
        config_dtype=config_dtype,
        tensor_dtypes=tuple(sorted({t.dtype for t in ckpt.tensors.values()})),
        sources=f.sources,
        mla=mla,
        **flags,
    )


def _family(f: _Fields, view: CanonicalView) -> str:
    """llama, qwen3 or mla, from the tensors the checkpoint holds."""
    arch, arch_source = "llama", "weights: no q_norm/k_norm or MLA projections"
    for name, markers in FAMILY_MARKERS:
        if any(m in c for c in view.stored for m in markers):
            arch, arch_source = name, f"weights: {markers[0]}* present"
            break
    f.sources["arch"] = arch_source
    return arch


def _attention_sizes(f: _Fields, arch: str
                     ) -> tuple[int | None, int | None, int | None, int | None, dict[str, int | None] | None]:
    """(hidden_size, heads, kv heads, head_dim, MLA dims or None), with the HF and MLA defaults and derivations."""
    hidden = f.get("hidden_size", "hidden_size", "int", lo=1)
    heads = f.get("num_attention_heads", "num_attention_heads", "int", lo=1)
    kv_heads = f.get("num_key_value_heads", "num_key_value_heads", "int", lo=1)
    if kv_heads is None and heads is not None:
        kv_heads = heads
        f.sources["num_key_value_heads"] = "default: = num_attention_heads (HF)"
    head_dim = f.get("head_dim", "head_dim", "int", lo=1)
    mla = _mla_dims(f) if arch == "mla" else None
    if mla is not None:
        nope, rope = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"]
        head_dim = nope + rope if nope is not None and rope is not None else None
        f.sources["head_dim"] = "derived: qk_nope_head_dim + qk_rope_head_dim (MLA q/k head)"
    elif head_dim is None and hidden and heads and hidden % heads == 0:
        head_dim = hidden // heads
        f.sources["head_dim"] = "derived: hidden_size / num_attention_heads"
    return hidden, heads, kv_heads, head_dim, mla


def _aux_width(f: _Fields, view: CanonicalView, hidden: int | None) -> tuple[int | None, int | None]:
    """(target_hidden_size, the number of aux states fc takes, from its weight)."""
    target_hidden = f.get("target_hidden_size", "target_hidden_size", "int", arch=False, lo=1)
    if target_hidden is None and hidden is not None:
        target_hidden = hidden
        f.sources["target_hidden_size"] = "default: = hidden_size (vLLM)"
    num_aux = None
    fc = view.shape("fc.weight")
    if fc is not None and len(fc) == 2 and target_hidden and fc[1] % target_hidden == 0:
        num_aux = fc[1] // target_hidden
        f.sources["num_aux_hidden_states"] = "weights: fc.weight in-features / target_hidden_size"
    return target_hidden, num_aux


def _rope(f: _Fields) -> tuple[float | None, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) in either encoding (transformers 5 keeps both in rope_parameters)."""
    rope_theta = f.get("rope_theta", "rope_theta", "float", lo=1e-9)
    if rope_theta is None and not f.arch.has("rope_theta"):
        rope_theta = f.get("rope_theta", "rope_parameters.rope_theta", "float", lo=1e-9)
    rope_scaling = f.get("rope_scaling", "rope_scaling", "dict")
    if rope_scaling is None:  # transformers 5 keeps scaling in rope_parameters
        params = f.arch.dict("rope_parameters")
        rope_scaling = params if params and params.get("rope_type", "default") != "default" else None
        f.sources["rope_scaling"] = ("config: rope_parameters" if rope_scaling is not None
                                     else "absent: no rope_scaling, rope_parameters type default")
    return rope_theta, rope_scaling


def _dtype_and_tie(f: _Fields, dialect: Dialect) -> tuple[str | None, bool | None]:
    """(the config's dtype, tie_word_embeddings), top level or in the nested layer config."""
    config_dtype = f.get("config_dtype", "torch_dtype", "str", arch=False)
    if config_dtype is None:
        config_dtype = f.get("config_dtype", "dtype", "str", arch=False)
    if config_dtype is None and dialect.layer_config_path:
        config_dtype = f.get("config_dtype", "torch_dtype", "str")
    tie = f.get("tie_word_embeddings", "tie_word_embeddings", "bool")
    if tie is None and dialect.layer_config_path:
        tie = f.get("tie_word_embeddings", "tie_word_embeddings", "bool", arch=False)
    return config_dtype, tie


def _sliding_window(f: _Fields, arch: str) -> tuple[int | None, tuple[int, ...]]:
    """(the window, the layers it applies to), as vLLM 0.32 reads them: a draft layer i slides when
    `layer_types[i]` is `sliding_attention` (llama.py / qwen3_eagle3.py, draft-relative index), with
    `sliding_window` as its window. `use_sliding_window` and `max_window_layers` are not read by the EAGLE-3
    drafters, and the MLA drafter (deepseek_eagle3.py) applies no window at all; the rules name both."""
    window = f.get("sliding_window", "sliding_window", "int", lo=1)
    layer_types = f.arch.str_list("layer_types", max_len=limit("drafter_layers"))
    layers = tuple(i for i, kind in enumerate(layer_types or ()) if kind == "sliding_attention")
    if arch == "mla" and layers:
        f.sources["sliding_window"] = "off: vLLM's MLA drafter applies no sliding window"
        return None, ()
    if not layers or window is None:
        f.sources["sliding_window"] = ("off: no sliding_attention in layer_types" if not layers
                                       else "off: sliding_attention layers without a sliding_window (vLLM: full)")
        return None, ()
    f.sources["sliding_window"] = f"config: layers {list(layers)} slide (layer_types), window {window}"
    return window, layers


def _mla_dims(f: _Fields) -> dict[str, int | None]:
    """The MLA sizes as vLLM reads them: `q_lora_rank: null` means a plain q_proj; an absent key takes
    DeepseekV3Config's default; an invalid one is None (the rules name it)."""
    out: dict[str, int | None] = {}
    for key, default in MLA_DEFAULTS.items():
        if key == "q_lora_rank" and key in f.arch.data and f.arch.data[key] is None:
            out[key] = None
            f.sources[key] = "config: q_lora_rank null (plain q_proj)"
        elif not f.arch.has(key):
            out[key] = default
            f.sources[key] = f"default: {default} (transformers DeepseekV3Config, as vLLM reads it)"
        else:
            out[key] = f.get(key, key, "int", lo=1)
    return out


def _aux_ids(f: _Fields, dialect: Dialect, probe: Probe) -> tuple[tuple[int, ...] | None, str]:
    recorded = f.top.str("eaglectl_provenance.aux_convention")
    if recorded in ("boundary", "output"):  # eaglectl wrote these ids and said what they mean
        convention = recorded
        f.sources["aux_convention"] = "recorded: eaglectl_provenance.aux_convention"
    else:
        convention, why = dialect.aux_convention_for(probe)
        f.sources["aux_convention"] = f"dialect: {why}"
    fields = f.top.dict("eaglectl_provenance.aux_id_fields") or {}
    for path in dialect.aux_ids_paths or AUX_ID_PATHS:
        if not f.top.has(path):
            continue
        ids = f.top.int_list(path, lo=-limit("target_layers"), hi=limit("target_layers"))
        f.sources["aux_layer_ids"] = f"config: {path}" if ids is not None else f"invalid: config '{path}'"
        if fields.get(path) in ("boundary", "output"):  # eaglectl recorded each field's numbering
            convention = fields[path]
            f.sources["aux_convention"] = f"recorded: eaglectl_provenance.aux_id_fields['{path}']"
        elif path in dialect.aux_path_conventions and recorded not in ("boundary", "output"):
            convention, why = dialect.aux_path_conventions[path]
            f.sources["aux_convention"] = f"dialect: {why}"
        return ids, convention
    f.sources["aux_layer_ids"] = "absent: engines use their default"
    return None, convention


def _flag(f: _Fields, defaults: dict[str, tuple[bool, str]], flag: str) -> bool:
    for path in FLAG_PATHS[flag]:
        value = f.top.bool(path)
        if value is None:  # absent, or invalid (config.problems records it)
            continue
        f.sources[flag] = f"config: {path}" + (" (an alias vLLM does not read)" if path in FLAG_ALIASES else "")
        return value
    value, why = defaults.get(flag, (False, "vLLM default"))
    f.sources[flag] = f"default: {why}"
    return value
