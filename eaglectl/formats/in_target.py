"""Drafters that live inside their target's checkpoint, declared as data: how each is told apart (tensor names under
a prefix of its own, or a subfolder beside the target's files), the config keys the engine that builds it requires,
and how it is served. Read from the engines' code (vLLM 0.32 and 0.34, SGLang 0.5.23; docs/families.md#in-target):

- DeepSeek-V4's `mtp.*` block is a DSpark drafter when it holds `markov_head` and no `enorm` / `hnorm`
  (DeepSeek-V4-Flash-0731): vLLM's method dspark builds it from the target's `dspark_*` keys; method mtp refuses a
  V4.1 target and cannot load DSpark's tensors on V4; SGLang's NextN loads part of it with only a warning.
- Mistral Large 4's `mtp_dspark.*` is a DSpark drafter vLLM 0.34 builds from the target's `mtp_config` (params.json's
  `mtp`), method dspark.
- MiniMax-M3's DSpark drafter lies in the target repository's `dspark/` subfolder, which vLLM 0.34 reads with method
  dspark and no draft model.
- Any other `mtp.*` block with `enorm`, `hnorm` and `eh_proj` is the target's own MTP block (method mtp).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class InTarget:
    name: str
    prefixes: tuple[str, ...]  # the tensor-name prefixes it lives under (empty: a subfolder, `subfolder`)
    has: tuple[str, ...]  # name parts some tensor under the prefix holds, each of them
    lacks: tuple[str, ...]  # name parts no tensor under the prefix holds
    served: str  # how it is served, said with its name
    method: str  # vLLM's --speculative-config method
    releases: str  # the vLLM releases whose code builds it
    # the target config keys (dotted) vLLM requires to build it, and the key holding its block (its drafts per step)
    needs: tuple[str, ...] = ()
    block: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()  # a subfolder drafter: the target model types it belongs to
    subfolder: str = ""
    architecture: str = ""  # a subfolder drafter's config architectures[0], as vLLM requires it
    ids: str = ""  # the key of the target layers it reads (output-of-layer ids: vLLM captures each + 1)
    ids_as_is: tuple[str, ...] = ()  # target model types whose ids vLLM captures as they are (DeepSeek-V4.1)
    # SGLang 0.5.23 captures the ids as they are, for every model type: the attention input of each layer
    # (models/deepseek_v4.py set_dspark_layers_to_capture); None: SGLang has no reader for it
    sglang_as_is: bool | None = None
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()  # keys with the values vLLM accepts (absent: the first)
    closed: tuple[str, tuple[str, ...]] | None = None  # an object whose other keys vLLM refuses


# Ordered: the first that fits names the block
IN_TARGET = (
    InTarget("a DSpark drafter", ("mtp.", "model.mtp."), (".markov_head.",), (".enorm.", ".hnorm."),
             "serve it as DSpark (vLLM method dspark, from 0.25), never as MTP: vLLM's method mtp refuses a V4.1 "
             "target and cannot load DSpark's tensors on V4, SGLang's NextN loads part of it with a warning",
             "dspark", "0.25-0.34", needs=("dspark_target_layer_ids", "dspark_markov_rank"),
             block=("dspark_block_size",), ids="dspark_target_layer_ids", ids_as_is=("deepseek_v41",),
             sglang_as_is=True),
    InTarget("a DSpark drafter (Mistral Large 4)", ("mtp_dspark.",), ("backbone.",), (),
             "vLLM 0.34 builds it from the target's mtp_config (method dspark); vLLM 0.33 and older and SGLang 0.5.23 "
             "have no reader for it", "dspark", "0.34",
             needs=("mtp_config.dspark.markov_rank", "mtp_config.n_layers", "mtp_config.depth",
                    "mtp_config.target_activation_layers"), block=("mtp_config.depth",),
             ids="mtp_config.target_activation_layers",
             choices=(("mtp_config.dspark.head_type", ("vanilla", "rnn")),
                      ("mtp_config.dspark.draft_input", ("shared_mask", "position_specific"))),
             closed=("mtp_config.dspark", ("markov_rank", "head_type", "draft_input"))),
    InTarget("an MTP block", ("mtp.", "model.mtp."), (".enorm.", ".hnorm.", ".eh_proj."), (".markov_head.",),
             "served by the target's own MTP method (vLLM method mtp), not as an EAGLE drafter", "mtp", ""),
    InTarget("a DSpark drafter (MiniMax-M3)", (), (), (),
             "vLLM 0.34 reads it from the target's dspark/ subfolder with method dspark and no draft model; vLLM 0.33 "
             "and older have no reader for it", "dspark", "0.34",
             needs=("dspark_markov_rank", "dspark_use_dense_ffn"), block=("dspark_block_size", "block_size"),
             model_types=("minimax_m3_vl", "minimax_m3_text"), subfolder="dspark",
             architecture="DSparkMiniMaxDraftModel"),
)


def held(tensors: Sequence[str]) -> tuple[InTarget, str, list[str]] | None:
    """The drafter a target's checkpoint holds under a prefix of its own, that prefix and its tensors."""
    for kind in IN_TARGET:
        for prefix in kind.prefixes:
            names = [t for t in tensors if t.startswith(prefix)]
            if names and all(any(h in t for t in names) for h in kind.has) and \
                    not any(x in t for t in names for x in kind.lacks):
                return kind, prefix, names
    return None


def in_target(tensors: Sequence[str]) -> str | None:
    """What drafter a target's checkpoint holds under a prefix of its own, and the names that say so; None: none."""
    found = held(tensors)
    if found is None:
        return None
    kind, prefix, names = found
    seen = ", ".join(h.strip(".") for h in kind.has)
    lacking = f"; no {' / '.join(x.strip('.') for x in kind.lacks)}" if kind.lacks else ""
    return f"it holds {kind.name} under {prefix}* ({len(names)} tensors: {seen}{lacking}): {kind.served}"


def beside(model_type: object) -> InTarget | None:
    """The drafter a target of this model type keeps in a subfolder of its own repository."""
    return next((k for k in IN_TARGET if k.subfolder and model_type in k.model_types), None)
