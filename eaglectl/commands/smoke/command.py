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
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import __version__
from ...checkpoint.drafter import DrafterCheckpoint, open_drafter
from ...checkpoint.speculation_profile import write_from_smoke
from ...engines.asking import config_folder, readings_for
from ...engines.engine_process import WorkerRun, engine_path, find_vllm_python, vllm_has_gpu
from ...engines.readings import Readings
from ...errors import MissingDependencyError, ReferenceLimitError, SmokeFailedError, UsageError
from ...families.checkpoint import FamilyCheckpoint, family_of, open_any
from ...families.inspect import inspect_family
from ...formats.families import smoke_limit
from ...io.atomic import check_outputs, local_inputs
from ...measure.target import Target
from ...measure.workload import PromptSet, load_prompts, needs_chat, tokenizer_of
from ...progress import Progress, passthrough
from ..inspect import inspect_opened
from ..requests import Baseline, SmokeRequest
from . import runner as runner_smoke
from . import server as server_smoke
from .report import ConfigResult, SmokeReport, red_flags
from .runner import RunnerRun

if TYPE_CHECKING:
    from ...measure.probe import Measurement
    from ...measure.target import Target
    from ...model.replay import LoopCounts

GPU_RUNNER_RULES = ("aux-ids-runner-split", "aux-ids-runner-count")  # rules/runners.py
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

    d = open_any(req.drafter)
    if req.states is not None and (req.engine != "reference" or req.target):
        raise UsageError("--states replays a capture's continuations: with --engine reference, instead of --target",
                         hint=f"eaglectl smoke {req.drafter} --states {req.states} --engine reference")
    t = Target.open(req.target or None, req.states, progress=progress, dtype=req.dtype)
    assert t is not None
    if req.states is not None and not t.replays:
        raise UsageError(f"--states {req.states}: the capture holds no greedy continuations",
                         hint="capture again with: eaglectl capture TARGET --max-tokens 64 --out DIR")
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


def _measurable(fc: FamilyCheckpoint, engine: str, python: str | None, runner: str | None, target: str) -> None:
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
            e = ReferenceLimitError(said)
            e.measure_with(fc.source, target)
            raise e
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
    max_tokens = _tokens(target, engine, max_tokens)
    server, plot, profile, context_lengths, vllm_python = (req.server, req.plot, req.profile, req.context_lengths,
                                                           req.vllm_python)
    check_outputs({"--plot": plot, "--profile": profile},
                  local_inputs(d, target, prompts, *[b.opened or b.path for b in req.baselines]))
    engine, baselines = _engine_for(engine, server, list(req.baselines), context_lengths)
    python = find_vllm_python(vllm_python) if engine == "vllm" else None
    fc = family_of(d)  # None: plain EAGLE-3
    if fc is not None:
        _measurable(fc, engine, python, runner, req.target)
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


def _tokens(target: Target, engine: str, max_tokens: int) -> int:
    """New tokens a prompt gets: `max_tokens`, or with 0 as many as a capture's continuations hold. A capture stands
    in for the target only in the reference loop, and only when it holds greedy continuations (else undecided)."""
    if target.states is not None and (engine != "reference" or not target.replays):
        raise MissingDependencyError(
            f"{target.states.root}: a capture stands in for the target only in the reference loop, and only when it "
            "holds greedy continuations" + ("" if target.replays else " (this one holds none)"),
            hint="pass --target (weights and a tokenizer), or --engine reference with a capture made with --max-tokens")
    if max_tokens:
        return max_tokens
    if target.states is None or target.states.continuation is None:
        raise UsageError("max_tokens 0 means a capture's continuations: pass --states DIR (a capture made with "
                         "--max-tokens) or a positive --max-tokens")
    return target.states.continuation.max_tokens


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
    """The prompts measured, tokenized with the target's tokenizer, and one more set per --context-lengths; from
    a capture of continuations, the first `count` prompts it continued."""
    if target.states is not None:
        if context_lengths:
            raise UsageError("--context-lengths: a capture holds its own prompts; pass --target")
        got = target.captured_prompts()[:count]
        return PromptSet(str(target.states.root), got, f"{len(got)} prompts the capture {target.states.root} "
                         "continued greedily"), []
    tokenizer = tokenizer_of(target.source, chat=needs_chat(prompts))
    vocab = target.checkpoint.vocab_size  # every prompt's token ids must index the target's vocabulary

    def load(length: int | None = None) -> PromptSet:
        return load_prompts(prompts, tokenizer, count=count, max_tokens=max_tokens, max_model_len=max_model_len,
                            k=k, seed=seed, length=length, vocab=vocab)

    return load(), [{"label": {"context_length": n}, "prompts": load(n).prompts} for n in context_lengths]


def _by_server(server: str, drafter: str, prompt_set: PromptSet, max_tokens: int, timeout_s: float
               ) -> tuple[list[ConfigResult], None, dict[str, Any]]:

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
            embed = None if loaded.has_embed else target.embedding_table().to(dtype)

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
