"""Bounds eaglectl enforces on untrusted input, declared once as data.

Every file eaglectl reads may be hostile: a header of nested arrays, a config asking for 10⁸
layers, a 100,000-element aux list. A value beyond a bound is an input problem with a one-line
message naming where it is (a corrupt header, or a `config-field-invalid` finding) — never a
crash, a memory blow-up or a minute of work. `docs/errors.md` renders this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    value: int
    applies_to: str


LIMITS: dict[str, Limit] = {
    "header_bytes": Limit(100_000_000, "safetensors JSON header (the safetensors reference's own cap)"),
    "json_bytes": Limit(64 * 2**20, "config.json, shard index, manifest, capture.json"),
    "json_depth": Limit(64, "nesting of any JSON document (headers, configs, indexes, manifests)"),
    "tensors_per_file": Limit(200_000, "tensors in one safetensors header"),
    "tensor_name_chars": Limit(1024, "characters in a tensor name"),
    "tensor_rank": Limit(8, "dimensions of one tensor"),
    "tensor_dim": Limit(2**40, "one dimension of a tensor shape"),
    "drafter_layers": Limit(256, "num_hidden_layers of a drafter"),
    "target_layers": Limit(4096, "num_hidden_layers of a target"),
    "aux_ids": Limit(64, "entries in an aux-layer-id list"),
    "config_int": Limit(2**40, "any other integer config field (sizes, vocab, positions)"),
    "config_string_chars": Limit(4096, "characters in a config string field"),
    "folder_entries": Limit(10_000, "files directly inside a checkpoint folder"),
    "weight_files": Limit(10_000, "weight files listed by one shard index"),
}


def limit(name: str) -> int:
    return LIMITS[name].value
