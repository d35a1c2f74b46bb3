"""`eaglectl inspect`: dialect, spec, tensor summary, findings and a vLLM speculative config."""

from __future__ import annotations

import json
import os
import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from . import __version__, formats
from .checkpoint import Checkpoint, open_checkpoint
from .errors import EXIT_FINDINGS, EXIT_OK, CheckpointNotFoundError
from .formats import Detection, Dialect, config_get
from .reading import CanonicalView, probe_of, read_spec
from .rules import Context, Finding, TargetFacts, run_checks, summarise
from .spec import DrafterSpec

SCHEMA = "eaglectl.inspect/1"


@dataclass
class InspectReport:
    source: str
    inputs: dict[str, Any]
    dialect: Dialect
    forced: bool
    detections: list[Detection]
    spec: DrafterSpec
    tensors: dict[str, Any]
    findings: list[Finding]
    speculative_config: dict[str, Any]
    serve_command: str
    target: dict[str, Any] | None
    strict: bool
    canonical_names: dict[str, str] = field(default_factory=dict)

    @property
    def summary(self) -> dict[str, int]:
        return summarise(self.findings)

    @property
    def exit_code(self) -> int:
        s = self.summary
        return EXIT_FINDINGS if s["error"] or (self.strict and s["warning"]) else EXIT_OK

    @property
    def evidence(self) -> tuple[str, ...]:
        if self.forced:
            return ("--from given",)
        return next(d.evidence for d in self.detections if d.dialect == self.dialect.name)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool_version": __version__,
            "command": "inspect",
            "inputs": self.inputs,
            "dialect": self.dialect.name,
            "dialect_evidence": list(self.evidence),
            "dialect_forced": self.forced,
            "candidates": [{"dialect": d.dialect, "score": d.score, "evidence": list(d.evidence)}
                           for d in self.detections],
            "eagle_version": self.spec.eagle_version,
            "arch": self.spec.arch,
            "spec": self.spec.to_json(),
            "spec_sources": dict(self.spec.sources),
            "tensors": self.tensors,
            "findings": [f.to_json() for f in self.findings],
            "summary": self.summary,
            "speculative_config": self.speculative_config,
            "serve_command": self.serve_command,
            "target": self.target,
            "strict": self.strict,
            "exit_code": self.exit_code,
        }


def inspect_checkpoint(
    source: str,
    *,
    target: str | None = None,
    from_dialect: str | None = None,
    strict: bool = False,
    scan: bool = False,
    allow_pickle: bool = False,
    revision: str | None = None,
    progress: Any = None,
) -> InspectReport:
    ckpt = open_checkpoint(source, allow_pickle=allow_pickle, revision=revision)
    dialect, detections = formats.detect(probe_of(ckpt), from_dialect, where=ckpt.root)
    view = CanonicalView(ckpt, dialect)
    spec, invalid = read_spec(ckpt, dialect, view)
    target_facts = open_target(target) if target else None
    ctx = Context(ckpt, dialect, view, spec, invalid, target_facts, scan)
    if progress is not None:
        ctx.progress = progress
    findings = run_checks(ctx)
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order[f.severity])
    spec_config, serve = speculative_config(ckpt, target)
    return InspectReport(
        source=source,
        inputs=_inputs(ckpt),
        dialect=dialect,
        forced=from_dialect is not None,
        detections=detections,
        spec=spec,
        tensors=tensor_summary(ckpt),
        findings=findings,
        speculative_config=spec_config,
        serve_command=serve,
        target=_target_summary(target_facts),
        strict=strict,
        canonical_names=dict(view.stored),
    )


def open_target(source: str) -> TargetFacts:
    """A target model: its config (required) and lazy access to its weights when present."""
    ckpt = open_checkpoint(source, weights_required=False)
    if ckpt.config is None:
        raise CheckpointNotFoundError(f"{source}: target has no config.json", path=source)
    return TargetFacts(source, ckpt.config, ckpt)


def _target_summary(t: TargetFacts | None) -> dict[str, Any] | None:
    if t is None:
        return None
    tc = t.text_config()
    out = {k: tc.get(k) for k in ("architectures", "model_type", "hidden_size", "num_hidden_layers", "vocab_size",
                                   "rope_theta", "tie_word_embeddings")}
    out["architectures"] = t.config.get("architectures")
    out["source"] = t.source
    if t.ckpt is not None and t.ckpt.hub_ref is not None:
        out["revision"] = t.ckpt.hub_ref.sha
    return out


def _inputs(ckpt: Checkpoint) -> dict[str, Any]:
    out: dict[str, Any] = {
        "source": ckpt.source,
        "root": ckpt.root,
        "layout": ckpt.layout,
        "files": [f.name for f in ckpt.files],
        "config": ckpt.config_name,
    }
    if ckpt.hub_ref is not None:
        out["repo_id"] = ckpt.hub_ref.repo_id
        out["revision"] = ckpt.hub_ref.revision
        out["sha"] = ckpt.hub_ref.sha
    return out


def tensor_summary(ckpt: Checkpoint) -> dict[str, Any]:
    infos = ckpt.tensors.values()
    return {
        "count": len(ckpt.tensors),
        "parameters": sum(i.numel for i in infos),
        "bytes": sum(i.nbytes for i in infos),
        "dtypes": dict(sorted(Counter(i.dtype for i in infos).items())),
        "files": len(ckpt.files),
    }


def speculative_config(ckpt: Checkpoint, target: str | None) -> tuple[dict[str, Any], str]:
    """The vLLM `--speculative-config` for this drafter: method is always explicit (pitfall 2)."""
    k = config_get(ckpt.config, "speculators_config.proposal_methods")
    tokens = 3
    if isinstance(k, list) and k and isinstance(k[0], dict) and isinstance(k[0].get("speculative_tokens"), int):
        tokens = k[0]["speculative_tokens"]
    cfg: dict[str, Any] = {"method": "eagle3"}
    if ckpt.hub_ref is not None:
        cfg["model"] = ckpt.hub_ref.repo_id + (f"/{ckpt.hub_ref.subfolder}" if ckpt.hub_ref.subfolder else "")
        if ckpt.hub_ref.sha:
            cfg["revision"] = ckpt.hub_ref.sha
    else:
        cfg["model"] = os.path.abspath(ckpt.root)
    cfg["num_speculative_tokens"] = tokens
    cfg["draft_tensor_parallel_size"] = 1
    verifier = config_get(ckpt.config, "speculators_config.verifier.name_or_path")
    served = target or (verifier if isinstance(verifier, str) and verifier else "<target-model>")
    command = f"vllm serve {shlex.quote(served)} --speculative-config {shlex.quote(json.dumps(cfg))}"
    return cfg, command
