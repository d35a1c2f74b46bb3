"""Plain-text layout that survives a pipe and an 80-column terminal (CI logs).

Identifiers — rule ids, dialect names, tensor names, paths, config labels — are never broken
across lines: only the columns named as prose wrap, and only at spaces. When even that cannot
fit the width, a table turns into records (the identifiers on one line, the prose indented
below). Long paths are shown short: relative to the working directory when under it, a Hub
cache snapshot as its Hub id, anything else as `…/last/two`; JSON keeps them whole.
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.markup import escape

GAP = 2
MIN_PROSE = 16  # narrower prose columns read worse than records
_HUB_SNAPSHOT = re.compile(r"(?:^|/)models--([^/]+?)--([^/]+)/snapshots/[^/]+(?:/(.*))?$")
SHORT_PATH = 40  # longer paths outside the working directory become …/last/two


def short_path(path: Any) -> str:
    """How a source is named in human output (the JSON keeps the full path)."""
    text = str(path)
    hub = _HUB_SNAPSHOT.search(text.rstrip("/"))
    if hub:
        org, name, sub = hub.groups()
        return f"{org}/{name}" + (f"/{sub}" if sub else "")
    if not os.path.isabs(text) and not text.startswith(".."):
        return text  # what the user typed, or a Hub id
    try:
        rel = os.path.relpath(text)
    except ValueError:  # another drive
        rel = text
    if not rel.startswith(".."):
        return rel
    parts = [p for p in text.rstrip("/").split("/") if p]
    if len(text) <= SHORT_PATH or len(parts) <= 2:
        return text
    return "…/" + "/".join(parts[-2:])


def wrap_words(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` cells, split only at spaces (a longer word stays whole)."""
    lines: list[str] = []
    for para in str(text).split("\n"):
        lines += textwrap.wrap(para, max(width, 1), break_long_words=False, break_on_hyphens=False) or [""]
    return lines


def grid(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, width: int, prose: Iterable[str] = (),
         style: dict[str, Callable[[str], str | None]] | None = None, title: str | None = None) -> list[str]:
    """Rich-markup lines of a table at most `width` cells wide where it can be.

    Columns in `prose` wrap at spaces; every other cell is one unbroken string. `style[column](text)`
    names a Rich style for a cell.
    """
    style = style or {}
    body = [[_plain(v) for v in row] for row in rows]
    prose_ix = [i for i, c in enumerate(columns) if c in set(prose)]
    widths = [max([cell_len(columns[i])] + [cell_len(r[i]) for r in body]) for i in range(len(columns))]
    out = [f"[bold]{escape(title)}[/]"] if title else []
    total = sum(widths) + GAP * (len(widths) - 1)
    if total > width and prose_ix:
        spare = width - (total - sum(widths[i] for i in prose_ix))
        # each prose column gets at least its longest word; the rest goes where the text is longest
        least = {i: max([min(MIN_PROSE, widths[i])] + [cell_len(w) for r in body for w in r[i].split()])
                 for i in prose_ix}
        extra = spare - sum(least.values())
        if extra < 0:
            return out + _records(columns, body, prose_ix, width, style)
        want = {i: widths[i] - least[i] for i in prose_ix}
        for i in prose_ix:
            widths[i] = least[i] + extra * want[i] // max(1, sum(want.values()))
    head = _line([c for c in columns], widths, {}, columns, bold=True)
    out.append(head)
    for r in body:
        cells = [wrap_words(r[i], widths[i]) if i in prose_ix else [r[i]] for i in range(len(columns))]
        for k in range(max(len(c) for c in cells)):
            out.append(_line([c[k] if k < len(c) else "" for c in cells], widths, style, columns))
    return out


def _records(columns: Sequence[str], body: list[list[str]], prose_ix: list[int], width: int,
             style: dict[str, Callable[[str], str | None]]) -> list[str]:
    """Each row's identifiers on one line, its prose indented below; aligned under a header when the
    identifiers alone fit the width (a numeric table stays readable), else one record per row."""
    ids = [i for i in range(len(columns)) if i not in prose_ix]
    widths = {i: max([cell_len(columns[i])] + [cell_len(r[i]) for r in body]) for i in ids}
    aligned = sum(widths.values()) + GAP * (len(ids) - 1) <= width
    out = []
    if aligned:
        out.append(_line([columns[i] for i in ids], [widths[i] for i in ids], {}, [columns[i] for i in ids],
                         bold=True))
        out.append("    [bold]" + escape(" / ".join(columns[i] for i in prose_ix)) + "[/]")
    for r in body:
        if aligned:
            out.append(_line([r[i] for i in ids], [widths[i] for i in ids], style, [columns[i] for i in ids]))
        else:
            out.append("  ".join(_styled(r[i], style.get(columns[i])) for i in ids if r[i]))
        for i in prose_ix:
            out += ["    " + escape(line) for line in wrap_words(r[i], width - 4) if r[i]]
    return out


def _line(cells: list[str], widths: list[int], style: dict[str, Callable[[str], str | None]],
          columns: Sequence[str], bold: bool = False) -> str:
    parts = []
    for i, (text, w) in enumerate(zip(cells, widths, strict=True)):
        pad = " " * (w - cell_len(text)) if i < len(cells) - 1 else ""
        parts.append((f"[bold]{escape(text)}[/]" if bold and text else _styled(text, style.get(columns[i]))) + pad)
    return (" " * GAP).join(parts).rstrip()


def _styled(text: str, pick: Callable[[str], str | None] | None) -> str:
    s = pick(text) if pick and text else None
    return f"[{s}]{escape(text)}[/]" if s else escape(text)


def _plain(v: Any) -> str:
    from .report import printable

    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(str, v)) + "]"
    return printable(v)
