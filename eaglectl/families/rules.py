"""The traps of the drafter families read beside EAGLE-3 (formats/families.py; docs/families.md), decided by what
vLLM 0.32.0's code does with the files (assumed from that code: eaglectl's tables, like the runner tables):

- which target layers each runner captures (the families count layer outputs; vLLM captures id+1), and
  whether they exist in the target (`family-layers`, `family-layers-range`);
- whether vLLM loads the tensor names at all (`family-layout`: TorchSpec's training names);
- which runner serves the method (`family-runner`: DSpark is V2 only, P-EAGLE's parallel drafting V1 only);
- whether the mask token id exists in the drafter's and the target's vocabulary and embedding (`family-mask-token`);
- whether the head is the drafter's own or the target's, and whether vLLM's d2t then fits it (`family-head-d2t`,
  `family-padded-vocab`);
- P-EAGLE's `mask_hidden` shape and how it is switched on (`peagle-mask-hidden`, `peagle-parallel-drafting`).

DFlash and DSpark are checked by `family_findings` (families/inspect.py, header-only); P-EAGLE by the check below,
beside the EAGLE-3 rules that read the rest of its layout.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..checkpoint.drafter import probe_of
from ..engines.facts import from_release
from ..formats.families import MASK_TOKEN_KEYS, SPECULATORS_DSPARK_ANCHOR
from ..formats.speculators import SPECULATORS_READERS
from ..io.dtypes import FLOAT_DTYPES
from ..rules import catalogue as rule
from ..rules.base import Context, Finding, Rule, check
from .checkpoint import HEAD, FamilyCheckpoint, of_checkpoint
from .validate import validate

if TYPE_CHECKING:
    from ..checkpoint.target import TargetCheckpoint
    from ..engines.readings import Readings

Emitted = list[tuple[Rule, str, str | None]]  # (rule, message, locator)
PEAGLE_READER = SPECULATORS_READERS["peagle"]  # its `until`: the vLLM release that removed P-EAGLE


def target_depth(fc: FamilyCheckpoint, target: TargetCheckpoint | None) -> tuple[int | None, str]:
    """The target's depth and where it came from: --target, else the drafter's own num_target_layers."""
    if target is not None and target.num_layers is not None:
        return target.num_layers, "--target"
    key = fc.layout.depth_key if fc.layout is not None else "num_target_layers"
    depth = fc.config.get(key)
    depth = depth if isinstance(depth, int) and not isinstance(depth, bool) else None
    return depth, f"the drafter's {key}" if depth is not None else "unknown"


def layers(fc: FamilyCheckpoint, readings: Readings, depth: int | None, depth_from: str) -> Emitted:
    ids, key = fc.field("layer_ids")
    where = f"config '{key}' {ids}" if key is not None else "no layer ids in the config"
    said = []
    for r in readings.runners:
        if r.error is not None:
            continue
        came = f"{r.source} +{r.shift}" if r.shift else r.source
        said.append(f"{r.runner.upper()} captures {r.ids_text()} ({came})")
    out: Emitted = [(rule.FAMILY_LAYERS, f"{where}: " + ("; ".join(said) or "no runner serves it")
                     + f"; {readings.basis}", key)]
    if depth is not None:
        beyond = sorted({b for r in readings.runners if r.error is None for b in (r.boundary_ids or ())
                         if b < 0 or b > depth})
        if beyond:
            out.append((rule.FAMILY_LAYERS_RANGE, f"{where}: vLLM captures boundaries {beyond}, beyond the "
                        f"{depth}-layer target ({depth_from}; its last layer's output is boundary {depth})", key))
    return out


def loadable(fc: FamilyCheckpoint) -> Emitted:
    """The files' layout is one vLLM loads (formats/families.LAYOUTS: TorchSpec's training names are not)."""
    lay = fc.layout
    if lay is None or lay.vllm_loads:
        return []
    names = sorted({n.split(".")[0] + "." for n in fc.ckpt.tensor_file if lay.to_canonical(n) != n})
    return [(rule.FAMILY_LAYOUT, f"{lay.title} layout ({lay.producers}): vLLM's {fc.family.name} loader does not know "
             f"{', '.join(n + '*' for n in names)}", None)]


def runner(fc: FamilyCheckpoint) -> Emitted:
    reading = fc.family.reading
    assert reading is not None
    serving = [k.upper() for k, why in reading.runners.items() if why is None]
    extra = "".join(f", {k}: {str(v).lower()}" for k, v in reading.serve_extra.items())
    refused = "; ".join(f"{k.upper()}: {why}" for k, why in reading.runners.items() if why is not None)
    return [(rule.FAMILY_RUNNER, f"method {reading.method}{extra}: served by vLLM's {' and '.join(serving)} runner"
             + ("s" if len(serving) > 1 else "") + (f" only ({refused})" if refused else ""), None)]


def anchor(fc: FamilyCheckpoint) -> Emitted:
    """DSpark's anchor convention as each engine reads it from these files (formats/families.DSPARK_ANCHOR): an
    engine that loads no config of this style, and engines that read an absent key differently, are named."""
    reads = fc.anchor_reads()
    if not reads:
        return []
    raw = fc.config.get("sample_from_anchor")
    if "sample_from_anchor" in fc.config and not isinstance(raw, bool):
        return []  # config-field-invalid says so (validate)
    explicit = isinstance(raw, bool)
    out: Emitted = []
    for r, value in reads:
        if value is None:
            out.append((rule.FAMILY_ENGINE_LAYOUT, f"{r.engine} {r.releases} cannot load a speculators-format DSpark "
                        f"drafter: {r.where}", None))
    said = "; ".join(f"{r.engine} {r.releases} reads {str(v).lower()}" + ("" if explicit else " (its default)")
                     for r, v in reads if v is not None)
    if explicit:
        return [*out, (rule.FAMILY_ANCHOR, f"sample_from_anchor {str(raw).lower()} (config): {said}",
                       "sample_from_anchor")]
    read = {v for _, v in reads if v is not None}
    if read != {SPECULATORS_DSPARK_ANCHOR}:
        return [*out, (rule.FAMILY_ANCHOR_ABSENT, f"no sample_from_anchor: {said}; speculators' DSpark class writes "
                       f"{str(SPECULATORS_DSPARK_ANCHOR).lower()} and both DSpark runtimes default to true, so a "
                       "drafter trained with the anchor as a query is read the other way", "sample_from_anchor")]
    return [*out, (rule.FAMILY_ANCHOR, f"no sample_from_anchor: {said}", "sample_from_anchor")]


def mask_token(fc: FamilyCheckpoint, target: TargetCheckpoint | None) -> Emitted:
    value, key = fc.field("mask_token_id")
    if value is None:
        return [(rule.FAMILY_MASK_TOKEN, f"no mask token id at any key vLLM reads ({', '.join(MASK_TOKEN_KEYS)}): "
                 "vLLM refuses to start parallel drafting", None)]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:  # vLLM holds ids as int64
        return [(rule.FAMILY_MASK_TOKEN, f"config '{key}' is {str(value)[:60]}, not a token id (an integer in "
                 "[0, 2^63))", key)]
    out: Emitted = []
    vocab = fc.int_field("vocab_size")
    if vocab is not None and value >= vocab:  # the draft embeds it: its own table, or the target's of that size
        out.append((rule.FAMILY_MASK_TOKEN, f"config '{key}' {value} is outside the drafter's vocabulary "
                    f"(vocab_size {vocab})", key))
    if target is not None:
        tv = target.vocab_size
        if tv is not None and value >= tv:
            out.append((rule.FAMILY_MASK_TOKEN, f"config '{key}' {value} is not in the target's vocabulary "
                        f"(vocab_size {tv})", key))
        name = target.table_name("embed_tokens")
        if name is not None:
            rows = target.ckpt.tensor_file[name].header.tensors[name].shape[0]
            if value >= rows:
                out.append((rule.FAMILY_MASK_TOKEN, f"config '{key}' {value} has no row in the target's embedding "
                            f"{name} ({rows} rows)", key))
    return out


def head_d2t(fc: FamilyCheckpoint, target: TargetCheckpoint | None) -> Emitted:
    """vLLM sizes the draft's head and d2t by draft_vocab_size (else vocab_size) and builds d2t (zeros: the
    identity) when that differs from the target's vocabulary (DSpark: is smaller); a d2t tensor overwrites it. The
    head is the drafter's lm_head when it ships one, else the target's (has_own_lm_head)."""
    reading = fc.family.reading
    assert reading is not None
    head, d2t, dv = fc.shape(HEAD), fc.tensor("d2t") is not None, fc.draft_vocab
    tv = target.vocab_size if target is not None else None
    full = tv if tv is not None else fc.int_field("vocab_size")
    whose = "the target's vocab_size" if tv is not None else "the drafter's vocab_size"
    if dv is None or full is None:
        return []
    builds = dv != full if reading.d2t_when == "differs" else dv < full
    if head is not None and not d2t and dv < full:
        return [(rule.FAMILY_HEAD_D2T, f"lm_head has {head[0]} rows (draft_vocab_size {dv}, {whose} {full}) and no "
                 "d2t ships: vLLM's d2t starts at zeros, so draft id i is taken for target token i; unless this "
                 "reduced vocabulary is the target's first ids, the drafter proposes the wrong tokens", HEAD)]
    if head is None and d2t and dv < full:
        return [(rule.FAMILY_HEAD_D2T, f"no lm_head ships, so vLLM computes the draft's logits with the target's head, "
                 f"yet d2t remaps the first {dv} of them as a reduced vocabulary (vllm-ascend #11374: acceptance "
                 "25 % to 1.7 % once a reduced head was replaced by the target's)", "d2t")]
    if d2t and not builds and tv is not None:  # the model registers draft_id_to_target_id only when it builds one
        return [(rule.FAMILY_HEAD_D2T, f"d2t ships, but with draft vocab {dv} and target vocab {tv} vLLM builds no d2t "
                 "parameter to load it into: its weight loader raises (no parameter 'draft_id_to_target_id')", "d2t")]
    if head is None and not d2t and builds and tv is not None:
        return [(rule.FAMILY_PADDED_VOCAB, f"draft vocab {dv}, target vocab {tv}: vLLM builds a d2t (the identity) "
                 "beside the target's head", None)]
    return []


def target_sizes(fc: FamilyCheckpoint, target: TargetCheckpoint | None) -> Emitted:
    """The drafter's vocabulary and the width of the target states its fc reads, against the target's (EAGLE-3's
    target rules): vLLM shares the target's embedding and captures its hidden states as they are."""
    if target is None:
        return []
    out: Emitted = []
    (v, vkey), tv = fc.field("vocab_size"), target.vocab_size
    v = v if isinstance(v, int) and not isinstance(v, bool) else None
    # DSpark: a larger input vocabulary is allowed with its own embed_tokens (qwen3_dspark.py load_weights)
    expanded = fc.family.id == "dspark" and (v is None or tv is None or v < tv or fc.tensor("embed_tokens.weight"))
    if v is not None and tv is not None and v != tv and not expanded:
        out.append((rule.TARGET_VOCAB_MISMATCH, f"drafter vocab_size {v}, target vocab_size {tv}", vkey))
    width = fc.int_field("target_hidden_size") or fc.int_field("hidden_size")
    if width is not None and target.hidden_size is not None and width != target.hidden_size:
        key = fc.field("target_hidden_size")[1] or fc.field("hidden_size")[1]
        out.append((rule.TARGET_HIDDEN_MISMATCH, f"fc reads target states {width} wide ('{key}'), the target's "
                    f"hidden_size is {target.hidden_size}", key))
    return out


def mask_hidden(fc: FamilyCheckpoint, n_aux: int | None, target_hidden: int | None, declared: str | None) -> Emitted:
    shape = fc.shape("mask_hidden")
    if shape is None:
        return [(rule.PEAGLE_MASK_HIDDEN, f"{declared}, but no mask_hidden ships: vLLM raises 'mask_hidden not found "
                 "in weights'", None)] if declared else []
    dtype = fc.ckpt.tensors[fc.tensor("mask_hidden")].dtype  # type: ignore[index]
    if dtype not in FLOAT_DTYPES:  # vLLM's copy_ into its float buffer casts silently (llama_eagle3.py load_weights)
        return [(rule.PEAGLE_MASK_HIDDEN, f"mask_hidden is {dtype}: a learned placeholder of floating-point values "
                 "stored as integers; vLLM casts it into its float buffer without a word", "mask_hidden")]
    fc_in = fc.shape("fc.weight")
    expected = fc_in[1] if fc_in is not None and len(fc_in) == 2 else (
        n_aux * target_hidden if n_aux and target_hidden else None)
    numel = math.prod(shape)
    if expected is not None and numel != expected:
        parts = f" ({n_aux} aux states x {target_hidden})" if n_aux and target_hidden else " (fc's input width)"
        return [(rule.PEAGLE_MASK_HIDDEN, f"mask_hidden is {list(shape)} ({numel} values); vLLM copies it into "
                 f"[1, {expected}]{parts}, so loading fails", "mask_hidden")]
    fits = f"{n_aux} aux states x {target_hidden}" if n_aux and target_hidden else "fc's input width"
    return [(rule.PEAGLE_PARALLEL_DRAFTING, f"mask_hidden {list(shape)} fits [1, {numel}] ({fits}): serve with "
             "--speculative-config '{\"method\": \"eagle3\", \"parallel_drafting\": true, ...}' (the V1 runner)",
             "mask_hidden")]


def family_findings(fc: FamilyCheckpoint, target: TargetCheckpoint | None, readings: Readings,
                    where: str, scanned: Emitted | None = None) -> list[Finding]:
    """Every family rule for a DFlash / DSpark drafter read in its own layout, header-only (`scanned`: what --scan
    found in the tensors' values)."""
    depth, depth_from = target_depth(fc, target)
    emitted = [*validate(fc), *loadable(fc), *layers(fc, readings, depth, depth_from), *runner(fc), *anchor(fc),
               *mask_token(fc, target), *head_d2t(fc, target), *target_sizes(fc, target), *(scanned or [])]
    return [Finding(r, message, f"{where}:{loc}" if loc is not None and fc.tensor(loc) is None else loc)
            for r, message, loc in emitted]


@check
def peagle(ctx: Context) -> None:
    """P-EAGLE: the EAGLE-3 layout plus mask_hidden; the EAGLE-3 rules read the rest (its layers, vocabulary)."""
    fc = of_checkpoint(ctx.ckpt)
    if fc is None or fc.family.reading is None or not fc.family.reading.mask_hidden:
        return
    probe = probe_of(ctx.ckpt)  # what declares P-EAGLE besides the tensor itself: its architecture or config keys
    said = [s.describe() for s in fc.family.signals if s.kind.startswith("config") and s.holds(probe)]
    declared = f"the config declares P-EAGLE ({said[0]})" if said else None
    spec = ctx.spec
    target_hidden = spec.target_hidden_size or spec.hidden_size
    release = ctx.engine_version or (ctx.readings.release if ctx.readings is not None and ctx.readings.asked
                                     else None)
    gone = from_release(release, PEAGLE_READER.until or "")
    if gone:
        ctx.emit(rule.PEAGLE_UNSUPPORTED, f"vLLM {release} has no P-EAGLE: " + (
            f"its speculators reader raises \"{PEAGLE_READER.refusal}\"" if
            ctx.config.str("speculators_model_type") == "peagle" else
            "it loads these files as a sequential EAGLE-3 drafter, skipping mask_hidden (llama_eagle3.py), and "
            "refuses parallel_drafting with method eagle3 (config/speculative.py)"), ctx.where)
    for r, message, loc in (*(() if gone else runner(fc)), *mask_token(fc, ctx.target),
                            *mask_hidden(fc, spec.num_aux_hidden_states, target_hidden, declared)):
        ctx.emit(r, message, ctx.at(loc) if loc is not None and fc.tensor(loc) is None else loc)
