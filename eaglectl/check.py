"""`eaglectl check`: the pre-publish gate — inspect, a parity self-check, optional smoke, the model card.

One summary, one exit code, and no stage reported as passed that did not run. A stage the user
asked for (`--smoke`, `--min-acceptance`, `--card`) that cannot run here is a failure with the
reason; only stages nobody asked for may be "skipped". The drafter is opened once. SARIF output
carries the findings for code-scanning UIs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from .errors import EXIT_FINDINGS, EaglectlError
from .progress import Progress, passthrough
from .rules import RULES, Finding

SCHEMA = "eaglectl.check/1"


@dataclass
class Stage:
    name: str
    status: str  # pass | fail | skipped
    detail: str
    seconds: float = 0.0
    data: dict[str, Any] | None = None
    requested: bool = False  # the user asked for it (a requested stage is never "skipped")


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

    def summary_line(self) -> str:
        return ", ".join(f"{s.name} {s.status}" for s in self.stages)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "tool_version": __version__, "command": "check", "source": self.source,
                "stages": [{"name": s.name, "status": s.status, "detail": s.detail, "seconds": round(s.seconds, 3),
                            "requested": s.requested, "data": s.data} for s in self.stages],
                "findings": [f.to_json() for f in self.findings], "card_written": self.card_written,
                "passed": self.exit_code == 0, "exit_code": self.exit_code}


def _timed(fn: Any) -> Stage:
    t = time.perf_counter()
    stage = fn()
    stage.seconds = time.perf_counter() - t
    return stage


def run(source: str, *, target: str | None = None, run_smoke: bool = False, card: bool | None = None,
        strict: bool = False, min_acceptance: float | None = None, vllm_python: str | None = None,
        allow_pickle: bool = False, base_model: str | None = None, measure: bool = True,
        states: str | None = None, engine_version: str | None = None, progress: Progress = passthrough
        ) -> CheckReport:
    """Run the gate on SOURCE. `min_acceptance` implies the smoke stage."""
    from .drafter import open_drafter
    from .inspect import inspect_opened
    from .target import Target

    t0 = time.perf_counter()
    d = open_drafter(source, allow_pickle=allow_pickle)
    tgt = Target.open(target, states, progress=progress)
    rep = inspect_opened(d, tgt, strict=strict, measure=measure, engine_version=engine_version, progress=progress,
                         vllm_python=vllm_python)
    s = rep.summary
    inspect_stage = Stage("inspect", "fail" if rep.exit_code else "pass",
                          f"dialect {d.dialect.name}, EAGLE {d.spec.eagle_version}: {s['error']} error(s), "
                          f"{s['warning']} warning(s)" + (" (strict)" if strict else "") +
                          (f", against {target}" if target else f", against the capture {states}" if states else ""),
                          time.perf_counter() - t0,
                          {"dialect": d.dialect.name, "eagle_version": d.spec.eagle_version, "summary": s},
                          requested=True)
    out = CheckReport(source, [inspect_stage], list(rep.findings), root=d.root)
    out.stages.append(_timed(lambda: _parity(rep)))
    wants_smoke = run_smoke or min_acceptance is not None
    smoke_stage = _timed(lambda: _smoke(rep, target, wants_smoke, min_acceptance, vllm_python, progress))
    out.stages.append(smoke_stage)
    smoke_doc = smoke_stage.data if smoke_stage.status == "pass" else None
    out.stages.append(_timed(lambda: _card(out, rep, card, smoke_doc, base_model)))
    return out


def _parity(rep: Any) -> Stage:
    if not rep.servable:
        return Stage("parity", "skipped", "inspect found errors; the reference would refuse or mislead")
    from .errors import MissingDependencyError
    from .verify import compare, real_inputs, synthetic_inputs

    try:
        loaded = rep.drafter.reference()
        t = rep.opened_target
        if t is not None and t.has_states:
            inputs = real_inputs(t, loaded, 32, 3)
        else:
            inputs = synthetic_inputs(loaded.args, loaded.spec.aux_layer_ids_vllm, 32, 3, 0)
        par = compare(loaded, loaded, inputs, "precision", ("bfloat16", "cpu"), ("float32", "cpu"), 3, 32, 0)
    except MissingDependencyError as e:
        return Stage("parity", "skipped", e.message)
    except EaglectlError as e:
        return Stage("parity", "fail", f"[{e.reference}] {e.message}")
    worst = max(par.metrics, key=lambda m: m.kl_mean)
    return Stage("parity", "pass" if par.passed else "fail",
                 f"strict load into the reference drafter; bf16 vs fp32 CPU over {par.steps} steps x {par.tokens} "
                 f"anchors ({par.inputs.split(':')[0]}): KL mean <= {worst.kl_mean:.2e}, top-1 >= "
                 f"{min(m.top1_agreement for m in par.metrics):.3f}", data=par.to_json())


def _smoke(rep: Any, target: str | None, requested: bool, min_acceptance: float | None,
           vllm_python: str | None, progress: Progress) -> Stage:
    if not requested:
        return Stage("smoke", "skipped", "not requested (--smoke runs the drafter under vLLM)")
    why_not = ("needs --target" if target is None else
               "inspect found errors" if not rep.servable else None)
    if why_not:
        return Stage("smoke", "fail", f"requested but cannot run: {why_not}", requested=True)
    from . import smoke

    try:
        sm = smoke.measure(rep.drafter, rep.opened_target, min_acceptance=min_acceptance, vllm_python=vllm_python,
                           concurrency=(1,), measured=rep.measured, progress=progress).to_json()
    except EaglectlError as e:
        return Stage("smoke", "fail", f"requested but failed: [{e.reference}] {e.message}", requested=True)
    al = sm["mean_acceptance_length"]
    detail = (f"vLLM {sm['versions'].get('vllm_version')}: acceptance length {al:.3f} at k={sm['num_speculative_tokens']}"
              if al is not None else "no drafts")
    if min_acceptance is not None:
        detail += f" (--min-acceptance {min_acceptance:g})"
    if sm["red_flags"]:
        return Stage("smoke", "fail", detail + "; " + sm["red_flags"][0], data=sm, requested=True)
    return Stage("smoke", "pass", detail, data=sm, requested=True)


def _card(out: CheckReport, rep: Any, card: bool | None, smoke_doc: dict[str, Any] | None,
          explicit_base: str | None) -> Stage:
    from .card import base_model, load_card, render_card, write_card
    from .rules.card import lint_card, lint_profile

    if card is False:
        return Stage("card", "skipped", "--no-card")
    if rep.drafter.ckpt.hub_ref is not None:
        if card:
            return Stage("card", "fail", "requested but cannot run: cards are written into local folders, not Hub repos",
                         requested=True)
    folder = Path(rep.drafter.root)
    base = base_model(rep, explicit_base)
    profile, profile_findings = lint_profile(folder, rep.drafter) if folder.is_dir() else (None, [])
    out.findings.extend(profile_findings)  # speculation_profile.json: validated; its figures go on the card
    try:
        existing = load_card(folder) if folder.is_dir() else None
        if card:
            path = write_card(folder, render_card(rep, base=base, smoke=smoke_doc, existing=existing, profile=profile))
            out.card_written = str(path)
            existing = load_card(folder)
    except EaglectlError as e:
        return Stage("card", "fail", f"[{e.reference}] {e.message}", requested=bool(card))
    if existing is None:
        bad = [f for f in profile_findings if f.severity == "error"]
        if bad:
            return Stage("card", "fail", f"[{bad[0].rule_id}] {bad[0].message}")
        return Stage("card", "skipped", "no README.md (--card writes one)")
    from .inspect import speculative_config

    found = lint_card(existing, rep.drafter, base, speculative_config(rep.drafter)["num_speculative_tokens"])
    out.findings.extend(found)
    found = profile_findings + found
    errors = [f for f in found if f.severity == "error"]
    note = "" if base else "; base_model unknown (pass --base-model ORG/NAME)"
    return Stage("card", "fail" if errors else "pass",
                 ("written and " if card else "") + f"linted: {len(errors)} error(s), {len(found) - len(errors)} "
                 "warning(s)" + note, requested=bool(card))


# ------------------------------------------------------------------------------------------ SARIF

def sarif(reports: list[CheckReport]) -> dict[str, Any]:
    """SARIF 2.1.0 for code-scanning UIs: one run, eaglectl's rules, every finding with its file."""
    used = sorted({f.rule_id for r in reports for f in r.findings})
    level = {"error": "error", "warning": "warning", "info": "note"}
    results = []
    for r in reports:
        for f in r.findings:
            uri, logical = _location(r, f)
            loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": uri}}}
            if logical:
                loc["logicalLocations"] = [{"name": logical, "kind": "member"}]
            results.append({"ruleId": f.rule_id, "ruleIndex": used.index(f.rule_id), "level": level[f.severity],
                            "message": {"text": f.message}, "locations": [loc]})
    return {
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{
            "tool": {"driver": {"name": "eaglectl", "version": __version__, "rules": [
                {"id": rid, "shortDescription": {"text": RULES[rid].title},
                 **({"help": {"text": RULES[rid].hint()}} if RULES[rid].fix else {}),
                 "defaultConfiguration": {"level": level[RULES[rid].severity.value]}} for rid in used]}},
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
    except (ValueError, OSError):
        uri = path.resolve().as_uri()
    return uri, name or None
