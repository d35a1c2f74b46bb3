"""Registry facts as plain rows, for `eaglectl formats` and the generated docs."""

from __future__ import annotations

from typing import Any

from .. import formats


def dialect_rows() -> list[dict[str, Any]]:
    rows = []
    for d in formats.DIALECTS.values():
        rows.append({
            "id": d.name,
            "title": d.title,
            "producers": d.producers,
            "required": [s.describe() for s in d.required]
            + ([" or ".join(s.describe() for s in d.required_any)] if d.required_any else []),
            "supporting": [s.describe() for s in d.supporting],
            "excluded_by": [s.describe() for s in d.forbidden],
            "key_renames": [{"canonical": c, "dialect": o} for c, o in d.key_rules if c != o],
            "decoder_config": d.layer_config_path or "top level",
            "aux_ids_paths": list(d.aux_ids_paths),
            "aux_convention": d.aux_convention,
            "aux_path_conventions": {p: c for p, (c, _) in d.aux_path_conventions.items()},
            # what the writer writes: every aux-id field with its numbering (None: not written)
            "aux_ids_written": [{"path": p, "convention": c} for p, c in d.writer.aux_fields(d.aux_convention)]
            if d.writer is not None else None,
            "flag_fields": sorted(d.flag_fields),
            "flag_defaults": {k: {"value": v, "why": why} for k, (v, why) in d.flag_defaults.items()},
            "consumer": d.consumer,
            "notes": list(d.notes),
        })
    return rows
