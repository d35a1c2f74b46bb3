"""ModelOpt's `speculation_profile.json`: measured acceptance that travels with the checkpoint.

The schema (version "1.0") is NVIDIA Model-Optimizer's: `examples/specdec_bench/specdec_bench/
speculation_profile.py` builds it, `examples/speculative_decoding/scripts/ar_validate.py` is a second
producer and `attach_speculation_profile.py` attaches one to an exported checkpoint (PRs #2247, #2313,
#2316). Fields (docs/smoke.md#speculation-profile):

- `measured` (a stub has false and a null mean), `method`, `num_speculative_tokens` (k), `max_supported_k`,
  `verification_method` (longest_prefix | block), `accept_length_model` (chain_analytic | measured_per_k),
  `block_size`, `draft_checkpoint`, `target_model`, `per_category`, `measurement_conditions`;
- `acceptance_length_histogram`: decode steps by acceptance length, the tokens a step emits including the
  target's bonus token (length 1 = no draft accepted);
- `marginal_accept_rates[i]` = P(length >= i + 2) (the first i + 1 drafts all accepted; vLLM's synthetic
  sampler) and `conditional_accept_rates[i]` = P(length >= i + 2) / P(length >= i + 1) (draft i + 1 accepted
  given the first i were; Dynamo's mocker): draft position i <-> acceptance length i + 2;
- `mean_accept_length`, per decode step (= 1 + sum of the marginals), and `mean_accept_length_per_request`;
- `validation`: the mean-consistency check (|1 + sum(marginal) - mean| <= 0.02) and marginal monotonicity.

`from_smoke` builds it from smoke's counters: vLLM accepts drafts as a prefix, so the drafts accepted at
position i (`accepted_per_pos[i]`) are the steps of length >= i + 2, and the histogram follows exactly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import CorruptCheckpointError
from ..io.atomic import write_file
from ..io.bounded import read_regular
from ..io.jsonio import loads
from ..limits import limit

SCHEMA_VERSION = "1.0"
FILE = "speculation_profile.json"
MEAN_TOLERANCE = 0.02  # ModelOpt's mean-consistency tolerance
VERIFICATION_METHODS = ("longest_prefix", "block")
ACCEPT_LENGTH_MODELS = ("chain_analytic", "measured_per_k")


def histogram(num_drafts: int, accepted_per_pos: list[int]) -> dict[int, int]:
    """Decode steps by acceptance length (1..k+1) from prefix-acceptance counters; ValueError when the counters
    are not those of prefix acceptance (a position accepted more often than the one before it)."""
    at_least = [num_drafts, *accepted_per_pos, 0]  # at_least[j] = steps that accepted >= j drafts
    out = {}
    for j in range(len(accepted_per_pos) + 1):
        n = at_least[j] - at_least[j + 1]
        if n < 0:
            raise ValueError(f"position {j} accepted {at_least[j + 1]} times, more than position {j - 1} "
                             f"({at_least[j]}): not prefix acceptance")
        out[j + 1] = n
    return out


def rates(hist: dict[int, int], k: int) -> tuple[list[float], list[float]]:
    """(marginal, conditional) per draft position: position i <-> acceptance length i + 2."""
    total = sum(hist.values())
    marginal, conditional = [], []
    for i in range(k):
        at_least = sum(c for length, c in hist.items() if length >= i + 2)
        before = sum(c for length, c in hist.items() if length >= i + 1)
        marginal.append(at_least / total if total else 0.0)
        conditional.append(at_least / before if before else 0.0)
    return marginal, conditional


def checkpoint_id(source: str | None) -> str | None:
    """A Hub id as it is; a local path reduced to its last two components (a published profile carries no
    machine paths, as ModelOpt's checkpoint_id)."""
    if not source:
        return None
    parts = [p for p in str(source).replace("\\", "/").split("/") if p and p != "."]
    return "/".join(parts[-2:]) if parts else None


def _runner(engine: str, versions: dict[str, Any], runs: list[dict[str, Any]] | None = None) -> str:
    first = runs[0] if runs else None  # the headline run: smoke's first runner (runner_smoke.RunnerRun)
    if first is not None and first.get("emulated"):
        return f"vLLM (CPU): {first['label']}"
    if first is not None and engine == "vllm" and first.get("runner_used") in ("v1", "v2"):
        return f"vLLM {first['runner_used'].upper()} ({'GPU' if versions.get('cuda') else 'CPU'})"
    if first is not None and engine == "reference" and first.get("runner") == "v2":
        return f"eaglectl reference loop on Model Runner V2's layers {first.get('boundary_ids')}"
    if engine == "reference":
        return "eaglectl reference loop (the counts vLLM's V1 runner gives in float32)"
    if engine == "server":
        return "a running vLLM server (runner not reported)"
    return "vLLM V1 (CPU)" if not versions.get("cuda") else "vLLM on GPU (V1 or Model Runner V2, as vLLM chose)"


def from_smoke(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The profile of a smoke report (`SmokeReport.to_json()`); None when no draft was made."""
    drafts, k = doc.get("num_drafts"), doc["num_speculative_tokens"]
    per_pos = doc.get("accepted_per_pos")
    if per_pos is None and doc.get("per_position_acceptance") is not None and drafts:
        per_pos = [round(x * drafts) for x in doc["per_position_acceptance"]]  # counts / drafts, exact in float64
    if not drafts or per_pos is None:
        return None
    hist = histogram(drafts, list(per_pos))
    marginal, conditional = rates(hist, k)
    mean = sum(length * c for length, c in hist.items()) / drafts
    versions = doc.get("versions") or {}
    engine = doc["engine"]
    version = versions.get("vllm_version") if engine != "reference" else f"eaglectl {versions.get('eaglectl_version')}"
    categories = {row["category"]: {"mean_accept_length": _r(row.get("mean_acceptance_length")),
                                    "mean_accept_length_per_request": _r(row.get("mean_acceptance_length_per_request")),
                                    "num_samples": row.get("requests")}
                  for row in doc.get("by_category") or []}
    prompts, serving = doc.get("prompts") or {}, doc.get("serving_options") or {}
    ran = serving.get("speculative") or {}  # the serving options as smoke ran them (runner_smoke.SERVING_OPTIONS)
    profile = {
        "schema_version": SCHEMA_VERSION,
        "measured": True,
        "producer": f"eaglectl {__version__} smoke",
        "method": "eagle3",
        "draft_checkpoint": {"name": checkpoint_id(doc.get("drafter"))},
        "target_model": {"name": checkpoint_id(doc.get("target"))},
        "num_speculative_tokens": k,
        "block_size": None,
        "max_supported_k": k,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": [_r(x) for x in conditional],
        "marginal_accept_rates": [_r(x) for x in marginal],
        "mean_accept_length": _r(mean),
        "mean_accept_length_per_request": _r(doc.get("mean_acceptance_length_per_request")),
        "accept_length_model": "chain_analytic",
        "accept_length_by_k": {str(k): _r(mean)},
        "acceptance_length_histogram": {str(length): c for length, c in hist.items()},
        "per_category": categories or None,
        "measurement_conditions": {
            "engine": engine, "engine_version": version, "runner": _runner(engine, versions, doc.get("runners")),
            "num_speculative_tokens": k, "dtype": doc.get("dtype"),
            "dataset": prompts.get("set"), "prompts": prompts.get("description"), "num_samples": prompts.get("count"),
            "osl": doc.get("max_tokens"), "sampling": "greedy (temperature 0), EOS ignored",
            "rejection_sample_method": (ran.get("rejection_sample_method") or {"value": "standard"})["value"],
            "draft_lm_head_quantization": (ran.get("draft_lm_head_quantization") or {"value": None})["value"],
            "serving_options_overridden": serving.get("overridden") or [],
            "max_model_len": serving.get("max_model_len"), "seed": serving.get("seed"),
            "validation": "engine counters around the measured batch" if engine != "reference"
            else "reference speculative loop (target verifies every draft)",
        },
    }
    profile["validation"] = {"mean_consistency": _consistency(profile["mean_accept_length"],
                                                              profile["marginal_accept_rates"]),
                             "marginal_monotonicity": _monotonicity(profile["marginal_accept_rates"])}
    return profile


def _r(x: Any) -> Any:
    return round(float(x), 6) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _consistency(mean: float, marginal: list[float]) -> dict[str, Any]:
    implied = 1.0 + sum(marginal)
    delta = abs(implied - mean)
    return {"implied_mean_accept_length": round(implied, 6), "reported_mean_accept_length": round(mean, 6),
            "abs_delta": round(delta, 6), "tolerance": MEAN_TOLERANCE, "passed": delta <= MEAN_TOLERANCE}


def _monotonicity(marginal: list[float]) -> dict[str, Any]:
    bad = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]} for i in range(1, len(marginal))
           if marginal[i] > marginal[i - 1] + 1e-9]
    return {"passed": not bad, "violations": bad}


# ------------------------------------------------------------------------------------------ validation

def number(x: Any) -> bool:
    """A finite JSON number a float can hold (a 400-digit integer is not: formatting it would overflow)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) <= 1e300 and math.isfinite(x)


def validate(p: Any) -> list[str]:
    """What is wrong with a profile under the schema as ModelOpt documents it (empty: valid)."""
    if not isinstance(p, dict):
        return ["the profile is not a JSON object"]
    out = []
    if p.get("schema_version") != SCHEMA_VERSION:
        out.append(f"schema_version {p.get('schema_version')!r} (this validator knows {SCHEMA_VERSION!r})")
    measured = p.get("measured")
    if not isinstance(measured, bool):
        out.append("measured is not true or false")
    k = p.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 1024:
        return [*out, f"num_speculative_tokens {k!r} is not a positive integer"]
    vectors = {}
    for key in ("conditional_accept_rates", "marginal_accept_rates"):
        v = p.get(key)
        if not isinstance(v, list) or len(v) != k or not all(number(x) and 0.0 <= x <= 1.0 for x in v):
            out.append(f"{key} is not a list of {k} rates in [0, 1]")
        else:
            vectors[key] = v
    for key, allowed in (("verification_method", VERIFICATION_METHODS), ("accept_length_model", ACCEPT_LENGTH_MODELS)):
        if p.get(key) is not None and p.get(key) not in allowed:
            out.append(f"{key} {p.get(key)!r} is not one of {', '.join(allowed)}")
    msk = p.get("max_supported_k")
    if msk is not None and (not isinstance(msk, int) or isinstance(msk, bool) or msk < k):
        out.append(f"max_supported_k {msk!r} is below num_speculative_tokens {k}")
    for key in ("measurement_conditions", "per_category", "draft_checkpoint", "target_model"):
        if p.get(key) is not None and not isinstance(p.get(key), dict):
            out.append(f"{key} is not an object")
    marginal, conditional = vectors.get("marginal_accept_rates"), vectors.get("conditional_accept_rates")
    if marginal is not None:
        if not _monotonicity(marginal)["passed"]:
            out.append(f"marginal_accept_rates {marginal} increase (a survival function cannot)")
        if conditional is not None:
            prev = 1.0
            for i, (m, c) in enumerate(zip(marginal, conditional, strict=True)):
                want = m / prev if prev > 0 else 0.0
                if abs(c - want) > 1e-6 + 2e-6 / max(prev, 1e-6):
                    out.append(f"conditional_accept_rates[{i}] {c} != marginal[{i}] / marginal[{i - 1}] = {want:.6f}")
                    break
                prev = m
    mean = p.get("mean_accept_length")
    if measured is True:
        if not number(mean) or not 1.0 <= mean <= k + 1:
            out.append(f"mean_accept_length {mean!r} is not in [1, k + 1] for a measured profile")
        elif marginal is not None and not _consistency(mean, marginal)["passed"]:
            out.append(f"mean_accept_length {mean} != 1 + sum(marginal_accept_rates) = {1 + sum(marginal):.6f} "
                       f"(tolerance {MEAN_TOLERANCE}): the vectors are cut short or the mean is another one")
    elif measured is False and mean is not None and not number(mean):
        out.append("mean_accept_length of a stub is neither null nor a number")
    out += _check_histogram(p.get("acceptance_length_histogram"), k, marginal, mean if measured is True else None)
    return out


def _check_histogram(h: Any, k: int, marginal: list[float] | None, mean: Any) -> list[str]:
    if h is None:
        return []
    if not isinstance(h, dict):
        return ["acceptance_length_histogram is not an object"]
    hist: dict[int, int] = {}
    for key, n in h.items():
        try:
            length = int(key)
        except (TypeError, ValueError):
            return [f"acceptance_length_histogram key {key!r} is not an acceptance length"]
        if not 1 <= length <= k + 1 or not isinstance(n, int) or isinstance(n, bool) or n < 0:
            return [f"acceptance_length_histogram[{key!r}] = {n!r}: lengths run 1..k+1 ({k + 1}), counts >= 0"]
        hist[length] = hist.get(length, 0) + n
    total = sum(hist.values())
    if not total:
        return []
    out = []
    got, _ = rates(hist, k)
    if marginal is not None and any(abs(a - b) > 1e-5 for a, b in zip(got, marginal, strict=True)):
        out.append(f"marginal_accept_rates {marginal} disagree with the histogram ({[round(x, 6) for x in got]})")
    per_step = sum(length * c for length, c in hist.items()) / total
    if number(mean) and abs(per_step - mean) > 1e-5:
        out.append(f"mean_accept_length {mean} is not the histogram's per-step mean {per_step:.6f}")
    return out


# ------------------------------------------------------------------------------------------ files

def read(path: str | Path) -> Any:
    """A profile file's JSON (CorruptCheckpointError when it is not JSON)."""

    raw = read_regular(path, lambda p, why: CorruptCheckpointError(f"{p}: {why}", file=p), limit("profile_bytes"))
    return loads(raw, str(path))


def write(path: str | Path, profile: dict[str, Any]) -> Path:
    """Write a profile atomically (it must validate: eaglectl never writes one that does not)."""

    problems = validate(profile)
    if problems:  # a bug in the builder, not bad input
        raise AssertionError(f"eaglectl built an invalid speculation profile: {problems[0]}")
    return write_file(path, (json.dumps(profile, indent=2) + "\n").encode())


def write_from_smoke(path: str | Path, doc: dict[str, Any]) -> str | None:
    """smoke --profile: the profile of this run, written atomically; None (nothing written) without drafts."""
    profile = from_smoke(doc)
    return None if profile is None else str(write(path, profile))
