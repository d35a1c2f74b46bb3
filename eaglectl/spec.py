"""DrafterSpec: a dialect-free description of an EAGLE-3 / EAGLE-3.1 drafter.

Canonical tensor names follow vLLM / speculators spelling: `layers.<i>.…`, `fc.weight`,
`fc_norm.<j>.weight`, `input_norm.weight`, `norm.weight`, `lm_head.weight`,
`embed_tokens.weight`, `d2t`, `t2d`. Every field records where its value came from
(`sources`): a config key, a dialect's definition, a default, or the weights.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")

_LAYER = re.compile(r"layers\.([0-9]{1,6})\.")  # ASCII digits only ('²'.isdigit() is True)


def layer_index(canonical: str) -> int | None:
    """The decoder layer a canonical tensor name belongs to (`layers.<i>.…`), else None."""
    m = _LAYER.match(canonical)
    return int(m.group(1)) if m else None

# Aux-layer-id conventions (docs/hazards.md#aux-ids). boundary: id k = residual stream entering layer k
# (vLLM, SafeAILab, speculators); output: id k = output of layer k = boundary k+1 (sglang,
# SpecForge, TRT-LLM, ModelOpt HF path, NeMo, TorchSpec).
AUX_CONVENTIONS = {
    "boundary": "id k = residual stream entering target layer k (HF hidden_states[k]); vLLM's meaning",
    "output": "id k = output of target layer k (HF hidden_states[k+1]); vLLM id = k + 1",
}

# EAGLE version names by (norm_before_fc, fc_norm, norm_output): 3.1 is fc_norm + norm_output.
EAGLE_VERSIONS: dict[tuple[bool, bool, bool], tuple[str, str]] = {
    (False, False, False): ("3", "EAGLE-3: no aux norms, pre-norm feedback"),
    (False, True, True): ("3.1", "EAGLE-3.1: per-aux fc_norm and post-norm feedback"),
    (False, True, False): ("3.1-fc-norm-only", "fc_norm without post-norm feedback"),
    (False, False, True): ("3.1-norm-output-only", "post-norm feedback without fc_norm"),
    (True, False, False): ("3-norm-before-fc", "gpt-oss style: one RMSNorm over the aux concatenation"),
    (True, False, True): ("3.1-single-norm", "speculators PR #610 'Eagle 3.1': norm_before_fc + norm_output"),
    (True, True, False): ("3.1-double-norm", "norm_before_fc and fc_norm (vLLM applies both)"),
    (True, True, True): ("3.1-double-norm", "norm_before_fc and fc_norm (vLLM applies both) + norm_output"),
}


@dataclass(frozen=True)
class DrafterSpec:
    arch: str  # llama | qwen3 | mla
    hidden_size: int | None
    target_hidden_size: int | None  # width of each aux state (defaults to hidden_size)
    num_attention_heads: int | None
    num_key_value_heads: int | None
    head_dim: int | None  # explicit, or hidden / heads
    intermediate_size: int | None
    num_hidden_layers: int | None  # drafter decoder layers
    vocab_size: int | None  # target vocab
    draft_vocab_size: int | None  # rows of lm_head
    aux_layer_ids: tuple[int, ...] | None  # as stored, in the dialect's convention
    aux_convention: str  # boundary | output
    num_aux_hidden_states: int | None  # from fc width (the weights decide)
    rms_norm_eps: float | None
    rope_theta: float | None
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int | None
    norm_before_residual: bool
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    has_embed_tokens: bool
    has_lm_head: bool
    tie_word_embeddings: bool | None
    attention_bias: bool  # q/k/v biases (vLLM reads attention_bias)
    sliding_window: int | None  # the window vLLM applies to the `sliding_layers` (None: every layer attends fully)
    config_dtype: str | None  # torch_dtype / dtype in the config
    tensor_dtypes: tuple[str, ...]
    sources: dict[str, str] = field(default_factory=dict)
    # MLA only: q_lora_rank (None = plain q_proj), kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    mla: dict[str, int | None] | None = None
    sliding_layers: tuple[int, ...] = ()  # the layers `layer_types` makes sliding_attention (vLLM reads no other key)

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Per layer, the sliding window vLLM applies (None: full attention)."""
        layers = range(self.num_hidden_layers or 0)
        return tuple(self.sliding_window if i in self.sliding_layers else None for i in layers)

    @property
    def eagle_version(self) -> str:
        return EAGLE_VERSIONS[(self.norm_before_fc, self.fc_norm, self.norm_output)][0]

    @property
    def aux_width(self) -> int | None:
        return self.target_hidden_size or self.hidden_size

    @property
    def aux_layer_ids_vllm(self) -> tuple[int, ...] | None:
        """The stored ids in boundary numbering (vLLM's), as the dialect's convention means them."""
        if self.aux_layer_ids is None:
            return None
        shift = 1 if self.aux_convention == "output" else 0
        return tuple(i + shift for i in self.aux_layer_ids)

    def capture_ids(self, target_layers: int) -> tuple[int, ...]:
        """The target boundaries the files say the drafter reads on a target of that depth: its stored ids in boundary
        numbering, else the default every engine uses; sorted and de-duplicated. What the drafter means, not what an
        engine reads of its config (engines/readings.layers_read, or the engine asked)."""
        return tuple(sorted(set(self.aux_layer_ids_vllm or default_aux_ids(target_layers, "boundary"))))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("sources")
        out["aux_layer_ids"] = list(self.aux_layer_ids) if self.aux_layer_ids is not None else None
        out["aux_layer_ids_vllm"] = list(self.aux_layer_ids_vllm) if self.aux_layer_ids_vllm else None
        out["tensor_dtypes"] = list(self.tensor_dtypes)
        out["eagle_version"] = self.eagle_version
        return out


def default_aux_ids(target_layers: int, convention: str) -> tuple[int, ...]:
    """The engines' heuristic when a drafter lists no ids (docs/math.md#aux-states)."""
    L = target_layers
    ids = (2, L // 2, L - 3) if convention == "boundary" else (1, L // 2 - 1, L - 4)
    return tuple(sorted(set(ids)))
