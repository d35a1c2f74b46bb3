"""Header parsing and validation match the safetensors reference; writes read back exactly."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from eaglectl.errors import CorruptCheckpointError
from eaglectl.io.safetensors import (
    LocalFile,
    count_nonfinite,
    entry_from_bytes,
    parse_header,
    read_header,
    read_rows,
    read_tensor,
    serialize_header,
    write_safetensors,
)

from .conftest import CORRUPT
from .strategies import metadata, tensor_specs


def _file(specs, meta) -> bytes:
    entries = [entry_from_bytes(n, d, s, b) for n, d, s, b in specs]
    return serialize_header(entries, meta) + b"".join(b for *_, b in specs)


@given(tensor_specs(), metadata)
def test_serialize_then_parse_round_trips(specs, meta):
    raw = _file(specs, meta)
    h = parse_header(raw, len(raw), "x")
    assert [(t.name, t.dtype, t.shape) for t in h.tensors.values()] == [(n, d, tuple(s)) for n, d, s, _ in specs]
    assert (h.metadata or None) == (dict(meta) if meta else None)
    for n, _, _, data in specs:
        t = h.tensors[n]
        assert raw[h.data_start + t.begin: h.data_start + t.end] == data


@given(tensor_specs(), st.data())
def test_any_single_byte_mutation_is_rejected_cleanly_or_still_valid(specs, data):
    """Fuzz: a mutated header either parses (and then obeys the invariants) or raises our error."""
    raw = bytearray(_file(specs, None))
    (n,) = struct.unpack("<Q", raw[:8])
    pos = data.draw(st.integers(0, 8 + n - 1))
    raw[pos] = data.draw(st.integers(0, 255))
    try:
        h = parse_header(bytes(raw), len(raw), "x")
    except CorruptCheckpointError as e:
        assert e.message.startswith("x: ")
        return
    covered = sorted((t.begin, t.end) for t in h.tensors.values())
    assert sum(e - b for b, e in covered) == len(raw) - h.data_start


@given(st.binary(max_size=200))
def test_random_bytes_never_crash(raw):
    try:
        parse_header(raw, len(raw), "x")
    except CorruptCheckpointError:
        pass


def test_reference_library_files_parse_and_read(tmp_path):
    tensors = {"w": torch.randn(3, 5).to(torch.bfloat16), "i": torch.arange(7), "m": torch.tensor([True, False]),
               "h": torch.randn(4).half(), "e": torch.zeros(0, 3)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    src = LocalFile(path)
    h = read_header(src)
    assert h.metadata == {"format": "pt"}
    for name, t in tensors.items():
        got = read_tensor(src, h, name)
        np.testing.assert_array_equal(got, t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy())
    np.testing.assert_array_equal(read_rows(src, h, "w", [2, 0]), tensors["w"].float().numpy()[[2, 0]])


def test_writer_output_loads_in_the_reference_library(tmp_path):
    w = torch.randn(4, 6).to(torch.bfloat16)
    d2t = torch.arange(5)
    path = tmp_path / "out.safetensors"
    write_safetensors(path, [entry_from_bytes("w", "BF16", (4, 6), w.view(torch.uint8).numpy().tobytes()),
                             entry_from_bytes("d2t", "I64", (5,), d2t.numpy().tobytes())], {"format": "pt"})
    with safe_open(path, "pt") as f:
        assert torch.equal(f.get_tensor("w"), w)
        assert torch.equal(f.get_tensor("d2t"), d2t)
        assert f.metadata() == {"format": "pt"}


def test_writer_refuses_wrong_byte_count(tmp_path):
    with pytest.raises(CorruptCheckpointError, match="'w'"):
        write_safetensors(tmp_path / "x.safetensors", [entry_from_bytes("w", "F32", (2,), b"\0" * 4)])


def test_the_writer_hands_every_step_to_the_disk_as_it_writes(tmp_path, monkeypatch):
    import eaglectl.io.safetensors as sio

    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(sio, "WRITEBACK_STEP", 64)
    monkeypatch.setattr(sio, "start_writeback", lambda fd, offset, length: asked.append((offset, length)))
    src = tmp_path / "src.safetensors"
    write_safetensors(src, [entry_from_bytes("a", "U8", (1000,), bytes(range(250)) * 4)])
    source = sio.ByteRange(src, read_header(LocalFile(src)).data_start, 1000)
    out = tmp_path / "out.safetensors"
    asked.clear()
    written = write_safetensors(out, [sio.TensorEntry("a", "U8", (1000,), copy=source),
                                      entry_from_bytes("b", "U8", (300,), b"x" * 300)])
    # contiguous from the file's start, each at least a step, and fewer than a step left to the final fsync
    assert asked and asked[0][0] == 0 and all(n >= 64 for _, n in asked)
    assert all(a + n == b for (a, n), (b, _) in zip(asked, asked[1:], strict=False))
    assert out.stat().st_size - (asked[-1][0] + asked[-1][1]) < 64
    assert sio.same_bytes(source, written.ranges["a"])


def test_nonfinite_count_streams_in_chunks(tmp_path):
    t = torch.ones(1000).to(torch.bfloat16)
    t[[3, 999]] = float("nan")
    t[500] = float("inf")
    path = tmp_path / "n.safetensors"
    save_file({"t": t, "ok": torch.ones(3)}, path)
    src = LocalFile(path)
    h = read_header(src)
    assert count_nonfinite(src, h, "t", chunk_bytes=64) == 3
    assert count_nonfinite(src, h, "ok") == 0


def test_exotic_dtype_sizes_are_known(tmp_path):
    path = tmp_path / "f8.safetensors"
    save_file({"q": torch.zeros(4, 4).to(torch.float8_e4m3fn)}, path)
    assert read_header(LocalFile(path)).tensors["q"].dtype == "F8_E4M3"


CORRUPT_REASONS = {
    "truncated.safetensors": "data buffer",
    "overlapping-offsets.safetensors": "overlaps",
    "hole.safetensors": "hole",
    "size-mismatch.safetensors": "expected 12",
    "header-length-lie.safetensors": "runs past the end",
    "header-not-json.safetensors": "not valid JSON",
    "header-not-object.safetensors": "does not start with '{'",
    "oversize-header.safetensors": "cap",
    "unknown-dtype.safetensors": "unknown dtype 'F7'",
    "metadata-not-strings.safetensors": "__metadata__",
    "duplicate-key.safetensors": "duplicate key 'a'",
    "tiny.safetensors": "8-byte header length",
}


@pytest.mark.parametrize("name", sorted(CORRUPT_REASONS))
def test_corrupt_fixture_is_rejected_with_its_reason(name):
    with pytest.raises(CorruptCheckpointError) as e:
        read_header(LocalFile(CORRUPT / name))
    assert CORRUPT_REASONS[name] in e.value.message
    assert str(CORRUPT / name) in e.value.message


def test_header_only_read_touches_only_the_header(tmp_path):
    path = tmp_path / "big.safetensors"
    header = {"w": {"dtype": "F32", "shape": [1 << 20], "data_offsets": [0, 4 << 20]}}
    raw = json.dumps(header).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + (4 << 20))
    reads = []

    class Counting(LocalFile):
        def read(self, offset, length):
            reads.append(length)
            return super().read(offset, length)

    read_header(Counting(path))
    assert sum(reads) == 8 + len(raw)
