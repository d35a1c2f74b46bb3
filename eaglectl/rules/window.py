"""Sliding-window attention: what the config asks for against what each engine applies.

vLLM 0.32 makes a draft layer sliding when `layer_types[i]` is `sliding_attention` (llama.py, qwen3_eagle3.py;
the index is draft-relative), with `sliding_window` as the window; it reads neither `use_sliding_window` nor
`max_window_layers`, its MLA drafter (deepseek_eagle3.py) applies no window, and its Llama drafter asserts
when `layer_types` is shorter than the layers. Its proposer also asserts that every draft layer sits in one KV
cache group (`validate_same_kv_cache_group`, llm_base_proposer.py), so draft layers that mix full and sliding
attention fail to start (seen on vLLM 0.32 CPU: "All drafting layers should belong to the same kv cache
group"); a sliding drafter over a full-attention target is served. speculators 0.9.0 `train` writes every
layer sliding (2048) unless told otherwise, so these drafters are common. The reference drafter applies the
window as vLLM does.
"""

from __future__ import annotations

from . import catalogue as rule
from .base import Context, check


@check
def sliding_window(ctx: Context) -> None:
    spec, layer = ctx.spec, ctx.drafter.layer_config
    types = layer.str_list("layer_types") or []
    where = ctx.at("layer_types")
    layers = spec.num_hidden_layers or 0
    if types and len(types) < layers and spec.arch == "llama":
        ctx.emit(rule.LAYER_TYPES_SHORT, f"layer_types has {len(types)} entries for {layers} layers", where)
    kinds = set(spec.layer_windows)
    if len(kinds) > 1:
        ctx.emit(rule.LAYER_TYPES_MIXED, f"layers {list(spec.sliding_layers)} slide (window {spec.sliding_window}), "
                 f"the other {layers - len(spec.sliding_layers)} attend fully", where)
    if spec.sliding_window is not None:
        slide = ", ".join(str(i) for i in spec.sliding_layers)
        ctx.emit(rule.SLIDING_WINDOW, f"layer(s) {slide} attend to the last {spec.sliding_window} positions only "
                                      f"(sliding_window {spec.sliding_window}); the rest attend fully", where)
        ctx.emit(rule.SLIDING_WINDOW_SGLANG, f"window {spec.sliding_window} on layer(s) {slide}", where)
        return
    # max_window_layers only means something beside use_sliding_window (Qwen configs carry it either way)
    asked = ["use_sliding_window: true (vLLM applies a window only through layer_types)"] \
        if layer.bool("use_sliding_window") is True else []
    if "sliding_attention" in types:
        asked.append("layer_types" + (" on an MLA drafter" if spec.arch == "mla" else " without sliding_window") +
                     f" ({spec.sources.get('sliding_window', 'no window')})")
    if asked:
        ctx.emit(rule.SLIDING_WINDOW_IGNORED, "; ".join(asked), ctx.at(asked[0].split(":")[0].split()[0]))
