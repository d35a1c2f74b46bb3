"""The rule catalogue and the checks behind `inspect`.

Severity policy: **error** = vLLM 0.32 (our reference consumer) fails to load the drafter or
serves it silently degraded; **warning** = another engine or tool misreads it, or the files
cannot settle a fact that decides acceptance; **info** = worth knowing, nothing to fix.
Each rule id is stable and has exactly one severity; `docs/rules.md` is generated from RULES.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .checkpoint import Checkpoint
from .formats import MISSING, Dialect, config_get
from .reading import AUX_ID_PATHS, CanonicalView, float_dtypes
from .safetensors_io import COMMON_DTYPES, FLOAT_DTYPES
from .spec import DrafterSpec, default_aux_ids


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str  # error | warning | info
    title: str
    fix: str


RULES: dict[str, Rule] = {}


def _rule(id: str, severity: str, title: str, fix: str) -> None:
    assert id not in RULES, id
    RULES[id] = Rule(id, severity, title, fix)


E, W, I = "error", "warning", "info"
# --- files
_rule("config-missing", E, "No config.json next to the weights", "add the drafter's config.json")
_rule("config-field-invalid", E, "A config field has the wrong type", "fix the value in config.json")
_rule("config-field-missing", E, "A config field the engines need is absent", "add it to config.json (never guessed)")
_rule("pickle-file", W, "Weights are a pickle (.bin)", "eaglectl convert to safetensors")
_rule("metadata-format", W, "safetensors __metadata__ lacks format=pt (transformers refuses the file)",
      "rewrite with metadata {'format': 'pt'} (eaglectl convert does)")
_rule("shard-index", E, "The shard index disagrees with the shards", "regenerate model.safetensors.index.json")
_rule("nonfinite-values", E, "A tensor holds NaN or Inf (--scan)", "re-export from a healthy training checkpoint")
_rule("exotic-dtype", W, "A tensor uses an F8/F6/F4/complex/unsigned dtype the reference cannot run",
      "dequantise, or check that your engine supports it")
_rule("mixed-dtypes", W, "Floating-point tensors come in more than one dtype", "convert --dtype to one dtype")
_rule("dtype-mismatch", W, "config torch_dtype disagrees with the tensors", "set torch_dtype to the tensors' dtype")
# --- architecture and layout
_rule("architectures-missing", W, "config has no 'architectures'", "set architectures (e.g. LlamaForCausalLMEagle3)")
_rule("architectures-plain", W, "architectures names a plain target class",
      "use an EAGLE-3 class: sglang/SpecForge route a plain class to the target loader")
_rule("architectures-unregistered", E, "architectures names a class no engine registers",
      "rename to LlamaForCausalLMEagle3 (eaglectl convert does)")
_rule("architectures-mismatch", E, "architectures disagrees with the weights' family", "fix architectures / model_type")
_rule("speculators-config", E, "speculators_config lacks a key vLLM needs", "add the nested key")
_rule("model-prefix", E, "Keys carry a 'model.' prefix, which vLLM doubles and rejects",
      "eaglectl convert --to speculators (strips it)")
_rule("multi-layer-midlayer", E, "midlayer.N.* keys (TRT-LLM naming) become layers.0.N.* in vLLM and fail",
      "rename to layers.N.* and check which norm layers >= 1 were trained with")
_rule("unknown-tensor", E, "A tensor matches no EAGLE-3 canonical name (vLLM raises on unknown names)",
      "drop or rename it")
_rule("duplicate-tensor", E, "Two stored names map to the same canonical tensor", "keep one of them")
_rule("missing-tensor", E, "A tensor the architecture needs is absent (vLLM leaves it at its init value)",
      "export it from the training checkpoint")
_rule("layer-count", E, "num_hidden_layers disagrees with the layer blocks present", "fix num_hidden_layers")
_rule("tensor-shape", E, "A tensor's shape disagrees with the config", "fix the config or the tensor")
_rule("bias-ignored", W, "A .bias tensor vLLM silently ignores", "drop it, or serve with an engine that uses it")
# --- vocabulary mapping
_rule("draft-vocab-size-missing", E, "draft_vocab_size is absent while lm_head is smaller than the vocab",
      "set draft_vocab_size to lm_head's row count")
_rule("draft-vocab-size-mismatch", E, "draft_vocab_size, lm_head rows and len(d2t) disagree", "make them equal")
_rule("d2t-missing", E, "Reduced draft vocab without d2t: vLLM maps draft id i to target id i",
      "export d2t from the training run")
_rule("d2t-dtype", E, "d2t is not an integer tensor", "store int64 offsets")
_rule("d2t-shape", E, "d2t is not one-dimensional", "store d2t with shape [draft_vocab_size]")
_rule("d2t-range", E, "i + d2t[i] falls outside the target vocab", "rebuild d2t as offsets: target_id - draft_id")
_rule("d2t-duplicate", E, "Two draft ids map to the same target id", "rebuild d2t from the unique selected ids")
_rule("d2t-unfilled", E, "d2t is all zeros with a reduced vocab (the mapping was never filled in)",
      "export the trained mapping")
_rule("d2t-order", W, "d2t is not increasing (only ModelOpt writes frequency order)",
      "check the producer; sorted ids are expected")
_rule("d2t-full-vocab", E, "d2t present although draft vocab == vocab (vLLM 0.32 has no parameter for it)",
      "drop d2t/t2d (eaglectl convert does)")
_rule("t2d-dtype", E, "t2d is not a bool mask", "store t2d as bool")
_rule("t2d-shape", E, "t2d length differs from the target vocab", "rebuild t2d with length vocab_size")
_rule("t2d-count", E, "t2d.sum() differs from the draft vocab size", "rebuild t2d from d2t")
_rule("t2d-d2t-mismatch", E, "t2d is false at a target id d2t maps to", "rebuild t2d from d2t")
# --- aux hidden states and widths
_rule("aux-ids-implicit", I, "The layout cannot store aux ids; engines use their default", "nothing")
_rule("aux-ids-missing", W, "No aux layer ids: each engine falls back to its own heuristic",
      "write eagle_aux_hidden_state_layer_ids explicitly")
_rule("aux-ids-conflict", E, "Top-level and eagle_config aux ids differ (vLLM captures one, sizes with the other)",
      "keep one list")
_rule("aux-ids-duplicate", E, "Aux ids repeat (vLLM de-duplicates, fc expects more states)", "list distinct ids")
_rule("aux-ids-unsorted", E, "Aux ids are not ascending (vLLM sorts them; chunks reorder)", "sort them and fc's columns")
_rule("aux-ids-range", E, "An aux id is negative or beyond the target's layers", "fix the ids for the target")
_rule("aux-ids-count", E, "Number of aux ids differs from fc's in-features / target_hidden_size", "fix ids or fc")
_rule("aux-count-unsized", E, "N != 3 aux states but vLLM sizes fc for 3 (no num_aux_hidden_states)",
      "write num_aux_hidden_states and eagle_config.eagle_aux_hidden_state_layer_ids")
_rule("aux-count-not-3", W, "N != 3 aux states: older engines hard-code 3", "serve with vLLM >= 0.22 or sglang with N-aux support")
_rule("aux-ids-output-convention", W, "Aux ids are output-of-layer ids: vLLM reads the same numbers as boundary "
      "ids, one layer too early", "for vLLM: eaglectl convert --to speculators (or modelopt), which translates them")
_rule("aux-convention-unverifiable", W, "The aux-id convention cannot be known from the files",
      "pass the convention when converting; measure AL with `eaglectl smoke`")
_rule("target-hidden-size", E, "fc's in-features do not fit target_hidden_size x aux count",
      "set target_hidden_size to the target's hidden size")
# --- norms and flags
_rule("fc-norm-weights-without-flag", E, "fc_norm.N weights present but fc_norm is false (vLLM load error)",
      "set fc_norm: true")
_rule("fc-norm-flag-without-weights", E, "fc_norm true but no fc_norm.N weights (vLLM runs with ones)",
      "export the trained fc_norm weights or run eaglectl upgrade")
_rule("fc-norm-count", E, "fc_norm.N indices do not match the aux count", "one fc_norm per aux state, 0..N-1")
_rule("input-norm-without-flag", E, "input_norm.weight present but norm_before_fc false (vLLM drops it silently)",
      "set norm_before_fc: true (top level and eagle_config)")
_rule("norm-before-fc-without-weights", E, "norm_before_fc true but no input_norm.weight (vLLM runs with ones)",
      "export input_norm.weight")
_rule("double-norm", E, "norm_before_fc and fc_norm both true: vLLM applies both, TRT-LLM one, speculators rejects",
      "keep exactly one")
_rule("norm-before-fc-placement", W, "norm_before_fc stored in one place only (TRT-LLM reads eagle_config, "
      "speculators the top level)", "write it in both places")
_rule("mla-norm-before-fc", E, "MLA drafter with norm_before_fc / input_norm (vLLM's DeepSeek path cannot load it)",
      "drop input_norm; MLA supports fc_norm only")
_rule("flag-absent", W, "A semantic flag is absent and engines disagree on its default",
      "write the flag explicitly (eaglectl convert writes all four)")
_rule("flags-implicit", I, "The layout cannot record the 3.1 flags; they are off by definition", "nothing")
_rule("specforge-norm-output-window", W, "SpecForge 3.1 checkpoint: norm_output meant something else before PR #879",
      "check the SpecForge commit: trained in 2026-07-20..09-15 means serve with norm_output false")
# --- tables, rope, engine
_rule("lm-head-missing", E, "No lm_head with a reduced vocab: vLLM substitutes the target's full head",
      "export lm_head [draft_vocab_size, hidden]")
_rule("lm-head-borrowed", W, "No lm_head: vLLM borrows the target head, sglang starts a random one",
      "export lm_head, or eaglectl convert --target to materialise it")
_rule("embed-tokens-missing", E, "No embed_tokens and target_hidden_size != hidden_size: vLLM cannot share "
      "the target's", "export the drafter's embed_tokens")
_rule("embed-tokens-shared", I, "No embed_tokens: engines share the target's embedding", "nothing")
_rule("tie-word-embeddings", W, "tie_word_embeddings is true: sglang ties lm_head to embed_tokens, vLLM ignores it",
      "set tie_word_embeddings: false")
_rule("rope-inconsistent", E, "rope_theta / rope_scaling disagree with rope_parameters",
      "write both encodings with the values the drafter was trained with")
_rule("rope-theta-missing", I, "No rope_theta: engines use base 10000", "nothing, if the drafter was trained so")
_rule("method-from-path", W, "The path contains 'eagle-': vLLM without an explicit method runs it as EAGLE-1 "
      "(checked before 'eagle3')",
      "always pass method: eagle3 (as the printed speculative config does)")
# --- against a target (--target)
_rule("target-vocab-mismatch", E, "Drafter vocab differs from the target's vocab_size", "use the drafter trained for this target")
_rule("target-hidden-mismatch", E, "Aux width differs from the target's hidden_size", "use the drafter trained for this target")
_rule("target-aux-range", E, "An aux id is beyond the target's layers", "fix the ids for this target")
_rule("target-aux-default-collision", E, "No aux ids and the target's default ids collide (few layers)",
      "write explicit ids")
_rule("target-rope-differs", I, "Drafter RoPE differs from the target's (normal for SafeAILab heads)", "nothing, if trained so")
_rule("target-embeddings", I, "Whether embed_tokens / lm_head rows equal the target's", "nothing")
_rule("target-verifier-mismatch", W, "speculators verifier differs from --target", "serve with the intended target")
# --- model card (check)
_rule("card-base-model", E, "The card's base_model is not the drafter's target", "fix base_model (eaglectl check --card)")
_rule("card-eagle-version", E, "The card claims another EAGLE version than the files", "fix the eagle3 / eagle3.1 tags")
_rule("card-tags", W, "The card lacks the speculative-decoding / eagle3 tags", "add them (eaglectl check --card)")
_rule("card-k", E, "The card's vLLM snippet uses another k than the speculators config", "fix the snippet")
_rule("card-dialect", E, "The card claims another checkpoint layout than the files", "fix the card")
_rule("card-provenance", W, "An upgraded drafter's card does not say it needs fine-tuning", "say so (check --card does)")


@dataclass
class Finding:
    rule: str
    message: str
    locator: str | None = None

    @property
    def severity(self) -> str:
        return RULES[self.rule].severity

    def to_json(self) -> dict[str, Any]:
        r = RULES[self.rule]
        return {"rule_id": self.rule, "severity": r.severity, "message": self.message,
                "hint": r.fix, "locator": self.locator}


@dataclass
class TargetFacts:
    """What --target contributes: its config and (optionally) lazy access to its tables."""

    source: str
    config: dict[str, Any]
    ckpt: Checkpoint | None

    def text_config(self) -> dict[str, Any]:
        inner = self.config.get("text_config")
        return inner if isinstance(inner, dict) else self.config


@dataclass
class Context:
    ckpt: Checkpoint
    dialect: Dialect
    view: CanonicalView
    spec: DrafterSpec
    invalid: list[tuple[str, str]]
    target: TargetFacts | None = None
    scan: bool = False
    progress: Callable[..., Any] = lambda it, **kw: it
    findings: list[Finding] = field(default_factory=list)
    _arrays: dict[str, Any] = field(default_factory=dict)

    def emit(self, rule: str, message: str, locator: str | None = None) -> None:
        assert rule in RULES, rule
        self.findings.append(Finding(rule, message, locator))

    def array(self, canon: str) -> Any:
        if canon not in self._arrays:
            self._arrays[canon] = self.view.read(canon)
        return self._arrays[canon]

    @property
    def where(self) -> str:
        return self.ckpt.config_name or f"{self.ckpt.root}/config.json"


CHECKS: list[Callable[[Context], None]] = []


def check(fn: Callable[[Context], None]) -> Callable[[Context], None]:
    CHECKS.append(fn)
    return fn


def run_checks(ctx: Context) -> list[Finding]:
    for fn in CHECKS:
        fn(ctx)
    return ctx.findings


# ---------------------------------------------------------------------------------------- files

@check
def files(ctx: Context) -> None:
    if ctx.ckpt.config is None:
        ctx.emit("config-missing", f"{ctx.ckpt.root}: no config.json", f"{ctx.ckpt.root}/config.json")
    for path, message in ctx.invalid:
        ctx.emit("config-field-invalid", message, f"{ctx.where}:{path}")
    for locator, message in ctx.ckpt.index_problems:
        ctx.emit("shard-index", message, locator)
    for wf in ctx.ckpt.files:
        if wf.pickled is not None:
            ctx.emit("pickle-file", f"{wf.name} is a pickle; safetensors is safer and loads lazily", wf.name)
        meta = wf.header.metadata
        if meta is not None and meta.get("format") not in ("pt", "tf", "flax", "mlx"):
            ctx.emit("metadata-format", f"{wf.name}: __metadata__ {dict(meta)} has no format", wf.name)


@check
def dtypes(ctx: Context) -> None:
    for name, info in ctx.ckpt.tensors.items():
        if info.dtype not in COMMON_DTYPES:
            ctx.emit("exotic-dtype", f"'{name}' is {info.dtype}", ctx.ckpt.locate(name))
    floats = float_dtypes(ctx.ckpt)
    if len(floats) > 1:
        ctx.emit("mixed-dtypes", f"floating tensors use {', '.join(sorted(floats))}")
    want = _DTYPE_NAMES.get((ctx.spec.config_dtype or "").removeprefix("torch."))
    if ctx.spec.config_dtype and floats and want not in floats:
        ctx.emit("dtype-mismatch", f"config says {ctx.spec.config_dtype}, tensors are {', '.join(sorted(floats))}",
                 f"{ctx.where}:torch_dtype")


_DTYPE_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "half": "F16",
                "float": "F32"}


@check
def scan(ctx: Context) -> None:
    if not ctx.scan:
        return
    names = [n for n, i in ctx.ckpt.tensors.items() if i.dtype in FLOAT_DTYPES]
    for name in ctx.progress(names, label="scanning for NaN/Inf", total=len(names)):
        bad = ctx.ckpt.count_nonfinite(name)
        if bad:
            ctx.emit("nonfinite-values", f"'{name}' has {bad} NaN/Inf values", ctx.ckpt.locate(name))


# --------------------------------------------------------------------------------- architecture

_PLAIN = {"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}
_REGISTERED = {
    "llama": {"Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3MiniMaxM2ForCausalLM",
              "Eagle3Qwen2_5vlForCausalLM", "Eagle3Qwen3vlForCausalLM", "PEagleDraftModel", "PeagleLlamaForCausalLM"},
    "qwen3": {"Eagle3Qwen3ForCausalLM", "PeagleQwen3ForCausalLM"},
    "mla": {"Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"},
}


@check
def architectures(ctx: Context) -> None:
    cfg = ctx.ckpt.config
    if cfg is None:
        return
    if ctx.dialect.name == "speculators":
        _speculators_config(ctx, cfg)
        return
    archs = cfg.get("architectures")
    loc = f"{ctx.where}:architectures"
    if not archs:
        ctx.emit("architectures-missing", "config has no architectures", loc)
        return
    arch = archs[0] if isinstance(archs, list) else archs
    known = {a for names in _REGISTERED.values() for a in names}
    if arch in _PLAIN:
        renamed = f"Eagle3{arch}"
        family = "qwen3" if arch.startswith("Qwen3") else "llama"
        if family != ctx.spec.arch:
            ctx.emit("architectures-mismatch", f"'{arch}' but the weights are {ctx.spec.arch}-style", loc)
        else:
            ctx.emit("architectures-plain", f"'{arch}' is a target class (vLLM renames it {renamed} with method eagle3)", loc)
        return
    if arch not in known:
        ctx.emit("architectures-unregistered", f"'{arch}' is registered in no engine", loc)
        return
    if arch not in _REGISTERED[ctx.spec.arch] and not (ctx.spec.arch == "qwen3" and arch in _REGISTERED["llama"]):
        ctx.emit("architectures-mismatch", f"'{arch}' but the weights are {ctx.spec.arch}-style", loc)


def _speculators_config(ctx: Context, cfg: dict[str, Any]) -> None:
    loc = ctx.where
    for path in ("speculators_config.proposal_methods", "speculators_config.verifier.name_or_path",
                 "speculators_model_type", "transformer_layer_config"):
        if config_get(cfg, path) in (MISSING, None, [], ""):
            ctx.emit("speculators-config", f"speculators config lacks '{path}'", f"{loc}:{path}")
    methods = config_get(cfg, "speculators_config.proposal_methods")
    if isinstance(methods, list) and methods and isinstance(methods[0], dict):
        if "speculative_tokens" not in methods[0]:
            ctx.emit("speculators-config", "proposal_methods[0] lacks 'speculative_tokens'",
                     f"{loc}:speculators_config.proposal_methods[0]")
    mt = config_get(cfg, "transformer_layer_config.model_type")
    if mt not in (MISSING, None, "llama", "qwen3"):
        ctx.emit("speculators-config", f"transformer_layer_config.model_type '{mt}': vLLM accepts llama or qwen3",
                 f"{loc}:transformer_layer_config.model_type")
    elif (mt == "qwen3") != (ctx.spec.arch == "qwen3"):
        ctx.emit("architectures-mismatch", f"transformer_layer_config.model_type is {mt or 'absent (llama)'} "
                 f"but the weights are {ctx.spec.arch}-style", f"{loc}:transformer_layer_config.model_type")


@check
def required_fields(ctx: Context) -> None:
    if ctx.ckpt.config is None:
        return
    need = ["hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "vocab_size",
            "rms_norm_eps"]
    if ctx.spec.arch == "mla":
        need = ["hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "vocab_size"]
    for name in need:
        if getattr(ctx.spec, name) is None and not ctx.spec.sources.get(name, "").startswith("invalid"):
            ctx.emit("config-field-missing", f"config lacks '{name}'", f"{ctx.where}:{name}")
    s = ctx.spec
    if s.arch != "mla" and s.head_dim is None and s.hidden_size and s.num_attention_heads:
        ctx.emit("config-field-missing", f"config lacks 'head_dim' and hidden_size {s.hidden_size} is not divisible "
                 f"by num_attention_heads {s.num_attention_heads}", f"{ctx.where}:head_dim")


# ------------------------------------------------------------------------------ tensor names

# Canonical tensor names (formats.md §1); {i} a layer, {j} an aux chunk.
_LAYER = r"layers\.(?P<i>\d+)\."
CANONICAL = [re.compile(p + r"$") for p in (
    r"embed_tokens\.weight", r"fc\.weight", r"fc\.bias", r"fc_norm\.(?P<j>\d+)\.weight", r"input_norm\.weight",
    r"norm\.weight", r"lm_head\.weight", r"d2t", r"t2d", r"mask_hidden",
    _LAYER + r"self_attn\.(q|k|v|o)_proj\.(weight|bias)",
    _LAYER + r"self_attn\.(q_norm|k_norm)\.weight",
    _LAYER + r"self_attn\.(q_a_proj|q_a_layernorm|q_b_proj|kv_a_proj_with_mqa|kv_a_layernorm|kv_b_proj)\.weight",
    _LAYER + r"mlp\.(gate|up|down)_proj\.weight",
    _LAYER + r"(input_layernorm|hidden_norm|post_attention_layernorm)\.weight",
)]


# Scales of a quantized drafter (ModelOpt FP8/NVFP4 exports); known only with a quantization_config.
QUANT_SUFFIXES = (".weight_scale", ".weight_scale_2", ".weight_scale_inv", ".input_scale", ".k_scale", ".v_scale")


@check
def names(ctx: Context) -> None:
    stored = list(ctx.ckpt.tensor_file)
    quantized = "quantization_config" in (ctx.ckpt.config or {})
    prefixed = [n for n in stored if n.startswith("model.")]
    if prefixed:
        ctx.emit("model-prefix", f"{len(prefixed)} keys start with 'model.' (e.g. '{prefixed[0]}')",
                 ctx.ckpt.locate(prefixed[0]))
    mid = [n for n in stored if re.match(r"midlayer\.\d+\.", n)]
    if mid:
        ctx.emit("multi-layer-midlayer", f"'{mid[0]}' and {len(mid) - 1} more", ctx.ckpt.locate(mid[0]))
    for canon, first, second in ctx.view.collisions:
        ctx.emit("duplicate-tensor", f"'{first}' and '{second}' are both '{canon}'", ctx.ckpt.locate(second))
    for canon in ctx.view.names():
        if mid and ctx.view.stored[canon] in mid:
            continue
        if quantized and canon.endswith(QUANT_SUFFIXES):
            continue
        if not any(p.match(canon) for p in CANONICAL):
            ctx.emit("unknown-tensor", f"'{ctx.view.stored[canon]}' is not an EAGLE-3 tensor", ctx.view.locate(canon))
        elif canon.endswith(".bias") and (canon == "fc.bias" or not ctx.spec.attention_bias):
            ctx.emit("bias-ignored", f"'{ctx.view.stored[canon]}' is dropped by vLLM", ctx.view.locate(canon))


def _mla_dims(ctx: Context) -> dict[str, int | None]:
    root = config_get(ctx.ckpt.config, ctx.dialect.arch_config) if ctx.dialect.arch_config else ctx.ckpt.config
    root = root if isinstance(root, dict) else {}
    dims: dict[str, int | None] = {k: root.get(k) if isinstance(root.get(k), int) else None
                                   for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                             "v_head_dim")}
    dims["lora_q"] = 0 if ("q_lora_rank" in root and root["q_lora_rank"] is None) else 1
    return dims


def _sum(*xs: int | None) -> int | None:
    return None if any(x is None for x in xs) else sum(xs)  # type: ignore[arg-type]


def _mul(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a * b


def _layer_tensors(spec: DrafterSpec, i: int, mla: dict[str, int | None]) -> dict[str, tuple[int | None, ...] | None]:
    """Expected canonical tensors of decoder layer i with their shapes (None: unknown / not checked)."""
    H, I = spec.hidden_size, spec.intermediate_size
    nh, nkv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    in_w = 2 * H if (H is not None and i == 0) else H
    p = f"layers.{i}."
    out: dict[str, tuple[int | None, ...] | None] = {
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


def _shape_ok(actual: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    return len(actual) == len(expected) and all(e is None or a == e for a, e in zip(actual, expected, strict=True))


def _fmt(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if s is None else str(s) for s in shape) + "]"


@check
def layers(ctx: Context) -> None:
    spec, view = ctx.spec, ctx.view
    present = view.layer_indices()
    declared = spec.num_hidden_layers
    if declared is not None and present != list(range(declared)):
        ctx.emit("layer-count", f"num_hidden_layers is {declared}, layer blocks present: {present or 'none'}",
                 f"{ctx.where}:num_hidden_layers")
    expected: dict[str, tuple[int | None, ...] | None] = {}
    mla = _mla_dims(ctx)
    for i in sorted(set(present) | {0}):  # layer-count already names absent layers; no flood per tensor
        expected.update(_layer_tensors(spec, i, mla))
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
                ctx.emit("missing-tensor", f"'{ctx.dialect.from_canonical(canon)}' is missing", canon)
            continue
        actual = view.shape(canon)
        if shape is not None and actual is not None and not _shape_ok(actual, shape):
            ctx.emit("tensor-shape", f"'{view.stored[canon]}' is {list(actual)}, config implies {_fmt(shape)}",
                     view.locate(canon))


# ------------------------------------------------------------------------------------ vocab

@check
def vocab(ctx: Context) -> None:
    spec, view = ctx.spec, ctx.view
    V, Vd = spec.vocab_size, spec.draft_vocab_size
    head_rows = view.shape("lm_head.weight")[0] if spec.has_lm_head else None
    d2t_len = view.shape("d2t")[0] if "d2t" in view and len(view.shape("d2t") or ()) == 1 else None
    if Vd is None and head_rows is not None and V is not None and head_rows < V:
        ctx.emit("draft-vocab-size-missing", f"lm_head has {head_rows} rows, vocab_size is {V}",
                 f"{ctx.where}:draft_vocab_size")
    sizes = {k: v for k, v in (("draft_vocab_size", Vd), ("lm_head rows", head_rows), ("len(d2t)", d2t_len))
             if v is not None}
    if len(set(sizes.values())) > 1:
        ctx.emit("draft-vocab-size-mismatch", ", ".join(f"{k} {v}" for k, v in sizes.items()),
                 f"{ctx.where}:draft_vocab_size")
    Vd_eff = d2t_len or head_rows or Vd  # the tensors decide; a disagreeing config is reported above
    reduced = V is not None and Vd_eff is not None and Vd_eff < V
    if "d2t" not in view:
        if reduced:
            ctx.emit("d2t-missing", f"draft vocab {Vd_eff} < vocab {V} and no d2t", "d2t")
    else:
        _check_d2t(ctx, V, Vd_eff, reduced)
    if "t2d" in view:
        _check_t2d(ctx, V, Vd_eff)


def _check_d2t(ctx: Context, V: int | None, Vd: int | None, reduced: bool) -> None:
    import numpy as np

    view, loc = ctx.view, ctx.view.locate("d2t")
    info = view.info("d2t")
    if not V or not reduced:
        if V is not None and Vd == V:
            ctx.emit("d2t-full-vocab", f"draft vocab == vocab ({V}) but d2t is present", loc)
    if info.dtype not in ("I64", "I32", "I16", "U8", "I8"):
        ctx.emit("d2t-dtype", f"d2t is {info.dtype}, expected I64", loc)
        return
    if len(info.shape) != 1:
        ctx.emit("d2t-shape", f"d2t has shape {list(info.shape)}", loc)
        return
    d2t = ctx.array("d2t").astype(np.int64)
    if reduced and not d2t.any():
        ctx.emit("d2t-unfilled", f"all {len(d2t)} offsets are zero with vocab {V}", loc)
        return
    target_ids = np.arange(len(d2t)) + d2t
    if V is not None:
        bad = np.flatnonzero((target_ids < 0) | (target_ids >= V))
        if bad.size:
            i = int(bad[0])
            ctx.emit("d2t-range", f"{bad.size} ids out of [0, {V}), first: draft {i} -> {int(target_ids[i])}", loc)
    uniq, counts = np.unique(target_ids, return_counts=True)
    if (counts > 1).any():
        dup = int(uniq[counts > 1][0])
        ctx.emit("d2t-duplicate", f"{int((counts > 1).sum())} target ids repeat, e.g. {dup}", loc)
    elif ctx.dialect.name != "modelopt" and len(target_ids) > 1 and not (np.diff(target_ids) > 0).all():
        ctx.emit("d2t-order", "arange + d2t is not increasing", loc)


def _check_t2d(ctx: Context, V: int | None, Vd: int | None) -> None:
    import numpy as np

    view, loc = ctx.view, ctx.view.locate("t2d")
    info = view.info("t2d")
    if info.dtype not in ("BOOL", "U8"):
        ctx.emit("t2d-dtype", f"t2d is {info.dtype}, expected BOOL", loc)
        return
    if len(info.shape) != 1 or (V is not None and info.shape[0] != V):
        ctx.emit("t2d-shape", f"t2d has shape {list(info.shape)}, vocab_size is {V}", loc)
        return
    t2d = ctx.array("t2d").astype(bool)
    if Vd is not None and int(t2d.sum()) != Vd:
        ctx.emit("t2d-count", f"t2d has {int(t2d.sum())} true entries, draft vocab is {Vd}", loc)
    if "d2t" in view and view.info("d2t").dtype.startswith(("I", "U")) and len(view.info("d2t").shape) == 1:
        ids = np.arange(view.info("d2t").shape[0]) + ctx.array("d2t").astype(np.int64)
        ids = ids[(ids >= 0) & (ids < len(t2d))]
        if not t2d[ids].all():
            ctx.emit("t2d-d2t-mismatch", f"{int((~t2d[ids]).sum())} mapped target ids are false in t2d", loc)


# ---------------------------------------------------------------------------------- aux states

@check
def aux(ctx: Context) -> None:
    spec, cfg = ctx.spec, ctx.ckpt.config or {}
    ids, n = spec.aux_layer_ids, spec.num_aux_hidden_states
    Ht = spec.aux_width
    fc = ctx.view.shape("fc.weight")
    if fc is not None and len(fc) == 2 and Ht and fc[1] % Ht:
        ctx.emit("target-hidden-size", f"fc.weight has {fc[1]} in-features, not a multiple of "
                 f"target_hidden_size {Ht}", ctx.view.locate("fc.weight"))
    lists = {p: config_get(cfg, p) for p in AUX_ID_PATHS}
    lists = {p: v for p, v in lists.items() if isinstance(v, list)}
    if len(lists) == 2 and len(set(map(tuple, lists.values()))) == 2:
        ctx.emit("aux-ids-conflict", " vs ".join(f"{p} {v}" for p, v in lists.items()), ctx.where)
    if ids is None:
        if ctx.spec.sources.get("aux_layer_ids", "").startswith("invalid"):
            return
        heuristics = ("engines use the default layers: vLLM (2, L//2, L-3) boundary = sglang/TRT-LLM (1, L//2-1, L-4) "
                      "output-of-layer, the same physical states; right only if the drafter was trained on them")
        if ctx.target is not None and isinstance(ctx.target.text_config().get("num_hidden_layers"), int):
            L = ctx.target.text_config()["num_hidden_layers"]
            heuristics = (f"for this {L}-layer target vLLM captures {list(default_aux_ids(L, 'boundary'))} "
                          f"(= sglang {list(default_aux_ids(L, 'output'))} output-of-layer); right only if the "
                          "drafter was trained on them")
        rule = "aux-ids-missing" if ctx.dialect.aux_ids_paths else "aux-ids-implicit"
        ctx.emit(rule, f"no aux layer ids; {heuristics}", ctx.where)
    else:
        loc = f"{ctx.where}:{spec.sources.get('aux_layer_ids', '').removeprefix('config: ')}"
        if len(set(ids)) != len(ids):
            ctx.emit("aux-ids-duplicate", f"aux ids {list(ids)} repeat", loc)
        elif list(ids) != sorted(ids):
            ctx.emit("aux-ids-unsorted", f"aux ids {list(ids)} are not ascending", loc)
        if any(i < 0 for i in ids):
            ctx.emit("aux-ids-range", f"aux ids {list(ids)} include a negative id", loc)
        if n is not None and len(ids) != n:
            ctx.emit("aux-ids-count", f"{len(ids)} aux ids but fc.weight takes {n} states of {Ht}", loc)
    declared = cfg.get("num_aux_hidden_states")
    if isinstance(declared, int) and n is not None and declared != n:
        ctx.emit("aux-ids-count", f"num_aux_hidden_states is {declared} but fc.weight takes {n} states of {Ht}",
                 f"{ctx.where}:num_aux_hidden_states")
    if ids is not None and spec.aux_convention == "output" and not ctx.dialect.aux_convention_note:
        ctx.emit("aux-ids-output-convention", f"stored {list(ids)} mean vLLM ids {list(spec.aux_layer_ids_vllm or ())}; "
                 f"vLLM would capture {list(ids)}", ctx.where)
    if ctx.dialect.aux_convention_note and ids is not None and spec.sources["aux_convention"].startswith("dialect"):
        ctx.emit("aux-convention-unverifiable", ctx.dialect.aux_convention_note, ctx.where)
    count = n if n is not None else (len(ids) if ids else None)
    if count is not None and count != 3:
        # what vLLM sizes fc / fc_norm from (formats.md §4.2); the Qwen3 path reads more places
        sizing = [cfg.get("num_aux_hidden_states"), len(lists.get("eagle_config.eagle_aux_hidden_state_layer_ids") or [])]
        if spec.arch == "qwen3":
            sizing += [cfg.get("num_aux_layers"), len(lists.get("eagle_aux_hidden_state_layer_ids") or [])]
        sized = count in sizing
        if not sized:
            ctx.emit("aux-count-unsized", f"{count} aux states; vLLM builds fc for 3", ctx.where)
        else:
            ctx.emit("aux-count-not-3", f"{count} aux states", ctx.where)


# ------------------------------------------------------------------------------- norms, flags

# (reader, config style it reads, default when the flag is absent). "hf" = HF-style configs,
# "speculators" = the speculators format. Only readers of the dialect's style can disagree.
ENGINE_DEFAULTS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "norm_before_residual": (("vLLM", "hf", False), ("sglang / TRT-LLM", "hf", False),
                             ("vLLM speculators reader", "speculators", True),
                             ("speculators class", "speculators", False)),
    # SpecForge's #568..#879 window read an absent norm_output as True, but that True meant plain
    # EAGLE-3 feedback, the same semantics as everyone's False: not a disagreement (see
    # specforge-norm-output-window for the case that is).
    "norm_output": (("vLLM", "hf", False), ("sglang", "hf", False), ("TRT-LLM", "hf", False),
                    ("vLLM speculators reader", "speculators", False)),
    "norm_before_fc": (("vLLM", "hf", False), ("TRT-LLM", "hf", False),
                       ("vLLM speculators reader", "speculators", False), ("speculators class", "speculators", False)),
    "fc_norm": (("vLLM", "hf", False), ("sglang", "hf", False), ("TRT-LLM", "hf", False),
                ("vLLM speculators reader", "speculators", False)),
}


@check
def norms(ctx: Context) -> None:
    spec, view, cfg = ctx.spec, ctx.view, ctx.ckpt.config or {}
    fc_norms = sorted(int(c.split(".")[1]) for c in view.names() if re.match(r"fc_norm\.\d+\.weight$", c))
    if fc_norms and not spec.fc_norm:
        ctx.emit("fc-norm-weights-without-flag", f"{len(fc_norms)} fc_norm weights, fc_norm is false",
                 view.locate(f"fc_norm.{fc_norms[0]}.weight"))
    if spec.fc_norm and not fc_norms:
        ctx.emit("fc-norm-flag-without-weights", "fc_norm is true, no fc_norm.N.weight", f"{ctx.where}:fc_norm")
    n = spec.num_aux_hidden_states
    if fc_norms and n is not None and fc_norms != list(range(n)):
        ctx.emit("fc-norm-count", f"fc_norm indices {fc_norms}, expected 0..{n - 1}", ctx.where)
    has_input_norm = "input_norm.weight" in view
    if has_input_norm and not spec.norm_before_fc:
        ctx.emit("input-norm-without-flag", "input_norm.weight present, norm_before_fc false",
                 view.locate("input_norm.weight"))
    if spec.norm_before_fc and not has_input_norm:
        ctx.emit("norm-before-fc-without-weights", "norm_before_fc true, no input_norm.weight",
                 f"{ctx.where}:norm_before_fc")
    if spec.norm_before_fc and spec.fc_norm:
        ctx.emit("double-norm", "norm_before_fc and fc_norm are both true", ctx.where)
    if spec.norm_before_fc:
        places = [p for p in ("norm_before_fc", "eagle_config.norm_before_fc") if config_get(cfg, p) is True]
        if len(places) == 1 and ctx.dialect.hf_style:  # TRT-LLM reads no speculators-format config
            ctx.emit("norm-before-fc-placement", f"norm_before_fc only at '{places[0]}'", f"{ctx.where}:{places[0]}")
        if spec.arch == "mla":
            ctx.emit("mla-norm-before-fc", "MLA drafter with norm_before_fc", ctx.where)
    elif spec.arch == "mla" and has_input_norm:
        ctx.emit("mla-norm-before-fc", "MLA drafter with input_norm.weight", view.locate("input_norm.weight"))

    if not ctx.dialect.flag_fields:
        ctx.emit("flags-implicit", f"{ctx.dialect.title} layout: " + ", ".join(
            f"{f}={getattr(spec, f)}" for f in ENGINE_DEFAULTS), ctx.where)
    style = "hf" if ctx.dialect.hf_style else "speculators"
    for flag, readers in ENGINE_DEFAULTS.items():
        absent = spec.sources.get(flag, "").startswith("default")
        defaults = {name: value for name, kind, value in readers if kind == style}
        if absent and flag in ctx.dialect.flag_fields and len(set(defaults.values())) > 1:
            named = ", ".join(f"{k} {str(v).lower()}" for k, v in defaults.items())
            ctx.emit("flag-absent", f"'{flag}' absent (read as {str(getattr(spec, flag)).lower()}); "
                     f"defaults: {named}", f"{ctx.where}:{flag}")
    if ctx.dialect.name == "specforge" and spec.fc_norm:
        ctx.emit("specforge-norm-output-window", f"norm_output is {str(spec.norm_output).lower()} "
                 f"({spec.sources.get('norm_output')}); its meaning depends on the SpecForge commit",
                 f"{ctx.where}:norm_output")


# ------------------------------------------------------------------------------ tables, rope

@check
def tables(ctx: Context) -> None:
    spec = ctx.spec
    V, Vd = spec.vocab_size, spec.draft_vocab_size
    if not spec.has_lm_head:
        if V is not None and Vd is not None and Vd < V:
            ctx.emit("lm-head-missing", f"draft vocab {Vd} < vocab {V} and no lm_head", "lm_head.weight")
        else:
            ctx.emit("lm-head-borrowed", "no lm_head.weight", "lm_head.weight")
    if not spec.has_embed_tokens:
        H, Ht = spec.hidden_size, spec.target_hidden_size
        if H is not None and Ht is not None and H != Ht:
            ctx.emit("embed-tokens-missing", f"hidden {H} != target hidden {Ht}", "embed_tokens.weight")
        else:
            ctx.emit("embed-tokens-shared", "no embed_tokens.weight", "embed_tokens.weight")
    if spec.tie_word_embeddings:
        ctx.emit("tie-word-embeddings", "tie_word_embeddings is true", f"{ctx.where}:tie_word_embeddings")


@check
def rope(ctx: Context) -> None:
    cfg = ctx.ckpt.config
    if cfg is None:
        return
    root = config_get(cfg, ctx.dialect.arch_config) if ctx.dialect.arch_config else cfg
    root = root if isinstance(root, dict) else {}
    params = root.get("rope_parameters")
    theta = root.get("rope_theta")
    if isinstance(params, dict):
        if theta is not None and params.get("rope_theta") is not None and float(params["rope_theta"]) != float(theta):
            ctx.emit("rope-inconsistent", f"rope_theta {theta} vs rope_parameters.rope_theta {params['rope_theta']}",
                     f"{ctx.where}:rope_theta")
        scaling = root.get("rope_scaling")
        ptype = params.get("rope_type", "default")
        stype = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")) if isinstance(scaling, dict) else "default"
        if scaling is not None and ptype != stype:
            ctx.emit("rope-inconsistent", f"rope_scaling type {stype} vs rope_parameters type {ptype}",
                     f"{ctx.where}:rope_scaling")
    if ctx.spec.rope_theta is None and ctx.spec.arch != "mla":
        ctx.emit("rope-theta-missing", "no rope_theta: base 10000", f"{ctx.where}:rope_theta")


@check
def method_path(ctx: Context) -> None:
    text = ctx.ckpt.source.lower()
    if "eagle-" in text:  # vLLM tests 'eagle-' before 'eagle3' (speculative.py)
        ctx.emit("method-from-path", f"'{ctx.ckpt.source}'", ctx.ckpt.source)


# ---------------------------------------------------------------------------------- target

@check
def against_target(ctx: Context) -> None:
    t = ctx.target
    if t is None:
        return
    spec, tc = ctx.spec, t.text_config()
    tv, th, L = tc.get("vocab_size"), tc.get("hidden_size"), tc.get("num_hidden_layers")
    vocab = spec.vocab_size
    if "t2d" in ctx.view and len(ctx.view.shape("t2d") or ()) == 1:
        vocab = ctx.view.shape("t2d")[0]  # type: ignore[index]
    if isinstance(tv, int) and vocab is not None and vocab != tv:
        ctx.emit("target-vocab-mismatch", f"drafter vocab {vocab}, target vocab_size {tv}", f"{ctx.where}:vocab_size")
    if isinstance(th, int) and spec.aux_width is not None and spec.aux_width != th:
        ctx.emit("target-hidden-mismatch", f"aux width {spec.aux_width}, target hidden_size {th}",
                 f"{ctx.where}:target_hidden_size")
    if isinstance(L, int):
        ids = spec.aux_layer_ids
        if ids is not None:
            top = L if spec.aux_convention == "boundary" else L - 1
            bad = [i for i in ids if i > top]
            if bad:
                ctx.emit("target-aux-range", f"aux ids {bad} exceed {top} ({spec.aux_convention} convention, "
                         f"{L}-layer target)", ctx.where)
        elif spec.num_aux_hidden_states:
            default = default_aux_ids(L, "boundary")
            if len(default) < spec.num_aux_hidden_states:
                ctx.emit("target-aux-default-collision", f"default ids for {L} layers are {list(default)}, "
                         f"fc expects {spec.num_aux_hidden_states} states", ctx.where)
    t_theta = tc.get("rope_theta") or (tc.get("rope_parameters") or {}).get("rope_theta")
    d_theta = spec.rope_theta or 10000.0
    if t_theta is not None and float(t_theta) != float(d_theta):
        ctx.emit("target-rope-differs", f"drafter rope_theta {d_theta:g}, target {float(t_theta):g}", ctx.where)
    verifier = config_get(ctx.ckpt.config, "speculators_config.verifier.name_or_path")
    from .hub import parse_hub_id

    # only a Hub id names a model anywhere; local paths in a published config are placeholders
    if isinstance(verifier, str) and parse_hub_id(verifier) and not same_model(verifier, t.source):
        ctx.emit("target-verifier-mismatch", f"verifier '{verifier}', --target '{t.source}'", ctx.where)
    _fingerprint(ctx, t)


def same_model(a: str, b: str) -> bool:
    """Two model references name the same model (repo id, path or hf:// URI, ignoring revisions)."""

    def norm(s: str) -> str:
        return s.rstrip("/").removeprefix("hf://").split("@")[0].rsplit("/", 2)[-1].lower()

    return a == b or norm(a) == norm(b)


def _fingerprint(ctx: Context, t: TargetFacts) -> None:
    """Compare a few rows of the drafter's tables with the target's (reads rows, not tensors)."""
    import numpy as np

    if t.ckpt is None or not t.ckpt.tensor_file:
        return
    tnames = t.ckpt.tensor_file
    t_embed = next((n for n in ("model.embed_tokens.weight", "embed_tokens.weight",
                                "model.language_model.embed_tokens.weight") if n in tnames), None)
    t_head = "lm_head.weight" if "lm_head.weight" in tnames else t_embed  # tied target: head = embedding
    parts = []
    if ctx.spec.has_embed_tokens and t_embed:
        rows_n = ctx.view.shape("embed_tokens.weight")[0]  # type: ignore[index]
        if rows_n == t.ckpt.tensors[t_embed].shape[0]:
            rows = sorted({0, rows_n // 2, rows_n - 1})
            same = np.array_equal(ctx.view.ckpt.read_rows(ctx.view.stored["embed_tokens.weight"], rows),
                                  t.ckpt.read_rows(t_embed, rows))
            parts.append("embed_tokens " + ("identical to the target's" if same else "differs from the target's (trained or another target)"))
    if ctx.spec.has_lm_head and t_head:
        d_shape, t_shape = ctx.view.shape("lm_head.weight"), t.ckpt.tensors[t_head].shape
        draft_rows = sorted({0, d_shape[0] // 2, d_shape[0] - 1})  # type: ignore[index]
        target_rows = draft_rows
        if "d2t" in ctx.view and ctx.view.info("d2t").dtype.startswith("I"):
            offsets = ctx.array("d2t")
            target_rows = [int(r + offsets[r]) for r in draft_rows]
        if d_shape[1] == t_shape[1] and all(0 <= r < t_shape[0] for r in target_rows):  # type: ignore[index]
            same = np.array_equal(ctx.view.ckpt.read_rows(ctx.view.stored["lm_head.weight"], draft_rows),
                                  t.ckpt.read_rows(t_head, target_rows))
            parts.append("lm_head " + ("rows equal the target head at the mapped ids" if same
                                       else "trained separately"))
    if parts:
        ctx.emit("target-embeddings", "; ".join(parts), t.source)


def summarise(findings: list[Finding]) -> dict[str, int]:
    out = {"error": 0, "warning": 0, "info": 0}
    for f in findings:
        out[f.severity] += 1
    return out

