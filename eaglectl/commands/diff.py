"""`eaglectl diff A B`: what two drafters mean, compared across dialects.

Both are interpreted (`open_drafter`): the dialect-free spec and canonical tensor names, so a drafter
and its conversion to another dialect compare equal. Spec fields are compared as meaning, not
spelling: aux ids in vLLM's boundary numbering, an absent rope_theta as the 10000 every engine
assumes. Tensors: only in A / only in B, dtype and shape, and values (max |a - b| in float64,
streamed in row blocks, never a whole large tensor at once).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..checkpoint.drafter import DrafterCheckpoint, open_drafter
from ..checkpoint.target import open_target
from ..progress import Progress, passthrough
from ..result import Result
from .inspect import inputs
from .requests import DiffRequest

BLOCK_BYTES = 16 << 20  # per side, per read
# spelling, not meaning (ids compare as aux_layer_ids_vllm), or covered by the per-tensor comparison; others as stored
REPRESENTATION = {"aux_layer_ids", "aux_convention", "config_dtype", "tensor_dtypes"}
DEFAULTS = {"rope_theta": 10000.0}  # absent means this to every engine
DERIVED = {"t2d": "d2t"}  # a tensor fully determined by another: a dialect may leave it out (ModelOpt: t2d)


@dataclass
class DiffReport(Result):
    SCHEMA, COMMAND = "eaglectl.diff/1", "diff"

    a: DrafterCheckpoint
    b: DrafterCheckpoint
    spec: list[dict[str, Any]] = field(default_factory=list)
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    derived_only: list[dict[str, str]] = field(default_factory=list)  # left out by one side, its source equal
    tensors: list[dict[str, Any]] = field(default_factory=list)  # those that differ
    compared: int = 0
    values: bool = True
    atol: float = 0.0
    target: str | None = None

    @property
    def equivalent(self) -> bool:
        return not (self.spec or self.only_in_a or self.only_in_b or self.tensors)

    @property
    def exit_code(self) -> int:
        return 0 if self.equivalent else 1

    def summary_line(self) -> str:
        if self.equivalent:
            return f"equivalent ({self.compared} tensors" + (", values compared)" if self.values else ", headers only)")
        return (f"{len(self.spec)} spec field(s), {len(self.only_in_a)} only in A, {len(self.only_in_b)} only in B, "
                f"{len(self.tensors)} tensor(s) differ")

    def payload(self) -> dict[str, Any]:
        return {
            "inputs": {"a": inputs(self.a), "b": inputs(self.b)},
            "a": _side(self.a), "b": _side(self.b),
            "equivalent": self.equivalent,
            "values_compared": self.values, "atol": self.atol, "target": self.target,
            "spec": self.spec, "only_in_a": self.only_in_a, "only_in_b": self.only_in_b,
            "derived_only": self.derived_only,
            "tensors": self.tensors, "tensors_compared": self.compared,
            "summary": {"spec_fields": len(self.spec), "only_in_a": len(self.only_in_a),
                        "only_in_b": len(self.only_in_b), "tensors_differ": len(self.tensors)},
        }


def _side(d: DrafterCheckpoint) -> dict[str, Any]:
    return {"source": d.source, "dialect": d.dialect.name, "eagle_version": d.spec.eagle_version}


def run(req: DiffRequest, progress: Progress = passthrough) -> DiffReport:
    """Compare A and B. With `target` (its config is enough), aux ids are compared as the boundaries
    vLLM captures on it: a drafter listing no ids and one listing the engine default are the same."""
    values, atol, target = req.values, req.atol, req.target
    da = open_drafter(req.a, from_dialect=req.from_a, allow_pickle=req.allow_pickle)
    db = open_drafter(req.b, from_dialect=req.from_b, allow_pickle=req.allow_pickle)
    layers = None
    if target is not None:

        layers = open_target(target).num_layers
    ma, mb = _meaning(da, layers), _meaning(db, layers)
    rep = DiffReport(da, db, [{"field": k, "a": ma.get(k), "b": mb.get(k)} for k in sorted(set(ma) | set(mb))
                              if ma.get(k) != mb.get(k)], values=values, atol=atol, target=target)
    na, nb = set(da.view.names()), set(db.view.names())
    rep.only_in_a, rep.only_in_b = sorted(na - nb), sorted(nb - na)
    common = sorted(na & nb)
    items: Iterable[str] = common
    if values:
        items = progress(common, label="comparing tensors", total=sum(da.view.info(c).nbytes for c in common),
                         weight=lambda c: da.view.info(c).nbytes, unit="B")
    for canon in items:
        ia, ib = da.view.info(canon), db.view.info(canon)
        row: dict[str, Any] = {"name": canon, "a": {"dtype": ia.dtype, "shape": list(ia.shape)},
                               "b": {"dtype": ib.dtype, "shape": list(ib.shape)}, "differs": []}
        if ia.dtype != ib.dtype:
            row["differs"].append("dtype")
        if tuple(ia.shape) != tuple(ib.shape):
            row["differs"].append("shape")
        elif values:
            worst = max_abs_diff(da, db, canon)
            row["max_abs_diff"] = worst
            if worst is None or worst > atol:
                row["differs"].append("values")
        rep.compared += 1
        if row["differs"]:
            rep.tensors.append(row)
    differing = {t["name"] for t in rep.tensors}
    for side, names, other in (("a", rep.only_in_a, nb), ("b", rep.only_in_b, na)):
        for name in list(names):
            source = DERIVED.get(name)
            if source is not None and source in na & nb and source not in differing:
                names.remove(name)
                rep.derived_only.append({"name": name, "in": side, "derived_from": source})
    return rep


def _meaning(d: DrafterCheckpoint, target_layers: int | None) -> dict[str, Any]:
    out = d.spec.to_json()
    for k in REPRESENTATION:
        out.pop(k, None)
    for k, v in DEFAULTS.items():
        if out.get(k) is None:
            out[k] = v
    if target_layers is not None:
        out["aux_layer_ids_vllm"] = list(d.spec.capture_ids(target_layers))
    out["eagle_version"] = d.spec.eagle_version
    return out


def max_abs_diff(a: DrafterCheckpoint, b: DrafterCheckpoint, canon: str) -> float | None:
    """max |a - b| over the tensor in float64 (None: a NaN on one side only, or values not comparable),
    read in row blocks of at most BLOCK_BYTES per side."""
    info = a.view.info(canon)
    shape = tuple(info.shape)
    row_bytes = max(1, info.nbytes // shape[0]) if shape and shape[0] else info.nbytes
    step = max(1, BLOCK_BYTES // max(1, row_bytes))
    worst = 0.0
    if len(shape) < 2 or shape[0] <= step:
        blocks = [(a.view.read(canon), b.view.read(canon))]
    else:
        sa, sb = a.view.stored[canon], b.view.stored[canon]
        blocks = ((a.ckpt.read_rows(sa, list(range(s, min(s + step, shape[0])))),
                   b.ckpt.read_rows(sb, list(range(s, min(s + step, shape[0])))))
                  for s in range(0, shape[0], step))
    for xa, xb in blocks:
        x, y = np.asarray(xa, dtype=np.float64), np.asarray(xb, dtype=np.float64)
        nan_x, nan_y = np.isnan(x), np.isnan(y)
        if (nan_x != nan_y).any():
            return None
        both = ~nan_x
        if x.size:
            with np.errstate(invalid="ignore"):
                d = np.abs(np.where(both, x, 0.0) - np.where(both, y, 0.0))
            same_inf = np.isinf(x) & (x == y)
            d = np.where(same_inf, 0.0, d)
            if np.isnan(d).any():
                return None
            worst = max(worst, float(d.max()))
    return worst
