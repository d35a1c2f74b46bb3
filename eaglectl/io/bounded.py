"""Untrusted local files and folders, read within bounds: one opener and one walker for every input surface.

`open_regular` refuses anything but a regular file before reading a byte: the path is stat'ed first (a
device or FIFO is never opened), then opened without blocking (a FIFO swapped in meanwhile cannot hang the
open) and checked again on the open descriptor; its size is checked against the surface's limit, and
`read_regular` reads at most one byte past it (a file that grows while read is still refused). `walk` lists
a folder iteratively (no recursion to exhaust), at most `tree_depth` levels and `tree_entries` entries.
Every refusal is the surface's own error, built by the caller's `fail(path, reason)`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import EaglectlError, filesystem_error
from ..limits import limit

Fail = Callable[[str, str], EaglectlError]  # (path, reason) -> the input surface's error


def kind(mode: int) -> str:
    """What a non-regular file is, for messages."""
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket"
            if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")


def open_regular(path: str | os.PathLike[str], fail: Fail, max_bytes: int, *, doing: str = "read") -> BinaryIO:
    """`path` opened for binary reads when it is a regular file (a link to one counts) of at most `max_bytes`."""
    name = os.fspath(path)
    try:
        st = os.stat(name)
    except OSError as e:
        raise filesystem_error(e, doing, name) from None
    _check(name, st, fail, max_bytes)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise filesystem_error(e, doing, name) from None
    try:
        _check(name, os.fstat(fd), fail, max_bytes)  # what was opened, should the path have changed since
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _check(name: str, st: os.stat_result, fail: Fail, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise fail(name, f"not a regular file ({kind(st.st_mode)}); it is not read")
    if st.st_size > max_bytes:
        raise fail(name, f"{st.st_size} bytes exceeds the {max_bytes}-byte limit")


def read_regular(path: str | os.PathLike[str], fail: Fail, max_bytes: int, *, doing: str = "read") -> bytes:
    """The bytes of a regular file of at most `max_bytes` (see `open_regular`)."""
    with open_regular(path, fail, max_bytes, doing=doing) as f:
        try:
            raw = f.read(max_bytes + 1)
        except OSError as e:
            raise filesystem_error(e, doing, path) from None
    if len(raw) > max_bytes:  # it grew after the size was checked
        raise fail(os.fspath(path), f"more than {max_bytes} bytes (the limit)")
    return raw


def pread_all(fd: int, length: int, offset: int) -> bytes:
    """`length` bytes at `offset` (fewer only where the file ends): one pread returns at most 2 GiB - 4 KiB on
    Linux, so large reads loop, into one buffer (no second copy)."""
    if length <= 1 << 30:
        first = os.pread(fd, length, offset)
        if len(first) == length or not first:
            return first
    buf = bytearray(length)
    view, done = memoryview(buf), 0
    while done < length:
        n = os.preadv(fd, [view[done:done + (1 << 30)]], offset + done)
        if n == 0:
            break
        done += n
    view.release()
    del buf[done:]
    return buf  # type: ignore[return-value]  # bytes-like: every reader takes a buffer (frombuffer, decode, +=)


@dataclass(frozen=True)
class Entry:
    """One thing under a walked folder that is not a folder walked into: a file, a link, a FIFO, a device."""

    rel: str  # path relative to the root, with "/"
    path: Path
    lstat: os.stat_result  # the entry itself (a link is not followed)


def walk(root: str | os.PathLike[str], fail: Fail, *, prune: Callable[[str, bool], bool] = lambda name, d: False,
         follow_links: bool = False) -> list[Entry]:
    """Every entry under `root` that is not a folder descended into, sorted by path: folders are descended,
    `prune(name, is_folder)` ones skipped, linked folders descended only with `follow_links` (else listed as
    entries); at most `tree_depth` levels and `tree_entries` entries, else `fail`."""
    top = Path(root)
    depth_cap, budget = limit("tree_depth"), limit("tree_entries")
    out: list[Entry] = []
    stack: list[tuple[Path, int]] = [(top, 0)]
    seen = 0
    while stack:
        here, depth = stack.pop()
        try:
            with os.scandir(here) as it:
                entries = []
                for e in it:
                    seen += 1
                    if seen > budget:
                        raise fail(str(top), f"more than {budget} files and folders under it (the limit)")
                    entries.append(e)
        except OSError as e:
            raise filesystem_error(e, "list", here) from None
        for e in entries:
            try:
                is_dir = e.is_dir(follow_symlinks=follow_links)
                st = e.stat(follow_symlinks=False)
            except OSError as err:
                raise filesystem_error(err, "read", e.path) from None
            if prune(e.name, is_dir):
                continue
            path = Path(e.path)
            if is_dir:
                if depth + 1 > depth_cap:
                    raise fail(str(path), f"a folder {depth + 1} levels below {top}; at most {depth_cap} are read")
                stack.append((path, depth + 1))
            else:
                out.append(Entry(path.relative_to(top).as_posix(), path, st))
    return sorted(out, key=lambda x: x.rel.split("/"))  # as pathlib orders paths: by their components
