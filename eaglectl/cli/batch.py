"""Batch runs for CI migrations: a list of sources or a JSONL manifest, one summary, the worst exit code.

A failing item does not stop the others unless `fail_fast`. Manifest lines are JSON objects with
`source` (and `dest` for convert / upgrade) plus per-item options named like the command's flags
(`to`, `target`, `dtype`, `init`, ...); an unknown key is an error, never silently ignored.

A manifest is untrusted input: at most `json_bytes` bytes and `manifest_entries` items, strict
UTF-8, every line through the bounded JSON parser, every string free of NUL and lone surrogates
(no path may carry them). Any problem is a ManifestError naming the line (exit 21), found before
any item runs.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import click

from ..errors import EXIT_INTERNAL, EaglectlError, ManifestError
from ..io.atomic import check_outputs, local_inputs, refuse_overlap, resolve_dest
from ..io.bounded import read_regular
from ..io.jsonio import loads
from ..limits import limit
from ..result import BatchResult, Result
from ..text import short_path
from . import report
from .params import Number


def read_manifest(path: str, keys: frozenset[str], need_dest: bool) -> list[tuple[int, dict[str, Any]]]:
    """Parse a JSONL manifest into (line number, item); `keys` are the per-item keys the command
    accepts (besides source/dest)."""
    raw = read_regular(path, lambda p, why: ManifestError(f"{p}: {why}", path=p), limit("json_bytes"),
                       doing="read the manifest")  # a FIFO or /dev/zero is refused before it is opened
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{path}: not UTF-8 (byte {e.start})", path=path) from None
    allowed = keys | {"source"} | ({"dest"} if need_dest else set())
    items = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{lineno}"
        try:
            obj = loads(line.encode(), where)
        except EaglectlError as e:
            raise ManifestError(e.message, path=path) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("source"), str) or (
                need_dest and not isinstance(obj.get("dest"), str)):
            keys_needed = "'source' and 'dest'" if need_dest else "'source'"
            raise ManifestError(f"{where}: needs {keys_needed} (strings)", path=path)
        unknown = sorted(set(obj) - allowed)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(allowed), n=1)
            guess = f"did you mean '{close[0]}'? " if close else ""
            raise ManifestError(f"{where}: unknown key '{_shown(unknown[0])}' ({guess}this command takes: "
                                f"{', '.join(sorted(allowed))})", path=path)
        for key, value in obj.items():
            bad = _bad_string(value)
            if bad is not None:
                raise ManifestError(f"{where}: '{key}' holds {bad} (not a usable path or value)", path=path)
            if key in ("source", "dest") and not value.strip():
                raise ManifestError(f"{where}: '{key}' is empty", path=path)
        items.append((lineno, obj))
        if len(items) > limit("manifest_entries"):
            raise ManifestError(f"{path}: more than {limit('manifest_entries')} items (the limit)", path=path)
    return items


def _shown(key: str) -> str:
    """A key as a message may show it: printable, bounded."""
    text = key.encode("utf-8", errors="backslashreplace").decode("utf-8")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad_string(value: Any) -> str | None:
    """Why a manifest value cannot be used (a NUL, a lone surrogate), searched through lists and objects."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                return "a NUL character"
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return "a lone surrogate"
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
    return None


def run_batch(command: str, items: list[dict[str, Any]], fn: Callable[[dict[str, Any]], tuple[int, str, Any]],
              fail_fast: bool = False) -> BatchResult:
    """`fn(item) -> (exit code, one-line summary, JSON result)`; library errors become rows. Each row is shown as
    its item finishes (report.batch_item), so a CI log follows the batch; the heartbeat names the item running."""
    out = BatchResult()
    for n, item in enumerate(items, 1):
        with report.step(f"{command} {n}/{len(items)} {short_path(item['source'])}"):
            try:
                code, summary, doc = fn(item)
                row = {**item, "exit_code": code, "summary_line": summary, "result": doc}
            except EaglectlError as e:
                row = {**item, "exit_code": e.exit_code, "summary_line": f"error[{e.reference}]: {e.message}",
                       "error": e.to_json()}
            except Exception as e:  # noqa: BLE001 - one broken item must not hide the others' results
                row = {**item, "exit_code": EXIT_INTERNAL,
                       "summary_line": f"internal error: {type(e).__name__}: {e}"}
        out.rows.append(row)
        report.batch_item(command, n, len(items), row)
        if fail_fast and row["exit_code"]:
            break
    return out


# ------------------------------------------------------------------- the command line's side

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
        expected, fits = _manifest_kind(p)
        values = value if p.multiple and isinstance(value, list) else [value]
        if not all(fits(v) for v in values):
            raise ManifestError(f"{where}: '{key}' must be {expected}" + (" (or a list of them)" if p.multiple else ""))
        try:
            out[p.name] = p.type_cast_value(ctx, value)  # type: ignore[index]
        except click.BadParameter as e:
            raise ManifestError(f"{where}: '{key}': {e.message}") from None
        except (TypeError, ValueError, OverflowError) as e:
            raise ManifestError(f"{where}: '{key}': {e}") from None
    return out


def _manifest_kind(p: click.Parameter) -> tuple[str, Callable[[Any], bool]]:
    """What a manifest value of this option must be, said and tested: the kind the command line would give it
    (text, or the JSON equivalent)."""
    if getattr(p, "is_flag", False) or isinstance(p.type, click.types.BoolParamType):
        return "true or false", lambda v: isinstance(v, bool)
    if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType, Number)):
        return "a number (or a string)", lambda v: isinstance(v, (int, float, str)) and not isinstance(v, bool)
    return "a string", lambda v: isinstance(v, str)


def single_or_batch(command: str, one: Callable[[dict[str, Any]], Result], need_dest: bool = True) -> None:
    """The current command's SOURCE [DEST] (or one of SOURCES...) runs once and renders; its --manifest, or
    several SOURCES, runs a batch with one summary and the worst item's exit code. `one` gets the command's
    options, an item's over them."""
    ctx = click.get_current_context()
    sources = ctx.params.get("sources") or ()
    source = ctx.params.get("source", sources[0] if len(sources) == 1 else None)
    dest, manifest, fail_fast = (ctx.params.get(k) for k in ("dest", "manifest", "fail_fast"))
    items = [{"source": s} for s in sources] if len(sources) > 1 else None
    defaults = {k: v for k, v in ctx.params.items() if k not in ("source", "sources", "dest", "manifest", "fail_fast")}
    if items is not None:
        if manifest is not None:
            raise click.UsageError("give SOURCES or --manifest, not both")
        _refuse_outputs_on_inputs(None, [{**defaults, **item} for item in items])
        report.finish_batch(command, run_batch(command, items, lambda item: _row(one({**defaults, **item})), fail_fast))
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
    _refuse_outputs_on_inputs(manifest, [{**defaults, **o} for o in options.values()])
    report.finish_batch(command, run_batch(command, [item for _, item in lines],
                                           lambda item: _row(one({**defaults, **options[id(item)]})), fail_fast))


# The options of a batch item that name what it reads, and the batch's own output (check --sarif).
_INPUT_KEYS = ("source", "target", "states", "prompts", "smoke_prompts")


def _refuse_outputs_on_inputs(manifest: str | None, items: list[dict[str, Any]]) -> None:
    """Before any item runs: no item's DEST on the manifest, and the batch's report (--sarif, written once at the
    end) on nothing any item reads. Each item checks its own DEST against its own inputs when it runs (a later
    line may read what an earlier one wrote)."""

    read = local_inputs(manifest, *[item.get(k) for item in items for k in _INPUT_KEYS])
    check_outputs({"--sarif": items[0].get("sarif_path") if items else None}, read)
    for item in items:
        if item.get("dest") and manifest is not None:
            refuse_overlap(resolve_dest(item["dest"]), [manifest])


def _row(result: Result) -> tuple[int, str, dict[str, Any]]:
    return result.exit_code, result.summary_line(), result.to_json()
