"""Plain-text layout that survives a pipe and an 80-column terminal (CI logs).

Identifiers — rule ids, dialect names, tensor names, paths, config labels — are never broken
across lines: only the columns named as prose wrap, and only at spaces. A command in prose
(`eaglectl convert X DEST --to speculators --target T`) is one unbreakable unit, rendered as the
serve line is: on one line, longer than the width if it must be, so that it pastes as one
command. A prose column gets at least MIN_PROSE cells; when that cannot fit the width, a table
turns into records (the identifiers on one line, or stacked when even they do not fit, the prose
and the identifier columns that do not fit indented below, whole). Nothing here is wrapped again by
the console (it prints with soft wrap): a line that must be longer than the width runs on. Paths
are shown short but never cut, so that they can be opened as printed: relative to the working
directory when under it, a Hub cache snapshot as its Hub id, the home directory as `~`.
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
MIN_PROSE = 36  # narrower prose columns (a message squeezed beside long locators) read worse than records
_GLUE = "\ue000"  # stands for a space inside an unbreakable unit while text is wrapped
# A command in prose — `eaglectl SUBCOMMAND ...` — runs to the next "(", ";", ", " or the end (the convention of
# rules/__init__.py): one unit. (The serve line and recipes print on lines of their own.)
_SUBCOMMANDS = "inspect|convert|upgrade|verify|diff|smoke|check|upload|capture|drift|formats|rules|completion"
COMMAND = re.compile(rf"(?<![\w/.-])eaglectl (?:{_SUBCOMMANDS})\b(?:(?!, )[^(;])*[^(;\s,]")
_HUB_SNAPSHOT = re.compile(r"(?:^|/)models--([^/]+?)--([^/]+)/snapshots/[^/]+(?:/(.*))?$")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(text: Any) -> str:
    """`text` with lone surrogates as \\udXXXX and control characters as \\xNN (one line, any terminal)."""
    s = str(text).encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", s)


def short_path(path: Any) -> str:
    """How a source is named in human output (the JSON keeps the full path): shorter where that loses nothing,
    never cut (a path cut from the left, `…/last/two`, could not be opened or told from another)."""
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
    home = os.path.expanduser("~").rstrip("/")
    if home and home != "~" and (text == home or text.startswith(home + "/")):
        return "~" + text[len(home):]
    return text


def short_names(paths: list[str]) -> list[str]:
    """Each path's last part when those tell them apart, else the paths (drift's tables and plot name drafters)."""
    base = [os.path.basename(os.path.normpath(p)) or p for p in paths]
    return base if len(set(base)) == len(set(paths)) else paths


def glue(text: str) -> str:
    """`text` with every command in it made one unbreakable unit (for `wrap_words`)."""
    return COMMAND.sub(lambda m: m.group().replace(" ", _GLUE), str(text))


def units(text: str) -> list[str]:
    """The pieces `wrap_words` never breaks: words, and whole commands."""
    return [u.replace(_GLUE, " ") for u in glue(text).split()]


def wrap_words(text: str, width: int, *, first: int | None = None) -> list[str]:
    """`text` in lines of at most `width` cells (the first line `first`), split only at spaces and never
    inside a command; a longer word or command stays whole on its own line."""
    lines: list[str] = []
    for para in glue(text).split("\n"):
        lead = max(0, width - first) if first is not None and not lines else 0
        got = textwrap.wrap(para, max(width, 1), initial_indent=_GLUE * lead, break_long_words=False,
                            break_on_hyphens=False) or [""]
        got[0] = got[0][lead:] if got[0].startswith(_GLUE * lead) else got[0]
        lines += got
    return [line.replace(_GLUE, " ") for line in lines]


def wrap_items(items: Sequence[str], width: int, *, first: int | None = None, sep: str = ", ") -> list[str]:
    """`items` joined by `sep`, broken only between items (`BF16×13, BOOL×1, I64×1` never splits inside
    one), at most `width` cells a line (the first `first`)."""
    lines: list[str] = []
    line = ""
    limit = first if first is not None else width
    for n, item in enumerate(items):
        piece = item + (sep.rstrip() if n < len(items) - 1 else "")
        candidate = f"{line} {piece}" if line else piece
        if line and cell_len(candidate) > limit:
            lines.append(line)
            line, limit = piece, width
        else:
            line = candidate
    return lines + [line] if line or not lines else lines


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
        # each prose column gets at least its longest word or command; the rest goes where the text is longest
        least = {i: max([min(MIN_PROSE, widths[i])] + [cell_len(w) for r in body for w in units(r[i])])
                 for i in prose_ix}
        extra = spare - sum(least.values())
        if extra < 0:
            return out + _records(columns, body, _below(widths, prose_ix, width), width, style, wrap=prose_ix)
        want = {i: widths[i] - least[i] for i in prose_ix}
        for i in prose_ix:
            widths[i] = least[i] + extra * want[i] // max(1, sum(want.values()))
    elif total > width and len(columns) > 1:  # identifiers only: the last ones go below each row, whole
        return out + _records(columns, body, _below(widths, [], width), width, style, wrap=prose_ix)
    out.append(_line(list(columns), widths, {}, columns, bold=True))
    for r in body:
        cells = [wrap_words(r[i], widths[i]) if i in prose_ix else [r[i]] for i in range(len(columns))]
        for k in range(max(len(c) for c in cells)):
            out.append(_line([c[k] if k < len(c) else "" for c in cells], widths, style, columns))
    return out


def _below(widths: list[int], prose_ix: list[int], width: int) -> list[int]:
    """The columns a record prints below its first line: the prose, then trailing identifier columns until
    the rest fit the width side by side (at least one column stays on top)."""
    below = list(prose_ix)
    top = [i for i in range(len(widths)) if i not in below]
    while len(top) > 1 and sum(widths[i] for i in top) + GAP * (len(top) - 1) > width:
        below.insert(len(prose_ix), top.pop())
    return sorted(below)


def _records(columns: Sequence[str], body: list[list[str]], prose_ix: list[int], width: int,
             style: dict[str, Callable[[str], str | None]], wrap: Sequence[int]) -> list[str]:
    """Each row's identifiers on one line, the columns in `prose_ix` indented below (wrapped at spaces
    when they are prose: `wrap`; whole when they are identifiers); aligned under a header when the
    identifiers on top fit the width (a numeric table stays readable), else one record per row, its
    identifiers stacked."""
    ids = [i for i in range(len(columns)) if i not in prose_ix]
    widths = {i: max([cell_len(columns[i])] + [cell_len(r[i]) for r in body]) for i in ids}
    aligned = sum(widths.values()) + GAP * (len(ids) - 1) <= width
    out = []
    if aligned and len(ids) > 1:  # one identifier column needs no header: the prose sits under it
        out.append(_line([columns[i] for i in ids], [widths[i] for i in ids], {}, [columns[i] for i in ids],
                         bold=True))
        out.append("    [bold]" + escape(" / ".join(columns[i] for i in prose_ix)) + "[/]")
    for r in body:
        if aligned:
            out.append(_line([r[i] for i in ids], [widths[i] for i in ids], style, [columns[i] for i in ids]))
        else:
            out += _stacked([(r[i], style.get(columns[i])) for i in ids if r[i]], width)
        for i in prose_ix:
            if r[i]:
                lines = wrap_words(r[i], width - 4) if i in wrap else [r[i]]
                out += ["    " + _styled(line, style.get(columns[i])) for line in lines]
    return out


def _stacked(cells: list[tuple[str, Callable[[str], str | None] | None]], width: int) -> list[str]:
    """A record's identifiers on as few lines as fit the width, each whole; the lines after the first
    indented by two (an identifier longer than the width has a line of its own)."""
    lines: list[list[str]] = [[]]
    used = 0
    for text, pick in cells:
        need = cell_len(text) + (GAP if lines[-1] else 0)
        if lines[-1] and used + need > width:
            lines.append([])
            used, need = 2, cell_len(text)
        lines[-1].append(_styled(text, pick))
        used += need
    return [("  " if n else "") + "  ".join(parts) for n, parts in enumerate(lines)]


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
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(str, v)) + "]"
    return printable(v)
