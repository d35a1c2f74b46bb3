"""Drafter families beside EAGLE-3, declared as data: what the files show, who serves them, and what eaglectl
does with them.

EAGLE-3 / 3.1 is one drafter layer fed fused target states and its own state. Most families here draft
differently, so no EAGLE-3 dialect can hold them and eaglectl's reference drafter cannot run them.
Detection runs before the dialect registry (formats.detect): an EAGLE-4 checkpoint has `layers.0.*`
keys and would otherwise be read as ModelOpt, an MTP head's `model.` prefix as NeMo. A family matches
when the weights of its signals that hold reach `threshold`.

A family with a `reading` is read: `inspect` names it with the evidence, gives its canonical spec and
checks its traps (families/rules.py; docs/families.md). DFlash and DSpark are read header-only in their
own layouts (`smoke --engine vllm` measures them, every other command refuses them); P-EAGLE is the EAGLE-3
layout plus `mask_hidden`, so the EAGLE-3 dialects read it and its rules run beside EAGLE-3's. A family
without one is refused by name. `smoke_limit` says where smoke cannot measure a read family.
Public sources: vLLM's model registry (architecture names) and its speculative config, proposer and
speculators reader (0.32.0: what the readings say), z-lab / ModelOpt DFlash exports (`dflash_config`),
eagle-harness 0.1.3's config keys (names only: its code is source-available, not OSI, and none of it is
copied), vLLM's MedusaConfig.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._base import Probe, Signal, renamed
from ._base import architectures as _archs

# Where vLLM 0.32's proposer looks for the mask (parallel-drafting) token id, in its order
# (v1/spec_decode/llm_base_proposer.py _init_parallel_drafting_params); speculators configs name it mask_token_id.
MASK_TOKEN_KEYS = ("dflash_config.mask_token_id", "mask_token_id", "dspark_noise_token_id", "pard_token",
                   "ptd_token_id")


# The speculators_model_type values vLLM 0.32-0.34's speculators reader builds a config from (algos.py
# register_speculator); SGLang 0.5.23 has no speculators reader. speculators' own MTP / FastMTP converters write
# "mtp", which no engine loads in that format.
VLLM_SPECULATORS_TYPES = ("eagle3", "peagle", "dflash", "dflash2", "dspark")


@dataclass(frozen=True)
class AnchorReading:
    """How an engine reads DSpark's `sample_from_anchor` from one config style ("hf": the drafter's own config;
    "speculators": speculators' format, turned into the former by the engine's reader). True: the anchor is a query
    and slot k predicts the token k+1 after it; false: the anchor is the bonus token and each mask slot predicts its
    own position. A drafter read the other way than it was trained drafts almost nothing (sglang PR #30982: AL 1.1
    against 4.05). Verified against the engines' code by tests/test_families.py."""

    engine: str
    releases: str
    style: str
    default: bool | None  # the value read when the key is absent; None: the engine loads no config of this style
    where: str  # the code that reads it (or refuses the style)


# Both DSpark runtimes read the top-level key, true when absent; vLLM's speculators reader defaults an absent key to
# false before the runtime sees it; SGLang has no speculators reader at all (a speculators config has no model_type)
DSPARK_ANCHOR = (
    AnchorReading("vllm", "0.32-0.34", "hf", True,
                  "v1/worker/gpu/spec_decode/dspark/speculator.py: getattr(hf_config, 'sample_from_anchor', True)"),
    AnchorReading("vllm", "0.32-0.34", "speculators", False, "transformers_utils/configs/speculators/algos.py "
                  "update_dspark: config_dict.get('sample_from_anchor', False)"),
    AnchorReading("sglang", "0.5.23", "hf", True, "srt/speculative/dspark_components/dspark_config.py: "
                  "_cfg_get(config, 'sample_from_anchor', True)"),
    AnchorReading("sglang", "0.5.23", "speculators", None, "no speculators reader: transformers' AutoConfig refuses "
                  "a config without model_type"),
)
# what speculators' DSpark config class writes when nothing sets it (its PR #760; DFlash's is false)
SPECULATORS_DSPARK_ANCHOR = True


@dataclass(frozen=True)
class Reading:
    """How eaglectl reads a family and what vLLM 0.32 does with it (docs/families.md)."""

    method: str  # the `method` of vLLM's --speculative-config
    # spec field -> the config keys it is read from, first present wins (shown with the key that held it)
    fields: tuple[tuple[str, tuple[str, ...]], ...]
    numbering: str  # how the family's own layer ids count the target's layers
    # runner -> None when it serves the method, else why not (vLLM 0.32's config/vllm.py)
    runners: dict[str, str | None]
    # when vLLM builds a d2t map: "differs" (draft vocab != the target's), "smaller" (draft vocab < the target's)
    d2t_when: str = "differs"
    eagle3_layout: bool = False  # the EAGLE-3 dialects read it (P-EAGLE); otherwise only `inspect`, header-only
    mask_hidden: bool = False  # a learnable [1, n_aux * target_hidden] placeholder for masked slots
    serve_extra: dict[str, object] = field(default_factory=dict)  # keys the serve line's --speculative-config needs
    # why eaglectl's reference loop (EAGLE-3's chain: one token per pass, fed its own state) cannot measure it;
    # `smoke --engine reference` reports this as undecided
    reference: str = ""


@dataclass(frozen=True)
class Family:
    name: str
    signals: tuple[Signal, ...]
    served_by: str
    why: str
    threshold: float = 1.0
    id: str = ""  # stable kebab-case id (JSON, docs)
    reading: Reading | None = None  # None: refused by name

    def evidence(self, probe: Probe) -> tuple[str, ...] | None:
        held = [s for s in self.signals if s.holds(probe)]
        return tuple(s.describe() for s in held) if sum(s.weight for s in held) >= self.threshold else None


# the sizes every read family's spec shows (a speculators config nests the decoder's)
_SIZES = (("num_hidden_layers", ("num_hidden_layers", "transformer_layer_config.num_hidden_layers")),
          ("hidden_size", ("hidden_size", "transformer_layer_config.hidden_size")),
          ("target_hidden_size", ("target_hidden_size",)),
          ("vocab_size", ("vocab_size", "transformer_layer_config.vocab_size")),
          ("draft_vocab_size", ("draft_vocab_size",)),
          # the depth of the target it was trained on (TorchSpec's own key first: its num_target_layers is a count)
          ("num_target_layers", ("target_num_hidden_layers", "num_target_layers")))

# vLLM 0.32's registered MTP architectures (model_executor/models/registry.py), and other MTP markers
_MTP_ARCHS = ("DeepSeekMTPModel", "DeepseekV32MTPModel", "DeepSeekV4MTPModel", "EagleDeepSeekMTPModel", "MiMoMTPModel",
              "MiMoV2MTPModel", "Glm4MoeMTPModel", "Glm4MoeLiteMTPModel", "Glm5NextMTPModel", "ErnieMTPModel",
              "LongCatFlashMTPModel", "NemotronHMTPModel", "OpenPanguMTPModel", "Qwen3NextMTP", "Qwen3_5MTP",
              "Qwen3_5MoeMTP", "Step3p5MTP", "Step5MTP", "KimiK3MTPModel", "MiniMaxM3MTP", "Gemma4MTPModel",
              "BailingMoeV25MTPModel", "BailingMoeV3MTPModel", "HYV3MTPModel", "HYV4MTPModel", "ExaoneMoeMTP",
              "TransformersForMTP", "ParseAuxMTPModel")

FAMILIES: tuple[Family, ...] = (
    Family(
        "EAGLE-4",
        (*_archs("LlamaForCausalLMEagle4"),
         Signal("config-key", "efficient_lm_head_config", weight=1.0),
         Signal("config-key", "attn_norm", weight=0.5), Signal("config-key", "use_rope", weight=0.5),
         Signal("config-key", "enable_post_mlp_norm", weight=0.5), Signal("config-key", "input_fuse_type", weight=0.5),
         Signal("config-key", "enable_fc_norm", weight=0.5),
         Signal("config-key", "share_draft_embedding_from_target", weight=0.5),
         Signal("config-key", "moe_architecture", weight=0.5)),
        "eagle-harness (source-available licence, not OSI; SGLang --speculative-algorithm EAGLE_HARNESS, and vLLM "
        "/ TokenSpeed through the harness)",
        "its drafter layer (attention norm, optional RoPE, post-MLP norm, MoE, a low-rank candidate head) has no "
        "EAGLE-3 equivalent: every EAGLE-3 dialect and the reference drafter would drop part of it",
        id="eagle-4",
    ),
    # before DFlash: a DSpark config may carry a dflash_config (MiniMax-M3's), never the reverse
    Family(
        "DSpark",
        (*_archs("DSparkDraftModel", "DSparkV41DraftModel", "Qwen3DSparkModel", "Qwen3OmniDSparkModel",
                 "K3DSparkModel", "Gemma4DSparkModel", "MuseSparkDSparkModel", "DSparkMiniMaxDraftModel",
                 "MistralLarge4DSparkModel", "LingDSparkModel", "Lfm2DSparkDraftModel"),
         Signal("config-key", "dspark_target_layer_ids"), Signal("config-value", "speculators_model_type", "dspark"),
         Signal("config-key", "markov_head_type", weight=0.5), Signal("tensor-prefix", "markov_head.", weight=0.5)),
        "vLLM (method dspark), SpecForge",
        "a block-parallel drafter with a Markov head over target layers (dspark_target_layer_ids), not EAGLE-3",
        id="dspark",
        reading=Reading(
            "dspark",
            (("layer_ids", ("dspark_target_layer_ids", "dflash_config.target_layer_ids", "target_layer_ids",
                           "aux_hidden_state_layer_ids")),
             ("mask_token_id", MASK_TOKEN_KEYS), ("block_size", ("block_size", "dspark_block_size")),
             ("markov_rank", ("markov_rank", "dspark_markov_rank", "text_config.dspark_markov_rank")), *_SIZES),
            "output-of-layer: id k is target layer k's output, captured as boundary k+1 (a deepseek_v41 draft's ids "
            "are read as they are)",
            {"v1": "vLLM 0.32's V1 runner refuses method dspark (config/vllm.py lists it among V1's unsupported "
                   "features), and every CPU build runs V1", "v2": None},
            d2t_when="smaller",
            reference="eaglectl's reference loop drafts EAGLE-3's chain; it has no DSpark drafter (block-parallel, "
                      "with a Markov head)"),
    ),
    Family(
        "DFlash",
        (*_archs("DFlashDraftModel", "DFlash2DraftModel", "DFlashLagunaForCausalLM", "Qwen3XPressModel",
                 "DFlash2BeamDraftModel"),
         Signal("config-key", "dflash_config"), Signal("config-value", "speculators_model_type", "dflash"),
         Signal("config-value", "speculators_model_type", "dflash2"),
         Signal("config-value", "speculators_model_type", "xpress")),
        "vLLM (method dflash), sglang / SpecForge",
        "a block-parallel drafter (a whole block of tokens per pass from several target layers), not the EAGLE-3 "
        "chain of one layer fed its own state",
        id="dflash",
        reading=Reading(
            "dflash",
            (("layer_ids", ("dflash_config.target_layer_ids", "aux_hidden_state_layer_ids", "target_layer_ids")),
             ("mask_token_id", MASK_TOKEN_KEYS), ("block_size", ("dflash_config.block_size", "block_size")),
             *_SIZES),
            "output-of-layer: id k is target layer k's output, which both vLLM runners capture as boundary k+1 "
            "(a speculators config's aux_hidden_state_layer_ids are boundaries: vLLM sets target_layer_ids = aux - 1)",
            {"v1": None, "v2": None},
            reference="eaglectl's reference loop drafts EAGLE-3's chain; it has no block-parallel DFlash drafter"),
    ),
    Family(
        "MTP head",
        (*_archs(*_MTP_ARCHS), Signal("config-value", "speculators_model_type", "mtp"),
         Signal("tensor-contains", ".eh_proj.", weight=0.5), Signal("tensor-contains", ".enorm.", weight=0.5),
         Signal("tensor-contains", ".hnorm.", weight=0.5), Signal("tensor-prefix", "mtp.", weight=0.5),
         Signal("tensor-contains", "pre_fc_norm_embedding", weight=0.5)),
        "vLLM (method mtp, with the target's own MTP module), sglang",
        "a multi-token-prediction head of the target (embedding and hidden-state projections eh_proj / enorm / "
        "hnorm), not an EAGLE-3 drafter over fused aux states",
        id="mtp",
    ),
    Family(
        "Medusa",
        (*_archs("MedusaModel"), Signal("config-value", "model_type", "medusa"),
         Signal("config-key", "medusa_num_heads"), Signal("tensor-prefix", "medusa_head.", weight=0.5),
         Signal("tensor-prefix", "lm_heads.", weight=0.5), Signal("tensor-prefix", "blocks.", weight=0.5)),
        "vLLM <= 0.32 (method medusa; removed in 0.33), TensorRT-LLM",
        "independent heads on the target's last hidden state: no drafter layer, no aux states, no EAGLE feedback",
        id="medusa",
    ),
    Family(
        "P-EAGLE",
        (*_archs("PEagleDraftModel", "PeagleLlamaForCausalLM", "PeagleQwen3ForCausalLM"),
         Signal("config-value", "speculators_model_type", "peagle"), Signal("tensor-contains", "mask_hidden"),
         Signal("config-value", "parallel_drafting", True)),
        "vLLM (method eagle3 with parallel_drafting: true, V1 runner only), NeMo, SpecForge, speculators",
        "an EAGLE-3 drafter that drafts k tokens in one pass: masked slots take a learnable mask_hidden in place of "
        "the target's states",
        id="peagle",
        reading=Reading(
            "eagle3",
            (("mask_token_id", MASK_TOKEN_KEYS), ("parallel_drafting", ("parallel_drafting",)), *_SIZES),
            "the EAGLE-3 dialect's own (aux ids as EAGLE-3 reads them)",
            {"v1": None, "v2": "Model Runner V2's EAGLE speculator has no parallel drafting: vLLM 0.32 falls back "
                               "to V1 (config/vllm.py), unless VLLM_USE_V2_MODEL_RUNNER=1 forces V2"},
            eagle3_layout=True, mask_hidden=True, serve_extra={"parallel_drafting": True},
            reference="eaglectl's reference loop drafts EAGLE-3's chain one token per pass; vLLM drafts P-EAGLE's k "
                      "tokens in one pass (mask token, mask_hidden), which the loop does not implement"),
    ),
)


@dataclass(frozen=True)
class Layout:
    """One producer's way of writing a read family's files: its tensor names and its config's shape.

    `convert` moves a drafter between the layouts of its family (families/convert.py): tensors renamed by
    `key_rules` (canonical prefix, this layout's), the config rebuilt from vLLM's reading of the source (its
    `config_style`: "hf", the fields at the top level and in `dflash_config`, as vLLM reads them; "speculators", the
    speculators format that vLLM's reader turns into the former; "torchspec", TorchSpec's config class's fields).
    The first layout of the family whose `signals` all hold is the files' layout; the last has none (the family's
    own). `writable` False: read only, with `why`.
    """

    id: str  # the --to value, stable (JSON, docs)
    family: str  # Family.id
    title: str
    producers: str
    signals: tuple[Signal, ...] = ()
    key_rules: tuple[tuple[str, str], ...] = ()
    config_style: str = "hf"
    vllm_loads: bool = True  # vLLM's loader knows these tensor names
    depth_key: str = "num_target_layers"  # the config key holding the depth of the target it was trained on
    writable: bool = True
    why: str = ""  # why eaglectl does not write it

    def to_canonical(self, name: str) -> str:
        return renamed(name, self.key_rules, to_canonical=True)

    def from_canonical(self, name: str) -> str:
        return renamed(name, self.key_rules, to_canonical=False)


# DFlash as three producers write it. The canonical names are vLLM's (qwen3_dflash.py); TorchSpec keeps its training
# names in what its DFlash export writes (tools/convert_dflash_to_hf.py saves the model's state dict as is) and maps
# the canonical ones back itself when it loads (models/draft/keymap.py), so it is read, never written.
LAYOUTS: tuple[Layout, ...] = (
    Layout("dflash-speculators", "dflash", "vLLM speculators DFlash",
           "vllm-project/speculators (`speculators_model_type: dflash`; its `convert --algorithm dflash`)",
           (Signal("config-value", "speculators_model_type", "dflash"),), config_style="speculators"),
    Layout("dflash-torchspec", "dflash", "TorchSpec DFlash", "lightseekorg/TorchSpec (training names: context_proj, "
           "context_norm, final_norm)", (Signal("tensor-prefix", "context_proj."),),
           key_rules=(("fc.", "context_proj."), ("hidden_norm.", "context_norm."), ("norm.", "final_norm.")),
           # its config class's fields: TorchSpec's num_target_layers counts the layers it captures
           config_style="torchspec", vllm_loads=False, depth_key="target_num_hidden_layers", writable=False,
           why="TorchSpec loads the vLLM layout itself (its keymap renames fc, hidden_norm and norm back): write "
               "--to dflash"),
    Layout("dflash", "dflash", "DFlash (z-lab / vLLM)", "z-lab DFlash releases, SpecForge, ModelOpt; what vLLM "
           "loads as DFlashDraftModel (`dflash_config`)"),
)


def layout_of(family: Family, probe: Probe) -> Layout | None:
    """The layout these files of `family` are in (None: the family has no layouts eaglectl converts)."""
    return next((lay for lay in LAYOUTS if lay.family == family.id and all(s.holds(probe) for s in lay.signals)),
                None)


def layout(layout_id: str) -> Layout | None:
    return next((lay for lay in LAYOUTS if lay.id == layout_id), None)


def writable_layouts(family_id: str | None = None) -> list[str]:
    """The layout ids eaglectl writes (of one family when `family_id` is given)."""
    return [lay.id for lay in LAYOUTS if lay.writable and family_id in (None, lay.family)]


# Model Runner V1 is the one every CPU build of vLLM runs (no Triton: docs/engines.md#runners)
CPU_RUNNER = "v1"


def smoke_limit(family: Family, engine: str, gpu: bool | None = None) -> str | None:
    """Why `smoke` cannot measure this family on `engine` (None: it can): the reference loop runs none of these
    methods; a CPU build of vLLM (gpu False) runs V1 only, which refuses some."""
    reading = family.reading
    if reading is None:
        return f"{family.name} is not read by eaglectl"
    if engine == "reference":
        return reading.reference
    if engine == "vllm" and gpu is False and reading.runners.get(CPU_RUNNER) is not None:
        return f"{reading.runners[CPU_RUNNER]}; this vLLM is a CPU build"
    return None


def identify(probe: Probe) -> tuple[Family, tuple[str, ...]] | None:
    """The family these files belong to (beside plain EAGLE-3), with the evidence; None for anything else."""
    for family in FAMILIES:
        evidence = family.evidence(probe)
        if evidence is not None:
            return family, evidence
    return None


def by_id(family_id: str) -> Family:
    return next(f for f in FAMILIES if f.id == family_id)
