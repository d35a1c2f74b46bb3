"""A DFlash / DSpark drafter in its own layout checked as strictly as an EAGLE-3 one: every config value vLLM 0.32's
DFlash / DSpark code reads, by type and range (`config-field-invalid`; sizes bounded by limits.py before anything
is sized by them); the layer ids it captures (`family-layer-ids`); what one value demands of another
(`family-config`); each weight's presence, shape and dtype derived from the config (`missing-tensor`,
`tensor-shape`, `family-tensor`), header-only; NaN/Inf under --scan (`nonfinite-values`).

The names and shapes are those vLLM 0.32 builds and loads (model_executor/models/qwen3_dflash.py: DFlashQwen3Model,
DFlashQwen3ForCausalLM.load_weights; qwen3_dspark.py: Qwen3DSparkModel). Its DFlash and DSpark load_weights return
no set of loaded names, so the loader's missing-weight check never runs and an absent tensor stays uninitialised
memory; a name it has no parameter for (a layer beyond num_hidden_layers) raises in AutoWeightsLoader; a shape
that differs fails the weight loader's size assertion. Classes whose code eaglectl has not read (DFlash2, XPress,
DeepSeek-V4's DSpark, ...) get the config checks only.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..engines.facts import RUNNERS
from ..engines.readings import select
from ..io.dtypes import FLOAT_DTYPES
from ..io.jsonio import ConfigView
from ..limits import limit
from ..progress import Progress, passthrough
from ..rules import catalogue as rule
from ..rules.base import Rule
from .checkpoint import FamilyCheckpoint
from .reading import SLIDING, family_view, layer_attention

Emitted = list[tuple[Rule, str, str | None]]  # (rule, message, locator)

# Each config key vLLM's DFlash / DSpark code or the transformers config it builds reads, with its type:
# ("int", lowest, the limits.py bound), ("float", lowest, highest) (finite; by default >= 0), ("bool",), ("str",),
# ("ids",) (a list of layer ids), ("types",) (layer_types), ("object",). The decoder's keys are also read inside a
# speculators config's transformer_layer_config; the mask token's keys are family-mask-token's.
DECODER_FIELDS: dict[str, tuple[Any, ...]] = {
    "num_hidden_layers": ("int", 1, "drafter_layers"), "hidden_size": ("int", 1, "config_int"),
    "intermediate_size": ("int", 1, "config_int"), "num_attention_heads": ("int", 1, "config_int"),
    "num_key_value_heads": ("int", 1, "config_int"), "head_dim": ("int", 1, "config_int"),
    "vocab_size": ("int", 1, "config_int"), "max_position_embeddings": ("int", 1, "config_int"),
    "sliding_window": ("int", 1, "config_int"), "rms_norm_eps": ("float", 0.0, 1.0), "rope_theta": ("float",),
    "logit_scale": ("float",), "hidden_act": ("str",), "model_type": ("str",), "attention_bias": ("bool",),
    "is_neox_style": ("bool",), "is_causal": ("bool",), "add_swa_attention_sink_bias": ("bool",),
    "use_aux_hidden_state": ("bool",), "layer_types": ("types",),
}
DRAFTER_FIELDS: dict[str, tuple[Any, ...]] = {
    "draft_vocab_size": ("int", 1, "config_int"), "target_hidden_size": ("int", 1, "config_int"),
    "num_target_layers": ("int", 1, "target_layers"), "target_num_hidden_layers": ("int", 1, "target_layers"),
    "block_size": ("int", 1, "draft_block"), "dspark_block_size": ("int", 1, "draft_block"),
    "markov_rank": ("int", 1, "config_int"), "dspark_markov_rank": ("int", 1, "config_int"),
    "enable_confidence_head": ("bool",), "confidence_head_with_markov": ("bool",), "sample_from_anchor": ("bool",),
    "sliding_window_non_causal": ("bool",), "target_layer_ids": ("ids",), "dspark_target_layer_ids": ("ids",),
    "aux_hidden_state_layer_ids": ("ids",), "eagle_aux_hidden_state_layer_ids": ("ids",),
    "dflash_config": ("object",), "transformer_layer_config": ("object",),
    "dflash_config.target_layer_ids": ("ids",), "dflash_config.layer_ids": ("ids",),
    "dflash_config.block_size": ("int", 1, "draft_block"), "dflash_config.use_swa": ("bool",),
    "dflash_config.swa_window_size": ("int", 1, "config_int"), "dflash_config.causal": ("bool",),
    "dflash_config.attention_sink_bias": ("bool",), "dflash_config.sample_from_anchor": ("bool",),
    "dflash_config.use_aux_hidden_state": ("bool",), "dflash_config.attention_value_scale": ("float",),
}
ATTENTION_TYPES = ("full_attention", SLIDING)  # the layer types qwen3_dflash.py tells apart
# vLLM 0.32's classes whose weights are checked (model_executor/models/registry.py): class -> the family's code
CHECKED_CLASSES = {"DFlashDraftModel": "dflash", "MuseGlimmerAssistantModel": "dflash",
                   "DFlashMuseGlimmerAssistantModel": "dflash", "Qwen3DSparkModel": "dspark",
                   "Qwen3OmniDSparkModel": "dspark"}
# what qwen3_dflash.py's hf_to_vllm_mapper renames before loading (besides a layout's own names)
VLLM_RENAMES = (("midlayer.", "layers.0."), ("encoder.output_norm_enc.", "hidden_norm."), ("encoder.fc.", "fc."))
_LAYER = re.compile(r"layers\.([0-9]{1,9})\.(.+)$")  # ASCII digits only


def _check(view: ConfigView, key: str, kind: tuple[Any, ...]) -> None:
    """One field read through the typed view (an invalid value lands in view.problems)."""
    if kind[0] == "int":
        view.int(key, lo=kind[1], hi=limit(kind[2]))
    elif kind[0] == "float":
        view.float(key, lo=kind[1] if len(kind) > 1 else 0.0, hi=kind[2] if len(kind) > 2 else math.inf)
    elif kind[0] == "bool":
        view.bool(key)
    elif kind[0] == "str":
        view.str(key)
    elif kind[0] == "ids":  # DFlash's -1 is boundary 0 (the embeddings), which vLLM captures
        view.int_list(key, lo=-1, hi=limit("target_layers"))
    elif kind[0] == "types":
        view.str_list(key, max_len=limit("drafter_layers"))
    else:
        view.dict(key)


def config_view(fc: FamilyCheckpoint) -> ConfigView:
    """The drafter's config, every field vLLM reads checked (problems recorded on the view)."""
    view = ConfigView(fc.config, fc.ckpt.config_name or f"{fc.ckpt.root}/config.json")
    for key, kind in DRAFTER_FIELDS.items():
        _check(view, key, kind)
    for prefix in ("", "transformer_layer_config."):
        for key, kind in DECODER_FIELDS.items():
            _check(view, prefix + key, kind)
    return view


def _sizes(view: dict[str, Any]) -> dict[str, Any]:
    """The sizes vLLM builds the drafter with, from its view of the config: only valid values (None otherwise)."""
    cv = ConfigView(view, "")
    out = {k: cv.int(k, lo=1, hi=limit("drafter_layers" if k == "num_hidden_layers" else "config_int"))
           for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size", "target_hidden_size",
                     "markov_rank")}
    H, nh = out["hidden_size"], out["num_attention_heads"]
    out["num_key_value_heads"] = out["num_key_value_heads"] or nh  # transformers' default
    out["head_dim"] = out["head_dim"] or (H // nh if H and nh else None)  # DFlashQwen3Attention's fallback
    out["draft_vocab_size"] = out["draft_vocab_size"] or out["vocab_size"]
    out["target_hidden_size"] = out["target_hidden_size"] or H
    return out


def layer_ids(fc: FamilyCheckpoint, view: dict[str, Any]) -> tuple[Emitted, int | None]:
    """The ids vLLM sizes fc by and captures (Model Runner V2's lookup, which _get_dflash_fc_input_size calls):
    absent or empty, repeated, unsorted or before boundary 0 is refused; (findings, how many fc reads)."""
    try:
        chosen, source, _ = select(view, next(t for t in RUNNERS if t.runner == "v2"))
    except ValueError:  # more ids than limits.py allows: config-field-invalid says so
        return [], None
    key = fc.field("layer_ids")[1] or source
    if chosen is None:
        return [(rule.FAMILY_LAYER_IDS, "no target layer ids vLLM can read (absent, empty or not integers): it "
                 "sizes fc for num_hidden_layers states and captures its default layers instead", key)], None
    shown = f"config '{key}' read as boundaries {list(chosen)}"
    if any(b < 0 for b in chosen):
        return [(rule.FAMILY_LAYER_IDS, f"{shown}: a boundary before 0 is never captured, so fc gets fewer states",
                 key)], len(chosen)
    if len(set(chosen)) != len(chosen):
        return [(rule.FAMILY_LAYER_IDS, f"{shown}: vLLM captures each boundary once, so fc, sized for "
                 f"{len(chosen)} states, gets {len(set(chosen))}", key)], len(chosen)
    if list(chosen) != sorted(chosen):
        return [(rule.FAMILY_LAYER_IDS, f"{shown}: vLLM captures them in layer order, so fc's input chunks come in "
                 "another order than the drafter was trained on", key)], len(chosen)
    return [], len(chosen)


def cross_fields(fc: FamilyCheckpoint, view: dict[str, Any], sizes: dict[str, Any]) -> Emitted:
    """What one value vLLM reads demands of another (transformers' config and vLLM's model refuse otherwise)."""
    out: Emitted = []
    n, types = sizes["num_hidden_layers"], view.get("layer_types")
    if isinstance(types, list) and n is not None and len(types) <= limit("drafter_layers"):
        if len(types) != n:
            out.append((rule.FAMILY_CONFIG, f"layer_types has {len(types)} entries for num_hidden_layers {n}: "
                        "transformers refuses the config", "layer_types"))
        odd = next((t for t in types if t not in ATTENTION_TYPES), None)
        if odd is not None:
            out.append((rule.FAMILY_CONFIG, f"layer_types holds {str(odd)[:40]!r}: vLLM's DFlash layers are "
                        f"{' or '.join(ATTENTION_TYPES)}", "layer_types"))
    if n is not None and not out and isinstance(attention := layer_attention(view), str):
        out.append((rule.FAMILY_CONFIG, f"{attention}: vLLM refuses the config (_resolve_layer_attention)",
                    "dflash_config.use_swa" if types is None else "layer_types"))
    dv, v = sizes["draft_vocab_size"], sizes["vocab_size"]
    if fc.family.id == "dflash" and dv and v and dv > v:  # DSpark allows a draft vocab padded past the target's
        out.append((rule.FAMILY_CONFIG, f"draft_vocab_size {dv} exceeds vocab_size {v}: vLLM's DFlash scatters the "
                    "draft's logits into a vocab_size-wide row (compute_logits), so ids beyond it fail",
                    "draft_vocab_size"))
    nh, nkv = sizes["num_attention_heads"], sizes["num_key_value_heads"]
    if nh and nkv and nh % nkv:
        out.append((rule.FAMILY_CONFIG, f"num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}: "
                    "vLLM's attention asserts it is", "num_key_value_heads"))
    if fc.family.id == "dspark" and sizes["markov_rank"] is None and view.get("markov_rank") is None:
        out.append((rule.FAMILY_CONFIG, "no markov_rank: vLLM's Qwen3DSparkModel reads config.markov_rank to build "
                    "the Markov head", "markov_rank"))
    return out


def expected(code: str, view: dict[str, Any], s: dict[str, Any], n_ids: int | None
             ) -> tuple[dict[str, tuple[int | None, ...]], dict[str, tuple[int | None, ...]]]:
    """(the tensors vLLM loads and needs, the ones it loads when they ship), each name with its shape (None: a size
    the config does not give)."""
    H, I, hd, N = s["hidden_size"], s["intermediate_size"], s["head_dim"], s["num_hidden_layers"] or 0
    q = s["num_attention_heads"] * hd if s["num_attention_heads"] and hd else None
    kv = s["num_key_value_heads"] * hd if s["num_key_value_heads"] and hd else None
    dc = view.get("dflash_config") if isinstance(view.get("dflash_config"), dict) else {}
    need: dict[str, tuple[int | None, ...]] = {"hidden_norm.weight": (H,), "norm.weight": (H,)}
    if dc.get("use_aux_hidden_state", view.get("use_aux_hidden_state", True)) is not False:
        n = n_ids if n_ids is not None else N  # _get_dflash_fc_input_size: the ids' count, else the layers'
        Ht = s["target_hidden_size"]
        need["fc.weight"] = (H, n * Ht if Ht else None)
    bias = view.get("attention_bias") is True
    sink = dc.get("attention_sink_bias", view.get("add_swa_attention_sink_bias", False)) is True
    for i in range(N):
        p = f"layers.{i}."
        need |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                 p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
                 p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
                 p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                 p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                 p + "mlp.down_proj.weight": (H, I)}
        if bias:
            need |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                     p + "self_attn.v_proj.bias": (kv,), p + "self_attn.o_proj.bias": (H,)}
        if sink:
            need[p + "self_attn.attention_sink_bias"] = (s["num_attention_heads"],)
    optional: dict[str, tuple[int | None, ...]] = {
        "embed_tokens.weight": (s["vocab_size"], H), "lm_head.weight": (s["draft_vocab_size"], H),
        "d2t": (s["draft_vocab_size"],), "t2d": (s["vocab_size"],), "mask_embedding": (H,)}
    if code == "dspark":
        r = s["markov_rank"]
        need |= {"markov_head.markov_w1.weight": (s["vocab_size"], r),
                 "markov_head.markov_w2.weight": (s["draft_vocab_size"], r)}
        width = H + r if H and r and view.get("confidence_head_with_markov") is True else H
        optional |= {"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)}
    return need, optional


def canonical(fc: FamilyCheckpoint, stored: str) -> str:
    """The name vLLM loads a stored tensor as: the layout's training names and vLLM's own renames undone."""
    name = fc.layout.to_canonical(stored) if fc.layout is not None else stored
    for old, new in VLLM_RENAMES:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def weights(fc: FamilyCheckpoint, view: dict[str, Any], sizes: dict[str, Any], n_ids: int | None) -> Emitted:
    """Each tensor against the config: absent, another shape, another dtype, or one vLLM has no parameter for."""
    archs = view.get("architectures")
    cls = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if fc.config.get("speculators_model_type") == "dspark":  # its reader builds Qwen3DSparkModel (update_dspark)
        cls = "Qwen3DSparkModel"
    code = CHECKED_CLASSES.get(cls or "")
    if code is None:
        return []
    need, optional = expected(code, view, sizes, n_ids)
    quantised = isinstance(view.get("quantization_config"), dict)  # scales beside the weights, packed shapes
    modules = {n.rsplit(".", 1)[0] for n in (*need, *optional)}
    out: Emitted = []
    held: set[str] = set()
    N = sizes["num_hidden_layers"] or 0
    for stored in sorted(fc.ckpt.tensor_file):
        name, info = canonical(fc, stored), fc.ckpt.tensors[stored]
        held.add(name)
        m = _LAYER.match(name)
        want = need.get(name, optional.get(name))
        if m is not None and sizes["num_hidden_layers"] is None:
            continue  # the depth is unknown (config-field-invalid or -missing says why): no layer to hold it against
        if m is not None and int(m.group(1)) >= N:
            out.append((rule.FAMILY_TENSOR, f"'{stored}': layer {int(m.group(1))} of a {N}-layer drafter "
                        "(num_hidden_layers): vLLM has no such layer and refuses the drafter", stored))
        elif want is None and not (quantised and name.rsplit(".", 1)[0] in modules):
            why = ("vLLM's DFlash loader asserts no mask_hidden ships (masked slots are embedded via the mask "
                   "token)" if "mask_hidden" in name else f"vLLM's {cls} has no parameter for it and refuses the "
                   "drafter")
            out.append((rule.FAMILY_TENSOR, f"'{stored}': {why}", stored))
        elif want is not None and not quantised:
            out += _one(stored, name, tuple(info.shape), info.dtype, want)
    absent: dict[str, list[str]] = {}  # one finding per name, its layers together
    for name in sorted(set(need) - held, key=_by_layer):
        shown = fc.layout.from_canonical(name) if fc.layout else name
        absent.setdefault(_LAYER.sub(r"layers.N.\2", shown), []).append(m.group(1) if (m := _LAYER.match(shown))
                                                                           else "")
    for shown, where in absent.items():
        layers = f" (layers {', '.join(where)})" if where[0] else ""
        out.append((rule.MISSING_TENSOR, f"'{shown}' is absent{layers}: vLLM's {cls} never checks that its weights "
                    "were all loaded, so it would run on uninitialised memory", None))
    return out


def _by_layer(name: str) -> tuple[str, int]:
    m = _LAYER.match(name)
    return (_LAYER.sub(r"layers.N.\2", name), int(m.group(1))) if m else (name, -1)


def _one(stored: str, name: str, shape: tuple[int, ...], dtype: str, want: tuple[int | None, ...]) -> Emitted:
    if len(shape) != len(want) or any(w is not None and w != d for w, d in zip(want, shape, strict=False)):
        shown = "[" + ", ".join("?" if w is None else str(w) for w in want) + "]"
        return [(rule.TENSOR_SHAPE, f"'{stored}' is {list(shape)}; the config makes vLLM's parameter {shown}, so "
                 "its weight loader's size assertion fails", stored)]
    integer = name in ("d2t", "t2d")
    if integer and dtype not in ("I64", "I32", "BOOL") or not integer and dtype not in FLOAT_DTYPES:
        wants = "an integer map" if integer else "floating-point values"
        return [(rule.FAMILY_TENSOR, f"'{stored}' is {dtype}; vLLM loads {wants} there (copying casts it silently)",
                 stored)]
    return []


# sizes transformers' Qwen3Config would fill in with its own defaults (32 layers, 4096 wide, ...) when absent
REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


def validate(fc: FamilyCheckpoint) -> Emitted:
    """Every check above on a DFlash / DSpark drafter read in its own layout, header-only."""
    cv = config_view(fc)
    out: Emitted = [(rule.CONFIG_FIELD_INVALID, message, path) for path, message in cv.problems.items()]
    view = family_view(fc.config)
    out += [(rule.CONFIG_FIELD_MISSING, f"no '{key}': vLLM would build the drafter at transformers' default size for "
             "it, not the one its weights were trained at", key) for key in REQUIRED if view.get(key) is None]
    sizes = _sizes(view)
    found, n_ids = layer_ids(fc, view)
    return out + found + cross_fields(fc, view, sizes) + weights(fc, view, sizes, n_ids)


def scan(fc: FamilyCheckpoint, progress: Progress = passthrough) -> Emitted:
    """--scan: every floating-point tensor read for NaN / Inf (the EAGLE-3 rules' nonfinite-values, scanned)."""
    names = [n for n, i in fc.ckpt.tensors.items() if i.dtype in FLOAT_DTYPES]
    out: Emitted = []
    for name in progress(names, label="scanning for NaN/Inf", total=len(names)):
        bad = fc.ckpt.count_nonfinite(name)
        if bad:
            out.append((rule.NONFINITE_VALUES, f"'{name}' has {bad} NaN/Inf values", name))
    total = sum(fc.ckpt.tensors[n].nbytes for n in names)
    found = f"{len(out)} with NaN/Inf (nonfinite-values)" if out else "no NaN/Inf"
    return out + [(rule.SCANNED, f"{len(names)} floating-point tensors ({total:,} bytes) read; {found}", None)]
