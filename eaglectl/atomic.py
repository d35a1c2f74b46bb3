"""All-or-nothing output: build in a staging folder next to the destination, then rename.

A crash or Ctrl-C leaves no destination and removes the staging folder; SIGTERM is turned into
the same clean exit; a `kill -9` leaves a staging folder whose name carries the dead pid, which
the next run next to the same destination removes. The source is never touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from .errors import OutputExistsError

_STAGING = ".{name}.eaglectl-staging-"


@contextlib.contextmanager
def staged_output(dest: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield an empty staging folder; on success it becomes `dest` (replacing it only with force)."""
    dest = Path(os.path.abspath(dest))
    if dest.exists() and not force:
        raise OutputExistsError(f"{dest}: already exists", path=str(dest), hint="pass --force to replace it")
    parent = dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(dest)
    staging = Path(tempfile.mkdtemp(prefix=_STAGING.format(name=dest.name) + f"{os.getpid()}-", dir=parent))
    try:
        with _sigterm_as_exit():
            yield staging
            _fsync_tree(staging)
            if dest.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.eaglectl-old-", dir=parent))
                os.replace(dest, old / "x")
                os.replace(staging, dest)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging, dest)
            _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def remove_stale_staging(dest: Path) -> list[Path]:
    """Remove staging folders of `dest` left by processes that no longer run."""
    removed = []
    pattern = re.compile(re.escape(_STAGING.format(name=dest.name)) + r"(\d+)-")
    for p in dest.parent.glob(f".{dest.name}.eaglectl-staging-*"):
        m = pattern.match(p.name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with p.open("rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
