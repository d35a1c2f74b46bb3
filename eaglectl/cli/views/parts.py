"""What every view shares: styles, sizes, numbers, and the findings table."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...text import short_path
from .. import console
from ..console import SETTINGS, say, say_apart

if TYPE_CHECKING:
    from ...rules import Finding


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
STATUS_STYLE = {"pass": "green", "fail": "bold red", "undecided": "bold yellow", "skipped": "yellow"}


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def num(x: object, fmt: str = "") -> str:
    """A value in human output (`fmt`: its format spec): an absent one is "-", never "None"."""
    return "-" if x is None else format(x, fmt)


def step_range(steps: list[int]) -> str:
    """'step 0', 'steps 1-2', 'steps 0, 2'."""
    if not steps:
        return ""
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}-{steps[-1]}"
    return "steps " + ", ".join(map(str, steps))


def json_short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(locator: str) -> str:
    """A locator as a line shows it: its file named as short_path names a source (the JSON keeps it whole)."""
    file, sep, key = locator.rpartition(":") if locator.startswith("/") else ("", "", locator)
    return f"{short_path(file)}{sep}{key}" if sep else locator


def findings(found: list[Finding]) -> None:
    """The findings table (info findings only with -v: a line says how many were left out) and the fixes,
    each command in them whole on one line (text.py)."""
    shown_ = [f for f in found if SETTINGS.verbose or f.severity != "info"]
    hidden = len(found) - len(shown_)
    if shown_:  # one layout whatever the content: a finding's identifiers on a line, its message below
        console.stdout.print()
        console.stdout.print("[bold]findings[/]")
        for f in shown_:
            severity = f"[{SEVERITY_STYLE[f.severity]}]{f.severity:<7}[/]  "
            say(severity, items=[f.rule_id, *([_where(f.locator)] if f.locator else [])], sep=" ", indent=4)
            say("    ", f.message)
        hints = {f.rule_id: f.hint for f in shown_ if f.hint}  # commands filled in per finding
        if hints:
            console.stdout.print("[bold]fixes[/]")
            for rule, hint in hints.items():
                say_apart(f"{rule}: ", hint)
    if hidden:
        console.stdout.print(f"[dim]{hidden} info finding(s) not shown: -v shows them (or --json)[/]")
