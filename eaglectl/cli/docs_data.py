"""Registry facts as plain rows, for `eaglectl formats` and the generated docs."""

from __future__ import annotations

from typing import Any

from .. import formats
from ..formats.families import FAMILIES, LAYOUTS


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
            # the defaults that replace those when every signal holds (a speculators config's type has its own reader)
            "flag_defaults_when": [{"when": [s.describe() for s in signals],
                                    "flag_defaults": {k: {"value": v, "why": why} for k, (v, why) in defaults.items()}}
                                   for signals, defaults in d.flag_defaults_when],
            "consumer": d.consumer,
            "notes": list(d.notes),
        })
    return rows


def family_rows() -> list[dict[str, Any]]:
    """The drafter families beside EAGLE-3 (formats/families.py): how each is detected, and whether eaglectl reads
    it (its method, fields and runners) or refuses it by name."""

    rows = []
    for f in FAMILIES:
        r = f.reading
        rows.append({
            "id": f.id, "name": f.name, "served_by": f.served_by, "why": f.why, "threshold": f.threshold,
            "signals": [{"signal": s.describe(), "weight": s.weight} for s in f.signals],
            "read": None if r is None else {
                "method": r.method,
                "by": "the EAGLE-3 dialects and inspect" if r.eagle3_layout else "inspect, header-only",
                "fields": {name: list(keys) for name, keys in r.fields}, "numbering": r.numbering,
                "runners": {k: "serves" if why is None else why for k, why in r.runners.items()},
                "d2t_when": r.d2t_when, "mask_hidden": r.mask_hidden, "serve_extra": dict(r.serve_extra)},
            # the producers' layouts `convert` moves it between (the last: the family's own, no signal)
            "layouts": [{"id": lay.id, "title": lay.title, "producers": lay.producers,
                         "signals": [s.describe() for s in lay.signals],
                         "key_rules": {canonical: ours for canonical, ours in lay.key_rules},
                         "config_style": lay.config_style, "vllm_loads": lay.vllm_loads,
                         "written": lay.writable, "why_not_written": lay.why or None}
                        for lay in LAYOUTS if lay.family == f.id],
        })
    return rows
