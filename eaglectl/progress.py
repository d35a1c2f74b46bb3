"""The library's progress hook: an iterator wrapper, so a call site never branches (the CLI passes
`report.progress`; the library's default passes items through)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Progress(Protocol):
    def __call__(self, items: Iterable[T], *, label: str, total: int | None = None,
                 weight: Callable[[T], int] | None = None, unit: str | None = None) -> Iterable[T]: ...


def passthrough(items: Iterable[T], **_: Any) -> Iterable[T]:
    return items
