"""Planning a conversion (`plan_conversion`): every tensor action and drop, the aux ids in the destination's
numbering, the destination config and its provenance, decided before a byte is written; a ConversionError
names what the destination cannot represent. `convert.execute` does exactly this plan."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from ... import __version__, formats
from ...checkpoint.drafter import DrafterCheckpoint
from ...checkpoint.plan import ConversionPlan, TensorAction, config_diff, provenance, shard, verifier
from ...checkpoint.target import TargetCheckpoint, is_hub_id
from ...engines import sglang
from ...engines.readings import sglang_reading, table_readings
from ...errors import ConversionError
from ...families.checkpoint import FamilyCheckpoint, of_checkpoint
from ...formats import Dialect
from ...formats.families import MASK_TOKEN_KEYS, by_id, layout
from ...formats.speculators import SPECULATORS_READERS
from ...io.dtypes import CONFIG_NAMES, FLOAT_DTYPES, TO_CONFIG
from ...io.jsonio import MISSING, config_get, config_set
from ...io.quant import QUANT_FILE, converted_configs, layout_of
from ...rules import Context, run_checks
from ...rules.hazards import strip_null_template_fields
from ...rules.layout import MLA_SPELLINGS, REGISTERED
from ...spec import FLAGS, DrafterSpec, default_aux_ids

if TYPE_CHECKING:
    from ...measure.probe import Measurement

Fail = Callable[[str], NoReturn]  # raises the conversion's ConversionError naming the source and the destination

# Keys of every config that describe the drafter as a whole, not its decoder layer.
_DRAFTER_KEYS = frozenset({
    "architectures", "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
    "num_aux_hidden_states", "eaglectl_provenance", "torch_dtype", "dtype", "quantization_config", *FLAGS,
})


def writable_dialect(to: str) -> Dialect:

    if (lay := layout(to)) is not None:
        raise ConversionError(f"'{to}' is a layout of {by_id(lay.family).name} drafters ({lay.title}); this is "
                              "an EAGLE-3 drafter", dialect=to, hint=f"write one of: {', '.join(formats.writable())}")
    if to not in formats.DIALECTS:
        raise ConversionError(f"unknown dialect '{to}' (known: {', '.join(formats.names())})", dialect=to)
    dialect = formats.get(to)
    if dialect.writer is None:
        raise ConversionError(f"eaglectl reads {to} checkpoints but does not write them", dialect=to,
                              hint=f"write one of: {', '.join(formats.writable())}")
    return dialect


@dataclass(frozen=True)
class Additions:
    """What an upgrade adds to a conversion: the output's spec (its flags) and new tensors, canonical name ->
    (dtype, shape, note), whose bytes the upgrade supplies."""

    spec: DrafterSpec
    tensors: dict[str, tuple[str, tuple[int, ...], str]]


def plan_conversion(
    src: DrafterCheckpoint,
    dest: str | os.PathLike[str],
    to: str,
    *,
    dtype: str | None = None,
    target: TargetCheckpoint | None = None,
    aux_layer_ids: tuple[int, ...] | None = None,
    source_aux_convention: str | None = None,
    max_shard_size: int | None = None,
    upgrade: Additions | None = None,
    measured: Measurement | None = None,
    base_model: str | None = None,
    embed_from_target: bool = False,
) -> ConversionPlan:
    """Everything a conversion will do, decided before a byte is written.

    `upgrade` lets the upgrade reuse the same machinery: it declares flags and new tensors whose bytes the
    caller supplies. `for_engines` makes the plan one that other engines than vLLM read right too.
    """
    dialect = writable_dialect(to)
    for f in run_checks(Context(src, target, measured=measured)):  # an error convert does not repair stops it
        if f.severity == "error" and not f.rule.repaired_by_convert:
            raise ConversionError(f"{src.root}: source has error [{f.rule_id}] {f.message} ({f.locator})",
                                  path=src.root, hint=f"eaglectl inspect {src.source} (shows every finding)")
    spec = upgrade.spec if upgrade is not None else src.spec

    def fail(message: str) -> NoReturn:
        raise ConversionError(f"{src.root} -> {to}: {message}", dialect=to, path=src.root)

    _refuse_unwritable(spec, dialect, fail)
    quantized = layout_of(src)
    if dtype and quantized is not None:  # a cast would lose the scales' meaning: FP8 / NVFP4 stay as stored
        fail(f"the drafter is quantised ({quantized.describe()}); --dtype {dtype} would cast its scales and leave the "
             "quantised weights as they are: convert it without --dtype (its tensors are copied bit for bit)")
    out_dtype = CONFIG_NAMES[dtype] if dtype else None
    actions, dropped = _stored_actions(src, spec, dialect, out_dtype, fail)
    float_dtype = out_dtype or _main_float_dtype(src)
    actions += _added_actions(src, spec, dialect, target, float_dtype, embed_from_target, fail)
    actions = _with_extra_tensors(actions, dialect, upgrade.tensors if upgrade else None, out_dtype, fail)
    actions.sort(key=lambda a: _tensor_order(a.canonical))

    aux_ids = _dest_aux_ids(src, spec, dialect, target, aux_layer_ids, source_aux_convention, fail)
    # how the numbering of the written ids is known: said (--aux-layer-ids / --source-aux-convention, or the
    # measurement convert passes the same way) or assumed from the dialect table (then nothing is recorded)
    decided = ("measured" if measured is not None and measured.boundary_ids is not None else "given") if (
        aux_layer_ids is not None or source_aux_convention is not None) and aux_ids is not None else None
    config, warnings, quant_file = _plan_config(src, spec, dialect, aux_ids, float_dtype, target, fail, base_model,
                                                decided)
    intended = _intended(spec, aux_ids, target, measured, aux_layer_ids, measured_flags=upgrade is None)
    metadata = {"format": "pt", "eaglectl": json.dumps(config["eaglectl_provenance"], sort_keys=True)}
    shard_limit = max_shard_size or (max(sum(t.nbytes for t in f.header.tensors.values()) for f in src.ckpt.files)
                                     if src.ckpt.layout == "sharded" else None)  # the source's largest file
    return ConversionPlan(
        source=src.ckpt.source, source_dialect=src.dialect.name, dest=os.fspath(dest), dest_dialect=to,
        tensors=actions, dropped=dropped, config=config, config_changes=config_diff(src.ckpt.config or {}, config),
        shards=shard(actions, shard_limit), metadata=metadata,
        side_files={QUANT_FILE: quant_file} if quant_file is not None else {}, intended=intended,
        warnings=warnings,
    )


def for_engines(plan: ConversionPlan, src: DrafterCheckpoint, target: TargetCheckpoint | None,
                engines: tuple[str, ...]) -> ConversionPlan:
    """The plan made one that every engine listed reads right (convert --for vllm,sglang): where SGLang is one,
    eagle_config's ids rewritten in the numbering of the target's class, and SGLang's reading of the planned config
    checked to be the drafter's (ConversionError naming the conflict otherwise: nothing is written)."""
    plan.engines = engines
    if "sglang" not in engines:
        return plan

    def fail(message: str) -> NoReturn:
        raise ConversionError(f"{src.root} -> {plan.dest_dialect} for {' and '.join(engines)}: {message}",
                              dialect=plan.dest_dialect, path=src.root)

    record = plan.config["eaglectl_provenance"]
    fields = record.get("aux_id_fields") or {}
    if _EC_IDS in fields and plan.intended is not None and plan.intended["boundary_ids"] is not None:
        written = {_EC_IDS: (fields[_EC_IDS], config_get(plan.config, _EC_IDS))}
        _sglang_numbering(plan.config, written, tuple(plan.intended["boundary_ids"]), target, fail, plan.warnings)
        record["aux_id_fields"] = {**fields, _EC_IDS: written[_EC_IDS][0]}
        plan.metadata["eaglectl"] = json.dumps(record, sort_keys=True)
        plan.config_changes = config_diff(src.ckpt.config or {}, plan.config)
    assert plan.intended is not None
    _read_right_by_sglang(plan.config, plan.intended, target, fail)
    return plan


def count_carriers(src: DrafterCheckpoint, count: int, target: TargetCheckpoint | None = None) -> list[str]:
    """The dialects eaglectl writes for vLLM whose written config vLLM reads as fc for `count` aux states on both
    runners: each is planned (nothing written) and its config read as vLLM's tables read it."""

    layers = target.num_layers if target is not None else None
    found = []
    for name in formats.writable():
        if formats.get(name).consumer != "vllm":
            continue
        try:
            plan = plan_conversion(src, "(planned)", name, target=target)
        except ConversionError:
            continue
        runners = table_readings(plan.config, layers).runners
        if runners and all(r.num_aux == count and not r.error for r in runners):
            found.append(name)
    return found


def _refuse_unwritable(spec: DrafterSpec, dialect: Dialect, fail: Fail) -> None:
    """The destination can hold this drafter's family, depth and flags (else `fail` names what it cannot)."""
    w = dialect.writer
    assert w is not None
    if spec.arch not in w.architectures:
        fail(f"{dialect.title} cannot hold a {spec.arch} drafter (it writes {', '.join(w.architectures)})")
    layers = spec.num_hidden_layers or 1
    if w.max_layers is not None and layers > w.max_layers:
        fail(f"{dialect.title} holds {w.max_layers} decoder layer(s); the source has {layers}")
    for flag in FLAGS:
        if getattr(spec, flag) and flag not in w.flag_paths:
            fail(f"{dialect.title} cannot express {flag}=true (the drafter would be served without it)")
    if dialect.config_style == "speculators" and spec.norm_before_fc and spec.fc_norm:
        fail("the speculators format rejects norm_before_fc together with fc_norm")


def _reduced(spec: DrafterSpec) -> bool:
    V, Vd = spec.vocab_size, spec.draft_vocab_size or spec.vocab_size
    return V is not None and Vd is not None and Vd < V


def _stored_actions(src: DrafterCheckpoint, spec: DrafterSpec, dialect: Dialect, out_dtype: str | None, fail: Fail
                    ) -> tuple[list[TensorAction], list[tuple[str, str]]]:
    """What happens to each stored tensor of the source: copied, cast, or dropped (with why)."""
    w = dialect.writer
    assert w is not None
    reduced = _reduced(spec)
    actions: list[TensorAction] = []
    dropped: list[tuple[str, str]] = []
    allowed = [re.compile(p + "$") for p in (w.allowed_tensors or (".*",))]
    for canon in src.view.names():
        stored = src.view.stored[canon]
        info = src.view.info(canon)
        if canon in ("d2t", "t2d") and not reduced:
            dropped.append((stored, "draft vocab == vocab: vLLM has no parameter for it"))
            continue
        if canon == "t2d" and not w.t2d:
            dropped.append((stored, f"{dialect.title} stores no t2d (derivable from d2t)"))
            continue
        if canon.startswith("layers.") and canon.endswith("hidden_norm.weight") and not canon.startswith("layers.0."):
            dropped.append((stored, "hidden_norm of layers >= 1 is unused by vLLM and speculators"))
            continue
        if not any(p.match(canon) for p in allowed):
            fail(f"{dialect.title} cannot hold '{stored}'")
        name = dialect.from_canonical(canon)
        shape = _at_rank(tuple(info.shape), w.ranks.get(canon))
        cast = out_dtype if (out_dtype and info.dtype in FLOAT_DTYPES) else None
        if cast and cast != info.dtype:
            actions.append(TensorAction(name, canon, "cast", cast, shape, stored, info.dtype,
                                        f"{info.dtype} -> {cast}"))
        else:
            actions.append(TensorAction(name, canon, "copy", info.dtype, shape, stored, info.dtype,
                                        "" if shape == tuple(info.shape) else f"stored as {list(shape)}"))
    return actions, dropped


def _at_rank(shape: tuple[int, ...], rank: int | None) -> tuple[int, ...]:
    """`shape` at `rank` by leading ones (Writer.ranks), when all but its last size are 1; else as it is."""
    if rank is None or not shape or any(n != 1 for n in shape[:-1]):
        return shape
    return (1,) * (rank - 1) + (shape[-1],)


def _added_actions(src: DrafterCheckpoint, spec: DrafterSpec, dialect: Dialect, target: TargetCheckpoint | None,
                   float_dtype: str, embed_from_target: bool, fail: Fail) -> list[TensorAction]:
    """Tensors the destination needs that the source lacks: t2d derived from d2t, tables read from the target."""
    w = dialect.writer
    assert w is not None
    actions: list[TensorAction] = []
    V, Vd = spec.vocab_size, spec.draft_vocab_size or spec.vocab_size
    reduced = _reduced(spec)

    def need_from_target(canon: str, shape: tuple[int, ...], why: str) -> None:
        if target is None or not target.ckpt.tensor_file:
            fail(f"'{dialect.from_canonical(canon)}' is needed ({why}) and the source has none: pass --target")
        actions.append(TensorAction(dialect.from_canonical(canon), canon, "from-target", float_dtype, shape, note=why))

    if reduced and "d2t" not in src.view:
        fail("reduced draft vocabulary without d2t: the mapping cannot be invented")
    if reduced and w.t2d and "t2d" not in src.view:
        actions.append(TensorAction(dialect.from_canonical("t2d"), "t2d", "derive", "BOOL", (V,),  # type: ignore[arg-type]
                                    note="t2d[i + d2t[i]] = true"))
    H = spec.hidden_size
    if not spec.has_lm_head:
        need_from_target("lm_head.weight", (Vd, H), "every engine needs the drafter's head")  # type: ignore[arg-type]
    if not spec.has_embed_tokens and (w.require_embed_tokens or (spec.target_hidden_size or H) != H):
        need_from_target("embed_tokens.weight", (V, H), "the destination keeps embed_tokens")  # type: ignore[arg-type]
    elif not spec.has_embed_tokens and embed_from_target:
        # the target's table, which every engine shares into such a drafter anyway; speculators' loader fills a
        # missing embed_tokens from the verifier only when the fresh tensor reads as NaN, so without it the
        # embedding is whatever memory held (docs/convert.md#embed-from-target)
        need_from_target("embed_tokens.weight", (V, H), "--embed-from-target: the target's embedding, shipped so "  # type: ignore[arg-type]
                         "that loaders which do not share it (speculators) need not")
    return actions


def _with_extra_tensors(actions: list[TensorAction], dialect: Dialect,
                        extra_tensors: dict[str, tuple[str, tuple[int, ...], str]] | None, out_dtype: str | None,
                        fail: Fail) -> list[TensorAction]:
    """The caller's new tensors (upgrade's), each replacing a planned one of the same canonical name."""
    w = dialect.writer
    assert w is not None
    allowed = [re.compile(p + "$") for p in (w.allowed_tensors or (".*",))]
    for canon, (dt, shape, note) in (extra_tensors or {}).items():
        name = dialect.from_canonical(canon)
        if not any(p.match(canon) for p in allowed):
            fail(f"{dialect.title} cannot hold '{name}'")
        actions = [x for x in actions if x.canonical != canon]  # an upgrade may replace a tensor
        actions.append(TensorAction(name, canon, "derive", out_dtype or dt, shape, note=note))
    return actions


def _plan_config(src: DrafterCheckpoint, spec: DrafterSpec, dialect: Dialect, aux_ids: tuple[int, ...] | None,
                 float_dtype: str, target: TargetCheckpoint | None, fail: Fail, base_model: str | None,
                 decided: str | None = None) -> tuple[dict[str, Any], list[str], dict[str, Any] | None]:
    """(the destination config with its quantisation and provenance records, the dialect's warnings, the
    quantisation side file or None)."""
    w = dialect.writer
    assert w is not None
    fields: dict[str, tuple[str, list[int]]] = {}
    warnings = [message for when, message in w.warnings if all(getattr(spec, k) == v for k, v in when.items())]
    config = _dest_config(src, spec, dialect, aux_ids, float_dtype, target, fail, base_model, fields, warnings)
    quant_config, quant_file = converted_configs(src, dialect)
    if quant_config is not None:
        config["quantization_config"] = quant_config  # entries renamed to this dialect's tensor names
    first = next((fields[p][0] for p in (dialect.aux_ids_paths or w.aux_ids_paths) if p in fields), None)
    record: dict[str, Any] = {"aux_convention": first or w.aux_convention or dialect.aux_convention}
    if fields:
        record["aux_id_fields"] = {p: c for p, (c, _) in fields.items()}  # the numbering of each field written
    if decided is not None and fields:
        record["aux_numbering"] = decided  # not assumed: the numbering rules (kimi-aux-ids-ambiguous) are settled
    config["eaglectl_provenance"] = provenance(src.ckpt, src.dialect.name, "convert", dialect.name, **record)
    return config, warnings, quant_file


def _sglang_numbering(config: dict[str, Any], fields: dict[str, tuple[str, Any]], boundary: tuple[int, ...],
                      target: TargetCheckpoint | None, fail: Fail, warnings: list[str]) -> None:
    """eagle_config's ids rewritten so that SGLang's target class captures `boundary` (engines/sglang.Capture): SGLang
    reads no other key, and numbers these by the target's class (most add 1, DeepSeek-V2/V3 only when the first
    id is 1)."""
    arch = (target.architectures or (None,))[0] if target is not None else None
    capture = sglang.capture_of(arch or "LlamaForCausalLM")
    if capture is None:
        fail(f"SGLang captures no EAGLE-3 states from the target's class {arch} (no set_eagle3_layers_to_capture)")
    ids = capture.ids_for(boundary, target.num_layers if target is not None else None)
    if ids is None:
        fail(f"SGLang's {arch or 'Llama-family'} target class ({capture.rule}: {capture.where}) captures "
             f"boundaries {list(boundary)} from no list of ids: no file serves these layers on SGLang and vLLM alike")
    if arch is None:
        warnings.append("SGLang numbers eagle_config's ids by the target's class: without --target they are written "
                        "for a Llama-family target (which adds 1 to each); pass --target for another class")
    numbering = "boundary" if ids == boundary else "output"  # every SGLang class reads one of the two
    if fields[_EC_IDS][1] != list(ids):
        warnings.append(f"{_EC_IDS} holds SGLang's numbering for the target's class ({numbering}: {list(ids)}), not "
                        f"the {fields[_EC_IDS][0]} numbering the dialect's own tools read ({fields[_EC_IDS][1]})")
    fields[_EC_IDS] = (numbering, list(ids))
    config_set(config, _EC_IDS, list(ids))


def _read_right_by_sglang(config: dict[str, Any], intended: dict[str, Any], target: TargetCheckpoint | None,
                          fail: Fail) -> None:
    """Before a byte is written: SGLang's reading of the planned config (eaglectl's table of its code) is the
    drafter's: a class it drafts with, the intended boundaries, the intended flags."""
    arch = (target.architectures or (None,))[0] if target is not None else None
    r = sglang_reading(config, target.num_layers if target is not None else None, arch)
    if r.error or r.model_error:
        fail(f"SGLang {r.version} would not draft with it: {r.error or r.model_error}")
    want = intended["boundary_ids"]
    if want is not None and r.boundary_ids is not None and list(r.boundary_ids) != list(want):
        fail(f"SGLang {r.version} would capture boundaries {list(r.boundary_ids)} ({r.source}), not the drafter's "
             f"{want}")
    wrong = [f for f in FLAGS if r.flags is not None and bool(r.flags.get(f)) != bool(intended["flags"].get(f))]
    if wrong:
        fail(f"SGLang {r.version}'s draft class applies "
             + ", ".join(f"{f}={str(bool(r.flags.get(f))).lower()}" for f in wrong)  # type: ignore[union-attr]
             + " where the drafter has " + ", ".join(f"{f}={str(bool(intended['flags'][f])).lower()}" for f in wrong)
             + " (SGLang never applies norm_before_residual)")


def _intended(spec: DrafterSpec, boundary: tuple[int, ...] | None, target: TargetCheckpoint | None,
              measured: Measurement | None,
              given: tuple[int, ...] | None, measured_flags: bool = True) -> dict[str, Any]:
    """The drafter's meaning that every runner serving the output must read: its boundaries (the measured
    reading when the probe decided it, else --aux-layer-ids, else the declared one; the target's default when no
    ids are known and the target's depth is) and its flags (with the flags the measurement decided)."""
    L = target.num_layers if target is not None else None
    ids = boundary if boundary is not None else (default_aux_ids(L, "boundary") if L is not None else None)
    flags = {f: bool(getattr(spec, f)) for f in FLAGS}
    basis = "given (--aux-layer-ids)" if given is not None else "declared (the files)"
    if measured is not None and not measured.at_chance:
        if measured.boundary_ids is not None and ids is not None and tuple(sorted(ids)) == tuple(measured.boundary_ids):
            basis = "measured"
        for name, fact in measured.facts.items() if measured_flags else ():  # upgrade sets its own flags
            if name in flags and fact.measured in ("true", "false") and fact.measured != fact.declared:
                flags[name] = fact.measured == "true"
    return {"boundary_ids": list(ids) if ids is not None else None, "flags": flags, "basis": basis}


def _main_float_dtype(src: DrafterCheckpoint) -> str:
    counts: dict[str, int] = {}
    for info in src.ckpt.tensors.values():
        if info.dtype in FLOAT_DTYPES:
            counts[info.dtype] = counts.get(info.dtype, 0) + info.numel
    return max(counts, key=counts.__getitem__) if counts else "F32"


def _tensor_order(canon: str) -> tuple[int, str]:
    order = ("embed_tokens", "input_norm", "fc_norm", "fc.", "layers.", "norm.", "lm_head", "d2t", "t2d")
    return next((i for i, p in enumerate(order) if canon.startswith(p)), len(order)), canon


def _dest_aux_ids(src: DrafterCheckpoint, spec: DrafterSpec, dialect: Dialect, target: TargetCheckpoint | None,
                  override: tuple[int, ...] | None, source_convention: str | None, fail: Fail
                  ) -> tuple[int, ...] | None:
    """Aux ids in the destination's convention; None when nobody knows them."""
    w = dialect.writer
    assert w is not None
    if override is not None:
        boundary: tuple[int, ...] | None = tuple(override)  # --aux-layer-ids is given in vLLM's convention
    elif spec.aux_layer_ids is not None:
        convention = source_convention or spec.aux_convention
        unverifiable = src.dialect.aux_convention_note and spec.sources["aux_convention"].startswith("dialect")
        if unverifiable and source_convention is None and src.dialect.name != dialect.name:
            fail(f"{src.dialect.aux_convention_note}; pass --source-aux-convention boundary|output")
        shift = 1 if convention == "output" else 0
        boundary = tuple(i + shift for i in spec.aux_layer_ids)
    else:
        boundary = None
    L = target.num_layers if target else None
    if boundary is None and L is not None and w.aux_ids_paths:
        boundary = default_aux_ids(L, "boundary")  # made explicit from the target, not guessed
    if boundary is None:
        return None
    if sorted(set(boundary)) != list(boundary):
        fail(f"aux ids {list(boundary)} must be ascending and distinct")
    if not w.aux_ids_paths:
        if L is None or tuple(boundary) != default_aux_ids(L, "boundary"):
            fail(f"{dialect.title} cannot record aux ids {list(boundary)} (it always uses (2, L//2, L-3), and both of "
                 "vLLM's runners would capture that default); "
                 + ("they are not that default for the target" if L is not None else
                    "pass --target to show they are that default"))
        return tuple(boundary)  # not written: every engine's default names them
    if w.exactly_3_aux and len(boundary) != 3:
        fail(f"{dialect.title} holds exactly 3 aux ids, not {len(boundary)}")
    if 0 in boundary and any(c == "output" for _, c in w.aux_fields(dialect.aux_convention)):
        fail("aux id 0 (the embeddings) has no output-of-layer equivalent")
    return boundary


def aux_fields_written(dialect: Dialect, boundary: tuple[int, ...]) -> dict[str, tuple[str, list[int]]]:
    """path -> (convention, ids) of every aux-id field the writer writes, from the drafter's boundary ids: vLLM's
    top-level key in vLLM's numbering, the dialect's own field in its own (formats/*.py, Writer.aux_conventions)."""
    w = dialect.writer
    assert w is not None
    return {path: (c, [i - 1 if c == "output" else i for i in boundary])
            for path, c in w.aux_fields(dialect.aux_convention)}


_EC_IDS = "eagle_config.eagle_aux_hidden_state_layer_ids"


def _dest_config(src: DrafterCheckpoint, spec: DrafterSpec, dialect: Dialect, aux_ids: tuple[int, ...] | None,
                 float_dtype: str, target: TargetCheckpoint | None, fail: Fail, base_model: str | None,
                 written_fields: dict[str, tuple[str, list[int]]], warnings: list[str]) -> dict[str, Any]:
    """The destination config; `aux_ids` are boundary ids, written into `written_fields` (path -> (convention,
    ids), filled here) in each field's own numbering; `warnings` gains the dialect's warnings about it."""
    w = dialect.writer
    assert w is not None
    if aux_ids is not None and w.aux_ids_paths:
        written_fields.update(aux_fields_written(dialect, aux_ids))
    layer = _layer_config(src, spec)
    n_aux = spec.num_aux_hidden_states
    draft_vocab = spec.draft_vocab_size or spec.vocab_size
    torch_dtype = TO_CONFIG.get(float_dtype, "float32")
    top: dict[str, Any] = {}
    family = of_checkpoint(src.ckpt)  # P-EAGLE: an EAGLE-3 drafter with a mask token and mask_hidden
    if family is not None and not family.eagle3_layout:
        family = None  # a family EAGLE-3's dialects do not read (its evidence is beside the point here)
    if dialect.config_style == "speculators":
        named_verifier = verifier(src.ckpt.config, target, base_model)
        if named_verifier is None:
            fail("the speculators format names its verifier (target): pass --base-model ORG/NAME or --target")
        if named_verifier["name_or_path"] is None:
            warnings.append("the speculators verifier is null (no Hub id of the target is known): the speculators "
                            "library's SpeculatorModel.from_pretrained raises OSError on it (rule verifier-unnamed), "
                            "and vllm serve needs --speculative-config and the target; pass --base-model ORG/NAME "
                            "to name it")
        elif not named_verifier["architectures"]:
            warnings.append(f"the speculators verifier {named_verifier['name_or_path']} is written with no "
                            "architectures (its config is not in the local Hugging Face cache); pass --target "
                            "(its folder or id) to record them")
        layer.update(model_type="qwen3" if spec.arch == "qwen3" else "llama",
                     architectures=["Qwen3ForCausalLM" if spec.arch == "qwen3" else "LlamaForCausalLM"],
                     torch_dtype=torch_dtype)
        if n_aux is not None and n_aux != 3:
            # vLLM's speculators reader (update_eagle3) builds the draft config from transformer_layer_config and
            # carries no count of its own: fc is sized from num_aux_hidden_states only when it is in there
            layer["num_aux_hidden_states"] = n_aux
        kind, architecture = "eagle3", w.architectures[spec.arch]
        if family is not None and family.family.id in w.family_forms:
            kind, architecture = w.family_forms[family.family.id]
            top.update(_family_form(family, kind, spec, layer, fail))
        top.update(architectures=[architecture], speculators_model_type=kind,
                   speculators_version="eaglectl-" + __version__,
                   speculators_config={"algorithm": kind, "default_proposal_method": "greedy",
                                       "proposal_methods": [{"proposal_type": "greedy",
                                                             "speculative_tokens": src.speculative_tokens}],
                                       "verifier": named_verifier},
                   transformer_layer_config=layer)
    else:
        top.update({"architectures": [_dest_architecture(src, spec, w.architectures[spec.arch])], **layer})
        if family is not None:
            top.update(_hf_family_keys(family, top))
    top["draft_vocab_size"] = draft_vocab
    top["target_hidden_size"] = spec.target_hidden_size
    for flag in FLAGS:
        if flag in w.omit_false and not getattr(spec, flag):
            continue  # the dialect's own loader reads an explicit false differently from an absent key
        for path in w.flag_paths.get(flag, ()):
            config_set(top, path, bool(getattr(spec, flag)))
        if flag in w.explicit_false:
            config_set(top, flag, False)  # plan_conversion refused a true value above
    if aux_ids is not None:
        for path, (_, ids) in written_fields.items():
            config_set(top, path, ids)
    if n_aux is not None and n_aux != 3:  # vLLM sizes fc for 3 unless told
        top["num_aux_hidden_states"] = n_aux
        if aux_ids is not None and w.aux_ids_paths and _EC_IDS not in written_fields:
            config_set(top, _EC_IDS, list(aux_ids))  # vLLM's sizing path, in vLLM's numbering
            written_fields[_EC_IDS] = ("boundary", list(aux_ids))
    for path, value in w.extra_config.items():
        config_set(top, path, value)
    top["torch_dtype"] = torch_dtype
    return top


def _layer_config(src: DrafterCheckpoint, spec: DrafterSpec) -> dict[str, Any]:
    """The decoder layer's config as every destination writes it: the source's own keys (a copy), without any
    dialect's wrapping, a training machine's path or a null typed field, with its RoPE base and untied head
    explicit."""
    skip = _DRAFTER_KEYS | {k for d in formats.DIALECTS.values() for k in d.owned_config_keys}  # a dialect's wrapping
    layer = json.loads(json.dumps({k: v for k, v in src.layer_config.data.items() if k not in skip}))  # the plan's own
    if not is_hub_id(layer.get("_name_or_path")):
        layer.pop("_name_or_path", None)  # a training machine's path is no identity
    strip_null_template_fields(layer)  # a typed field is never written as null (rule null-template-field)
    layer["tie_word_embeddings"] = False  # the drafter's head is its own (sglang would tie it)
    if spec.rope_theta is None and "rope_parameters" not in layer:
        layer["rope_theta"] = 10000.0  # absent means base 10000 (SafeAILab); written explicitly
    if isinstance(layer.get("rope_parameters"), dict) and "rope_theta" in layer:
        layer["rope_parameters"]["rope_theta"] = layer["rope_theta"]  # both encodings agree
    return layer


def _family_form(family: FamilyCheckpoint, kind: str, spec: DrafterSpec, layer: dict[str, Any], fail: Fail
                 ) -> dict[str, Any]:
    """A family's speculators form (`kind`, e.g. P-EAGLE's `peagle`), as vLLM's reader of that kind reads it
    (SPECULATORS_READERS): the keys it requires at the top level, taken from the family's own reading (the mask token),
    and every flag it does not copy from the top level written inside transformer_layer_config as well, so the draft
    model applies it. The HF-style places of those keys leave `layer`."""
    reader = SPECULATORS_READERS[kind]
    top: dict[str, Any] = {}
    for key in reader.renamed:
        value, _ = family.field(key)
        if value is None:
            fail(f"the speculators {kind} form needs {key} (vLLM's {kind} reader requires it); the source has none")
        top[key] = value
    for key in (*MASK_TOKEN_KEYS, "parallel_drafting"):  # vLLM's speculators reader sets both for this kind
        if "." not in key:  # a nested one (dflash_config's) is no P-EAGLE's
            layer.pop(key, None)
    for flag in FLAGS:
        if flag not in reader.copied:
            layer[flag] = bool(getattr(spec, flag))
    return top


def _hf_family_keys(family: FamilyCheckpoint, top: dict[str, Any]) -> dict[str, Any]:
    """What an HF-style config of a family in the EAGLE-3 layout holds beside EAGLE-3's, where the source kept it
    elsewhere (a speculators P-EAGLE: the mask token at the top level, parallel drafting implied by its type): the
    mask token where vLLM's proposer looks for it, and the keys its serve line needs (`parallel_drafting`)."""
    reading = family.family.reading
    assert reading is not None
    out: dict[str, Any] = dict(reading.serve_extra)
    token, _ = family.field("mask_token_id")
    if token is not None and all(config_get(top, key) is MISSING for key in MASK_TOKEN_KEYS):
        out["mask_token_id"] = token
    return {k: v for k, v in out.items() if k not in top}


def _dest_architecture(src: DrafterCheckpoint, spec: DrafterSpec, written: str) -> str:
    """The writer's class for the family, except that an MLA source spelled any known way keeps its
    DeepSeek version under vLLM's registered name (rules/layout.py MLA_SPELLINGS)."""

    archs = src.config.str_list("architectures") or ()
    name = MLA_SPELLINGS.get(archs[0]) if archs and spec.arch == "mla" else None
    return name if name in REGISTERED["mla"] and written in REGISTERED["mla"] else written


