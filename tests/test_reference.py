"""The reference drafter pins docs/math.md: hand-computed cases and the flag invariants (#flags)."""

from __future__ import annotations

import math

import pytest
import torch

from eaglectl.model.reference import (
    ChainCache,
    Drafter,
    DrafterArgs,
    RMSNorm,
    apply_rope,
    chain_step,
    prefill,
    rope_inv_freq,
)

ARGS = dict(hidden_size=16, target_hidden_size=12, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=24,
            num_layers=1, vocab_size=50, draft_vocab_size=20, num_aux=3, rms_norm_eps=1e-6, rope_theta=10000.0)


def make(seed: int = 0, **flags) -> Drafter:
    torch.manual_seed(seed)
    a = DrafterArgs(**{**ARGS, **flags})
    d = Drafter(a)
    with torch.no_grad():
        for name, p in d.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if name.endswith("weight") and p.dim() == 2 else 0.2) + (1.0 if p.dim() == 1 else 0.0))
        ids = torch.randperm(a.vocab_size)[: a.draft_vocab_size].sort().values
        d.d2t.copy_(ids - torch.arange(a.draft_vocab_size))
    return d.double().eval()


def inputs(T: int = 7, steps: int = 3, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(1, T, 36, generator=g, dtype=torch.float64) * torch.tensor([1.0] * 12 + [3.0] * 12 + [9.0] * 12, dtype=torch.float64)
    tokens = torch.randint(0, 50, (1, T + steps), generator=g)
    return aux, tokens


# ------------------------------------------------------------------------------ building blocks

def test_rmsnorm_hand_computed():
    n = RMSNorm(2, eps=0.0)
    with torch.no_grad():
        n.weight.copy_(torch.tensor([2.0, 1.0]))
    out = n(torch.tensor([3.0, 4.0]))
    rms = math.sqrt((9 + 16) / 2)
    torch.testing.assert_close(out, torch.tensor([2 * 3 / rms, 4 / rms]))


def test_rmsnorm_with_unit_weight_is_not_identity():
    assert not torch.allclose(RMSNorm(3, 1e-6)(torch.tensor([1.0, 2.0, 3.0])), torch.tensor([1.0, 2.0, 3.0]))


def test_rope_hand_computed():
    inv = rope_inv_freq(2, 10000.0, None)  # one frequency: theta^0 = 1
    x = torch.tensor([[[[1.0, 2.0]]]])  # (B, nh, T, d)
    p = 0.7
    out = apply_rope(x, torch.tensor([[p]]), inv)
    want = torch.tensor([1 * math.cos(p) - 2 * math.sin(p), 2 * math.cos(p) + 1 * math.sin(p)])
    torch.testing.assert_close(out.flatten(), want)
    torch.testing.assert_close(apply_rope(x, torch.tensor([[0]]), inv), x)


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "linear", "factor": 4.0},
])
def test_rope_scaling_matches_transformers(scaling):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(hidden_size=128, num_attention_heads=1, rope_theta=500000.0,
                      rope_scaling=dict(scaling), max_position_embeddings=131072)
    want, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg, "cpu")
    torch.testing.assert_close(rope_inv_freq(128, 500000.0, scaling).float(), want.float(), rtol=1e-6, atol=0)


# ------------------------------------------------------------------- forward vs docs/math.md

def naive_step0(d: Drafter, aux, tokens):
    """docs/math.md#step-0 written out per position, no batching, no cache, fp64."""
    a = d.a
    T = aux.shape[1]

    def rms(x, w):
        return w * x / torch.sqrt((x * x).mean() + a.rms_norm_eps)

    layer = d.layers[0]
    ks, vs, outs = [], [], []
    for t in range(T):
        g = d.fc.weight @ aux[0, t]
        e = d.embed_tokens.weight[tokens[0, t + 1]]
        x = torch.cat([rms(e, layer.input_layernorm.weight), rms(g, layer.hidden_norm.weight)])
        q = (layer.self_attn.q_proj.weight @ x).view(a.num_heads, a.head_dim)
        k = (layer.self_attn.k_proj.weight @ x).view(a.num_kv_heads, a.head_dim)
        v = (layer.self_attn.v_proj.weight @ x).view(a.num_kv_heads, a.head_dim)
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2, dtype=torch.float64) / a.head_dim))

        def rot(h, p=t):
            ang = p * inv
            c, s = torch.cos(torch.cat([ang, ang])), torch.sin(torch.cat([ang, ang]))
            half = a.head_dim // 2
            return h * c + torch.cat([-h[..., half:], h[..., :half]], -1) * s

        q, k = rot(q), rot(k)
        ks.append(k)
        vs.append(v)
        heads = []
        for h in range(a.num_heads):
            kvh = h // (a.num_heads // a.num_kv_heads)
            scores = torch.stack([q[h] @ kk[kvh] for kk in ks]) / math.sqrt(a.head_dim)
            w = torch.softmax(scores, 0)
            heads.append(sum(wi * vv[kvh] for wi, vv in zip(w, vs, strict=True)))
        s1 = g + layer.self_attn.o_proj.weight @ torch.cat(heads)
        y = rms(s1, layer.post_attention_layernorm.weight)
        mlp = layer.mlp.down_proj.weight @ (torch.nn.functional.silu(layer.mlp.gate_proj.weight @ y) * (layer.mlp.up_proj.weight @ y))
        s2 = s1 + mlp
        outs.append(d.lm_head.weight @ rms(s2, d.norm.weight))
    return torch.stack(outs)


def test_step0_matches_math_md_written_out():
    d = make()
    aux, tokens = inputs()
    got = d.run(aux, tokens, steps=1)[0].logits[0].double()
    torch.testing.assert_close(got, naive_step0(d, aux, tokens), rtol=1e-9, atol=1e-9)


def test_all_flags_off_is_plain_eagle3_bit_for_bit():
    """A 3.1-capable drafter with the flags off equals the same weights built as plain EAGLE-3."""
    plain = make(seed=3)
    off = make(seed=3, fc_norm=False, norm_output=False, norm_before_fc=False, norm_before_residual=False)
    aux, tokens = inputs()
    for a, b in zip(plain.run(aux, tokens, 3), off.run(aux, tokens, 3), strict=True):
        assert torch.equal(a.logits, b.logits) and torch.equal(a.feedback, b.feedback)


def test_norm_output_leaves_step0_and_changes_later_steps():
    pre, post = make(seed=4), make(seed=4, norm_output=True)
    aux, tokens = inputs()
    a, b = pre.run(aux, tokens, 3), post.run(aux, tokens, 3)
    assert torch.equal(a[0].logits, b[0].logits)
    assert not torch.allclose(a[1].logits, b[1].logits)
    torch.testing.assert_close(b[0].feedback, post.norm(a[0].feedback))


def test_fc_norm_with_constant_weights_equals_fc_on_normalised_scaled_inputs():
    c = torch.tensor([0.5, 2.0, 7.0], dtype=torch.float64)
    with_norm = make(seed=5, fc_norm=True)
    plain = make(seed=5)
    with torch.no_grad():
        for j, norm in enumerate(with_norm.fc_norm):
            norm.weight.fill_(c[j])
        plain.load_state_dict({k: v for k, v in with_norm.state_dict().items() if not k.startswith("fc_norm")},
                              strict=False)
    aux, tokens = inputs()
    chunks = aux.split(12, -1)
    eps = with_norm.a.rms_norm_eps
    scaled = torch.cat([c[j] * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) for j, x in enumerate(chunks)], -1)
    a, b = with_norm.run(aux, tokens, 2), plain.run(scaled, tokens, 2)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.logits, y.logits, rtol=1e-12, atol=1e-12)


def test_norm_before_fc_equals_fc_norm_when_chunks_share_their_rms():
    a_nbfc, a_fcn = make(seed=6, norm_before_fc=True), make(seed=6, fc_norm=True)
    gam = torch.rand(36, dtype=torch.float64) + 0.5
    with torch.no_grad():
        a_nbfc.input_norm.weight.copy_(gam)
        for j, n in enumerate(a_fcn.fc_norm):
            n.weight.copy_(gam[12 * j: 12 * (j + 1)])
        a_fcn.load_state_dict({k: v for k, v in a_nbfc.state_dict().items() if not k.startswith("input_norm")},
                              strict=False)
    aux, tokens = inputs()
    chunks = aux.split(12, -1)
    same = torch.cat([x / torch.sqrt((x * x).mean(-1, keepdim=True)) for x in chunks], -1)  # every chunk RMS 1
    torch.testing.assert_close(a_nbfc.run(same, tokens, 1)[0].logits, a_fcn.run(same, tokens, 1)[0].logits,
                               rtol=1e-9, atol=1e-9)
    assert not torch.allclose(a_nbfc.run(aux, tokens, 1)[0].logits, a_fcn.run(aux, tokens, 1)[0].logits)


def test_both_norms_apply_both_like_vllm():
    both = make(seed=7, norm_before_fc=True, fc_norm=True)
    aux, _ = inputs()
    x = both.input_norm(aux)
    x = torch.cat([n(c) for n, c in zip(both.fc_norm, x.split(12, -1), strict=True)], -1)
    torch.testing.assert_close(both.combine(aux), both.fc(x))


def test_norm_before_residual_changes_the_residual_only():
    """Step 0 by hand from the same weights: one attention output; the residual added to it is fc(aux) itself, or
    hidden_norm(fc(aux)) with the flag. Everything else is shared."""
    raw, normed = make(seed=8), make(seed=8, norm_before_residual=True)
    aux, tokens = inputs()
    layer, T = raw.layers[0], aux.shape[1]
    x = raw.combine(aux)
    h = layer.hidden_norm(x)
    attn_in = torch.cat([layer.input_layernorm(raw.embed_tokens(tokens[:, 1: 1 + T])), h], -1)
    q, k, v = layer.self_attn.project(attn_in, torch.arange(T)[None], raw.inv_freq)
    attended = layer.self_attn.attend(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())
    for model, residual in ((raw, x), (normed, h)):
        s1 = residual + attended
        out = s1 + layer.mlp(layer.post_attention_layernorm(s1))
        torch.testing.assert_close(model.run(aux, tokens, 1)[0].logits, model.lm_head(model.norm(out)),
                                   rtol=1e-10, atol=1e-10)
    assert not torch.allclose(raw.run(aux, tokens, 1)[0].logits, normed.run(aux, tokens, 1)[0].logits)


def test_d2t_scatters_to_the_right_target_ids():
    d = make(seed=9)
    aux, tokens = inputs()
    out = d.run(aux, tokens, 1)[0]
    full = d.full_vocab_logits(out.logits)
    ids = torch.arange(20) + d.d2t
    assert torch.equal(full[..., ids], out.logits)
    mask = torch.ones(50, dtype=torch.bool)
    mask[ids] = False
    assert torch.isinf(full[..., mask]).all()
    assert torch.equal(full.argmax(-1), out.target_ids)


@pytest.mark.parametrize("flags", [{}, {"fc_norm": True, "norm_output": True}, {"num_layers": 2},
                                   {"windows": (2,)}, {"num_layers": 2, "windows": (3, None), "norm_output": True}])
def test_all_anchor_run_equals_incremental_chain_drafting(flags):
    """Teacher-forced all-anchors drafting is exactly vLLM's chain drafting from each anchor."""
    d = make(seed=10, **flags)
    aux, tokens = inputs(T=6, steps=3)
    batch = d.run(aux, tokens, 3)
    for t in (0, 3, 5):
        cache = ChainCache()
        out = prefill(d, aux[:, : t + 1], tokens[:, 1: t + 2], torch.arange(t + 1)[None], cache)
        steps = [out.logits[:, -1]]
        fb = out.feedback[:, -1:]
        for j in range(1, 3):
            out = chain_step(d, fb, tokens[:, t + j + 1: t + j + 2], torch.tensor([[t + j]]), cache)
            steps.append(out.logits[:, -1])
            fb = out.feedback
        for j in range(3):
            torch.testing.assert_close(steps[j], batch[j].logits[:, t], rtol=1e-10, atol=1e-10)


def test_qwen3_qk_norm_is_applied():
    """q and k are RMS-normed per head (over head_dim) before RoPE: by hand, and doubling q_norm's weight doubles q
    (RoPE is linear) and leaves k as it was."""
    d = make(seed=11, qk_norm=True)
    attn = d.layers[0].self_attn
    x = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)  # layer 0: 2H wide
    pos = torch.arange(5)[None]

    def per_head(proj, norm, heads):
        y = proj(x).view(1, 5, heads, 8)
        y = y / torch.sqrt((y * y).mean(-1, keepdim=True) + 1e-6) * norm.weight
        return apply_rope(y.transpose(1, 2), pos, d.inv_freq)

    q, k, _ = attn.project(x, pos, d.inv_freq)
    torch.testing.assert_close(q, per_head(attn.q_proj, attn.q_norm, 4), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(k, per_head(attn.k_proj, attn.k_norm, 2), rtol=1e-10, atol=1e-10)
    aux, tokens = inputs()
    before = d.run(aux, tokens, 1)[0].logits
    with torch.no_grad():
        attn.q_norm.weight.mul_(2.0)
    q2, k2, _ = attn.project(x, pos, d.inv_freq)
    torch.testing.assert_close(q2, 2 * q, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(k2, k, rtol=0, atol=0)
    assert not torch.allclose(before, d.run(aux, tokens, 1)[0].logits)


# ------------------------------------------------------------------------------ sliding-window layers

def test_a_window_wider_than_the_context_is_full_attention():
    aux, tokens = inputs(T=6, steps=3)
    full, wide = make(seed=12).run(aux, tokens, 3), make(seed=12, windows=(64,)).run(aux, tokens, 3)
    for a, b in zip(full, wide, strict=True):
        assert torch.equal(a.logits, b.logits)


def test_a_window_hides_exactly_the_keys_older_than_it():
    """Window w: a query at position p sees keys at p - w + 1 .. p (vLLM's per-layer window, HF's
    sliding_attention). Changing the target state at p - w leaves step 0 at p as it was and changes it at
    p - 1; at chain step j >= w the whole context is out of sight."""
    w, T = 2, 7
    d = make(seed=13, windows=(w,))
    aux, tokens = inputs(T=T, steps=3)
    base = d.run(aux, tokens, 3)
    p = 5
    moved = aux.clone()
    moved[:, p - w] += 5.0
    after = d.run(moved, tokens, 3)
    assert torch.equal(after[0].logits[:, p], base[0].logits[:, p])
    assert not torch.allclose(after[0].logits[:, p - 1], base[0].logits[:, p - 1])
    # the softmax rows themselves: a step-j query of anchor t (position t + j) weighs only keys at positions
    # t + j - w + 1 .. t + j, context and chain alike
    attn = d.layers[0].self_attn
    attn.kept_probs = []
    d.run(aux, tokens, 3)
    for j, probs in enumerate(attn.kept_probs):  # (B, heads, T, T + T*j)
        positions = torch.cat([torch.arange(T)] + [torch.arange(T) + step for step in range(1, j + 1)])
        for t in range(T):
            seen = positions[(probs[0, :, t] > 0).any(0)]
            chain = torch.arange(1, j + 1) + t  # own chain's keys (other anchors' chains are masked anyway)
            expect = sorted(q for q in [*range(t + 1), *chain.tolist()] if t + j - q < w)
            assert sorted(seen.tolist()) == expect, (j, t)
