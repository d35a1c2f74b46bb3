"""`convert` between the producers' layouts of one drafter family (formats/families.LAYOUTS: DFlash as z-lab / vLLM,
the speculators format and TorchSpec write it), planned, streamed, fail-closed and re-checked like EAGLE-3's.

The source's meaning is vLLM's reading of its config (families/reading.reading: the layers each runner captures, the
mask token, each layer's attention, the sizes), TorchSpec's config first read as TorchSpec's model reads it. The
destination config is built from that meaning; before a byte is written its reading must equal the source's (else
a ConversionError names the value the destination cannot carry), and after writing the files are re-opened,
detected as the destination layout, inspected, and read again. Tensors are renamed by the layouts' key tables and
copied byte for byte (or cast with --dtype); nothing is dropped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .. import __version__
from ..checkpoint.plan import ConversionPlan, TensorAction, config_diff, provenance, reopen, shard, verifier
from ..checkpoint.target import TargetCheckpoint
from ..errors import ConversionError
from ..formats.families import LAYOUTS, Layout, layout, writable_layouts
from ..io.dtypes import CONFIG_NAMES, FLOAT_DTYPES, TO_CONFIG
from ..io.safetensors import Written
from .checkpoint import FamilyCheckpoint, of_checkpoint
from .inspect import inspect_family
from .reading import differences, drafter_config, family_view, layer_attention, reading

# the only DFlash class whose layouts eaglectl maps (DFlash2's convolution and selector, XPress: not mapped)
CONVERTED_ARCHITECTURE = "DFlashDraftModel"
# keys of a DFlash config that describe the drafter as a whole (the speculators format keeps them outside the decoder)
_DRAFTER_KEYS = frozenset({"architectures", "auto_map", "dflash_config", "eagle_aux_hidden_state_layer_ids",
                           "draft_vocab_size", "target_hidden_size", "block_size", "num_target_layers",
                           "eaglectl_provenance"})
# TorchSpec's DFlashConfig fields beside the decoder's (models/draft/dflash.py); `num_target_layers` counts the layers
# it captures there, where z-lab's counts the target's layers
_TORCHSPEC_KEYS = ("target_layer_ids", "mask_token_id", "num_target_layers", "target_num_hidden_layers",
                   "markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")



def _fail(src: FamilyCheckpoint, to: str, message: str) -> NoReturn:
    raise ConversionError(f"{src.source} -> {to}: {message}", dialect=to, path=src.source)


def _source_layout(src: FamilyCheckpoint) -> Layout:
    found = src.layout
    if found is None:
        raise ConversionError(f"{src.source}: eaglectl converts no {src.family.name} layouts (only between "
                              f"DFlash's: {', '.join(lay.id for lay in LAYOUTS)})", path=src.source,
                              hint=f"eaglectl inspect {src.source}")
    return found


def meaning(src: FamilyCheckpoint, lay: Layout, fail: Callable[[str], NoReturn]) -> dict[str, Any]:
    """The source's config as vLLM reads a DFlash config (reading.family_view); TorchSpec's first mapped from the
    fields its own model reads (a top-level target_layer_ids and mask_token_id, num_target_layers = how many)."""
    config = src.config
    if lay.config_style != "torchspec":
        view = family_view(config)
    else:
        view = {k: v for k, v in config.items() if k not in _TORCHSPEC_KEYS}
        if config.get("markov_rank") or config.get("enable_confidence_head"):
            fail("a Markov or confidence head (DSpark's): no DFlash layout carries it")
        dc = dict(drafter_config(config))
        ids = config.get("target_layer_ids") or dc.get("target_layer_ids")
        mask = config.get("mask_token_id", dc.get("mask_token_id"))
        if not isinstance(ids, list) or mask is None:
            fail("TorchSpec's config names no target_layer_ids or mask_token_id (its trainer derives defaults from "
                 "the target): write them into config.json as the drafter was trained")
        dc.update(target_layer_ids=ids, mask_token_id=mask)
        view["dflash_config"] = dc
        if config.get(lay.depth_key) is not None:
            view["num_target_layers"] = config[lay.depth_key]  # z-lab's key for the target's depth
        if view.get("model_type") == "dflash":  # TorchSpec's config class; the decoder is Qwen3's (q_norm, k_norm)
            view["model_type"] = "qwen3"
    archs = view.get("architectures")  # a speculators dflash2 / xpress config reads as its own class
    if archs not in (None, [CONVERTED_ARCHITECTURE]):
        fail(f"architecture {archs}: eaglectl maps the layouts of {CONVERTED_ARCHITECTURE} only (DFlash2's "
             "convolution and selector head, XPress: not mapped)")
    fc = src.shape("fc.weight") or src.shape(lay.from_canonical("fc.weight"))
    ids = drafter_config(view).get("target_layer_ids")
    hidden = view.get("target_hidden_size") or view.get("hidden_size")
    if fc is not None and isinstance(ids, list) and isinstance(hidden, int) and fc[1] != len(ids) * hidden:
        fail(f"fc.weight takes {fc[1]} inputs, but {len(ids)} target layers of {hidden} give {len(ids) * hidden}: "
             "the config does not describe these weights")
    return view


def plan_family(src: FamilyCheckpoint, dest: str | os.PathLike[str], to: str, *, dtype: str | None = None,
                target: TargetCheckpoint | None = None, base_model: str | None = None,
                max_shard_size: int | None = None) -> ConversionPlan:
    """Every tensor renamed (copied or cast) and the destination config, decided before a byte is written; refused
    where the source has an error the conversion would carry over. `convert` executes it with `recheck`."""
    for f in inspect_family(src, target).findings:
        if f.severity == "error" and not f.rule.repaired_by_convert:
            raise ConversionError(f"{src.source}: source has error [{f.rule_id}] {f.message}", path=src.source,
                                  hint=f"eaglectl inspect {src.source} (shows every finding)")
    dest_layout = layout(to)

    def fail(message: str) -> NoReturn:
        _fail(src, to, message)

    source_layout = _source_layout(src)
    if dest_layout is None or dest_layout.family != src.family.id:
        fail(f"'{to}' is not a layout of {src.family.name} drafters (eaglectl writes: {', '.join(writable_layouts())})")
    if not dest_layout.writable:
        fail(f"eaglectl reads {dest_layout.title} but does not write it: {dest_layout.why}")
    view = meaning(src, source_layout, fail)
    config = _config(src, view, dest_layout, target, base_model, fail)
    config["eaglectl_provenance"] = provenance(src.ckpt, source_layout.id, "convert", to)
    if dtype:
        config.get("transformer_layer_config", config)["torch_dtype"] = TO_CONFIG[CONFIG_NAMES[dtype]]
    before = reading(view)
    changed = differences(before, reading(config))
    if changed:
        what, was, now = changed[0]
        fail(f"vLLM would read {what} as {now!r} from the {dest_layout.title} config, not {was!r} as from the source: "
             f"the layout cannot carry it; nothing was written")
    out_dtype = CONFIG_NAMES[dtype] if dtype else None
    actions = []
    for stored in sorted(src.ckpt.tensor_file):
        info = src.ckpt.tensors[stored]
        name = dest_layout.from_canonical(source_layout.to_canonical(stored))
        cast = out_dtype is not None and info.dtype in FLOAT_DTYPES and info.dtype != out_dtype
        actions.append(TensorAction(name, source_layout.to_canonical(stored), "cast" if cast else "copy",
                                    out_dtype if cast else info.dtype, tuple(info.shape), stored,
                                    info.dtype if cast else None))
    if len({a.dest for a in actions}) != len(actions):
        fail("two source tensors map to one name in the destination layout")
    metadata = {"format": "pt", "eaglectl": json.dumps(config["eaglectl_provenance"], sort_keys=True)}
    return ConversionPlan(source=src.ckpt.source, source_dialect=source_layout.id, dest=os.fspath(dest),
                          dest_dialect=to, tensors=actions, dropped=[], config=config,
                          config_changes=config_diff(src.config, config), shards=shard(actions, max_shard_size),
                          metadata=metadata, intended={"reading": before})


def _config(src: FamilyCheckpoint, view: dict[str, Any], lay: Layout, target: TargetCheckpoint | None,
            base_model: str | None, fail: Callable[[str], NoReturn]) -> dict[str, Any]:
    """The destination's config.json for the meaning `view`."""
    dc = dict(drafter_config(view))
    block = src.config.get("block_size", dc.get("block_size"))
    if lay.config_style == "hf":
        out = {k: v for k, v in view.items() if k != "eagle_aux_hidden_state_layer_ids"}
        out["architectures"] = [CONVERTED_ARCHITECTURE]
        if block is not None and "block_size" not in dc:
            out["block_size"] = block
        if target is not None and target.num_layers is not None:
            out.setdefault("num_target_layers", target.num_layers)
        return out
    attention = layer_attention(view)
    causal = {c for _, c in attention} if isinstance(attention, list) else set()
    if len(causal) > 1:
        fail("its layers differ in causality (causal sliding layers, non-causal full ones), and the speculators "
             "format has one switch for all (vLLM sets dflash_config.causal from sliding_window_non_causal)")
    named = verifier(src.config, target, base_model)
    if named is None:
        fail("the speculators format names its verifier (target): pass --base-model ORG/NAME or --target")
    if not isinstance(block, int) or block < 2:
        fail(f"block_size {block!r}: the speculators format needs the draft block size (speculative tokens + 1)")
    sample_from_anchor = bool(dc.get("sample_from_anchor", False))
    ids = dc.get("target_layer_ids")
    return {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "speculators_version": "eaglectl-" + __version__,
        "speculators_config": {
            "algorithm": "dflash", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": block if sample_from_anchor else block - 1}],
            "verifier": named},
        "transformer_layer_config": {k: v for k, v in view.items() if k not in _DRAFTER_KEYS},
        "draft_vocab_size": view.get("draft_vocab_size") or view.get("vocab_size"),
        **({"target_hidden_size": view["target_hidden_size"]} if view.get("target_hidden_size") else {}),
        "block_size": block,
        # boundary numbering: vLLM's reader sets dflash_config.target_layer_ids = each - 1 (every id is kept)
        "aux_hidden_state_layer_ids": [i + 1 for i in ids] if isinstance(ids, list) else ids,
        "mask_token_id": dc.get("mask_token_id"),
        # vLLM's reader: causal = not sliding_window_non_causal (absent reads as true); written explicitly
        "sliding_window_non_causal": not causal.pop() if causal else True,
        "sample_from_anchor": sample_from_anchor,
    }


def recheck(stage: Path, plan: ConversionPlan, written: list[Written], target: TargetCheckpoint | None) -> list[str]:
    """The staged output opens with exactly the planned tensors, is the destination layout of the family, has no
    inspect errors, and vLLM's reading of the written config is the source's."""
    where = f"{plan.dest} (staged)"
    out = reopen(stage, plan, written)
    fam = of_checkpoint(out, own_layout=True)
    found = fam.layout if fam is not None else None
    if found is None or found.id != plan.dest_dialect:
        raise ConversionError(f"{where}: the written files read as {found.id if found else 'no DFlash layout'}, "
                              f"not {plan.dest_dialect}")
    assert fam is not None
    report = inspect_family(fam, target, scan=True)  # every value read: a cast may overflow to Inf
    errors = [f for f in report.findings if f.severity == "error"]
    if errors:
        raise ConversionError(f"{where}: inspect finds [{errors[0].rule_id}] {errors[0].message}")
    assert plan.intended is not None
    before = plan.intended["reading"]
    changed = differences(before, reading(out.config or {}))
    if changed:
        what, was, now = changed[0]
        raise ConversionError(f"{where}: vLLM reads {what} as {now!r} from the written config, the source as "
                              f"{was!r}; nothing was written", path=plan.dest)
    captured = before.get("layers vLLM's v1 runner captures")
    return [f"detected as {found.id} ({fam.family.name})", "inspect --scan finds no errors (no NaN/Inf)",
            f"vLLM reads the written config as the source's ({len(before)} values: both runners capture boundaries "
            f"{captured}, mask token {before['mask_token_id']}, each layer's attention); eaglectl's reading of vLLM "
            "0.32's DFlash code"]

