"""Where output goes: the two consoles, the one output setting, and the line and table primitives.

Two module-level consoles (Rich resolves sys.stdout / sys.stderr on every write, so Click's test
runner captures them). No colour when NO_COLOR is set or the stream is not a terminal (Rich's own
rules). Every string that comes from a file (names, keys, messages) goes through `safe`: lone
surrogates and control characters are escaped and Rich markup is neutralised, so a hostile tensor
name cannot crash or restyle the output. The views (cli/views/) draw with these; the sink
(cli/report.py) finishes a command with them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from ..text import COMMAND, grid, printable, wrap_items, wrap_words

# Neither console wraps: text.py lays lines out at the width (`say`, `table`) and a command or
# identifier that cannot fit runs on, whole, rather than being folded where a paste would break it.
stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass
class Settings:
    """The one output setting object (the CLI sets it; the library never reads it)."""

    json: bool = False
    debug: bool = False
    command: str | None = None  # the subcommand being run (the JSON envelope's `command`)
    verbosity: int = 0  # -1 quiet (errors and the result line), 0 normal, 1 verbose
    started: float = 0.0
    emitted: bool = False  # a JSON document is on stdout (never two)
    stopped: bool = False  # the interruption was reported (Ctrl-C, SIGTERM)

    def reset(self, *, debug: bool = False, verbosity: int = 0) -> None:
        # `command` is set before this runs; --json and -q/-v after the subcommand are parsed after it
        self.json, self.debug, self.verbosity = False, debug, verbosity
        self.emitted = self.stopped = False
        self.started = time.perf_counter()

    @property
    def quiet(self) -> bool:
        return self.verbosity < 0

    @property
    def verbose(self) -> bool:
        return self.verbosity > 0


SETTINGS = Settings()


def safe(text: Any) -> str:
    """Printable and markup-escaped: for anything derived from input files."""
    return escape(printable(text))


def say(prefix: str, text: str = "", *, items: list[str] | None = None, indent: int | None = None,
        sep: str = ", ", style: str | None = None, out: Console | None = None) -> None:
    """One logical line on stdout (or `out`): `prefix` (markup, eaglectl's own) then `text` (plain, escaped
    here) or `items`, wrapped at the console width at spaces (`items`: only between items), never inside a
    word, a path or a command; continuation lines indented (default: under the text)."""
    out = out or stdout
    width = out.width
    lead = cell_len(Text.from_markup(prefix).plain)
    hang = lead if indent is None else indent
    hang = hang if hang <= width // 2 else 4
    shown = [printable(x) for x in items] if items is not None else None
    head = (shown[0] if shown else None) if shown is not None else next(iter(printable(text).split()), None)
    if head is not None and prefix.strip() and cell_len(head) > width - lead:
        # the first path or word fits no line after the prefix: the prefix alone, then the rest below it, as far
        # left as the longest first piece needs
        out.print(prefix.rstrip())
        hang = lead = min(hang, max(0, width - cell_len(head)))
        prefix = " " * lead
    lines = (wrap_items(shown, width - hang, first=width - lead, sep=sep) if shown is not None else
             wrap_words(printable(text), width - hang, first=width - lead))

    def styled(line: str) -> str:
        return f"[{style}]{escape(line)}[/]" if style and line else escape(line)

    out.print(prefix + styled(lines[0]))
    for line in lines[1:]:
        out.print(" " * hang + styled(line))


def say_apart(prefix: str, text: str, *, indent: int = 4, out: Console | None = None) -> None:
    """`say`, each command in `text` on a line of its own below the prose around it (whole: one paste)."""
    out = out or stdout
    pieces = [p.strip() for p in COMMAND.split(printable(text))]
    commands = COMMAND.findall(printable(text))
    lead = prefix
    for n, prose in enumerate(pieces):
        if prose:
            say(lead, prose, indent=indent, out=out)
            lead = " " * indent
        if n < len(commands):
            if lead == prefix and prefix.strip():
                out.print(prefix.rstrip())
            out.print(" " * indent + escape(commands[n]))
            lead = " " * indent


# columns that may wrap (at spaces)
PROSE = ("message", "meaning", "fix", "what was checked", "result", "reason", "name", "flags it records")


def table(title: str | None, columns: list[str], rows: Iterable[Iterable[Any]],
          style: dict[str, Callable[[str], str | None]] | None = None) -> str:
    """A table as markup lines no wider than the console where it can be; identifiers never broken
    (text.py)."""
    lines = grid(columns, [list(r) for r in rows], width=stdout.width, prose=PROSE, style=style,
                 title=title.strip() if title else None)
    return ("\n" if title and title.startswith("\n") else "") + "\n".join(lines)
