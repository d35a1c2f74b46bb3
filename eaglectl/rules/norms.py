"""Norms and semantic flags: fc_norm / input_norm weights against their flags, flag placement,
flags absent where engines disagree on the default, and the dialect's own caveats."""

from __future__ import annotations

import re

from ..checkpoint.drafter import FLAG_ALIASES, flag_alias
from ..formats import ConfigStyle
from . import catalogue as rule
from .base import RULES, Context, check

# (reader, config style it reads, default when the flag is absent). "hf" = HF-style configs,
# "speculators" = the speculators format. Only readers of the dialect's style can disagree.
ENGINE_DEFAULTS: dict[str, tuple[tuple[str, ConfigStyle, bool], ...]] = {
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
    spec, view, cfg = ctx.spec, ctx.view, ctx.config
    fc_norms = sorted(int(c.split(".")[1]) for c in view.names() if re.match(r"fc_norm\.[0-9]{1,6}\.weight$", c))
    alias = flag_alias(spec, "fc_norm")
    if alias is not None and spec.fc_norm and fc_norms:
        ctx.emit(rule.FC_NORM_ALIAS, f"{alias} is true ({FLAG_ALIASES[alias]}) and there are {len(fc_norms)} fc_norm "
                 "weights, but no fc_norm key: vLLM reads only fc_norm", ctx.at(alias))
    if fc_norms and not spec.fc_norm:
        ctx.emit(rule.FC_NORM_WEIGHTS_WITHOUT_FLAG, f"{len(fc_norms)} fc_norm weights, fc_norm is false",
                 view.locate(f"fc_norm.{fc_norms[0]}.weight"))
    if spec.fc_norm and not fc_norms:
        ctx.emit(rule.FC_NORM_FLAG_WITHOUT_WEIGHTS, "fc_norm is true, no fc_norm.N.weight", ctx.at("fc_norm"))
    n = spec.num_aux_hidden_states
    if fc_norms and n is not None and fc_norms != list(range(n)):
        shown = fc_norms if len(fc_norms) <= 8 else [*fc_norms[:8], "..."]
        ctx.emit(rule.FC_NORM_COUNT, f"fc_norm indices {shown}, expected 0..{n - 1}", ctx.where)
    has_input_norm = "input_norm.weight" in view
    if has_input_norm and not spec.norm_before_fc:
        ctx.emit(rule.INPUT_NORM_WITHOUT_FLAG, "input_norm.weight present, norm_before_fc false",
                 view.locate("input_norm.weight"))
    if spec.norm_before_fc and not has_input_norm:
        ctx.emit(rule.NORM_BEFORE_FC_WITHOUT_WEIGHTS,
                 "norm_before_fc true, no input_norm.weight", ctx.at("norm_before_fc"))
    if spec.norm_before_fc and spec.fc_norm:
        ctx.emit(rule.DOUBLE_NORM, "norm_before_fc and fc_norm are both true", ctx.where)
    if spec.norm_before_fc:
        places = [p for p in ("norm_before_fc", "eagle_config.norm_before_fc") if cfg.bool(p) is True]
        if len(places) == 1 and ctx.dialect.config_style == "hf":  # TRT-LLM reads no speculators-format config
            ctx.emit(rule.NORM_BEFORE_FC_PLACEMENT, f"norm_before_fc only at '{places[0]}'", ctx.at(places[0]))
        if spec.arch == "mla":
            ctx.emit(rule.MLA_NORM_BEFORE_FC, "MLA drafter with norm_before_fc", ctx.where)
    elif spec.arch == "mla" and has_input_norm:
        ctx.emit(rule.MLA_NORM_BEFORE_FC, "MLA drafter with input_norm.weight", view.locate("input_norm.weight"))

    if not ctx.dialect.flag_fields:
        ctx.emit(rule.FLAGS_IMPLICIT, f"{ctx.dialect.title} layout: " + ", ".join(
            f"{f}={str(getattr(spec, f)).lower()}" for f in ENGINE_DEFAULTS), ctx.where)
    for flag, readers in ENGINE_DEFAULTS.items():
        absent = spec.sources.get(flag, "").startswith("default")
        defaults = {name: value for name, kind, value in readers if kind == ctx.dialect.config_style}
        if absent and flag in ctx.dialect.flag_fields and len(set(defaults.values())) > 1:
            named = ", ".join(f"{k} {str(v).lower()}" for k, v in defaults.items())
            ctx.emit(rule.FLAG_ABSENT, f"'{flag}' absent (read as {str(getattr(spec, flag)).lower()}); "
                     f"defaults: {named}", ctx.at(flag))
    said: set[str] = set()
    for caveat in ctx.dialect.caveats:
        if caveat.rule in said or any(not spec.sources.get(k, "").startswith("config:") for k in caveat.explicit):
            continue
        if all(getattr(spec, k) == v for k, v in caveat.when.items()) \
                and not ctx.drafter.set_by_upgrade(caveat.subject):  # an upgrade's flag: eaglectl's meaning
            constant = ctx.constant_norm(caveat.settled_by) if caveat.settled_by else None
            if constant is None and caveat.settled_by and caveat.settled_by in view:
                continue  # the weights settle it: that norm was trained, so the later meaning holds
            said.add(caveat.rule)
            value = getattr(spec, caveat.subject)
            declared = f"{caveat.subject} is {str(value).lower()} ({spec.sources.get(caveat.subject)})"
            if constant is None:
                ctx.emit(RULES[caveat.rule], f"{declared}; {caveat.message}", ctx.at(caveat.subject))
            else:  # measured: the weights were trained the other way than every engine serves them
                stored = caveat.settled_by or ""
                ctx.emit(RULES[caveat.untrained_rule], f"{declared}; {view.stored[stored]} is {constant:g} "
                         f"everywhere: {caveat.untrained}", view.locate(stored))
