"""An engine's answer, read as untrusted input: checked against its schema before anything uses or caches it, then
turned into readings (vLLM's runners, SGLang's reading, the target pre-flight).

A reading worker (workers/*_reading.py) runs the engine's own code, which eaglectl does not control: a version with
another answer shape, a crash halfway through, or a hostile interpreter can answer anything. `check_vllm` and
`check_sglang` accept exactly the shapes the readers below use (types, ranges, lengths bounded by limits.py); any
other answer is the worker's failure, said with the path of the first wrong value, and is never cached.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..limits import LIMITS
from . import sglang
from .readings import EngineReading
from .target_support import TargetSupport, support_from_worker

Schema = Any  # a type, a tuple of alternatives, a dict of keys (optional ones end with "?"), or [item]


class BadAnswer(ValueError):
    """The answer does not have the shape its reader takes: the path of the first wrong value."""


def _check(value: Any, schema: Schema, path: str) -> None:
    if isinstance(schema, tuple):
        errors = []
        for alternative in schema:
            try:
                return _check(value, alternative, path)
            except BadAnswer as e:
                errors.append(str(e))
        raise BadAnswer(errors[0])
    if schema is None:
        if value is not None:
            raise BadAnswer(f"{path}: {type(value).__name__}, not null")
        return None
    if isinstance(schema, list):
        if not isinstance(value, list) or len(value) > LIMITS["aux_ids"].value * 4:
            raise BadAnswer(f"{path}: not a list of at most {LIMITS['aux_ids'].value * 4} items")
        for i, item in enumerate(value):
            _check(item, schema[0], f"{path}[{i}]")
        return None
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise BadAnswer(f"{path}: {type(value).__name__}, not an object")
        for key, sub in schema.items():
            name = key.rstrip("?")
            if name in value:
                _check(value[name], sub, f"{path}.{name}")
            elif not key.endswith("?"):
                raise BadAnswer(f"{path}.{name}: missing")
        return None
    if schema is int:  # a layer id, a count, a shift: an int of a layer's range, never a bool
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > LIMITS["target_layers"].value * 4:
            raise BadAnswer(f"{path}: {value!r:.40} is not an integer of a layer's range")
        return None
    if schema is str:
        if not isinstance(value, str) or len(value) > 1 << 20:
            raise BadAnswer(f"{path}: not a string")
        return None
    if not isinstance(value, schema):
        raise BadAnswer(f"{path}: {type(value).__name__}, not {schema.__name__}")
    return None


def _results(raw: dict[str, Any], count: int, version_key: str, result: Schema) -> None:
    _check(raw, {"ok": bool, f"{version_key}?": str, "error?": (str, None)}, "answer")
    if not raw["ok"]:
        return
    _check(raw.get(version_key), str, f"answer.{version_key}")
    results = raw.get("results")
    if not isinstance(results, list) or len(results) != count:
        raise BadAnswer(f"answer.results: {count} result(s) asked, "
                        f"{len(results) if isinstance(results, list) else 'none'} answered")
    for i, one in enumerate(results):
        _check(one, result, f"answer.results[{i}]")


_TEXT = (str, None)
_RUNNER = {"boundary_ids": ([int], None), "source": _TEXT, "shift": int, "error": _TEXT}
_VLLM_RESULT = {
    "build": _TEXT, "error": _TEXT, "runners": ({"v1?": _RUNNER, "v2?": _RUNNER}, None),
    "model": ({"class": _TEXT, "error?": _TEXT, "basis?": _TEXT, "num_aux?": (int, None),
               "flags?": ({"fc_norm": bool, "norm_output": bool, "norm_before_residual": bool,
                           "norm_before_fc": bool}, None)}, None),
    "target_support?": ({"architecture": _TEXT, "class": _TEXT, "module": _TEXT, "supports_eagle3": (bool, None),
                         "hybrid": (bool, None), "attention_free": (bool, None), "num_layers": (int, None),
                         "error": _TEXT}, None)}
_SGLANG_RESULT = {
    "build?": _TEXT, "error": _TEXT,
    "capture": ({"ids_read": ([int], None), "source": _TEXT, "target_class": _TEXT, "captured": ([int], None),
                 "error": _TEXT}, None),
    "model": ({"class": _TEXT, "is_draft": bool, "error": _TEXT, "num_aux": (int, None), "skipped": [str],
               "flags": ({"fc_norm": bool, "norm_output": bool, "norm_before_residual": bool,
                          "norm_before_fc": bool}, None)}, None)}


def check_vllm(raw: dict[str, Any], count: int) -> None:
    """BadAnswer unless `raw` is the vLLM reading worker's answer to `count` requests, as `vllm_runners` reads it."""
    _results(raw, count, "vllm_version", _VLLM_RESULT)
    if raw["ok"]:
        _check(raw.get("runners_available", {}), {"v1?": _TEXT, "v2?": _TEXT}, "answer.runners_available")


def check_sglang(raw: dict[str, Any], count: int) -> None:
    _results(raw, count, "sglang_version", _SGLANG_RESULT)


def clean(message: Any, limit: int = 300) -> str | None:
    """An engine's exception message on one line, without the list of every architecture it supports."""
    if message is None:
        return None
    text = " ".join(str(message).split())
    text = re.sub(r"Supported architectures: dict_keys\(\[.*?\]\)", "", text)
    text = text.replace("1 validation error for SpeculativeConfig ", "").replace("Value error, ", "")
    text = re.sub(r"\[type=value_error.*$", "", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def vllm_runners(result: dict[str, Any], version: str, target_layers: int | None,
                 runners: dict[str, str | None]) -> list[EngineReading]:
    """Each runner's reading in one checked result; only the runners `runners` says this release has."""
    basis = f"asked vLLM {version} (its own code)"
    model = result.get("model") or {}
    flags = model.get("flags") if not model.get("error") else None
    build = result.get("build")
    if model.get("basis") and result.get("runners"):
        build = f"{build}; model class {model.get('basis')}"
    out = []
    for runner in (name for name, missing in runners.items() if missing is None):
        r = (result.get("runners") or {}).get(runner)
        if r is None:
            out.append(EngineReading("vllm", runner, version, None, None, 0, None, None, basis,
                                     error=clean(result.get("error")) or "not read", build=build))
            continue
        ids = tuple(r["boundary_ids"]) if r.get("boundary_ids") is not None else None
        if ids is not None and len(ids) > LIMITS["aux_ids"].value:
            ids, r = None, {**r, "error": f"{len(ids)} ids (more than {LIMITS['aux_ids'].value})"}
        if r.get("source") == "model default" and target_layers is None:
            ids = None  # read on a stand-in depth: the real target's default is unknown
        out.append(EngineReading("vllm", runner, version, ids, r.get("source"), int(r.get("shift") or 0), flags,
                                 model.get("num_aux") if flags is not None else None, basis,
                                 error=clean(r.get("error")),
                                 build=build, model_class=model.get("class"), model_error=clean(model.get("error"))))
    return out


def vllm_target(result: dict[str, Any], version: str, target_config: dict[str, Any] | None) -> TargetSupport | None:
    return support_from_worker(result.get("target_support"), version, target_config)


def sglang_reading(result: dict[str, Any], version: str, target_layers: int | None) -> EngineReading:
    """SGLang's reading in one checked result."""
    basis = f"asked SGLang {version} (its own code)"
    if result.get("error"):
        return EngineReading("sglang", None, version, None, None, 0, None, None, basis, error=clean(result["error"]),
                             build=result.get("build"))
    capture, model = result.get("capture") or {}, result.get("model") or {}
    captured = capture.get("captured")
    ids_read = capture.get("ids_read")
    bounds = tuple(sorted(set(captured))) if captured is not None else None
    if bounds is not None and ids_read is None and target_layers is None:
        bounds = None  # the default of a stand-in depth: the real target's is unknown
    shift = 1 if ids_read and captured and sorted(set(captured)) != sorted(set(ids_read)) else 0
    drafts = bool(model.get("is_draft"))
    klass = model.get("class")
    return EngineReading("sglang", None, version, bounds, capture.get("source"), shift,
                         model.get("flags") if drafts else None, model.get("num_aux") if drafts else None, basis,
                         error=clean(capture.get("error")), build=result.get("build"),
                         model_class=klass, model_error=clean(model.get("error")),
                         skipped=tuple(model.get("skipped") or ()))


READERS: dict[str, tuple[Callable[[dict[str, Any], int], None], str]] = {
    "vllm": (check_vllm, "vllm_version"), "sglang": (check_sglang, "sglang_version")}
SGLANG_TABLE = sglang.RELEASE
