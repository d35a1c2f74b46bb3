"""`eaglectl inspect` on a DFlash or DSpark drafter: the family named with the evidence, its canonical spec, what
each vLLM runner captures, and the family's traps (families/rules.py), header-only (docs/families.md).

These layouts are not EAGLE-3's, so no dialect reads them: `inspect`, `check`, `smoke` and `convert` (between the
family's layouts) take this report instead of EAGLE-3's; `upgrade`, `verify` and the rest refuse them by name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..checkpoint.target import TargetCheckpoint
from ..engines.readings import Readings
from ..engines.serving import serve_line
from ..errors import EXIT_FINDINGS, EXIT_OK
from ..progress import Progress, passthrough
from ..result import Result
from ..rules import Finding, scope, summarise
from .checkpoint import FamilyCheckpoint
from .reading import family_readings
from .rules import family_findings, target_depth
from .validate import scan as scan_values


@dataclass
class FamilyReport(Result):
    SCHEMA, COMMAND = "eaglectl.inspect/1", "inspect"

    drafter: FamilyCheckpoint
    target: TargetCheckpoint | None
    readings: Readings
    findings: list[Finding]
    strict: bool

    @property
    def summary(self) -> dict[str, int]:
        return summarise(self.findings)

    @property
    def exit_code(self) -> int:
        s = self.summary
        return EXIT_FINDINGS if s["error"] or (self.strict and s["warning"]) else EXIT_OK

    def summary_line(self) -> str:
        s = self.summary
        return f"{self.drafter.family.name} (not EAGLE-3): {s['error']} error(s), {s['warning']} warning(s)"

    def speculative_config(self) -> dict[str, Any] | None:
        """vLLM's --speculative-config for it, when no error stands (num_speculative_tokens: the block's drafts)."""
        reading = self.drafter.family.reading
        assert reading is not None
        if self.summary["error"]:
            return None
        ckpt = self.drafter.ckpt
        cfg: dict[str, Any] = {"method": reading.method, "model": ckpt.hub_ref.repo_id if ckpt.hub_ref is not None
                               else os.path.abspath(ckpt.root)}
        block = self.drafter.int_field("block_size")
        # a block of queries: with the anchor among them (DSpark's sample_from_anchor, as vLLM reads it) it drafts a
        # token per query; else the anchor is the bonus token and the rest draft
        anchored = any(value for r, value in self.drafter.anchor_reads() if r.engine == "vllm")
        if block is not None and block > 1:
            cfg["num_speculative_tokens"] = block if anchored else block - 1
        return cfg | dict(reading.serve_extra)

    def payload(self) -> dict[str, Any]:
        d = self.drafter
        cfg = self.speculative_config()
        return {
            "inputs": d.ckpt.inputs(),
            "dialect": None,
            "family": {"id": d.family.id, "name": d.family.name, "evidence": list(d.evidence),
                       "served_by": d.family.served_by, "why_not_eagle3": d.family.why},
            "spec": d.spec(),
            "tensors": {"count": len(d.ckpt.tensor_file), "files": len(d.ckpt.files)},
            "findings": [f.to_json() for f in self.findings],
            "summary": self.summary,
            "speculative_config": cfg,
            "serve_command": serve_line(self.target.source if self.target else "<target-model>", cfg) if cfg else None,
            "target": self.target.summary() if self.target else None,
            "engine_readings": self.readings.to_json(),
            "strict": self.strict,
        }


def inspect_family(d: FamilyCheckpoint, target: TargetCheckpoint | None, *, strict: bool = False,
                   for_engine: str = "vllm", scan: bool = False, progress: Progress = passthrough) -> FamilyReport:
    """Read a DFlash / DSpark drafter and check its traps against the target's config, when one is given (opened
    by the caller: smoke's pre-flight passes the target it has open); `scan`: read every tensor for NaN / Inf."""
    reading = d.family.reading
    assert reading is not None
    depth, _ = target_depth(d, target)
    readings = family_readings(d.config, reading.runners, depth, d.ckpt.root)
    where = d.ckpt.config_name or f"{d.ckpt.root}/config.json"
    scanned = scan_values(d, progress) if scan else []
    findings = scope(family_findings(d, target, readings, where, scanned), for_engine)
    return FamilyReport(d, target, readings, findings, strict)
