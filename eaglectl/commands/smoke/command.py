"""`eaglectl smoke`: run a drafter under real vLLM (or the reference loop) and measure acceptance.

vLLM runs in its own interpreter (`--vllm-python`, `EAGLECTL_VLLM_PYTHON`, else this one) through
`workers/vllm_smoke.py`, JSON in and out, with its log kept. Prompts are tokenized here with the target's
tokenizer and sent as token ids, so every engine and baseline sees the same tokens. Greedy,
`ignore_eos`, fixed `max_tokens`; counters are deltas around the measured batch.

Definitions (docs/math.md#acceptance, vLLM's): mean acceptance length AL = 1 + accepted / drafts (bonus token
included); accepted draft length = AL - 1; draft acceptance rate = accepted / draft tokens;
per-position rate i = accepted at position i / drafts.

Drafter families beside EAGLE-3 (formats/families.py, docs/families.md#smoke-what-vllms-cpu-build-serves): a
P-EAGLE drafter is served as `eagle3` with the family's extra keys (`parallel_drafting`), a DFlash / DSpark drafter
by its own method, opened header-only in its own layout. Where smoke cannot measure one (the reference loop runs
none of them; a CPU build of vLLM runs V1, which refuses DSpark) it says undecided and why (`smoke_limit`): exit 13
for the reference loop's limit, 10 for the engine's, as `check` maps them.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import __version__
from ...checkpoint.drafter import DrafterCheckpoint, open_drafter
from ...engines.asking import config_folder, readings_for
from ...engines.engine_process import WorkerRun, engine_path, find_vllm_python, vllm_has_gpu
from ...engines.readings import Readings
from ...errors import MissingDependencyError, ReferenceLimitError, SmokeFailedError, UsageError
from ...families.checkpoint import FamilyCheckpoint, family_of, open_any
from ...families.inspect import inspect_family
from ...formats.families import smoke_limit
from ...io.atomic import check_outputs, local_inputs
from ...measure.workload import PromptSet, load_prompts, needs_chat, tokenizer_of
from ...progress import Progress, passthrough
from ...result import Result, verdict
from ..requests import SmokeRequest
from . import runner as runner_smoke
from .runner import RunnerRun

if TYPE_CHECKING:
    from ...measure.probe import Measurement
    from ...measure.reading import ServedReading
    from ...measure.target import Target
    from ...model.replay import LoopCounts

GPU_RUNNER_RULES = ("aux-ids-runner-split", "aux-ids-runner-count")  # rules/runners.py
NEAR_ONE = 1.05


@dataclass
class Baseline:
    name: str
    kind: str  # none | ngram | draft_model | eagle3
    path: str | None = None
    opened: DrafterCheckpoint | None = field(default=None, repr=False, compare=False)  # eagle3, once opened


BASELINE_KINDS = ("none", "ngram", "draft_model:PATH", "eagle3:PATH", "a drafter folder")
# methods smoke does not offer as baselines, and why (vLLM 0.33 removed both: config/speculative.py)
NOT_OFFERED = {"medusa": "vLLM 0.33 removed method medusa (smoke measures what current vLLM serves)",
               "mlp_speculator": "vLLM 0.33 removed method mlp_speculator"}


def parse_baselines(text: str | None) -> list[Baseline]:
    """`none`, `ngram`, `draft_model:PATH`, `eagle3:PATH` (or a drafter path), comma-separated.
    Raises ValueError naming the first item that is none of these."""
    out: list[Baseline] = []
    items = (text or "").split(",")
    for raw in items:
        item = raw.strip()
        if not item:
            if len(items) > 1:
                raise ValueError(f"empty item in {text!r}")
            continue
        kind, _, rest = item.partition(":")
        if kind in NOT_OFFERED:
            raise ValueError(f"baseline '{item}' is not offered: {NOT_OFFERED[kind]}")
        if item in ("none", "ngram"):
            out.append(Baseline(item, item))
        elif kind == "draft_model" or kind in ("eagle3", "eagle"):
            if not rest.strip():
                raise ValueError(f"'{item}' names no model: use {kind}:PATH")
            out.append(Baseline(item if kind == "draft_model" else f"eagle3:{rest}",
                                "draft_model" if kind == "draft_model" else "eagle3", rest))
        elif "/" in item or Path(item).exists():
            out.append(Baseline(f"eagle3:{item}", "eagle3", item))
        else:
            raise ValueError(f"unknown baseline '{item}' (one of: {', '.join(BASELINE_KINDS)})")
    return out


# ---------------------------------------------------------------------------------------- report

@dataclass
class ConfigResult:
    name: str
    kind: str
    path: str | None
    counters: dict[str, Any] | None  # num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_pos
    outputs: list[list[int]] | None
    throughput: list[dict[str, Any]] = field(default_factory=list)
    load_seconds: float | None = None
    generate_seconds: float | None = None
    skipped: str | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)  # per prompt: counts, tpot_s, ttft_s
    groups: list[dict[str, Any]] = field(default_factory=list)  # extra prompt sets: label, counters, requests

    @property
    def mean_acceptance_length(self) -> float | None:
        c = self.counters
        return 1 + c["num_accepted_tokens"] / c["num_drafts"] if c and c["num_drafts"] else None

    def by_context_length(self, labels: list[dict[str, Any]], prompts: list[list[int]]) -> list[dict[str, Any]]:
        """--context-lengths groups, then the workload's own throughput buckets (SPEED-Bench)."""
        rows = [{"context_length": g["label"]["context_length"], **acceptance_summary(g["counters"], g["requests"])}
                for g in self.groups if "context_length" in g["label"]]
        buckets = sorted({lab["bucket"] for lab in labels if lab.get("bucket")}, key=lambda b: int(b[:-1]))
        for b in buckets:
            idx = [i for i, lab in enumerate(labels) if lab.get("bucket") == b]
            rows.append({"context_length": round(sum(len(prompts[i]) for i in idx) / len(idx)), "bucket": b,
                         **acceptance_summary(None, [self.requests[i] for i in idx if i < len(self.requests)])})
        return rows

    def by_category(self, labels: list[dict[str, Any]]) -> list[dict[str, Any]]:
        cats = sorted({lab["category"] for lab in labels if lab.get("category")})
        return [{"category": c, **acceptance_summary(None, [self.requests[i] for i, lab in enumerate(labels)
                                                     if lab.get("category") == c and i < len(self.requests)])}
                for c in cats]

    def to_json(self, reference_outputs: list[list[int]] | None, labels: list[dict[str, Any]],
                prompts: list[list[int]]) -> dict[str, Any]:
        c = self.counters
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "path": self.path, "skipped": self.skipped}
        if c is not None:
            a = acceptance_summary(c, self.requests)
            al = a["mean_acceptance_length"]
            out.update({
                "mean_acceptance_length": al,
                "accepted_draft_length": None if al is None else al - 1,
                "draft_acceptance_rate": (c["num_accepted_tokens"] / c["num_draft_tokens"] if c["num_draft_tokens"]
                                          else None),
                "per_position_acceptance": a["per_position_acceptance"],
                "num_drafts": c["num_drafts"], "num_draft_tokens": c["num_draft_tokens"],
                "num_accepted_tokens": c["num_accepted_tokens"], "accepted_per_pos": c["accepted_per_pos"],
                "mean_acceptance_length_per_request": a["mean_acceptance_length_per_request"],
                "by_context_length": self.by_context_length(labels, prompts),
                "by_category": self.by_category(labels),
            })
        out["requests"] = self.requests
        if self.outputs is not None and reference_outputs is not None:
            same = sum(a == b for a, b in zip(self.outputs, reference_outputs, strict=False))
            out["greedy_match"] = same / len(reference_outputs)
        out["throughput"] = self.throughput
        out["load_seconds"] = self.load_seconds
        out["generate_seconds"] = self.generate_seconds
        return out


def acceptance_summary(counters: dict[str, Any] | None, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """AL both ways the ecosystem reports it: pooled (1 + accepted / drafts, vLLM's counters) and the mean
    over requests of each request's own AL (SPEED-Bench's); pooled from `requests` when no counters."""
    rows = [r for r in requests if r.get("num_drafts")]
    c = counters or {"num_drafts": sum(r["num_drafts"] for r in rows),
                     "num_accepted_tokens": sum(r["num_accepted_tokens"] for r in rows),
                     "num_draft_tokens": sum(r.get("num_draft_tokens", 0) for r in rows),
                     "accepted_per_pos": [sum(x) for x in zip(*(r["accepted_per_pos"] for r in rows), strict=True)]
                     if rows and all("accepted_per_pos" in r for r in rows) else []}
    drafts = c["num_drafts"]
    return {
        "requests": len(requests),
        "mean_acceptance_length": 1 + c["num_accepted_tokens"] / drafts if drafts else None,
        "mean_acceptance_length_per_request": (sum(1 + r["num_accepted_tokens"] / r["num_drafts"] for r in rows)
                                               / len(rows) if rows else None),
        "per_position_acceptance": [a / drafts for a in c["accepted_per_pos"]] if drafts else [],
        "num_drafts": drafts, "num_accepted_tokens": c["num_accepted_tokens"],
    }


@dataclass
class SmokeReport(Result):
    SCHEMA, COMMAND = "eaglectl.smoke/1", "smoke"

    drafter: str
    target: str
    engine: str
    k: int
    dtype: str
    max_tokens: int
    prompts: PromptSet
    results: list[ConfigResult]
    versions: dict[str, Any]
    red_flags: list[str]
    log: str | None = None
    min_acceptance: float | None = None
    engine_reading: ServedReading | None = None  # vLLM engine only
    engine_reading_note: str | None = None
    plot: str | None = None
    profile: str | None = None  # --profile: the speculation_profile.json written
    runner: str | None = None  # --runner as given (None: the default)
    runs: list[RunnerRun] = field(default_factory=list)  # one per vLLM runner measured
    readings: Readings | None = None  # the runners' readings of the drafter on the target
    intended: dict[str, Any] | None = None  # the drafter's intended reading: boundary_ids, basis
    serving: dict[str, Any] | None = None  # the serving options that make AL comparable (runner_smoke)
    reference_layers: dict[str, Any] | None = None  # --engine reference: the layers it ran and where from
    runner_flags: list[str] = field(default_factory=list)
    family: dict[str, Any] | None = None  # a family beside EAGLE-3: id, name, the method and keys vLLM was given

    @property
    def main(self) -> ConfigResult:
        return self.results[0]

    def reference_outputs(self) -> list[list[int]] | None:
        none = next((r for r in self.results if r.kind == "none" and r.outputs is not None), None)
        return none.outputs if none else None

    def speedups(self) -> list[dict[str, Any]]:
        none = next((r for r in self.results if r.kind == "none" and r.throughput), None)
        if none is None:
            return []
        base = {t["concurrency"]: t["per_user_tokens_per_s"] for t in none.throughput if t["per_user_tokens_per_s"]}
        rows = []
        for r in self.results:
            for t in r.throughput:
                if t["concurrency"] in base and r.kind != "none" and t["per_user_tokens_per_s"]:
                    rows.append({"config": r.name, "concurrency": t["concurrency"],
                                 "speedup": t["per_user_tokens_per_s"] / base[t["concurrency"]]})
        return rows

    @property
    def exit_code(self) -> int:
        return SmokeFailedError.exit_code if self.red_flags else 0

    def failure(self) -> SmokeFailedError | None:
        return SmokeFailedError(self.red_flags[0], reported=True) if self.red_flags else None

    def summary_line(self) -> str:
        al = self.payload()["mean_acceptance_length"]
        return f"AL {'-' if al is None else f'{al:.3f}'}; {verdict(self.exit_code)}"

    def payload(self) -> dict[str, Any]:
        ref = self.reference_outputs()
        labels, prompts = self.prompts.labels, self.prompts.prompts
        main = self.main.to_json(ref, labels, prompts)
        return {
            "engine": self.engine,
            "drafter": self.drafter, "target": self.target, "num_speculative_tokens": self.k, "dtype": self.dtype,
            "max_tokens": self.max_tokens, "prompts": {"set": self.prompts.name, "description": self.prompts.description,
                                                        "count": len(self.prompts.prompts)},
            **{key: main.get(key) for key in ("mean_acceptance_length", "accepted_draft_length",
                                              "draft_acceptance_rate", "per_position_acceptance", "num_drafts",
                                              "num_draft_tokens", "num_accepted_tokens",
                                              "mean_acceptance_length_per_request")},
            **{key: main.get(key, []) for key in ("by_context_length", "by_category", "requests")},
            "greedy_match": main.get("greedy_match"),
            "baselines": [r.to_json(ref, labels, prompts) for r in self.results[1:]],
            "speedup": self.speedups(), "versions": self.versions, "red_flags": self.red_flags,
            "min_acceptance": self.min_acceptance,
            "engine_reading": self.engine_reading.to_json() if self.engine_reading is not None else None,
            "engine_reading_note": self.engine_reading_note,
            "runner": self.runner, "runners": [r.to_json() for r in self.runs],
            "engine_readings": self.readings.to_json() if self.readings is not None else [],
            "intended_reading": self.intended, "serving_options": self.serving,
            "reference_layers": self.reference_layers, "log": self.log, "plot": self.plot,
            "profile": self.profile, "family": self.family,
        }


# ------------------------------------------------------------------------------------------ run

def speculative_config(kind: str, path: str | None, k: int, extra: dict[str, Any] | None = None
                       ) -> dict[str, Any] | None:
    """vLLM's --speculative-config for one configuration; a drafter's kind is its method (eagle3, or a family's:
    dflash, dspark), with the family's extra keys (P-EAGLE: parallel_drafting)."""
    if kind == "none":
        return None
    if kind == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if kind == "draft_model":
        return {"method": "draft_model", "model": engine_path(path), "num_speculative_tokens": k}
    return {"method": kind, "model": engine_path(path),
            "num_speculative_tokens": k, "draft_tensor_parallel_size": 1, **(extra or {})}


def run(req: SmokeRequest, progress: Progress = passthrough) -> SmokeReport:
    """Measure DRAFTER on TARGET under vLLM (or the reference loop); `preflight` inspects every drafter first."""
    from ...measure.target import Target
    from ..inspect import inspect_opened

    d = open_any(req.drafter)
    t = Target.open(req.target, progress=progress, dtype=req.dtype)
    assert t is not None
    baselines = [replace(b, opened=open_drafter(b.path)) if b.kind == "eagle3" and b.path else b
                 for b in req.baselines]
    for opened in ([d] if req.preflight else []) + [b.opened for b in baselines if b.opened is not None]:
        if not opened.eagle3_layout:  # its own layout: the family's rules, header-only
            findings = inspect_family(opened, t.checkpoint).findings  # type: ignore[arg-type]
        else:
            findings = inspect_opened(opened, t, measure=False).findings  # engine_reading measures what vLLM ran
        # the GPU runner's reading does not stop a run here (CPU vLLM and the reference loop run V1's)
        first = next((f for f in findings if f.severity == "error" and f.rule_id not in GPU_RUNNER_RULES), None)
        if first is not None:
            raise SmokeFailedError(f"{opened.source}: pre-flight inspect found errors, first [{first.rule_id}] "
                                   f"{first.message}", hint=f"eaglectl inspect {opened.source} --target {req.target}")
    return measure(d, t, replace(req, baselines=tuple(baselines)), progress=progress)


def _measurable(fc: FamilyCheckpoint, engine: str, python: str | None, runner: str | None) -> None:
    """Refuse, as undecided, a family this engine cannot measure: the limit is eaglectl's or the engine's, never
    the drafter's (ReferenceLimitError and MissingDependencyError are `check`'s undecided)."""
    reading = fc.family.reading
    assert reading is not None
    gpu = vllm_has_gpu(python) if python is not None and reading.runners.get("v1") is not None else None
    why = smoke_limit(fc.family, engine, gpu)
    if why is not None:
        said = (f"{fc.source}: {fc.family.name} (method {reading.method}): undecided, smoke cannot measure it here: "
                f"{why}")
        if engine == "reference":
            raise ReferenceLimitError(said)
        raise MissingDependencyError(said, hint="a vLLM build whose runner serves the method "
                                     "(docs/families.md#smoke-what-vllms-cpu-build-serves)")
    if runner is not None and not reading.eagle3_layout:
        raise UsageError(f"--runner: the runners' readings are EAGLE-3's; {fc.family.name} is measured as vLLM "
                         "runs it here")


def measure(d: DrafterCheckpoint | FamilyCheckpoint, target: Target, req: SmokeRequest, *,
            measured: Measurement | None = None, progress: Progress = passthrough) -> SmokeReport:
    """Smoke an opened drafter on an opened target (check passes what it has already inspected and measured:
    the target is loaded once per command); the request's drafter and target name them."""
    engine, k, prompts, max_tokens, dtype, seed, timeout_s, runner, reference_layers = (
        req.engine, req.k, req.prompts, req.max_tokens, req.dtype, req.seed, req.timeout_s, req.runner,
        req.reference_layers)
    server, plot, profile, context_lengths, vllm_python = (req.server, req.plot, req.profile, req.context_lengths,
                                                           req.vllm_python)
    check_outputs({"--plot": plot, "--profile": profile},
                  local_inputs(d, target, prompts, *[b.opened or b.path for b in req.baselines]))
    engine, baselines = _engine_for(engine, server, list(req.baselines), context_lengths)
    python = find_vllm_python(vllm_python) if engine == "vllm" else None
    fc = family_of(d)  # None: plain EAGLE-3
    if fc is not None:
        _measurable(fc, engine, python, runner)
    own = not d.eagle3_layout  # DFlash / DSpark: no EAGLE-3 reading, no runner readings
    # a context-length axis widens the window to its longest bucket (what the engine must hold)
    max_model_len = max([req.max_model_len] + [n + max_tokens + k + 2 for n in context_lengths])
    prompt_set, groups = _prompt_sets(target, prompts, req.num_prompts, max_tokens, max_model_len, k, seed,
                                      context_lengths)
    serving = _serving(engine, dict(req.serving_options) if req.serving_options else None)
    runs: list[RunnerRun] = []
    readings, intended = None, None
    if server is None and not own:
        readings, runs, measured, intended = runner_smoke.prepare(d, target, engine, runner, reference_layers, python,
                                                                  vllm_python, measured, progress)
    active = [r for r in runs if r.skipped is None]  # a runner that cannot load the drafter is reported, not run
    if runs and not active:
        raise SmokeFailedError(f"nothing to measure: {'; '.join(f'{r.runner}: {r.skipped}' for r in runs)}",
                               hint="eaglectl convert SOURCE DEST --to speculators (writes the ids at the top level, "
                                    "which both runners read)")
    reading = fc.family.reading if fc is not None else None
    method = reading.method if reading is not None else "eagle3"
    configs = [*([Baseline(r.name, "eagle3", d.source, d) for r in active]
                 or [Baseline("drafter", method, d.source, None if own else d)]), *baselines]  # type: ignore[arg-type]
    extra = dict(reading.serve_extra) if reading is not None else {}
    drafters = max(1, len(active))  # the drafter's own configurations come first
    applied = None  # the serving options vLLM reports it applied
    if server is not None:
        results, log, versions = _by_server(server, d.source, prompt_set, max_tokens, timeout_s)
    elif python is not None:
        request = {"target": engine_path(target.source), "dtype": dtype, "max_model_len": max_model_len,
                   "seed": seed, "kv_cache_gib": 1, "tensor_parallel_size": req.tensor_parallel_size,
                   "max_tokens": max_tokens, "concurrency": list(req.concurrency), "prompts": prompt_set.prompts,
                   "groups": groups, "serving_options": serving,
                   "configs": [{"name": c.name, "speculative_config": speculative_config(
                       c.kind, c.path, k, extra if i < drafters else None)} for i, c in enumerate(configs)]}
        results, log, versions, applied = _by_vllm(python, request, configs, d, target, runs, active, runner,
                                                   readings, timeout_s, progress)
    else:
        results, log = _reference(configs, target, prompt_set, groups, k, max_tokens, progress,
                                  _reference_ids(configs, active, target, vllm_python)), None
        for run, res in zip(active, results, strict=False):
            run.result, run.used = res, "reference loop"
        import torch

        versions = {"torch_version": torch.__version__, "python": sys.version.split()[0]}
    versions["eaglectl_version"] = __version__
    if len(active) > 1:  # the first runner is the headline; the others are reported per runner, not as baselines
        results = [results[0], *results[len(active):]]
    rep = SmokeReport(d.source, target.source, engine, k, dtype, max_tokens, prompt_set, results, versions, [], log,
                      req.min_acceptance)
    rep.runner, rep.runs, rep.readings, rep.intended = runner, runs, readings, intended
    if fc is not None and reading is not None:
        rep.family = {"id": fc.family.id, "name": fc.family.name, "method": method, "extra": extra,
                      "evidence": list(fc.evidence)}
        rep.engine_reading_note = f"not replayed: {reading.reference}" if python is not None else None
    rep.serving = runner_smoke.serving_record(serving, applied, k=k, dtype=dtype, max_model_len=max_model_len,
                                              seed=seed, engine=engine)
    if engine == "reference" and active:
        rep.reference_layers = runner_smoke.reference_record(active, reference_layers)
    return _judged(rep, d, target, active, measured, reference_layers, plot, profile, vllm=python is not None)


def _engine_for(engine: str, server: str | None, baselines: list[Baseline], context_lengths: tuple[int, ...]
                ) -> tuple[str, list[Baseline]]:
    """The engine that measures (`server` with --server) and the baselines it can measure; refuses what it cannot."""
    if server is not None:
        engine = "server"
        baselines = [b for b in baselines if b.kind != "none"]  # the default: no server without a drafter here
        if baselines or context_lengths:
            raise SmokeFailedError("--server measures the drafter the server runs: no --baseline or "
                                   "--context-lengths (each would need its own server)")
    return engine, baselines


def _serving(engine: str, serving_options: dict[str, str] | None) -> dict[str, dict[str, Any]]:
    """The serving options vLLM is given (the standard ones, then the user's); only eaglectl's vLLM takes any."""
    if serving_options and engine != "vllm":
        why = "the reference loop verifies as vLLM's standard method does" if engine == "reference" else \
            "a running server keeps its own"
        raise UsageError(f"--serving-option {', '.join(serving_options)}: vLLM's options, set where eaglectl starts "
                         f"vLLM (--engine vllm); {why}")
    return runner_smoke.serving_request(serving_options or {})


def _prompt_sets(target: Target, prompts: str, count: int, max_tokens: int, max_model_len: int, k: int, seed: int,
                 context_lengths: tuple[int, ...]) -> tuple[PromptSet, list[dict[str, Any]]]:
    """The prompts measured, tokenized with the target's tokenizer, and one more set per --context-lengths."""
    tokenizer = tokenizer_of(target.source, chat=needs_chat(prompts))
    vocab = target.checkpoint.vocab_size  # every prompt's token ids must index the target's vocabulary

    def load(length: int | None = None) -> PromptSet:
        return load_prompts(prompts, tokenizer, count=count, max_tokens=max_tokens, max_model_len=max_model_len,
                            k=k, seed=seed, length=length, vocab=vocab)

    return load(), [{"label": {"context_length": n}, "prompts": load(n).prompts} for n in context_lengths]


def _by_server(server: str, drafter: str, prompt_set: PromptSet, max_tokens: int, timeout_s: float
               ) -> tuple[list[ConfigResult], None, dict[str, Any]]:
    from . import server as server_smoke

    got = server_smoke.run(server, prompt_set.prompts, max_tokens=max_tokens, timeout_s=timeout_s)
    return ([ConfigResult("drafter", "eagle3", drafter, got["counters"], got["outputs"],
                          generate_seconds=got["generate_seconds"])], None,
            {"vllm_version": got["vllm_version"], "server": server, "served_model": got["model"]})


def _by_vllm(python: str, request: dict[str, Any], configs: list[Baseline], d: DrafterCheckpoint, target: Target,
             runs: list[RunnerRun], active: list[RunnerRun], runner: str | None, readings: Readings | None,
             timeout_s: float, progress: Progress
             ) -> tuple[list[ConfigResult], str, dict[str, Any], dict[str, Any] | None]:
    """Every configuration through the vLLM worker: the results, the log, the versions and the serving options
    vLLM applied. A V2 run emulated on V1 serves a staged copy, removed afterwards."""
    staged: list[Path] = []
    try:
        for entry, run in zip(request["configs"], active, strict=False):
            entry["runner"] = run.runner if runner is not None or len(runs) > 1 else None
            if run.runner == "v2" and run.boundary_ids is not None:
                folder = config_folder(d.ckpt.config_name)
                if folder is None:
                    raise SmokeFailedError(f"{d.source}: --runner v2 emulates Model Runner V2 on a local folder "
                                           "(a staged copy with V2's ids pinned); this drafter has none")
                staged.append(runner_smoke.stage_pinned(folder, run.boundary_ids))
                runner_smoke.check_staged(staged[-1], run.boundary_ids, target.num_layers)
                entry["pinned_model"] = run.staged = str(staged[-1])
        worker = WorkerRun(python, request, timeout_s)
        # the worker rewrites its result file after each configuration: progress by configurations done
        for _ in progress(worker.ticks(lambda: _configs_done(worker.res_path)),
                          label="smoke (vLLM): configurations", total=len(configs), weight=lambda grew: grew):
            pass
        raw, log = worker.result()
    finally:  # the staged copies hold links only: removing them never touches the source
        for folder_ in staged:
            shutil.rmtree(folder_, ignore_errors=True)
    results = [ConfigResult(c.name, c.kind, c.path, r["counters"] if c.kind != "none" else None, r["outputs"],
                            r["throughput"], r["load_seconds"], r["generate_seconds"],
                            requests=r["requests"] if c.kind != "none" else [], groups=r["groups"])
               for c, r in zip(configs, raw["configs"], strict=True)]
    runner_smoke.attach(active, results, raw, log, readings)
    worker.discard()  # the log was read (attach): a run that succeeded leaves no scratch folder behind
    versions = {key: raw[key] for key in ("vllm_version", "torch_version", "cuda", "python")}
    return results, None, versions, raw["configs"][0].get("serving_applied")


def _judged(rep: SmokeReport, d: DrafterCheckpoint | FamilyCheckpoint, target: Target, active: list[RunnerRun],
            measured: Measurement | None, reference_layers: str, plot: str | None, profile: str | None, *,
            vllm: bool) -> SmokeReport:
    """The report's readings and red flags, then its plot and profile."""
    if vllm and rep.family is None:  # a family's drafting is not the loop's: measure() says why not replayed
        for run in active:
            if run.result is not None and run.result.counters and run.result.counters["num_drafts"]:
                run.engine_reading, run.engine_reading_note = runner_smoke.replayed(
                    run, d, target, rep.prompts.prompts, k=rep.k, max_tokens=rep.max_tokens, dtype=rep.dtype,
                    measured=measured)
        if active:
            rep.engine_reading, rep.engine_reading_note = active[0].engine_reading, active[0].engine_reading_note
    if rep.readings is not None and rep.intended is not None:
        rep.runner_flags = runner_smoke.runner_flags(
            rep.runs if reference_layers == "runner" or rep.engine != "reference" else [], rep.readings,
            tuple(rep.intended["boundary_ids"]), rep.intended["basis"],
            only=rep.runner if rep.runner != "both" else None)
    rep.red_flags = red_flags(rep)
    if plot:
        from ..plot import plot_smoke

        plot_smoke(rep.to_json(), plot)
        rep.plot = plot
    if profile:
        from ...checkpoint.speculation_profile import write_from_smoke

        rep.profile = write_from_smoke(profile, rep.to_json())
    return rep


def _reference_ids(configs: list[Baseline], runs: list[RunnerRun], target: Target,
                   vllm_python: str | None) -> dict[str, tuple[int, ...]]:
    """The layers the reference loop runs for each EAGLE configuration: each runner's reading of the drafter
    (or the measured layers), and for an EAGLE baseline the first runner's reading of it; never the dialect
    table's, unless no runner reads the drafter at all."""
    L = target.num_layers
    ids = {r.name: tuple(r.boundary_ids) for r in runs if r.boundary_ids is not None}
    first = runs[0].runner if runs else "v1"
    for c in configs:
        if c.kind != "eagle3" or c.name in ids:
            continue
        opened = c.opened or open_drafter(c.path)  # type: ignore[arg-type]
        got = readings_for(opened, target, vllm_python=vllm_python).get(first)
        ids[c.name] = tuple(got.boundary_ids) if got is not None and got.boundary_ids is not None \
            else opened.spec.capture_ids(L)
    return ids


def _configs_done(path: Path) -> int:
    try:
        return len(json.loads(path.read_text())["configs"])
    except (OSError, ValueError, KeyError, TypeError):  # not written yet, or caught mid-write
        return 0


def _reference(configs: list[Baseline], target: Target, prompt_set: PromptSet,
               groups: list[dict[str, Any]], k: int, max_tokens: int, progress: Progress,
               ids: dict[str, tuple[int, ...]]) -> list[ConfigResult]:
    """The reference loop for every configuration on one set of the target's greedy continuations (decoded
    once, model/replay.py): each EAGLE drafter costs one teacher-forced pass, `none` is the continuation."""
    from ...model.loader import DTYPES, load_reference
    from ...model.replay import replay

    dtype = DTYPES[target.dtype]
    opened = {c.name: c.opened or open_drafter(c.path) for c in configs if c.kind == "eagle3"}  # type: ignore[arg-type]
    target.need({i for b in ids.values() for i in b})
    results = []
    for c in progress(configs, label="smoke (reference): configurations", total=len(configs)):
        t0 = time.perf_counter()
        if c.kind == "none":
            conts = target.continuations(prompt_set.prompts, max_tokens=max_tokens, k=k, boundaries=())
            results.append(ConfigResult(c.name, c.kind, c.path, None, [x.output for x in conts],
                                        generate_seconds=time.perf_counter() - t0))
        elif c.kind == "eagle3":
            loaded = load_reference(opened[c.name])
            model = loaded.build(dtype, "cpu")
            embed = None if loaded.has_embed else target.model().embedding().to(dtype)

            def loop(prompts: list[list[int]]) -> LoopCounts:
                conts = target.continuations(prompts, max_tokens=max_tokens, k=k, boundaries=ids[c.name])
                return replay(model, conts, aux_ids=ids[c.name], embed=embed)  # noqa: B023

            counts = loop(prompt_set.prompts)
            seconds = time.perf_counter() - t0
            extra = []
            for g in groups:
                more = loop(g["prompts"])
                extra.append({"label": g["label"], "counters": _counters(more),
                              "requests": [r.row() for r in more.per_request]})
            results.append(ConfigResult(c.name, c.kind, c.path, _counters(counts), counts.outputs,
                                        generate_seconds=seconds, requests=[r.row() for r in counts.per_request],
                                        groups=extra))
        else:
            results.append(ConfigResult(c.name, c.kind, c.path, None, None,
                                        skipped=f"{c.kind} needs vLLM (--engine vllm)"))
    return results


def _counters(counts: LoopCounts) -> dict[str, Any]:
    return {"num_drafts": counts.num_drafts, "num_draft_tokens": counts.num_draft_tokens,
            "num_accepted_tokens": counts.num_accepted_tokens, "accepted_per_pos": counts.accepted_per_pos}


def red_flags(rep: SmokeReport) -> list[str]:
    main = rep.main
    c = main.counters
    flags = []
    if c is None or c["num_drafts"] == 0:
        method = rep.family["method"] if rep.family else "eagle3"
        return [f"no drafts were made: speculative decoding did not run (check method {method} and the drafter path)"]
    al = main.mean_acceptance_length
    assert al is not None
    if al < NEAR_ONE:
        flags.append(f"acceptance length {al:.3f} is about 1.0: drafts are almost never accepted (silent breakage: "
                     "aux ids, d2t, flags or a wrong target)")
    if main.outputs:
        tokens = [t for o in main.outputs for t in o]
        diversity = len(set(tokens)) / max(1, len(tokens))
        if al >= rep.k + 1 - 0.05 and diversity < 0.05:
            flags.append(f"acceptance length {al:.3f} is about k + 1 with degenerate, repetitive output "
                         f"({diversity:.1%} distinct tokens): fast and worthless")
    if rep.min_acceptance is not None and al < rep.min_acceptance:
        flags.append(f"acceptance length {al:.3f} is below --min-acceptance {rep.min_acceptance}")
    flags += rep.runner_flags
    for run in rep.runs or []:
        er = run.engine_reading
        diff = er.difference() if er is not None else None
        # a runner that read its own reading is named by runner_flags already; this one ran something else
        if diff and not (rep.runner_flags and er.matched is not None and run.boundary_ids is not None
                         and er.matched.boundary_ids == tuple(run.boundary_ids)
                         and er.matched.flags == er.intended.flags):
            flags.append(diff)
    if not rep.runs and rep.engine_reading is not None and rep.engine_reading.difference():
        flags.append(rep.engine_reading.difference())
    return flags
