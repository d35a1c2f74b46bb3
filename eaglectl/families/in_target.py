"""`eaglectl inspect TARGET` on a target that ships its drafter inside (formats/in_target.py): the drafter named from
the tensor names (header-only), the target config keys the engine that builds it requires, checked, and the serve
line. Where vLLM reads it: DeepSeek-V4's `mtp.*` and Mistral Large 4's `mtp_dspark.*` from the target's own files
and config (Mistral's `mtp_config` is params.json's `mtp`), MiniMax-M3's from the `dspark/` subfolder, which is a
DSpark drafter of its own: `inspect TARGET/dspark` reads it as one (families/inspect.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..engines.serving import serve_line
from ..errors import EXIT_FINDINGS, EXIT_OK, CorruptCheckpointError, EaglectlError
from ..formats.in_target import InTarget, beside, held
from ..io.bounded import read_regular
from ..io.checkpoint import Checkpoint
from ..io.jsonio import MISSING, config_get, load_object
from ..limits import limit
from ..result import Result
from ..rules import Finding, scope, summarise
from ..rules import catalogue as rule
from .reading import with_text_config


@dataclass
class InTargetReport(Result):
    SCHEMA, COMMAND = "eaglectl.inspect/1", "inspect"

    target: Checkpoint
    kind: InTarget
    where: str  # the tensor prefix, or the subfolder
    tensors: int
    findings: list[Finding]
    config: dict[str, Any]  # the target's config as vLLM reads it (read once: params.json's mtp included)

    @property
    def summary(self) -> dict[str, int]:
        return summarise(self.findings)

    @property
    def exit_code(self) -> int:
        return EXIT_FINDINGS if self.summary["error"] else EXIT_OK

    def summary_line(self) -> str:
        s = self.summary
        return f"{self.kind.name} inside the target: {s['error']} error(s), {s['warning']} warning(s)"

    def speculative_config(self) -> dict[str, Any] | None:
        """vLLM's --speculative-config for it (the target serves as its own draft), when no error stands."""
        if self.summary["error"]:
            return None
        cfg: dict[str, Any] = {"method": self.kind.method}
        block = next((v for k in self.kind.block if _count(v := config_get(self.config, k))), None)
        if block is not None:
            cfg["num_speculative_tokens"] = block  # DSpark's block: sample_from_anchor, true for these
        return cfg

    def payload(self) -> dict[str, Any]:
        cfg = self.speculative_config()
        return {
            "inputs": self.target.inputs(),
            "dialect": None,
            "in_target": {"name": self.kind.name, "where": self.where, "tensors": self.tensors,
                          "method": self.kind.method, "vllm_releases": self.kind.releases,
                          "served": self.kind.served},
            "findings": [f.to_json() for f in self.findings],
            "summary": self.summary,
            "speculative_config": cfg,
            "serve_command": serve_line(self.target.source, cfg) if cfg else None,
        }


def _locate(ckpt: Checkpoint, key: str) -> str:
    """Where a key of the config vLLM reads lies: Mistral's mtp_config is params.json's `mtp`."""
    if key.startswith("mtp_config.") and "mtp_config" not in (ckpt.config or {}):
        return f"{os.path.join(ckpt.root, 'params.json')}:mtp.{key.removeprefix('mtp_config.')}"
    return f"{ckpt.config_name or os.path.join(ckpt.root, 'config.json')}:{key}"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _config(ckpt: Checkpoint) -> dict[str, Any]:
    """The target's config as vLLM reads it: config.json, with a Mistral params.json's `mtp` as `mtp_config`."""
    config = dict(ckpt.config or {})
    params = os.path.join(ckpt.root, "params.json")
    if "mtp_config" not in config and os.path.isfile(params):
        try:
            mtp = _json_object(params).get("mtp")
        except EaglectlError:  # unreadable: no mtp_config, whose keys are then named missing
            mtp = None
        if isinstance(mtp, dict):
            config["mtp_config"] = mtp
    return config


def _json_object(path: str) -> dict[str, Any]:
    """A small JSON object file, read as every config is (a regular file, bounded); raises EaglectlError."""
    raw = read_regular(path, lambda p, why: CorruptCheckpointError(f"{p}: {why}", file=p), limit("json_bytes"))
    return load_object(raw, path)


def in_target_of(ckpt: Checkpoint, for_engine: str = "vllm") -> InTargetReport | None:
    """The report on the drafter this target holds (None: it holds none eaglectl knows), for the engines
    `for_engine` names (inspect --for: a finding about another engine is advice)."""
    found = held(list(ckpt.tensor_file))
    config = _config(ckpt)
    if found is not None:
        kind, prefix, names = found
        where, count = f"{prefix}*", len(names)
    else:
        kind_ = beside(config.get("model_type"))
        if kind_ is None:
            return None
        kind, where, count = kind_, f"{kind_.subfolder}/", 0
    findings = [Finding(rule.IN_TARGET_DRAFTER, f"{kind.name} under {where}" + (f" ({count} tensors)" if count else "")
                        + f": {kind.served}", where)]
    if kind.subfolder:
        findings += _subfolder(ckpt, kind)
    else:
        findings += [Finding(rule.IN_TARGET_CONFIG, f"{why}: vLLM's method {kind.method} cannot build it",
                             _locate(ckpt, key)) for key, why in _needs(kind, config)]
        findings += _engines_disagree(ckpt, kind, config)
    return InTargetReport(ckpt, kind, where, count, scope(findings, for_engine), config)


def _needs(kind: InTarget, config: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, what is wrong) for each key vLLM requires that is absent or unreadable, each value outside what it
    accepts, and target layers it would capture beyond the target's last."""
    out = [(key, f"no '{key}' in the target's config") for key in kind.needs
           if config_get(config, key) in (MISSING, None)]
    for key, allowed in kind.choices:
        value = config_get(config, key)
        if value not in (MISSING, None) and value not in allowed:
            out.append((key, f"'{key}' is {str(value)[:40]!r}: vLLM accepts {' or '.join(allowed)}"))
    if kind.closed is not None and isinstance(obj := config_get(config, kind.closed[0]), dict):
        out += [(f"{kind.closed[0]}.{k}", f"'{kind.closed[0]}.{k}': vLLM reads no such key and refuses the block")
                for k in obj if k not in kind.closed[1]]
    value = config_get(config, kind.ids) if kind.ids else MISSING
    if value in (MISSING, None):
        return out
    ids = _layer_ids(value)
    if ids is None:
        return [*out, (kind.ids, f"'{kind.ids}' is {str(value)[:60]!r}: vLLM wants unique, ascending layer ids >= 0")]
    shift = 0 if config.get("model_type") in kind.ids_as_is else 1
    depth = config.get("num_hidden_layers")
    beyond = [i + shift for i in ids if isinstance(depth, int) and i + shift > depth]
    if beyond:
        out.append((kind.ids, f"'{kind.ids}' {ids}: vLLM captures boundaries {beyond} (ids" + (" +1" if shift else "")
                    + f"), beyond the {depth}-layer target"))
    return out


def _engines_disagree(ckpt: Checkpoint, kind: InTarget, config: dict[str, Any]) -> list[Finding]:
    """vLLM captures DeepSeek-V4's ids + 1 (V4.1's as they are); SGLang 0.5.23 captures them as they are for both:
    on a V4 target the two engines feed the drafter different layers."""
    ids = _layer_ids(config_get(config, kind.ids)) if kind.ids else None
    if ids is None or not kind.sglang_as_is or config.get("model_type") in kind.ids_as_is:
        return []
    return [Finding(rule.IN_TARGET_ENGINES_DISAGREE, f"'{kind.ids}' {ids}: vLLM captures boundaries "
                    f"{[i + 1 for i in ids]} (ids +1 for model_type {config.get('model_type')!r}), SGLang 0.5.23 "
                    f"boundaries {ids} (the attention input of each layer, for every model type): at most one of "
                    "them feeds the drafter the layers it was trained on", _locate(ckpt, kind.ids))]


def _layer_ids(value: Any) -> list[int] | None:
    """Layer ids as vLLM parses them (a list, or Mistral's comma string): unique, ascending, >= 0; else None."""
    try:
        ids = [int(x) for x in str(value).split(",") if x.strip()] if isinstance(value, str) else [
            i for i in value if isinstance(i, int) and not isinstance(i, bool)] if isinstance(value, list) else []
    except ValueError:
        return None
    ok = ids and ids == sorted(set(ids)) and ids[0] >= 0 and (not isinstance(value, list) or len(ids) == len(value))
    return ids if ok else None


def _subfolder(ckpt: Checkpoint, kind: InTarget) -> list[Finding]:
    """MiniMax-M3: the subfolder vLLM 0.34 reads, and the keys its DSpark model requires."""
    folder = os.path.join(ckpt.root, kind.subfolder)
    config_path = os.path.join(folder, "config.json")
    ref = ckpt.hub_ref
    if not os.path.isfile(config_path) and (ref is not None or not os.path.isdir(ckpt.root)):
        # a Hub target whose subfolder was not fetched with it: the subfolder is a source of its own
        sub = f"hf://{ref.repo_id}/{kind.subfolder}" if ref is not None else f"{ckpt.source}/{kind.subfolder}"
        return [Finding(rule.IN_TARGET_DRAFTER, f"not fetched with the target: eaglectl inspect {sub} reads it",
                        f"{kind.subfolder}/")]
    if not os.path.isfile(config_path):
        return [Finding(rule.IN_TARGET_CONFIG, f"no {kind.subfolder}/config.json: vLLM 0.34 refuses method "
                        f"{kind.method} for this target (\"found no draft checkpoint in the '{kind.subfolder}/' "
                        "subfolder\")", f"{kind.subfolder}/config.json")]
    try:
        sub = _json_object(config_path)
    except EaglectlError as e:
        return [Finding(rule.IN_TARGET_CONFIG, f"{kind.subfolder}/config.json unreadable ({e.message})", config_path)]
    view = with_text_config(sub)
    out = []
    archs = sub.get("architectures")
    if not (isinstance(archs, list) and archs and archs[0] == kind.architecture):
        out.append(Finding(rule.IN_TARGET_CONFIG, f"architectures is {archs}: vLLM 0.34 requires {kind.architecture} "
                           "first", f"{config_path}:architectures"))
    out += [Finding(rule.IN_TARGET_CONFIG, f"{why}: vLLM's method {kind.method} cannot build it",
                    f"{config_path}:{key}") for key, why in _needs(kind, view)]
    if view.get("dspark_use_dense_ffn") is False:
        out.append(Finding(rule.IN_TARGET_CONFIG, "dspark_use_dense_ffn is false: vLLM 0.34's MiniMax DSpark supports "
                           "dense FFN drafts only", f"{config_path}:dspark_use_dense_ffn"))
    if not out:
        out.append(Finding(rule.IN_TARGET_DRAFTER, f"the subfolder is a DSpark drafter of its own: eaglectl inspect "
                           f"{folder} checks it", f"{kind.subfolder}/"))
    return out
