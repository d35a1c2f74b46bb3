"""What `smoke` reports: the configurations it measures (the drafter and its baselines), each one's acceptance
and throughput, and the red flags a run raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...engines.readings import Readings
from ...errors import SmokeFailedError
from ...measure.workload import PromptSet
from ...result import Result, verdict
from .runner import RunnerRun

if TYPE_CHECKING:
    from ...measure.reading import ServedReading

NEAR_ONE = 1.05


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
            "max_tokens": self.max_tokens,
            "prompts": {"set": self.prompts.name, "description": self.prompts.description,
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
