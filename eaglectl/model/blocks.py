"""What the reference drafter's attention kinds share (model/reference.py's GQA, model/mla.py's MLA): the
drafter's sizes and flags (`DrafterArgs`, with MLA's dims), the fp32-for-half-types rule (`wide`) and `RMSNorm`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn


def owned(a: np.ndarray, dtype: Any = None) -> torch.Tensor:
    """A tensor of an array (as `dtype`, contiguous), copied only where the array is read-only (bytes read from a
    file, a memory map): torch warns on, and must never write through, a read-only buffer."""
    a = np.ascontiguousarray(a, dtype=dtype)
    return torch.from_numpy(a if a.flags.writeable else a.copy())


@dataclass(frozen=True)
class MLADims:
    q_lora_rank: int | None  # None: a plain q_proj (vLLM 0.32's EAGLE-3 loader cannot load that)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass
class DrafterArgs:
    hidden_size: int
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    num_layers: int
    vocab_size: int
    draft_vocab_size: int
    num_aux: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before RoPE
    attention_bias: bool = False
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    mla: MLADims | None = None  # set: MLA attention (head_dim / num_kv_heads are then unused)
    windows: tuple[int | None, ...] = ()  # per layer: the sliding window (None, or beyond the tuple: full attention)


def wide(x: torch.Tensor) -> torch.Tensor:
    """fp32 for half types, fp64 stays fp64 (the math tests run in fp64)."""
    return x if x.dtype == torch.float64 else x.float()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = wide(x)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)
