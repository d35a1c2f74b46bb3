"""safetensors without torch: header parsing and validation, lazy tensor reads, a streaming writer.

Validation reproduces the reference implementation (`huggingface/safetensors`
`safetensors/src/tensor.rs`, `Metadata::validate`): 8-byte little-endian header length, header
within the file and under a size cap, a JSON object starting with `{`, `__metadata__` a
string→string map, every tensor's `data_offsets` contiguous from 0 and in order, each size equal
to numel × dtype bits / 8 (overflow-safe in Python), and the data buffer fully covered (no holes,
no overlaps, nothing trailing). Dtypes are opaque strings with a known bit width; an unknown one is
a named error, a known-but-exotic one (F8/F6/F4) is accepted and reported by `inspect`.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from .errors import CorruptCheckpointError

# Rust's cap; huggingface_hub's remote reader stops at 25 MB.
MAX_HEADER_BYTES = 100_000_000

DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
    "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
}
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
# dtypes torch and the reference drafter handle directly; the rest are reported by inspect.
COMMON_DTYPES = frozenset({"BOOL", "U8", "I8", "I16", "I32", "I64", "F16", "BF16", "F32", "F64"})


class ByteSource(Protocol):
    """Random access to one file's bytes (a local file or a remote Hub file)."""

    name: str
    size: int

    def read(self, offset: int, length: int) -> bytes: ...


class LocalFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)
        self.size = path.stat().st_size

    def read(self, offset: int, length: int) -> bytes:
        with self.path.open("rb") as f:
            f.seek(offset)
            return f.read(length)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offset of the first byte, relative to the data buffer
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    file: str
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] | None
    data_start: int  # absolute offset of the data buffer (8 + header length)
    file_size: int = field(default=0)


def _fail(file: str, reason: str, tensor: str | None = None) -> CorruptCheckpointError:
    where = f"{file}: tensor '{tensor}': " if tensor else f"{file}: "
    return CorruptCheckpointError(where + reason, file=file, tensor=tensor)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key '{key}'")
        out[key] = value
    return out


def parse_header(head: bytes, file_size: int, file: str) -> Header:
    """Validate a safetensors header.

    `head` starts at byte 0 of the file and holds at least the whole header (it may be longer);
    `file_size` is the size of the whole file. Raises CorruptCheckpointError naming the file and,
    where there is one, the tensor.
    """
    if file_size < 8 or len(head) < 8:
        raise _fail(file, f"file is {file_size} bytes; a safetensors file needs an 8-byte header length")
    (n,) = struct.unpack("<Q", head[:8])
    if n > MAX_HEADER_BYTES:
        raise _fail(file, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte cap")
    if 8 + n > file_size:
        raise _fail(file, f"header length {n} runs past the end of the {file_size}-byte file")
    if len(head) < 8 + n:
        raise _fail(file, "header truncated")
    raw = head[8 : 8 + n]
    if not raw.startswith(b"{"):
        raise _fail(file, "header does not start with '{'")
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise _fail(file, f"header is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise _fail(file, "header is not a JSON object")

    metadata = obj.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise _fail(file, "__metadata__ must map strings to strings")

    tensors: dict[str, TensorInfo] = {}
    for name, entry in obj.items():
        tensors[name] = _parse_entry(file, name, entry)

    buffer_size = file_size - 8 - n
    expected = 0
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != expected:
            kind = "overlaps the previous tensor" if info.begin < expected else "leaves a hole before it"
            raise _fail(file, f"data_offsets [{info.begin}, {info.end}] {kind} (expected start {expected})", info.name)
        expected = info.end
    if expected != buffer_size:
        raise _fail(file, f"tensors cover {expected} bytes but the data buffer has {buffer_size}")
    return Header(file, tensors, metadata, 8 + n, file_size)


def _parse_entry(file: str, name: str, entry: Any) -> TensorInfo:
    if not isinstance(entry, dict):
        raise _fail(file, "entry is not an object", name)
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise _fail(file, "missing dtype", name)
    if dtype not in DTYPE_BITS:
        raise _fail(file, f"unknown dtype '{dtype}'", name)
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise _fail(file, f"invalid shape {shape!r}", name)
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
    ):
        raise _fail(file, f"invalid data_offsets {offsets!r}", name)
    begin, end = offsets
    if end < begin:
        raise _fail(file, f"data_offsets [{begin}, {end}] end before begin", name)
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or end - begin != bits // 8:
        raise _fail(file, f"{end - begin} bytes for shape {shape} of {dtype} (expected {bits / 8:g})", name)
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def read_header(source: ByteSource) -> Header:
    """Read and validate the header of one safetensors file (reads only the header bytes)."""
    head = source.read(0, 8)
    if len(head) == 8:
        (n,) = struct.unpack("<Q", head)
        if n <= MAX_HEADER_BYTES and 8 + n <= source.size:
            head += source.read(8, n)
    return parse_header(head, source.size, source.name)


# ---------------------------------------------------------------------------------------- reads

def read_tensor(source: ByteSource, header: Header, name: str) -> Any:
    """One tensor as a numpy array (BF16 widened to float32); reads only its bytes."""
    info = header.tensors[name]
    raw = source.read(header.data_start + info.begin, info.nbytes)
    if len(raw) != info.nbytes:
        raise _fail(source.name, "data truncated", name)
    return _decode(raw, info.dtype, info.shape, source.name, name)


def read_rows(source: ByteSource, header: Header, name: str, rows: list[int]) -> Any:
    """Selected rows of a 2-D tensor (reads only those rows), as float32 / native numpy."""
    import numpy as np

    info = header.tensors[name]
    if len(info.shape) != 2 or DTYPE_BITS[info.dtype] % 8:
        raise _fail(source.name, "row reads need a 2-D tensor of whole bytes", name)
    width = info.shape[1] * DTYPE_BITS[info.dtype] // 8
    out = []
    for r in rows:
        raw = source.read(header.data_start + info.begin + r * width, width)
        out.append(_decode(raw, info.dtype, (info.shape[1],), source.name, name))
    return np.stack(out) if out else np.zeros((0, info.shape[1]), dtype=np.float32)


def _decode(raw: bytes, dtype: str, shape: tuple[int, ...], file: str, name: str) -> Any:
    import numpy as np

    if dtype == "BF16":
        wide = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return wide.view(np.float32).reshape(shape)
    np_dtype = _NUMPY_DTYPES.get(dtype)
    if np_dtype is None:
        raise _fail(file, f"dtype {dtype} cannot be decoded without torch", name)
    return np.frombuffer(raw, dtype=np_dtype).reshape(shape)


_NUMPY_DTYPES = {
    "BOOL": "?", "U8": "u1", "I8": "i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
    "I32": "<i4", "U32": "<u4", "F32": "<f4", "I64": "<i8", "U64": "<u8", "F64": "<f8",
}

# Bit masks of the exponent field: all ones means Inf or NaN.
_NONFINITE_MASK = {"F16": ("<u2", 0x7C00), "BF16": ("<u2", 0x7F80), "F32": ("<u4", 0x7F800000),
                   "F64": ("<u8", 0x7FF0000000000000)}


def count_nonfinite(source: ByteSource, header: Header, name: str, chunk_bytes: int = 1 << 24) -> int:
    """Number of NaN/Inf values in a float tensor, streamed in chunks (never the whole file)."""
    import numpy as np

    info = header.tensors[name]
    if info.dtype not in _NONFINITE_MASK:
        return 0
    word, mask = _NONFINITE_MASK[info.dtype]
    width = np.dtype(word).itemsize
    chunk_bytes -= chunk_bytes % width
    bad = 0
    for start in range(0, info.nbytes, chunk_bytes):
        raw = source.read(header.data_start + info.begin + start, min(chunk_bytes, info.nbytes - start))
        bits = np.frombuffer(raw, dtype=word)
        bad += int(np.count_nonzero((bits & mask) == mask))
    return bad


# ---------------------------------------------------------------------------------------- write

@dataclass(frozen=True)
class TensorEntry:
    """A tensor to write: its bytes come from `chunks()` (an iterable of bytes-like objects)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: Any  # Callable[[], Iterable[bytes | memoryview]]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BITS[self.dtype] // 8


def serialize_header(entries: Iterable[TensorEntry], metadata: dict[str, str] | None) -> bytes:
    """Header bytes (length prefix included), padded with spaces to an 8-byte boundary."""
    obj: dict[str, Any] = {}
    if metadata:
        obj["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for e in entries:
        if e.dtype not in DTYPE_BITS:
            raise CorruptCheckpointError(f"tensor '{e.name}': unknown dtype '{e.dtype}'", tensor=e.name)
        obj[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(obj, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_safetensors(path: Path, entries: list[TensorEntry], metadata: dict[str, str] | None = None) -> None:
    """Stream tensors into a new safetensors file; each entry's bytes must match its shape."""
    with path.open("wb") as f:
        f.write(serialize_header(entries, metadata))
        for e in entries:
            written = _copy_chunks(f, e.chunks())
            if written != e.nbytes:
                raise CorruptCheckpointError(
                    f"{path}: tensor '{e.name}': got {written} bytes, expected {e.nbytes}", tensor=e.name
                )
        f.flush()
        os.fsync(f.fileno())


def _copy_chunks(f: BinaryIO, chunks: Iterable[Any]) -> int:
    n = 0
    for chunk in chunks:
        n += f.write(chunk)
    return n


def entry_from_bytes(name: str, dtype: str, shape: tuple[int, ...], data: bytes) -> TensorEntry:
    return TensorEntry(name, dtype, tuple(shape), lambda: (data,))


def iter_byte_range(source: ByteSource, offset: int, length: int, chunk: int = 1 << 24) -> Iterator[bytes]:
    for start in range(0, length, chunk):
        yield source.read(offset + start, min(chunk, length - start))
