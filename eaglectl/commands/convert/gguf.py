"""`convert --to gguf`: the plan's tensors written as one llama.cpp EAGLE-3 `.gguf` file, checked by reading it back.

The plan (plan.py) has already refused what the GGUF dialect's Writer cannot hold (not exactly 3 aux
layers, more than one decoder layer, MLA / Qwen3 attention, fc_norm, norm_output); this module refuses the rest
that llama.cpp's eagle3 loader cannot take (rope scaling, attention biases, a missing lm_head) and then follows
llama.cpp's converter (conversion/llama.py at 0c1e5709): q/k rows permuted, `d2t` as absolute I64 ids, `t2d` left
out, the `eagle3.*` keys typed as the loader reads them. The file is staged and renamed by io/atomic.py; before the
rename it is re-read, un-permuted and compared bit for bit with what the plan said to write.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...checkpoint.drafter import DrafterCheckpoint, interpret
from ...errors import ConversionError, filesystem_error
from ...io import gguf as ggufio
from ...io.atomic import REPLACEABLE, local_inputs, staged_output
from ...io.dtypes import DTYPES
from .write import SourceDigest, tensor_entry

if TYPE_CHECKING:
    from ...checkpoint.plan import ConversionPlan, TensorAction
    from ...checkpoint.target import TargetCheckpoint

FILE_NAME = "model.gguf"
_KEYS = {config: key for key, config in ggufio.CONFIG_KEYS.items()}


def gguf_metadata(plan: ConversionPlan) -> dict[str, Any]:
    c = plan.config
    if c.get("rope_scaling"):
        raise ConversionError(f"{plan.source}: rope_scaling {c['rope_scaling']!r} is not written to GGUF (llama.cpp's "
                              "eagle3 loader reads it through keys and a rope_freqs tensor eaglectl does not produce)",
                              hint="convert a drafter trained with default RoPE, or use llama.cpp's own converter")
    if c.get("attention_bias"):
        raise ConversionError(f"{plan.source}: attention biases: llama.cpp's eagle3 loader has no q/k/v bias tensors")
    ids = c.get("eagle_aux_hidden_state_layer_ids")
    if not isinstance(ids, list) or len(ids) != 3:
        raise ConversionError(f"{plan.source}: llama.cpp's eagle3 loader needs exactly 3 ids in eagle3.target_layers; "
                              f"the drafter records {ids if ids is not None else 'none'}",
                              hint="pass --target (its default (2, L//2, L-3) is written) or --aux-layer-ids")
    wanted = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
              "vocab_size", "rms_norm_eps", "rope_theta", "max_position_embeddings",
              "eagle_aux_hidden_state_layer_ids", "target_hidden_size", "norm_before_residual", "norm_before_fc")
    # llama.cpp's vocab loader requires tokenizer.ggml.model; "none" loads without a tokenizer (vocab_size dummy
    # tokens). Its converter copies the target's tokenizer instead, which eaglectl does not (docs/gguf.md)
    meta: dict[str, Any] = {"general.name": Path(plan.source).name or "eagle3-draft", "tokenizer.ggml.model": "none"}
    for name in wanted:
        value = c.get(name)
        if name == "target_hidden_size" and value is None:
            value = c.get("hidden_size")
        if value is None:
            continue
        meta[_KEYS[name]] = float(value) if name in ("rms_norm_eps", "rope_theta") else value
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    meta[f"{ggufio.ARCH}.rope.dimension_count"] = int(head_dim)
    if c.get("head_dim"):
        meta[f"{ggufio.ARCH}.attention.key_length"] = meta[f"{ggufio.ARCH}.attention.value_length"] = int(head_dim)
    return meta


def _stored(a: TensorAction, src: DrafterCheckpoint, target: TargetCheckpoint | None, digest: SourceDigest
            ) -> np.ndarray:
    """The plan's bytes for `a` (copy, cast, from-target), as an array in the HF layout."""
    entry = tensor_entry(a, src, target, {}, digest)
    if entry.copy is not None:
        with open(entry.copy.path, "rb") as f:
            f.seek(entry.copy.offset)
            raw = f.read(entry.copy.length)
    else:
        raw = b"".join(bytes(c) for c in entry.chunks())
    code = DTYPES[a.dtype].numpy or "<u2"  # BF16 as its bit patterns
    return np.frombuffer(raw, dtype=code).reshape(a.shape)


def _llama_layout(name: str, data: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    if name in ggufio.PERMUTED:
        heads = meta[_KEYS[ggufio.PERMUTED[name]]]
        return np.ascontiguousarray(ggufio.permute(data, heads))
    if name == "d2t":
        return data.astype(np.int64) + np.arange(data.shape[0], dtype=np.int64)
    return data


def execute_gguf(plan: ConversionPlan, src: DrafterCheckpoint, *, target: TargetCheckpoint | None = None,
                 force: bool = False, after_write: Callable[[DrafterCheckpoint], list[str]] | None = None,
                 inputs: list[str] | None = None, digest: SourceDigest | None = None) -> tuple[list[str], str]:
    """Write `plan` as DEST/model.gguf; (what was checked, the source digest). `after_write(out)` (convert's
    behavioural replay) runs on the staged file, re-read, before the rename, as for every other destination."""
    if "lm_head.weight" not in {a.canonical for a in plan.tensors}:
        raise ConversionError(f"{plan.source}: no lm_head: llama.cpp's eagle3 graph needs the draft's own output head",
                              hint="pass --target to take it from the target model")
    meta = gguf_metadata(plan)
    with staged_output(plan.dest, force=force, sources=local_inputs(src, target) if inputs is None else inputs,
                       replaceable=(*REPLACEABLE, "*.gguf")) as stage:
        digest = digest or SourceDigest(src.ckpt)
        try:
            wanted = {a.dest: (a, _stored(a, src, target, digest)) for a in plan.tensors}
            source_digest = digest.result()
            tensors = [(name, "I64" if name == "d2t" else a.dtype, _llama_layout(name, data, meta))
                       for name, (a, data) in wanted.items()]
            ggufio.write_gguf(stage / FILE_NAME, meta, tensors)
        except OSError as e:
            raise filesystem_error(e, "write the output in", stage) from None
        finally:
            digest.close()
        out = interpret(ggufio.open_gguf(str(stage / FILE_NAME), stage / FILE_NAME))
        checked = [_check_round_trip(out, wanted), *_check_spec(out, src, plan)]
        if after_write is not None:  # under llama.cpp's reading of eagle3.target_layers (ENGINE_AUX_CONVENTIONS)
            checked += after_write(out)
        src.ckpt.ensure_unchanged()
        checked.append("the source did not change while it was read")
    return checked, source_digest


def _check_round_trip(out: DrafterCheckpoint, wanted: dict[str, tuple[TensorAction, np.ndarray]]) -> str:
    g = out.ckpt.files[0].source.gguf  # type: ignore[union-attr]
    for name, (_, data) in wanted.items():
        back = g.raw(name)
        if back.shape != data.shape or back.astype(data.dtype).tobytes() != data.tobytes():
            raise ConversionError(f"{out.root}: tensor '{name}' reads back different from what was written "
                                  "(nothing was written)", tensor=name)
    return f"{len(wanted)} tensors read back through the gguf reader, un-permuted, bit-identical to the plan"


def _check_spec(out: DrafterCheckpoint, src: DrafterCheckpoint, plan: ConversionPlan) -> list[str]:
    if out.dialect.name != "gguf":
        raise ConversionError(f"{out.root}: the written file is detected as {out.dialect.name}, not gguf")
    s, o = src.spec, out.spec
    ids = plan.config.get("eagle_aux_hidden_state_layer_ids")
    same = {"aux ids": (list(o.aux_layer_ids or ()), list(ids or ())),
            "vocab": ((o.vocab_size, o.draft_vocab_size), (s.vocab_size, s.draft_vocab_size)),
            "flags": ((o.norm_before_residual, o.norm_before_fc, o.fc_norm, o.norm_output),
                      (s.norm_before_residual, s.norm_before_fc, s.fc_norm, s.norm_output)),
            "sizes": ((o.hidden_size, o.num_attention_heads, o.num_key_value_heads, o.head_dim, o.intermediate_size),
                      (s.hidden_size, s.num_attention_heads, s.num_key_value_heads, s.head_dim, s.intermediate_size))}
    for what, (got, want) in same.items():
        if got != want:
            raise ConversionError(f"{out.root}: the GGUF reads back with {what} {got}, the source has {want} "
                                  "(nothing was written)")
    return [f"re-read as gguf: aux ids {list(ids or ())}, vocab {s.vocab_size}/{s.draft_vocab_size}, flags and "
            "sizes as the source"]
