"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) for the reference drafter, torch only.

The executable form of docs/math.md#mla: vLLM 0.32's `DeepseekV2MLAAttention` as used by
`Eagle3DeepseekV2ForCausalLM`, written in the non-absorbed form (per-head keys and values are
materialised; the engine's absorbed decode is the same function, only rounded differently):

    q      = q_b_proj(q_a_layernorm(q_a_proj(x)))          (or q_proj(x) when q_lora_rank is null)
    c, k_r = kv_a_proj_with_mqa(x).split([kv_lora_rank, qk_rope_head_dim])    latent first
    k_n, v = kv_b_proj(kv_a_layernorm(c)) per head as [k_nope ; v]
    q_r, k_r = interleaved RoPE on the rope slice only (k_r shared by every head), cos/sin × mscale ratio
    out    = o_proj(softmax(q·kᵀ · scale) · v),   scale = (nope + rope)^-½ · m²  (m = 1 unless DeepSeek YaRN)

Same interface as `reference.Attention` (`project`, `attend`), so the drafter around it, its KV
cache and its masks are unchanged. Attribute names are the checkpoint tensor names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .blocks import DrafterArgs, MLADims, RMSNorm, wide

# ---------------------------------------------------------------------------------------------- rope

def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """DeepSeek's attention-temperature factor: 0.1·mscale·ln(scale) + 1 (1 for scale ≤ 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def default_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    """1 / base^(2i/d), fp64."""
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cpu") / rotary_dim))


def deepseek_yarn_inv_freq(rotary_dim: int, base: float, factor: float, original_max_position_embeddings: int,
                           beta_fast: float = 32, beta_slow: float = 1) -> torch.Tensor:
    """YaRN inverse frequencies (fp64): dims turning faster than `beta_fast` times over the original
    context keep their frequency, dims slower than `beta_slow` are divided by `factor`, a linear ramp
    between. vLLM floors/ceils the ramp bounds (it has no `truncate` option)."""

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rotary_dim - 1)
    if low == high:
        high += 0.001  # vLLM's guard against a zero-width ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64, device="cpu") - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1 = the original frequency
    original = default_inv_freq(rotary_dim, base)
    return original / factor * (1 - keep) + original * keep


@dataclass(frozen=True)
class MLARope:
    kind: str  # default | deepseek_yarn | deepseek_llama_scaling (vLLM's names after its rewrite)
    inv_freq: torch.Tensor  # (qk_rope_head_dim // 2,) fp64
    mscale_ratio: float  # multiplies cos and sin
    softmax_scale: float


def rope_kind(scaling: dict[str, Any] | None) -> str:
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    return "default" if kind in (None, "default") else str(kind)


def mla_rope(dims: MLADims, theta: float, scaling: dict[str, Any] | None) -> MLARope:
    """vLLM's rope resolution for MLA (docs/math.md#mla-rope): every rope type other than `default`
    becomes DeepSeek YaRN (`deepseek_llama_scaling` when attention_factor == 1.0, else `deepseek_yarn`);
    cos/sin carry mscale(f, mscale)/mscale(f, mscale_all_dim) (defaults 1 and 0); only `deepseek_yarn`
    multiplies the softmax scale by m², m = mscale(f, mscale_all_dim)."""
    scale = dims.qk_head_dim ** -0.5
    params = scaling or {}
    if params.get("partial_rotary_factor", 1.0) != 1.0 or params.get("rope_dim") not in (None, dims.qk_rope_head_dim):
        raise ValueError("partial rotary on the MLA rope slice is not implemented")
    if rope_kind(params) == "default":
        return MLARope("default", default_inv_freq(dims.qk_rope_head_dim, theta), 1.0, scale)
    for key in ("factor", "original_max_position_embeddings"):
        if params.get(key) is None:
            raise ValueError(f"rope_scaling lacks '{key}' (vLLM's DeepSeek YaRN needs it)")
    kind = "deepseek_llama_scaling" if params.get("attention_factor") == 1.0 else "deepseek_yarn"
    factor = float(params["factor"])
    inv_freq = deepseek_yarn_inv_freq(dims.qk_rope_head_dim, theta, factor,
                                      int(params["original_max_position_embeddings"]),
                                      float(params.get("beta_fast", 32)), float(params.get("beta_slow", 1)))
    ratio = yarn_get_mscale(factor, float(params.get("mscale", 1))) / yarn_get_mscale(
        factor, float(params.get("mscale_all_dim", 0)))
    if kind == "deepseek_yarn":
        m = yarn_get_mscale(factor, float(params.get("mscale_all_dim", 0)))
        scale *= m * m
    return MLARope(kind, inv_freq, float(ratio), scale)


def apply_interleaved_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                           mscale_ratio: float = 1.0) -> torch.Tensor:
    """GPT-J (interleaved) RoPE: pair (x[2i], x[2i+1]) turns by position·inv_freq[i] and the output stays
    interleaved, as vLLM does for MLA whatever `rope_interleave` says. In fp32 (fp64 for fp64 x).
    x: (B, nh, T, d), positions: (B, T)."""
    x32 = x if x.dtype == torch.float64 else x.float()
    inv = inv_freq.to(device=x.device, dtype=x32.dtype)
    angles = positions.to(x32.dtype)[:, None, :, None] * inv[None, None, None, :]  # (B, 1, T, d/2)
    cos = (angles.cos() * mscale_ratio).repeat_interleave(2, -1)
    sin = (angles.sin() * mscale_ratio).repeat_interleave(2, -1)
    rotated = torch.stack((-x32[..., 1::2], x32[..., 0::2]), dim=-1).flatten(-2)
    return (x32 * cos + rotated * sin).to(x.dtype)


# ----------------------------------------------------------------------------------------- attention

class MLAAttention(nn.Module):
    """`in_features` is 2·hidden in EAGLE-3 layer 0 (`[norm(embeds) ; hidden_norm(hidden)]`), hidden
    after; o_proj maps back to hidden. No biases: vLLM builds none and drops stored ones."""

    def __init__(self, a: DrafterArgs, in_features: int) -> None:
        super().__init__()
        assert a.mla is not None
        self.a, self.d = a, a.mla
        d, nh = a.mla, a.num_heads
        if d.q_lora_rank is not None:
            self.q_a_proj = nn.Linear(in_features, d.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(d.q_lora_rank, a.rms_norm_eps)
            self.q_b_proj = nn.Linear(d.q_lora_rank, nh * d.qk_head_dim, bias=False)
        else:
            self.q_proj = nn.Linear(in_features, nh * d.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(in_features, d.kv_lora_rank + d.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(d.kv_lora_rank, a.rms_norm_eps)
        self.kv_b_proj = nn.Linear(d.kv_lora_rank, nh * (d.qk_nope_head_dim + d.v_head_dim), bias=False)
        self.o_proj = nn.Linear(nh * d.v_head_dim, a.hidden_size, bias=False)
        rope = mla_rope(d, a.rope_theta, a.rope_scaling)
        self.kept_probs: list[torch.Tensor] | None = None  # a list: softmax rows (fp32) are appended (attention readers)
        # plain attributes, not buffers: Module.to(bfloat16) must not round them
        self.rope_kind, self.inv_freq, self.rope_mscale, self.scale = (rope.kind, rope.inv_freq, rope.mscale_ratio,
                                                                       rope.softmax_scale)

    def project(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, in) → q, k (B, nh, T, nope + rope) with RoPE applied, v (B, nh, T, v_head_dim).
        The drafter's shared `inv_freq` is for GQA layers; MLA always uses its own."""
        d, nh = self.d, self.a.num_heads
        B, T, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if d.q_lora_rank is not None else self.q_proj(x)
        q_nope, q_pe = q.view(B, T, nh, d.qk_head_dim).transpose(1, 2).split(
            [d.qk_nope_head_dim, d.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([d.kv_lora_rank, d.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(B, T, nh, d.qk_nope_head_dim + d.v_head_dim)
        k_nope, v = kv.transpose(1, 2).split([d.qk_nope_head_dim, d.v_head_dim], dim=-1)
        q_pe = apply_interleaved_rope(q_pe, positions, self.inv_freq, self.rope_mscale)
        k_pe = apply_interleaved_rope(k_pe[:, None], positions, self.inv_freq, self.rope_mscale)  # (B, 1, T, r)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(B, nh, T, d.qk_rope_head_dim)], dim=-1)
        return q, k, v.contiguous()

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q (B, nh, Tq, qk); k (B, nh, Tk, qk); v (B, nh, Tk, v); mask (Tq, Tk) True = visible → (B, Tq, H)."""
        scores = (wide(q) @ wide(k).transpose(-1, -2)) * self.scale
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        if self.kept_probs is not None:
            self.kept_probs.append(probs)
        probs = probs.to(v.dtype)
        out = (probs @ v).transpose(1, 2).reshape(q.shape[0], q.shape[2], self.a.num_heads * self.d.v_head_dim)
        return self.o_proj(out)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x, positions)
        return self.attend(q, k, v, mask)
