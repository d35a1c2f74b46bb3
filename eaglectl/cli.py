"""The command line. Each command parses options, calls one library function and hands the result
to `report`. torch is never imported here; heavy modules are imported inside command bodies."""

from __future__ import annotations

import os
from typing import Any

import click

from . import __version__, formats, report
from .errors import EXIT_INTERNAL, EaglectlError


class EaglectlGroup(click.Group):
    """Turns library errors into one line + exit code, and bugs into exit 70."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EaglectlError as e:
            report.error(e)
            ctx.exit(e.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit, KeyboardInterrupt):
            raise
        except Exception as e:
            if os.environ.get("EAGLECTL_DEBUG"):
                raise
            report.internal_error(e)
            ctx.exit(EXIT_INTERNAL)


def json_option(fn: Any) -> Any:
    def set_mode(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        report.MODE.json = value
        return value

    return click.option("--json", "as_json", is_flag=True, is_eager=True, callback=set_mode, expose_value=True,
                        help="Print one JSON document on stdout (schema id in 'schema').")(fn)


@click.group(cls=EaglectlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="eaglectl")
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors (same as EAGLECTL_DEBUG=1).")
def cli(debug: bool) -> None:
    """Inspect, convert, upgrade, verify and smoke-test EAGLE-3 / EAGLE-3.1 drafters.

    Exit codes: 0 ok, 1 findings at error level (warnings too with --strict), 2 usage,
    3-12 specific failures (see docs/errors.md), 70 internal error.
    """
    report.MODE.json = False
    if debug:
        os.environ["EAGLECTL_DEBUG"] = "1"


@cli.command("inspect", epilog="""\b
Examples:
  eaglectl inspect ./my-drafter
  eaglectl inspect yuhuili/EAGLE3-LLaMA3.1-Instruct-8B --target meta-llama/Llama-3.1-8B-Instruct
  eaglectl inspect hf://org/drafter@v2 --json --strict
""")
@click.argument("source")
@click.option("--target", metavar="TARGET", help="Target model folder or Hub id (config and a few rows only).")
@click.option("--from", "from_dialect", type=click.Choice(formats.names()), help="Dialect, when detection cannot tell.")
@click.option("--revision", metavar="REV", help="Hub revision (not with an id that pins one).")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option("--scan", is_flag=True, help="Stream every tensor and report NaN/Inf values.")
@click.option("--allow-pickle", is_flag=True, help="Read .bin weights with torch.load(weights_only=True).")
@json_option
def inspect_cmd(source: str, target: str | None, from_dialect: str | None, revision: str | None, strict: bool,
                scan: bool, allow_pickle: bool, as_json: bool) -> None:
    """Name the dialect of a drafter checkpoint and check everything the files can tell.

    SOURCE is a folder, a .safetensors file, a *.index.json, a .bin (with --allow-pickle) or a Hub
    repo (org/name, org/name@rev, hf://org/name@rev/subfolder). Only headers, config.json and
    small tensors (d2t, t2d) are read; --scan reads everything.
    """
    from .inspection import inspect_checkpoint

    result = inspect_checkpoint(source, target=target, from_dialect=from_dialect, strict=strict, scan=scan,
                                allow_pickle=allow_pickle, revision=revision, progress=report.progress)
    if as_json:
        report.emit_json(result.to_json())
    else:
        report.render_inspect(result)
    click.get_current_context().exit(result.exit_code)


@cli.command("formats")
@json_option
def formats_cmd(as_json: bool) -> None:
    """List the dialects eaglectl reads, with their detection signals."""
    from .docs_data import dialect_rows

    rows = dialect_rows()
    if as_json:
        report.emit_json({"schema": "eaglectl.formats/1", "dialects": rows})
        return
    report.stdout.print(report.table(None, ["id", "name", "aux-id convention", "flags it records"], [
        (r["id"], r["title"], r["aux_convention"] + ("" if r["aux_ids_paths"] else " (ids not stored)"),
         ", ".join(r["flag_fields"]) or "none") for r in rows]))
    report.stdout.print("\n[dim]detection signals and key renames: eaglectl formats --json, docs/formats.md[/]")


@cli.command("rules")
@json_option
def rules_cmd(as_json: bool) -> None:
    """List every inspect rule with its severity and fix."""
    from .rules import RULES

    if as_json:
        report.emit_json({"schema": "eaglectl.rules/1",
                          "rules": [{"id": r.id, "severity": r.severity, "title": r.title, "fix": r.fix}
                                    for r in RULES.values()]})
        return
    report.stdout.print(report.table(None, ["rule", "severity", "meaning", "fix"],
                                     ((r.id, r.severity, r.title, r.fix) for r in RULES.values())))


def main() -> None:
    cli(prog_name="eaglectl")
