"""What serving engines do with a drafter's files: versioned facts, declared as data.

An engine's reading of a checkpoint changed over time (sglang's aux ids in May 2026, vLLM's
speculators-format flags in June 2026), so each fact carries the version (or change and date) it
holds from. `docs/engines.md` is generated from these tables; `smoke` checks the reading vLLM
actually ran against what the weights say, and `convert` checks its output under the reading of the
engine that serves the destination dialect.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """The first release of an engine that serves a drafter feature correctly."""

    feature: str
    engine: str
    since: str
    note: str


FEATURES: tuple[FeatureSupport, ...] = (
    FeatureSupport("eagle3", "vllm", "0.8", "EAGLE-3 drafters (method eagle3)"),
    FeatureSupport("fc_norm / norm_output (HF-style configs)", "vllm", "0.22",
                   "EAGLE-3.1 (PR #42764); older releases ignore both flags silently"),
    FeatureSupport("fc_norm / norm_output (speculators-format configs)", "vllm", "PR #46488 (merged 2026-06-23)",
                   "earlier releases dropped both flags from speculators configs: 3.1 drafters ran as 3.0"),
    FeatureSupport("fc_norm on MLA drafters", "vllm", "PR #43482 (merged 2026-05-23)",
                   "earlier releases loaded the fc_norm weights of MLA drafters and never applied them"),
    FeatureSupport("norm_before_fc read from eagle_config", "vllm", "PR #42143", "before it, the top level only"),
    FeatureSupport("MLA drafters (Eagle3DeepseekV2ForCausalLM)", "vllm", "PR #36361 (merged 2026-03-07)",
                   "Kimi-K2.5-style MLA EAGLE-3 drafters"),
    FeatureSupport("aux ids with first id != 1 read as boundaries", "sglang", "PR #25454 (merged 2026-05-16)",
                   "before it, every configured id was shifted by +1"),
)

# The version eaglectl's checks and engine-parity tests are pinned to.
REFERENCE = {"vllm": "0.32"}
