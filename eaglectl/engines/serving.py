"""`convert --for ENGINE[,ENGINE]`: which dialect the engines serve this drafter from, and the lines that serve it.

The choice is data: for one engine the writable dialects whose `consumer` it is (formats registry); for several,
the writable dialects every one of them loads as a drafter (`loads`). Each is planned for real (a dialect that cannot
hold the drafter, or that an engine listed would read otherwise, refuses with its reason), ranked by the oldest
engine release that serves the drafter's features in that dialect's config style (engines.FEATURES), then each
engine's SERVE_PREFERENCE.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from typing import Any, TypeVar

from .. import formats
from ..checkpoint.drafter import DrafterCheckpoint
from ..checkpoint.target import TargetCheckpoint, is_hub_id
from ..errors import ConversionError
from ..spec import DrafterSpec
from . import sglang
from .facts import REFERENCE, SERVE_PREFERENCE, needed_features, version_key

ENGINES = tuple(SERVE_PREFERENCE)
P = TypeVar("P")  # what `pick`'s caller plans a dialect into


def loads(engine: str, dialect: formats.Dialect, spec: DrafterSpec) -> bool:
    """`engine` loads what this dialect's writer writes for the drafter as an EAGLE-3 drafter: vLLM every layout it
    knows (`vllm_loads`), SGLang an HF-style config naming one of its draft classes (sglang.DRAFT_CLASSES)."""
    w = dialect.writer
    if w is None or spec.arch not in w.architectures:
        return False
    if engine == "vllm":
        return dialect.vllm_loads
    return engine == "sglang" and dialect.config_style == "hf" and w.architectures[spec.arch] in sglang.DRAFT_CLASSES


def pick(src: DrafterCheckpoint, engines: tuple[str, ...], plan_for: Callable[[str], P]
         ) -> tuple[str, P, dict[str, Any]]:
    """(dialect, its plan, the record of the choice). `plan_for(dialect)` plans the conversion (raising
    ConversionError when the dialect cannot hold this drafter, or an engine listed would read it otherwise)."""
    def rank_in(engine: str, name: str) -> int:
        order = [n for n, _ in SERVE_PREFERENCE[engine]]
        return order.index(name) if name in order else len(order)

    if len(engines) == 1:
        candidates = [d for d in formats.DIALECTS.values() if d.writer is not None and d.consumer == engines[0]]
    else:
        candidates = [d for d in formats.DIALECTS.values() if all(loads(e, d, src.spec) for e in engines)]
    candidates.sort(key=lambda d: sum(rank_in(e, d.name) for e in engines))
    rows: list[dict[str, Any]] = []
    fits: list[tuple[tuple[tuple[int, ...], int], str, P]] = []
    for d in candidates:
        try:
            plan = plan_for(d.name)
        except ConversionError as e:
            rows.append({"dialect": d.name, "refused": e.message})
            continue
        feats = [f for e in engines
                 for f in needed_features(e, src.spec, d.config_style, d.writer.flag_paths if d.writer else None)]
        newest = max((f for f in feats), key=lambda f: version_key(f.release), default=None)
        needs = newest.release if newest is not None and newest.release else (
            f"unconfirmed release with {newest.since}" if newest is not None else "any")
        rows.append({"dialect": d.name, "needs": needs, "features": [f.feature for f in feats]})
        rank = (version_key(newest.release) if newest is not None else (0,), sum(rank_in(e, d.name) for e in engines))
        fits.append((rank, d.name, plan))
    who = " and ".join(engines)
    if not fits:
        raise ConversionError(f"{src.source}: no dialect {who} {'serves' if len(engines) == 1 else 'all serve'} can "
                              "hold this drafter (" + "; ".join(f"{r['dialect']}: {r['refused']}" for r in rows)
                              + ")" if rows else f"{src.source}: no dialect eaglectl writes is loaded as a drafter by "
                              f"{who}")
    fits.sort(key=lambda x: x[0])
    _, name, plan = fits[0]
    chosen = next(r for r in rows if r["dialect"] == name)
    reason = (f"{who} serve{'s' if len(engines) == 1 else ''} this drafter's features from {chosen['needs']} in the "
              f"{name} layout" if chosen["needs"] != "any" else f"every {who} release with EAGLE-3 serves it")
    why = [dict(SERVE_PREFERENCE[e]).get(name) for e in engines]
    reason += "".join(f"; {w}" for w in dict.fromkeys(w for w in why if w))
    # the choice reads the drafter alone: --target / --base-model name the verifier and the served model, never
    # the dialect (a speculators verifier nobody named is written null, with the warning that says so)
    reason += "; chosen on the drafter's features alone (--target and --base-model do not change it)"
    return name, plan, {"engine": ",".join(engines), "dialect": name, "why": reason, "candidates": rows,
                        "reference_release": REFERENCE.get(engines[0]) if len(engines) == 1 else None}


def speculative_config(d: DrafterCheckpoint) -> dict[str, Any]:
    """The vLLM `--speculative-config` for this drafter: method is always explicit (a path with
    'eagle-' would otherwise run as EAGLE-1)."""
    cfg: dict[str, Any] = {"method": "eagle3"}
    ref = d.ckpt.hub_ref
    if ref is not None:
        cfg["model"] = ref.repo_id + (f"/{ref.subfolder}" if ref.subfolder else "")
        if ref.sha:
            cfg["revision"] = ref.sha
    else:
        cfg["model"] = os.path.abspath(d.root)
    cfg["num_speculative_tokens"] = d.speculative_tokens
    cfg["draft_tensor_parallel_size"] = 1
    return cfg


def serve_line(served: str, spec: dict[str, Any]) -> str:
    """`vllm serve SERVED --speculative-config 'SPEC'`, shell-quoted: the one builder of the line that inspect,
    `convert --for vllm` and the model card print."""
    return f"vllm serve {shlex.quote(served)} --speculative-config {shlex.quote(json.dumps(spec))}"


def serve_command(src: DrafterCheckpoint, dest: str, target: TargetCheckpoint | None, base_model: str | None,
                  config: dict[str, Any]) -> str:
    """The serve line for the converted folder at `dest` (written config `config`; its k is the source's,
    `DrafterCheckpoint.speculative_tokens`). A local target is served by its absolute path (a command here, not
    an identity)."""
    spec = speculative_config(src)
    spec.pop("revision", None)
    spec["model"] = os.path.abspath(dest)
    if target is not None and target.ckpt.hub_ref is None and os.path.exists(target.source):
        served = os.path.abspath(target.source)
    else:
        verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
        served = base_model or (target.hub_id if target is not None else None) \
            or (verifier if is_hub_id(verifier) else None) or "<target-model>"
    return serve_line(served, spec)
