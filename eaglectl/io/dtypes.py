"""The one table of tensor dtypes: safetensors name, bit width, numpy and torch spellings, config names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # safetensors spelling
    bits: int
    numpy: str | None  # little-endian numpy code; None: not decodable without torch (BF16 is widened by hand)
    torch: str | None  # torch.<name>; None: torch has no such dtype
    floating: bool = False
    common: bool = True  # the reference drafter and torch handle it directly


DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("BOOL", 8, "?", "bool"), DType("U8", 8, "u1", "uint8"), DType("I8", 8, "i1", "int8"),
    DType("I16", 16, "<i2", "int16"), DType("U16", 16, "<u2", "uint16", common=False),
    DType("F16", 16, "<f2", "float16", floating=True), DType("BF16", 16, None, "bfloat16", floating=True),
    DType("I32", 32, "<i4", "int32"), DType("U32", 32, "<u4", "uint32", common=False),
    DType("F32", 32, "<f4", "float32", floating=True), DType("I64", 64, "<i8", "int64"),
    DType("U64", 64, "<u8", "uint64", common=False), DType("F64", 64, "<f8", "float64", floating=True),
    DType("C64", 64, None, "complex64", common=False),
    DType("F8_E4M3", 8, None, "float8_e4m3fn", common=False), DType("F8_E5M2", 8, None, "float8_e5m2", common=False),
    DType("F8_E4M3FNUZ", 8, None, "float8_e4m3fnuz", common=False),
    DType("F8_E5M2FNUZ", 8, None, "float8_e5m2fnuz", common=False), DType("F8_E8M0", 8, None, None, common=False),
    DType("F6_E2M3", 6, None, None, common=False), DType("F6_E3M2", 6, None, None, common=False),
    DType("F4", 4, None, None, common=False),
)}
DTYPE_BITS = {n: d.bits for n, d in DTYPES.items()}
FLOAT_DTYPES = frozenset(n for n, d in DTYPES.items() if d.floating)
COMMON_DTYPES = frozenset(n for n, d in DTYPES.items() if d.common)
FROM_TORCH = {d.torch: n for n, d in DTYPES.items() if d.torch}

# config.json / CLI spellings (`torch_dtype`, `--dtype`) -> safetensors dtype
CONFIG_NAMES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64", "half": "F16", "float": "F32"}
TO_CONFIG = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
