"""GGUF EAGLE-3 drafts (llama.cpp): header-only reading into a Checkpoint, and the writer `convert --to gguf` uses.

The `gguf` package (optional extra `gguf`) is imported lazily, only when a `.gguf` file is opened or written.
Reading parses the metadata and tensor infos; tensor bytes are touched only when a tensor is read (`--scan`, the
small d2t table). What llama.cpp stores differently from the HF layout is undone on read, so the checkpoint looks
like any other dialect's: q/k rows are un-permuted (llama.cpp's converter permutes them for its RoPE), `d2t` is
made relative again (it is stored as absolute target ids) and the `eagle3.*` keys become a synthesised config.
Names stay as llama.cpp spells them; formats/gguf.py's key rules map them to canonical names.
The checkpoint reads the GGUF through `HFLayout`, a byte source that lays those HF-layout tensors end to end.
Source of truth: llama.cpp commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f (docs/gguf.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptCheckpointError, MissingDependencyError, UnknownFormatError
from .checkpoint import Checkpoint, WeightFile
from .safetensors import Header, TensorInfo, file_identity

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
_GGML_DTYPES = ("F32", "F16", "BF16", "I8", "I16", "I32", "I64", "F64")


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise MissingDependencyError("reading or writing GGUF needs the 'gguf' package", package="gguf",
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
    reader: Any  # gguf.GGUFReader (memory-mapped; data pages are read only when touched)
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]  # torch-order shapes, eaglectl dtype names

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"gguf_architecture": self.metadata.get("general.architecture"),
                               "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama"}
        for key, name in CONFIG_KEYS.items():
            if key in self.metadata:
                cfg[name] = self.metadata[key]
        if "d2t" in self.tensors:
            cfg["draft_vocab_size"] = self.tensors["d2t"].shape[0]
        if "output.weight" in self.tensors:  # the draft's own head: not tied to token_embd
            cfg["tie_word_embeddings"] = False
        return cfg

    def stored(self, name: str) -> np.ndarray:
        """The tensor's stored values, shaped as torch shapes it (BF16 as uint16 bit patterns)."""
        t = next(t for t in self.reader.tensors if t.name == name)
        data = np.asarray(t.data)
        if t.tensor_type.name == "BF16":
            data = data.view(np.uint16)
        return data.reshape(self.tensors[name].shape)

    def raw(self, name: str) -> np.ndarray:
        """The tensor as the HF layout holds it: q/k un-permuted, d2t relative (bit patterns kept)."""
        data = self.stored(name)
        if name in PERMUTED:
            heads = self.config().get(PERMUTED[name])
            if not isinstance(heads, int) or heads < 1 or data.shape[0] % (2 * heads):
                raise CorruptCheckpointError(f"{self.path}: tensor '{name}': cannot un-permute {data.shape[0]} rows "
                                             f"over {heads} heads", file=str(self.path), tensor=name)
            # `permute`'s inverse: each head's rows from (d/2, 2) back to (2, d/2) order
            rows, rest = data.shape[0], data.shape[1:]
            data = data.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(data.shape)
        if name == "d2t":
            data = data - np.arange(data.shape[0], dtype=np.int64)
        return np.ascontiguousarray(data)


def read_gguf(path: Path) -> GGUFFile:
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # noqa: BLE001 - a malformed file can make the parser raise anything
        raise CorruptCheckpointError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})"[:300],
                                     file=str(path)) from None
    metadata: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            value = f.contents()
        except Exception:  # noqa: BLE001, S112 - an undecodable value is reported as absent
            continue
        if f.types == [gguf.GGUFValueType.FLOAT32]:  # the shortest decimal that is this float32 (1e-05, not 9.99e-06)
            value = float(str(np.float32(value)))
        metadata[key] = value
    if metadata.get("general.architecture") != ARCH:
        raise UnknownFormatError(f"{path}: GGUF architecture {metadata.get('general.architecture')!r}, not an "
                                 f"EAGLE-3 draft ('{ARCH}')", path=str(path),
                                 hint="only llama.cpp EAGLE-3 drafts (general.architecture = eagle3) are read")
    tensors: dict[str, TensorInfo] = {}
    for t in reader.tensors:
        dtype = t.tensor_type.name
        if dtype not in _GGML_DTYPES:
            raise UnknownFormatError(f"{path}: tensor '{t.name}' is {dtype}-quantised; only unquantised GGUF drafts "
                                     "are read", path=str(path), tensor=t.name)
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        begin = int(t.data_offset)
        tensors[t.name] = TensorInfo(t.name, dtype, shape, begin, begin + int(t.n_bytes))
    return GGUFFile(path, reader, metadata, tensors)


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
