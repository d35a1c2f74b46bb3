"""Floating-point casts between safetensors dtypes in numpy, bit-identical to torch's `.to(dtype)`.

Conversions cast chunk by chunk without importing torch (its import alone costs a second). bf16
rounding is round-to-nearest-even on the fp32 bits, as in c10::BFloat16; fp16 goes through
numpy's IEEE conversion (also round-to-nearest-even); double → half/bf16 rounds through float, as
torch does. NaN stays NaN (its payload may differ: torch's own vectorised and scalar paths disagree
on it, 0xFFFF vs 0x7FC0). A test compares every pair against torch on random and special values.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def decode(raw: Any, dtype: str) -> np.ndarray:
    """Raw little-endian bytes of `dtype` as float32 (float64 for F64), flat."""
    if dtype == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4")
    if dtype == "F64":
        return np.frombuffer(raw, dtype="<f8")
    raise ValueError(f"not a float dtype: {dtype}")


def encode(values: np.ndarray, dtype: str) -> bytes:
    """float values (any float numpy dtype) as raw bytes of `dtype`."""
    if dtype == "F64":
        return np.ascontiguousarray(values, dtype="<f8").tobytes()
    with np.errstate(over="ignore"):  # out-of-range values become inf, as in torch
        x = np.ascontiguousarray(values, dtype="<f4")  # double -> bf16/fp16 rounds through float, as torch does
    if dtype == "F32":
        return x.tobytes()
    if dtype == "F16":
        with np.errstate(over="ignore"):
            return x.astype("<f2").tobytes()
    if dtype == "BF16":
        bits = x.view(np.uint32)
        rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
        rounded[np.isnan(x)] = 0x7FC0
        return rounded.astype("<u2").tobytes()
    raise ValueError(f"not a float dtype: {dtype}")


def cast(raw: Any, src: str, dst: str) -> bytes:
    return encode(decode(raw, src), dst)
