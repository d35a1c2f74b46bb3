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

import ctypes
import functools
import hashlib
import json
import math
import os
import struct
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import TRUNCATED_HINT, CorruptCheckpointError, SourceChangedError, filesystem_error
from ..limits import limit
from .atomic import start_writeback
from .bounded import pread_all
from .dtypes import DTYPE_BITS, DTYPES
from .jsonio import loads


class ByteSource(Protocol):
    """Random access to one file's bytes (a local file or a remote Hub file)."""

    name: str
    size: int

    def read(self, offset: int, length: int) -> bytes: ...


class LocalFile:
    """A local file, with the identity it had when opened (to notice a file replaced or rewritten
    while eaglectl reads it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)
        try:
            st = path.stat()
        except OSError as e:
            raise filesystem_error(e, "read", path) from None
        self.size = st.st_size
        self.identity = file_identity(st)

    def read(self, offset: int, length: int) -> bytes:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise filesystem_error(e, "read", self.path) from None
        try:
            data = pread_all(fd, length, offset)
        finally:
            os.close(fd)
        if len(data) < length and offset + length <= self.size:  # there when the file was opened: it shrank
            raise SourceChangedError(f"{self.path}: ends before byte {offset + length}: the file changed (shrank) "
                                     "while it was read", path=self.name,
                                     hint="run again once the file is no longer being written")
        return data


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime in ns): changes when a file is replaced or rewritten."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


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


def _fail(file: str, reason: str, tensor: str | None = None, hint: str | None = None) -> CorruptCheckpointError:
    where = f"{file}: tensor '{tensor}': " if tensor else f"{file}: "
    return CorruptCheckpointError(where + reason, hint=hint, file=file, tensor=tensor)


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
    if n > limit("header_bytes"):
        raise _fail(file, f"header length {n} exceeds the {limit('header_bytes')}-byte cap")
    if 8 + n > file_size:
        raise _fail(file, f"header length {n} runs past the end of the {file_size}-byte file", hint=TRUNCATED_HINT)
    if len(head) < 8 + n:
        raise _fail(file, "header truncated", hint=TRUNCATED_HINT)
    raw = head[8 : 8 + n]
    if not raw.startswith(b"{"):
        raise _fail(file, "header does not start with '{'")
    obj = loads(raw, f"{file}: header", object_pairs_hook=_reject_duplicates, max_bytes=limit("header_bytes"))
    if not isinstance(obj, dict):
        raise _fail(file, "header is not a JSON object")
    if len(obj) > limit("tensors_per_file") + 1:
        raise _fail(file, f"{len(obj)} header entries exceed the limit of {limit('tensors_per_file')} tensors")

    metadata = obj.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise _fail(file, "__metadata__ must map strings to strings")

    buffer_size = file_size - 8 - n
    tensors: dict[str, TensorInfo] = {}
    for name, entry in obj.items():
        tensors[name] = _parse_entry(file, name, entry, buffer_size)

    expected = 0
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != expected:
            kind = "overlaps the previous tensor" if info.begin < expected else "leaves a hole before it"
            raise _fail(file, f"data_offsets [{info.begin}, {info.end}] {kind} (expected start {expected})", info.name)
        expected = info.end
    if expected != buffer_size:
        raise _fail(file, f"tensors cover {expected} bytes but the data buffer has {buffer_size}",
                    hint=TRUNCATED_HINT if expected > buffer_size else None)
    return Header(file, tensors, metadata, 8 + n)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _parse_entry(file: str, name: str, entry: Any, buffer_size: int) -> TensorInfo:
    if len(name) > limit("tensor_name_chars"):
        raise _fail(file, f"tensor name of {len(name)} characters exceeds the limit of {limit('tensor_name_chars')}",
                    name[:64] + "...")
    if not isinstance(entry, dict):
        raise _fail(file, "entry is not an object", name)
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise _fail(file, "missing dtype", name)
    if dtype not in DTYPE_BITS:
        raise _fail(file, f"unknown dtype {_short(dtype)}", name)
    if not (isinstance(shape, list) and len(shape) <= limit("tensor_rank") and all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= limit("tensor_dim") for d in shape)):
        raise _fail(file, f"invalid shape {_short(shape)} (at most {limit('tensor_rank')} dimensions of at most "
                    f"2**40 each)", name)
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
    ):
        raise _fail(file, f"invalid data_offsets {_short(offsets)}", name)
    begin, end = offsets
    if end < begin:
        raise _fail(file, f"data_offsets [{begin}, {end}] end before begin", name)
    if end > buffer_size:
        raise _fail(file, f"data_offsets end {_short(end)} runs past the {buffer_size}-byte data buffer", name,
                    hint=TRUNCATED_HINT)
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or end - begin != bits // 8:
        raise _fail(file, f"{end - begin} bytes for shape {shape} of {dtype} (expected {bits / 8:g})", name)
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def read_header(source: ByteSource) -> Header:
    """Read and validate the header of one safetensors file (reads only the header bytes)."""
    head = source.read(0, 8)
    if len(head) == 8:
        (n,) = struct.unpack("<Q", head)
        if n <= limit("header_bytes") and 8 + n <= source.size:
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

    info = header.tensors[name]
    if len(info.shape) != 2 or DTYPE_BITS[info.dtype] % 8:
        raise _fail(source.name, "row reads need a 2-D tensor of whole bytes", name)
    width = info.shape[1] * DTYPE_BITS[info.dtype] // 8
    out = []
    for r in rows:
        raw = source.read(header.data_start + info.begin + r * width, width)
        out.append(_decode(raw, info.dtype, (info.shape[1],), source.name, name))
    return np.stack(out) if out else np.zeros((0, info.shape[1]), dtype=np.float32)


def decodable(dtype: str) -> bool:
    """Whether `read_tensor` / `read_rows` can decode this dtype without torch."""
    return dtype == "BF16" or DTYPES[dtype].numpy is not None


def _decode(raw: bytes, dtype: str, shape: tuple[int, ...], file: str, name: str) -> Any:

    if dtype == "BF16":
        wide = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return wide.view(np.float32).reshape(shape)
    np_dtype = DTYPES[dtype].numpy
    if np_dtype is None:
        raise _fail(file, f"dtype {dtype} cannot be decoded without torch", name)
    return np.frombuffer(raw, dtype=np_dtype).reshape(shape)


# Bit masks of the non-finite encodings: all ones there means Inf or NaN. FP8 E4M3 (FN) has no Inf and one NaN
# per sign, 0x7F / 0xFF (exponent and mantissa all ones); E5M2 is IEEE-like (exponent all ones).
NONFINITE_MASK = {"F16": ("<u2", 0x7C00), "BF16": ("<u2", 0x7F80), "F32": ("<u4", 0x7F800000),
                  "F64": ("<u8", 0x7FF0000000000000), "F8_E4M3": ("u1", 0x7F), "F8_E5M2": ("u1", 0x7C)}


def nonfinite_in(raw: Any, dtype: str) -> int:
    """Number of NaN/Inf encodings in RAW (a whole number of DTYPE values); 0 for a dtype without any."""

    if dtype not in NONFINITE_MASK:
        return 0
    word, mask = NONFINITE_MASK[dtype]
    bits = np.frombuffer(raw, dtype=word)
    return int(np.count_nonzero((bits & mask) == mask))


def count_nonfinite(source: ByteSource, header: Header, name: str, chunk_bytes: int = 1 << 24) -> int:
    """Number of NaN/Inf values in a float tensor (FP8 included), streamed in chunks (never the whole file)."""
    info = header.tensors[name]
    if info.dtype not in NONFINITE_MASK:
        return 0
    width = DTYPE_BITS[info.dtype] // 8
    chunk_bytes -= chunk_bytes % width
    bad = 0
    for start in range(0, info.nbytes, chunk_bytes):
        bad += nonfinite_in(source.read(header.data_start + info.begin + start,
                                        min(chunk_bytes, info.nbytes - start)), info.dtype)
    return bad


# ---------------------------------------------------------------------------------------- write

@dataclass(frozen=True)
class ByteRange:
    """`length` bytes of a local file at `offset`: what a copied tensor is, before and after a write."""

    path: Path
    offset: int
    length: int


@dataclass(frozen=True)
class TensorEntry:
    """A tensor to write: its bytes are either copied by the kernel from `copy` (a local byte range) or
    produced by `chunks()` (an iterable of bytes-like objects)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: Any = None  # Callable[[], Iterable[bytes | memoryview]]
    copy: ByteRange | None = None

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


@dataclass
class Written:
    """Where each tensor landed in a written file, and a CRC-32 of the bytes produced for it, so a
    re-read can prove the file holds what was written (copies are compared with their source)."""

    path: Path
    data_start: int
    ranges: dict[str, ByteRange]
    crc32: dict[str, int]  # produced (not copied) tensors only


# a writer hands the kernel each this many bytes for writeback as soon as they are written (`start_writeback`)
WRITEBACK_STEP = 1 << 26


class _Writeback:
    """Starts the writeback of each WRITEBACK_STEP bytes written to `fd`, so the copy and the disk work at the
    same time (as `cat` then `sync` never do) and the caller's final fsync waits for the tail only. The requests
    are made from a helper thread: one blocks while the device is busy, and the copy goes on meanwhile."""

    def __init__(self, fd: int) -> None:
        self.fd, self.started = fd, 0
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="eaglectl-writeback")

    def written_to(self, pos: int) -> None:
        if pos - self.started >= WRITEBACK_STEP:
            self.pool.submit(start_writeback, self.fd, self.started, pos - self.started)
            self.started = pos

    def close(self) -> None:
        """Waits for the requests made (they use `fd`: close it after this)."""
        self.pool.shutdown(wait=True)


def write_safetensors(path: Path, entries: list[TensorEntry], metadata: dict[str, str] | None = None) -> Written:
    """Write a safetensors file: the header, then each tensor at its offset with unbuffered writes.

    Copied tensors go through `os.copy_file_range` (no user-space copy), produced ones are written
    from their buffers as they come; the kernel is asked to start writing each 64 MB to disk as soon as it is
    written. The file is not fsynced here: the caller flushes it.
    """
    header = serialize_header(entries, metadata)
    ranges: dict[str, ByteRange] = {}
    crcs: dict[str, int] = {}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    writeback = _Writeback(fd)
    try:
        _write_all(fd, header, 0)
        pos = len(header)
        for e in entries:
            ranges[e.name] = ByteRange(path, pos, e.nbytes)
            if e.copy is not None:
                if e.copy.length != e.nbytes:
                    raise CorruptCheckpointError(f"{path}: tensor '{e.name}': source range holds {e.copy.length} "
                                                 f"bytes, expected {e.nbytes}", tensor=e.name)
                copy_range(e.copy, fd, pos, writeback.written_to)
                pos += e.nbytes
                continue
            crc, start = 0, pos
            for chunk in e.chunks():
                view = memoryview(chunk).cast("B")
                _write_all(fd, view, pos)
                crc = zlib.crc32(view, crc)
                pos += len(view)
                writeback.written_to(pos)
            if pos - start != e.nbytes:
                raise CorruptCheckpointError(f"{path}: tensor '{e.name}': got {pos - start} bytes, expected {e.nbytes}",
                                             tensor=e.name)
            crcs[e.name] = crc
    finally:
        writeback.close()
        os.close(fd)
    return Written(path, len(header), ranges, crcs)


def _write_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def copy_range(src: ByteRange, fd: int, offset: int, written_to: Callable[[int], None] | None = None) -> None:
    """Copy a local byte range into `fd` at `offset`, in the kernel when it can (copy_file_range),
    else through a 16 MB buffer; `written_to(end)` after each WRITEBACK_STEP at most."""
    sfd = os.open(src.path, os.O_RDONLY)
    try:
        done = 0
        use_kernel = hasattr(os, "copy_file_range")
        while done < src.length:
            want = min(WRITEBACK_STEP, src.length - done)
            n = 0
            if use_kernel:
                try:
                    n = os.copy_file_range(sfd, fd, want, src.offset + done, offset + done)
                except OSError:  # EXDEV / ENOSYS / EINVAL on some filesystems: copy in user space
                    use_kernel = False
            if not use_kernel:
                buf = os.pread(sfd, min(want, 1 << 24), src.offset + done)
                _write_all(fd, buf, offset + done)
                n = len(buf)
            if n == 0:  # its size was checked against the header when it was opened: it shrank since
                raise SourceChangedError(f"{src.path}: ends before byte {src.offset + src.length}: the source changed "
                                         "(shrank) while it was copied; nothing was written", path=str(src.path),
                                         hint="run again once the source is no longer being written")
            done += n
            if written_to is not None:
                written_to(offset + done)
    finally:
        os.close(sfd)


def same_bytes(a: ByteRange, b: ByteRange, window: int = 1 << 25) -> bool:
    """Whether two local byte ranges hold the same bytes: 32 MB windows read into two reused buffers and compared
    by libc's memcmp (vectorised, the GIL released while it reads and compares). Read with pread, never mapped: a
    file that shrinks under a mapping kills the process with SIGBUS; a short read here is SourceChangedError."""

    if a.length != b.length:
        return False
    memcmp = _memcmp()
    bx, by = bytearray(min(window, a.length)), bytearray(min(window, a.length))
    with a.path.open("rb") as fa, b.path.open("rb") as fb:
        for start in range(0, a.length, window):
            n = min(window, a.length - start)
            x, y = read_exact(fa.fileno(), bx, n, a.offset + start, a.path), read_exact(
                fb.fileno(), by, n, b.offset + start, b.path)
            equal = memcmp(_address(bx), _address(by), n) == 0 if memcmp else x == y
            x.release()
            y.release()
            if not equal:
                return False
    return True


def read_exact(fd: int, buf: bytearray, n: int, offset: int, path: Path) -> memoryview:
    """`n` bytes of `fd` at `offset` into `buf` (a view of them returned); a file that ends first changed while it
    was read (its size was checked against every range when it was opened)."""
    view, done = memoryview(buf)[:n], 0
    while done < n:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            view.release()
            raise SourceChangedError(f"{path}: ends before byte {offset + n}: the file changed (shrank) while it was "
                                     "read; nothing was written", path=str(path),
                                     hint="run again once the file is no longer being written")
        done += got
    return view


def _address(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


@functools.cache
def _memcmp() -> Any:
    """libc's memcmp through ctypes, None where there is no C library to load."""

    try:
        fn = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return fn


def crc32_range(r: ByteRange, chunk: int = 1 << 23) -> int:
    """CRC-32 of a local byte range, read in chunks into one reused buffer (bounded memory)."""
    buf = memoryview(bytearray(chunk))
    crc, done = 0, 0
    fd = os.open(r.path, os.O_RDONLY)
    try:
        while done < r.length:
            n = os.preadv(fd, [buf[:min(chunk, r.length - done)]], r.offset + done)
            if n == 0:
                raise CorruptCheckpointError(f"{r.path}: ends before byte {r.offset + r.length}", file=str(r.path))
            crc = zlib.crc32(buf[:n], crc)
            done += n
    finally:
        os.close(fd)
    return crc


def sha256_range(r: ByteRange, window: int = 1 << 25) -> str:
    """sha256 of a local byte range, hashed from 32 MB windows read into one reused buffer (hashlib and the read
    release the GIL, so this runs on another core while the main thread copies; memory stays flat). Never mapped:
    a source that shrinks while it is hashed is SourceChangedError, not SIGBUS."""
    h = hashlib.sha256()
    buf = bytearray(min(window, r.length))
    with r.path.open("rb") as f:
        for start in range(0, r.length, window):
            view = read_exact(f.fileno(), buf, min(window, r.length - start), r.offset + start, r.path)
            h.update(view)
            view.release()
    return h.hexdigest()


def entry_from_bytes(name: str, dtype: str, shape: tuple[int, ...], data: bytes) -> TensorEntry:
    return TensorEntry(name, dtype, tuple(shape), lambda: (data,))
