"""Architecture names, required fields, tensor names and shapes (per layer, MLA included)."""

from __future__ import annotations

import re

from ..checkpoint.target import is_hub_id
from ..engines.facts import DRAFT_CLASSES, version_key
from ..io.quant import SCALE_SUFFIXES
from ..spec import DrafterSpec, layer_index
from . import catalogue as rule
from .base import Context, check

_PLAIN = {"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}
# Registered EAGLE-3 classes in vLLM 0.32 (engines.DRAFT_CLASSES), by weight family.
REGISTERED = {family: {c for c, m in DRAFT_CLASSES.items() if m == module}
              for family, module in (("llama", "llama_eagle3"), ("qwen3", "qwen3_eagle3"), ("mla", "deepseek_eagle3"))}
# vLLM renames a plain class X to Eagle3X for method eagle3; these plain MLA classes therefore load.
_PLAIN_MLA = {"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"}
# Every spelling of the MLA EAGLE-3 class seen in exports -> the registered vLLM name it stands for (V2 and V3
# are one class in vLLM; the version is kept). eaglectl convert writes the right-hand side.
MLA_SPELLINGS = {
    "Eagle3DeepseekV2ForCausalLM": "Eagle3DeepseekV2ForCausalLM",
    "Eagle3DeepseekV3ForCausalLM": "Eagle3DeepseekV3ForCausalLM",
    "DeepseekV3ForCausalLMEagle3": "Eagle3DeepseekV3ForCausalLM",  # SpecForge / sglang
    "Eagle3DeepSeekV3ForCausalLM": "Eagle3DeepseekV3ForCausalLM",  # TensorRT-LLM
    "DeepseekV2ForCausalLMEagle3": "Eagle3DeepseekV2ForCausalLM",
    "Eagle3DeepSeekV2ForCausalLM": "Eagle3DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "Eagle3DeepseekV3ForCausalLM",  # the target class (vLLM renames it itself)
    "DeepseekV2ForCausalLM": "Eagle3DeepseekV2ForCausalLM",
}


@check
def architectures(ctx: Context) -> None:
    if ctx.ckpt.config is None:
        return
    if ctx.dialect.config_style == "speculators":
        _speculators_config(ctx)
        return
    archs = ctx.config.str_list("architectures")
    loc = ctx.at("architectures")
    if not archs:
        if not ctx.config.problems.get("architectures"):
            ctx.emit(rule.ARCHITECTURES_MISSING, "config has no architectures", loc)
        return
    arch = archs[0]
    known = {a for names in REGISTERED.values() for a in names}
    if arch in _PLAIN or arch in _PLAIN_MLA:
        family = "mla" if arch in _PLAIN_MLA else "qwen3" if arch.startswith("Qwen3") else "llama"
        if family != ctx.spec.arch:  # a plain class of the weights' family: vLLM renames it Eagle3X (SGLang does
            # not: rules/sglang.py says what it builds instead)
            ctx.emit(rule.ARCHITECTURES_MISMATCH, f"'{arch}' but the weights are {ctx.spec.arch}-style", loc)
        return
    if arch in MLA_SPELLINGS and arch not in known:
        if ctx.spec.arch != "mla":
            ctx.emit(rule.ARCHITECTURES_MISMATCH, f"'{arch}' but the weights are {ctx.spec.arch}-style", loc)
        else:
            ctx.emit(rule.ARCHITECTURES_SPELLING, f"'{arch}' is not a vLLM 0.32 class; vLLM's name for it is "
                     f"'{MLA_SPELLINGS[arch]}'", loc)
        return
    if arch not in known:
        ctx.emit(rule.ARCHITECTURES_UNREGISTERED, f"'{arch}' is registered in no engine", loc)
        return
    if arch not in REGISTERED[ctx.spec.arch] and not (ctx.spec.arch == "qwen3" and arch in REGISTERED["llama"]):
        ctx.emit(rule.ARCHITECTURES_MISMATCH, f"'{arch}' but the weights are {ctx.spec.arch}-style", loc)


def _speculators_config(ctx: Context) -> None:
    cfg = ctx.config
    verifier = cfg.dict("speculators_config.verifier") or {}
    named = "name_or_path" in verifier  # null is allowed: vLLM reads the key only when serving the drafter alone
    for path in ("speculators_config.proposal_methods", "speculators_config.verifier.name_or_path",
                 "speculators_model_type", "transformer_layer_config"):
        if cfg.raw(path) in ([], "") or not (cfg.has(path) or (path.endswith("name_or_path") and named)):
            ctx.emit(rule.SPECULATORS_CONFIG, f"speculators config lacks '{path}'", ctx.at(path))
    name = verifier.get("name_or_path")
    where = ctx.at("speculators_config.verifier.name_or_path")
    if named and name is None:
        ctx.emit(rule.VERIFIER_UNNAMED,
                 "verifier name_or_path is null: speculators 0.9.0's SpeculatorModel.from_pretrained "
                 "raises OSError on it, and vllm serve DRAFTER alone cannot find the target", where)
    elif isinstance(name, str) and (name.startswith(("/", ".", "~")) or ("/" in name and not is_hub_id(name))):
        if _from_0_33(ctx):
            ctx.emit(rule.VERIFIER_LOCAL_PATH_REJECTED, f"verifier name_or_path '{name}' is a local path: vLLM "
                     f"{ctx.engine_version} raises 'Speculators verifier must name a remote model repository'",
                     where)
        else:
            ctx.emit(rule.VERIFIER_LOCAL_PATH, f"verifier name_or_path '{name}' is a local path (from vLLM 0.33 on "
                     "`vllm serve DRAFTER` refuses it: --engine-version 0.33 makes this an error)", where)
    methods = cfg.raw("speculators_config.proposal_methods")
    if isinstance(methods, list) and methods and isinstance(methods[0], dict) and "speculative_tokens" not in methods[0]:
        ctx.emit(rule.SPECULATORS_CONFIG, "proposal_methods[0] lacks 'speculative_tokens'",
                 ctx.at("speculators_config.proposal_methods[0]"))
    mt = cfg.str("transformer_layer_config.model_type")
    if mt not in (None, "llama", "qwen3"):
        ctx.emit(rule.SPECULATORS_CONFIG, f"transformer_layer_config.model_type '{mt}': vLLM accepts llama or qwen3",
                 ctx.at("transformer_layer_config.model_type"))
    elif (mt == "qwen3") != (ctx.spec.arch == "qwen3"):
        ctx.emit(rule.ARCHITECTURES_MISMATCH, f"transformer_layer_config.model_type is {mt or 'absent (llama)'} "
                 f"but the weights are {ctx.spec.arch}-style", ctx.at("transformer_layer_config.model_type"))


def _from_0_33(ctx: Context) -> bool:
    version = ctx.engine_version
    return version is not None and version_key(version) >= (0, 33)


@check
def required_fields(ctx: Context) -> None:
    if ctx.ckpt.config is None:
        return
    need = ["hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "vocab_size"]
    if ctx.spec.arch != "mla":
        need.append("rms_norm_eps")
    for name in need:
        if getattr(ctx.spec, name) is None and not ctx.spec.sources.get(name, "").startswith("invalid"):
            ctx.emit(rule.CONFIG_FIELD_MISSING, f"config lacks '{name}'", ctx.at(name))
    s = ctx.spec
    if s.arch != "mla" and s.head_dim is None and s.hidden_size and s.num_attention_heads:
        ctx.emit(rule.CONFIG_FIELD_MISSING, f"config lacks 'head_dim' and hidden_size {s.hidden_size} is not divisible "
                 f"by num_attention_heads {s.num_attention_heads}", ctx.at("head_dim"))


# Canonical tensor names (docs/hazards.md#canonical-names); {i} a layer, {j} an aux chunk.
_LAYER = r"layers\.(?P<i>[0-9]+)\."
CANONICAL = [re.compile(p + r"$") for p in (
    r"embed_tokens\.weight", r"fc\.weight", r"fc\.bias", r"fc_norm\.(?P<j>[0-9]+)\.weight", r"input_norm\.weight",
    r"norm\.weight", r"lm_head\.weight", r"d2t", r"t2d", r"mask_hidden",
    _LAYER + r"self_attn\.(q|k|v|o)_proj\.(weight|bias)",
    _LAYER + r"self_attn\.(q_norm|k_norm)\.weight",
    _LAYER + r"self_attn\.(q_a_proj|q_a_layernorm|q_b_proj|kv_a_proj_with_mqa|kv_a_layernorm|kv_b_proj)\.weight",
    _LAYER + r"mlp\.(gate|up|down)_proj\.weight",
    _LAYER + r"(input_layernorm|hidden_norm|post_attention_layernorm)\.weight",
)]
_MAX_NAME_FINDINGS = 20  # a hostile file may hold 10⁵ strange names; name the first few


@check
def names(ctx: Context) -> None:
    stored = list(ctx.ckpt.tensor_file)
    quantized = ctx.config.has("quantization_config") or "hf_quant_config.json" in ctx.ckpt.file_names
    prefixed = [n for n in stored if n.startswith("model.")]
    if prefixed:
        ctx.emit(rule.MODEL_PREFIX, f"{len(prefixed)} keys start with 'model.' (e.g. '{prefixed[0]}')",
                 ctx.ckpt.locate(prefixed[0]))
    mid = [n for n in stored if re.match(r"midlayer\.[0-9]+\.", n)]
    if mid:
        ctx.emit(rule.MULTI_LAYER_MIDLAYER, f"'{mid[0]}' and {len(mid) - 1} more", ctx.ckpt.locate(mid[0]))
    for canon, first, second in ctx.view.collisions[:_MAX_NAME_FINDINGS]:
        ctx.emit(rule.DUPLICATE_TENSOR, f"'{first}' and '{second}' are both '{canon}'", ctx.ckpt.locate(second))
    unknown = 0
    for canon in ctx.view.names():
        if mid and ctx.view.stored[canon] in mid:
            continue
        if quantized and canon.endswith(SCALE_SUFFIXES):  # scales: known only with a quantization_config
            continue
        if not any(p.match(canon) for p in CANONICAL):
            unknown += 1
            if unknown <= _MAX_NAME_FINDINGS:
                ctx.emit(rule.UNKNOWN_TENSOR,
                         f"'{ctx.view.stored[canon]}' is not an EAGLE-3 tensor", ctx.view.locate(canon))
        elif canon.endswith(".bias") and (canon == "fc.bias" or not ctx.spec.attention_bias):
            ctx.emit(rule.BIAS_IGNORED, f"'{ctx.view.stored[canon]}' is dropped by vLLM", ctx.view.locate(canon))
    if unknown > _MAX_NAME_FINDINGS:
        ctx.emit(rule.UNKNOWN_TENSOR, f"and {unknown - _MAX_NAME_FINDINGS} more unknown tensors")


def _sum(*xs: int | None) -> int | None:
    return None if any(x is None for x in xs) else sum(xs)  # type: ignore[arg-type]


def _mul(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a * b


def layer_tensors(spec: DrafterSpec, i: int, mla: dict[str, int | None]) -> dict[str, tuple[int | None, ...]]:
    """Expected canonical tensors of decoder layer i with their shapes (None: unknown / not checked)."""
    H, I = spec.hidden_size, spec.intermediate_size
    nh, nkv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    in_w = 2 * H if (H is not None and i == 0) else H
    p = f"layers.{i}."
    out: dict[str, tuple[int | None, ...]] = {
        p + "mlp.gate_proj.weight": (I, H),
        p + "mlp.up_proj.weight": (I, H),
        p + "mlp.down_proj.weight": (H, I),
        p + "input_layernorm.weight": (H,),
        p + "post_attention_layernorm.weight": (H,),
    }
    if i == 0:
        out[p + "hidden_norm.weight"] = (H,)
    if spec.arch == "mla":
        a = f"{p}self_attn."
        q_lora, kv_lora, rope, v = mla["q_lora_rank"], mla["kv_lora_rank"], mla["qk_rope_head_dim"], mla["v_head_dim"]
        qk = _sum(mla["qk_nope_head_dim"], rope)
        if mla["lora_q"]:  # q through a low-rank q_a/q_b pair unless q_lora_rank is null
            out[a + "q_a_proj.weight"] = (q_lora, in_w)
            out[a + "q_a_layernorm.weight"] = (q_lora,)
            out[a + "q_b_proj.weight"] = (_mul(nh, qk), q_lora)
        else:
            out[a + "q_proj.weight"] = (_mul(nh, qk), in_w)
        out[a + "kv_a_proj_with_mqa.weight"] = (_sum(kv_lora, rope), in_w)
        out[a + "kv_a_layernorm.weight"] = (kv_lora,)
        out[a + "kv_b_proj.weight"] = (_mul(nh, _sum(mla["qk_nope_head_dim"], v)), kv_lora)
        out[a + "o_proj.weight"] = (H, _mul(nh, v))
        return out
    q = nh * d if nh and d else None
    kv = nkv * d if nkv and d else None
    out.update({
        p + "self_attn.q_proj.weight": (q, in_w),
        p + "self_attn.k_proj.weight": (kv, in_w),
        p + "self_attn.v_proj.weight": (kv, in_w),
        p + "self_attn.o_proj.weight": (H, q),
    })
    if spec.arch == "qwen3":
        out[p + "self_attn.q_norm.weight"] = (d,)
        out[p + "self_attn.k_norm.weight"] = (d,)
    return out


def _fmt(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if s is None else str(s) for s in shape) + "]"


@check
def layers(ctx: Context) -> None:
    spec, view = ctx.spec, ctx.view
    present = sorted({i for c in view.stored if (i := layer_index(c)) is not None})
    declared = spec.num_hidden_layers
    if declared is not None and (len(present) != declared or present != list(range(declared))):
        shown = present if len(present) <= 8 else [*present[:8], "..."]
        ctx.emit(rule.LAYER_COUNT, f"num_hidden_layers is {declared}, layer blocks present: {shown or 'none'}",
                 ctx.at("num_hidden_layers"))
    expected: dict[str, tuple[int | None, ...]] = {}
    mla: dict[str, int | None] = dict(spec.mla or {})  # the MLA sizes as read; lora_q 0: an explicit q_lora_rank null
    mla["lora_q"] = 0 if spec.sources.get("q_lora_rank", "").startswith("config: q_lora_rank null") else 1
    for i in sorted(set(present[:64]) | {0}):  # layer-count already names absent layers; no flood per tensor
        expected.update(layer_tensors(spec, i, mla))
    H, Ht, n = spec.hidden_size, spec.aux_width, spec.num_aux_hidden_states
    expected["fc.weight"] = (H, None)
    expected["norm.weight"] = (H,)
    if spec.has_lm_head:
        expected["lm_head.weight"] = (None, H)  # rows: the vocab rules compare them
    if spec.has_embed_tokens:
        expected["embed_tokens.weight"] = (spec.vocab_size, H)
    if "input_norm.weight" in view and n and Ht:
        expected["input_norm.weight"] = (n * Ht,)
    for canon in view.names():
        if canon.startswith("fc_norm."):
            expected[canon] = (Ht,)
    for canon, shape in expected.items():
        if canon not in view:
            if canon.startswith(("layers.", "fc.", "norm.")):
                ctx.emit(rule.MISSING_TENSOR, f"'{ctx.dialect.from_canonical(canon)}' is missing", canon)
            continue
        actual = view.shape(canon)
        if actual is not None and (len(actual) != len(shape) or
                                   any(e is not None and a != e for a, e in zip(actual, shape, strict=True))):
            ctx.emit(rule.TENSOR_SHAPE, f"'{view.stored[canon]}' is {list(actual)}, config implies {_fmt(shape)}",
                     view.locate(canon))

