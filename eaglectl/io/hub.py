"""Hub access through huggingface_hub: its cache, offline mode, token and endpoint variables.

Online, safetensors headers and single tensors are read with HTTP range requests (HfFileSystem)
and only small JSON files are downloaded. Offline (`HF_HUB_OFFLINE=1`) or when the Hub cannot be
reached, the cached snapshot is used; a repo that is not cached is a one-line error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ..errors import CheckpointNotFoundError, EaglectlError, first_line
from ..limits import limit
from .bounded import read_regular
from .jsonio import load_object

_HUB_ID = re.compile(
    r"^(?P<scheme>hf://)?(?:models/)?(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)"
    r"(?:@(?P<rev>[^/]+))?(?:/(?P<sub>.+))?$"
)


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    revision: str | None = None
    subfolder: str | None = None
    sha: str | None = None  # the commit actually used

    @property
    def display(self) -> str:
        at = self.sha or self.revision or "main"
        return f"{self.repo_id}@{at}" + (f"/{self.subfolder}" if self.subfolder else "")


def parse_hub_id(text: str, revision: str | None = None) -> HubRef | None:
    """`org/name`, `org/name@rev`, or `hf://org/name[@rev][/subfolder]`; None if it is not one."""
    m = _HUB_ID.match(text)
    if m is None or (m["sub"] and not m["scheme"]):
        return None
    if m["rev"] and revision:
        raise CheckpointNotFoundError(f"{text}: the id already pins revision '{m['rev']}'; drop --revision")
    return HubRef(m["repo"], m["rev"] or revision, m["sub"])


@dataclass
class RemoteFile:
    """A Hub file read by byte ranges."""

    name: str
    size: int
    _read: Callable[[int, int], bytes]

    def read(self, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        return self._read(offset, length)


@dataclass
class Resolved:
    ref: HubRef
    local_dir: Path | None = None  # a cached snapshot (offline)
    files: tuple[str, ...] = ()  # remote listing relative to the subfolder (online)
    read_small: Callable[[str], bytes] = lambda name: b""
    remote_file: Callable[[str], RemoteFile] = lambda name: RemoteFile(name, 0, lambda o, n: b"")


def resolve(ref: HubRef) -> Resolved:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return _from_cache(ref, reason="HF_HUB_OFFLINE is set")
    try:
        return _online(ref)
    except _Unreachable as e:
        return _from_cache(ref, reason=f"the Hub is unreachable ({e})")


class _Unreachable(Exception):
    pass


def _from_cache(ref: HubRef, reason: str) -> Resolved:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(ref.repo_id, revision=ref.revision, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
        raise CheckpointNotFoundError(
            f"{ref.display}: not in the local Hugging Face cache and {reason}", repo=ref.repo_id,
            hint="download it once with `hf download` while online, or point HF_HUB_CACHE at a cache that has it",
        ) from None
    local = folder / ref.subfolder if ref.subfolder else folder
    if not local.exists():
        raise CheckpointNotFoundError(f"{ref.display}: subfolder not in the cached snapshot", repo=ref.repo_id)
    return Resolved(replace(ref, sha=folder.name), local_dir=local)


HubFailure = Literal["repository", "revision", "forbidden", "refused", "unreachable"]


def hub_failure(e: Exception) -> HubFailure | None:
    """What a failed huggingface_hub call means: the repository is missing or not accessible, the revision is
    missing, the Hub refused (401/403: "forbidden") or answered an error, or it cannot be reached. None: the
    exception is not the Hub's (re-raise it)."""
    from huggingface_hub import errors as hf_errors

    if isinstance(e, (hf_errors.RepositoryNotFoundError, hf_errors.GatedRepoError)):
        return "repository"
    if isinstance(e, hf_errors.RevisionNotFoundError):
        return "revision"
    if isinstance(e, hf_errors.HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        return "forbidden" if status in (401, 403) else "refused"
    # connection refused, DNS, timeouts; httpx transport errors derive from no OSError: caught by module, so
    # httpx need not be imported here
    if isinstance(e, OSError) or type(e).__module__.startswith(("httpx", "httpcore", "requests", "urllib3")):
        return "unreachable"
    return None


def _online(ref: HubRef) -> Resolved:
    from huggingface_hub import HfApi, HfFileSystem, hf_hub_download

    api = HfApi()
    try:
        info = api.model_info(ref.repo_id, revision=ref.revision)
    except Exception as e:
        failure = hub_failure(e)
        if failure == "repository":
            raise CheckpointNotFoundError(f"{ref.repo_id}: repository not found or not accessible ({first_line(e)})",
                                          repo=ref.repo_id,
                                          hint="check the id, or set HF_TOKEN for a private repo") from None
        if failure == "revision":
            raise CheckpointNotFoundError(f"{ref.repo_id}: revision '{ref.revision}' not found",
                                          repo=ref.repo_id) from None
        if failure is not None:
            raise _Unreachable(first_line(e)) from None
        raise
    resolved = replace(ref, sha=info.sha)
    prefix = f"{ref.subfolder}/" if ref.subfolder else ""
    files = tuple(s.rfilename[len(prefix):] for s in info.siblings or () if s.rfilename.startswith(prefix))
    fs = HfFileSystem()

    def read_small(name: str) -> bytes:
        local = hf_hub_download(ref.repo_id, prefix + name, revision=info.sha)
        return Path(local).read_bytes()

    def remote_file(name: str) -> RemoteFile:
        path = f"{ref.repo_id}@{info.sha}/{prefix}{name}"
        size = int(fs.info(path)["size"])
        return RemoteFile(f"hf://{path}", size, lambda o, n: fs.cat_file(path, start=o, end=o + n))

    return Resolved(resolved, files=files, read_small=read_small, remote_file=remote_file)


def local_snapshot(source: str, patterns: list[str]) -> Path:
    """A local folder holding a Hub repo's files matching `patterns` (downloaded into the cache, or the
    cached snapshot offline); what running a target with HF transformers needs."""
    from huggingface_hub import snapshot_download

    ref = parse_hub_id(source)
    if ref is None:
        raise CheckpointNotFoundError(f"{source}: no such folder, and not a Hub id", path=source)
    try:
        folder = Path(snapshot_download(ref.repo_id, revision=ref.revision, allow_patterns=patterns))
    except Exception as e:  # noqa: BLE001 - huggingface_hub raises many types for "not available"
        raise CheckpointNotFoundError(f"{ref.display}: cannot get the files ({first_line(e)})", repo=ref.repo_id,
                                      hint="download it once with `hf download` while online") from None
    return folder / ref.subfolder if ref.subfolder else folder


def cached_architectures(repo_id: str) -> list[str] | None:
    """The `architectures` of a Hub model's config.json when the local Hugging Face cache holds it (never the
    network: a verifier is named offline too); None when it is not cached or holds no list of names."""
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(repo_id, "config.json")
        if not isinstance(path, str):
            return None
        config = load_object(read_regular(path, lambda p, why: CheckpointNotFoundError(f"{p}: {why}"),
                                          limit("json_bytes")), path)
    except (OSError, ValueError, EaglectlError):  # an unusable id, an unreadable or broken cached file
        return None
    archs = config.get("architectures")
    return list(archs) if isinstance(archs, list) and all(isinstance(a, str) for a in archs) else None
