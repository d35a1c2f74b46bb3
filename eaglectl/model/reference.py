"""The reference EAGLE-3 / EAGLE-3.1 drafter: the executable form of docs/math.md, torch only.

Mirrors vLLM 0.32 `vllm/model_executor/models/llama_eagle3.py` (and `qwen3_eagle3.py`), SafeAILab
`eagle/model/cnets.py` and speculators `models/eagle3/model_definitions.py`:

- aux combine (step 0 only): `input_norm` over the concatenation if `norm_before_fc`, then one
  RMSNorm per aux chunk if `fc_norm` (both when both flags are set, as vLLM does), then `fc`;
- layer 0: token embedding → `input_layernorm`, hidden → `hidden_norm`, attention over
  `[emb ; hidden]` (embedding first) at the hidden state's position; the residual is the raw hidden
  (or the normed one with `norm_before_residual`); layers ≥ 1 are plain pre-norm layers;
- final `norm` → `lm_head` over the draft vocab; draft id i means target id `i + d2t[i]`;
- the state fed to the next step is the pre-norm sum (EAGLE-3) or the post-norm state
  (`norm_output`, EAGLE-3.1);
- norms in fp32 (HF form `w * (x32 * rsqrt(mean(x32²) + eps)).to(dtype)`), softmax in fp32;
- attention: Llama/Qwen3 GQA here, or MLA (`Eagle3DeepseekV2ForCausalLM`, model/mla.py) when the
  args carry MLA dims; everything around the attention is the same (vLLM's `deepseek_eagle3.py`
  differs from `llama_eagle3.py` only there and in having no `input_norm`: docs/math.md#mla).

Attention keys: a step-j query of anchor t sees the step-0 (context) keys at positions ≤ t and its
own chain's keys of steps 1..j — vLLM's drafter KV cache for a chain drafted from t, and the
training-time-test mask. A sliding-window layer (`layer_types: sliding_attention`, as vLLM applies it
per layer) further hides keys more than `sliding_window - 1` positions before the query. `Drafter.run`
evaluates every anchor at once with that mask; `ChainCache` drafts one chain incrementally. Canonical
tensor names are the module attribute names, so loading is `load_state_dict(strict=True)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import IncompatibleDrafterError
from .blocks import DrafterArgs, RMSNorm, wide
from .mla import MLAAttention

ROPE_KINDS = ("default", "linear", "llama3")  # rope_scaling types implemented below (GQA; MLA: model/mla.py)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies (fp64), with HF `default`, `linear` and `llama3` scaling."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "linear":
        inv = inv / float(scaling["factor"])  # type: ignore[index]
    elif kind == "llama3":
        assert scaling is not None
        factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        mid = (wavelen <= old / low) & (wavelen >= old / high)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    elif kind not in ("default", None):
        raise ValueError(f"rope_scaling type '{kind}' is not one of {ROPE_KINDS}")
    return inv


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """NeoX rotate-half RoPE in fp32 (fp64 for fp64 x). x: (B, nh, T, d), positions: (B, T)."""
    x32 = wide(x)
    inv = inv_freq.to(device=x.device, dtype=x32.dtype)
    angles = positions.to(x32.dtype)[:, None, :, None] * inv[None, None, None, :]  # (B, 1, T, d/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = x32.shape[-1] // 2
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], -1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, a: DrafterArgs, in_features: int) -> None:
        super().__init__()
        self.a = a
        self.q_proj = nn.Linear(in_features, a.num_heads * a.head_dim, bias=a.attention_bias)
        self.k_proj = nn.Linear(in_features, a.num_kv_heads * a.head_dim, bias=a.attention_bias)
        self.v_proj = nn.Linear(in_features, a.num_kv_heads * a.head_dim, bias=a.attention_bias)
        self.o_proj = nn.Linear(a.num_heads * a.head_dim, a.hidden_size, bias=False)
        self.kept_probs: list[torch.Tensor] | None = None  # `eaglectl drift` sets a list: softmax rows land there
        if a.qk_norm:
            self.q_norm = RMSNorm(a.head_dim, a.rms_norm_eps)
            self.k_norm = RMSNorm(a.head_dim, a.rms_norm_eps)

    def project(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, nh, T, d) and k, v (B, nkv, T, d), RoPE applied."""
        B, T, _ = x.shape
        a = self.a
        q = self.q_proj(x).view(B, T, a.num_heads, a.head_dim)
        k = self.k_proj(x).view(B, T, a.num_kv_heads, a.head_dim)
        v = self.v_proj(x).view(B, T, a.num_kv_heads, a.head_dim)
        if a.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q (B, nh, Tq, d); k, v (B, nkv, Tk, d); mask (Tq, Tk) or (B, 1, Tq, Tk) True = visible. Returns
        (B, Tq, H)."""
        a = self.a
        group = a.num_heads // a.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = (wide(q) @ wide(k).transpose(-1, -2)) / math.sqrt(a.head_dim)  # (B, nh, Tq, Tk)
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if self.kept_probs is not None:
            self.kept_probs.append(probs)
        probs = probs.to(v.dtype)
        out = (probs @ v).transpose(1, 2).reshape(q.shape[0], q.shape[2], a.num_heads * a.head_dim)
        return self.o_proj(out)


class FeedForward(nn.Module):
    def __init__(self, a: DrafterArgs) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class LayerKV:
    """One layer's drafter KV for a sequence: (B, nkv, P, d) keys and values and their (B, P) positions (a
    sliding-window layer masks by them), appended step by step."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    positions: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], 2)
        self.v = v if self.v is None else torch.cat([self.v, v], 2)
        positions = positions.expand(k.shape[0], -1)
        self.positions = positions if self.positions is None else torch.cat([self.positions, positions], 1)
        return self.k, self.v

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def truncate(self, length: int) -> None:
        if self.k is not None and self.v is not None and self.positions is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]
            self.positions = self.positions[:, :length]


def window_mask(mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, window: int
                ) -> torch.Tensor:
    """`mask` (Tq, Tk) narrowed to keys within `window` positions of each query: a query at position p sees
    keys at p - window + 1 .. p, as vLLM's per-layer sliding window (FlashAttention's window (w - 1, 0)) and
    HF's `sliding_attention` do. Returns (B, 1, Tq, Tk), broadcast over heads."""
    near = (query_positions[:, :, None] - key_positions[:, None, :]) < window  # (B, Tq, Tk)
    return (mask & near)[:, None]


class Layer(nn.Module):
    """Decoder layer i. Layer 0 takes [norm(embeds) ; hidden_norm(hidden)] (2H wide). A sliding-window layer
    (`a.windows[i]`) sees only the keys of the last `window` positions."""

    def __init__(self, a: DrafterArgs, index: int) -> None:
        super().__init__()
        self.a, self.index = a, index
        self.window = a.windows[index] if index < len(a.windows) else None
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        if index == 0:
            self.hidden_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        kind = Attention if a.mla is None else MLAAttention  # GQA, or MLA when the args carry MLA dims
        self.self_attn = kind(a, 2 * a.hidden_size if index == 0 else a.hidden_size)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = FeedForward(a)

    def forward(self, x: torch.Tensor, embeds: torch.Tensor | None, positions: torch.Tensor,
                inv_freq: torch.Tensor | None, kv: LayerKV, mask: torch.Tensor) -> torch.Tensor:
        """x (B, T, H) at `positions` (B, T); the new keys join `kv`; mask (T, P) over all of them."""
        if self.index == 0:
            assert embeds is not None
            normed = self.hidden_norm(x)
            attn_in = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # (B, T, 2H), embedding first
            residual = normed if self.a.norm_before_residual else x
        else:
            attn_in, residual = self.input_layernorm(x), x
        q, k, v = self.self_attn.project(attn_in, positions, inv_freq)
        keys, values = kv.append(k, v, positions)
        if self.window is not None:
            assert kv.positions is not None
            mask = window_mask(mask, positions, kv.positions, self.window)
        s1 = residual + self.self_attn.attend(q, keys, values, mask)
        return s1 + self.mlp(self.post_attention_layernorm(s1))  # pre-norm layer output


# ---------------------------------------------------------------------------------------------- drafter

@dataclass
class StepOutput:
    logits: torch.Tensor  # (B, T, V_d) draft-vocab logits, fp32
    feedback: torch.Tensor  # (B, T, H) the state fed to the next step
    target_ids: torch.Tensor  # (B, T) greedy draft mapped to target ids
    pre_norm: torch.Tensor  # (B, T, H) the last layer's output before the final norm


class Drafter(nn.Module):
    """`own_embedding=False` for drafters that ship no `embed_tokens`: pass the target's table (or
    any table covering the token ids used) as `embed` to `run` / `prefill` / `chain_step`."""

    def __init__(self, a: DrafterArgs, own_embedding: bool = True) -> None:
        super().__init__()
        self.a = a
        width = a.num_aux * a.target_hidden_size
        if a.norm_before_fc:
            self.input_norm = RMSNorm(width, a.rms_norm_eps)
        if a.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(a.target_hidden_size, a.rms_norm_eps) for _ in range(a.num_aux))
        self.fc = nn.Linear(width, a.hidden_size, bias=False)
        self.layers = nn.ModuleList(Layer(a, i) for i in range(a.num_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.lm_head = nn.Linear(a.hidden_size, a.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(a.draft_vocab_size, dtype=torch.long), persistent=True)
        # a plain attribute, not a buffer: Module.to(dtype) must not round it to bf16; MLA layers keep their own
        self.inv_freq = rope_inv_freq(a.head_dim, a.rope_theta, a.rope_scaling) if a.mla is None else None
        if own_embedding:
            self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)

    def table(self, embed: torch.Tensor | None) -> torch.Tensor:
        if embed is not None:
            return embed.to(device=self.fc.weight.device, dtype=self.fc.weight.dtype)
        if not hasattr(self, "embed_tokens"):
            raise ValueError("this drafter has no embed_tokens: pass the target's embedding table")
        return self.embed_tokens.weight

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """(B, T, n_aux·H_t) target features → (B, T, H); step 0 only."""
        if aux.shape[-1] != self.fc.weight.shape[1]:  # another target's states (its hidden size differs)
            raise IncompatibleDrafterError(
                f"the target's aux states are {aux.shape[-1]} wide, the drafter's fc takes {self.fc.weight.shape[1]} "
                f"({self.a.num_aux} x target_hidden_size {self.a.target_hidden_size})",
                hint="use the target this drafter was trained for (inspect with --target compares their configs)")
        x = aux.to(self.fc.weight.dtype)
        if self.a.norm_before_fc:
            x = self.input_norm(x)
        if self.a.fc_norm:
            chunks = x.split(self.a.target_hidden_size, dim=-1)  # chunk j = j-th smallest aux id
            x = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(x)

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, kvs: list[LayerKV],
                mask: torch.Tensor) -> StepOutput:
        """One draft step for T query rows: every layer, then the final norm and the head."""
        x: torch.Tensor = hidden
        emb: torch.Tensor | None = embeds
        for layer, kv in zip(self.layers, kvs, strict=True):
            x = layer(x, emb, positions, self.inv_freq, kv, mask)
            emb = None
        post = self.norm(x)
        logits = wide(self.lm_head(post))
        draft = logits.argmax(-1)
        return StepOutput(logits, post if self.a.norm_output else x, draft + self.d2t[draft], x)

    def full_vocab_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits scattered to target ids, −inf elsewhere (vLLM `compute_logits`)."""
        out = logits.new_full((*logits.shape[:-1], self.a.vocab_size), float("-inf"))
        ids = torch.arange(self.a.draft_vocab_size, device=logits.device) + self.d2t
        return out.index_copy(-1, ids, logits)

    # -- all anchors at once (parity, training-time-test layout) -----------------------------

    def run(self, aux: torch.Tensor, tokens: torch.Tensor, steps: int,
            embed: torch.Tensor | None = None, anchors: slice | None = None) -> list[StepOutput]:
        """Draft `steps` tokens from every anchor t = 0..T-1, teacher-forced.

        aux: (B, T, n_aux·H_t) target features of positions 0..T-1; tokens: (B, T + steps) token ids,
        the step-j input of anchor t is tokens[t + j + 1] at position t + j. `embed` overrides the
        embedding table (the target's, for drafters that ship none). `anchors` (a slice of 0..T-1)
        drafts the chains of those anchors only: step 0 still runs at every position (its keys are
        every chain's context), steps >= 1 only for the window, and their outputs cover the window.
        """
        B, T = aux.shape[:2]
        lo, hi, _ = (anchors or slice(0, T)).indices(T)
        W = hi - lo
        table = self.table(embed)
        pos0 = torch.arange(T, device=aux.device).expand(B, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=aux.device).tril()
        diag = torch.eye(W, dtype=torch.bool, device=aux.device)
        kvs = [LayerKV() for _ in self.layers]
        hidden = self.combine(aux)
        outs = []
        for j in range(steps):
            if j == 0:
                out = self(hidden, F.embedding(tokens[:, 1: 1 + T], table), pos0, kvs, causal)
                outs.append(out if W == T else StepOutput(out.logits[:, lo:hi], out.feedback[:, lo:hi],
                                                          out.target_ids[:, lo:hi], out.pre_norm[:, lo:hi]))
                hidden = out.feedback[:, lo:hi]
                continue
            embeds = F.embedding(tokens[:, lo + j + 1: hi + j + 1], table)
            mask = torch.cat([causal[lo:hi]] + [diag] * j, dim=1)  # (W, T + W·j): context ≤ t, own chain
            out = self(hidden, embeds, pos0[:, lo:hi] + j, kvs, mask)
            outs.append(out)
            hidden = out.feedback
        return outs


@dataclass
class ChainCache:
    """Drafter KV for one sequence: context entries (target-derived) plus the current chain's."""

    layers: list[LayerKV] = field(default_factory=list)

    def for_model(self, drafter: Drafter) -> list[LayerKV]:
        while len(self.layers) < len(drafter.layers):
            self.layers.append(LayerKV())
        return self.layers

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions (drops the previous chain before new context entries)."""
        for kv in self.layers:
            kv.truncate(length)

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0


def prefill(drafter: Drafter, aux: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor,
            cache: ChainCache, embed: torch.Tensor | None = None) -> StepOutput:
    """Write context entries (features of positions p paired with token p+1) and return step-0 output."""
    return _incremental(drafter, drafter.combine(aux), F.embedding(next_tokens, drafter.table(embed)), positions, cache)


def chain_step(drafter: Drafter, feedback: torch.Tensor, token: torch.Tensor, position: torch.Tensor,
               cache: ChainCache, embed: torch.Tensor | None = None) -> StepOutput:
    """One chain step: previous feedback (B, 1, H) and previous draft's target id (B, 1)."""
    return _incremental(drafter, feedback, F.embedding(token, drafter.table(embed)), position, cache)


def _incremental(drafter: Drafter, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
                 cache: ChainCache) -> StepOutput:
    T = hidden.shape[1]
    P = cache.length + T
    mask = torch.ones(T, P, dtype=torch.bool, device=hidden.device).tril(P - T)  # causal within the new block
    return drafter(hidden, embeds, positions, cache.for_model(drafter), mask)
