"""GGUF EAGLE-3 drafts (llama.cpp): header-only reading into a Checkpoint, and the writer `convert --to gguf` uses.

Reading is eaglectl's own parser, as strict as llama.cpp's (ggml/src/gguf.cpp `gguf_init_from_file_impl` and
src/llama-model-loader.cpp): whatever that loader refuses (a bad header, a KV of an unknown type, a tensor offset that
is not where the previous tensor's padded bytes end, bytes beyond the end of the file, ...) is refused here too
(exit 4, naming the file, the tensor and the offset), with eaglectl's bounds (limits.py) on counts and lengths. The
file is memory-mapped; tensor bytes are touched only when a tensor is read (`--scan`, the small d2t table). The
`gguf` package (optional extra `gguf`) is imported lazily, only to write. What llama.cpp stores differently from the
HF layout is undone on read, so the checkpoint looks like any other dialect's: q/k rows are un-permuted (llama.cpp's
converter permutes them for its RoPE), `d2t` is made relative again (it is stored as absolute target ids) and the
`eagle3.*` keys become a synthesised config.
Names stay as llama.cpp spells them; formats/gguf.py's key rules map them to canonical names.
The checkpoint reads the GGUF through `HFLayout`, a byte source that lays those HF-layout tensors end to end.
Source of truth: llama.cpp commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f (docs/gguf.md).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptCheckpointError, MissingDependencyError, UnknownFormatError, filesystem_error
from ..limits import limit
from .checkpoint import Checkpoint, WeightFile
from .safetensors import Header, TensorInfo, file_identity, read_exact

ARCH = "eagle3"
# metadata key -> synthesised config key (llama.cpp gguf-py constants.py Keys.LLM / Keys.Attention / Keys.Rope)
CONFIG_KEYS = {
    f"{ARCH}.embedding_length": "hidden_size", f"{ARCH}.feed_forward_length": "intermediate_size",
    f"{ARCH}.attention.head_count": "num_attention_heads", f"{ARCH}.attention.head_count_kv": "num_key_value_heads",
    f"{ARCH}.attention.key_length": "head_dim", f"{ARCH}.block_count": "num_hidden_layers",
    f"{ARCH}.vocab_size": "vocab_size", f"{ARCH}.attention.layer_norm_rms_epsilon": "rms_norm_eps",
    f"{ARCH}.rope.freq_base": "rope_theta", f"{ARCH}.context_length": "max_position_embeddings",
    f"{ARCH}.target_layers": "eagle_aux_hidden_state_layer_ids", f"{ARCH}.target_hidden_size": "target_hidden_size",
    f"{ARCH}.norm_before_residual": "norm_before_residual", f"{ARCH}.norm_before_fc": "norm_before_fc",
}
PERMUTED = {"blk.0.attn_q.weight": "num_attention_heads", "blk.0.attn_k.weight": "num_key_value_heads"}
# the tensors eaglectl reshapes on reading (un-permute, d2t - arange) need their rank; llama.cpp's loader refuses any
# other shape for them (create_tensor's shape check), so another rank is a corrupt file, not a finding
RANKS = {"d2t": 1, "blk.0.attn_q.weight": 2, "blk.0.attn_k.weight": 2}

# ---- the GGUF format as llama.cpp 0c1e5709 reads it (ggml/include/gguf.h, ggml/include/ggml.h, ggml/src/gguf.cpp)
GGUF_VERSION = 3  # the newest version the loader reads; version 1 is refused
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT; general.alignment (a UINT32, a power of 2) overrides it
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME: a tensor name has fewer bytes than this
TYPE_COUNT = 43  # GGML_TYPE_COUNT: a ggml type id is in [0, 43)
# the loader maps the file and uses each tensor's bytes in place, asserting (abort) that they start on a 32-byte
# boundary (ggml-backend.cpp: TENSOR_ALIGNMENT): a general.alignment below 32 that leaves one off it is refused
TENSOR_ALIGNMENT = 32
# gguf_type: value type id -> numpy dtype (8 STRING and 9 ARRAY are read apart; 7 BOOL is one byte, != 0)
_VALUES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<i1", 10: "<u8", 11: "<i8",
           12: "<f8"}
_STRING, _ARRAY, _UINT32, _FLOAT32, _BOOL = 8, 9, 4, 6, 7
# ggml_type: the unquantised types eaglectl reads -> (name, bytes per element; block size 1)
_READ = {0: ("F32", 4), 1: ("F16", 2), 24: ("I8", 1), 25: ("I16", 2), 26: ("I32", 4), 27: ("I64", 8),
         28: ("F64", 8), 30: ("BF16", 2)}
# the quantised ones (refused as such, exit 5); an id in [0, TYPE_COUNT) in neither table is a removed type
# (Q4_2, Q4_0_4_4, ...): ggml's block size 0, which the loader refuses as corrupt
_QUANTISED = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K",
              13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
              20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0",
              39: "MXFP4", 40: "NVFP4", 41: "Q1_0"}
_NUMPY = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
          "F64": "<f8"}


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise MissingDependencyError("writing GGUF needs the 'gguf' package", package="gguf",
                                     hint="pip install 'eaglectl[gguf]' (or: pip install gguf)") from None
    return gguf


def gguf_entry(path: Path) -> Path | None:
    """The `.gguf` file SOURCE names: the file itself, or the only `.gguf` in a folder without other weights."""
    if path.is_file() and path.name.endswith(".gguf"):
        return path
    if not path.is_dir():
        return None
    try:
        names = [p for p in path.iterdir() if p.is_file()]
    except OSError:
        return None
    ggufs = [p for p in names if p.name.endswith(".gguf")]
    other = [p for p in names if p.name.endswith((".safetensors", ".bin", ".pt", ".pth", ".index.json"))]
    return ggufs[0] if len(ggufs) == 1 and not other else None


def permute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (conversion/llama.py): each head's rows from (2, d/2) to (d/2, 2) order."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


@dataclass
class GGUFFile:
    """One parsed GGUF header: metadata values, tensor infos, and lazy access to each tensor's stored bytes."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]  # torch-order shapes, eaglectl dtype names, absolute file offsets

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"gguf_architecture": self.metadata.get("general.architecture"),
                               "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama"}
        for key, name in CONFIG_KEYS.items():
            if key in self.metadata:
                cfg[name] = self.metadata[key]
        if "d2t" in self.tensors:  # 1-D (RANKS)
            cfg["draft_vocab_size"] = self.tensors["d2t"].shape[0]
        if "output.weight" in self.tensors:  # the draft's own head: not tied to token_embd
            cfg["tie_word_embeddings"] = False
        return cfg

    def stored(self, name: str) -> np.ndarray:
        """The tensor's stored values, shaped as torch shapes it (BF16 as uint16 bit patterns): read with pread, not
        through the mapping, which kills the process (SIGBUS) when the file shrinks while it is read."""
        t = self.tensors[name]
        buf = bytearray(t.nbytes)
        try:
            with open(self.path, "rb") as f:
                read_exact(f.fileno(), buf, t.nbytes, t.begin, self.path).release()
        except OSError as e:
            raise filesystem_error(e, "read", self.path) from None
        return np.frombuffer(buf, dtype=_NUMPY[t.dtype], count=t.numel).reshape(t.shape)

    def raw(self, name: str) -> np.ndarray:
        """The tensor as the HF layout holds it: q/k un-permuted, d2t relative (bit patterns kept)."""
        data = self.stored(name)
        if name in PERMUTED:
            heads = self.config().get(PERMUTED[name])
            if type(heads) is not int or heads < 1 or data.shape[0] % (2 * heads):  # a BOOL key is no count
                raise CorruptCheckpointError(f"{self.path}: tensor '{name}': cannot un-permute {data.shape[0]} rows "
                                             f"over {heads} heads", file=str(self.path), tensor=name)
            # `permute`'s inverse: each head's rows from (d/2, 2) back to (2, d/2) order
            rows, rest = data.shape[0], data.shape[1:]
            data = data.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(data.shape)
        if name == "d2t":
            data = data - np.arange(data.shape[0], dtype=np.int64)
        return np.ascontiguousarray(data)


class _Pread:
    """A file's bytes read with pread in 1 MiB chunks (the header's fields are read in order): a file that
    shrinks while it is read is a changed source (exit 16), where a memory map would kill the process (SIGBUS)."""

    CHUNK = 1 << 20

    def __init__(self, path: Path, fd: int, size: int) -> None:
        self.path, self.fd, self.size = path, fd, size
        self._at, self._chunk = -1, b""

    def __len__(self) -> int:
        return self.size

    def read(self, offset: int, n: int) -> bytes:
        out = bytearray()
        while n > 0:
            index = offset // self.CHUNK
            if index != self._at:
                want = min(self.CHUNK, self.size - index * self.CHUNK)
                buf = bytearray(want)
                read_exact(self.fd, buf, want, index * self.CHUNK, self.path).release()
                self._at, self._chunk = index, bytes(buf)
            piece = self._chunk[offset - index * self.CHUNK:][:n]
            out += piece
            offset, n = offset + len(piece), n - len(piece)
        return bytes(out)


class _Header:
    """A cursor over the file's bytes that reads GGUF's little-endian fields; reading past the end is a corrupt
    file (llama.cpp: "failed to read ...")."""

    def __init__(self, path: Path, data: Any) -> None:
        self.path, self.pos, self.size = path, 0, len(data)
        self.read: Any = data.read if isinstance(data, _Pread) else (lambda offset, n: bytes(data[offset:offset + n]))

    def fail(self, reason: str, tensor: str | None = None) -> CorruptCheckpointError:
        where = f"tensor '{tensor}'" if tensor is not None else "not a readable GGUF file"
        where = f"{self.path}: {where}: "
        return CorruptCheckpointError(f"{where}{reason}"[:400], file=str(self.path), tensor=tensor)

    def take(self, n: int, what: str) -> int:
        if n > self.size - self.pos:
            raise self.fail(f"{what} at byte {self.pos} runs past the end of the file ({self.size} bytes)")
        self.pos += n
        return self.pos - n

    def unpack(self, fmt: str, what: str) -> int:
        n = struct.calcsize(fmt)
        return struct.unpack(fmt, self.read(self.take(n, what), n))[0]

    def string(self, what: str, bound: int) -> bytes:
        n = self.unpack("<Q", what)
        if n > bound:
            raise self.fail(f"{what} at byte {self.pos - 8} is {n} bytes long, over the limit of {bound}")
        return self.read(self.take(n, what), n)

    def value(self, key: str, kind: int, count: int | None) -> Any:
        """One KV value (`count` items when an array): Python values, FLOAT32 as its shortest decimal."""
        if kind == _STRING:
            items = [self.string(f"a string of key '{key}'", limit("gguf_string_bytes"))
                     for _ in range(1 if count is None else count)]
            values: list[Any] = [b.decode("utf-8", "surrogateescape") for b in items]
        else:
            dtype = np.dtype(_VALUES[kind])
            n = 1 if count is None else count
            raw = np.frombuffer(self.read(self.take(n * dtype.itemsize, f"key '{key}'"), n * dtype.itemsize),
                                dtype=dtype, count=n)
            if kind == _BOOL:
                values = [bool(v) for v in raw]
            elif kind == _FLOAT32:  # the shortest decimal that is this float32 (1e-05, not 9.99e-06)
                values = [float(str(v)) for v in raw]
            else:
                values = raw.tolist()
        return values if count is not None else values[0]


def _name(h: _Header, raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise h.fail(f"{what} {raw[:64]!r} is not UTF-8") from None


def _parse(path: Path, data: Any) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """The metadata and the tensor infos (absolute offsets), checked as llama.cpp's gguf_init_from_file_impl and
    llama_model_loader check them, in their order, with eaglectl's bounds on counts and lengths."""
    h = _Header(path, data)
    if h.size < 4 or h.read(0, 4) != b"GGUF":
        raise h.fail("no GGUF magic")
    h.pos = 4
    version = h.unpack("<I", "the version")
    if version in (0, 1) or version & 0xFFFF == 0 or version > GGUF_VERSION:
        raise h.fail(f"GGUF version {version} is not read (llama.cpp reads versions 2 and 3, little-endian)")
    n_tensors, n_kv = h.unpack("<q", "the tensor count"), h.unpack("<q", "the KV count")
    for n, what, bound in ((n_tensors, "tensors", limit("tensors_per_file")), (n_kv, "KV pairs", limit("gguf_kv"))):
        if not 0 <= n <= bound:
            raise h.fail(f"header says {n} {what}; the limit is {bound}")
    metadata, alignment = _metadata(h, n_kv)
    if metadata.get("general.architecture") != ARCH:
        raise UnknownFormatError(f"{path}: GGUF architecture {metadata.get('general.architecture')!r}, not an "
                                 f"EAGLE-3 draft ('{ARCH}')", path=str(path),
                                 hint="only llama.cpp EAGLE-3 drafts (general.architecture = eagle3) are read")
    return metadata, _placed(h, _tensor_infos(h, path, n_tensors), alignment)


def _metadata(h: _Header, n_kv: int) -> tuple[dict[str, Any], int]:
    """The KV pairs and the alignment they set, checked as gguf.cpp reads them."""
    metadata: dict[str, Any] = {}
    seen: set[bytes] = set()
    alignment: Any = DEFAULT_ALIGNMENT
    for i in range(n_kv):
        raw_key = h.string(f"key {i}", limit("gguf_string_bytes"))
        if not raw_key or raw_key in seen:
            raise h.fail(f"key {i} is {'empty' if not raw_key else f'a duplicate of {raw_key[:64]!r}'}")
        seen.add(raw_key)
        key = raw_key.decode("utf-8", "surrogateescape")
        kind, count = h.unpack("<i", f"the type of key '{key}'"), None
        if kind == _ARRAY:
            kind, count = h.unpack("<i", f"the item type of key '{key}'"), h.unpack("<Q", f"the length of '{key}'")
            if count > limit("gguf_array_items"):
                raise h.fail(f"key '{key}' is an array of {count} items, over the limit of "
                             f"{limit('gguf_array_items')}")
        if kind != _STRING and kind not in _VALUES:
            raise h.fail(f"key '{key}' has invalid GGUF type {kind}")
        value = h.value(key, kind, count)
        if raw_key == b"general.alignment":
            if kind != _UINT32 or count is not None:
                raise h.fail("key 'general.alignment' must be a UINT32")
            alignment = value
        metadata[key] = value
    if alignment == 0 or alignment & (alignment - 1):
        raise h.fail(f"general.alignment {alignment} is not a power of 2")
    return metadata, alignment


_Info = tuple[str, str, tuple[int, ...], int, int]  # name, dtype, torch shape, offset, bytes


def _tensor_infos(h: _Header, path: Path, n_tensors: int) -> list[_Info]:
    """Each tensor's name, type, shape and relative offset, checked as gguf.cpp reads them."""
    infos: list[_Info] = []
    names: set[str] = set()
    for i in range(n_tensors):
        raw = h.string(f"tensor name {i}", MAX_NAME - 1)
        name = _name(h, raw, f"tensor name {i}")
        if name in names:
            raise h.fail("duplicate tensor name", name)
        names.add(name)
        n_dims = h.unpack("<I", f"the dimension count of tensor '{name}'")
        if n_dims > MAX_DIMS:
            raise h.fail(f"{n_dims} dimensions, more than GGML_MAX_DIMS ({MAX_DIMS})", name)
        ne = [h.unpack("<q", f"the shape of tensor '{name}'") for _ in range(n_dims)]
        if any(not 0 <= d <= limit("tensor_dim") for d in ne):
            raise h.fail(f"shape {ne} has a dimension outside [0, {limit('tensor_dim')}]", name)
        numel = int(np.prod(ne, dtype=object)) if ne else 1
        if numel >= 2**63 - 1:
            raise h.fail(f"shape {ne} has {numel} elements, more than an int64 counts", name)
        type_id = h.unpack("<i", f"the type of tensor '{name}'")
        if type_id in _QUANTISED:
            raise UnknownFormatError(f"{path}: tensor '{name}' is {_QUANTISED[type_id]}-quantised; only unquantised "
                                     "GGUF drafts are read", path=str(path), tensor=name)
        if type_id not in _READ:
            raise h.fail(f"invalid ggml type {type_id}" + ("" if 0 <= type_id < TYPE_COUNT else
                                                            f" (not in [0, {TYPE_COUNT}))"), name)
        dtype, size = _READ[type_id]
        offset = h.unpack("<Q", f"the offset of tensor '{name}'")
        infos.append((name, dtype, tuple(reversed(ne)), offset, numel * size))
    return infos


def _placed(h: _Header, infos: list[_Info], alignment: int) -> dict[str, TensorInfo]:
    """The tensor infos at absolute offsets, each where llama.cpp's loader expects its bytes."""
    # the data section starts at the first aligned byte after the tensor infos; each tensor's offset (relative to
    # it) must be exactly where the previous tensor's bytes, padded to the alignment, end: aligned, in order, no
    # overlap, no gap (gguf.cpp: "tensor '%s' has offset %lu, expected %zu")
    data_start, expected = -(-h.pos // alignment) * alignment, 0
    tensors: dict[str, TensorInfo] = {}
    for name, dtype, shape, offset, nbytes in infos:
        if offset != expected:
            raise h.fail(f"data offset {offset} is not where the previous tensor's padded data ends ({expected}; "
                         f"alignment {alignment})", name)
        begin = data_start + offset
        if begin % TENSOR_ALIGNMENT:
            raise h.fail(f"data at offset {offset} starts at byte {begin} of the file, not on the {TENSOR_ALIGNMENT}-"
                         f"byte boundary llama.cpp maps tensors on (general.alignment {alignment})", name)
        if begin + nbytes > h.size:  # llama_model_loader: "data is not within the file bounds"
            raise h.fail(f"data at offset {offset} (bytes {begin}..{begin + nbytes} of the file) is not within the "
                         f"file ({h.size} bytes)", name)
        if name in RANKS and len(shape) != RANKS[name]:
            raise h.fail(f"shape {list(shape)}: llama.cpp's eagle3 loader reads a {RANKS[name]}-D '{name}'", name)
        tensors[name] = TensorInfo(name, dtype, shape, begin, begin + nbytes)
        expected += -(-nbytes // alignment) * alignment
    return tensors


def read_gguf(path: Path) -> GGUFFile:
    try:
        with open(path, "rb") as f:
            data = _Pread(path, f.fileno(), os.fstat(f.fileno()).st_size)
            metadata, tensors = _parse(path, data)
    except OSError as e:
        raise filesystem_error(e, "read", path) from None
    return GGUFFile(path, metadata, tensors)


class HFLayout:
    """A ByteSource over the tensors as the HF layout holds them (un-permuted q/k, relative d2t), laid end to end
    at the offsets of the Checkpoint's TensorInfos: every reader of a checkpoint (read, read_rows, count_nonfinite,
    the digest, convert's streamed copies) reads a GGUF like a safetensors file. The offsets are not the file's."""

    def __init__(self, g: GGUFFile, tensors: dict[str, TensorInfo]) -> None:
        self.gguf, self.name, self.size = g, str(g.path), sum(t.nbytes for t in tensors.values())
        self._spans = sorted((t.begin, t.end, t.name) for t in tensors.values())
        self._cached: tuple[str, bytes] | None = None

    def _bytes(self, name: str) -> bytes:
        if self._cached is None or self._cached[0] != name:
            self._cached = (name, self.gguf.raw(name).tobytes())
        return self._cached[1]

    def read(self, offset: int, length: int) -> bytes:
        out = bytearray()
        for begin, end, name in self._spans:
            if end <= offset or begin >= offset + length:
                continue
            lo, hi = max(offset, begin), min(offset + length, end)
            out += self._bytes(name)[lo - begin:hi - begin]
        return bytes(out)


def open_gguf(source: str, path: Path) -> Checkpoint:
    """A Checkpoint over one `.gguf` file: llama.cpp's names, its metadata as config, no tensor bytes read."""
    g = read_gguf(path)
    tensors, offset = {}, 0
    for name, t in g.tensors.items():  # the HF layout's offsets: d2t widened to I64 as stored, nothing else resized
        tensors[name] = TensorInfo(name, t.dtype, t.shape, offset, offset + t.nbytes)
        offset += t.nbytes
    header = Header(str(path), tensors, None, 0)  # no safetensors metadata
    wf = WeightFile(path.name, HFLayout(g, tensors), header)
    ckpt = Checkpoint(source, str(path.parent), "gguf", [wf], dict.fromkeys(tensors, wf), g.config(),
                      f"{path} (GGUF metadata)")
    ckpt.file_names = (path.name,)
    ckpt.identities = {str(path): file_identity(path.stat())}
    return ckpt


def write_gguf(path: Path, metadata: dict[str, Any], tensors: Iterable[tuple[str, str, np.ndarray]]) -> None:
    """Write a GGUF file: `metadata` (key -> value, typed as llama.cpp's loader reads it) and (name, dtype, array)
    tensors already in llama.cpp's layout (BF16 as uint16 bit patterns). The caller stages and renames it."""
    gguf = _gguf()
    types = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(path, ARCH)
    for key, value in metadata.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif key.endswith("target_layers"):
            w.add_array(key, [int(v) for v in value])  # INT32 array, as get_arr reads it
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, str(value))
    for name, dtype, data in tensors:
        w.add_tensor(name, data, raw_dtype=getattr(types, dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
