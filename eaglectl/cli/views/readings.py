"""What each engine reads of a drafter, in words for humans (inspect's engine lines)."""

from __future__ import annotations

from ...engines.readings import FLAG_NAMES, EngineReading, Readings


def _where(r: EngineReading) -> str:
    if r.error:
        return f"refused: {r.error}"
    if r.default:
        return "the target's default" if r.boundary_ids is not None else ""
    return f"from {r.source}" + (f" (+{r.shift})" if r.shift else "")


def describe(r: Readings) -> list[str]:
    """Human lines (inspect): one when the runners agree, one per runner otherwise, then flags and basis."""
    if not r.runners:
        return [f"not read ({r.note})" if r.note else "not read"]
    v1, v2 = r.get("v1"), r.get("v2")
    lines = []
    same = v1 is not None and v2 is not None and (v1.boundary_ids, v1.source, v1.error) == (
        v2.boundary_ids, v2.source, v2.error)
    if same and v1 is not None:
        lines.append(f"v1 = v2: {v1.ids_text()} {_where(v1)}".rstrip())
    else:
        for x in r.runners:
            lines.append(f"{x.runner}: {x.ids_text()} {_where(x)}".rstrip())
    first = next((x for x in r.runners if x.flags is not None), None)
    if first is not None and first.flags is not None:
        on = [f for f in FLAG_NAMES if first.flags.get(f)]
        lines.append((", ".join(on) + " applied" if on else "no norm flags applied")
                     + (f"; fc takes {first.num_aux} aux states" if first.num_aux is not None else ""))
    elif r.runners[0].model_error:
        lines.append(f"vLLM cannot build the draft model: {r.runners[0].model_error}")
    if r.note and r.note.startswith("no vLLM interpreter") and r.basis.endswith(")"):
        lines.append(r.basis[:-1] + "; no vLLM here)")
    else:
        lines.append(r.basis)
        if r.note:
            lines.append(r.note)
    return lines


def describe_other(r: EngineReading, note: str | None = None) -> list[str]:
    """Human lines for another engine's reading (SGLang): the layers it captures, the draft class and what it
    applies, then the basis."""
    if r.error:
        lines = [f"refused: {r.error}"]
    else:
        came = f"from {r.source}" + (f" (+{r.shift})" if r.shift else "") if not r.default else (
            "the target's default" if r.boundary_ids is not None else "")
        lines = [f"captures {r.ids_text()} {came}".rstrip()]
        if r.model_error:
            lines.append(f"no EAGLE-3 drafter: {r.model_error}")
        elif r.flags is not None:
            on = [f for f in FLAG_NAMES if r.flags.get(f)]
            lines.append(f"draft class {r.model_class}; " + (", ".join(on) + " applied" if on else
                                                              "no norm flags applied")
                         + (f"; fc takes {r.num_aux} aux states" if r.num_aux is not None else ""))
    lines.append(r.basis)
    if note:
        lines.append(note)
    return lines
