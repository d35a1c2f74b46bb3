"""A plain Llama target run by eaglectl itself: torch only, transformers never imported.

Importing transformers and building its model costs about 2.5 CPU-s before the first token (its modeling module
pulls in torch._dynamo and torch.distributed), more than everything a probe of a small target computes. A target
whose config is one eaglectl implements exactly (`RUNS_ITSELF`: Llama, default RoPE, no biases) is read from its
safetensors with eaglectl's own reader and run here, in fp32: the same math as transformers' Llama (pre-norm
layers, fp32 RMSNorm, rotate-half RoPE with transformers' fp32 inverse frequencies, SDPA attention), a KV cache
for decoding, greedy continuation. Anything else (another architecture, rope scaling, a dtype other than fp32)
goes to transformers (model/hf.py). Its tokenizer is tokenizer.json through the `tokenizers` library when
tokenizer_config.json says that is all it is (model/tokens.py), else transformers'.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..errors import CorruptCheckpointError
from ..limits import limit
from .blocks import owned

if TYPE_CHECKING:
    from ..checkpoint.target import TargetCheckpoint

# config key -> the values eaglectl implements (a key absent from the config reads as None)
RUNS_ITSELF: dict[str, tuple[Any, ...]] = {
    "architectures": (["LlamaForCausalLM"],), "model_type": ("llama",), "hidden_act": ("silu", None),
    "attention_bias": (False, None), "mlp_bias": (False, None), "pretraining_tp": (1, None),
    "rope_scaling": (None,), "quantization_config": (None,),
}
ROPE_TYPES = ("default", None)  # rope_parameters.rope_type (transformers 5) that is plain RoPE


def why_not_native(config: dict[str, Any], dtype: torch.dtype) -> str | None:
    """Why eaglectl does not run this target itself (None: it does)."""
    if dtype != torch.float32:
        return f"runs at {dtype}"
    for key, allowed in RUNS_ITSELF.items():
        if config.get(key) not in allowed:
            return f"{key} is {config.get(key)!r}"
    rope = config.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        return "rope_parameters is not an object"
    if rope.get("rope_type") not in ROPE_TYPES or rope.get("partial_rotary_factor", 1.0) != 1.0:
        return f"rope_parameters {rope}"
    if config.get("rope_theta", rope.get("rope_theta")) is None:
        return "no rope_theta"
    return None


class KVCache:
    """Keys and values (B, nkv, P, d) of the positions run so far, per layer."""

    def __init__(self, layers: int) -> None:
        self.k: list[torch.Tensor | None] = [None] * layers
        self.v: list[torch.Tensor | None] = [None] * layers

    def get_seq_length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (a negative length drops that many, as transformers' caches do)."""
        keep = length if length >= 0 else self.get_seq_length() + length
        self.k = [None if k is None else k[:, :, :keep] for k in self.k]
        self.v = [None if v is None else v[:, :, :keep] for v in self.v]

    def append(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = self.k[i], self.v[i]
        self.k[i] = k if old_k is None else torch.cat([old_k, k], 2)
        self.v[i] = v if old_v is None else torch.cat([old_v, v], 2)
        return self.k[i], self.v[i]  # type: ignore[return-value]


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: fp32 statistics, the weight applied in the input's dtype."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


class Llama:
    """The target's weights under transformers' names (`model.layers.0.self_attn.q_proj.weight`), run in fp32 with
    plain functions (no nn.Module: building modules initialises weights, which on the meta device imports
    torch._dynamo, and on the CPU costs seconds for a 1B-class target only to be overwritten)."""

    def __init__(self, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
        H, L, nh = config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]
        self.nh, self.nkv = nh, config.get("num_key_value_heads") or nh
        self.d = config.get("head_dim") or H // nh
        self.eps = config.get("rms_norm_eps", 1e-6)
        self.num_layers, self.hidden_size, self.vocab_size = L, H, config["vocab_size"]
        self.w = weights
        theta = float(config.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta")))
        # transformers' default RoPE frequencies, computed as it computes them (fp32), so the angles are its own
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.d, 2, dtype=torch.int64).float() / self.d))

    @staticmethod
    def tensor_names(config: dict[str, Any]) -> list[str]:
        per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                     "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"]
        return ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"] + [
            f"model.layers.{i}.{n}.weight" for i in range(config["num_hidden_layers"]) for n in per_layer]

    def get_input_embeddings(self) -> Any:  # as transformers' models: model/hf.py's HFModel asks these
        return SimpleNamespace(weight=self.w["model.embed_tokens.weight"])

    def get_output_embeddings(self) -> Any:
        return SimpleNamespace(weight=self.w["lm_head.weight"])

    def _layer(self, i: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None,
               mask: torch.Tensor | None) -> torch.Tensor:
        w, p = self.w, f"model.layers.{i}."
        B, T, _ = h.shape
        x = _norm(h, w[p + "input_layernorm.weight"], self.eps)
        q, k, v = (F.linear(x, w[f"{p}self_attn.{n}_proj.weight"]).view(B, T, heads, self.d).transpose(1, 2)
                   for n, heads in (("q", self.nh), ("k", self.nkv), ("v", self.nkv)))
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if cache is not None:
            k, v = cache.append(i, k, v)
        group = self.nh // self.nkv
        if mask is not None and group > 1:  # as transformers' SDPA path: grouped heads in the kernel unless masked
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1,
                                             scale=self.d ** -0.5, enable_gqa=mask is None and group > 1)
        h = h + F.linear(att.transpose(1, 2).reshape(B, T, self.nh * self.d), w[p + "self_attn.o_proj.weight"])
        x = _norm(h, w[p + "post_attention_layernorm.weight"], self.eps)
        gate, up = F.linear(x, w[p + "mlp.gate_proj.weight"]), F.linear(x, w[p + "mlp.up_proj.weight"])
        return h + F.linear(F.silu(gate) * up, w[p + "mlp.down_proj.weight"])

    def run(self, input_ids: torch.Tensor, layer_ids: tuple[int, ...], *, cache: KVCache | None = None,
            positions: torch.Tensor | None = None, logits_to_keep: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, T, V) and the states at boundaries `layer_ids` (B, T, len·H), as model/hf.py's `forward`."""
        B, T = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if positions is None:
            positions = torch.arange(past, past + T)[None].expand(B, T)
        freqs = positions.float()[:, :, None] * self.inv_freq[None, None, :]
        emb = torch.cat([freqs, freqs], -1)[:, None]  # (B, 1, T, d)
        cos, sin = emb.cos(), emb.sin()
        mask = None
        if past and T > 1:  # new tokens after cached ones: each sees the cache and the new ones up to itself
            mask = torch.arange(past + T)[None, :] <= (past + torch.arange(T))[:, None]
        h = F.embedding(input_ids, self.w["model.embed_tokens.weight"])
        states = {0: h}
        for i in range(self.num_layers):
            h = self._layer(i, h, cos, sin, cache, mask)
            states[i + 1] = h
        kept = h[:, -logits_to_keep:] if logits_to_keep else h
        logits = F.linear(_norm(kept, self.w["model.norm.weight"], self.eps), self.w["lm_head.weight"])
        if not layer_ids:
            return logits, logits.new_zeros(B, T, 0)
        return logits, torch.cat([states[k] for k in layer_ids], dim=-1)

    def greedy(self, input_ids: torch.Tensor, new: int) -> torch.Tensor:
        """The prompts (B, P) followed by `new` greedy tokens each (no end-of-sequence stop), with the KV cache."""
        cache = KVCache(self.num_layers)
        logits, _ = self.run(input_ids, (), cache=cache, logits_to_keep=1)
        out = [input_ids]
        for step in range(new):
            token = logits[:, -1].argmax(-1, keepdim=True)
            out.append(token)
            if step + 1 < new:
                logits, _ = self.run(token, (), cache=cache)
        return torch.cat(out, dim=1)


def _sizes(target: TargetCheckpoint) -> dict[str, Any]:
    """The sizes the native Llama builds from the target's config, each a valid value, else the key refused."""
    cv = target.config
    sizes = {"num_hidden_layers": cv.int("num_hidden_layers", lo=1, hi=limit("target_layers")),
             "hidden_size": cv.int("hidden_size", lo=1), "num_attention_heads": cv.int("num_attention_heads", lo=1),
             "num_key_value_heads": cv.int("num_key_value_heads", lo=1), "head_dim": cv.int("head_dim", lo=1),
             "intermediate_size": cv.int("intermediate_size", lo=1), "vocab_size": cv.int("vocab_size", lo=1)}
    cv.float("rms_norm_eps", lo=0.0)
    cv.float("rope_theta", lo=1e-9)
    cv.float("rope_parameters.rope_theta", lo=1e-9)
    H, nh = sizes["hidden_size"], sizes["num_attention_heads"]
    sizes["num_key_value_heads"] = sizes["num_key_value_heads"] or nh
    sizes["head_dim"] = sizes["head_dim"] or (H // nh if H and nh else None)
    missing = next((k for k, v in sizes.items() if v is None), None)
    bad = next(iter(cv.problems.items()), None)
    if bad is not None or missing is not None:
        key = bad[0] if bad is not None else missing
        raise CorruptCheckpointError(f"{cv.where}: " + (bad[1] if bad is not None else f"no valid '{missing}'")
                                     + " (the target cannot be run)", path=target.source, key=key,
                                     hint="fix the target's config.json to describe its weights")
    if nh % sizes["num_key_value_heads"]:
        raise CorruptCheckpointError(f"{cv.where}: num_attention_heads {nh} is not a multiple of "
                                     f"num_key_value_heads {sizes['num_key_value_heads']}", path=target.source,
                                     key="num_key_value_heads", hint="fix the target's config.json")
    return sizes


def _shape(name: str, s: dict[str, Any]) -> tuple[int, ...]:
    """The shape transformers' Llama gives the parameter `name` at sizes `s`."""
    H, I, V = s["hidden_size"], s["intermediate_size"], s["vocab_size"]
    q, kv = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    for suffix, shape in (("embed_tokens.weight", (V, H)), ("lm_head.weight", (V, H)), ("q_proj.weight", (q, H)),
                          ("k_proj.weight", (kv, H)), ("v_proj.weight", (kv, H)), ("o_proj.weight", (H, q)),
                          ("gate_proj.weight", (I, H)), ("up_proj.weight", (I, H)), ("down_proj.weight", (H, I))):
        if name.endswith(suffix):
            return shape
    return (H,)  # the norms


def load_native(target: TargetCheckpoint, dtype: torch.dtype) -> Llama | None:
    """The model when eaglectl runs this local target itself, else None."""
    config = target.config.data
    if why_not_native(config, dtype) is not None or target.ckpt.hub_ref is not None:
        return None
    sizes = _sizes(target)  # the config's sizes valid before any of them sizes a loop or a tensor
    names = {n: n for n in Llama.tensor_names(config)}
    if config.get("tie_word_embeddings"):
        if "lm_head.weight" in target.ckpt.tensor_file:
            return None  # tied, yet a head of its own on disk: which one wins is transformers' to say
        names["lm_head.weight"] = "model.embed_tokens.weight"
    if set(names.values()) != set(target.ckpt.tensor_file):
        return None  # another layout than transformers' Llama: transformers reads it
    for name, stored in names.items():  # transformers refuses a checkpoint whose weights disagree with its config
        shape = tuple(target.ckpt.tensors[stored].shape)
        want = _shape(name, sizes)
        if shape != want:
            raise CorruptCheckpointError(f"{target.config.where}: {stored} is {list(shape)}, but the config's sizes "
                                         f"make it {list(want)} ({', '.join(f'{k} {v}' for k, v in sizes.items())})",
                                         path=target.source, tensor=stored,
                                         hint="fix the target's config.json to describe its weights")
    weights = {n: owned(target.ckpt.read(stored), "float32") for n, stored in names.items()}
    return Llama(config, weights)
