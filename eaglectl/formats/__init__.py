"""The dialect registry: the single source for CLI choices, detection, conversion and the docs.

A dialect is one module of data (`Dialect`); `register` adds it. Detection is local to each
dialect's own signals: a dialect is excluded by what its layout cannot hold (`forbidden`) and by
another dialect's `markers` (keys only that producer writes), never by a list of its neighbours.
"""

from __future__ import annotations

import re
import shlex

from ..errors import AmbiguousFormatError, UnknownFormatError
from ._base import VLLM_AUX_KEY, Caveat, ConfigStyle, Detection, Dialect, Probe, Signal, Writer
from .families import VLLM_SPECULATORS_TYPES, identify, writable_layouts
from .in_target import IN_TARGET, in_target

__all__ = ["DIALECTS", "VLLM_AUX_KEY", "Caveat", "ConfigStyle", "Detection", "Dialect", "Probe", "Signal", "Writer",
           "detect", "evaluate", "get", "names", "register", "writable"]

DIALECTS: dict[str, Dialect] = {}
FITS = "fits: "  # the evidence prefix of a signal that held in a dialect excluded only for lacking its marker


def register(dialect: Dialect) -> Dialect:
    if dialect.name in DIALECTS:
        raise ValueError(f"dialect '{dialect.name}' registered twice")
    DIALECTS[dialect.name] = dialect
    return dialect


def names() -> list[str]:
    return list(DIALECTS)


def writable() -> list[str]:
    return [d.name for d in DIALECTS.values() if d.writer is not None]


def get(name: str) -> Dialect:
    return DIALECTS[name]


def evaluate(dialect: Dialect, probe: Probe) -> Detection:
    for other in DIALECTS.values():
        if other.name == dialect.name:
            continue
        for s in other.markers:
            if s.holds(probe) and s not in dialect.markers:
                return Detection(dialect.name, None, (f"excluded: {s.describe()} ({other.name} marker)",))
    for s in dialect.forbidden:
        if s.holds(probe):
            return Detection(dialect.name, None, (f"excluded: {s.describe()}",))
    missing = [s for s in dialect.required if not s.holds(probe)]
    if missing:
        return Detection(dialect.name, None, tuple(f"missing: {s.describe()}" for s in missing))
    any_held = [s for s in dialect.required_any if s.holds(probe)]
    if dialect.required_any and not any_held:
        alternatives = " or ".join(s.describe() for s in dialect.required_any)
        # its layout fits but its marker is absent (a template, or a config edited by hand): said as evidence
        fits = tuple(FITS + s.describe() for s in dialect.supporting if s.holds(probe))
        return Detection(dialect.name, None, (f"missing: {alternatives}", *fits))
    held = list(dict.fromkeys([*dialect.required, *any_held,
                               *(s for s in (*dialect.markers, *dialect.supporting) if s.holds(probe))]))
    return Detection(dialect.name, sum(s.weight for s in held), tuple(s.describe() for s in held))


def detect(probe: Probe, forced: str | None = None, where: str = "") -> tuple[Dialect, list[Detection]]:
    """The dialect with the highest score, or the forced one; never a guess between equals. A drafter of a
    family that is not EAGLE-3 (formats/families.py) is refused by name, whatever --from says."""
    if forced is None and (why := looks_like_target(probe)):  # first: a target names the drafter it holds inside
        inside = f"eaglectl inspect {shlex.quote(where)} reads the drafter inside it; " if in_target(
            list(probe.tensors)) else ""
        raise UnknownFormatError(f"{where}: this looks like a target model ({why}), not an EAGLE drafter",
                                 path=where, target=True,
                                 hint=f"{inside}give the drafter as SOURCE and this model as --target")
    not_eagle3(probe, where)
    detections = sorted((evaluate(d, probe) for d in DIALECTS.values()),
                        key=lambda d: -(d.score if d.score is not None else -1))
    if forced is not None:
        return DIALECTS[forced], detections
    fitting = [d for d in detections if d.score is not None]
    if not fitting:
        raise UnknownFormatError(
            f"{where}: no known dialect matches ({'; '.join(f'{d.dialect}: {d.evidence[0]}' for d in detections)})",
            path=where, hint=f"pass --from with one of {', '.join(DIALECTS)} if you know the producer",
        )
    if len(fitting) > 1 and fitting[0].score == fitting[1].score:
        tied = [d for d in fitting if d.score == fitting[0].score]
        raise AmbiguousFormatError(
            f"{where}: {' and '.join(d.dialect for d in tied)} fit equally "
            f"({'; '.join(f'{d.dialect}: ' + ', '.join(d.evidence) for d in tied)})",
            path=where, hint=f"pass --from {tied[0].dialect} (or another) to say which producer wrote it",
        )
    return DIALECTS[fitting[0].dialect], detections


def not_eagle3(probe: Probe, where: str) -> None:
    """UnknownFormatError naming the family, the engine that serves it and why, for a drafter whose layout is not
    EAGLE-3's (a family in the EAGLE-3 layout, P-EAGLE, is read by the dialects). `inspect` catches it for a family
    it reads on its own (`family_id` in the error's context: families/checkpoint.open_any)."""
    found = identify(probe)
    if found is None or (found[0].reading is not None and found[0].reading.eagle3_layout):
        return
    family, evidence = found
    read = family.reading is not None
    kind = (probe.config or {}).get("speculators_model_type")
    served = f"served by {family.served_by}"
    if isinstance(kind, str) and kind not in VLLM_SPECULATORS_TYPES:  # speculators' MTP / FastMTP format
        served = (f"in speculators' '{kind}' format no engine loads it (vLLM 0.32-0.34's speculators reader builds "
                  f"{', '.join(VLLM_SPECULATORS_TYPES)}; SGLang 0.5.23 has none); the {family.name} is {served}")
    raise UnknownFormatError(
        f"{where}: {family.name}, not EAGLE-3 ({'; '.join(evidence[:3])}): {family.why}; {served}",
        path=where, family=family.name, served_by=family.served_by,
        family_id=family.id if read else None,
        hint=(f"eaglectl inspect {shlex.quote(where)} (reads it header-only: its layers, mask token and head); "
              f"eaglectl smoke {shlex.quote(where)} --target TARGET (measures it where vLLM serves the method); "
              + (f"eaglectl convert {shlex.quote(where)} DEST --to {layouts[0]} (between its layouts: "
                 f"{', '.join(layouts)}); "
                 if (layouts := writable_layouts(family.id)) else "")
              + "upgrading and verifying are for EAGLE-3 / 3.1 drafters" if read else
              "only EAGLE-3 / 3.1 drafters are read, checked and converted here; serve this one with the engine "
              "named"))


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_IN_TARGET_PREFIXES = tuple(p for k in IN_TARGET for p in k.prefixes)


def looks_like_target(probe: Probe) -> str | None:
    """Why these weights are a whole model rather than a drafter: every EAGLE-3 drafter has an fc
    that fuses aux states, and one (rarely a few) decoder layers; a target has no fc and many (a drafter it
    ships inside, under its MTP prefix, is named: `in_target`)."""
    inside = in_target(list(probe.tensors))
    own = [t for t in probe.tensors if not t.startswith(_IN_TARGET_PREFIXES)]
    fc = any(t == "fc.weight" or t.endswith(".fc.weight") for t in own)
    layers = {int(m.group(1)) for t in own if (m := _LAYER.search(t))}
    if (fc and inside is None) or len(layers) < 2:
        return None
    arch = (probe.config or {}).get("architectures")
    named = f"{arch[0]}, " if isinstance(arch, list) and arch and isinstance(arch[0], str) else ""
    return f"{named}{len(layers)} decoder layers" + ("" if fc else ", no fc.weight") + (f"; {inside}" if inside else "")


# The registry: one line per dialect module.
from . import eagle, gguf, modelopt, nemo, specforge, speculators, torchspec  # noqa: E402

for _module in (eagle, specforge, speculators, torchspec, modelopt, nemo, gguf):
    register(_module.DIALECT)
