"""Batch runs for CI migrations: a list of sources or a JSONL manifest, one summary, the worst exit code.

A failing item does not stop the others unless `fail_fast`. Manifest lines are JSON objects with
`source` and (for convert / upgrade) `dest`; other keys are per-item options (e.g. `to`, `target`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import EXIT_INTERNAL, CheckpointNotFoundError, EaglectlError


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


def read_manifest(path: str, need_dest: bool) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise CheckpointNotFoundError(f"{path}: manifest not found", path=path)
    items = []
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise CheckpointNotFoundError(f"{path}:{lineno}: not a JSON object", path=path) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("source"), str) or (
                need_dest and not isinstance(obj.get("dest"), str)):
            keys = "'source' and 'dest'" if need_dest else "'source'"
            raise CheckpointNotFoundError(f"{path}:{lineno}: needs {keys}", path=path)
        items.append(obj)
    return items


def run_batch(items: list[dict[str, Any]], fn: Callable[[dict[str, Any]], tuple[int, str, Any]],
              fail_fast: bool = False) -> BatchResult:
    """`fn(item) -> (exit code, one-line summary, JSON result)`; library errors become rows."""
    out = BatchResult()
    for item in items:
        try:
            code, summary, doc = fn(item)
            row = {**item, "exit_code": code, "summary": summary, "result": doc}
        except EaglectlError as e:
            row = {**item, "exit_code": e.exit_code, "summary": f"error[{e.reference}]: {e.message}",
                   "error": e.to_json()}
        except Exception as e:  # noqa: BLE001 - one broken item must not hide the others' results
            row = {**item, "exit_code": EXIT_INTERNAL, "summary": f"internal error: {type(e).__name__}: {e}"}
        out.rows.append(row)
        if fail_fast and row["exit_code"]:
            break
    return out
