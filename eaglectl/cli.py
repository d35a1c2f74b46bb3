"""The command line. Each command parses its options (validated here, at parse time), calls one
library function (`<command>.run`) and hands the result to `report.finish`. torch is never
imported here; heavy modules are imported inside command bodies.

One error funnel (`EaglectlGroup.invoke`): eaglectl's own errors are one line and their exit code;
an OSError naming a path is a filesystem error (15); Ctrl-C is 130, SIGTERM 143; anything else is
a bug (70, with a traceback under --debug / EAGLECTL_DEBUG=1).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from . import __version__, formats, report, threads
from .drift import DEFAULT_SYSTEM, PROTOCOLS
from .errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EaglectlError,
    ManifestError,
    UsageError,
    filesystem_error,
)
from .workload import TEMPLATES

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
            _usage_json(e, argv)
            _own_style(e)
            raise
        ctx.meta["eaglectl.argv"] = argv
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        argv = ctx.meta.get("eaglectl.argv", [])
        report.SETTINGS.command = next((a for a in argv if a in self.commands), None)
        try:
            return super().invoke(ctx)
        except click.ClickException as e:
            _usage_json(e, argv)
            _own_style(e)
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


def _own_style(exc: click.ClickException) -> None:
    """Click's usage errors print as eaglectl's own: `error[usage]: ...` and a hint (Click calls `show`).
    `eaglectl` alone still prints the help."""
    if not report.is_help(exc):
        exc.show = lambda file=None: report.usage_error(exc)  # type: ignore[method-assign]


def _usage_json(exc: click.ClickException, argv: list[str]) -> None:
    """With --json anywhere on the line, a usage error is also the JSON error document on stdout."""
    if "--json" in argv and not getattr(exc, "eaglectl_reported", False):
        exc.eaglectl_reported = True  # type: ignore[attr-defined]
        report.usage_error_json(exc, next((a for a in argv if a in cli.commands), None))


# ------------------------------------------------------------------------------ parameter types

ENGINE_NAMES = ("vllm", "sglang", "trt-llm", "trtllm", "tensorrt-llm")  # engines, often typed where a dialect goes


class DialectChoice(click.Choice):
    """The registry's dialects (or the writable ones), read when used: a dialect registered at run
    time is a valid choice."""

    def __init__(self, writable: bool = False) -> None:
        self.writable = writable
        super().__init__([])

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        return tuple(formats.writable() if self.writable else formats.names())

    @choices.setter
    def choices(self, value: Any) -> None:
        pass

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and value not in self.choices and value.lower() in ENGINE_NAMES:
            name = param.opts[0] if param is not None and param.opts else "--to"
            command = ctx.info_name if ctx is not None else None
            e = click.BadParameter(f"{value!r} is an engine, not a dialect (dialects: {', '.join(self.choices)})",
                                   ctx, param)
            e.eaglectl_hint = (  # type: ignore[attr-defined]
                "eaglectl convert SOURCE DEST --for vllm (the dialect vLLM serves best)"
                if command == "convert" and name == "--to" and value.lower() == "vllm" else
                f"{name} names the layout of the files; vLLM serves speculators, modelopt and eagle, "
                "sglang serves specforge")
            raise e
        return super().convert(value, param, ctx)


class Number(click.ParamType):
    """A finite number within [lo, hi] (NaN and infinities are refused: `nan` would disable a gate)."""

    name = "number"

    def __init__(self, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False) -> None:
        self.lo, self.hi, self.lo_open = lo, hi, lo_open

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        below = x <= self.lo if self.lo_open else x < self.lo
        if not math.isfinite(x) or below or x > self.hi:
            bound = f"{'>' if self.lo_open else '>='} {self.lo:g}" + (f" and <= {self.hi:g}" if self.hi < math.inf else "")
            self.fail(f"{value!r} is not a finite number {bound}", param, ctx)
        return x


class IntList(click.ParamType):
    """Comma-separated integers, every item present (`1,,4` is refused), each within [lo, hi]."""

    name = "ints"

    def __init__(self, lo: int = 0, hi: int = 1 << 20, example: str = "1,4,16", k_suffix: bool = False) -> None:
        self.lo, self.hi, self.example, self.k_suffix = lo, hi, example, k_suffix

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        items = [x.strip() for x in str(value).split(",")]
        if not items or any(not x for x in items):
            self.fail(f"{value!r}: comma-separated integers with no empty item, e.g. {self.example}", param, ctx)
        try:
            out = tuple(int(x[:-1]) * 1024 if self.k_suffix and x[-1:] in "kK" else int(x) for x in items)
        except ValueError:
            self.fail(f"{value!r}: comma-separated integers, e.g. {self.example}", param, ctx)
        if any(not self.lo <= x <= self.hi for x in out):
            self.fail(f"{value!r}: each value must be in [{self.lo}, {self.hi}]", param, ctx)
        return out


class ChoiceList(click.ParamType):
    """Comma-separated names, each one of `choices`, no repeats."""

    name = "names"

    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = choices

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        items = tuple(x.strip() for x in str(value).split(","))
        bad = [x for x in items if x not in self.choices]
        if bad or len(set(items)) != len(items):
            self.fail(f"{value!r}: comma-separated names from {', '.join(self.choices)}, each once", param, ctx)
        return items


class Size(click.ParamType):
    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        from .convert import parse_size

        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Baselines(click.ParamType):
    name = "baselines"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[Any]:
        from .smoke import parse_baselines

        if isinstance(value, list):
            return value
        try:
            return parse_baselines(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


class ServingOptions(click.ParamType):
    name = "serving-option"

    def convert(self, value: Any, param: Any, ctx: Any) -> dict[str, str]:
        from .runner_smoke import parse_serving_options

        if isinstance(value, dict):
            return value
        try:
            return parse_serving_options([str(value)])
        except ValueError as e:
            self.fail(str(e), param, ctx)


class TextFile(click.ParamType):
    """A readable, non-empty UTF-8 text file; the value is its text."""

    name = "file"

    def shell_complete(self, ctx: Any, param: Any, incomplete: str) -> list[Any]:
        return click.Path().shell_complete(ctx, param, incomplete)

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        path = Path(str(value))
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            self.fail(f"{value}: {getattr(e, 'strerror', None) or 'not readable UTF-8 text'}", param, ctx)
        if not text.strip():
            self.fail(f"{value}: the file is empty", param, ctx)
        return text


class OutputFile(click.ParamType):
    """A file to write: its folder must exist (checked before any work starts)."""

    name = "file"

    def shell_complete(self, ctx: Any, param: Any, incomplete: str) -> list[Any]:
        return click.Path().shell_complete(ctx, param, incomplete)

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        parent = Path(os.path.abspath(str(value))).parent
        if not parent.is_dir():
            self.fail(f"{value}: the folder {parent} does not exist", param, ctx)
        if Path(str(value)).is_dir():
            self.fail(f"{value}: is a folder", param, ctx)
        return str(value)


class Seed(click.IntRange):
    """A seed: any integer from 0 to 2**63-1 (shown as such in --help, not as its 19 digits)."""

    def __init__(self) -> None:
        super().__init__(0, 2**63 - 1)

    def _describe_range(self) -> str:
        return "0 to 2**63-1"


SEED = Seed()
DTYPES = ("float32", "bfloat16", "float16")
TP_SIZES = click.IntRange(1, 1024)  # one range for every command that takes --tensor-parallel-size


# ---------------------------------------------------------------------------------- shared options

def option(*decls: str, **kw: Any) -> Callable[[Any], Any]:
    return click.option(*decls, **kw)


def json_option(fn: Any) -> Any:
    def set_mode(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        report.SETTINGS.json = value
        return value

    fn = click.option("--json", is_flag=True, is_eager=True, callback=set_mode, expose_value=False,
                      help="Print one JSON document on stdout (schema id in 'schema'); no progress, no colour.")(fn)
    return verbosity_options(fn)


def _set_verbosity(level: int) -> None:
    if report.SETTINGS.verbosity == -level:
        raise click.UsageError("give -q/--quiet or -v/--verbose, not both")
    report.SETTINGS.verbosity = level


def verbosity_options(fn: Any) -> Any:
    """-q / -v after the subcommand too (`eaglectl inspect X -q`), as before it."""
    def quiet(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            _set_verbosity(-1)

    def verbose(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            _set_verbosity(1)

    fn = click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=verbose,
                      help="As `eaglectl -v`: print more (evidence, the spec table, info findings, timings).")(fn)
    return click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=quiet,
                        help="As `eaglectl -q`: only errors and the one-line result.")(fn)


def dtype_option(default: str | None, help: str, shown: str | None = None) -> Callable[[Any], Any]:
    """--dtype: one definition (choices, how the default is shown) for every command."""
    return click.option("--dtype", type=click.Choice(DTYPES), default=default,
                        show_default=shown if shown is not None else default is not None, help=help)


def tensor_parallel_option(help: str) -> Callable[[Any], Any]:
    return click.option("--tensor-parallel-size", type=TP_SIZES, default=1, show_default=True, help=help)


def target_option(help: str, required: bool = False) -> Callable[[Any], Any]:
    return click.option("--target", metavar="TARGET", required=required, help=help)


def from_option(fn: Any) -> Any:
    return click.option("--from", "from_dialect", type=DialectChoice(),
                        help="The source's dialect, when detection cannot tell.")(fn)


def allow_pickle_option(fn: Any) -> Any:
    return click.option("--allow-pickle", is_flag=True,
                        help="Read .bin weights with torch.load(weights_only=True).")(fn)


def measure_option(fn: Any) -> Any:
    return click.option("--measure/--no-measure", default=True, show_default=True,
                        help="With --target that can be run (weights and a tokenizer): measure the layers, embedding, "
                             "head and uncertain flags the weights were trained with (docs/math.md#reading-probe).")(fn)


def states_option(fn: Any) -> Any:
    return click.option("--states", metavar="DIR", type=click.Path(exists=True, file_okay=False),
                        help="Target hidden states captured by `eaglectl capture` (or a recipe-made vllm serve "
                             "dump): stands in for running the target; its capture.json names the target.")(fn)


def plot_option(what: str) -> Callable[[Any], Any]:
    def check_extra(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value:  # before any work: a missing extra must not cost a long run
            from .plot import require_matplotlib

            require_matplotlib()
        return value

    return click.option("--plot", type=OutputFile(), metavar="FILE.png", callback=check_extra,
                        help=f"Also draw {what} (needs the plot extra: pip install 'eaglectl-cli[plot]').")


class HubId(click.ParamType):
    """ORG/NAME on the Hub; a local path (one that exists, or spelled like one) is refused."""

    name = "org/name"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from .target import is_hub_id

        if not is_hub_id(str(value)):
            self.fail(f"{value!r} is not a Hub id (ORG/NAME)", param, ctx)
        return str(value)


class ReleaseVersion(click.ParamType):
    """X.Y or X.Y.Z."""

    name = "x.y"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        import re

        if not re.fullmatch(r"\d{1,4}(\.\d{1,4}){1,2}", str(value)):
            self.fail(f"{value!r} is not a release number like 0.22 or 0.22.1", param, ctx)
        return str(value)


def engine_version_option(fn: Any) -> Any:
    return click.option("--engine-version", type=ReleaseVersion(), metavar="X.Y",
                        help="Scope findings to this vLLM release: features it does not serve are errors "
                             "(docs/engines.md#features).")(fn)


def base_model_option(fn: Any) -> Any:
    return click.option("--base-model", type=HubId(), metavar="ORG/NAME",
                        help="The target's Hub id, written wherever the target is named (speculators verifier, "
                             "model card); default: the target's own id (its repo, or a Hub-id `_name_or_path`). "
                             "A local path is never written.")(fn)


def write_options(fn: Any) -> Any:
    fn = click.option("--force", is_flag=True,
                      help="Replace an existing DEST folder that holds only checkpoint files.")(fn)
    return click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")(fn)


def manifest_options(dest: bool = True) -> Callable[[Any], Any]:
    item = '{"source": ..., "dest": ...}' if dest else '{"source": ...}'

    def decorate(fn: Any) -> Any:
        fn = click.option("--fail-fast", is_flag=True, help="Stop a batch at the first failure.")(fn)
        return click.option("--manifest", type=click.Path(exists=True, dir_okay=False),
                            help=f"JSONL, one item per line: {item} plus per-item options named like this "
                                 "command's flags (unknown keys are errors).")(fn)

    return decorate


# ------------------------------------------------------------------------------------------ group

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
    3-22 specific failures (docs/errors.md), 70 internal error, 130 Ctrl-C, 143 SIGTERM.
    """
    if quiet and verbose:
        raise click.UsageError("give -q/--quiet or -v/--verbose, not both")
    report.SETTINGS.reset(debug=debug or bool(os.environ.get("EAGLECTL_DEBUG")), verbosity=verbose - quiet)
    threads.configure()  # torch's threads: OMP_NUM_THREADS, else the cores this process may use


# ------------------------------------------------------------------------------------- single/batch

def _manifest_keys(cmd: click.Command) -> dict[str, click.Parameter]:
    """Per-item keys a manifest may use: the command's own options (as their flag names)."""
    keys = {}
    for p in cmd.params:
        if isinstance(p, click.Option) and p.name not in ("manifest", "fail_fast", "dry_run", "force") \
                and p.expose_value and p.name is not None:
            flag = max(p.opts, key=len).lstrip("-").replace("-", "_")
            keys[flag] = p
    return keys


def _item_options(ctx: click.Context, item: dict[str, Any], where: str) -> dict[str, Any]:
    """A manifest item's options, validated by the same parameter types as the command line."""
    params = _manifest_keys(ctx.command)
    out = {}
    for key, value in item.items():
        if key in ("source", "dest"):
            out[key] = value
            continue
        p = params[key]
        expected = _manifest_kind(p)
        values = value if p.multiple and isinstance(value, list) else [value]
        if not all(_manifest_fits(p, v) for v in values):
            raise ManifestError(f"{where}: '{key}' must be {expected}" + (" (or a list of them)" if p.multiple else ""))
        try:
            out[p.name] = p.type_cast_value(ctx, value)  # type: ignore[index]
        except click.BadParameter as e:
            raise ManifestError(f"{where}: '{key}': {e.message}") from None
        except (TypeError, ValueError, OverflowError) as e:
            raise ManifestError(f"{where}: '{key}': {e}") from None
    return out


def _manifest_numeric(p: click.Parameter) -> bool:
    return isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType, Number))


def _manifest_kind(p: click.Parameter) -> str:
    if getattr(p, "is_flag", False) or isinstance(p.type, click.types.BoolParamType):
        return "true or false"
    return "a number (or a string)" if _manifest_numeric(p) else "a string"


def _manifest_fits(p: click.Parameter, value: Any) -> bool:
    """A manifest value of the kind the command line would give this option (text, or the JSON equivalent)."""
    if getattr(p, "is_flag", False) or isinstance(p.type, click.types.BoolParamType):
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return _manifest_numeric(p)
    return isinstance(value, str)


def _single_or_batch(command: str, source: str | None, dest: str | None, manifest: str | None, fail_fast: bool,
                     one: Callable[[dict[str, Any]], Any], need_dest: bool = True,
                     items: list[dict[str, Any]] | None = None) -> None:
    """SOURCE [DEST] runs once and renders; --manifest (or several SOURCES: `items`) runs a batch with
    one summary and the worst item's exit code."""
    from .batch import read_manifest, run_batch

    ctx = click.get_current_context()
    defaults = {k: v for k, v in ctx.params.items() if k not in ("source", "sources", "dest", "manifest", "fail_fast")}
    if items is not None:
        if manifest is not None:
            raise click.UsageError("give SOURCES or --manifest, not both")
        report.finish_batch(command, run_batch(items, lambda item: _row(one({**defaults, **item})), fail_fast))
        return
    if manifest is None:
        if source is None or (need_dest and dest is None):
            raise click.UsageError("give SOURCE and DEST, or --manifest FILE" if need_dest else
                                   "give SOURCE, or --manifest FILE")
        report.finish(command, one({**defaults, "source": source, "dest": dest}))
        return
    if source is not None or dest is not None:
        raise click.UsageError("give either SOURCE/DEST or --manifest, not both")
    keys = frozenset(_manifest_keys(ctx.command))
    lines = read_manifest(manifest, keys, need_dest)
    options = {id(item): _item_options(ctx, item, f"{manifest}:{n}") for n, item in lines}  # all, before any work
    report.finish_batch(command, run_batch([item for _, item in lines],
                                           lambda item: _row(one({**defaults, **options[id(item)]})), fail_fast))


def _row(result: Any) -> tuple[int, str, Any]:
    return result.exit_code, result.summary_line(), result.to_json()


# ---------------------------------------------------------------------------------------- inspect

@cli.command("inspect", short_help="Name a drafter's dialect and check its files.", epilog="""\b
Examples:
  eaglectl inspect ./my-drafter
  eaglectl inspect yuhuili/EAGLE3-LLaMA3.1-Instruct-8B --target meta-llama/Llama-3.1-8B-Instruct
  eaglectl inspect hf://org/drafter@v2 --json --strict
""")
@click.argument("source")
@target_option("Target model folder or Hub id: checks against its config and a few table rows.")
@from_option
@click.option("--revision", metavar="REV", help="Hub revision (not with an id that pins one).")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option("--for", "for_engine", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True,
              help="The engine the report is for: advice scoped to another engine is shown as info.")
@click.option("--scan", is_flag=True, help="Stream every tensor and report NaN/Inf values.")
@engine_version_option
@measure_option
@states_option
@click.option("--vllm-python", metavar="PATH", help="Interpreter with vLLM, asked what each model runner reads "
              "(default: $EAGLECTL_VLLM_PYTHON, then this one if it has vLLM; else eaglectl's table).")
@allow_pickle_option
@json_option
def inspect_cmd(source: str, target: str | None, from_dialect: str | None, revision: str | None, strict: bool,
                for_engine: str, scan: bool, engine_version: str | None, measure: bool, states: str | None,
                vllm_python: str | None, allow_pickle: bool) -> None:
    """Name the dialect of a drafter checkpoint and check everything the files can tell.

    SOURCE is a folder, a .safetensors file, a *.index.json, a .bin (with --allow-pickle) or a Hub
    repo (org/name, org/name@rev, hf://org/name@rev/subfolder). Only headers, config.json and
    small tensors (d2t, t2d) are read; --scan reads everything.
    """
    from . import inspection

    report.finish("inspect", inspection.run(source, target=target, from_dialect=from_dialect, strict=strict, scan=scan,
                                            allow_pickle=allow_pickle, revision=revision, measure=measure,
                                            states=states, progress=report.progress, engine_version=engine_version,
                                            vllm_python=vllm_python, for_engine=for_engine))


# ---------------------------------------------------------------------------------------- convert

@cli.command("convert", short_help="Convert a drafter between dialects, checked after writing.", epilog="""\b
Examples:
  eaglectl convert ./eagle-head ./out --to speculators --target meta-llama/Llama-3.1-8B-Instruct
  eaglectl convert ./nemo-draft ./vllm-draft --to modelopt --dry-run
  eaglectl convert ./head ./head-fp16 --to specforge --dtype float16 --max-shard-size 2GB
  eaglectl convert ./head ./served --for vllm --target ./target  # picks the dialect, prints vllm serve
""")
@click.argument("source", required=False, metavar="SOURCE")
@click.argument("dest", required=False, metavar="DEST")
@click.option("--to", "to", type=DialectChoice(writable=True), help="Destination dialect. [required unless --for]")
@click.option("--for", "for_engine", type=click.Choice(["vllm"]),
              help="Instead of --to: the dialect this engine serves the drafter from best (by the release its "
                   "features need, docs/engines.md); prints the serve line for DEST.")
@from_option
@dtype_option(None, "Cast float tensors to this precision.", shown="keep")
@target_option("Target model: verifier name, default aux ids, missing tables (folder or Hub id).")
@click.option("--aux-layer-ids", type=IntList(0, 1 << 16, "2,16,29"), metavar="IDS",
              help="Aux ids in vLLM's (boundary) convention, e.g. 2,16,29.")
@click.option("--source-aux-convention", type=click.Choice(["boundary", "output"]),
              help="What the source's aux ids mean, when the files cannot say (ModelOpt).")
@click.option("--max-shard-size", type=Size(), metavar="SIZE", help="Shard the output (e.g. 5GB); must be > 0.")
@click.option("--embed-from-target", is_flag=True,
              help="Ship embed_tokens.weight from --target when the drafter has none (speculators' loader leaves a "
                   "missing one uninitialised; engines share the target's anyway).")
@base_model_option
@measure_option
@states_option
@write_options
@allow_pickle_option
@manifest_options()
@json_option
def convert_cmd(source: str | None, dest: str | None, manifest: str | None, fail_fast: bool, **options: Any) -> None:
    """Convert the drafter SOURCE to DEST in another dialect: planned, streamed, fail-closed, checked.

    Every source tensor is copied (byte ranges), cast, dropped by a named rule, or the conversion
    fails naming it. Semantic flags, aux ids (translated between conventions) and the vocabulary
    mapping are written explicitly. DEST appears only when complete and re-checked.
    """
    from . import convert

    def one(o: dict[str, Any]) -> Any:
        if bool(o.get("to")) == bool(o.get("for_engine")):
            raise UsageError("give --to DIALECT or --for ENGINE (or a 'to' / 'for' key per manifest line), not both"
                             if o.get("to") else "--to DIALECT or --for ENGINE is required (or a 'to' / 'for' key "
                             "per manifest line)", hint="eaglectl convert SOURCE DEST --for vllm")
        return convert.run(o["source"], o["dest"], o["to"], for_engine=o["for_engine"], from_dialect=o["from_dialect"], dtype=o["dtype"],
                           target=o["target"], aux_layer_ids=o["aux_layer_ids"],
                           source_aux_convention=o["source_aux_convention"], max_shard_size=o["max_shard_size"],
                           dry_run=o["dry_run"], force=o["force"], allow_pickle=o["allow_pickle"],
                           measure=o["measure"], states=o["states"], progress=report.progress,
                           base_model=o["base_model"], embed_from_target=o["embed_from_target"])

    _single_or_batch("convert", source, dest, manifest, fail_fast, one)


# ---------------------------------------------------------------------------------------- upgrade

@cli.command("upgrade", short_help="Take an EAGLE-3 drafter to the EAGLE-3.1 layout.", epilog="""\b
Examples:
  eaglectl upgrade ./speculators-head ./head-31                        # fc_norm = 1, norm_output on
  eaglectl upgrade ./head ./head-31 --init calibrated --target ./target  # least-squares fc_norm
  eaglectl upgrade ./safeailab-head ./out --to speculators --target org/target
  eaglectl upgrade ./head ./head-31 --init calibrated --states ./states  # from eaglectl capture
  eaglectl upgrade ./head ./head-31 --target ./target --prompts my.jsonl  # AL as vLLM prints it on yours
""")
@click.argument("source", required=False, metavar="SOURCE")
@click.argument("dest", required=False, metavar="DEST")
@click.option("--fc-norm/--no-fc-norm", default=True, show_default=True, help="Add per-aux fc_norm weights.")
@click.option("--norm-output/--no-norm-output", default=True, show_default=True, help="Feed back the post-norm state.")
@click.option("--init", type=click.Choice(["auto", "ones", "harmonic", "calibrated", "refit", "fit"]), default="auto",
              show_default=True, help="How fc_norm starts; auto measures every init with --target (acceptance on "
              "held-out prompts, or --prompts) or --states (FC-output error on held-out requests) and keeps the "
              "best; ones without either. fit: the best closed-form init tuned by the target's likelihood.")
@click.option("--fit-fc", is_flag=True, help="With the fit init: tune fc.weight too (not only fc_norm).")
@target_option("Target model (calibration, fidelity inputs, verifier name).")
@base_model_option
@states_option
@click.option("--prompts", metavar="FILE|DIR", help="Rank the inits and report the acceptance lengths before and "
              "after on these prompts (smoke's loaders: builtin:NAME, JSONL, SPEED-Bench folder); needs --target. "
              "The figure is what vLLM prints on them (greedy, fp32).")
@click.option("--num-prompts", type=click.IntRange(1, 10000), default=16, show_default=True,
              help="Prompts ranked on (as smoke's --num-prompts).")
@click.option("--max-tokens", type=click.IntRange(1, 32768), default=64, show_default=True,
              help="New tokens per prompt (as smoke's --max-tokens).")
@click.option("--calibration-text", type=TextFile(), help="UTF-8 text for calibration and fidelity (default: bundled).")
@click.option("--to", "to", type=DialectChoice(writable=True), help="Output dialect (default: the source's).")
@from_option
@click.option("--fidelity/--no-fidelity", default=True, show_default=True,
              help="Measure the result against the source through the reference drafter.")
@write_options
@allow_pickle_option
@manifest_options()
@json_option
def upgrade_cmd(source: str | None, dest: str | None, manifest: str | None, fail_fast: bool, **options: Any) -> None:
    """Take the EAGLE-3 drafter SOURCE to the EAGLE-3.1 layout (fc_norm, norm_output) at DEST.

    Not function-preserving: the result is a warm start for 3.1 fine-tuning, recorded as such in
    its config and metadata. Reports its fidelity to the source (per-step top-1 agreement and KL).
    Upgrading a drafter that already has the features changes nothing and says so.
    """
    from . import upgrade

    def one(o: dict[str, Any]) -> Any:
        return upgrade.run(o["source"], o["dest"], fc_norm=o["fc_norm"], norm_output=o["norm_output"],
                           init=o["init"], target=o["target"], states=o["states"], prompts=o["prompts"],
                           num_prompts=o["num_prompts"], max_tokens=o["max_tokens"], fit_fc=o["fit_fc"],
                           calibration_text=o["calibration_text"], to=o["to"],
                           from_dialect=o["from_dialect"], allow_pickle=o["allow_pickle"], force=o["force"],
                           dry_run=o["dry_run"], fidelity=o["fidelity"], progress=report.progress,
                           base_model=o["base_model"])

    _single_or_batch("upgrade", source, dest, manifest, fail_fast, one)


# ----------------------------------------------------------------------------------------- verify

@cli.command("verify", short_help="Numerical parity through the reference drafter.", epilog="""\b
Examples:
  eaglectl verify ./converted --against ./original          # conversion parity, fp32 CPU
  eaglectl verify ./drafter --dtype bfloat16 --device cuda  # precision parity vs fp32 CPU
  eaglectl verify ./drafter --target ./target-model --steps 5 --json
""")
@click.argument("candidate")
@click.option("--against", metavar="REFERENCE", help="Compare with this checkpoint (any dialect) on the same inputs.")
@target_option("Real aux states from this HF target (folder or Hub id); default: seeded synthetic states.")
@states_option
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where CANDIDATE runs (the reference of a precision check stays on CPU).")
@dtype_option(None, "Precision CANDIDATE runs at (a precision check compares it with fp32).",
              shown="float32 with --against, else bfloat16")
@click.option("--steps", type=click.IntRange(1, 32), default=3, show_default=True, help="Draft steps per anchor.")
@click.option("--tokens", type=click.IntRange(2, 8192), default=64, show_default=True, help="Anchors (positions).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the synthetic inputs.")
@click.option("--text", type=TextFile(), help="UTF-8 text for --target (default: bundled).")
@from_option
@click.option("--against-from", type=DialectChoice(), help="Dialect of REFERENCE.")
@allow_pickle_option
@json_option
def verify_cmd(candidate: str, against: str | None, target: str | None, states: str | None, device: str,
               dtype: str | None,
               steps: int, tokens: int, seed: int, text: str | None, from_dialect: str | None,
               against_from: str | None, allow_pickle: bool) -> None:
    """Numerical parity of a drafter through the reference drafter.

    With --against: conversion parity (identical tensors must give identical outputs; a dtype
    change gets that precision's tolerance; an upgrade of REFERENCE gets the upgrade regime: carried
    tensors identical, outputs a warm start). Without: CANDIDATE at --dtype (default bfloat16) on
    --device against its own fp32 CPU run. Reports per draft step; exit 8 when a step fails.
    """
    from . import verify

    report.finish("verify", verify.run(candidate, against=against, target=target, states=states, device=device,
                                       dtype=dtype,
                                       steps=steps, tokens=tokens, seed=seed, text=text, from_dialect=from_dialect,
                                       against_from=against_from, allow_pickle=allow_pickle,
                                       progress=report.progress))


# ------------------------------------------------------------------------------------------- diff

@cli.command("diff", epilog="""\b
Examples:
  eaglectl diff ./head ./head-speculators                  # a conversion: equivalent, exit 0
  eaglectl diff ./head-3.0 ./head-3.1 --json               # flags and fc_norm tensors differ, exit 1
  eaglectl diff ./safeailab-head ./converted --target ./target   # default aux ids resolved on the target
""")
@click.argument("a")
@click.argument("b")
@click.option("--values/--no-values", default=True, show_default=True,
              help="Compare tensor values (max |A-B|, streamed); --no-values compares names, dtypes and shapes only.")
@click.option("--atol", type=Number(0.0), default=0.0, show_default=True,
              help="Values within this max absolute difference count as equal.")
@target_option("Target model (its config): compare aux ids as the boundaries vLLM captures on it, so "
               "'no ids' (engine default) equals the default written out.")
@click.option("--from-a", type=DialectChoice(), help="A's dialect, when detection cannot tell.")
@click.option("--from-b", type=DialectChoice(), help="B's dialect, when detection cannot tell.")
@allow_pickle_option
@json_option
def diff_cmd(a: str, b: str, values: bool, atol: float, target: str | None, from_a: str | None, from_b: str | None,
             allow_pickle: bool) -> None:
    """Compare two drafters by meaning, across dialects.

    Reports differing spec fields (aux ids in vLLM's boundary numbering, flags, sizes), tensors only
    in A or only in B, dtype and shape differences, and value differences (max |A-B|). Exit 0 when
    equivalent, 1 when they differ.
    """
    from . import diff

    report.finish("diff", diff.run(a, b, from_a=from_a, from_b=from_b, values=values, atol=atol, target=target,
                                   allow_pickle=allow_pickle, progress=report.progress))


# ------------------------------------------------------------------------------------------ smoke

@cli.command("smoke", short_help="Measure acceptance under vLLM or the reference loop.", epilog="""\b
Examples:
  eaglectl smoke ./drafter --target ./target --baseline none,ngram
  eaglectl smoke ./drafter --target org/model --num-speculative-tokens 5 --prompts builtin:long
  eaglectl smoke ./drafter --target ./target --engine reference --json
""")
@click.argument("drafter")
@target_option("Target model folder or Hub id (with a tokenizer).", required=True)
@click.option("--engine", type=click.Choice(["vllm", "reference"]), default="vllm", show_default=True,
              help="Real vLLM (its own interpreter) or eaglectl's reference loop (same counts, no vLLM needed).")
@click.option("-k", "--num-speculative-tokens", "k", type=click.IntRange(1, 16), default=3, show_default=True,
              help="Draft tokens per step (k).")
@click.option("--prompts", default="builtin:short", show_default=True,
              help="builtin:short, builtin:long, builtin:calibration, a JSONL file ({'prompt': text}, {'messages': "
                   "[...]} or {'prompt_token_ids'}), or a local SPEED-Bench folder (parquet; reported per category).")
@click.option("--num-prompts", type=click.IntRange(1, 10000), default=16, show_default=True,
              help="How many prompts to run.")
@click.option("--max-tokens", type=click.IntRange(1, 32768), default=64, show_default=True,
              help="New tokens per prompt (greedy, EOS ignored).")
@click.option("--max-model-len", type=click.IntRange(16, 1 << 20), default=1024, show_default=True,
              help="Context window given to vLLM.")
@click.option("--concurrency", type=IntList(1, 4096), default="1,4,16", show_default=True,
              help="Concurrency levels for throughput and speedup (vLLM engine).")
@click.option("--baseline", "baselines", type=Baselines(), default="none", show_default=True,
              help="Comma list: none, ngram, draft_model:PATH, eagle3:PATH (or a drafter path).")
@dtype_option("float32", "Precision the target (and the drafter) runs at.")
@tensor_parallel_option("vLLM tensor parallelism of the target.")
@click.option("--vllm-python", metavar="PATH", help="Interpreter with vLLM (default: $EAGLECTL_VLLM_PYTHON, then this one).")
@click.option("--server", metavar="URL", help="Measure an already running vLLM server serving TARGET with DRAFTER: "
              "prompts via its completions API, acceptance from its /metrics counters (deltas around the run).")
@click.option("--min-acceptance", type=Number(1.0, 65.0), help="Fail (exit 9) below this mean acceptance length.")
@click.option("--timeout-s", type=Number(0.0, 86400.0, lo_open=True), default=900.0, show_default=True,
              help="Give up on vLLM after this many seconds.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed for prompt sampling and vLLM.")
@click.option("--context-lengths", type=IntList(16, 1 << 20, example="2k,8k", k_suffix=True),
              help="Also run prompts of exactly these lengths (1k = 1024 tokens, built from the workload) and report "
                   "acceptance per length; --max-model-len grows to fit.")
@plot_option("per-position acceptance, AL by context length and speedup by concurrency")
@click.option("--profile", type=OutputFile(), help="Also write the measured acceptance as ModelOpt's "
              "speculation_profile.json (conditional and marginal rates per position, histogram, conditions).")
@click.option("--runner", type=click.Choice(["v1", "v2", "both"]), help="vLLM model runner(s) to measure: V1 (every "
              "CPU build), V2 (the GPU default; emulated on CPU by pinning its layers in a staged copy), or both. "
              "Default: both when their readings differ, else the one vLLM uses here.")
@click.option("--reference-layers", type=click.Choice(["runner", "measured"]), default="runner", show_default=True,
              help="--engine reference: run the layers each vLLM runner reads, or the layers the probe measured.")
@click.option("--serving-option", "serving_options", multiple=True, type=ServingOptions(), metavar="KEY=VALUE",
              help="Override a serving option that changes acceptance (rejection_sample_method, "
                   "draft_lm_head_quantization); recorded as an override. Default: vLLM's standard ones, forced.")
@json_option
def smoke_cmd(drafter: str, target: str, engine: str, k: int, prompts: str, num_prompts: int, max_tokens: int,
              max_model_len: int, concurrency: tuple[int, ...], baselines: list[Any], dtype: str,
              tensor_parallel_size: int, vllm_python: str | None, server: str | None, min_acceptance: float | None,
              timeout_s: float, seed: int, context_lengths: tuple[int, ...] | None, plot: str | None,
              profile: str | None, runner: str | None, reference_layers: str,
              serving_options: tuple[dict[str, str], ...]) -> None:
    """Run DRAFTER on TARGET under real vLLM (or the reference loop) and measure acceptance.

    Greedy, fixed prompts, counters around the measured batch. Reports mean acceptance length
    (with the bonus token), accepted draft length, draft acceptance rate, per-position acceptance,
    greedy-output match against no speculation, per-user throughput and speedup by concurrency,
    and baselines side by side. Red flags (no drafts, acceptance ~1, ~k+1 with repetition, below
    --min-acceptance, vLLM's runners reading different layers from each other or from the drafter's
    intended reading) exit 9 after the report.
    """
    from . import smoke

    report.finish("smoke", smoke.run(drafter, target, engine=engine, k=k, prompts=prompts, num_prompts=num_prompts,
                                     max_tokens=max_tokens, concurrency=concurrency, baselines=baselines, dtype=dtype,
                                     tensor_parallel_size=tensor_parallel_size, vllm_python=vllm_python,
                                     min_acceptance=min_acceptance, max_model_len=max_model_len, seed=seed,
                                     timeout_s=timeout_s, context_lengths=context_lengths or (), plot=plot,
                                     progress=report.progress, server=server, profile=profile, runner=runner,
                                     reference_layers=reference_layers,
                                     serving_options=_merge_options(serving_options)))


def _merge_options(items: tuple[dict[str, str], ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        for key, value in item.items():
            if key in out:
                raise click.BadParameter(f"{key} given twice", param_hint="'--serving-option'")
            out[key] = value
    return out


# ------------------------------------------------------------------------------------------ check

def gate_options(fn: Any) -> Any:
    """The options of the pre-publish gate (`check`, and `upload`, which runs it first): one definition."""
    for decorate in reversed([
        target_option("Target model (inspect against it; parity inputs; smoke)."),
        click.option("--smoke", "run_smoke", is_flag=True,
                     help="Also run the drafter under vLLM (needs --target; --engine reference: eaglectl's loop)."),
        click.option("--engine", "smoke_engine", type=click.Choice(["vllm", "reference"]), show_default="vllm",
                     help="The smoke stage's engine: real vLLM, or eaglectl's reference loop (same counts, runs on "
                          "any CPU runner); implies the smoke stage."),
        click.option("-k", "--num-speculative-tokens", "smoke_k", type=click.IntRange(1, 16), show_default="3",
                     help="k of the smoke stage (implies it)."),
        click.option("--prompts", "smoke_prompts", show_default="builtin:short",
                     help="The smoke stage's prompts, as `smoke --prompts` (implies it)."),
        click.option("--num-prompts", "smoke_num_prompts", type=click.IntRange(1, 10000), show_default="16",
                     help="How many prompts the smoke stage runs (implies it)."),
        click.option("--timeout-s", "smoke_timeout_s", type=Number(0.0, 86400.0, lo_open=True), show_default="900",
                     help="Give up on vLLM after this many seconds (implies the smoke stage)."),
        click.option("--min-acceptance", type=Number(1.0, 65.0), help="Run the smoke stage and fail below this mean "
                     "acceptance length."),
        click.option("--card/--no-card", default=None,
                     help="Write/update README.md (--card) or skip the card (--no-card); default: lint it if "
                          "present."),
        base_model_option,
        click.option("--strict", is_flag=True, help="Inspect warnings fail the gate too."),
        engine_version_option,
        measure_option,
        states_option,
        click.option("--vllm-python", metavar="PATH", help="Interpreter with vLLM (default: $EAGLECTL_VLLM_PYTHON)."),
        allow_pickle_option,
    ]):
        fn = decorate(fn)
    return fn


def run_gate(o: dict[str, Any]) -> Any:
    """`check.run` with the gate options as the CLI parsed them (a manifest line's, or the command line's)."""
    from . import check

    smoke = {"engine": o["smoke_engine"], "k": o["smoke_k"], "prompts": o["smoke_prompts"],
             "num_prompts": o["smoke_num_prompts"], "timeout_s": o["smoke_timeout_s"]}
    return check.run(o["source"], target=o["target"], run_smoke=o["run_smoke"], card=o["card"],
                     strict=o["strict"], min_acceptance=o["min_acceptance"], vllm_python=o["vllm_python"],
                     allow_pickle=o["allow_pickle"], base_model=o["base_model"], measure=o["measure"],
                     states=o["states"], engine_version=o["engine_version"], progress=report.progress,
                     smoke_options=smoke)


@cli.command("check", short_help="The pre-publish gate: inspect, parity, smoke, card.", epilog="""\b
Examples:
  eaglectl check ./drafter --target ./target                 # inspect + parity + card lint
  eaglectl check ./drafter --target ./target --smoke --card  # + vLLM smoke, write README.md
  eaglectl check ./drafter --target ./target --engine reference --num-prompts 8   # a CPU runner's smoke
  eaglectl check --manifest drafters.jsonl --sarif eaglectl.sarif --json
""")
@click.argument("sources", nargs=-1, metavar="SOURCE...")
@gate_options
@click.option("--sarif", "sarif_path", type=OutputFile(), help="Also write the findings as SARIF 2.1.0.")
@manifest_options(dest=False)
@json_option
def check_cmd(sources: tuple[str, ...], sarif_path: str | None, manifest: str | None, fail_fast: bool,
              **options: Any) -> None:
    """The pre-publish gate for each drafter in SOURCE... (or each --manifest line): inspect, parity
    self-check, optional smoke, model card, and the files that would be uploaded (no local path).

    A stage you asked for (--smoke, --engine, --min-acceptance, --card) that cannot run is a failure,
    never "skipped". Exit 0 when every stage that ran passed, 1 when one failed on the drafter, 10
    when a requested stage cannot run on this machine (no vLLM); a batch: the worst item's code.
    """
    import json as _json

    from . import check

    reports: list[Any] = []

    def one(o: dict[str, Any]) -> Any:
        rep = run_gate(o)
        reports.append(rep)
        return rep

    items = [{"source": s} for s in sources] if len(sources) > 1 else None
    try:
        _single_or_batch("check", sources[0] if len(sources) == 1 else None, None, manifest, fail_fast, one,
                         need_dest=False, items=items)
    finally:
        if sarif_path and reports:
            try:
                Path(sarif_path).write_text(_json.dumps(check.sarif(reports), indent=1) + "\n")
            except OSError as e:
                raise filesystem_error(e, "write the SARIF file", sarif_path) from None


# ----------------------------------------------------------------------------------------- upload

@cli.command("upload", short_help="After a PASS: the gate, then the folder to the Hub.", epilog="""\b
Examples:
  eaglectl upload ./head-31 my-org/head-31 --target ./target --dry-run   # the gate and the planned commit
  eaglectl upload ./head-31 my-org/head-31 --target ./target --card --base-model org/target
  eaglectl upload ./head-31 my-org/head-31 --revision v2 --create-pr     # a pull request against branch v2
""")
@click.argument("folder", metavar="DEST")
@click.argument("repo_id", metavar="ORG/NAME", type=HubId())
@click.option("--revision", metavar="BRANCH", help="Commit to this branch (created when missing; the PR's base with "
              "--create-pr); default: the repo's main branch.")
@click.option("--create-pr", is_flag=True, help="Open a pull request instead of committing to the branch.")
@click.option("--private", is_flag=True, help="Create the repo private when it does not exist (an existing repo's "
              "visibility is not changed).")
@click.option("--commit-message", metavar="TEXT", help="The commit's title (default: made from the gate's report; "
              "the description always lists the stages).")
@click.option("--dry-run", is_flag=True, help="Run the gate and list the commit's operations; send nothing.")
@gate_options
@json_option
def upload_cmd(folder: str, repo_id: str, revision: str | None, create_pr: bool, private: bool,
               commit_message: str | None, dry_run: bool, **options: Any) -> None:
    """Run the pre-publish gate on DEST (as `eaglectl check`, same options), then upload DEST to the
    Hub repo ORG/NAME in one commit.

    Refuses, uploading nothing, when the gate fails, cannot finish here (exit 10), or finds a local
    path in any file that would be uploaded. The files are those check lists (all but dot-files);
    the commit message and description are made from the gate's report. The token is HF_TOKEN (or
    the one `hf auth login` stored); the network is touched only after the gate passed.
    """
    from . import upload

    upload.require_folder(folder)
    gate = run_gate({**options, "source": folder})
    report.finish("upload", upload.run(folder, repo_id, gate=gate, revision=revision, create_pr=create_pr,
                                       private=private, dry_run=dry_run, commit_message=commit_message))


# ---------------------------------------------------------------------------------------- capture

class EngineArg(click.ParamType):
    """KEY=VALUE for vLLM's engine (LLM(**kwargs)); VALUE is read as JSON when it parses (numbers,
    true/false, objects), else kept as a string."""

    name = "key=value"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
        import json as _json

        if isinstance(value, tuple):
            return value
        key, sep, raw = str(value).partition("=")
        if not sep or not key.strip().isidentifier():
            self.fail(f"{value!r}: KEY=VALUE with KEY an engine argument name, e.g. gpu_memory_utilization=0.9",
                      param, ctx)
        try:
            parsed = _json.loads(raw)
        except ValueError:
            parsed = raw
        return key.strip(), parsed


@cli.command("capture", short_help="Capture a target's hidden states for --states.", epilog="""\b
Examples:
  eaglectl capture ./target --out ./states                               # HF transformers, layers auto
  eaglectl capture org/big-target --engine vllm --drafter ./head --tensor-parallel-size 8 --out ./states
  eaglectl capture org/big-target --drafter ./head --print-recipe --out ./states   # for your own vllm serve
  eaglectl upgrade ./head ./head-31 --states ./states                    # then use it
""")
@click.argument("target")
@click.option("--out", required=True, metavar="DIR", help="Folder to write (must not exist, unless --force).")
@click.option("--engine", type=click.Choice(["hf", "vllm", "server"]), default="hf", show_default=True,
              help="hf: HF transformers (one device); vllm: vLLM in its own interpreter (whatever it serves); "
                   "server: your running vllm serve (--server-url; start it as --print-recipe says).")
@click.option("--server-url", metavar="URL", help="The vllm serve to drive with --engine server.")
@click.option("--layers", default="auto", show_default=True, metavar="IDS|auto",
              help="Boundary ids (vLLM's numbering, 0..L), or auto: the drafter's readings and their neighbours "
                   "(what the probe compares), plus 0 and L.")
@click.option("--drafter", metavar="DRAFTER", help="The drafter whose layers --layers auto captures.")
@click.option("--prompts", default="builtin:calibration", show_default=True,
              help="builtin:calibration, builtin:short, builtin:long, or a JSONL file ({'prompt'}, {'messages'} "
                   "or {'prompt_token_ids'}).")
@click.option("--num-prompts", type=click.IntRange(1, 1_000_000), default=16, show_default=True,
              help="Requests to capture.")
@click.option("--length", type=click.IntRange(8, 1 << 20), default=256, show_default=True,
              help="Tokens per request of the built-in prompt sets.")
@dtype_option("float32", "Precision the target runs at (the states are stored at it).")
@tensor_parallel_option("vLLM tensor parallelism of the target (--engine vllm, --print-recipe).")
@click.option("--max-model-len", type=click.IntRange(16, 1 << 24), help="vLLM context window (default: fits the "
              "longest prompt).")
@click.option("--vllm-arg", "vllm_args", type=EngineArg(), multiple=True, metavar="KEY=VALUE",
              help="Extra vLLM engine argument, repeatable (e.g. quantization=fp8, gpu_memory_utilization=0.9).")
@click.option("--vllm-python", metavar="PATH", help="Interpreter with vLLM (default: $EAGLECTL_VLLM_PYTHON, then this "
              "one).")
@click.option("--print-recipe", is_flag=True, help="Run nothing: print the vllm serve flags and client loop that "
              "write the same folder from your own server.")
@click.option("--timeout-s", type=Number(0.0, 7 * 86400.0, lo_open=True), default=3600.0, show_default=True,
              help="Give up on vLLM after this many seconds.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed for prompt sampling.")
@click.option("--force", is_flag=True, help="Replace an existing --out folder that holds only a capture.")
@json_option
def capture_cmd(target: str, out: str, engine: str, server_url: str | None, layers: str, drafter: str | None,
                prompts: str, num_prompts: int, length: int, dtype: str, tensor_parallel_size: int,
                max_model_len: int | None, vllm_args: tuple[tuple[str, Any], ...], vllm_python: str | None,
                print_recipe: bool, timeout_s: float, seed: int, force: bool) -> None:
    """Capture TARGET's hidden states at chosen boundaries, for --states on the other commands.

    Writes vLLM's own dump layout (one safetensors per request: token_ids, hidden_states
    [seq, layers, hidden], and the target's greedy next tokens) plus capture.json (boundaries,
    target identity and config, engine and versions, prompts). Both engines write the same layout.
    """
    from . import capture

    if print_recipe:
        ctx = click.get_current_context()
        given = [(f"--{k.replace('_', '-')}", str(ctx.params[k])) for k in ("prompts", "num_prompts", "length", "seed")
                 if ctx.get_parameter_source(k) is not click.core.ParameterSource.DEFAULT]
        report.finish("capture", capture.recipe(target, layers, drafter, out, tensor_parallel_size,
                                                tuple(x for pair in given for x in pair)))
        return
    report.finish("capture", capture.run(
        target, out, engine=engine, layers=layers, drafter=drafter, prompts=prompts, num_prompts=num_prompts,
        length=length, dtype=dtype, tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len,
        vllm_args=dict(vllm_args), vllm_python=vllm_python, server_url=server_url, seed=seed, force=force,
        timeout_s=timeout_s,
        progress=report.progress))


# ------------------------------------------------------------------------------------------ drift

@cli.command("drift", short_help="Measure attention drift and state growth by depth.", epilog="""\b
Examples:
  eaglectl drift ./eagle3 ./eagle3.1 --target ./target               # side by side, depth 0..7
  eaglectl drift ./drafter --target ./target --context-lengths 1k,4k,16k --plot drift.png
  eaglectl drift ./drafter --target ./target --prompts chat.jsonl --templates training,changed,none
  eaglectl drift ./drafter --states ./states --json                  # a capture of a big target
""")
@click.argument("drafters", nargs=-1, required=True)
@target_option("Target model (folder or Hub id): runs the acceptance loop and gives the states.")
@states_option
@click.option("--protocol", type=click.Choice(list(PROTOCOLS)), default="paper-v1", show_default=True,
              help="Named definitions of sink, window and anchors (docs/drift.md); the options below override them.")
@click.option("--depth", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Draft steps per chain (deeper than training shows extrapolation).")
@click.option("-k", "--num-speculative-tokens", "k", type=click.IntRange(1, 16), default=3, show_default=True,
              help="k of the acceptance loop (the same loop as smoke --engine reference).")
@click.option("--prompts", default="builtin:short", show_default=True,
              help="builtin:short, builtin:long, builtin:calibration, or a JSONL file (as smoke).")
@click.option("--num-prompts", type=click.IntRange(1, 10000), default=16, show_default=True, help="Prompts per "
              "condition (with --states: captured requests).")
@click.option("--max-tokens", type=click.IntRange(2, 32768), default=64, show_default=True,
              help="Answer tokens per prompt; anchors step through the answer.")
@click.option("--context-lengths", type=IntList(16, 1 << 20, example="1k,4k", k_suffix=True),
              help="Axis: prompts of exactly these lengths (1k = 1024 tokens), built from the workload.")
@click.option("--templates", type=ChoiceList(TEMPLATES),
              help="Axis: the JSONL chat prompts as written, with --system-prompt instead, or with no system prompt.")
@click.option("--system-prompt", default=DEFAULT_SYSTEM, show_default=True, help="The system prompt of the `changed` template.")
@click.option("--sink-tokens", type=click.IntRange(1, 1 << 20), help="Positions counted as the sink (protocol: 1).")
@click.option("--recent-window", type=click.IntRange(1, 1 << 20), help="Context positions counted as recent "
              "(protocol: 16).")
@click.option("--anchor-every", type=click.IntRange(1, 1 << 20), help="Anchor spacing in the answer (protocol: 8).")
@click.option("--bootstrap", "bootstrap_reps", type=click.IntRange(100, 100_000), default=1000, show_default=True,
              help="Bootstrap resamples for the 95 % intervals.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed for prompt sampling and the bootstrap.")
@plot_option("attention masses and state RMS by depth, drafters overlaid")
@json_option
def drift_cmd(drafters: tuple[str, ...], target: str | None, states: str | None, protocol: str, depth: int, k: int,
              prompts: str, num_prompts: int, max_tokens: int, context_lengths: tuple[int, ...] | None,
              templates: tuple[str, ...] | None, system_prompt: str, sink_tokens: int | None,
              recent_window: int | None, anchor_every: int | None, bootstrap_reps: int, seed: int,
              plot: str | None) -> None:
    """Measure attention drift of DRAFTERS: where each one's attention goes as speculation deepens.

    Free-running chains from anchors inside real text, in the reference drafter. Per depth:
    attention mass on the sink, on the chain's own tokens and on recent context, attention
    entropy, and the RMS of the state fed back (what EAGLE 3.1's norm_output bounds), with
    95 % bootstrap intervals and the spread over heads; plus the acceptance length of the same
    run (--target). Several drafters side by side; context-length and template axes.
    """
    from . import drift

    report.finish("drift", drift.run(
        list(drafters), target=target, states=states, protocol=protocol, depth=depth, k=k, prompts=prompts,
        num_prompts=num_prompts, max_tokens=max_tokens, context_lengths=context_lengths or (),
        templates=templates or (), system_prompt=system_prompt, sink_tokens=sink_tokens,
        recent_window=recent_window, anchor_every=anchor_every, bootstrap_reps=bootstrap_reps, seed=seed,
        plot=plot, progress=report.progress))


# ------------------------------------------------------------------------------------ registry

@cli.command("formats", short_help="List the dialects eaglectl reads and writes.")
@json_option
def formats_cmd() -> None:
    """List the dialects eaglectl reads, with their detection signals."""
    from .docs_data import dialect_rows

    report.finish_listing("formats", {"dialects": dialect_rows()}, report.render_formats)


@cli.command("rules", short_help="List the inspect rules, or explain one: rules ID.")
@click.argument("rule_id", required=False)
@json_option
def rules_cmd(rule_id: str | None) -> None:
    """List every inspect rule with its severity and fix, or explain one: eaglectl rules RULE_ID."""
    from .rules import RULES

    if rule_id is not None and rule_id not in RULES:
        import difflib

        near = difflib.get_close_matches(rule_id, list(RULES), n=3, cutoff=0.5)
        raise UsageError(f"no rule '{rule_id}'", hint=(f"did you mean {' or '.join(near)}? " if near else "")
                         + "eaglectl rules lists them all")
    rules = [r for r in RULES.values() if rule_id in (None, r.id)]
    report.finish_listing("rules", {"rules": [r.to_json() for r in rules]}, report.render_rules)


@cli.command("completion", short_help="Print the shell completion script.")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion_cmd(shell: str) -> None:
    """Print the completion script for SHELL, e.g. `eval "$(eaglectl completion bash)"`."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    click.echo(cls(cli, {}, "eaglectl", "_EAGLECTL_COMPLETE").source())


# ------------------------------------------------------------------------------------------ main

# Parameters that take a local path (or a Hub id, which completion cannot know): the shell
# completes file names. click.Path without exists= converts any string unchanged.
PATH_PARAMS = frozenset({"source", "dest", "sources", "candidate", "drafter", "drafters", "target", "against", "out",
                         "prompts", "vllm_python", "card_path", "smoke_prompts", "folder"})


def _complete_paths(group: click.Group) -> None:
    for cmd in group.commands.values():
        for p in cmd.params:
            if p.name in PATH_PARAMS and p.type is click.STRING:
                p.type = click.Path()


_complete_paths(cli)


def _terminated(signum: int, frame: object) -> None:
    report.interrupted("terminated (SIGTERM); no output was left behind", EXIT_TERMINATED)
    raise SystemExit(EXIT_TERMINATED)


def main() -> None:
    from .interrupts import install

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
