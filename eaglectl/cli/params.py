"""The command line's parameter types and shared options: each defined once, used by every command
that takes it. Values are validated at parse time (before any work starts); torch is never
imported here, and the modules a type needs are imported when it converts a value.
"""

from __future__ import annotations

import importlib
import json as _json
import math
import os
import re
import shlex
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

from .. import formats
from ..checkpoint.target import is_hub_id
from ..commands.requests import SmokeRequest
from ..engines.facts import ENGINE_TITLES, RELEASED_ENGINES, engines_of, parse_releases
from ..errors import EaglectlError, UsageError
from ..formats.families import writable_layouts
from ..io.bounded import read_regular
from ..io.dtypes import CONFIG_NAMES, DTYPES, TO_CONFIG
from ..limits import limit
from . import report

F = TypeVar("F", bound=Callable[..., Any])
Param = click.Parameter | None
Ctx = click.Context | None

# ------------------------------------------------------------------------------ parameter types

ENGINE_NAMES = ("vllm", "sglang", "trt-llm", "trtllm", "tensorrt-llm")  # engines, often typed where a dialect goes


class DialectChoice(click.Choice):
    """The registry's dialects (or the writable ones), read when used: a dialect registered at run
    time is a valid choice."""

    def __init__(self, writable: bool = False, layouts: bool = False) -> None:
        self.writable, self.layouts = writable, layouts  # layouts: also the drafter families' (convert)
        super().__init__([])

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:

        return tuple((formats.writable() if self.writable else formats.names())
                     + (writable_layouts() if self.layouts else []))

    @choices.setter
    def choices(self, value: object) -> None:
        pass

    def convert(self, value: Any, param: Param, ctx: Ctx) -> Any:
        if isinstance(value, str) and value not in self.choices and value.lower() in ENGINE_NAMES:
            name = param.opts[0] if param is not None and param.opts else "--to"
            command = ctx.info_name if ctx is not None else None
            e = click.BadParameter(f"{value!r} is an engine, not a dialect (dialects: {', '.join(self.choices)})",
                                   ctx, param)
            engine = value.lower()
            e.eaglectl_hint = (  # type: ignore[attr-defined]
                f"{_as_given(ctx, 'convert')} --for {engine} (the dialect {ENGINE_TITLES[engine]} serves best)"
                if command == "convert" and name == "--to" and engine in RELEASED_ENGINES else
                f"{name} names the layout of the files; vLLM serves speculators, modelopt and eagle, "
                "sglang serves specforge")
            raise e
        return super().convert(value, param, ctx)


def _as_given(ctx: Ctx | None, command: str) -> str:
    """`eaglectl COMMAND SOURCE DEST` with the paths the user typed right after the command (click parses the
    arguments after the options, so the command line is read: cli/app.py keeps it in ctx.meta); placeholders for
    what is not there."""
    words = list(ctx.meta.get("eaglectl.argv", [])) if ctx is not None else []
    lead = []
    for w in words[words.index(command) + 1:] if command in words else []:
        if w.startswith("-"):
            break
        lead.append(w)
    given = [*lead[:2], *("SOURCE", "DEST")[len(lead[:2]):]]
    return f"eaglectl {command} " + " ".join(shlex.quote(w) if w not in ("SOURCE", "DEST") else w for w in given)


class Number(click.ParamType):
    """A finite number within [lo, hi] (NaN and infinities are refused: `nan` would disable a gate)."""

    name = "number"

    def __init__(self, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False) -> None:
        self.lo, self.hi, self.lo_open = lo, hi, lo_open

    def convert(self, value: Any, param: Param, ctx: Ctx) -> float:
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        below = x <= self.lo if self.lo_open else x < self.lo
        if not math.isfinite(x) or below or x > self.hi:
            upper = f" and <= {self.hi:g}" if self.hi < math.inf else ""
            bound = f"{'>' if self.lo_open else '>='} {self.lo:g}{upper}"
            self.fail(f"{value!r} is not a finite number {bound}", param, ctx)
        return x


class IntList(click.ParamType):
    """Comma-separated integers, every item present (`1,,4` is refused), each within [lo, hi]."""

    name = "ints"

    def __init__(self, lo: int = 0, hi: int = 1 << 20, example: str = "1,4,16", k_suffix: bool = False) -> None:
        self.lo, self.hi, self.example, self.k_suffix = lo, hi, example, k_suffix

    def convert(self, value: Any, param: Param, ctx: Ctx) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        items = [x.strip() for x in str(value).split(",")]
        if not items or any(not x or not re.fullmatch(r"-?[0-9]+[kK]?", x) for x in items):  # int() reads "٣" too
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

    def convert(self, value: Any, param: Param, ctx: Ctx) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        items = tuple(x.strip() for x in str(value).split(","))
        bad = [x for x in items if x not in self.choices]
        if bad or len(set(items)) != len(items):
            self.fail(f"{value!r}: comma-separated names from {', '.join(self.choices)}, each once", param, ctx)
        return items


class Parsed(click.ParamType):
    """A value read by the library parser `module:function` (imported when a value comes); its ValueError is
    the usage error. A value that is a `kind` already (a default) is kept. `listed`: the parser reads a list of
    values (it is given this one)."""

    def __init__(self, name: str, kind: type, parser: str, listed: bool = False) -> None:
        self.name, self.kind, self.parser, self.listed = name, kind, parser, listed

    def convert(self, value: Any, param: Param, ctx: Ctx) -> Any:
        if isinstance(value, self.kind):
            return value
        module, _, function = self.parser.partition(":")
        parse = getattr(importlib.import_module(module, __package__), function)
        try:
            return parse([str(value)] if self.listed else str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


SIZE = Parsed("size", int, "eaglectl.checkpoint.plan:parse_size")
BASELINES = Parsed("baselines", list, "eaglectl.commands.requests:parse_baselines")
SERVING_OPTION = Parsed("serving-option", dict, "eaglectl.commands.smoke.runner:parse_serving_options", listed=True)


class FileType(click.ParamType):
    """A file named on the command line: the shell completes file names."""

    name = "file"

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        return click.Path().shell_complete(ctx, param, incomplete)


class TextFile(FileType):
    """A readable, non-empty UTF-8 text file of at most `calibration_text_bytes`; the value is its text. A FIFO or
    device is refused before it is opened (io/bounded.py)."""

    def convert(self, value: Any, param: Param, ctx: Ctx) -> str:

        try:
            text = read_regular(str(value), lambda path, why: UsageError(f"{path}: {why}"),
                                limit("calibration_text_bytes")).decode("utf-8")
        except EaglectlError as e:
            self.fail(e.message, param, ctx)
        except UnicodeDecodeError:
            self.fail(f"{value}: not readable UTF-8 text", param, ctx)
        if not text.strip():
            self.fail(f"{value}: the file is empty", param, ctx)
        return text


class OutputFile(FileType):
    """A file to write: its folder must exist (checked before any work starts)."""

    def convert(self, value: Any, param: Param, ctx: Ctx) -> str:
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


class HubId(click.ParamType):
    """ORG/NAME on the Hub; a local path (one that exists, or spelled like one) is refused."""

    name = "org/name"

    def convert(self, value: Any, param: Param, ctx: Ctx) -> str:

        if not is_hub_id(str(value)):
            self.fail(f"{value!r} is not a Hub id (ORG/NAME)", param, ctx)
        return str(value)


class ReleaseVersion(click.ParamType):
    """`X.Y[.Z]` (a vLLM release) or a comma list of `ENGINE@X.Y[.Z]` (engines.facts.parse_releases)."""

    name = "x.y"

    def convert(self, value: Any, param: Param, ctx: Ctx) -> str:

        try:
            parse_releases(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return str(value)


class EngineList(click.ParamType):
    """The engines a report or a written file is for: one, or a comma list (vllm,sglang)."""

    name = "engines"

    def __init__(self, allowed: tuple[str, ...] = RELEASED_ENGINES) -> None:
        self.allowed = allowed

    def convert(self, value: Any, param: Param, ctx: Ctx) -> str:

        got = engines_of(str(value))
        wrong = [e for e in got if e not in self.allowed]
        if not got or wrong:
            self.fail(f"{value!r}: name {' or '.join(self.allowed)}, or a comma list of them", param, ctx)
        return ",".join(got)


class EngineArg(click.ParamType):
    """KEY=VALUE for vLLM's engine (LLM(**kwargs)); VALUE is read as JSON when it parses (numbers,
    true/false, objects), else kept as a string."""

    name = "key=value"

    def convert(self, value: Any, param: Param, ctx: Ctx) -> tuple[str, Any]:

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


# ---------------------------------------------------------------------------------- shared options

# --dtype's choices: the config spellings of the precisions a drafter runs at (one name each, float64 left out)
RUN_DTYPES = tuple(n for n, s in CONFIG_NAMES.items() if TO_CONFIG.get(s) == n and DTYPES[s].bits <= 32)
TP_SIZES = click.IntRange(1, 1024)  # one range for every command that takes --tensor-parallel-size


def json_option(fn: F) -> F:
    def set_mode(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        report.SETTINGS.json = value
        return value

    fn = click.option("--json", is_flag=True, is_eager=True, callback=set_mode, expose_value=False,
                      help="Print one JSON document on stdout (schema id in 'schema'); no progress bar, no colour.")(fn)
    return verbosity_options(fn)


def _set_verbosity(level: int, ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value:
        return
    if report.SETTINGS.verbosity == -level:
        raise click.UsageError("give -q/--quiet or -v/--verbose, not both")
    report.SETTINGS.verbosity = level


def verbosity_options(fn: F) -> F:
    """-q / -v after the subcommand too (`eaglectl inspect X -q`), as before it."""
    fn = click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=partial(_set_verbosity, 1),
                      help="As `eaglectl -v`: print more (evidence, the spec table, info findings, timings).")(fn)
    return click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=partial(_set_verbosity, -1),
                        help="As `eaglectl -q`: only errors and the one-line result.")(fn)


def dtype_option(default: str | None, help: str, shown: str | None = None) -> Callable[[F], F]:
    return click.option("--dtype", type=click.Choice(RUN_DTYPES), default=default,
                        show_default=shown if shown is not None else default is not None, help=help)


def tensor_parallel_option(help: str) -> Callable[[F], F]:
    return click.option("--tensor-parallel-size", type=TP_SIZES, default=1, show_default=True, help=help)


def seed_option(help: str) -> Callable[[F], F]:
    return click.option("--seed", type=SEED, default=0, show_default=True, help=help)


def vllm_python_option(used_for: str, without: str | None = None) -> Callable[[F], F]:
    """--vllm-python, its default said one way on every command; `without`: what the command does when no
    interpreter has vLLM (None: it needs one)."""
    tail = f" if it has vLLM; else {without}" if without else ""
    return click.option("--vllm-python", metavar="PATH", help=f"Interpreter with vLLM, {used_for} (default: "
                        f"$EAGLECTL_VLLM_PYTHON, then this one{tail}).")


sglang_python_option = click.option(
    "--sglang-python", metavar="PATH", help="Interpreter with SGLang, asked what it reads (default: "
    "$EAGLECTL_SGLANG_PYTHON, then this one if it has SGLang; else eaglectl's table of SGLang).")


def for_option(help: str, default: str | None = "vllm") -> Callable[[F], F]:
    return click.option("--for", "for_engine", type=EngineList(), default=default, show_default=default is not None,
                        metavar="ENGINE[,ENGINE]", help=help)


def target_option(help: str, required: bool = False) -> Callable[[F], F]:
    return click.option("--target", metavar="TARGET", required=required, help=help)


def from_option(fn: F) -> F:
    return click.option("--from", "from_dialect", type=DialectChoice(),
                        help="The source's dialect, when detection cannot tell.")(fn)


def allow_pickle_option(fn: F) -> F:
    return click.option("--allow-pickle", is_flag=True,
                        help="Read .bin weights with torch.load(weights_only=True).")(fn)


def measure_option(fn: F) -> F:
    return click.option("--measure/--no-measure", default=True, show_default=True,
                        help="With --target that can be run (weights and a tokenizer): measure the layers, embedding, "
                             "head and uncertain flags the weights were trained with (docs/math.md#reading-probe).")(fn)


def states_option(fn: F) -> F:
    return click.option("--states", metavar="DIR", type=click.Path(exists=True, file_okay=False),
                        help="Target hidden states captured by `eaglectl capture` (or a recipe-made vllm serve "
                             "dump): stands in for running the target; its capture.json names the target.")(fn)


def plot_option(what: str) -> Callable[[F], F]:
    def check_extra(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value:  # before any work: a missing extra must not cost a long run
            from ..commands.plot import require_matplotlib

            require_matplotlib()
        return value

    return click.option("--plot", type=OutputFile(), metavar="FILE.png", callback=check_extra,
                        help=f"Also draw {what} (needs the plot extra: pip install 'eaglectl-cli[plot]').")


def engine_version_option(fn: F) -> F:
    return click.option("--engine-version", type=ReleaseVersion(), metavar="[ENGINE@]X.Y",
                        help="Scope findings to these releases: X.Y is vLLM's, or a list such as "
                             "vllm@0.34.0,sglang@0.5.23; features a release does not serve are errors "
                             "(docs/engines.md#features).")(fn)


def base_model_option(fn: F) -> F:
    return click.option("--base-model", type=HubId(), metavar="ORG/NAME",
                        help="The target's Hub id, written wherever the target is named (speculators verifier, "
                             "model card); default: the target's own id (its repo, or a Hub-id `_name_or_path`). "
                             "A local path is never written.")(fn)


def write_options(fn: F) -> F:
    fn = click.option("--force", is_flag=True,
                      help="Replace an existing DEST folder that holds only checkpoint files.")(fn)
    return click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")(fn)


def manifest_options(dest: bool = True) -> Callable[[F], F]:
    item = '{"source": ..., "dest": ...}' if dest else '{"source": ...}'

    def decorate(fn: F) -> F:
        fn = click.option("--fail-fast", is_flag=True, help="Stop a batch at the first failure.")(fn)
        return click.option("--manifest", type=click.Path(exists=True, dir_okay=False),
                            help=f"JSONL, one item per line: {item} plus per-item options named like this "
                                 "command's flags (unknown keys are errors).")(fn)

    return decorate


def gate_options(fn: F) -> F:
    """The options of the pre-publish gate (`check`, and `upload`, which runs it first): one definition."""
    for decorate in reversed([
        target_option("Target model (inspect against it; parity inputs; smoke)."),
        click.option("--smoke", "run_smoke", is_flag=True,
                     help="Also run the drafter under vLLM (needs --target; --engine reference: eaglectl's loop)."),
        click.option("--engine", "smoke_engine", type=click.Choice(["vllm", "reference"]),
                     show_default=SmokeRequest.engine,
                     help="The smoke stage's engine: real vLLM, or eaglectl's reference loop (same counts, runs on "
                          "any CPU runner); implies the smoke stage."),
        click.option("-k", "--num-speculative-tokens", "smoke_k", type=click.IntRange(1, 16),
                     show_default=str(SmokeRequest.k),
                     help="k of the smoke stage (implies it)."),
        click.option("--prompts", "smoke_prompts", show_default=SmokeRequest.prompts,
                     help="The smoke stage's prompts, as `smoke --prompts` (implies it)."),
        click.option("--num-prompts", "smoke_num_prompts", type=click.IntRange(1, 10000),
                     show_default=str(SmokeRequest.num_prompts),
                     help="How many prompts the smoke stage runs (implies it)."),
        click.option("--timeout-s", "smoke_timeout_s", type=Number(0.0, 86400.0, lo_open=True),
                     show_default=f"{SmokeRequest.timeout_s:g}",
                     help="Give up on vLLM after this many seconds (implies the smoke stage)."),
        click.option("--min-acceptance", type=Number(1.0, 65.0), help="Run the smoke stage and fail below this mean "
                     "acceptance length."),
        click.option("--card/--no-card", default=None,
                     help="Write/update README.md (--card) or skip the card (--no-card); default: lint it if "
                          "present."),
        base_model_option,
        click.option("--strict", is_flag=True, help="Inspect warnings fail the gate too."),
        for_option("The engines the gate is for (vllm, sglang, or vllm,sglang): another engine's findings are "
                   "advice, shown as info."),
        engine_version_option,
        measure_option,
        states_option,
        vllm_python_option("asked what each model runner reads and running the smoke stage",
                           without="eaglectl's table, and the smoke stage is undecided"),
        sglang_python_option,
        allow_pickle_option,
    ]):
        fn = decorate(fn)
    return fn


def given_flags(*names: str) -> tuple[str, ...]:
    """The current command's options among `names` that the command line gave, as flags and values."""
    ctx = click.get_current_context()
    given = [(f"--{k.replace('_', '-')}", str(ctx.params[k])) for k in names
             if ctx.get_parameter_source(k) is not click.core.ParameterSource.DEFAULT]
    return tuple(x for pair in given for x in pair)


def merge_serving_options(ctx: Ctx, param: Param, items: tuple[dict[str, str], ...]) -> dict[str, str]:
    """The --serving-option values as one mapping; a key given twice is a usage error."""
    out: dict[str, str] = {}
    for item in items:
        for key, value in item.items():
            if key in out:
                raise click.BadParameter(f"{key} given twice", param_hint="'--serving-option'")
            out[key] = value
    return out


# Parameters that take a local path (or a Hub id, which completion cannot know): the shell
# completes file names. click.Path without exists= converts any string unchanged.
PATH_PARAMS = frozenset({"source", "dest", "sources", "candidate", "drafter", "drafters", "target", "against", "out",
                         "prompts", "vllm_python", "card_path", "smoke_prompts", "folder"})


def complete_paths(group: click.Group) -> None:
    for cmd in group.commands.values():
        for p in cmd.params:
            if p.name in PATH_PARAMS and p.type is click.STRING:
                p.type = click.Path()
