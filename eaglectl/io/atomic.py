"""All-or-nothing output, and the one place that decides what may be written or replaced.

`staged_output(dest, sources=..., force=...)` is the only way eaglectl writes a folder:

- DEST is checked after resolving real paths (symlinked parents included): it may not be empty,
  may not overlap any input (a source checkpoint, a shard, a target), and may not be anything but
  a directory (a file, FIFO, device or symbolic link is never replaced, not even with --force).
- `--force` replaces only a directory holding nothing but checkpoint files (`REPLACEABLE`); the
  first foreign entry is named when it refuses.
- An exclusive lock (`.<name>.eaglectl-lock` beside DEST) is held for the whole run, so a second
  writer fails at once (OutputBusyError) instead of racing; the final rename never clobbers a DEST
  that appeared meanwhile (renameat2 RENAME_NOREPLACE where the kernel has it).
- The output is built in `.<name>.eaglectl-staging-<pid>-*` and fsynced before the rename; a
  replaced DEST goes to `.<name>.eaglectl-old-<pid>-*` first. Folders left by a killed process are
  removed by the next run once their pid is gone. Outputs get the umask's mode, like `mkdir`.
- SIGTERM becomes the same clean exit as Ctrl-C. Sources are never opened for writing.

`write_file(path, data)` is the only way it writes a single file (a model card, a plot, SARIF, a sidecar):
a temporary file beside it, fsynced, renamed over it, with the umask's mode.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import fnmatch
import functools
import glob
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import (
    FilesystemError,
    OutputBusyError,
    OutputExistsError,
    OutputOverlapError,
    UsageError,
    filesystem_error,
)
from ..limits import limit

# What --force may replace: the files of a checkpoint folder (and eaglectl's own capture dumps).
REPLACEABLE = (
    "config.json", "generation_config.json", "README.md", ".gitattributes", "*.safetensors",
    "*.safetensors.index.json", "pytorch_model*.bin", "*.bin.index.json", "tokenizer.json", "tokenizer_config.json",
    "tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
    "chat_template.jinja", "chat_template.json", "hf_quant_config.json", "capture.json", "*.safetensors.lock",
)


@contextlib.contextmanager
def staged_output(dest: str | os.PathLike[str], *, force: bool = False, sources: Iterable[str | os.PathLike[str]] = (),
                  replaceable: tuple[str, ...] = REPLACEABLE) -> Iterator[Path]:
    """Yield an empty staging folder that becomes DEST when the block succeeds."""
    final = resolve_dest(dest)
    refuse_overlap(final, sources)
    parent = final.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise filesystem_error(e, "create the destination's parent folder", parent) from None
    with _locked(final), _sigterm_as_exit():
        remove_stale_staging(final, locked=True)
        existing = _existing(final, force, replaceable)
        try:
            staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.eaglectl-staging-{os.getpid()}-", dir=parent))
            os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes 0700; outputs follow the umask like mkdir
        except OSError as e:
            raise filesystem_error(e, "create a staging folder in", parent) from None
        try:
            yield staging
            _fsync_tree(staging)
            _commit(staging, final, existing)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def check_destination(dest: str | os.PathLike[str], *, force: bool = False,
                      sources: Iterable[str | os.PathLike[str]] = (), replaceable: tuple[str, ...] = REPLACEABLE) -> None:
    """Refuse DEST now, before any measurement or write, for every reason `staged_output` would (it checks
    again under its lock)."""
    final = resolve_dest(dest)
    refuse_overlap(final, sources)
    _existing(final, force, replaceable)
    _writable(final)


def _writable(final: Path) -> None:
    """DEST's folder (or the nearest one that exists, where the missing ones will be made) takes a new entry: a
    read-only or full place is refused before minutes of measuring, not after."""
    where = final.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{final.name}.eaglectl-probe-", dir=where))
    except OSError as e:
        raise filesystem_error(e, "create the destination in", where) from None


def write_file(path: str | os.PathLike[str], data: bytes, *, doing: str = "write") -> Path:
    """The module's single-file writer; the folder is fsynced too. An existing regular file is replaced; a link,
    folder or device never is. An OSError is one FilesystemError line ("PATH: cannot `doing` (reason)")."""
    final = resolve_dest(path)
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise filesystem_error(e, "look up", final) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputExistsError(f"{final}: exists and is not a regular file; it is never replaced", path=str(final))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.eaglectl-", dir=final.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a file eaglectl writes follows the umask
        os.replace(tmp, final)
        tmp = None
        fsync(final.parent)
    except OSError as e:
        raise filesystem_error(e, doing, final) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return final


def resolve_dest(dest: str | os.PathLike[str]) -> Path:
    """DEST with symlinked parents resolved (DEST itself is not followed: a link there is refused)."""
    text = os.fspath(dest)
    if not text.strip():
        raise UsageError("DEST is empty (an unset variable?); name the output folder", path=text)
    try:
        absolute = Path(os.path.abspath(os.path.expanduser(text)))
        if not absolute.name or absolute.name in (".", ".."):
            raise UsageError(f"{text}: DEST must name a folder, not the filesystem root", path=text)
        return Path(os.path.realpath(absolute.parent)) / absolute.name
    except RuntimeError:
        raise FilesystemError(f"{text}: no such user's home folder", path=text) from None
    except OSError as e:
        raise filesystem_error(e, "resolve", text) from None


def refuse_overlap(final: Path, sources: Iterable[str | os.PathLike[str]], what: str = "the destination") -> None:
    """An output (resolved) may not be, contain, or lie inside any input, nor be a hard link of an input's file."""
    reals = []
    for source in sources:
        try:
            reals.append(Path(os.path.realpath(source)))
        except (OSError, ValueError):
            continue
    for real in reals:
        if final == real or real.is_relative_to(final) or final.is_relative_to(real):
            raise OutputOverlapError(f"{final}: {what} overlaps the source/input {real}; inputs are never modified",
                                     path=str(final), hint="choose an output outside every input")
    twin = _hard_link_twin(final, reals)
    if twin is not None:
        raise OutputOverlapError(f"{final}: {what} is a hard link of the input file {twin}; inputs are never modified",
                                 path=str(final), hint="choose an output outside every input")


def _hard_link_twin(final: Path, inputs: list[Path]) -> Path | None:
    """The input file that `final` (an existing file with several links) is another name of, if any; folders are
    searched a few levels down and a bounded number of entries (checkpoints, captures and prompt folders are
    shallow)."""
    try:
        st = os.lstat(final)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
        return None
    budget = limit("folder_entries")
    stack = [(p, 0) for p in inputs]
    while stack and budget > 0:
        path, depth = stack.pop()
        budget -= 1
        try:
            s = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(s.st_mode) and (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
            return path
        if stat.S_ISDIR(s.st_mode) and depth < 3:
            try:
                with os.scandir(path) as entries:
                    stack.extend((Path(e.path), depth + 1) for e in entries)
            except OSError:
                continue
    return None


def check_outputs(outputs: dict[str, str | os.PathLike[str] | None], inputs: Iterable[str | os.PathLike[str]]
                  ) -> None:
    """Refuse single-file outputs, named by their option ({"--profile": path}; None: not asked for), now, before
    any measurement: for every reason `write_file` would, and when one overlaps an input of the command."""
    inputs = list(inputs)
    for what, path in outputs.items():
        if path is None:
            continue
        final = resolve_dest(path)
        refuse_overlap(final, inputs, what)
        try:
            st = os.lstat(final)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise filesystem_error(e, "look up", final) from None
        if not stat.S_ISREG(st.st_mode):
            raise OutputExistsError(f"{final}: {what} exists and is not a regular file; it is never replaced",
                                    path=str(final))


def local_inputs(*inputs: object) -> list[str]:
    """Every local path the given inputs read: an opened checkpoint (drafter or target: its files and folder), a
    target (its checkpoint and its capture), a capture, or a path as the user gave it (kept when it exists: a Hub
    id or builtin:NAME names no local file). None is skipped."""
    paths: list[str] = []
    for item in inputs:
        if item is None:
            continue
        if isinstance(item, (str, os.PathLike)):
            if os.path.lexists(item):
                paths.append(os.fspath(item))
            continue
        ckpt = getattr(item, "ckpt", None)
        if ckpt is not None:  # an opened drafter or target checkpoint
            paths += [p for p in [*ckpt.identities, ckpt.root] if os.path.lexists(p)]
        elif hasattr(item, "checkpoint"):  # a Target: its files, and the capture standing in for it
            paths += local_inputs(item.checkpoint, getattr(item, "states", None))
        elif hasattr(item, "root"):  # a capture (States)
            paths += local_inputs(item.root)
    return paths


def _existing(final: Path, force: bool, replaceable: tuple[str, ...]) -> bool:
    """Whether DEST exists and may be replaced; raises when it may not."""
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise filesystem_error(e, "look up", final) from None
    if stat.S_ISLNK(st.st_mode):
        raise OutputExistsError(f"{final}: is a symbolic link; eaglectl never replaces links", path=str(final))
    if not stat.S_ISDIR(st.st_mode):
        kind = "a file" if stat.S_ISREG(st.st_mode) else "a device, FIFO or socket"
        raise OutputExistsError(f"{final}: exists and is {kind}, not a folder; it is never replaced", path=str(final))
    if not force:
        raise OutputExistsError(f"{final}: already exists", path=str(final), hint="pass --force to replace it")
    foreign = first_foreign_entry(final, replaceable)
    if foreign is not None:
        raise OutputExistsError(f"{final}: --force replaces only checkpoint folders, and it holds '{foreign}'",
                                path=str(final), hint="remove it yourself, or choose another DEST")
    return True


def first_foreign_entry(folder: Path, replaceable: tuple[str, ...] = REPLACEABLE) -> str | None:
    """The first entry (sorted) that is not a regular checkpoint file, or None."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        raise filesystem_error(e, "list", folder) from None
    for entry in entries:
        regular = entry.is_file(follow_symlinks=False)
        if not regular or not any(fnmatch.fnmatchcase(entry.name, p) for p in replaceable):
            return entry.name + ("" if regular else "/" if entry.is_dir(follow_symlinks=False) else "")
    return None


def _commit(staging: Path, final: Path, existing: bool) -> None:
    try:
        if existing:
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.eaglectl-old-{os.getpid()}-", dir=final.parent))
            rename_noreplace(final, old / "x")
            try:
                rename_noreplace(staging, final)
            except BaseException:
                rename_noreplace(old / "x", final)  # put the original back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            rename_noreplace(staging, final)
        fsync(final.parent)
    except FileExistsError:
        raise OutputExistsError(f"{final}: appeared while eaglectl was writing; it was left as it is",
                                path=str(final)) from None
    except OSError as e:
        raise filesystem_error(e, "rename the finished output to", final) from None


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def rename_noreplace(src: Path, dst: Path) -> None:
    """rename(2) that fails with FileExistsError instead of replacing `dst`."""
    fn = getattr(_libc(), "renameat2", None) if os.name == "posix" else None
    if fn is not None:
        rc = fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), str(dst))
        if err not in (errno.ENOSYS, errno.EINVAL):  # EINVAL: the filesystem lacks the flag
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


# ------------------------------------------------------------------------------------------ lock

def lock_path(final: Path) -> Path:
    return final.parent / f".{final.name}.eaglectl-lock"


@contextlib.contextmanager
def _locked(final: Path) -> Iterator[None]:
    """Hold an exclusive flock on DEST's lock file; unlink it (while still holding it) when done."""
    path = lock_path(final)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise filesystem_error(e, "create a lock file in", final.parent) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputBusyError(f"{final}: another eaglectl run is writing it (lock {path.name} is held)",
                                  path=str(final), hint="wait for the other run, or choose another DEST") from None
        try:  # the file we locked must still be the one at the path (a finishing run unlinks it)
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    else:
        raise OutputBusyError(f"{final}: could not take the lock {path.name}", path=str(final))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def remove_stale_staging(dest: str | os.PathLike[str], *, locked: bool = False) -> list[Path]:
    """Remove staging and old-DEST folders of `dest` whose process no longer runs (and an unheld lock)."""
    final = Path(os.path.abspath(dest))
    removed = []
    if not locked:
        try:
            with _locked(final):
                return remove_stale_staging(final, locked=True)
        except (OutputBusyError, FilesystemError):
            return removed
    try:
        candidates = list(final.parent.glob(f".{glob.escape(final.name)}.eaglectl-*"))
    except OSError:
        return removed
    for p in candidates:
        for kind in ("staging", "old"):
            m = re.match(re.escape(f".{final.name}.eaglectl-{kind}-") + r"(\d+)-", p.name)
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


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


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
    try:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                fsync(p)
        fsync(root)
    except OSError as e:
        raise filesystem_error(e, "flush to disk") from None


_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing these bytes of `fd` to disk now, without waiting (Linux sync_file_range
    WRITE), so that the fsync a writer ends with waits for the last bytes only, not the whole file. No guarantee:
    only the fsync is one, and where the call is missing or fails nothing changes."""
    fn = getattr(_libc(), "sync_file_range", None) if os.name == "posix" else None
    if fn is not None:
        fn(fd, ctypes.c_longlong(offset), ctypes.c_longlong(length), _SYNC_FILE_RANGE_WRITE)


def fsync(path: Path) -> None:
    """Flush a file, or a folder's entries, to disk (an OSError is the caller's to word)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

