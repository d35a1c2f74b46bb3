"""What each command is asked: one dataclass per command, its defaults defined here once.

The command line builds a request from its options (`cli/table.py`, whose option defaults read these), a
manifest line builds one the same way (`cli/batch.py`), `check` builds smoke's from its own, and each command's
`run(request, progress)` is its one library call. Field names are the options' Python names. Nothing heavy is
imported here: the command line reads it before it knows which command runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ..checkpoint.drafter import DrafterCheckpoint

R = TypeVar("R")

DEFAULT_SYSTEM = "You are a careful assistant. Think before answering, then answer briefly."


def build(kind: type[R], options: Mapping[str, Any], **more: Any) -> R:
    """The request of `kind` from options named as its fields (the command line's, a manifest line's). None is an
    option not given: the field keeps its default. An option that is not a field is a programming error, never
    silently dropped."""
    names = {f.name for f in fields(kind)}  # type: ignore[arg-type]
    given = {k: v for k, v in {**options, **more}.items() if v is not None}
    unknown = sorted(set(given) - names)
    if unknown:
        raise TypeError(f"{kind.__name__} has no field {', '.join(unknown)}")
    return kind(**given)


# ------------------------------------------------------------------ smoke's baselines (--baseline)

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


@dataclass(frozen=True)
class InspectRequest:
    source: str
    target: str | None = None
    from_dialect: str | None = None
    revision: str | None = None
    strict: bool = False
    for_engine: str = "vllm"  # one engine or a comma list (engines.facts.engines_of)
    scan: bool = False
    engine_version: str | None = None
    measure: bool = True
    states: str | None = None
    vllm_python: str | None = None
    sglang_python: str | None = None
    allow_pickle: bool = False


@dataclass(frozen=True)
class ConvertRequest:
    source: str
    dest: str
    to: str | None = None
    for_engine: str | None = None
    from_dialect: str | None = None
    dtype: str | None = None
    target: str | None = None
    aux_layer_ids: tuple[int, ...] | None = None
    source_aux_convention: str | None = None
    max_shard_size: int | None = None
    embed_from_target: bool = False
    base_model: str | None = None
    measure: bool = True
    states: str | None = None
    dry_run: bool = False
    force: bool = False
    allow_pickle: bool = False


@dataclass(frozen=True)
class UpgradeRequest:
    source: str
    dest: str
    fc_norm: bool = True
    norm_output: bool = True
    init: str = "auto"
    fit_fc: bool = False
    target: str | None = None
    base_model: str | None = None
    states: str | None = None
    prompts: str | None = None
    num_prompts: int = 16  # held-out prompts the inits are ranked on (as smoke's --num-prompts)
    max_tokens: int = 64
    calibration_text: str | None = None
    to: str | None = None
    for_engine: str | None = None  # instead of `to`: the dialect these engines serve the output from best
    from_dialect: str | None = None
    fidelity: bool = True
    fidelity_tokens: int = 64
    runner: str = "v1"  # the vLLM runner whose reading of the files the figures follow (v1: every CPU build)
    dry_run: bool = False
    force: bool = False
    allow_pickle: bool = False


@dataclass(frozen=True)
class VerifyRequest:
    candidate: str
    against: str | None = None
    target: str | None = None
    states: str | None = None
    device: str = "cpu"
    dtype: str | None = None  # None: float32 with `against`, else bfloat16
    steps: int = 3
    tokens: int = 64
    seed: int = 0
    text: str | None = None
    from_dialect: str | None = None
    against_from: str | None = None
    allow_pickle: bool = False
    fidelity: bool = False  # the upgrade regime (upgrade's own fidelity report)


@dataclass(frozen=True)
class DiffRequest:
    a: str
    b: str
    values: bool = True
    atol: float = 0.0
    target: str | None = None
    from_a: str | None = None
    from_b: str | None = None
    allow_pickle: bool = False


@dataclass(frozen=True)
class SmokeRequest:
    drafter: str
    target: str
    engine: str = "vllm"
    k: int = 3
    prompts: str = "builtin:short"
    num_prompts: int = 16
    max_tokens: int = 64
    max_model_len: int = 1024
    concurrency: tuple[int, ...] = (1, 4, 16)
    baselines: tuple[Baseline, ...] = ()
    dtype: str = "float32"
    tensor_parallel_size: int = 1
    vllm_python: str | None = None
    server: str | None = None
    min_acceptance: float | None = None
    timeout_s: float = 900.0
    seed: int = 0
    context_lengths: tuple[int, ...] = ()
    plot: str | None = None
    profile: str | None = None
    runner: str | None = None
    reference_layers: str = "runner"
    serving_options: Mapping[str, str] | None = None
    preflight: bool = True  # inspect every drafter first (check has inspected it already)
    states: str | None = None  # --engine reference: a capture of greedy continuations stands in for the target
    # (max_tokens 0: as many as the capture's continuations hold)


# The smoke stage's options as `check` names them (smoke_<field>); unset ones take SmokeRequest's defaults.
GATE_SMOKE_FIELDS = ("engine", "k", "prompts", "num_prompts", "timeout_s")


@dataclass(frozen=True)
class CheckRequest:
    source: str
    target: str | None = None
    run_smoke: bool = False
    smoke_engine: str | None = None
    smoke_k: int | None = None
    smoke_prompts: str | None = None
    smoke_num_prompts: int | None = None
    smoke_timeout_s: float | None = None
    min_acceptance: float | None = None
    card: bool | None = None  # None: lint a card that is there
    base_model: str | None = None
    strict: bool = False
    for_engine: str = "vllm"
    engine_version: str | None = None
    measure: bool = True
    states: str | None = None
    vllm_python: str | None = None
    sglang_python: str | None = None
    allow_pickle: bool = False
    sarif_path: str | None = None

    def smoke_given(self) -> dict[str, Any]:
        """The smoke stage's options given (SmokeRequest field -> value); any of them implies the stage."""
        return {f: getattr(self, f"smoke_{f}") for f in GATE_SMOKE_FIELDS if getattr(self, f"smoke_{f}") is not None}


@dataclass(frozen=True)
class UploadRequest:
    folder: str
    repo_id: str
    gate: CheckRequest
    revision: str | None = None
    create_pr: bool = False
    private: bool = False
    commit_message: str | None = None
    dry_run: bool = False


@dataclass(frozen=True)
class CaptureRequest:
    target: str
    out: str
    engine: str = "hf"
    server_url: str | None = None
    server_storage: str | None = None
    layers: str = "auto"
    drafter: str | None = None
    prompts: str = "builtin:calibration"
    num_prompts: int = 16
    length: int = 256
    max_tokens: int = 0  # each prompt's greedy continuation captured too (0: the prompts alone)
    k: int = 3  # draft steps the continuation serves: max_tokens + k tokens are decoded
    dtype: str = "float32"
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    vllm_args: Mapping[str, Any] | None = None
    vllm_python: str | None = None
    print_recipe: bool = False
    recipe_flags: tuple[str, ...] = ()  # the options the recipe's client loop repeats, as given
    timeout_s: float = 3600.0
    seed: int = 0
    force: bool = False


@dataclass(frozen=True)
class Protocol:
    """Drift's named definitions of the sink, the recent window and the anchors (`--protocol`)."""

    name: str
    sink_tokens: int
    recent_window: int
    anchor_every: int
    note: str


PROTOCOLS = {
    "paper-v1": Protocol(
        "paper-v1", sink_tokens=1, recent_window=16, anchor_every=8,
        note="definitions follow arXiv 2605.09992 Fig. 1 (sink = the first prompt token; own tokens = the "
             "positions drafted in the current chain); the paper's exact head/averaging protocol is not "
             "published, so this averages over heads, then anchors, then prompts"),
}


@dataclass(frozen=True)
class DriftRequest:
    drafters: tuple[str, ...]
    target: str | None = None
    states: str | None = None
    protocol: str = "paper-v1"
    depth: int = 8
    k: int = 3
    prompts: str = "builtin:short"
    num_prompts: int = 16
    max_tokens: int = 64
    context_lengths: tuple[int, ...] = ()
    templates: tuple[str, ...] = ()
    system_prompt: str = DEFAULT_SYSTEM
    sink_tokens: int | None = None
    recent_window: int | None = None
    anchor_every: int | None = None
    bootstrap_reps: int = 1000
    seed: int = 0
    plot: str | None = None
