"""The one output layer: results to stdout (rich tables or JSON), everything else to stderr.

Two module-level consoles (Rich resolves sys.stdout / sys.stderr on every write, so Click's test
runner captures them). No colour when NO_COLOR is set or the stream is not a terminal (Rich's own
rules); progress on stderr whenever stderr is a terminal and --json is off (NO_COLOR only removes
colour). Every string that comes from a file (names, keys, messages) goes through `safe`: lone
surrogates and control characters are escaped and Rich markup is neutralised, so a hostile tensor
name cannot crash or restyle the output.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape

from .errors import EaglectlError

# Neither console wraps: eaglectl/layout.py lays lines out at the width (`say`, `table`) and a command or
# identifier that cannot fit runs on, whole, rather than being folded where a paste would break it.
stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

T = TypeVar("T")


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
        import time

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
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(text: Any) -> str:
    """`text` with lone surrogates as \\udXXXX and control characters as \\xNN (one line, any terminal)."""
    s = str(text).encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", s)


def safe(text: Any) -> str:
    """Printable and markup-escaped: for anything derived from input files."""
    return escape(printable(text))


def say(prefix: str, text: str = "", *, items: list[str] | None = None, indent: int | None = None,
        sep: str = ", ", style: str | None = None) -> None:
    """One logical line on stdout: `prefix` (markup, eaglectl's own) then `text` (plain, escaped here) or
    `items`, wrapped at the console width at spaces (`items`: only between items), never inside a word, a
    path or a command; continuation lines indented (default: under the text)."""
    from rich.cells import cell_len
    from rich.text import Text

    from .layout import wrap_items, wrap_words

    width = stdout.width
    lead = cell_len(Text.from_markup(prefix).plain)
    hang = lead if indent is None else indent
    hang = hang if hang <= width // 2 else 4
    shown = [printable(x) for x in items] if items is not None else None
    lines = (wrap_items(shown, width - hang, first=width - lead, sep=sep) if shown is not None else
             wrap_words(printable(text), width - hang, first=width - lead))

    def styled(line: str) -> str:
        return f"[{style}]{escape(line)}[/]" if style and line else escape(line)

    stdout.print(prefix + styled(lines[0]))
    for line in lines[1:]:
        stdout.print(" " * hang + styled(line))


ERROR_SCHEMA = "eaglectl.error/1"


def envelope(schema: str, command: str | None, exit_code: int, **result: Any) -> dict[str, Any]:
    """The keys every JSON document starts with (docs/json.md); the command's result follows them."""
    from . import __version__

    return {"schema": schema, "tool_version": __version__, "command": command, **result, "exit_code": exit_code}


def emit_json(payload: dict[str, Any]) -> None:
    SETTINGS.emitted = True
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")


# ------------------------------------------------------------------------------------ finishing

def finish(command: str, result: Any) -> None:
    """Print a command's result (JSON or human), its failure line if any, and exit with its code."""
    if SETTINGS.json:
        emit_json(result.to_json())
    elif SETTINGS.quiet:
        stdout.print(safe(result_line(command, result)))
    else:
        RENDERERS[command](result)
    timings()
    failure = result.failure() if hasattr(result, "failure") else None
    if failure is not None:
        error(failure)
    click.get_current_context().exit(result.exit_code)


def finish_batch(command: str, result: Any) -> None:
    if SETTINGS.json:
        emit_json(result.to_json(command))
    elif SETTINGS.quiet:
        ok = sum(r["exit_code"] == 0 for r in result.rows)
        stdout.print(f"{command}: {ok} ok, {len(result.rows) - ok} failed; exit {result.exit_code}")
    else:
        render_batch(command, result)
    timings()
    click.get_current_context().exit(result.exit_code)


def finish_listing(command: str, payload: dict[str, Any], render: Callable[[dict[str, Any]], None]) -> None:
    if SETTINGS.json:
        emit_json(envelope(f"eaglectl.{command}/1", command, 0, **payload))
    elif SETTINGS.quiet:
        stdout.print(f"{command}: {sum(len(v) for v in payload.values() if isinstance(v, list))} listed")
    else:
        render(payload)


def failing_rules(result: Any) -> list[str]:
    """The rule ids that make a result fail: its error findings (and warnings under --strict), once each."""
    findings = getattr(result, "findings", None) or []
    strict = getattr(result, "strict", False)
    return list(dict.fromkeys(f.rule_id for f in findings
                              if f.severity == "error" or (strict and f.severity == "warning")))


def result_line(command: str, result: Any) -> str:
    """The one line -q prints: the result's own summary line (with the failing rule ids), else its verdict."""
    if hasattr(result, "summary_line"):
        rules = failing_rules(result) if result.exit_code else []
        return f"{command}: {result.summary_line()}" + (f" [{', '.join(rules)}]" if rules else "")
    verdict = {0: "ok"}.get(result.exit_code, f"exit {result.exit_code}")
    if command == "verify":
        verdict = {True: "PASS", False: "FAIL", None: "measured"}[result.passed]
    if command == "smoke":
        al = result.to_json().get("mean_acceptance_length")
        return f"smoke: AL {'-' if al is None else f'{al:.3f}'}; {verdict}"
    return f"{command}: {verdict}"


def timings() -> None:
    """-v: how long the command took and what it opened, loaded and ran (eaglectl/loads.py), on stderr."""
    if SETTINGS.verbose and not SETTINGS.json:
        import time

        from .loads import COUNTS

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

HEARTBEAT_S = 30.0  # off a terminal (CI logs): a progress line on stderr at least this often


def progress_enabled() -> bool:
    """On a terminal, unless --json or -q; NO_COLOR removes colour only (it is not "no progress")."""
    return not SETTINGS.json and not SETTINGS.quiet and stderr.is_terminal


def progress(items: Iterable[T], *, label: str, total: int | None = None, weight: Callable[[T], int] | None = None,
             unit: str | None = None) -> Iterator[T]:
    """Wrap an iterable in a transient progress bar on stderr when a human watches it. Off a terminal (a CI
    log), a measurement is not silent either: one plain line on stderr once it has run HEARTBEAT_S, then at
    least every HEARTBEAT_S (never with --json or -q, where stderr carries errors only).

    `weight(item)` advances the bar by that amount (bytes with unit "B", tokens, ...) instead of 1.
    """
    if not progress_enabled():
        yield from items if SETTINGS.json or SETTINGS.quiet else _heartbeat(items, label, total, weight)
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


def _heartbeat(items: Iterable[T], label: str, total: int | None, weight: Callable[[T], int] | None
               ) -> Iterator[T]:
    """Pass `items` through; a daemon thread prints how far they got every HEARTBEAT_S until they end."""
    import threading
    import time

    started, done, stop = time.monotonic(), [0], threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            took = time.monotonic() - started
            eta = f", about {took / done[0] * (total - done[0]):.0f} s left" if total and done[0] else ""
            stderr.print(f"{safe(label)}: {done[0]}" + (f" of {total}" if total else "") + f" after {took:.0f} s{eta}")

    thread = threading.Thread(target=beat, name="eaglectl-heartbeat", daemon=True)
    thread.start()
    try:
        for item in items:
            yield item
            done[0] += weight(item) if weight else 1
    finally:
        stop.set()


PROSE = ("message", "meaning", "fix", "what was checked", "result", "reason", "name", "flags it records",
         "per position")  # columns that may wrap (at spaces)


def table(title: str | None, columns: list[str], rows: Iterable[Iterable[Any]],
          style: dict[str, Callable[[str], str | None]] | None = None) -> str:
    """A table as markup lines no wider than the console where it can be; identifiers never broken
    (eaglectl/layout.py)."""
    from .layout import grid

    lines = grid(columns, [list(r) for r in rows], width=stdout.width, prose=PROSE, style=style,
                 title=title.strip() if title else None)
    return ("\n" if title and title.startswith("\n") else "") + "\n".join(lines)


def severity_style(text: str) -> str | None:
    return SEVERITY_STYLE.get(text)


def status_style(text: str) -> str | None:
    return STATUS_STYLE.get(text)


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def render_inspect(report: Any) -> None:
    """Human view of an InspectReport: the verdict first, then findings and the serve line; the spec
    table and the detection evidence with -v (all of it in --json)."""
    from .layout import short_path

    d, spec, out = report.drafter, report.spec, stdout
    s = report.summary
    out.print(f"[bold]{safe(short_path(d.source))}[/]")
    out.print(f"dialect  [bold]{d.dialect.name}[/] ({safe(d.dialect.title)})" + ("  [dim](--from)[/]" if d.forced else ""))
    if SETTINGS.verbose:
        for line in d.evidence:
            say("  [dim]-[/] ", line, style="dim")
    mine = next((x.score for x in d.detections if x.dialect == d.dialect.name), 0) or 0
    for x in d.detections:
        if x.dialect != d.dialect.name and x.score is not None:
            out.print(f"  [dim]also fits {x.dialect} (score {x.score:g} vs {mine:g})[/]")
    out.print(f"EAGLE    [bold]{spec.eagle_version}[/]   arch {spec.arch}")
    from .inspection import tensor_summary

    t = tensor_summary(d)
    dtypes = [f"{k}×{v}" for k, v in t["dtypes"].items()]
    say("tensors  ", items=[f"{t['count']} in {t['files']} file(s)", f"{t['parameters']:,} parameters",
                            human_size(t["bytes"]), *(["dtypes " + ", ".join(dtypes)] if dtypes else [])])
    for f in report.findings:
        if f.rule_id == "scanned":  # --scan confirms what it read
            say("scan     ", f.message)
    if report.target:
        tg = report.target.summary()
        say("target   ", items=[f"{short_path(tg['source'])}: {shown(tg.get('num_hidden_layers'))} layers",
                                f"hidden {shown(tg.get('hidden_size'))}", f"vocab {shown(tg.get('vocab_size'))}"])
        if report.measured is None and report.measured_note:  # a fix that measures cannot work with this target
            say("measured ", f"nothing: {report.measured_note}")
    if report.readings is not None:  # what each vLLM runner reads (V1: CPU; V2: GPU default)
        from .runners import describe

        from .runners import scope_note

        for i, line in enumerate(describe(report.readings)):
            say("vLLM     " if i == 0 else "         ", line)
        note = scope_note(report.readings, report.engine_version, with_note=False)
        if note:
            say("         ", note, style="dim")
    verdict = "[bold red]FAIL[/]" if report.exit_code else "[bold green]OK[/]"
    out.print(f"{verdict}  {s['error']} error(s), {s['warning']} warning(s), {s['info']} info"
              + ("  (--strict: warnings fail)" if report.strict else ""))
    rec = report.recommendation()
    if rec:
        out.print(f"{'for vLLM' if report.for_engine == 'vllm' else 'for sglang'}: {safe(rec)}", soft_wrap=True)
    findings(report.findings)
    out.print()
    serve = report.serve_command()
    if serve is not None:
        out.print("vLLM:")
        out.print(f"  {safe(serve)}", soft_wrap=True)
    elif report.wrong_layers() and report.for_engine == "vllm":
        ids = sorted({w.split(":", 1)[0] for w in report.wrong_layers()})
        say("vLLM: ", f"no serve command: vLLM would serve the drafter on other target layers than it reads "
            f"({', '.join(ids)}); run first:", indent=2)
        fix = report.serve_fix()
        if fix:
            out.print(f"  {safe(fix)}", soft_wrap=True)
    elif report.for_engine != "vllm":
        out.print(f"no vLLM serve command (--for {report.for_engine})")
    else:
        out.print("vLLM: no serve command until the errors above are fixed")
    if not SETTINGS.verbose:
        out.print("[dim]spec fields and where each was read: eaglectl inspect -v (or --json)[/]")
        return
    fields = ["hidden_size", "target_hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "num_hidden_layers", "vocab_size", "draft_vocab_size", "aux_layer_ids",
              "aux_convention", "num_aux_hidden_states", "rms_norm_eps", "rope_theta", "rope_scaling",
              "max_position_embeddings", "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
              "has_embed_tokens", "has_lm_head", "tie_word_embeddings", "config_dtype"]
    rows = [(f, getattr(spec, f), spec.sources.get(f, "weights" if f.startswith("has_") else "")) for f in fields]
    if spec.aux_layer_ids is not None and spec.aux_convention == "output":
        rows.insert(10, ("aux ids (vLLM)", spec.aux_layer_ids_vllm, "derived: output-of-layer id + 1"))
    out.print()
    out.print(table("spec", ["field", "value", "source"], rows))


def shown(value: Any) -> str:
    """A value in human output: an absent one is "-", never "None"."""
    return "-" if value is None else str(value)


def findings(found: list[Any], *, hide_info: bool | None = None) -> None:
    """The findings table (info findings only with -v: a line says how many were left out) and the fixes,
    each command in them whole on one line (eaglectl/layout.py)."""
    hide = (not SETTINGS.verbose) if hide_info is None else hide_info
    shown_ = [f for f in found if not (hide and f.severity == "info")]
    hidden = len(found) - len(shown_)
    if shown_:
        stdout.print()
        stdout.print(table("findings", ["severity", "rule", "where", "message"],
                           ((f.severity, f.rule_id, f.locator or "", f.message) for f in shown_),
                           style={"severity": severity_style}))
        hints = {f.rule_id: f.hint for f in shown_ if f.hint}  # commands filled in per finding
        if hints:
            stdout.print(table("fixes", ["rule", "fix"], hints.items()))
    if hidden:
        stdout.print(f"[dim]{hidden} info finding(s) not shown: -v shows them (or --json)[/]")


def _num(x: float | None, fmt: str = ".2e") -> str:
    return "-" if x is None else format(x, fmt)


def _steps(steps: list[int]) -> str:
    """'step 0', 'steps 1-2', 'steps 0, 2'."""
    if not steps:
        return ""
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}-{steps[-1]}"
    return "steps " + ", ".join(map(str, steps))


def render_verify(report: Any) -> None:
    """Human view of a ParityReport."""
    out = stdout
    c, r = report.candidate, report.reference
    out.print(f"[bold]verify[/] ({report.mode})")
    from .layout import short_path

    for label, side in (("candidate", c), ("reference", r)):
        say(f"{label}  ", items=[short_path(side["source"]), f"({side['dialect']}, EAGLE {side['eagle_version']},",
                                 f"{side['dtype']} on {side['device']})"], indent=11, sep=" ")
    say("inputs     ", f"{report.inputs}; {report.tokens} anchors x {report.steps} steps, teacher-forced")
    warm = report.warm_start
    if report.regime == "upgrade" and warm is not None:
        added = [k for k in report.differing_tensors if k.startswith("fc_norm.")]
        rewritten = [k for k in report.differing_tensors if k not in added]
        say("tensors    ", f"{len(added)} added by the upgrade ({', '.join(added[:5])})"
            + (f", {', '.join(rewritten)} rewritten by it" if rewritten else "") + "; every carried tensor identical")
        did = ", ".join(warm.steps) or "an upgrade"
        say("upgrade    ", f"warm start ({did}" + (f", fc_norm init {warm.init}" if warm.init else "")
            + "), not function-preserving by design; "
            + (f"{len(warm.digests_checked)} written tensor(s) checked against its provenance"
               if warm.digests_checked else "no provenance digests to check the written tensors against"))
        for problem in warm.problems:
            say("           [bold red]FAIL[/] ", problem, indent=11)
        judged = _steps(warm.judged)
        say("judged     ", (f"{judged}" if judged else "no step") + (f"; {_steps(warm.reported)} reported" if
                                                                     warm.reported else "") + f": {warm.why}")
    elif report.differing_tensors:
        say(f"tensors    {len(report.differing_tensors)} differ: ", items=list(report.differing_tensors[:5]), indent=11)
    else:
        out.print("tensors    identical")
    if warm is not None:
        say("tolerance  upgrade: ", items=[f"step {j} KL mean <= {k:.3g}, top-1 >= {100 * t:.1f}%"
                                           for j, (k, t) in sorted(warm.bounds.items())] or ["none"], indent=11)
    elif report.regime:
        say(f"tolerance  {report.regime}: ", items=[f"{k} {v:g}" for k, v in report.tolerances.items()], indent=11)
    else:
        out.print("tolerance  none: fidelity is a measurement")
    rows = []
    for m in report.metrics:
        verdict = {True: "pass", False: "FAIL", None: "reported" if warm is not None else "-"}[m.passed]
        rows.append((str(m.step), _num(m.logits_max_abs, ".1e"), _num(m.state_max_abs, ".1e"),
                     f"{m.state_cos_min:.6f}", _num(m.kl_mean, ".1e"), _num(m.kl_max, ".1e"),
                     f"{100 * m.top1_agreement:.1f}%/{m.top1_rows}", str(m.near_ties), verdict))
    out.print(table(None, ["step", "logit Δ", "state Δ", "cos min", "KL mean", "KL max", "top-1", "ties", ""], rows,
                    style={"": {"pass": "green", "FAIL": "bold red"}.get}))
    if report.passed is None:
        out.print("\nfidelity measured (no pass/fail)")
    else:
        out.print("\n" + ("[bold green]PASS[/]" if report.passed else "[bold red]FAIL[/]"))


def render_conversion(result: Any) -> None:
    """Human view of a ConversionResult (the plan, and what the check established)."""
    from .layout import short_path

    plan, out = result.plan, stdout
    verb = "plan (dry run: nothing written)" if not result.written else "converted"
    say(f"[bold]{verb}[/]  ", items=[f"{short_path(plan.source)} ({plan.source_dialect}) ->",
                                     f"{short_path(plan.dest)} ({plan.dest_dialect})"], indent=2, sep=" ")
    rows = []
    for a in plan.tensors:
        src = a.source if a.source and a.source != a.dest else ("" if a.source else a.note)
        rows.append((a.dest, a.action, a.dtype, list(a.shape), src or ""))  # layout formats lists
    # a tensor's origin is a name or a note in words: "reason" wraps, names stay whole
    out.print(table(None, ["tensor", "action", "dtype", "shape", "reason" if any(
        a.source is None and a.note for a in plan.tensors) else "from"], rows))
    for name, why in plan.dropped:
        say(f"  [yellow]drop[/] {safe(name)}: ", why, indent=4)
    render_config_changes(plan.config_changes)
    out.print(f"files: {', '.join(plan.file_names())}")
    for note in plan.notes:
        say("[yellow]note:[/] ", note, indent=2)
    for warning in plan.warnings:
        say("[yellow]warning:[/] ", warning, indent=2)
    for check in result.checked:
        say("[green]checked[/] ", check, indent=2)
    serve = getattr(result, "serve", None)
    if serve:
        say(f"[bold]for {serve['engine']}:[/] {serve['dialect']} ", f"({serve['why']})")
        for c in serve["candidates"]:
            if "refused" in c:
                say(f"  not {c['dialect']}: ", c["refused"], indent=4)
        out.print(("serve it with:" if result.written else "once written, serve it with:"))
        click.echo(serve["command"])  # unwrapped: a command to copy


def render_config_changes(changes: list[dict[str, Any]]) -> None:
    """Key-level config changes (convert.py `_diff`): keys that only changed place are one line per move
    ("moved into transformer_layer_config: hidden_size, ..."), every other change one line with its value."""
    from collections import defaultdict

    stdout.print("config:")
    shown = [c for c in changes if not c["key"].startswith("eaglectl_provenance")]  # provenance: its own record
    moves: dict[tuple[str, str], list[str]] = defaultdict(list)
    for c in shown:
        if c["change"] == "moved" and "old" not in c:
            leaf = c["key"].rsplit(".", 1)[-1]
            moves[(c["from"][: -len(leaf)].rstrip("."), c["key"][: -len(leaf)].rstrip("."))].append(leaf)
    for (frm, to), keys in moves.items():
        where = f"into {to}" if to else f"out of {frm}"
        say(f"  > moved {safe(where)}: ", items=keys, indent=4)
    for c in shown:
        new, old = json_short(c.get("new")), json_short(c.get("old"))
        if c["change"] == "moved":
            if "old" in c:
                say("  > ", f"{c['from']} -> {c['key']}: {old} -> {new}", indent=4)
            continue
        line = {"added": f"+ {c['key']} = {new}", "removed": f"- {c['key']} (was {old})",
                "changed": f"~ {c['key']}: {old} -> {new}"}[c["change"]]
        say("  ", line, indent=4)


def json_short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_upgrade(result: Any) -> None:
    out = stdout
    render_conversion(result.conversion)
    out.print()
    if result.changed:
        out.print(f"[bold]upgrade[/]: {', '.join(result.steps)}" + (f" (fc_norm init: {result.init})" if result.init else ""))
    for note in result.notes:
        say("[yellow]note:[/] ", note, indent=2)
    stats = result.statistics
    if stats:
        say("calibration: ", f"{stats['tokens']} tokens of {stats['text_source']} through {stats['target']}, "
            f"aux ids {stats['aux_ids_vllm']} (sink excluded)", indent=2)
        out.print("  chunk RMS mean " + ", ".join(f"{x:.3g}" for x in stats["rms_mean"])
                  + "; harmonic " + ", ".join(f"{x:.3g}" for x in stats["rms_harmonic_mean"]))
        if "fc_output_relative_error" in stats:
            out.print(f"  FC output relative error: {stats['fc_output_relative_error']:.4f} "
                      f"(fc_norm = 1 would give {stats['fc_output_relative_error_ones']:.4f})")
    if result.fit:
        f = result.fit
        out.print(f"fit: from {f['start']}, {f['parameters']:,} parameters ({'fc_norm and fc' if f['fit_fc'] else 'fc_norm'})"
                  f", {f['steps']} steps (kept step {f['best_step']}), {f['tokens']:,} anchors (+{f['heldout_tokens']:,} "
                  f"held out), held-out loss {f['heldout_loss_before']:.4f} -> {f['heldout_loss_after']:.4f} "
                  f"(gain {f['heldout_gain']:.4f}), {f['seconds']:.1f} s")
    if result.init_candidates:
        by_loop = "acceptance_kept" in result.init_candidates[0]
        where = safe(result.acceptance["prompts"]["description"]) if result.acceptance else "held-out prompts"
        out.print("fc_norm inits, ranked by " + (f"the reference loop's acceptance kept on {where}" if by_loop
                                                  else "FC-output error on held-out requests of the capture") + ":")
        out.print(table(None, ["init", "acceptance kept" if by_loop else "held-out FC error"], [
            (c["init"], f"{100 * c['acceptance_kept']:.1f}%" if by_loop else f"{c['heldout_fc_output_relative_error']:.4f}")
            for c in result.init_candidates]))
    if result.fidelity is not None:
        say("fidelity to the source ", f"({result.fidelity.inputs}):", indent=2)
        out.print(table(None, ["step", "top-1 agreement", "near ties", "KL mean", "KL max"], [
            (str(m.step), f"{100 * m.top1_agreement:.1f}% of {m.top1_rows}", str(m.near_ties), f"{m.kl_mean:.3g}",
             f"{m.kl_max:.3g}") for m in result.fidelity.metrics]))
    _upgrade_ending(result)


def _upgrade_ending(result: Any) -> None:
    """The last lines of every upgrade: AL before -> after and on which prompts, that it is a warm start, and
    the command to run next."""
    out = stdout
    out.print()
    acc = result.acceptance
    if acc is not None:
        p = acc["prompts"]
        kept = f" ({100 * acc['kept']:.1f}% kept)" if acc.get("kept") is not None else ""
        out.print(f"[bold]acceptance length[/] {acc['before']:.3f} -> {acc['after']:.3f}{kept}, k={p['k']}, "
                  f"{p['count']} prompts x {p['max_tokens']} tokens: {safe(p['description'])}"
                  + (f" ({safe(p['source'])})" if p["given"] else "") + f"; {safe(acc['reading_description'])}, "
                  f"boundaries {acc['source_boundary_ids']} -> {acc['dest_boundary_ids']}")
        if acc.get("interval"):
            i = acc["interval"]
            out.print(f"  95% bootstrap interval over these prompts: before {i['before'][0]:.3f}-{i['before'][1]:.3f}, "
                      f"after {i['after'][0]:.3f}-{i['after'][1]:.3f}, kept {100 * i['kept'][0]:.1f}-"
                      f"{100 * i['kept'][1]:.1f}%; pass --prompts FILE for the figure vLLM prints on yours")
        else:
            out.print("  this is the figure vLLM prints on these prompts (greedy, fp32; the reference loop's counts "
                      "equal vLLM's)")
    elif result.changed:
        out.print("acceptance length: not measured (that needs a runnable --target: weights and a tokenizer)")
    if result.changed:
        out.print(f"[yellow]{safe(result.to_json()['warm_start'])}[/]")
    if not result.conversion.written:
        out.print("dry run: nothing written; run again without --dry-run")
    elif result.next_command:
        out.print("next:")
        click.echo(f"  {result.next_command}")  # unwrapped: a command to copy


def _bar(value: float, width: int = 30) -> str:
    full = max(0, min(width, round(value * width)))
    return "█" * full + "·" * (width - full)


def _config_label(name: str) -> str:
    """`eagle3:/work/x/fixtures/trained/eagle3.1` → `eagle3:fixtures/trained/eagle3.1`: a baseline is named
    by its path as the user gave it (short_path), so two drafters of one name stay apart."""
    from .layout import short_path

    kind, sep, path = name.partition(":")
    return f"{kind}:{short_path(path)}" if sep and path else name


def render_smoke(rep: Any) -> None:
    from .layout import short_path

    out = stdout
    doc = rep.to_json()
    say(f"[bold]smoke[/] ({rep.engine})  ", items=[f"{short_path(rep.drafter)} on {short_path(rep.target)}",
                                                   f"k={rep.k}", rep.dtype, doc["prompts"]["description"],
                                                   f"{rep.max_tokens} new tokens", "greedy"], indent=2)
    v = doc["versions"]
    say("versions: ", items=[f"{k} {v[k]}" for k in v if v[k] is not None], indent=2)
    al = doc.get("mean_acceptance_length")
    if al is not None:  # the one headline figure; the other conventions are named after it
        per_request = doc.get("mean_acceptance_length_per_request")
        say(f"[bold]AL {al:.3f}[/]  ", "mean acceptance length: tokens per target step, the bonus token included "
            f"(vLLM's metric); without it (accepted draft length, SpecForge's) {al - 1:.3f}"
            + (f"; averaged per request (SPEED-Bench's) {per_request:.3f}" if per_request is not None else ""),
            indent=2)
    rows, skipped = [], []
    for r in [doc, *doc["baselines"]]:
        name = "drafter" if r is doc else _config_label(r["name"])
        if r.get("skipped"):  # below the table: a reason is prose, the table stays narrow
            skipped.append((name, r["skipped"]))
            rows.append((name, "skipped", "", "", "", "", ""))
            continue
        al = r.get("mean_acceptance_length")
        rows.append((name, "-" if al is None else f"{al:.3f}",
                     "-" if al is None else f"{al - 1:.3f}",
                     "-" if r.get("draft_acceptance_rate") is None else f"{100 * r['draft_acceptance_rate']:.1f}%",
                     " / ".join(f"{x:.2f}" for x in r.get("per_position_acceptance") or []) or "-",
                     "-" if r.get("num_drafts") is None else str(r["num_drafts"]),
                     "-" if r.get("greedy_match") is None else f"{100 * r['greedy_match']:.0f}%"))
    out.print(table(None, ["config", "AL", "accepted", "rate", "per position", "drafts", "=no-spec"], rows))
    if skipped:
        out.print(table(None, ["config", "reason"], skipped))
    for key, label in (("by_context_length", "context tokens"), ("by_category", "category")):
        configs = [("drafter", doc)] + [(_config_label(b["name"]), b) for b in doc["baselines"] if b.get(key)]
        if doc.get(key):
            rows = [(name, r.get("bucket") or r.get("context_length") if key == "by_context_length" else r["category"],
                     r["requests"], _num(r["mean_acceptance_length"], ".3f"),
                     _num(r["mean_acceptance_length_per_request"], ".3f"),
                     " / ".join(f"{p:.2f}" for p in r["per_position_acceptance"]) or "-")
                    for name, c in configs for r in c[key]]
            out.print(table(f"\nacceptance by {label}", ["config", label, "requests", "AL pooled", "AL per request",
                                                          "per position"], rows))
    per = doc.get("per_position_acceptance") or []
    if per:
        out.print("\nper-position acceptance (drafter):")
        for i, rate in enumerate(per):
            out.print(f"  {i + 1:2d} {_bar(rate)} {100 * rate:5.1f}%")
    if doc["speedup"]:
        out.print("\nspeedup over no speculation (per-user output tokens/s, 1/TPOT: time to first token excluded):")
        conc = sorted({s["concurrency"] for s in doc["speedup"]})
        configs = list(dict.fromkeys(s["config"] for s in doc["speedup"]))
        rows = [(_config_label(c), *(f"{next(s['speedup'] for s in doc['speedup'] if s['config'] == c and s['concurrency'] == n):.2f}x"
                      for n in conc)) for c in configs]
        out.print(table(None, ["config", *(f"c={n}" for n in conc)], rows))
    _render_runners(rep, doc)
    for flag in rep.red_flags:
        say("[bold red]red flag:[/] ", flag, indent=2)
    if rep.log:
        out.print(f"[dim]vLLM log: {safe(rep.log)}[/]")
    if rep.plot:
        out.print(f"plot: {safe(rep.plot)}")


def _render_runners(rep: Any, doc: dict[str, Any]) -> None:
    """smoke: one line per vLLM runner measured (shown when more than one, one asked for, or V2 emulated),
    and the serving options a user overrode."""
    runs = doc.get("runners") or []
    if runs and (len(runs) > 1 or rep.runner is not None or any(r["emulated"] for r in runs)):
        stdout.print("\nvLLM runners measured:")
        for r in runs:
            al = r.get("mean_acceptance_length")
            extra = [f"not run: {r['skipped']}" if r.get("skipped") else f"AL {'-' if al is None else f'{al:.3f}'}"]
            if r.get("aux_log_line"):
                extra.append(f"vLLM: {r['aux_log_line']}")
            extra += r.get("notes") or []
            say(f"  {r['runner']}: ", f"{r['label']}; " + "; ".join(extra), indent=6)
    layers = doc.get("reference_layers")
    if layers and layers.get("from"):
        say("reference layers: ", f"{layers['from']}; flags {layers['flags']}", indent=2)
    serving = doc.get("serving_options") or {}
    if serving.get("overridden"):
        items = [f"{key}={serving['speculative'][key]['value']}" for key in serving["overridden"]]
        say("[yellow]serving options overridden:[/] ", ", ".join(items) + " (acceptance is not comparable with a "
            "standard run)", indent=2)


STATUS_STYLE = {"pass": "green", "fail": "bold red", "skipped": "yellow"}


def render_check(rep: Any) -> None:
    out = stdout
    from .layout import short_path

    out.print(f"[bold]check[/]  {safe(short_path(rep.source))}")
    out.print(table(None, ["stage", "status", "s", "what was checked"],
                    ((s.name, s.status, f"{s.seconds:.1f}", s.detail) for s in rep.stages),
                    style={"status": status_style}))
    findings(rep.findings)
    if rep.card_written:
        say("card written: ", short_path(rep.card_written))
    if rep.config_written:
        say("verifier named in: ", short_path(rep.config_written))
    out.print("\n" + ("[bold green]PASS[/]" if rep.exit_code == 0 else "[bold red]FAIL[/]"))


def render_upload(rep: Any) -> None:
    """The gate's report, then the commit: its operations, where it goes, and what happened."""
    render_check(rep.gate)
    rows = rep.operation_rows()
    where = rep.repo_id + (f" (branch {rep.revision})" if rep.revision else "") + (
        ", as a pull request" if rep.create_pr else "") + (", private if created" if rep.private else "")
    stdout.print()
    say("[bold]upload[/]  ", f"{len(rows)} file(s) to {where}")
    stdout.print(table(None, ["operation", "path_in_repo", "size", "sha256"],
                       ((r["operation"], r["path_in_repo"], human_size(r["size"]), r["sha256"][:12]) for r in rows)))
    say("commit: ", rep.commit_message, indent=2)
    if rep.refused:
        say("[bold red]not uploaded:[/] ", rep.refused, indent=2)
    elif rep.dry_run:
        stdout.print("[yellow]dry run: nothing was sent[/]")
    else:
        say("[bold green]uploaded:[/] ", rep.pr_url or rep.commit_url, indent=2)


def render_batch(command: str, result: Any) -> None:
    out = stdout
    from .layout import short_path

    out.print(table(f"{command}: {len(result.rows)} item(s)", ["source", "dest", "exit", "result"],
                    ((short_path(r["source"]), short_path(r.get("dest", "")), r["exit_code"], r["summary_line"])
                     for r in result.rows)))
    ok = sum(r["exit_code"] == 0 for r in result.rows)
    out.print(f"\n{ok} ok, {len(result.rows) - ok} failed; exit {result.exit_code}")


def render_formats(payload: dict[str, Any]) -> None:
    rows = payload["dialects"]
    stdout.print(table(None, ["id", "name", "aux-id convention", "flags it records"], [
        (r["id"], r["title"], r["aux_convention"] + ("" if r["aux_ids_paths"] else " (ids not stored)"),
         ", ".join(r["flag_fields"]) or "none") for r in rows]))
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
    stdout.print(table(None, ["rule", "severity", "meaning", "fix"],
                       ((r["rule_id"], r["severity"], r["title"], r["hint"]) for r in rules)))


def render_capture(result: Any) -> None:
    if result.recipe is not None:
        stdout.print(escape(result.recipe), soft_wrap=True, highlight=False)
        return
    meta = result.meta
    versions = ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items() if v and k != "python")
    say("[bold]capture[/]: ", f"{result.requests} requests, {result.tokens} tokens of "
        f"{meta['prompts']['description']}", indent=2)
    say("  ", f"boundaries {list(result.layer_ids)} (vLLM's numbering; 0 = embeddings, "
        f"{meta['target_config'].get('num_hidden_layers', 'L')} = last layer before the final norm)", indent=4)
    rate = f" ({result.tokens / result.seconds:,.0f} tokens/s)" if result.seconds else ""
    say("  ", f"engine {result.engine}, states stored as {meta['dtype']} ({versions}): {result.seconds:.1f} s{rate}",
        indent=4)
    say("  ", f"wrote {result.out} (one safetensors per request + capture.json); use it with --states {result.out}",
        indent=4)
    if result.log:
        stdout.print(f"  [dim]vLLM log: {safe(result.log)}[/]")


def _short_names(paths: list[str]) -> list[str]:
    import os

    base = [os.path.basename(os.path.normpath(p)) or p for p in paths]
    return base if len(set(base)) == len(set(paths)) else paths


def render_drift(rep: Any) -> None:
    out = stdout
    doc = rep.to_json()
    source = f"target {doc['target']}" if doc["target"] else f"capture {doc['states']}"
    say(f"[bold]drift[/] ({doc['protocol']})  ", items=[source, f"depth {doc['depth']}",
        f"sink = first {doc['sink_tokens']} token(s)", f"recent = last {doc['recent_window']} context positions",
        f"an anchor every {doc['anchor_every']} answer tokens"], indent=2)
    say("", doc["protocol_note"], style="dim")
    runs = doc["runs"]
    names = dict(zip(dict.fromkeys(r["drafter"] for r in runs), _short_names(list(dict.fromkeys(
        r["drafter"] for r in runs))), strict=True))
    conditions = list(dict.fromkeys((r["context_length"], r["template"]) for r in runs))
    for length, template in conditions:
        group = [r for r in runs if (r["context_length"], r["template"]) == (length, template)]
        what = (f"context {length} tokens" if length else f"template {template}" if template
                else f"{group[0]['prompts']} prompts")
        rows = []
        for d in range(doc["depth"]):
            cells = []
            for r in group:
                x = r["depths"][d]
                cells.append(" ".join(_num(x[m], ".3f") for m in ("sink_mass", "self_mass", "recent_mass"))
                             + f"  {_num(x['state_rms'], '.2f')}")
            rows.append((d, *cells))
        out.print(table(f"\n{what}: sink self recent (attention mass)  state RMS, by draft depth", ["depth",
                        *(safe(names[r["drafter"]]) for r in group)], rows))
        als = [(safe(names[r["drafter"]]), _num(r["mean_acceptance_length"], ".3f"),
                _num(r["mean_acceptance_length_per_request"], ".3f"),
                " / ".join(_num(p, ".2f") for p in r["per_position_acceptance"] or []) or "-",
                " ".join(_num(x, ".2f") for x in r["aux_chunk_rms"])) for r in group]
        out.print(table(None, ["drafter", "AL pooled", "AL per request", "per position", "aux RMS"], als))
    if doc["acceptance_note"]:
        say("", doc["acceptance_note"], style="dim")
    for r in runs:
        for note in r["notes"]:
            say("", f"{names[r['drafter']]}: {note}", style="dim", indent=2)
        if r["chains_cut"]:
            out.print(f"[yellow]{safe(names[r['drafter']])}: {r['chains_cut']} chains stopped at a token "
                      "without an embedding row[/]")
    if doc["plot"]:
        out.print(f"plot: {safe(doc['plot'])}")


def render_diff(rep: Any) -> None:
    out, doc = stdout, rep.to_json()
    for side in ("a", "b"):
        say(f"[bold]{side.upper()}[/] ", items=[doc[side]["source"], f"({doc[side]['dialect']}, EAGLE "
                                                f"{doc[side]['eagle_version']})"], indent=2, sep=" ")
    for f in doc["spec"]:
        say(f"  spec {f['field']}: ", f"{json_short(f['a'])} -> {json_short(f['b'])}", indent=4)
    for side in ("a", "b"):
        for name in doc[f"only_in_{side}"]:
            out.print(f"  only in {side.upper()}: {safe(name)}")
    for d in doc["derived_only"]:
        out.print(f"  [dim]only in {d['in'].upper()}: {safe(d['name'])} (derived from {d['derived_from']}, "
                  "which is equal)[/]")
    for t in doc["tensors"]:
        parts = []
        if "dtype" in t["differs"]:
            parts.append(f"dtype {t['a']['dtype']} -> {t['b']['dtype']}")
        if "shape" in t["differs"]:
            parts.append(f"shape {t['a']['shape']} -> {t['b']['shape']}")
        if "values" in t["differs"]:
            worst = t.get("max_abs_diff")
            parts.append("values: NaN on one side" if worst is None else f"values: max |A-B| {worst:.6g}")
        out.print(f"  tensor {safe(t['name'])}: {'; '.join(parts)}")
    verdict = "[bold green]EQUIVALENT[/]" if doc["equivalent"] else "[bold red]DIFFERENT[/]"
    out.print(f"\n{verdict}  {safe(rep.summary_line())}")


RENDERERS: dict[str, Callable[[Any], None]] = {
    "inspect": render_inspect, "verify": render_verify, "convert": render_conversion, "upgrade": render_upgrade,
    "smoke": render_smoke, "check": render_check, "capture": render_capture, "drift": render_drift,
    "diff": render_diff, "upload": render_upload,
}
