"""`eaglectl inspect`: dialect, spec, tensor summary, findings and a vLLM speculative config."""

from __future__ import annotations

import functools
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checkpoint.drafter import DrafterCheckpoint, open_files
from ..checkpoint.target import TargetCheckpoint, open_target
from ..engines import sglang
from ..engines.asking import readings_for
from ..engines.facts import engines_of, release_of
from ..engines.readings import scope_note
from ..engines.serving import serve_line, speculative_config
from ..errors import EXIT_FINDINGS, EXIT_OK, UnknownFormatError
from ..families.checkpoint import interpret_any, of_checkpoint
from ..families.in_target import InTargetReport, in_target_of
from ..families.inspect import inspect_family
from ..measure.target import Target
from ..progress import Progress, passthrough
from ..result import Result
from ..rules import Context, Finding, blocking, hint_values, run_checks, scope, summarise
from ..rules.base import target_args
from .convert.plan import count_carriers
from .requests import InspectRequest

if TYPE_CHECKING:
    from ..families.checkpoint import FamilyCheckpoint
    from ..families.inspect import FamilyReport


@dataclass
class InspectReport(Result):
    SCHEMA, COMMAND = "eaglectl.inspect/1", "inspect"

    drafter: DrafterCheckpoint
    opened_target: Target | None  # what the command opened, loaded and ran of the target (check reuses it)
    findings: list[Finding]
    strict: bool
    measured: Any = None  # probe.Measurement when the target could be run
    measured_note: str | None = None  # why nothing was measured
    readings: Any = None  # engines.readings.Readings: what each engine reads (asked of it, else assumed)
    engine_version: str | None = None
    for_engine: str = "vllm"  # inspect --for: the engines the findings are judged for (one, or a comma list)
    merged_convert: str | None = None  # the one conversion the report offers, when its fixes named several

    @property
    def target(self) -> TargetCheckpoint | None:
        return self.opened_target.checkpoint if self.opened_target is not None else None

    @property
    def summary(self) -> dict[str, int]:
        return summarise(self.findings)

    @functools.cached_property
    def family(self) -> FamilyCheckpoint | None:
        """The family read in the EAGLE-3 layout (P-EAGLE), with its evidence; None for a plain EAGLE-3 drafter."""

        return of_checkpoint(self.drafter.ckpt)

    @property
    def exit_code(self) -> int:
        s = self.summary
        return EXIT_FINDINGS if s["error"] or (self.strict and s["warning"]) else EXIT_OK

    @property
    def servable(self) -> bool:
        """vLLM can serve the files as they are: a dialect it loads, no error-level finding."""
        return self.drafter.dialect.vllm_loads and self.summary["error"] == 0

    def summary_line(self) -> str:
        s, d = self.summary, self.drafter
        return f"{d.dialect.name}, EAGLE {d.spec.eagle_version}: {s['error']} error(s), {s['warning']} warning(s)"

    def tensor_summary(self) -> dict[str, Any]:
        ckpt = self.drafter.ckpt
        infos = ckpt.tensors.values()
        return {
            "count": len(ckpt.tensors),
            "parameters": sum(i.numel for i in infos),
            "bytes": sum(i.nbytes for i in infos),
            "dtypes": dict(sorted(Counter(i.dtype for i in infos).items())),
            "files": len(ckpt.files),
        }

    @property
    def engines(self) -> tuple[str, ...]:
        return engines_of(self.for_engine)

    def speculative_config(self) -> dict[str, Any] | None:
        if not self.servable or self.unservable("vllm"):
            return None
        fam = self.family
        extra = fam.family.reading.serve_extra if fam is not None and fam.family.reading is not None else {}
        return speculative_config(self.drafter) | dict(extra)  # P-EAGLE: parallel_drafting

    def unservable(self, engine: str) -> list[str]:
        """Why `engine` does not serve the drafter as its files are (the findings that say so): no serve line."""
        return [f"{f.rule_id}: {f.message}" for f in self.findings if f.rule.unservable and f.rule.engine == engine]

    def wrong_layers(self, engine: str = "vllm") -> list[str]:
        """Why the engine's serve line as printed would serve the drafter on other target layers than it reads (on
        any of vLLM's runners): the findings that say so, and a measured reading the engine does not capture."""
        why = [f"{f.rule_id}: {f.message}" for f in self.findings
               if f.rule.wrong_layers and f.rule.engine in ((None, "vllm") if engine == "vllm" else (engine,))]
        if engine != "vllm":
            return why
        trained = self.measured.boundary_ids if self.measured is not None else None
        if trained is not None and self.readings is not None and not why:
            for r in self.readings.runners:
                if r.boundary_ids is not None and tuple(r.boundary_ids) != tuple(trained):
                    why.append(f"vLLM's {r.runner.upper()} runner captures {list(r.boundary_ids)}; measured: trained "
                               f"on {list(trained)}")
        return why

    def serve_fix(self) -> str | None:
        """The command that makes the serve line right, when it is withheld for wrong layers."""
        from ..text import COMMAND

        if blocking(self.findings) or not self.wrong_layers():
            return None
        if (rec := self.recommendation()) is not None:  # one command for vLLM: it writes the layers right too
            return rec
        for f in self.findings:
            if f.rule.wrong_layers and f.rule.engine in (None, "vllm") and f.hint and (m := COMMAND.search(f.hint)):
                return m.group()

        return hint_values(self.drafter, self.target)["to_runners"]

    def recommendation(self) -> str | None:
        """One command for the engine the report is for, when a conversion repairs a finding that counts (error
        or warning): `convert --for vllm` (the dialect vLLM serves it from best), or SpecForge's layout for sglang."""

        if blocking(self.findings) or not any(f.rule.repaired_by_convert and f.severity in ("error", "warning")
                                              for f in self.findings):
            return None
        if self.merged_convert is not None:
            return self.merged_convert

        v = hint_values(self.drafter, self.target)
        how = f"--for {self.for_engine}"
        needs = target_args(self.drafter, self.target, None if self.engines == ("vllm",) else "specforge")
        if self.target is None and any(f.rule.fix and "{convert_t}" in f.rule.fix and f.severity != "info"
                                       for f in self.findings):
            needs = " --target TARGET"  # a table only the target holds (lm_head rows, a measured flag)
        return f"eaglectl convert {v['source']} DEST {how}{needs}{v['pickle']}"

    def serve_command(self) -> str | None:
        cfg = self.speculative_config()
        if cfg is None or self.wrong_layers() or "vllm" not in self.engines:
            return None
        verifier = self.drafter.config.str("speculators_config.verifier.name_or_path")
        return serve_line(self.target.source if self.target else (verifier or "<target-model>"), cfg)

    def sglang_serve_command(self) -> str | None:
        """SGLang's launch line, for --for sglang, where SGLang builds an EAGLE-3 drafter from the files and no
        finding stands against serving it there."""
        reading = self.readings.engine("sglang") if self.readings is not None else None
        if "sglang" not in self.engines or reading is None or reading.error or reading.model_error or \
                self.summary["error"] or self.wrong_layers("sglang"):
            return None
        ref = self.drafter.ckpt.hub_ref
        drafter = ref.repo_id if ref is not None else os.path.abspath(self.drafter.root)
        return sglang.serve_line(self.target.source if self.target else "<target-model>", drafter,
                                 self.drafter.spec.sliding_window)

    def payload(self) -> dict[str, Any]:

        d = self.drafter
        return {
            "inputs": inputs(d),
            "dialect": d.dialect.name,
            "dialect_evidence": list(d.evidence),
            "dialect_forced": d.forced,
            "family": ({"id": fam.family.id, "name": fam.family.name, "evidence": list(fam.evidence)}
                       if (fam := self.family) is not None else None),
            "candidates": [{"dialect": x.dialect, "score": x.score, "evidence": list(x.evidence)}
                           for x in d.detections],
            "eagle_version": d.spec.eagle_version,
            "arch": d.spec.arch,
            "spec": d.spec.to_json(),
            "spec_sources": dict(d.spec.sources),
            "tensors": self.tensor_summary(),
            "findings": [f.to_json() for f in self.findings],
            "summary": self.summary,
            "speculative_config": self.speculative_config(),
            "serve_command": self.serve_command(),
            "sglang_serve_command": self.sglang_serve_command(),
            "recommendation": {"engine": self.for_engine, "command": self.recommendation()},
            "serve_withheld": self.wrong_layers(),
            "serve_fix": self.serve_fix(),
            "target": self.target.summary() if self.target else None,
            "measured": self.measured.to_json() if self.measured is not None else None,
            "measured_note": self.measured_note,
            "engine_readings": self.readings.to_json(self.engines) if self.readings is not None else [],
            "engine_readings_note": scope_note(self.readings, self.engine_version) if self.readings else None,
            "engine_readings_notes": {e: n for e, n in self.readings.notes.items() if e in self.engines}
            if self.readings else {},
            "target_support": self.readings.target.to_json() if self.readings and self.readings.target else None,
            "for": self.for_engine,
            "other_engine_findings": [{"rule_id": f.rule_id, "engine": f.rule.engine,
                                       "rule_severity": f.rule.severity.value}
                                      for f in self.findings if f.other_engine is not None],
            "strict": self.strict,
        }


def run(req: InspectRequest, progress: Progress = passthrough) -> InspectReport | FamilyReport | InTargetReport:
    """Open SOURCE, name its dialect and run every rule. With a target, check against its config and, when it can
    be run (weights and a tokenizer), measure what the files cannot settle (`probe.measure`)."""

    files = open_files(req.source, allow_pickle=req.allow_pickle, revision=req.revision)
    try:
        d = interpret_any(files, req.from_dialect)
    except UnknownFormatError as e:  # a target: the drafter it may ship inside is read where vLLM reads it
        found = in_target_of(files, req.for_engine) if e.context.get("target") and not (req.target or req.states) \
            else None
        if found is None:
            raise
        return found
    if not d.eagle3_layout:  # a family read in its own layout (DFlash, DSpark): families/inspect.py
        return inspect_family(d, open_target(req.target) if req.target else None,  # type: ignore[arg-type]
                              strict=req.strict, for_engine=req.for_engine, scan=req.scan, progress=progress)
    return inspect_opened(d, Target.open(req.target, req.states, progress=progress), progress=progress,
                          strict=req.strict, scan=req.scan, measure=req.measure, engine_version=req.engine_version,
                          vllm_python=req.vllm_python, sglang_python=req.sglang_python, for_engine=req.for_engine)


def inspect_opened(d: DrafterCheckpoint, t: Target | None, *, strict: bool = False, scan: bool = False,
                   measure: bool = True, progress: Progress = passthrough,
                   engine_version: str | None = None, vllm_python: str | None = None,
                   sglang_python: str | None = None, for_engine: str = "vllm") -> InspectReport:
    """Inspect an opened drafter; with a runnable target, or a capture of one, measure too (the target
    object keeps what it loaded and ran, for the caller's next steps). What each engine reads is asked of it where
    an interpreter is at hand (engines/asking.readings_for)."""

    readings = readings_for(d, t, vllm_python=vllm_python, sglang_python=sglang_python,
                            engine_version=engine_version, engines=engines_of(for_engine), progress=progress)
    measured, note = None, None
    checkpoint = t.checkpoint if t is not None else None
    if t is not None and measure:
        note = t.why_not_measurable()
        if note is None and any(f.severity == "error" for f in run_checks(Context(d, checkpoint))):
            # the probe needs a drafter the reference can build
            note = "not measured: inspect finds errors that keep the reference drafter from running"
        if note is None:
            from ..measure.probe import try_measure  # torch and transformers: only when the target can be run

            measured, note = try_measure(d, t, progress=progress)
    ctx = Context(d, checkpoint, scan, measured, readings=readings)
    ctx.engine_version = release_of(engine_version, "vllm")
    ctx.for_engines = engines_of(for_engine)
    ctx.progress = progress
    findings = run_checks(ctx)
    _count_fix(d, checkpoint, findings)
    report = InspectReport(d, t, scope(findings, for_engine), strict, measured, note, readings, engine_version,
                           for_engine)
    _one_convert(report)
    return report


# the placeholders that name a conversion (rules/base.py hint_values)
CONVERTS = ("convert", "convert_t", "to_vllm", "to_runners", "to_count", "to_named", "to_mla", "to_both")


def _one_convert(report: InspectReport) -> None:
    """One report offers one conversion, the one that fixes the most: where its fixes name different ones, each
    names the merged command instead. Its dialect: the count carrier where aux-count-unsized chose one (vLLM reads
    the count from that layout only), else the one every fix names, else `--for vllm` (SpecForge's layout for
    --for sglang); its target: --target where any fix needs the target (it names the verifier too), else
    --base-model ORG/NAME where one names the verifier. The recommendation line is that command too."""
    used = [(f, k) for f in report.findings if f.values is not None and f.rule.fix
            for k in CONVERTS if "{" + k + "}" in f.rule.fix and f.values[k].startswith("eaglectl convert ")]
    commands = {f.values[k] for f, k in used if f.values is not None}
    rec = report.recommendation()
    if len(commands | ({rec} if rec else set())) <= 1:
        return
    v = next(f.values for f, _ in used if f.values is not None) if used else None
    if v is None:
        return
    words = [c.split() for c in commands]
    dests = {" ".join(w[4:6]) for w in words}
    count = next((f.values["to_count"].split()[4:6] for f, k in used if k == "to_count" and f.values), None)
    how = (" ".join(count) if count else next(iter(dests)) if len(dests) == 1 and rec is None else
           f"--for {report.for_engine}")
    text = " ".join(commands | ({rec} if rec else set()))
    given = report.target is not None and f" --target {v['target']}" in text
    needs = (f" --target {v['target']}" if given else " --target TARGET" if "--target TARGET" in text else "") + (
        " --base-model ORG/NAME" if "--base-model ORG/NAME" in text else "")  # a local target names no verifier
    merged = f"eaglectl convert {v['source']} DEST {how}{needs}{v['pickle']}"
    for f, k in used:
        assert f.values is not None
        f.values[k] = merged
    if rec is not None:
        report.merged_convert = merged


def _count_fix(d: DrafterCheckpoint, target: TargetCheckpoint | None, findings: list[Finding]) -> None:
    """aux-count-unsized's fix names a dialect whose written config vLLM reads the count from (each writable
    dialect planned and read), the drafter's own first; none: the fix says so."""
    unsized = [f for f in findings if f.rule_id == "aux-count-unsized" and f.values is not None]
    count = d.spec.num_aux_hidden_states
    if not unsized or count is None:
        return

    carriers = sorted(count_carriers(d, count, target), key=lambda name: name != d.dialect.name)
    for f in unsized:
        assert f.values is not None
        f.values["to_count"] = (re.sub(r"--to \S+", f"--to {carriers[0]}", f.values["convert"]) if carriers else
                                f"no dialect eaglectl writes makes vLLM build fc for {count} aux states: "
                                "retrain with 3, or serve it with an engine that reads the count")


def inputs(d: DrafterCheckpoint) -> dict[str, Any]:
    return d.ckpt.inputs()
