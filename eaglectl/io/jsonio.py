"""JSON from untrusted files, parsed totally: size and depth bounds, strict UTF-8, and one typed
accessor (`ConfigView`) through which every config value is read.

The rules never see a value of an unexpected type: a field that is absent, of the wrong type,
non-finite or out of bounds reads as None, and the problem is recorded once per path for the
`config-field-invalid` finding.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from ..errors import CorruptCheckpointError, first_line
from ..limits import limit

MISSING = object()


def loads(raw: bytes, name: str, *, object_pairs_hook: Any = None, max_bytes: int | None = None) -> Any:
    """Parse `raw` (bytes of file `name`) or raise CorruptCheckpointError naming the file."""
    max_bytes = limit("json_bytes") if max_bytes is None else max_bytes
    if len(raw) > max_bytes:
        raise CorruptCheckpointError(f"{name}: {len(raw)} bytes of JSON exceeds the {max_bytes}-byte limit",
                                     file=name)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptCheckpointError(f"{name}: not UTF-8 (byte {e.start})", file=name) from None
    try:
        obj = json.loads(text, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise CorruptCheckpointError(f"{name}: JSON nested deeper than {limit('json_depth')} levels",
                                     file=name) from None
    except ValueError as e:  # JSONDecodeError, over-long integers, duplicate keys from the hook
        raise CorruptCheckpointError(f"{name}: not valid JSON ({first_line(e, most=200)})", file=name) from None
    if depth(obj) > limit("json_depth"):
        raise CorruptCheckpointError(f"{name}: JSON nested deeper than {limit('json_depth')} levels", file=name)
    return obj


def load_object(raw: bytes, name: str) -> dict[str, Any]:
    obj = loads(raw, name)
    if not isinstance(obj, dict):
        raise CorruptCheckpointError(f"{name}: expected a JSON object, got {type(obj).__name__}", file=name)
    return obj


def depth(obj: Any) -> int:
    """Nesting depth, computed iteratively (a deep document cannot exhaust the stack here)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in node)
    return deepest


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def config_get(config: Any, path: str) -> Any:
    """Raw value at a dotted path (`eagle_config.norm_before_fc`), or MISSING. For detection signals
    and copying; checks read through ConfigView."""
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def config_set(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = config
    for p in parents:
        child = node.get(p)
        if not isinstance(child, dict):
            child = node[p] = {}
        node = child
    node[last] = value


class ConfigView:
    """Typed, bounded reads of a config (or a sub-object of it), recording every invalid value.

    `where` names the file for messages; `prefix` is the dotted path of this view inside it. Views
    made by `sub` share one problem list with their parent, so a config's problems are reported once.
    """

    def __init__(self, data: Any, where: str, prefix: str = "", problems: dict[str, str] | None = None) -> None:
        self.data: dict[str, Any] = data if isinstance(data, dict) else {}
        self.present = isinstance(data, dict)
        self.where = where
        self.prefix = prefix
        self.problems: dict[str, str] = {} if problems is None else problems

    # -- plumbing ------------------------------------------------------------------------------

    def path(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def raw(self, key: str) -> Any:
        """The stored value or MISSING (None counts as absent)."""
        v = config_get(self.data, key)
        return MISSING if v is None else v

    def has(self, key: str) -> bool:
        return self.raw(key) is not MISSING

    def _bad(self, key: str, expected: str, value: Any) -> None:
        shown = json.dumps(value, default=str)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        self.problems.setdefault(self.path(key), f"config '{self.path(key)}' should be {expected}, got {shown}")

    def sub(self, key: str) -> ConfigView:
        v = self.raw(key)
        if v is not MISSING and not isinstance(v, dict):
            self._bad(key, "an object", v)
        return ConfigView(v if isinstance(v, dict) else None, self.where, self.path(key) + ".", self.problems)

    # -- typed getters ---------------------------------------------------------------------------

    def _typed(self, key: str, ok: Callable[[Any], bool], expected: str) -> Any:
        """The value at `key` when `ok(value)`; None when it is absent, or invalid (recorded as a problem)."""
        v = self.raw(key)
        if v is MISSING:
            return None
        if not ok(v):
            self._bad(key, expected, v)
            return None
        return v

    def int(self, key: str, *, lo: int = 0, hi: int | None = None) -> int | None:
        hi = limit("config_int") if hi is None else hi
        return self._typed(key, lambda v: _is_int(v) and lo <= v <= hi, f"an integer in [{lo}, {hi}]")

    def float(self, key: str, *, lo: float = -math.inf, hi: float = math.inf) -> float | None:
        v = self._typed(key, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                        and abs(v) < 1e300 and math.isfinite(v) and lo <= v <= hi,  # huge ints overflow floats
                        "a finite number" + (f" in [{lo:g}, {hi:g}]" if (lo, hi) != (-math.inf, math.inf) else ""))
        return None if v is None else float(v)

    def bool(self, key: str) -> bool | None:
        return self._typed(key, lambda v: isinstance(v, bool), "true or false")

    def str(self, key: str) -> str | None:
        most = limit("config_string_chars")
        return self._typed(key, lambda v: isinstance(v, str) and len(v) <= most,
                           f"a string of at most {most} characters")

    def int_list(self, key: str, *, max_len: int | None = None, lo: int = 0, hi: int | None = None
                 ) -> tuple[int, ...] | None:
        max_len = limit("aux_ids") if max_len is None else max_len
        hi = limit("config_int") if hi is None else hi
        v = self._typed(key, lambda v: isinstance(v, list) and len(v) <= max_len
                        and all(_is_int(i) and lo <= i <= hi for i in v),
                        f"a list of at most {max_len} integers in [{lo}, {hi}]")
        return None if v is None else tuple(v)

    def str_list(self, key: str, *, max_len: int = 64) -> tuple[str, ...] | None:
        most = limit("config_string_chars")
        v = self._typed(key, lambda v: isinstance(v, list) and len(v) <= max_len
                        and all(isinstance(s, str) and len(s) <= most for s in v),
                        f"a list of at most {max_len} strings")
        return None if v is None else tuple(v)

    def dict(self, key: str) -> dict[str, Any] | None:
        return self._typed(key, lambda v: isinstance(v, dict), "an object")
