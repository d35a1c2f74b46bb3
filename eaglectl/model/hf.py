"""Run a real HF transformers target and capture the aux hidden states a drafter consumes (a plain Llama
target that eaglectl runs itself, model/native.py, answers the same calls without transformers).

vLLM's aux id k (boundary convention) is the residual stream entering target layer k: the token
embeddings for k = 0, the output of decoder layer k-1 otherwise, and for k = L the last layer's
output *before* the final norm. HF's `hidden_states[L]` is post-norm, so states are taken with
forward hooks on the decoder layers rather than from `output_hidden_states` (docs/math.md#aux-states).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import counters as loads
from ..errors import (
    CorruptCheckpointError,
    IncompatibleDrafterError,
    MissingDependencyError,
    ReferenceLimitError,
    UnknownFormatError,
)
from ..io.hub import local_snapshot
from ..io.jsonio import ConfigView
from .native import KVCache, Llama, load_native
from .tokens import plain_tokenizer

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

    from ..checkpoint.target import TargetCheckpoint


_LAYER = re.compile(r"(?:^|\.)layers\.([0-9]{1,6})\.")  # a decoder layer's tensors, ASCII digits only


@dataclass
class HFModel:
    model: PreTrainedModel | Llama
    tokenizer: PreTrainedTokenizerBase | None
    path: str
    num_layers: int
    hidden_size: int
    vocab_size: int

    def embedding(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight.detach()

    def head(self) -> torch.Tensor:
        """The output head [V, H] (a tied target's head is its embedding)."""
        out = self.model.get_output_embeddings()
        return (out.weight if out is not None else self.model.get_input_embeddings().weight).detach()


def load_model(source: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
               checkpoint: TargetCheckpoint | None = None) -> HFModel:
    """A local folder or a Hub id (through the huggingface_hub cache); never trust_remote_code. A command loads
    its target once, through `target.Target.model`, which passes the opened `checkpoint`: when eaglectl runs it
    itself (model/native.py) it is read from there and transformers is not imported."""
    loads.count("target_model")
    native = load_native(checkpoint, dtype) if checkpoint is not None and device == "cpu" else None
    if native is not None:
        assert checkpoint is not None
        folder = Path(checkpoint.ckpt.root)
        tokenizer = plain_tokenizer(folder) or _auto_tokenizer(folder)
        return HFModel(native, tokenizer, source, native.num_layers, native.hidden_size, native.vocab_size)
    try:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise MissingDependencyError("transformers is needed to run the target", hint="pip install transformers") from None
    hf_logging.disable_progress_bar()  # our stderr carries one-line messages only
    hf_logging.set_verbosity_error()
    path = _local_folder(source)
    model = _from_pretrained(AutoModelForCausalLM, source, path, dtype, checkpoint).to(device).eval()
    tokenizer = _auto_tokenizer(Path(path))
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return HFModel(model, tokenizer, source, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size)


def _from_pretrained(auto: Any, source: str, path: str, dtype: torch.dtype,
                     checkpoint: TargetCheckpoint | None) -> PreTrainedModel:
    """transformers' model of the target; its refusal of the config (a model_type it has no class for, sizes it
    cannot build) is eaglectl's error naming the target, as open_target refuses a target that is no model."""
    from transformers import CONFIG_MAPPING

    if checkpoint is not None:
        where = checkpoint.config.where
        kind = ConfigView(checkpoint.ckpt.config, where).str("model_type")  # the top level's: what transformers reads
        if kind is not None and kind not in CONFIG_MAPPING:
            raise UnknownFormatError(f"{where}: model_type '{kind[:80]}' is not a model transformers knows, so the "
                                     "target cannot be run", path=source, key="model_type",
                                     hint="check the target's config.json, or update transformers")
        held = [int(m.group(1)) for n in checkpoint.ckpt.tensor_file if (m := _LAYER.search(n))]
        depth = checkpoint.num_layers
        if held and depth is not None and depth > max(held) + 1:  # transformers would fill the rest at random
            raise CorruptCheckpointError(f"{where}: num_hidden_layers {depth}, but the weights hold layers up to "
                                         f"{max(held)}: transformers would run the missing layers at random values",
                                         path=source, key="num_hidden_layers",
                                         hint="fix the target's config.json to describe its weights")
    from huggingface_hub.errors import StrictDataclassError  # transformers' typed config fields raise it

    try:
        return auto.from_pretrained(path, dtype=dtype, trust_remote_code=False)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RuntimeError, ZeroDivisionError,
            StrictDataclassError) as e:  # a hostile config trips transformers anywhere while it builds
        why = " ".join(str(e).split())[:200] or type(e).__name__  # its checks of the config, on one line
        raise UnknownFormatError(f"{source}: transformers cannot build the target from its config.json ({why})",
                                 path=source, hint="check the target's config.json against its weights") from None


def _auto_tokenizer(folder: Path) -> PreTrainedTokenizerBase | None:
    """transformers' tokenizer of the folder (None: it has none)."""
    if not any((folder / n).exists() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def _local_folder(source: str) -> str:
    if Path(source).is_dir():
        return source
    return str(local_snapshot(source, ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]))


def decoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    for path in ("model.layers", "model.language_model.layers", "transformer.h"):
        node = model
        try:
            for part in path.split("."):
                node = getattr(node, part)
        except AttributeError:
            continue
        return node
    raise ReferenceLimitError(f"{type(model).__name__}: cannot find the decoder layers to capture",
                              hint="capture the states with vLLM (`eaglectl capture`) and pass --states")


@torch.no_grad()
def forward(target: HFModel, input_ids: torch.Tensor, layer_ids: tuple[int, ...], *, cache: Any = None,
            positions: torch.Tensor | None = None, logits_to_keep: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (B, T, V) and the aux states of `layer_ids` (B, T, len(ids)·H_t) from one forward pass.

    With `cache` (from `new_cache`), `input_ids` are the tokens after the ones the cache holds, at
    `positions` (B, T): the cache grows by T, and the logits and states are those of the new tokens.
    `logits_to_keep` > 0 computes only the last that many logits (a prefill needs one)."""
    L = target.num_layers
    bad = [i for i in layer_ids if not 0 <= i <= L]
    if bad:
        raise IncompatibleDrafterError(f"aux ids {bad} are outside 0..{L} for this {L}-layer target",
                                       hint="give the target the drafter was trained for (inspect --target compares)")
    if isinstance(target.model, Llama):
        return target.model.run(input_ids, layer_ids, cache=cache, positions=positions, logits_to_keep=logits_to_keep)
    layers = decoder_layers(target.model)
    captured: dict[int, torch.Tensor] = {}
    hooks = []
    for k in layer_ids:
        if k == 0:
            continue

        def hook(module: Any, args: Any, output: Any, k: int = k) -> None:
            captured[k] = output[0] if isinstance(output, tuple) else output

        hooks.append(layers[k - 1].register_forward_hook(hook))
    extra: dict[str, Any] = {}
    if cache is not None:
        extra = {"cache" if _takes(target.model, "cache") else "past_key_values": cache, "use_cache": True}
        if positions is not None:
            extra["position_ids"] = positions.to(target.model.device)
    if logits_to_keep and _takes(target.model, "logits_to_keep"):  # else all logits (the last ones are the same)
        extra["logits_to_keep"] = logits_to_keep
    try:
        out = target.model(input_ids=input_ids.to(target.model.device), output_hidden_states=0 in layer_ids, **extra)
    finally:
        for h in hooks:
            h.remove()
    if 0 in layer_ids:
        captured[0] = out.hidden_states[0]
    if not layer_ids:
        return out.logits, out.logits.new_zeros(*input_ids.shape, 0, dtype=torch.float32)
    return out.logits, torch.cat([captured[k].float() for k in layer_ids], dim=-1)


@torch.no_grad()
def greedy(target: HFModel, input_ids: torch.Tensor, new: int) -> torch.Tensor:
    """The prompts (B, P, one length) followed by `new` greedy tokens each (no stop at end-of-sequence)."""
    if isinstance(target.model, Llama):
        return target.model.greedy(input_ids, new)
    return target.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None)


# ------------------------------------------------------------------------------------ the KV cache

def new_cache(target: HFModel) -> DynamicCache | KVCache:
    """An empty transformers `DynamicCache` (eaglectl's own for a target it runs itself) for one sequence of
    `target` (pass it to `forward`)."""
    if isinstance(target.model, Llama):
        return KVCache(target.num_layers)
    from transformers import DynamicCache

    try:
        return DynamicCache(config=target.model.config)
    except TypeError:  # an older transformers: layers are made on first use
        return DynamicCache()


def croppable(cache: Any) -> bool:
    """True when every layer of a filled cache holds each past position (full attention), so cropping it
    to a prefix gives exactly the cache of that prefix. Sliding-window and linear-attention layers
    (recurrent states) cannot be rolled back: callers recompute instead."""
    if isinstance(cache, KVCache):
        return True
    from transformers import cache_utils

    layers = getattr(cache, "layers", None)
    full = getattr(cache_utils, "DynamicLayer", None)
    if layers is None or full is None:  # an older cache: per-layer key/value lists of every position
        return True
    return bool(layers) and all(type(layer) is full for layer in layers)


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first `length` positions. `crop(-n)` removes n positions in every transformers version
    (a positive argument is an absolute length before 5.x and an error after)."""
    drop = cache.get_seq_length() - length
    if drop > 0:
        cache.crop(-drop)


def _takes(model: Any, name: str) -> bool:
    """Whether the model's forward takes `name`: transformers 5.x calls the cache `cache` (`past_key_values`
    is deprecated), 4.x only knows `past_key_values`."""
    return name in inspect.signature(model.forward).parameters
