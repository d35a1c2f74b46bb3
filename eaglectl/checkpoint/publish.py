"""What may reach the Hub: the files an upload sends, and no local path in any of them.

A drafter's folder is published as it is (`eaglectl upload`, `hf upload`), so whatever eaglectl writes
into it names other models by Hub id only, and a local source by its basename (with the digest that
identifies its bytes): `/home/me/runs/head-7` means nothing to the reader of a model card, and tells
them about the writer's machine. `local_paths` finds what slipped through anyway (an old export, a
training script's `_name_or_path`) for `check` and `upload`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CorruptCheckpointError, UsageError
from ..io.bounded import kind, read_regular, walk
from ..io.jsonio import loads
from ..limits import limit
from .target import is_hub_id

# A path in free text: absolute, home-relative or dot-relative, not part of a URL ("https://"), a Hub id
# ("org/name": a word character before the slash) or a placeholder ("<org>/<name>").
_EMBEDDED = re.compile(r"(?<![\w/:.~<>@%-])(?:~|\.\.?)?/[\w.@+-][^\s'\"`()\[\]{}<>,;|]*")
_WINDOWS = re.compile(r"^[A-Za-z]:[\\/]")


def is_local_path(value: str) -> bool:
    """`value` spells a path on some machine (absolute with two components or one that exists, ~, ./ or ../, a
    drive, file:), never a Hub id, a URL or a lone "/"."""
    v = value.strip()
    if not v or v.startswith("//"):
        return False
    if v.startswith("/"):
        return len(v) > 1 and not v[1].isspace() and (v.rstrip("/").count("/") >= 2 or _exists(v))
    return v.startswith(("~/", "./", "../", "file:")) or v in ("~", ".", "..") or bool(_WINDOWS.match(v))


def public_name(value: str) -> str:
    """How a model or file is named in what eaglectl writes: a Hub id as it is, a local path by its
    basename (`/home/me/runs/head-7` -> `head-7`)."""

    if is_hub_id(value) or not (is_local_path(value) or "/" in value or "\\" in value):
        return value
    return os.path.basename(os.path.normpath(os.path.expanduser(value.replace("\\", "/")))) or value


def public_value(value: Any) -> Any:
    """`value` (a provenance record) with every local path replaced by its basename, in strings, lists and
    objects alike, also inside prose ("target /x/y: 4096 tokens" -> "target y: 4096 tokens")."""
    if isinstance(value, dict):
        return {k: public_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [public_value(v) for v in value]
    if isinstance(value, str):
        if is_local_path(value) or (("/" in value) and " " not in value and _exists(value)):
            return public_name(value)
        return _EMBEDDED.sub(_public_match, value)
    return value


def _public_match(m: re.Match[str]) -> str:
    path = m.group().rstrip(".:")
    return public_name(path) + m.group()[len(path):] if _paths_in(path) == [path] else m.group()


def _exists(value: str) -> bool:
    try:
        return Path(value).exists()
    except (OSError, ValueError):
        return False


# -------------------------------------------------------------------------------- what is uploaded

def upload_files(folder: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """(path in the repo, file to read) for every file an upload of `folder` sends, sorted: everything but names
    starting with a dot (eaglectl's lock and staging files, .git, .cache) and __pycache__ folders, at any depth
    (within `tree_depth` and `tree_entries`).

    Nothing outside the folder is ever read or sent: a link is followed only to a regular file inside the folder
    (sent under the link's name; the file read is the one it resolves to now). A link whose real path leaves the
    folder, a link to a folder (inside or out) or to nothing, a hard link whose file has a name outside the folder,
    and a FIFO, socket or device are refused with a UsageError naming them, before any file is read."""

    root = Path(folder)
    real_root = os.path.realpath(root)

    def fail(path: str, why: str) -> UsageError:
        return UsageError(f"{path}: {why}", path=path, hint="copy the file into the folder (cp --dereference) or "
                          "remove it; upload sends the folder's own files only")

    out = []
    linked: dict[tuple[int, int], list[str]] = {}  # (device, inode) of a file with more than one name -> its names
    for e in walk(root, fail, prune=lambda name, is_dir: name.startswith(".") or (is_dir and name == "__pycache__")):
        path, mode = e.path, e.lstat.st_mode
        if stat.S_ISLNK(mode):
            real = os.path.realpath(path)
            if os.path.commonpath([real_root, real]) != real_root:
                raise fail(str(e.path), f"a link to {real}, outside the folder; upload never reads or sends a file "
                           "from outside it")
            try:
                mode = os.stat(real).st_mode
            except OSError:
                raise fail(str(e.path), "a link to nothing") from None
            if stat.S_ISDIR(mode):
                raise fail(str(e.path), "a link to a folder; upload follows links to files inside the folder only")
            path = Path(real)
        if not stat.S_ISREG(mode):
            raise fail(str(e.path), f"not a regular file ({kind(mode)}); upload sends regular files only")
        out.append((e.rel, path))
        if path == e.path and e.lstat.st_nlink > 1:
            linked.setdefault((e.lstat.st_dev, e.lstat.st_ino), []).append(str(e.path))
    for names in linked.values():  # a hard link is a second name of one file: each of its names must be here
        links = os.lstat(names[0]).st_nlink
        if links > len(names):
            raise fail(names[0], f"a hard link: the file has {links} names and {len(names)} of them in the folder, "
                       "so it is also a file outside it (or in a folder upload skips); upload never sends a file "
                       "from outside the folder")
    return out


@dataclass(frozen=True)
class LocalPath:
    file: str  # path in the repo
    where: str  # the key path in a JSON file, `__metadata__.KEY` in a safetensors header, or `line N`
    value: str  # the path found


def local_paths(folder: str | os.PathLike[str]) -> list[LocalPath]:
    """Every local path in the files an upload of `folder` would send: JSON string values (and the JSON
    in safetensors metadata) that are paths, and paths written into text files (model card, notes). Text
    files over `publish_scan_bytes` are not searched; a safetensors file is read up to its header only; JSON
    goes through the bounded parser (a document it refuses is searched as text)."""

    def fail(path: str, why: str) -> UsageError:
        return UsageError(f"{path}: {why}", path=path)

    found: list[LocalPath] = []
    most = limit("publish_scan_bytes")
    for rel, path in upload_files(folder):
        try:
            if rel.endswith(".safetensors"):
                found += _in_safetensors(rel, path)
            elif path.stat().st_size <= most and not rel.endswith((".bin", ".pt", ".pth", ".gguf")):
                found += _in_text(rel, read_regular(path, fail, most))
        except OSError:
            continue
    return found


def _in_safetensors(rel: str, path: Path) -> list[LocalPath]:
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 0 < n <= limit("header_bytes"):
            return []
        try:
            header = loads(f.read(n), rel, max_bytes=limit("header_bytes"))
        except CorruptCheckpointError:
            return []  # inspect reports a broken header
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    out = []
    for key, text in (meta if isinstance(meta, dict) else {}).items():
        if not isinstance(text, str):
            continue
        try:
            doc = loads(text.encode("utf-8", "surrogatepass"), rel)
        except CorruptCheckpointError:
            out += [LocalPath(rel, f"__metadata__.{key}", v) for v in _paths_in(text)]
            continue
        out += [LocalPath(rel, f"__metadata__.{key}{where[len('$'):]}", v) for where, v in _walk(doc)]
    return out


def _in_text(rel: str, raw: bytes) -> list[LocalPath]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return []
    if rel.endswith(".json"):
        try:
            return [LocalPath(rel, where[2:] or "$", v) for where, v in _walk(loads(raw, rel))]
        except CorruptCheckpointError:
            pass  # not JSON, or nested deeper than json_depth: searched as text
    return [LocalPath(rel, f"line {n}", v) for n, line in enumerate(text.splitlines(), 1) for v in _paths_in(line)]


def _walk(value: Any, where: str = "$") -> Iterator[tuple[str, str]]:
    """(key path, string) for every JSON string that is a local path, or holds one in prose."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{where}[{i}]")
    elif isinstance(value, str):
        if is_local_path(value) or ("/" in value and " " not in value and not value.startswith(("http:", "https:"))
                                    and _exists(value)):  # a relative path that names something here
            yield where, value
        else:
            for v in _paths_in(value):
                yield where, v


def _paths_in(text: str) -> list[str]:
    """Paths written in prose: at least two components, or home- or dot-relative (a lone `/x` is too often
    not a path); trailing punctuation is not part of them."""
    found = (m.group().rstrip(".:") for m in _EMBEDDED.finditer(text))
    return [p for p in found if p.count("/") >= 2 or (p[:1] in "~." and "/" in p)]
