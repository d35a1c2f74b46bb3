"""What serving engines do with a drafter's files: versioned facts, declared as data.

An engine's reading of a checkpoint changed over time (sglang's aux ids in May 2026, vLLM's
speculators-format flags in June 2026), so each fact carries the version (or change and date) it
holds from. `docs/engines.md` is generated from these tables; `smoke` checks the reading vLLM
actually ran against what the weights say, and `convert` checks its output under the reading of the
engine that serves the destination dialect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .spec import default_aux_ids


@dataclass(frozen=True)
class AuxReading:
    """How an engine turns the aux ids written in a drafter's config into target boundaries."""

    engine: str
    since: str  # the version, or the change and its date, from which this holds
    rule: str  # boundary | output | output-if-first-is-1
    source: str

    def boundaries(self, ids: tuple[int, ...]) -> tuple[int, ...]:
        if self.rule == "boundary" or (self.rule == "output-if-first-is-1" and ids and ids[0] != 1):
            return tuple(ids)
        return tuple(i + 1 for i in ids)

    def describe(self) -> str:
        return {"boundary": "reads the ids as boundaries",
                "output": "reads the ids as output-of-layer ids (adds 1)",
                "output-if-first-is-1": "adds 1 only when the first id is 1; any other list is read as boundaries",
                }[self.rule]


# Oldest first; the last entry of an engine is its current reading.
AUX_READINGS: tuple[AuxReading, ...] = (
    AuxReading("vllm", "0.8", "boundary",
               "model_executor/models/llama.py captures the residual stream entering layer k"),
    AuxReading("sglang", "EAGLE-3 support", "output", "models/llama.py set_eagle3_layers_to_capture adds 1"),
    AuxReading("sglang", "PR #25454, 2026-05-16", "output-if-first-is-1",
               "sglang PR #25454: boundary-numbered Kimi drafters lost 0.10 AL to the +1"),
    AuxReading("trt-llm", "EAGLE-3 support", "output", "_torch/speculative/eagle3.py"),
)


def aux_reading(engine: str) -> AuxReading:
    """The engine's current reading of configured aux ids."""
    return [r for r in AUX_READINGS if r.engine == engine][-1]


def engine_boundaries(engine: str, ids: tuple[int, ...] | None, target_layers: int) -> tuple[int, ...]:
    """The target boundaries `engine` captures for a drafter whose config lists `ids` (None: no list;
    every engine's default names the same boundaries). Sorted and de-duplicated, as engines do."""
    if ids is None:
        return default_aux_ids(target_layers, "boundary")
    return tuple(sorted(set(aux_reading(engine).boundaries(tuple(ids)))))


@dataclass(frozen=True)
class FeatureSupport:
    """The first release of an engine that serves a drafter feature correctly.

    The feature applies to a drafter in a dialect when its `arch` matches (None: any), the dialect's
    config style is `style` (hf | speculators | None: any) and, when `flags` is given, one of those
    spec flags is true. `release` is the first release (X.Y) known to hold it; None when only the
    change is known (the release that first shipped it is unconfirmed: the reference release has it)."""

    feature: str
    engine: str
    since: str
    note: str
    release: str | None = None
    flags: tuple[str, ...] = ()
    style: str | None = None
    arch: str | None = None

    def applies(self, spec: Any, hf_style: bool) -> bool:
        if self.arch is not None and spec.arch != self.arch:
            return False
        if self.style is not None and self.style != ("hf" if hf_style else "speculators"):
            return False
        return not self.flags or any(getattr(spec, f, False) for f in self.flags)


FEATURES: tuple[FeatureSupport, ...] = (
    FeatureSupport("eagle3", "vllm", "0.8", "EAGLE-3 drafters (method eagle3)", release="0.8"),
    FeatureSupport("fc_norm / norm_output (EAGLE-3.1)", "vllm", "0.22",
                   "PR #42764 (merged 2026-05-15); older releases ignore both flags silently", release="0.22",
                   flags=("fc_norm", "norm_output")),
    FeatureSupport("fc_norm / norm_output (speculators-format configs)", "vllm", "PR #46488 (merged 2026-06-23)",
                   "earlier releases dropped both flags from speculators configs: 3.1 drafters ran as 3.0",
                   flags=("fc_norm", "norm_output"), style="speculators"),
    FeatureSupport("fc_norm on MLA drafters", "vllm", "PR #43482 (merged 2026-05-23)",
                   "earlier releases loaded the fc_norm weights of MLA drafters and never applied them",
                   flags=("fc_norm",), arch="mla"),
    FeatureSupport("norm_before_fc", "vllm", "PR #36545 (merged 2026-03-09)",
                   "earlier releases had no RMSNorm before fc (the flag was ignored)", flags=("norm_before_fc",)),
    FeatureSupport("norm_before_fc read from eagle_config", "vllm", "PR #42143", "before it, the top level only",
                   flags=("norm_before_fc",), style="hf"),
    FeatureSupport("norm_before_fc (speculators-format configs)", "vllm", "PR #38111 (merged 2026-03-25)",
                   "earlier releases dropped the flag from speculators configs (the RMSNorm before fc was skipped)",
                   flags=("norm_before_fc",), style="speculators"),
    FeatureSupport("MLA drafters (Eagle3DeepseekV2ForCausalLM)", "vllm", "PR #36361 (merged 2026-03-07)",
                   "Kimi-K2.5-style MLA EAGLE-3 drafters", arch="mla"),
    FeatureSupport("aux ids with first id != 1 read as boundaries", "sglang", "PR #25454 (merged 2026-05-16)",
                   "before it, every configured id was shifted by +1"),
)


def version_key(release: str | None) -> tuple[int, ...]:
    """Orders releases; an unconfirmed one (None) after every known release."""
    return (1 << 30,) if release is None else tuple(int(x) for x in release.split("."))


def needed_features(engine: str, spec: Any, hf_style: bool) -> list[FeatureSupport]:
    """The features `engine` must serve correctly for this drafter in a dialect of that config style."""
    return [f for f in FEATURES if f.engine == engine and f.applies(spec, hf_style)]


# The version eaglectl's checks and engine-parity tests are pinned to.
REFERENCE = {"vllm": "0.32"}

# What eaglectl writes for an engine (`convert --for ENGINE`): among the writable dialects this engine
# serves (`consumer`), the one needing the oldest release for this drafter's features; on a tie, this order.
SERVE_PREFERENCE = {
    "vllm": (("speculators", "self-describing: carries k and the verifier; `vllm serve` reads its method"),
             ("modelopt", "HF-style EAGLE-3 config with every flag explicit"),
             ("eagle", "SafeAILab layout")),
}
