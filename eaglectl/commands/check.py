"""`eaglectl check`: the pre-publish gate — inspect, a parity self-check, optional smoke, the model card.

One summary, one exit code, and no stage reported as passed that did not run. A stage that eaglectl
cannot run — this machine lacks a piece (vLLM, a device), or eaglectl's reference drafter lacks a feature
the drafter uses — is "undecided" with the reason and what would let it run, never "fail": the gate
exits 10 where nothing failed, and `upload` refuses it as undecided. A stage the user asked for
(`--smoke`, `--min-acceptance`, `--card`) that cannot run for a reason of the drafter's or the options
fails; only stages nobody asked for may be "skipped". The drafter is opened once. SARIF output carries the
findings for code-scanning UIs.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..checkpoint.drafter import open_drafter
from ..checkpoint.publish import is_local_path, upload_files
from ..engines.engine_process import find_vllm_python
from ..errors import (
    EXIT_FINDINGS,
    EaglectlError,
    MissingDependencyError,
    OutputOverlapError,
    ReferenceLimitError,
    filesystem_error,
)
from ..families.checkpoint import open_any
from ..families.inspect import inspect_family
from ..io.atomic import check_outputs, local_inputs, write_file
from ..measure.target import Target
from ..progress import Progress, passthrough
from ..result import Result
from ..rules import RULES, Finding
from ..rules.card import lint_card, lint_profile
from ..rules.publish import lint_publish, local_path_findings
from .card import CARD, base_model, load_card, render_card
from .inspect import inspect_opened
from .requests import CheckRequest, SmokeRequest
from .smoke import command as smoke

if TYPE_CHECKING:
    from ..checkpoint.drafter import DrafterCheckpoint
    from ..families.checkpoint import FamilyCheckpoint
    from ..families.inspect import FamilyReport
    from ..measure.probe import Measurement
    from ..measure.target import Target
    from .inspect import InspectReport


@dataclass
class Stage:
    name: str
    status: str  # pass | fail | undecided (eaglectl could not run it: see `environment`) | skipped
    detail: str
    seconds: float = 0.0
    data: dict[str, Any] | None = None
    requested: bool = False  # the user asked for it (a requested stage is never "skipped")
    environment: bool = False  # undecided because this machine cannot run it (no vLLM, no device)


@dataclass
class CheckReport(Result):
    SCHEMA, COMMAND = "eaglectl.check/1", "check"

    source: str
    stages: list[Stage]
    findings: list[Finding] = field(default_factory=list)
    card_written: str | None = None
    root: str = ""
    config_written: str | None = None  # --card --base-model named the speculators verifier in config.json

    @property
    def exit_code(self) -> int:
        """1 when a stage failed on the drafter; else 10 when a stage is undecided (eaglectl could not run it
        here: rerun where vLLM is, or measure what its reference cannot run with vLLM); else 0."""
        if any(s.status == "fail" for s in self.stages):
            return EXIT_FINDINGS
        return MissingDependencyError.exit_code if any(s.status == "undecided" for s in self.stages) else 0

    def summary_line(self) -> str:
        return ", ".join(f"{s.name} {s.status}" for s in self.stages)

    @property
    def verdict(self) -> str:
        """PASS, FAIL, or UNDECIDED (nothing failed, but eaglectl could not run every stage)."""
        return {0: "PASS", EXIT_FINDINGS: "FAIL"}.get(self.exit_code, "UNDECIDED")

    def payload(self) -> dict[str, Any]:
        return {"source": self.source,
                "stages": [{"name": s.name, "status": s.status, "detail": s.detail, "seconds": round(s.seconds, 3),
                            "requested": s.requested, "environment": s.environment, "data": s.data}
                           for s in self.stages],
                "findings": [f.to_json() for f in self.findings], "card_written": self.card_written,
                "config_written": self.config_written,
                "passed": self.exit_code == 0, "verdict": self.verdict}


def _timed(fn: Callable[[], Stage]) -> Stage:
    t = time.perf_counter()
    stage = fn()
    stage.seconds = time.perf_counter() - t
    return stage


# What the smoke stage passes to `smoke.measure` when the user gave nothing (the CLI's defaults).
# the findings `--card --base-model` fixes by writing the verifier into config.json
NAMING_FIXES = ("verifier-unnamed", "verifier-local-path", "verifier-local-path-rejected")


def run(req: CheckRequest, progress: Progress = passthrough) -> CheckReport:
    """Run the gate on the request's source (`check`'s, `upload`'s or a manifest line's). `--min-acceptance`, or
    any of the smoke stage's options, implies the smoke stage."""

    source, target, states, strict = req.source, req.target, req.states, req.strict
    given = req.smoke_given()
    t0 = time.perf_counter()
    d = open_any(source, allow_pickle=req.allow_pickle)
    tgt = Target.open(target, states, progress=progress)
    others = local_inputs(tgt, given.get("prompts"))
    check_outputs({"--sarif": req.sarif_path}, [*others, *local_inputs(d)])
    if req.card and d.ckpt.hub_ref is None:  # the card goes into the drafter's folder, beside its files

        check_outputs({"the model card": Path(d.ckpt.root) / CARD}, [*others, *d.ckpt.identities])
    wants_smoke = req.run_smoke or req.min_acceptance is not None or bool(given)
    # the target loaded once: one concurrency; a capture of continuations replays as many tokens as it holds
    replayed = tgt is not None and tgt.states is not None and tgt.states.continuation is not None
    smoke = SmokeRequest(source, target or "", min_acceptance=req.min_acceptance, vllm_python=req.vllm_python,
                         concurrency=(1,), preflight=False, **({"max_tokens": 0} if replayed else {}), **given)
    missing = _environment(wants_smoke and target is not None, smoke)  # before the slow stages, not after them
    if not d.eagle3_layout:  # DFlash, DSpark: their own layout
        return _family_gate(req, d, tgt, smoke, wants_smoke, missing, progress)  # type: ignore[arg-type]
    rep = inspect_opened(d, tgt, strict=strict, measure=req.measure,
                         engine_version=req.engine_version, progress=progress, vllm_python=req.vllm_python,
                         sglang_python=req.sglang_python, for_engine=req.for_engine)
    inspect_stage = Stage("inspect", _inspect_status(rep),
                          f"dialect {rep.summary_line()}" + (" (strict)" if strict else "") +
                          (f", against {target}" if target else f", against the capture {states}" if states else ""),
                          time.perf_counter() - t0,
                          {"dialect": d.dialect.name, "eagle_version": d.spec.eagle_version, "summary": rep.summary},
                          requested=True)
    out = CheckReport(source, [inspect_stage], list(rep.findings), root=d.root)

    def timed(name: str, fn: Callable[[], Stage]) -> Stage:  # a stage the CI log's heartbeat names
        stage = None
        for _ in progress([0], label=f"check: {name}", total=1):
            stage = _timed(fn)
        assert stage is not None
        return stage

    out.stages.append(timed("parity", lambda: _parity(rep)))  # the CPU runs it: a failure here fails the gate anywhere
    if missing is None or not rep.servable:
        smoke_stage = timed("smoke", lambda: _smoke(rep.drafter, rep.opened_target, rep.servable, rep.measured,
                                                    wants_smoke, smoke, progress))
    else:  # only the smoke stage is undecided: rerun the gate where it can run
        smoke_stage = undecided("smoke", missing, requested=True)
    out.stages.append(smoke_stage)
    smoke_doc = smoke_stage.data if smoke_stage.status == "pass" else None
    out.stages.append(timed("card", lambda: _card(out, rep, req.card, smoke_doc, req.base_model)))
    out.stages.append(timed("publish", lambda: _publish(out, rep)))
    resolved = sorted({f.rule_id for f in rep.findings if f not in out.findings})
    if resolved:  # the inspect row's counts are inspect's; the list shows what the later stages left of them
        inspect_stage.detail += f" ({', '.join(resolved)} resolved by the later stages: not listed)"
    return out


@contextlib.contextmanager
def gates(sarif_path: str | None,
          progress: Progress = passthrough) -> Iterator[Callable[[CheckRequest], CheckReport]]:
    """Yield `run` that keeps each report; when the block ends (an error or an exit included), the
    reports made so far are written to `sarif_path` as SARIF 2.1.0, all or nothing."""
    reports: list[CheckReport] = []
    refused: list[tuple[str, EaglectlError]] = []  # items stopped before a report: each is a SARIF result too
    read: list[str] = []  # every local path an item named: the SARIF file never lands on one

    def gate(req: CheckRequest) -> CheckReport:
        read.extend(local_inputs(req.source, req.target, req.states, *req.smoke_given().values()))
        try:
            reports.append(run(req, progress))
        except OutputOverlapError:
            raise  # the SARIF path (or another output) is an input: nothing is written
        except EaglectlError as e:
            refused.append((req.source, e))
            raise
        return reports[-1]

    try:
        yield gate
    finally:
        if sarif_path and (reports or refused):
            try:
                check_outputs({"--sarif": sarif_path}, read)  # again, for the items that stopped before run's check
            except EaglectlError:
                pass  # refused already or refused now: never written over an input (the item's own error stands)
            else:
                write_file(sarif_path, (json.dumps(sarif(reports, refused), indent=1) + "\n").encode())


def _publish(out: CheckReport, rep: InspectReport) -> Stage:
    """The files an upload would send (after the card stage wrote README.md): no local path, and a drafter
    the loaders it meets on the Hub can load (rules/publish.py)."""
    drafter = rep.drafter
    if out.config_written:  # the card stage named the verifier: lint the config as it is now

        drafter = open_drafter(drafter.root, from_dialect=drafter.dialect.name)
    return _publish_files(out, Path(drafter.root), drafter.ckpt.hub_ref is not None, drafter)


def _publish_files(out: CheckReport, folder: Path, remote: bool, drafter: DrafterCheckpoint | None) -> Stage:
    """The publish stage on `folder`: its files, and the findings about publishing them (an EAGLE-3 `drafter`'s
    loader rules too; a family's: local paths only)."""

    if remote and not folder.is_dir():
        return Stage("publish", "skipped", "a Hub repo, read remotely: its files are published already")
    try:
        files = upload_files(folder)  # refuses a link out of the folder, a FIFO, a device: before reading any file
        found = lint_publish(drafter, folder) if drafter is not None else local_path_findings(folder)
    except EaglectlError as e:
        return Stage("publish", "fail", f"[{e.reference}] {e.message}")
    if any(f.rule_id == "speculators-null-verifier" for f in found):  # says all verifier-unnamed says, and more
        out.findings = [f for f in out.findings if f.rule_id != "verifier-unnamed"]
    out.findings.extend(found)
    errors = [f for f in found if f.severity == "error"]
    local = sum(f.rule_id == "local-path" for f in found)
    return Stage("publish", "fail" if errors else "pass",
                 f"{len(files)} file(s) an upload would send: " + (f"{local} local path(s)" if local else
                                                                   "no local path")
                 + (f", {len(found) - local} warning(s)" if len(found) > local else ""),
                 data={"files": [rel for rel, _ in files]})


def _environment(smoke_wanted: bool, smoke: SmokeRequest) -> MissingDependencyError | None:
    """What this machine lacks for a requested stage, found in a second at the start rather than after the inspect
    and parity stages: the vLLM interpreter of a vLLM smoke (not a --server one, nor the reference loop's)."""
    if not smoke_wanted or smoke.engine != "vllm" or smoke.server is not None:
        return None

    try:
        find_vllm_python(smoke.vllm_python)
    except MissingDependencyError as e:
        return e
    return None


def _inspect_status(rep: InspectReport | FamilyReport) -> str:
    """fail on inspect's failure; undecided where eaglectl could not tell what an engine the gate is for reads
    (a rule marked `undecided`); else pass."""
    if rep.exit_code:
        return "fail"
    return "undecided" if any(f.rule.undecided and f.other_engine is None for f in rep.findings) else "pass"


def undecided(name: str, e: EaglectlError, requested: bool = False) -> Stage:
    """A stage eaglectl could not run: this machine lacks a piece, or its reference drafter lacks a feature."""
    why = "cannot run here" if isinstance(e, MissingDependencyError) else "beyond eaglectl's reference drafter"
    return Stage(name, "undecided", f"{why}: [{e.reference}] {e.message}" + (f"; {e.hint}" if e.hint else ""),
                 requested=requested, environment=isinstance(e, MissingDependencyError))


def _parity(rep: InspectReport) -> Stage:
    if not rep.servable:
        return Stage("parity", "skipped", "inspect found errors; the reference would refuse or mislead")
    from ..measure.parity import compare, real_inputs, synthetic_inputs

    try:
        from ..model.loader import CHAIN_UNUSED, load_reference
        loaded = load_reference(rep.drafter)
        t = rep.opened_target
        if t is not None and t.has_states:
            inputs = real_inputs(t, loaded, 32, 3)
        else:
            inputs = synthetic_inputs(loaded.args, loaded.spec.aux_layer_ids_vllm, 32, 3, 0)
        par = compare(loaded, loaded, inputs, "precision", ("bfloat16", "cpu"), ("float32", "cpu"), 3, 32, 0)
    except (MissingDependencyError, ReferenceLimitError) as e:
        if isinstance(e, ReferenceLimitError):
            e.measure_with(rep.drafter.ckpt.source, rep.target.source if rep.target is not None else None)
        return undecided("parity", e)
    except EaglectlError as e:
        return Stage("parity", "fail", f"[{e.reference}] {e.message}")
    worst = max(par.metrics, key=lambda m: m.kl_mean)
    # what the chain never reads (P-EAGLE's mask_hidden) is not run, so its values are checked here
    unused = [(c, rep.drafter.ckpt.count_nonfinite(rep.drafter.view.stored[c])) for c in sorted(CHAIN_UNUSED)
              if c in rep.drafter.view]
    bad = [f"'{c}' has {n} NaN/Inf values" for c, n in unused if n]
    not_run = (f"; not run by the reference (it drafts the chain): {', '.join(c for c, _ in unused)}, "
               + ("; ".join(bad) if bad else "finite")) if unused else ""
    failed = par.breached()
    measured = (f"failed {failed} ({par.regime} tolerance)" if failed else
                f"KL mean <= {worst.kl_mean:.2e}, top-1 >= {min(m.top1_agreement for m in par.metrics):.3f}, "
                f"state cos >= {min(m.state_cos_mean for m in par.metrics):.4f}")
    return Stage("parity", "pass" if par.passed and not bad else "fail",
                 f"strict load into the reference drafter; bf16 vs fp32 CPU over {par.steps} steps x {par.tokens} "
                 f"anchors ({par.inputs.split(':')[0]}): {measured}{not_run}", data=par.to_json())


def _smoke(d: DrafterCheckpoint | FamilyCheckpoint, t: Target | None, servable: bool, measured: Measurement | None,
           requested: bool, req: SmokeRequest, progress: Progress) -> Stage:
    if not requested:
        return Stage("smoke", "skipped", "not requested (--smoke runs the drafter under vLLM, --engine reference "
                     "under eaglectl's reference loop)")
    why_not = ("needs --target" if t is None else
               "inspect found errors" if not servable else None)
    if why_not:
        return Stage("smoke", "fail", f"requested but cannot run: {why_not}", requested=True)
    assert t is not None

    try:
        sm = smoke.measure(d, t, req, measured=measured, progress=progress).to_json()
    except (MissingDependencyError, ReferenceLimitError) as e:  # eaglectl cannot run it: undecided (exit 10)
        return undecided("smoke", e, requested=True)
    except EaglectlError as e:
        return Stage("smoke", "fail", f"requested but failed: [{e.reference}] {e.message}", requested=True)
    al = sm["mean_acceptance_length"]
    engine = (f"vLLM {sm['versions'].get('vllm_version')}" if sm["engine"] == "vllm" else
              "the reference loop" if sm["engine"] == "reference" else str(sm["engine"]))
    detail = (f"{engine}: acceptance length {al:.3f} at k={sm['num_speculative_tokens']} on "
              f"{sm['prompts']['description']}" if al is not None else f"{engine}: no drafts")
    if req.min_acceptance is not None:
        detail += f" (--min-acceptance {req.min_acceptance:g})"
    if sm["red_flags"]:
        return Stage("smoke", "fail", detail + "; " + sm["red_flags"][0], data=sm, requested=True)
    return Stage("smoke", "pass", detail, data=sm, requested=True)


def _family_gate(req: CheckRequest, d: FamilyCheckpoint, t: Target | None, smoke: SmokeRequest, wants_smoke: bool,
                 missing: MissingDependencyError | None, progress: Progress) -> CheckReport:
    """The gate for a drafter of a family read in its own layout (DFlash, DSpark): its inspect, and smoke when asked
    (vLLM serves the family's method). Parity is undecided (eaglectl's reference drafter runs none of these methods),
    and eaglectl writes and lints EAGLE-3 model cards only."""

    t0 = time.perf_counter()
    # its values read too: no parity stage runs these weights, so NaN / Inf would pass the gate unseen
    rep = inspect_family(d, t.checkpoint if t is not None else None, strict=req.strict, scan=True, progress=progress,
                       for_engine=req.for_engine)
    servable = not rep.summary["error"]
    reading = d.family.reading
    assert reading is not None
    out = CheckReport(req.source, [Stage("inspect", _inspect_status(rep), rep.summary_line()
                                         + (" (strict)" if req.strict else "")
                                         + (f", against {req.target}" if req.target else ""),
                                         time.perf_counter() - t0, {"family": d.family.id, "summary": rep.summary},
                                         requested=True)],
                      list(rep.findings), root=d.ckpt.root)
    limit = ReferenceLimitError(f"{d.source}: {d.family.name}: {reading.reference}")
    limit.measure_with(d.source, req.target)  # vLLM serves the method
    out.stages.append(undecided("parity", limit)
                      if servable else Stage("parity", "skipped", "inspect found errors"))
    out.stages.append(undecided("smoke", missing, requested=True) if missing is not None else
                      _timed(lambda: _smoke(d, t, servable, None, wants_smoke, smoke, progress)))
    out.stages.append(Stage("card", "undecided", f"beyond eaglectl: it writes model cards from an EAGLE-3 report, and "
                            f"this is a {d.family.name} drafter", requested=True) if req.card else
                      Stage("card", "skipped", f"not linted: eaglectl lints EAGLE-3 model cards ({d.family.name})"))
    out.stages.append(_timed(lambda: _publish_files(out, Path(d.ckpt.root), d.ckpt.hub_ref is not None, None)))
    return out


def _card(out: CheckReport, rep: InspectReport, card: bool | None, smoke_doc: dict[str, Any] | None,
          explicit_base: str | None) -> Stage:

    folder = Path(rep.drafter.root)
    # speculation_profile.json is validated whether or not a card is linted: upload sends it, and refuses it broken
    profile, profile_findings = lint_profile(folder, rep.drafter) if folder.is_dir() else (None, [])
    out.findings.extend(profile_findings)  # its figures go on the card
    if card is False:
        bad = [f for f in profile_findings if f.severity == "error"]
        return Stage("card", "fail", f"--no-card; [{bad[0].rule_id}] {bad[0].message}") if bad else Stage(
            "card", "skipped", "--no-card")
    if rep.drafter.ckpt.hub_ref is not None and card:
        return Stage("card", "fail", "requested but cannot run: cards are written into local folders, not Hub repos",
                     requested=True)
    base = base_model(rep, explicit_base)
    try:
        existing = load_card(folder) if folder.is_dir() else None
        if card and explicit_base:
            out.config_written = name_verifier(rep.drafter, explicit_base)
            if out.config_written:  # what inspect found of the unnamed verifier no longer holds
                out.findings = [f for f in out.findings if f.rule_id not in NAMING_FIXES]
        if card:
            text = render_card(rep, base=base, smoke=smoke_doc, existing=existing, profile=profile)
            out.card_written = str(write_file(folder / CARD, text.encode("utf-8"), doing="write the model card"))
            existing = load_card(folder)
    except EaglectlError as e:
        return Stage("card", "fail", f"[{e.reference}] {e.message}", requested=bool(card))
    if existing is None:
        bad = [f for f in profile_findings if f.severity == "error"]
        if bad:
            return Stage("card", "fail", f"[{bad[0].rule_id}] {bad[0].message}")
        return Stage("card", "skipped", "no README.md (--card writes one)" + (
            "; the config's verifier stays null (--card --base-model writes it)"
            if explicit_base and _unnamed_verifier(rep.drafter) else ""))
    found = lint_card(existing, rep.drafter, base, rep.drafter.speculative_tokens)
    out.findings.extend(found)
    found = profile_findings + found
    errors = [f for f in found if f.severity == "error"]
    note = "" if base else "; base_model unknown (pass --base-model ORG/NAME)"
    if out.config_written:
        note += f"; config.json names the verifier {explicit_base}"
    elif explicit_base and not card and _unnamed_verifier(rep.drafter):
        note += "; the config's verifier stays null (--card --base-model writes it)"
    return Stage("card", "fail" if errors else "pass",
                 ("written and " if card else "") + f"linted: {len(errors)} error(s), {len(found) - len(errors)} "
                 "warning(s)" + note, requested=bool(card))


def _unnamed_verifier(d: DrafterCheckpoint) -> bool:
    """A speculators config whose verifier is null or a local path (vllm serve DRAFTER cannot find the target)."""

    verifier = None if d.dialect.config_style == "hf" else d.config.dict("speculators_config.verifier")
    if verifier is None:
        return False
    name = verifier.get("name_or_path")
    return name is None or (isinstance(name, str) and is_local_path(name))


def name_verifier(d: DrafterCheckpoint, base: str) -> str | None:
    """Write `base` (a Hub id) as the speculators verifier into the drafter's config.json when it is null or a
    local path; the file is replaced atomically, its other keys untouched. The path written, or None."""


    if not _unnamed_verifier(d) or d.ckpt.config_name is None:
        return None
    path = Path(d.ckpt.config_name)
    config = json.loads(path.read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = base
    try:
        mode = path.stat().st_mode & 0o777
        fd, tmp = tempfile.mkstemp(prefix=".config.json.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(config, indent=2) + "\n")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        raise filesystem_error(e, "write the verifier into", path) from None
    return str(path)


# ------------------------------------------------------------------------------------------ SARIF

STAGE_LEVEL = {"fail": "error", "undecided": "warning"}  # a stage that did not pass is a SARIF result of its own


def sarif(reports: list[CheckReport], refused: Sequence[tuple[str, EaglectlError]] = ()) -> dict[str, Any]:
    """SARIF 2.1.0 for code-scanning UIs: one run, eaglectl's rules, every finding with its file, every stage
    that failed or is undecided (a parity or smoke failure has no finding) as rule `check-STAGE` on the drafter's
    config.json, and every item stopped before its report (a source not found, unreadable) as rule `check-error`
    on the source, with the error's reference and message."""
    used = sorted({f.rule_id for r in reports for f in r.findings})
    stages = sorted({s.name for r in reports for s in r.stages if s.status in STAGE_LEVEL} |
                    ({"error"} if refused else set()))
    ids = used + [f"check-{name}" for name in stages]
    level = {"error": "error", "warning": "warning", "info": "note"}
    results = []
    for r in reports:
        for f in r.findings:
            uri, logical = _location(r, f.locator or "")
            loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": uri}}}
            if logical:
                loc["logicalLocations"] = [{"name": logical, "kind": "member"}]
            results.append({"ruleId": f.rule_id, "ruleIndex": ids.index(f.rule_id), "level": level[f.severity],
                            "message": {"text": f.message}, "locations": [loc]})
        for s in r.stages:
            if s.status in STAGE_LEVEL:
                uri, _ = _location(r, "")
                results.append({"ruleId": f"check-{s.name}", "ruleIndex": ids.index(f"check-{s.name}"),
                                "level": STAGE_LEVEL[s.status], "message": {"text": f"{s.name} {s.status}: {s.detail}"},
                                "locations": [{"physicalLocation": {"artifactLocation": {"uri": uri}}}]})
    for source, e in refused:
        results.append({"ruleId": "check-error", "ruleIndex": ids.index("check-error"), "level": "error",
                        "message": {"text": f"error[{e.reference}] (exit {e.exit_code}): {e.message}"},
                        "locations": [{"physicalLocation": {"artifactLocation": {"uri": _relative(Path(source))}}}]})
    return {
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{
            "tool": {"driver": {"name": "eaglectl", "version": __version__, "rules": [
                {"id": rid, "shortDescription": {"text": RULES[rid].title},
                 **({"help": {"text": RULES[rid].hint()}} if RULES[rid].fix else {}),
                 "defaultConfiguration": {"level": level[RULES[rid].severity.value]}} for rid in used] + [
                {"id": f"check-{name}", "shortDescription": {"text": "the check gate stopped before its report"
                                                             if name == "error" else
                                                             f"the check gate's {name} stage did not pass"},
                 "defaultConfiguration": {"level": "error"}} for name in stages]}},
            "results": results,
        }],
    }


def _location(r: CheckReport, loc: str) -> tuple[str, str | None]:
    """(file URI relative to the working directory, tensor or key) from a finding's locator ("": config.json)."""
    root = Path(r.root)
    if ":" in loc and not loc.startswith("/"):
        file, _, name = loc.partition(":")
        path = root / file
    elif ":" in loc:
        file, _, name = loc.rpartition(":")
        path = Path(file)
    else:
        path, name = (root / "config.json"), loc
    return _relative(path), name or None


def _relative(path: Path) -> str:
    """A file's SARIF URI: relative to the working directory, else absolute (file://)."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        return path.resolve().as_uri()
