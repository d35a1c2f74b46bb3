"""`eaglectl check`: the pre-publish gate — inspect, a parity self-check, optional smoke, the model card.

One summary, one exit code. Stages that cannot run here (no vLLM, no target, an MLA drafter for the
reference) are reported as skipped with the reason, never as passed. SARIF output carries the
findings for code-scanning UIs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from .errors import EXIT_FINDINGS, EaglectlError, MissingDependencyError
from .rules import RULES, Finding

SCHEMA = "eaglectl.check/1"


@dataclass
class Stage:
    name: str
    status: str  # pass | fail | skipped
    detail: str
    seconds: float = 0.0
    data: dict[str, Any] | None = None


@dataclass
class CheckReport:
    source: str
    stages: list[Stage]
    findings: list[Finding] = field(default_factory=list)
    card_written: str | None = None
    root: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_FINDINGS if any(s.status == "fail" for s in self.stages) else 0

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "tool_version": __version__, "command": "check", "source": self.source,
                "stages": [{"name": s.name, "status": s.status, "detail": s.detail, "seconds": round(s.seconds, 3),
                            "data": s.data} for s in self.stages],
                "findings": [f.to_json() for f in self.findings], "card_written": self.card_written,
                "passed": self.exit_code == 0, "exit_code": self.exit_code}


def _timed(name: str, fn: Any) -> Stage:
    t = time.perf_counter()
    stage = fn()
    stage.seconds = time.perf_counter() - t
    return stage


def check(source: str, *, target: str | None = None, run_smoke: bool = False, card: bool | None = None,
          strict: bool = False, min_acceptance: float | None = None, vllm_python: str | None = None,
          allow_pickle: bool = False) -> CheckReport:
    from .inspection import inspect_checkpoint

    stages: list[Stage] = []
    t = time.perf_counter()
    rep = inspect_checkpoint(source, target=target, strict=strict, allow_pickle=allow_pickle)
    s = rep.summary
    stages.append(Stage("inspect", "fail" if rep.exit_code else "pass",
                        f"dialect {rep.dialect.name}, EAGLE {rep.spec.eagle_version}: {s['error']} error(s), "
                        f"{s['warning']} warning(s)" + (" (strict)" if strict else "") +
                        (f", against {target}" if target else ""), time.perf_counter() - t,
                        {"dialect": rep.dialect.name, "eagle_version": rep.spec.eagle_version, "summary": s}))
    out = CheckReport(source, stages, list(rep.findings), root=rep.inputs["root"])
    stages.append(_timed("parity", lambda: _parity(source, rep, target, allow_pickle)))
    smoke_doc: dict[str, Any] | None = None
    smoke_stage = _timed("smoke", lambda: _smoke(source, rep, target, run_smoke, min_acceptance, vllm_python))
    stages.append(smoke_stage)
    if smoke_stage.status != "skipped":
        smoke_doc = smoke_stage.data
    stages.append(_timed("card", lambda: _card(out, rep, target, card, smoke_doc)))
    return out


def _parity(source: str, rep: Any, target: str | None, allow_pickle: bool) -> Stage:
    if rep.exit_code and any(f.severity == "error" for f in rep.findings):
        return Stage("parity", "skipped", "inspect found errors; the reference would refuse or mislead")
    if rep.spec.arch == "mla":
        return Stage("parity", "skipped", "the reference drafter does not run MLA drafters")
    from .parity import verify

    try:
        par = verify(source, dtype="bfloat16", target=target, tokens=32, steps=3, allow_pickle=allow_pickle)
    except MissingDependencyError as e:
        return Stage("parity", "skipped", e.message)
    except EaglectlError as e:
        return Stage("parity", "fail", f"[{e.reference}] {e.message}")
    worst = max(par.metrics, key=lambda m: m.kl_mean)
    return Stage("parity", "pass" if par.passed else "fail",
                 f"strict load into the reference drafter; bf16 vs fp32 CPU over {par.steps} steps x {par.tokens} "
                 f"anchors ({par.inputs.split(':')[0]}): KL mean <= {worst.kl_mean:.2e}, top-1 >= "
                 f"{min(m.top1_agreement for m in par.metrics):.3f}", data=par.to_json())


def _smoke(source: str, rep: Any, target: str | None, run: bool, min_acceptance: float | None,
           vllm_python: str | None) -> Stage:
    if not run:
        return Stage("smoke", "skipped", "not requested (--smoke runs the drafter under vLLM)")
    if target is None:
        return Stage("smoke", "skipped", "needs --target")
    if rep.exit_code:
        return Stage("smoke", "skipped", "inspect failed")
    from .smoke import smoke

    try:
        sm = smoke(source, target, min_acceptance=min_acceptance, vllm_python=vllm_python, concurrency=(1,)).to_json()
    except MissingDependencyError as e:
        return Stage("smoke", "skipped", e.message)
    except EaglectlError as e:
        return Stage("smoke", "fail", f"[{e.reference}] {e.message}")
    al = sm["mean_acceptance_length"]
    detail = (f"vLLM {sm['versions'].get('vllm_version')}: acceptance length {al:.3f} at k={sm['num_speculative_tokens']}"
              if al is not None else "no drafts")
    if sm["red_flags"]:
        return Stage("smoke", "fail", detail + "; " + sm["red_flags"][0], data=sm)
    return Stage("smoke", "pass", detail, data=sm)


def _card(out: CheckReport, rep: Any, target: str | None, card: bool | None, smoke_doc: dict[str, Any] | None) -> Stage:
    from .card import lint_card, load_card, render_card, write_card

    if card is False:
        return Stage("card", "skipped", "--no-card")
    if rep.inputs.get("repo_id"):
        if card:
            return Stage("card", "skipped", "cards are written into local folders, not Hub repos")
    folder = Path(rep.inputs["root"])
    existing = load_card(folder) if folder.is_dir() else None
    if card:
        path = write_card(folder, render_card(rep, target=target, smoke=smoke_doc, existing=existing))
        out.card_written = str(path)
        existing = load_card(folder)
    if existing is None:
        return Stage("card", "skipped", "no README.md (--card writes one)")
    found = lint_card(existing, rep, target)
    out.findings.extend(found)
    errors = [f for f in found if f.severity == "error"]
    return Stage("card", "fail" if errors else "pass",
                 ("written and " if card else "") + f"linted: {len(errors)} error(s), {len(found) - len(errors)} "
                 "warning(s)")


# ------------------------------------------------------------------------------------------ SARIF

def sarif(reports: list[CheckReport]) -> dict[str, Any]:
    """SARIF 2.1.0 for code-scanning UIs: one run, eaglectl's rules, every finding with its file."""
    used = sorted({f.rule for r in reports for f in r.findings})
    level = {"error": "error", "warning": "warning", "info": "note"}
    results = []
    for r in reports:
        for f in r.findings:
            uri, logical = _location(r, f)
            loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": uri}}}
            if logical:
                loc["logicalLocations"] = [{"name": logical, "kind": "member"}]
            results.append({"ruleId": f.rule, "ruleIndex": used.index(f.rule), "level": level[f.severity],
                            "message": {"text": f.message}, "locations": [loc]})
    return {
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{
            "tool": {"driver": {"name": "eaglectl", "version": __version__, "rules": [
                {"id": rid, "shortDescription": {"text": RULES[rid].title}, "help": {"text": RULES[rid].fix},
                 "defaultConfiguration": {"level": level[RULES[rid].severity]}} for rid in used]}},
            "results": results,
        }],
    }


def _location(r: CheckReport, f: Finding) -> tuple[str, str | None]:
    """(file URI relative to the working directory, tensor or key) from a finding's locator."""
    loc = f.locator or ""
    root = Path(r.root)
    if ":" in loc and not loc.startswith("/"):
        file, _, name = loc.partition(":")
        path = root / file
    elif ":" in loc:
        file, _, name = loc.rpartition(":")
        path = Path(file)
    else:
        path, name = (root / "config.json"), loc
    try:
        uri = str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        uri = path.resolve().as_uri()
    return uri, name or None
