"""What SGLang reads of an EAGLE-3 drafter, release by release, as eaglectl's table of SGLang's own code.

Read in the SGLang 0.5.23 wheel (every row names its file; docs/engines.md#sglang renders them):
- the target's capture: `model_runner_components/spec_aux_hidden_state.py _resolve_eagle_aux_hidden_state` takes the
  ids from `eagle_config.eagle_aux_hidden_state_layer_ids` only (the top-level key, vLLM's, is never read; any
  exception reading it means none), and the target class's own `set_eagle3_layers_to_capture` turns them into the
  layers whose input it captures (boundaries): most classes add 1 to every id, DeepSeek-V2/V3 only when the first
  id is 1 (CAPTURE); none given, the class's default [2, L//2, L-3];
- the draft class: the loader (`model_loader/utils.py get_model_architecture`) resolves `architectures`; only two
  classes are EAGLE-3 drafters (`LlamaForCausalLMEagle3`, `Eagle3DeepseekV2ForCausalLM`). Any other registered
  class loads as that model (a SafeAILab `LlamaForCausalLM` head as the whole Llama), an unregistered name is
  refused ("Cannot find model module"), and a speculators file, which carries no `model_type`, is refused at
  launch (`arg_groups/speculative_hook.py`: "Unrecognized model");
- the draft class's reading (`models/llama_eagle3.py`): fc's aux count, `fc_norm` or the legacy `use_aux_norm`,
  `norm_output`, `norm_before_fc` (eagle_config first), never `norm_before_residual`; weights it has no parameter
  for are dropped without a word; a window only from the server flag `--speculative-draft-window-size`, on every
  draft layer.

Pure data and functions of a config: no torch, no SGLang import (`asking.py` asks SGLang itself where an interpreter
is given, and a CI test holds these tables to what SGLang's code answers).
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..io.jsonio import MISSING, config_get

RELEASE = "0.5.23"  # the SGLang release these tables were read in
RELEASES = (RELEASE,)
BASIS = f"assumed (eaglectl's table of SGLang {RELEASE}, read in its wheel)"
IDS_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"
_M = "srt/models/"


@dataclass(frozen=True)
class Capture:
    """What a group of SGLang target classes does with the ids it is given (`set_eagle3_layers_to_capture`)."""

    rule: str  # plus-one | plus-one-if-first-is-1 | as-is-if-max-is-L | plus-one-default-too
    where: str  # the file and line, under sglang/
    archs: tuple[str, ...]
    past_last: str = "never captured"  # what an id past the last layer does there

    def boundaries(self, ids: tuple[int, ...] | None, layers: int | None) -> tuple[int, ...] | None:
        """The boundaries captured (the input of each layer listed), in the order kept; None: the default with the
        depth unknown."""
        if ids is None:
            if layers is None:
                return None
            default = (2, layers // 2, layers - 3)
            return tuple(i + 1 for i in default) if self.rule == "plus-one-default-too" else default
        if self.rule == "plus-one-if-first-is-1" and ids[:1] != (1,):
            return ids
        if self.rule == "as-is-if-max-is-L" and layers is not None and ids and max(ids) == layers:
            return ids
        return tuple(i + 1 for i in ids)

    def ids_for(self, boundaries: tuple[int, ...], layers: int | None) -> tuple[int, ...] | None:
        """The eagle_config ids this class captures exactly `boundaries` from; None where no ids can say them (a
        boundary 0 under +1: id -1; the DeepSeek rule, whose first boundary cannot be 1)."""
        if self.rule == "plus-one-if-first-is-1":
            return boundaries if boundaries[:1] != (1,) else None
        if self.rule == "as-is-if-max-is-L" and layers is not None and boundaries and max(boundaries) == layers:
            return boundaries
        if any(b < 1 for b in boundaries):
            return None
        return tuple(b - 1 for b in boundaries)

    def shift(self, ids: tuple[int, ...] | None, layers: int | None) -> int:
        got = self.boundaries(ids, layers)
        return 0 if ids is None or got == ids else 1


_INDEXED = "an IndexError at start-up (the class marks self.layers[id])"
CAPTURE: tuple[Capture, ...] = (
    Capture("plus-one", _M + "llama.py L929-941 (and the same code in 19 other files)", (
        "ApertusForCausalLM", "BailingMoEForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
        "Cosmos3ForConditionalGeneration", "EmbeddingGemmaModel", "ExaoneMoEForCausalLM", "ExaoneMoEForCausalLMMTP",
        "ExaoneMoeForCausalLM", "Gemma3ForCausalLM", "Gemma4AssistantForCausalLM", "Gemma4ForCausalLM",
        "Gemma4UnifiedAssistantForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeForCausalLMNextN",
        "Glm5NextForConditionalGeneration", "IQuestCoderForCausalLM", "InternLM3ForCausalLM",
        "InternS1ProForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration", "Llama4ForCausalLM", "LlamaForCausalLM", "LlamaForCausalLMEagle",
        "LlamaForCausalLMEagle3", "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN", "MellumForCausalLM",
        "MiniMaxM2ForCausalLM", "MiniMaxM3SparseForCausalLM", "Ministral3ForCausalLM", "MistralForCausalLM",
        "MistralForCausalLMEagle", "Phi3ForCausalLM", "Qwen2ForCausalLM", "Qwen2ForCausalLMEagle",
        "Qwen2_5_VLForConditionalGeneration", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3MoeForCausalLMMTP",
        "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForCausalLM",
        "Qwen4ExpForConditionalGeneration", "SarvamMoEForCausalLM", "TeleFLMForCausalLM",
        # wrappers that hand the ids to a language model of this group (gemma3_mm.py L543, mllama4.py L971,
        # gemma4_mm.py L1155)
        "Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration", "Gemma4ForConditionalGeneration",
        "Gemma4UnifiedForConditionalGeneration")),
    Capture("plus-one", _M + "qwen2_moe.py L1418, qwen3_next.py L1286, qwen3_5.py (the inner models mark layers)", (
        "Qwen2MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3NextForCausalLMMTP", "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"), past_last=_INDEXED),
    Capture("plus-one-if-first-is-1", _M + "deepseek_v2.py L3458-3473 (`if layer_ids and layer_ids[0] == 1`), "
            "glm4_moe_lite.py L805-820, kimi_k25.py L928-939 (its language model)", (
                "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM",
                "DeepseekV3ForCausalLMNextN", "Glm4MoeLiteForCausalLM", "Glm4MoeLiteForCausalLMNextN",
                "Glm5NextForConditionalGenerationNextN", "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN",
                "MistralLarge3ForCausalLM", "MistralLarge3ForCausalLMEagle", "KimiK25ForConditionalGeneration")),
    Capture("as-is-if-max-is-L", _M + "gpt_oss.py L1337-1352", ("GptOssForCausalLM",)),
    Capture("plus-one-default-too", _M + "minimax_m3_vl.py L246-263", ("MiniMaxM3SparseForConditionalGeneration",)),
)

# the EAGLE-3 draft classes of SGLang's registry: the module that builds each, and how it counts fc's aux states
DRAFT_CLASSES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLMEagle3": ("llama_eagle3", "num_aux_hidden_states, else len(eagle_config ids), else 3 "
                                               "(llama_eagle3.py L156-161)"),
    "Eagle3DeepseekV2ForCausalLM": ("kimi_k25_eagle3", "len(eagle_config ids), else len(top-level ids), else 3; "
                                                       "num_aux_hidden_states is not read (kimi_k25_eagle3.py "
                                                       "L48-59)"),
}
# the canonical tensor names the Llama draft class has a parameter for (llama_eagle3.py load_weights, after its
# renames midlayer -> layers.0, aux_norm_* -> fc_norm.*); d2t becomes hot_token_id, t2d is read and ignored
_KEPT = ("embed_tokens.weight", "fc.weight", "fc.bias", "norm.weight", "lm_head.weight", "input_norm.weight", "d2t",
         "t2d")
WINDOW_FLAG = "--speculative-draft-window-size"
SERVE = "python -m sglang.launch_server"


@functools.cache
def registry() -> frozenset[str]:
    """The architectures SGLang's registry resolves (eaglectl/data, read in the wheel)."""
    text = (Path(__file__).parents[1] / "data" / f"sglang-{RELEASE}-registry.txt").read_text()
    return frozenset(line for line in text.splitlines() if line and not line.startswith("#"))


def capture_of(target_arch: str | None) -> Capture | None:
    """The capture group of a target architecture (None: not a class SGLang captures EAGLE-3 states from)."""
    return next((c for c in CAPTURE if target_arch in c.archs), None)


def ids_read(config: dict[str, Any]) -> tuple[int, ...] | None:
    """The ids `_resolve_eagle_aux_hidden_state` hands the target: eagle_config's, as a list of integers; None
    where reading them raises (no eagle_config, no key, not a list) or the list is empty."""
    value = config_get(config, IDS_KEY)
    if value is MISSING or not isinstance(value, list) or not value:
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return None
    return tuple(value)


def draft_class(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the class SGLang builds for the draft, why it is not an EAGLE-3 drafter: None when it is)."""
    if "speculators_model_type" in config and "model_type" not in config:
        return None, ("refused at launch: a speculators config carries no model_type (arg_groups/speculative_hook.py "
                      "L90-95: \"Unrecognized model ... Should have a model_type key\")")
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch in DRAFT_CLASSES:
        return f"{DRAFT_CLASSES[arch][0]}.{arch}", None
    if arch is None:
        return None, "no architectures: SGLang's loader resolves no class"
    if arch in registry():
        return arch, (f"loads as the model {arch}, not as an EAGLE-3 draft class (SGLang's EAGLE-3 drafters: "
                      f"{', '.join(DRAFT_CLASSES)})")
    return None, f"refused at load: '{arch}' is no SGLang class (model_loader/utils.py: \"Cannot find model module\")"


def flags(config: dict[str, Any], klass: str) -> dict[str, bool]:
    """The norm flags the draft class applies (llama_eagle3.py L169-207; kimi_k25_eagle3.py has no norm_before_fc)."""
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    nbfc = eagle.get("norm_before_fc", config.get("norm_before_fc", False)) and not _deepseek(klass)
    return {"fc_norm": bool(config.get("fc_norm") or config.get("use_aux_norm")),
            "norm_output": bool(config.get("norm_output", False)), "norm_before_fc": bool(nbfc),
            "norm_before_residual": False}  # never read: the layer always normalises after the residual


def num_aux(config: dict[str, Any], klass: str) -> int | None:
    """How many aux states fc is built for, as the draft class counts them."""
    nested = ids_read(config)
    if _deepseek(klass):
        top = config.get("eagle_aux_hidden_state_layer_ids")
        return len(nested) if nested else len(top) if isinstance(top, list) and top else 3
    n = config.get("num_aux_hidden_states")
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    return len(nested) if nested else 3


def _deepseek(klass: str) -> bool:
    return klass.endswith("Eagle3DeepseekV2ForCausalLM")


def skipped(canonical: list[str], klass: str) -> list[str]:
    """The drafter's tensors the Llama draft class has no parameter for: SGLang drops them without a word
    (llama_eagle3.py L363-378). The DeepSeek class names what it drops in a warning (kimi_k25_eagle3.py L494-496)."""
    if _deepseek(klass):
        return []
    return [n for n in canonical if n not in _KEPT and not n.startswith(("fc_norm.", "layers.0.", "layers."))]


def serve_line(target: str, drafter: str, window: int | None = None) -> str:
    """`python -m sglang.launch_server` with the EAGLE-3 flags (steps, top-k and draft tokens chosen by SGLang for
    the target: speculative_hook.py _auto_choose_speculative_params), and the window flag a sliding drafter needs."""
    line = (f"{SERVE} --model-path {shlex.quote(target)} --speculative-algorithm EAGLE3 "
            f"--speculative-draft-model-path {shlex.quote(drafter)}")
    return line + (f" {WINDOW_FLAG} {window}" if window else "")
