"""Batch runs for CI migrations: a list of sources or a JSONL manifest, one summary, the worst exit code.

A failing item does not stop the others unless `fail_fast`. Manifest lines are JSON objects with
`source` (and `dest` for convert / upgrade) plus per-item options named like the command's flags
(`to`, `target`, `dtype`, `init`, ...); an unknown key is an error, never silently ignored.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import EXIT_INTERNAL, EaglectlError, UsageError, filesystem_error
from .io.jsonio import loads
from .limits import limit


@dataclass
class BatchResult:
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return max((r["exit_code"] for r in self.rows), default=0)

    def to_json(self, command: str) -> dict[str, Any]:
        from . import __version__

        return {"schema": "eaglectl.batch/1", "tool_version": __version__, "command": command, "items": self.rows,
                "summary": {"total": len(self.rows), "ok": sum(r["exit_code"] == 0 for r in self.rows),
                            "failed": sum(r["exit_code"] != 0 for r in self.rows)}, "exit_code": self.exit_code}


def read_manifest(path: str, keys: frozenset[str], need_dest: bool) -> list[tuple[int, dict[str, Any]]]:
    """Parse a JSONL manifest into (line number, item); `keys` are the per-item keys the command
    accepts (besides source/dest)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise filesystem_error(e, "read the manifest", path) from None
    if len(raw) > limit("json_bytes"):
        raise UsageError(f"{path}: {len(raw)} bytes exceeds the {limit('json_bytes')}-byte limit")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 (byte {e.start})") from None
    allowed = keys | {"source"} | ({"dest"} if need_dest else set())
    items = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = loads(line.encode(), f"{path}:{lineno}")
        except EaglectlError as e:
            raise UsageError(e.message) from None
        where = f"{path}:{lineno}"
        if not isinstance(obj, dict) or not isinstance(obj.get("source"), str) or (
                need_dest and not isinstance(obj.get("dest"), str)):
            keys_needed = "'source' and 'dest'" if need_dest else "'source'"
            raise UsageError(f"{where}: needs {keys_needed} (strings)")
        unknown = sorted(set(obj) - allowed)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(allowed), n=1)
            guess = f"did you mean '{close[0]}'? " if close else ""
            raise UsageError(f"{where}: unknown key '{unknown[0]}' ({guess}this command takes: "
                             f"{', '.join(sorted(allowed))})")
        items.append((lineno, obj))
    return items


def run_batch(items: list[dict[str, Any]], fn: Callable[[dict[str, Any]], tuple[int, str, Any]],
              fail_fast: bool = False) -> BatchResult:
    """`fn(item) -> (exit code, one-line summary, JSON result)`; library errors become rows."""
    out = BatchResult()
    for item in items:
        try:
            code, summary, doc = fn(item)
            row = {**item, "exit_code": code, "summary_line": summary, "result": doc}
        except EaglectlError as e:
            row = {**item, "exit_code": e.exit_code, "summary_line": f"error[{e.reference}]: {e.message}",
                   "error": e.to_json()}
        except Exception as e:  # noqa: BLE001 - one broken item must not hide the others' results
            row = {**item, "exit_code": EXIT_INTERNAL, "summary_line": f"internal error: {type(e).__name__}: {e}"}
        out.rows.append(row)
        if fail_fast and row["exit_code"]:
            break
    return out
