"""What may reach the Hub: the files an upload sends, and no local path in any of them.

A drafter's folder is published as it is (`eaglectl upload`, `hf upload`), so whatever eaglectl writes
into it names other models by Hub id only, and a local source by its basename (with the digest that
identifies its bytes): `/home/me/runs/head-7` means nothing to the reader of a model card, and tells
them about the writer's machine. `local_paths` finds what slipped through anyway (an old export, a
training script's `_name_or_path`) for `check` and `upload`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A path in free text: absolute, home-relative or dot-relative, not part of a URL ("https://"), a Hub id
# ("org/name": a word character before the slash) or a placeholder ("<org>/<name>").
_EMBEDDED = re.compile(r"(?<![\w/:.~<>@%-])(?:~|\.\.?)?/[\w.@+-][^\s'\"`()\[\]{}<>,;|]*")
_WINDOWS = re.compile(r"^[A-Za-z]:[\\/]")
TEXT_BYTES = 8 << 20  # larger non-weight files are not read for paths (a tokenizer.json is a few MB)


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
    from .target import is_hub_id

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
    """(path in the repo, file) for every file an upload of `folder` sends, sorted: everything but names
    starting with a dot (eaglectl's lock and staging files, .git, .cache) at any depth."""
    root = Path(folder)
    out = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(files):
            path = Path(here) / name
            if name.startswith(".") or not path.is_file():
                continue
            out.append((path.relative_to(root).as_posix(), path))
    return out


@dataclass(frozen=True)
class LocalPath:
    file: str  # path in the repo
    where: str  # the key path in a JSON file, `__metadata__.KEY` in a safetensors header, or `line N`
    value: str  # the path found


def local_paths(folder: str | os.PathLike[str]) -> list[LocalPath]:
    """Every local path in the files an upload of `folder` would send: JSON string values (and the JSON
    in safetensors metadata) that are paths, and paths written into text files (model card, notes)."""
    found: list[LocalPath] = []
    for rel, path in upload_files(folder):
        try:
            if rel.endswith(".safetensors"):
                found += _in_safetensors(rel, path)
            elif path.stat().st_size <= TEXT_BYTES and not rel.endswith((".bin", ".pt", ".pth", ".gguf")):
                found += _in_text(rel, path.read_bytes())
        except OSError:
            continue
    return found


def _in_safetensors(rel: str, path: Path) -> list[LocalPath]:
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 0 < n <= 100_000_000:
            return []
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return []
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    out = []
    for key, text in (meta or {}).items():
        if not isinstance(text, str):
            continue
        try:
            out += [LocalPath(rel, f"__metadata__.{key}{where[len('$'):]}", v) for where, v in _walk(json.loads(text))]
        except ValueError:
            out += [LocalPath(rel, f"__metadata__.{key}", v) for v in _paths_in(text)]
    return out


def _in_text(rel: str, raw: bytes) -> list[LocalPath]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return []
    if rel.endswith(".json"):
        try:
            return [LocalPath(rel, where[2:] or "$", v) for where, v in _walk(json.loads(text))]
        except ValueError:
            pass
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
