"""The one result shape: every command's result is a `Result`, and its JSON document is built here, once.

A result class names its `SCHEMA` and `COMMAND`, says its `exit_code` (0 unless it overrides it), the one line
-q prints (`summary_line`) and its own keys (`payload`); `to_json` wraps them in the envelope every JSON
document starts and ends with (docs/json.md): schema, tool_version, command, the payload, exit_code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from . import __version__
from .errors import EaglectlError


def envelope(schema: str, command: str | None, exit_code: int, **result: Any) -> dict[str, Any]:
    """The keys every JSON document starts with (docs/json.md); the command's result follows them."""
    return {"schema": schema, "tool_version": __version__, "command": command, **result, "exit_code": exit_code}


def verdict(exit_code: int) -> str:
    """A result's outcome in one word when it has no summary of its own: "ok", else "exit N"."""
    return {0: "ok"}.get(exit_code, f"exit {exit_code}")


class Result:
    """What a command's library function returns: its JSON document and its one-line summary."""

    SCHEMA: ClassVar[str]
    COMMAND: ClassVar[str]

    @property
    def exit_code(self) -> int:
        return 0

    def summary_line(self) -> str:
        return verdict(self.exit_code)

    def failure(self) -> EaglectlError | None:
        """The error line printed after the result when it failed (smoke's red flag, verify's mismatch)."""
        return None

    def payload(self) -> dict[str, Any]:
        """The command's own keys, in document order (between the envelope's header and its exit_code)."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        return envelope(self.SCHEMA, self.COMMAND, self.exit_code, **self.payload())


@dataclass
class BatchResult:
    """A batch run (a list of sources or a manifest, batch.py): one row per item, the worst exit code."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return max((r["exit_code"] for r in self.rows), default=0)

    def to_json(self, command: str) -> dict[str, Any]:
        return envelope("eaglectl.batch/1", command, self.exit_code, items=self.rows, summary={
            "total": len(self.rows), "ok": sum(r["exit_code"] == 0 for r in self.rows),
            "failed": sum(r["exit_code"] != 0 for r in self.rows)})
