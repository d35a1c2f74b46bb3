"""Load an interpreted drafter checkpoint into the reference drafter (strict: every tensor, no extras)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .. import counters as loads
from ..checkpoint.drafter import DrafterCheckpoint
from ..errors import IncompatibleDrafterError, ReferenceLimitError
from ..io.dtypes import FLOAT_DTYPES
from ..io.jsonio import ConfigView
from ..io.quant import config_problem, dequantize, layout_of, scale_of
from ..spec import DrafterSpec, layer_index
from .blocks import MLADims, owned
from .mla import mla_rope, rope_kind
from .reference import ROPE_KINDS, Drafter, DrafterArgs

DTYPES = {name: getattr(torch, name) for name in ("float32", "bfloat16", "float16")}  # the --dtype choices


def args_from_spec(spec: DrafterSpec, source: str = "") -> DrafterArgs:
    """DrafterArgs for a spec, or IncompatibleDrafterError naming what the reference cannot run."""
    where = f"{source}: " if source else ""

    def need(name: str) -> int:
        value = getattr(spec, name)
        if value is None:
            raise IncompatibleDrafterError(f"{where}the drafter's config lacks '{name}'", key=name,
                                           hint=f"add '{name}' to config.json (vLLM needs it too)")
        return value

    mla, rope_scaling = None, spec.rope_scaling
    if spec.arch == "mla":
        mla, rope_scaling = _mla_args(spec, where)
    else:
        kind = rope_kind(spec.rope_scaling)
        if kind not in ROPE_KINDS:
            raise ReferenceLimitError(f"{where}rope_scaling type '{kind}' is not implemented in the reference "
                                      f"drafter (it runs {', '.join(ROPE_KINDS)})", key="rope_scaling")
    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    return DrafterArgs(
        hidden_size=hidden,
        target_hidden_size=spec.target_hidden_size or hidden,
        num_heads=heads,
        num_kv_heads=heads if mla else need("num_key_value_heads"),  # MLA: every head has its own k and v
        head_dim=need("head_dim"),
        intermediate_size=need("intermediate_size"),
        num_layers=need("num_hidden_layers"),
        vocab_size=need("vocab_size"),
        draft_vocab_size=spec.draft_vocab_size or need("vocab_size"),
        num_aux=need("num_aux_hidden_states"),
        rms_norm_eps=spec.rms_norm_eps if spec.rms_norm_eps is not None else 1e-6,
        rope_theta=spec.rope_theta if spec.rope_theta is not None else 10000.0,
        rope_scaling=rope_scaling,
        qk_norm=spec.arch == "qwen3",
        attention_bias=spec.attention_bias,
        norm_before_residual=spec.norm_before_residual,
        norm_before_fc=spec.norm_before_fc,
        fc_norm=spec.fc_norm,
        norm_output=spec.norm_output,
        mla=mla,
        windows=spec.layer_windows,
    )


def _mla_args(spec: DrafterSpec, where: str) -> tuple[MLADims, dict[str, Any] | None]:
    """MLA dims and the rope dict as vLLM resolves them (docs/math.md#mla-rope), or the key that stops it."""
    dims = spec.mla or {}
    for key, value in dims.items():
        if value is None and (key != "q_lora_rank" or spec.sources.get(key, "").startswith("invalid")):
            raise IncompatibleDrafterError(f"{where}the drafter's config has no valid '{key}'", key=key,
                                           hint=f"fix '{key}' in config.json (inspect names what it read)")
    if spec.norm_before_fc:
        raise IncompatibleDrafterError(f"{where}MLA drafters have no input_norm / norm_before_fc (vLLM's DeepSeek "
                                       "EAGLE-3 model cannot load one)", key="norm_before_fc",
                                       hint="drop norm_before_fc and input_norm.weight, or serve it as a Llama drafter")
    scaling = dict(spec.rope_scaling) if spec.rope_scaling else None
    if scaling is not None and rope_kind(scaling) != "default":
        # transformers fills the original context from max_position_embeddings (its default 4096)
        scaling.setdefault("original_max_position_embeddings", spec.max_position_embeddings or 4096)
    mla = MLADims(dims["q_lora_rank"], dims["kv_lora_rank"], dims["qk_nope_head_dim"],  # type: ignore[arg-type]
                  dims["qk_rope_head_dim"], dims["v_head_dim"])  # type: ignore[arg-type]
    try:
        mla_rope(mla, spec.rope_theta if spec.rope_theta is not None else 10000.0, scaling)
    except ValueError as e:
        raise ReferenceLimitError(f"{where}{e}", key="rope_scaling") from None
    return mla, scaling


# Tensors of a drafter that EAGLE-3's chain never reads, so the reference drafter (which drafts the chain) does not
# build them: P-EAGLE's mask_hidden fills its parallel slots only. They are loaded all the same, for what compares
# values (verify; check's parity stage looks at them), and inspect checks their shape.
CHAIN_UNUSED = frozenset({"mask_hidden"})


@dataclass
class LoadedDrafter:
    """A drafter's values in fp32 (exact for bf16/fp16 files), ready to build at any dtype/device."""

    source: str
    dialect: str
    spec: DrafterSpec
    args: DrafterArgs
    tensors: dict[str, torch.Tensor]  # canonical name -> fp32 values
    stored_dtypes: dict[str, str]
    has_embed: bool

    def build(self, dtype: torch.dtype, device: str, *, replace: dict[str, torch.Tensor] | None = None,
              own_embedding: bool | None = None, **overrides: Any) -> Drafter:
        """The reference drafter. The probe tries other readings of the same files: `overrides` replace
        DrafterArgs fields (flags), `replace` replaces tensors (a head taken from the target), and
        `own_embedding=False` ignores a shipped embedding (the target's is passed to `run` instead)."""
        args = DrafterArgs(**{**self.args.__dict__, **overrides}) if overrides else self.args
        own = self.has_embed if own_embedding is None else own_embedding
        with torch.device("meta"):  # no random init of weights that are replaced anyway
            model = Drafter(args, own_embedding=own)
        state = {k: v for k, v in {**self.tensors, **(replace or {})}.items() if k != "t2d" and k not in CHAIN_UNUSED}
        if not own:
            state.pop("embed_tokens.weight", None)
        if overrides.get("fc_norm") is False:  # a reading that ignores fc_norm weights (an engine that drops them)
            state = {k: v for k, v in state.items() if not k.startswith("fc_norm.")}
        if "d2t" not in state:
            state["d2t"] = torch.zeros(args.draft_vocab_size, dtype=torch.long)
        expected = set(model.state_dict())
        if overrides.get("fc_norm") is True:  # a reading with fc_norm but no weights: an engine's unit init
            state.update({k: torch.ones(args.target_hidden_size) for k in expected - set(state)
                          if k.startswith("fc_norm.")})
        extra = sorted(set(state) - expected)
        missing = sorted(expected - set(state))
        if extra or missing:
            what = f"unexpected {extra[0]!r}" if extra else f"missing {missing[0]!r}"
            raise IncompatibleDrafterError(f"{self.source}: tensor {what} for the reference drafter "
                                           f"({len(extra)} unexpected, {len(missing)} missing)",
                                           tensor=(extra or missing)[0],
                                           hint=f"eaglectl inspect {self.source} (names the tensors vLLM would refuse)")
        model.load_state_dict(state, strict=True, assign=True)  # shares the fp32 tensors, no copy
        return model.to(device=device, dtype=dtype).eval()


def load_reference(d: DrafterCheckpoint, shared: Mapping[str, torch.Tensor] | None = None) -> LoadedDrafter:
    """Every tensor of an interpreted checkpoint in fp32 for the reference drafter, read on the first call only
    (`d.memo` keeps the result); a quantised export's weights are dequantised. `shared`: fp32 tensors the caller
    already holds for canonical names whose stored bytes it proved equal (a conversion's copied tensors, checked
    byte for byte after writing): used as they are, not read into a second copy."""
    kept = d.memo.get("fp32")
    if isinstance(kept, LoadedDrafter):
        return kept

    loads.count("drafter_fp32")
    bad = config_problem(ConfigView(d.ckpt.config, d.config.where))
    if bad is not None:  # vLLM stops at it before the weights: no run of them would mean anything
        raise IncompatibleDrafterError(f"{d.source}: {bad[1]}", key=bad[0],
                                       hint="fix quantization_config in config.json (inspect names it)")
    unrun = [c for c in sorted(CHAIN_UNUSED) if c in d.view and d.view.info(c).dtype not in FLOAT_DTYPES]
    if unrun:  # compared by value (verify, check's parity): integers are no learned placeholder
        raise IncompatibleDrafterError(f"{d.source}: '{d.view.stored[unrun[0]]}' is {d.view.info(unrun[0]).dtype}, "
                                       "not floating-point values (inspect: peagle-mask-hidden)", tensor=unrun[0],
                                       hint="export mask_hidden with the drafter's floating-point dtype")
    args = args_from_spec(d.spec, d.source)
    quant = layout_of(d)  # a quantised export: weights are dequantised, scales are not parameters
    tensors: dict[str, torch.Tensor] = {}
    for canon in d.view.names():
        if canon.endswith(".hidden_norm.weight") and layer_index(canon) not in (None, 0):
            continue  # vLLM creates hidden_norm on every layer but uses only layer 0's
        if quant is not None and scale_of(canon) is not None and canon not in quant.orphans:
            continue
        if shared is not None and canon in shared:
            tensors[canon] = shared[canon]
            continue
        if quant is not None and canon in quant.quantized:
            value = dequantize(d, canon, quant)
        else:
            value = d.view.read(canon)
        t = owned(value)
        tensors[canon] = t.long() if canon == "d2t" else t if canon == "t2d" else t.float()
    stored = {c: d.view.info(c).dtype for c in d.view.names()}
    d.memo["fp32"] = loaded = LoadedDrafter(d.source, d.dialect.name, d.spec, args, tensors, stored,
                                            "embed_tokens.weight" in tensors)
    return loaded
