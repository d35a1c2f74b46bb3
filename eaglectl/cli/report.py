"""The output sink: a command's result to stdout (its human view or its JSON document), everything else to
stderr: errors, usage errors, interruptions, warnings, timings and progress.

The consoles and the one output setting are cli/console.py's; the human views are cli/views/.
Progress shows on stderr whenever stderr is a terminal and --json is off (NO_COLOR only removes colour).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.markup import escape

from ..counters import COUNTS
from ..errors import EaglectlError
from ..result import envelope
from ..text import printable
from . import views
from .console import SETTINGS, safe, say, say_apart, stderr, stdout, table

if TYPE_CHECKING:
    from ..result import BatchResult, Result

T = TypeVar("T")


ERROR_SCHEMA = "eaglectl.error/1"


def emit_json(payload: dict[str, Any]) -> None:
    SETTINGS.emitted = True
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")


# ------------------------------------------------------------------------------------ finishing

def finish(command: str, result: Result) -> None:
    """Print a command's result (JSON or human), its failure line if any, and exit with its code."""
    if SETTINGS.json:
        emit_json(result.to_json())
    elif SETTINGS.quiet:
        stdout.print(safe(result_line(command, result)))
    else:
        views.RENDERERS[type(result).__name__](result)
    timings()
    failure = result.failure()
    if failure is not None:
        error(failure)
    click.get_current_context().exit(result.exit_code)


def finish_batch(command: str, result: BatchResult) -> None:
    if SETTINGS.json:
        emit_json(result.to_json(command))
    elif SETTINGS.quiet:
        ok = sum(r["exit_code"] == 0 for r in result.rows)
        stdout.print(f"{command}: {ok} ok, {len(result.rows) - ok} failed; exit {result.exit_code}")
    else:
        views.render_batch(command, result)
    timings()
    click.get_current_context().exit(result.exit_code)


def batch_item(command: str, n: int, total: int, row: dict[str, Any]) -> None:
    """A batch item as it finishes: on stdout in the human view; on stderr beside --json (stdout holds the one
    document, written at the end); not with -q (its one line comes at the end)."""
    if SETTINGS.quiet:
        return
    views.batch_item(n, total, row, stderr if SETTINGS.json else stdout)
    if SETTINGS.json:
        pulse.printed()


def finish_listing(command: str, payload: dict[str, Any], render: Callable[[dict[str, Any]], None]) -> None:
    if SETTINGS.json:
        emit_json(envelope(f"eaglectl.{command}/1", command, 0, **payload))
    elif SETTINGS.quiet:
        stdout.print(f"{command}: {sum(len(v) for v in payload.values() if isinstance(v, list))} listed")
    else:
        render(payload)


def result_line(command: str, result: Result) -> str:
    """The one line -q prints: the result's own summary line, with the rule ids that make it fail (its error
    findings, and warnings under --strict), once each."""
    findings = (getattr(result, "findings", None) or []) if result.exit_code else []
    strict = getattr(result, "strict", False)
    rules = list(dict.fromkeys(f.rule_id for f in findings
                               if f.severity == "error" or (strict and f.severity == "warning")))
    return f"{command}: {result.summary_line()}" + (f" [{', '.join(rules)}]" if rules else "")


def timings() -> None:
    """-v: how long the command took and what it opened, loaded and ran (counters.py), on stderr."""
    if SETTINGS.verbose and not SETTINGS.json:


        done = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(COUNTS.items()))
        stderr.print(f"[dim]{SETTINGS.command or 'eaglectl'}: {time.perf_counter() - SETTINGS.started:.2f} s"
                     + (f"; {safe(done)}" if done else "") + "[/]")


def warning(message: str) -> None:
    if SETTINGS.quiet:
        return
    stderr.print(f"[yellow]warning:[/] {safe(message)}")


def error(exc: EaglectlError) -> None:
    """One line on stderr (plus a hint); with --json also the error object on stdout."""
    stderr.print(f"[bold red]{escape(f'error[{exc.reference}]:')}[/] {safe(exc.message)}")
    if exc.hint:
        stderr.print(f"[dim]hint:[/] {safe(exc.hint)}")
    if SETTINGS.json and not exc.reported:
        emit_json(envelope(ERROR_SCHEMA, SETTINGS.command, exc.exit_code, error=exc.to_json()))


def usage_hint(exc: click.ClickException, command: str | None) -> str:
    """What to do about a usage error: its own pointer (an engine given as a dialect), else the help."""
    return getattr(exc, "eaglectl_hint", None) or f"eaglectl {command + ' ' if command else ''}--help"


def is_help(exc: click.ClickException) -> bool:
    """Click's "no arguments: here is the help" (exit 2), which is shown as the help, not as an error."""
    return type(exc).__name__ == "NoArgsIsHelpError"


def usage_error(exc: click.ClickException) -> None:
    """A usage error Click found, in eaglectl's one error style: `error[usage]: ...` and a hint."""
    if is_help(exc):
        type(exc).show(exc)
        return
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    stderr.print(f"[bold red]{escape('error[usage]:')}[/] {safe(message)}")
    stderr.print(f"[dim]hint:[/] {safe(usage_hint(exc, SETTINGS.command))}")


def usage_error_json(exc: click.ClickException, command: str | None) -> None:
    """A Click usage error (bad flag or value, exit 2) as the error document, for --json callers."""
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    emit_json(envelope(ERROR_SCHEMA, command, exc.exit_code, error={
        "reference": "usage", "message": printable(message), "context": {}, "hint": usage_hint(exc, command),
        "exit_code": exc.exit_code}))


INTERRUPTIONS = {130: "interrupted", 143: "terminated"}  # error.reference of the JSON document (docs/json.md)


def interrupted(message: str, exit_code: int = 130) -> None:
    """Ctrl-C or SIGTERM: one line on stderr and, with --json, the error document on stdout (once)."""
    if SETTINGS.stopped:
        return
    SETTINGS.stopped = True
    stderr.print(f"[bold red]eaglectl:[/] {safe(message)}")
    if SETTINGS.json and not SETTINGS.emitted:
        emit_json(envelope(ERROR_SCHEMA, SETTINGS.command, exit_code, error={
            "reference": INTERRUPTIONS.get(exit_code, "interrupted"), "message": printable(message), "context": {},
            "hint": None, "exit_code": exit_code}))


def internal_error(exc: BaseException) -> None:
    first = str(exc).splitlines()[0] if str(exc) else ""
    stderr.print(f"[bold red]internal error:[/] {safe(type(exc).__name__)}: {safe(first)}")
    stderr.print("[dim]hint:[/] this is a bug in eaglectl; set EAGLECTL_DEBUG=1 for a traceback and report it")


# ------------------------------------------------------------------------------------- progress

HEARTBEAT_S = 30.0  # off a terminal (CI logs): a line on stderr at least this often while a command runs


def progress_enabled() -> bool:
    """On a terminal, unless --json or -q; NO_COLOR removes colour only (it is not "no progress")."""
    return not SETTINGS.json and not SETTINGS.quiet and stderr.is_terminal


def heartbeat_enabled() -> bool:
    """Off a terminal (a CI log), unless -q: --json too, whose document is on stdout (stderr is the log)."""
    return not SETTINGS.quiet and not stderr.is_terminal


class Pulse:
    """The heartbeat off a terminal: while anything holds it (a command, a step), a daemon thread prints on
    stderr what is running — the steps, innermost last, with how far the innermost got — whenever no line
    came for HEARTBEAT_S. One thread for the whole command, so a step outside any progress() call (loading,
    writing, checking) is not silent either."""

    def __init__(self) -> None:

        self.lock, self.wake = threading.Lock(), threading.Event()
        self.steps: list[dict[str, Any]] = []
        self.holds, self.last = 0, 0.0
        self.thread: threading.Thread | None = None

    def hold(self) -> None:

        with self.lock:
            self.holds += 1
            if self.holds == 1:
                self.last = time.perf_counter()
            if self.thread is None:
                self.wake.clear()
                self.thread = threading.Thread(target=self._beat, name="eaglectl-heartbeat", daemon=True)
                self.thread.start()
            else:
                self.wake.set()  # the running thread times its next beat again (HEARTBEAT_S may have changed)

    def release(self) -> None:
        with self.lock:
            self.holds -= 1
            if not self.holds:
                self.steps.clear()
                self.wake.set()

    def printed(self) -> None:
        """A line went to stderr: the next beat is due HEARTBEAT_S from now."""

        self.last = time.perf_counter()

    def _beat(self) -> None:

        while True:
            self.wake.wait(max(0.01, self.last + HEARTBEAT_S - time.perf_counter()))
            with self.lock:
                self.wake.clear()
                if not self.holds:
                    self.thread = None
                    return
                if time.perf_counter() - self.last < HEARTBEAT_S or not heartbeat_enabled():
                    continue
                line = self.line(time.perf_counter())
                self.last = time.perf_counter()
            with contextlib.suppress(ValueError, OSError):  # the stream closed as the command ended
                say_err(line)

    def line(self, now: float) -> str:
        """`upgrade 2/5 a: calibration: requests: 3 of 32 after 41 s, about 380 s left`."""
        if not self.steps:
            return f"{SETTINGS.command or 'eaglectl'}: running, {now - SETTINGS.started:.0f} s so far"
        *outer, step = self.steps
        total, done = step["total"], step["done"]
        took = now - step["started"]
        # the rate after the first advance: the first item also pays for start-up (a worker, a model load), which
        # made the estimate jump as later items came in
        since, base = step["first"] or (step["started"], 0)
        rate = (now - since) / (done - base) if done > base else took / max(done, 1)
        eta = f", about {rate * (total - done):.0f} s left" if total and done else ""
        count = f"{done}" + (f" of {total}" if total else "") + " " if step["counted"] else ""
        head, tail = ": ".join([*(s["label"] for s in outer), step["label"]]), f": {count}after {took:.0f} s{eta}"
        # one line a beat (say_err's lines hold width - 4 cells): the labels give way, never the count and the time
        room = stderr.width - 4 - len(tail)
        return (head if len(head) <= room else head[: max(room - 1, 8)] + "…") + tail


pulse = Pulse()


@contextlib.contextmanager
def step(label: str, total: int | None = None, counted: bool = False) -> Iterator[dict[str, Any]]:
    """A step the heartbeat names while it runs (a batch item, a progress() loop); yields its counter."""

    entry = {"label": label, "total": total, "done": 0, "counted": counted, "started": time.perf_counter(),
             "first": None}
    pulse.hold()
    with pulse.lock:
        pulse.steps.append(entry)
    try:
        yield entry
    finally:
        with pulse.lock:
            pulse.steps[:] = [s for s in pulse.steps if s is not entry]
        pulse.release()


def progress(items: Iterable[T], *, label: str, total: int | None = None, weight: Callable[[T], int] | None = None,
             unit: str | None = None) -> Iterator[T]:
    """Wrap an iterable in a transient progress bar on stderr when a human watches it. Off a terminal (a CI
    log), the heartbeat (Pulse) names this step and how far it got, at least every HEARTBEAT_S.

    `weight(item)` advances the bar by that amount (bytes with unit "B", tokens, ...) instead of 1.
    """
    if not progress_enabled():
        with step(label, total, counted=True) as counter:
            for item in items:
                yield item
                counter["done"] += weight(item) if weight else 1
                if counter["first"] is None:
                    counter["first"] = (time.perf_counter(), counter["done"])
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    columns = [TextColumn("{task.description}"), BarColumn()]
    columns += [DownloadColumn(), TransferSpeedColumn()] if unit == "B" else [MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=stderr, transient=True, refresh_per_second=6) as bar:
        task = bar.add_task(label, total=total)
        for item in items:
            yield item
            bar.advance(task, weight(item) if weight else 1)


def say_err(text: str) -> None:
    """A plain line for the log on stderr, wrapped at the width like every line (commands stay whole)."""
    from ..text import wrap_words

    lines = wrap_words(printable(text), stderr.width - 4, first=stderr.width)
    for n, line in enumerate(lines):
        stderr.print(("    " if n else "") + escape(line))
    pulse.printed()


# ------------------------------------------------------------------------------------- listings

def render_formats(payload: dict[str, Any]) -> None:
    rows = payload["dialects"]
    stdout.print(table(None, ["id", "name", "aux-id convention", "flags it records"], [
        (r["id"], r["title"], r["aux_convention"] + ("" if r["aux_ids_paths"] else " (ids not stored)"),
         ", ".join(r["flag_fields"]) or "none") for r in rows]))
    stdout.print(table(None, ["family", "eaglectl", "vLLM method", "served by"], [
        (f["name"], f["read"]["by"] if f["read"] else "refused by name", f["read"]["method"] if f["read"] else "-",
         f["served_by"]) for f in payload.get("families", [])]))
    stdout.print("\n[dim]detection signals and key renames: eaglectl formats --json, docs/formats.md[/]")


def render_rules(payload: dict[str, Any]) -> None:
    rules = payload["rules"]
    if len(rules) == 1:
        r = rules[0]
        stdout.print(f"[bold]{r['rule_id']}[/] ({r['severity']})")
        say("", r["title"])
        say("fix: ", r["hint"] or "-", indent=2)
        if r["repaired_by_convert"]:
            stdout.print("repaired by eaglectl convert")
        return
    for r in rules:  # the findings' layout: the identifiers on a line, the prose below, a command on its own line
        stdout.print(f"[bold]{r['rule_id']}[/]  {r['severity']}")
        say("    ", r["title"])
        if r["hint"]:
            say_apart("    fix: ", r["hint"], indent=6)
