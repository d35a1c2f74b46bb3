"""The command line: the group, its error funnel and `main`; the commands themselves are the command table
(`table.py`). torch is never imported here; a command's library module is imported when the command runs.

One error funnel (`EaglectlGroup.invoke`): eaglectl's own errors are one line and their exit code;
an OSError naming a path is a filesystem error (15); Ctrl-C is 130, SIGTERM 143; anything else is
a bug (70, with a traceback under --debug / EAGLECTL_DEBUG=1).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from click.shell_completion import get_completion_class

from .. import __version__, threads
from ..errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    SPECIFIC_EXIT_CODES,
    EaglectlError,
    filesystem_error,
)
from ..rules import explain
from . import params as params
from . import report, table
from .docs_data import dialect_rows, family_rows
from .interrupts import install

# Workflow order for `eaglectl --help` (Click would sort alphabetically).
COMMAND_ORDER = ("inspect", "convert", "upgrade", "verify", "diff", "smoke", "check", "upload", "capture", "drift",
                 "formats", "rules", "completion")


class EaglectlGroup(click.Group):
    """Turns library errors into one line + exit code, and bugs into exit 70."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.commands, key=lambda c: COMMAND_ORDER.index(c) if c in COMMAND_ORDER else len(COMMAND_ORDER))

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        argv = list(args)
        report.SETTINGS.command = next((a for a in argv if a in self.commands), None)
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as e:
            _usage_error(e, argv)
            raise
        ctx.meta["eaglectl.argv"] = argv
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        argv = ctx.meta.get("eaglectl.argv", [])  # the command was named from it in make_context
        try:
            return super().invoke(ctx)
        except click.ClickException as e:
            _usage_error(e, argv)
            raise
        except EaglectlError as e:
            report.error(e)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            report.interrupted("interrupted (Ctrl-C); no output was left behind", EXIT_INTERRUPTED)
            ctx.exit(EXIT_INTERRUPTED)
        except SystemExit as e:
            if e.code == EXIT_TERMINATED:  # SIGTERM inside a write (io/atomic.py) or from main's handler
                report.interrupted("terminated (SIGTERM); no output was left behind", EXIT_TERMINATED)
            raise
        except (click.exceptions.Exit, click.Abort):
            raise
        except OSError as e:
            if e.filename is None or report.SETTINGS.debug:
                raise
            report.error(filesystem_error(e, "access"))
            ctx.exit(filesystem_error(e, "access").exit_code)
        except Exception as e:
            if report.SETTINGS.debug:
                raise
            report.internal_error(e)
            ctx.exit(EXIT_INTERNAL)


def _usage_error(exc: click.ClickException, argv: list[str]) -> None:
    """Click's usage errors print as eaglectl's own: `error[usage]: ...` and a hint (Click calls `show`;
    `eaglectl` alone still prints the help). With --json anywhere on the line, a usage error is also the
    JSON error document on stdout."""
    if "--json" in argv and not getattr(exc, "eaglectl_reported", False):
        exc.eaglectl_reported = True  # type: ignore[attr-defined]
        report.usage_error_json(exc, next((a for a in argv if a in cli.commands), None))
    if not report.is_help(exc):
        exc.show = lambda file=None: report.usage_error(exc)  # type: ignore[method-assign]


# ------------------------------------------------------------------------------------------ the group

@click.group(cls=EaglectlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="eaglectl")
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors (same as EAGLECTL_DEBUG=1).")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors and the one-line result (no tables, warnings, "
              "progress).")
@click.option("-v", "--verbose", is_flag=True, help="Print more: detection evidence, the spec table, timings on "
              "stderr.")
def cli(debug: bool, quiet: bool, verbose: bool) -> None:
    """Inspect, convert, upgrade, verify and smoke-test EAGLE-3 / EAGLE-3.1 drafters.

    Exit codes: 0 ok, 1 findings at error level (warnings too with --strict), 2 usage,
    {specific} specific failures (docs/errors.md), 70 internal error, 130 Ctrl-C, 143 SIGTERM.
    """
    if quiet and verbose:
        raise click.UsageError("give -q/--quiet or -v/--verbose, not both")
    report.SETTINGS.reset(debug=debug or bool(os.environ.get("EAGLECTL_DEBUG")), verbosity=verbose - quiet)
    threads.configure()  # torch's threads: OMP_NUM_THREADS, else the cores this process may use
    report.pulse.hold()  # off a terminal, a line on stderr at least every HEARTBEAT_S until the command ends
    click.get_current_context().call_on_close(report.pulse.release)


cli.help = (cli.help or "").format(specific=SPECIFIC_EXIT_CODES)  # the codes errors.py declares


# -------------------------------------------------------------------------------- the commands, in help order

for _command in table.COMMANDS:
    cli.add_command(_command)


@cli.command("formats", short_help="List the dialects and the drafter families eaglectl reads.")
@params.json_option
def formats_cmd() -> None:
    """List the dialects eaglectl reads, with their detection signals, and the drafter families beside EAGLE-3
    (DFlash, DSpark, P-EAGLE are read; the others are refused by name)."""

    report.finish_listing("formats", {"dialects": dialect_rows(), "families": family_rows()}, report.render_formats)


@cli.command("rules", short_help="List the inspect rules, or explain one: rules ID.")
@click.argument("rule_id", required=False)
@params.json_option
def rules_cmd(rule_id: str | None) -> None:
    """List every inspect rule with its severity and fix, or explain one: eaglectl rules RULE_ID."""

    report.finish_listing("rules", {"rules": [r.to_json() for r in explain(rule_id)]}, report.render_rules)


@cli.command("completion", short_help="Print the shell completion script.")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion_cmd(shell: str) -> None:
    """Print the completion script for SHELL, e.g. `eval "$(eaglectl completion bash)"`."""

    cls = get_completion_class(shell)
    assert cls is not None
    click.echo(cls(cli, {}, "eaglectl", "_EAGLECTL_COMPLETE").source())


# ------------------------------------------------------------------------------------------ main

params.complete_paths(cli)


def _terminated(signum: int, frame: object) -> None:
    report.interrupted("terminated (SIGTERM); no output was left behind", EXIT_TERMINATED)
    raise SystemExit(EXIT_TERMINATED)


def main() -> None:

    install(sigterm=_terminated)
    try:
        code = cli.main(prog_name="eaglectl", standalone_mode=False)  # returns ctx.exit's code
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        report.usage_error(e)
        sys.exit(e.exit_code)
    except (click.Abort, KeyboardInterrupt):
        report.interrupted("interrupted (Ctrl-C); no output was left behind", EXIT_INTERRUPTED)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)
