"""Hazards from the field (docs/hazards.md#field-2026-12): producer bugs and drafter variants that the
files show, each a rule with a planted fixture.

- NeMo Automodel before PR #2897 (2026-07-03) trained plain EAGLE-3 while its runs were named 3.1;
- speculators' converter (≤ 0.9.0, issue #1114) keeps init values for keys it did not match: norms at
  exactly 1.0 (read without --scan: norm vectors are small), matrices drawn from an initialiser (--scan);
- TorchSpec MoE EAGLE-3 drafters (`use_moe`) and Kimi-K3 MLA drafters (`mla_use_nope`,
  `mla_use_output_gate`), which vLLM ≤ 0.33 cannot build or silently misreads;
- typed template fields left null by an exporter (`use_cache: null`), which strict loaders reject;
- TokenSpeed, which sizes fc / fc_norm from the draft `hidden_size`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from . import catalogue as rule
from .base import Context, check

# Typed fields of transformers' PretrainedConfig / LlamaConfig that an export template may leave null. Each has a
# non-optional type (a null is not its default), and no other rule names it: `hidden_size: null` and friends are
# `config-field-missing`. ModelOpt's triage notes: `use_cache: null` fails huggingface_hub's strict dataclass
# validation (StrictDataclassFieldValidationError). `convert` never writes these as null.
TYPED_TEMPLATE_FIELDS = {
    "use_cache": "bool", "tie_word_embeddings": "bool", "attention_bias": "bool", "mlp_bias": "bool",
    "hidden_act": "str", "initializer_range": "float", "attention_dropout": "float", "pretraining_tp": "int",
    "max_position_embeddings": "int", "rope_theta": "float",
}

# "EAGLE-3.1" spelled in a repo, folder or model name (not "Llama-3.1", not "eagle3-1b")
_CLAIM_31 = re.compile(r"eagle[-_ ]?3[._-]1(?![0-9a-z])", re.IGNORECASE)
_NORM = re.compile(r"(^|\.)(norm|[a-z_]*layernorm|[a-z_]*_norm|fc_norm\.[0-9]+)\.weight$")
_MATRIX = re.compile(r"^(fc|layers\.[0-9]{1,6}\.(self_attn|mlp)\.[a-z_]+)\.weight$")
_MIN_ELEMENTS = 1024  # below this a matrix's statistics decide nothing
_SAMPLE = 1 << 20  # elements a large matrix is judged on (a fixed stride)


def strip_null_template_fields(config: dict[str, Any]) -> list[str]:
    """Drop typed template fields whose value is null from a config dict (in place); the names dropped."""
    dropped = [k for k in TYPED_TEMPLATE_FIELDS if k in config and config[k] is None]
    for k in dropped:
        del config[k]
    return dropped


def _claims(ctx: Context) -> list[str]:
    """Where the drafter is named EAGLE-3.1: its path or repo id, config names, the card."""
    found = []
    ref = ctx.ckpt.hub_ref
    names = [("source", ctx.ckpt.source), ("repo", ref.repo_id if ref is not None else None),
             ("_name_or_path", ctx.config.str("_name_or_path")), ("eagle_version", ctx.config.str("eagle_version"))]
    for where, text in names:
        if text and (_CLAIM_31.search(text) or (where == "eagle_version" and text.strip() == "3.1")):
            found.append(f"{where} '{text}'")
    card = Path(ctx.ckpt.root) / "README.md"
    try:
        if ref is None and card.is_file() and card.stat().st_size <= 1 << 20:
            m = _CLAIM_31.search(card.read_text(errors="replace"))
            if m:
                found.append(f"README.md '{m.group(0)}'")
    except OSError:
        pass
    return found


@check
def nemo_claims_31(ctx: Context) -> None:
    spec = ctx.spec
    if ctx.dialect.name != "nemo" or spec.eagle_version != "3":
        return
    if any(c.startswith("fc_norm.") for c in ctx.view.stored):
        return
    claims = _claims(ctx)
    if claims:
        ctx.emit(rule.NEMO_CLAIMS_3_1, f"named EAGLE-3.1 ({'; '.join(claims)}) but no fc_norm.* weights and fc_norm / "
                 "norm_output false: the weights are plain EAGLE-3", ctx.where)


@check
def untrained_norms(ctx: Context) -> None:
    if ctx.dialect.name != "speculators":
        return
    upgraded = bool(ctx.config.bool("eaglectl_provenance.needs_fine_tuning"))  # eaglectl upgrade adds unit fc_norm
    ones = []
    for canon in ctx.view.names():
        if not _NORM.search(canon) or (upgraded and canon.startswith("fc_norm.")):
            continue
        if ctx.constant_norm(canon) == 1.0:
            ones.append(ctx.view.stored[canon])
    if ones:
        ctx.emit(rule.UNTRAINED_NORMS, f"{len(ones)} norm weight(s) exactly 1.0: {', '.join(ones[:4])}"
                 + (" ..." if len(ones) > 4 else ""), ctx.view.locate(ctx.dialect.to_canonical(ones[0])))


def init_match(values: np.ndarray, fan_in: int, init_std: float) -> str | None:
    """Which initialiser these values look drawn from: N(0, init_std) (HF `_init_weights`) or torch's default
    kaiming-uniform U(±1/sqrt(fan_in)); None when neither. Bands: 4 standard errors plus a small margin."""
    x = values.reshape(-1)
    if x.size > _SAMPLE:
        x = x[:: x.size // _SAMPLE]
    x = x.astype(np.float64)
    n = x.size
    mean, std = float(x.mean()), float(x.std())
    if n < _MIN_ELEMENTS or not np.isfinite(std) or std == 0.0:
        return None
    kurt = float(np.mean((x - mean) ** 4) / std**4)
    if abs(std / init_std - 1) <= 0.02 + 4 / np.sqrt(2 * n) and abs(kurt - 3) <= 0.15 + 4 * np.sqrt(24 / n) \
            and abs(mean) <= 4 * init_std / np.sqrt(n) + 1e-4:
        return f"N(0, {init_std:g}) (std {std:.4g}, kurtosis {kurt:.2f})"
    bound = 1 / np.sqrt(fan_in)
    uniform_std = bound / np.sqrt(3)
    if abs(std / uniform_std - 1) <= 0.02 + 4 / np.sqrt(n) and abs(kurt - 1.8) <= 0.05 + 4 * np.sqrt(0.4 / n) \
            and float(np.abs(x).max()) <= bound * 1.01:
        return f"U(±1/sqrt({fan_in})) (std {std:.4g}, kurtosis {kurt:.2f})"
    return None


@check
def random_weights(ctx: Context) -> None:
    if not ctx.scan:
        return
    init_std = ctx.drafter.layer_config.float("initializer_range", lo=1e-12, hi=10.0) or 0.02
    for canon in ctx.view.names():
        info = ctx.view.info(canon)
        if not _MATRIX.match(canon) or len(info.shape) != 2 or info.dtype not in ("BF16", "F16", "F32", "F64"):
            continue
        if info.numel < _MIN_ELEMENTS:
            continue
        looks = init_match(np.asarray(ctx.array(canon)), info.shape[1], init_std)
        if looks:
            where = ctx.view.stored[canon]
            who = "speculators' converter (<= 0.9.0) keeps init values for unmatched keys; " \
                if ctx.dialect.name == "speculators" else ""
            ctx.emit(rule.RANDOM_WEIGHTS, f"'{where}' looks drawn from {looks}: {who}vLLM would serve it untrained",
                     ctx.view.locate(canon))


@check
def moe_and_k3(ctx: Context) -> None:
    layer = ctx.drafter.layer_config
    if layer.bool("use_moe") or ctx.config.bool("use_moe"):
        experts = sum(1 for c in ctx.view.stored if ".experts." in c)
        n = layer.int("n_routed_experts", lo=1)
        ctx.emit(rule.MOE_DRAFTER, "use_moe is true" + (f" ({n} routed experts)" if n else "")
                 + (f", {experts} expert tensors" if experts else "") + ": vLLM's EAGLE-3 decoder layer has a dense "
                 "MLP, so the expert weights are parameters it does not have", ctx.at(layer.path("use_moe")))
    keys = [k for k in ("mla_use_nope", "mla_use_output_gate") if layer.bool(k)]
    if keys:
        what = {"mla_use_nope": "applies RoPE the drafter never saw (NoPE)",
                "mla_use_output_gate": "drops the sigmoid output gate"}
        ctx.emit(rule.MLA_K3_VARIANT, "; ".join(f"{k} is true: vLLM {what[k]}" for k in keys),
                 ctx.at(layer.path(keys[0])))


@check
def null_template_fields(ctx: Context) -> None:
    for view in dict.fromkeys([ctx.config, ctx.drafter.layer_config], None):
        for key, kind in TYPED_TEMPLATE_FIELDS.items():
            if key in view.data and view.data[key] is None:
                ctx.emit(rule.NULL_TEMPLATE_FIELD, f"'{view.path(key)}' is null (a {kind} field; absent means the "
                         "class default)", ctx.at(view.path(key)))


@check
def tokenspeed_sizes(ctx: Context) -> None:
    spec = ctx.spec
    hidden, target_hidden = spec.hidden_size, spec.target_hidden_size
    if hidden is None or target_hidden is None or hidden == target_hidden:
        return
    what = "fc and fc_norm" if spec.fc_norm else "fc"
    ctx.emit(rule.TOKENSPEED_TARGET_HIDDEN,
             f"target_hidden_size {target_hidden} != hidden_size {hidden}: TokenSpeed builds "
             f"{what} for {hidden}-wide aux states, the weights take {target_hidden}", ctx.at("target_hidden_size"))
