"""The MLA attention of the reference drafter (eaglectl/model/mla.py, docs/math.md#mla) against an
independent implementation, transformers' `DeepseekV3Attention`, on the same projections, and against
vLLM 0.32's YaRN formulas (copied literally below)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

from eaglectl.model.mla import (
    MLAAttention,
    MLADims,
    apply_interleaved_rope,
    deepseek_yarn_inv_freq,
    mla_rope,
    yarn_get_mscale,
)
from eaglectl.model.reference import DrafterArgs

H, NH, KV_LORA, ROPE, NOPE, V = 64, 4, 32, 16, 16, 16
Q_LORA = 24
YARN = {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
        "original_max_position_embeddings": 64}
# mscale != mscale_all_dim: cos/sin carry a ratio ≠ 1 and the softmax m² uses mscale_all_dim
YARN_RATIO = dict(YARN, mscale=1.0, mscale_all_dim=0.707)
THETA = 10000.0


def mla_args(q_lora, rope, eps=1e-6, *, hidden=H, heads=NH, kv_lora=KV_LORA, nope=NOPE, rope_dim=ROPE, v=V,
             theta=THETA):
    return DrafterArgs(hidden_size=hidden, target_hidden_size=hidden, num_heads=heads, num_kv_heads=heads,
                       head_dim=nope + rope_dim, intermediate_size=8, num_layers=1, vocab_size=8, draft_vocab_size=8,
                       num_aux=3, rms_norm_eps=eps, rope_theta=theta, rope_scaling=dict(rope) if rope else None,
                       mla=MLADims(q_lora, kv_lora, nope, rope_dim, v))


def _wide_norm_forward(norm):
    """DeepseekV3RMSNorm's formula, but fp64 stays fp64 (transformers always upcasts to fp32 only, which
    caps an fp64 comparison at ~1e-7; reference.py / mla.py keep fp64). Same result for fp32/bf16."""
    def forward(x):
        x32 = x if x.dtype == torch.float64 else x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return norm.weight * x32.to(x.dtype)
    return forward


def make_pair(q_lora: int | None, rope: dict | None, eps: float = 1e-6, in_features: int = H, seed: int = 0):
    """(ours, transformers DeepseekV3Attention, rotary embedding) with identical weights."""
    torch.manual_seed(seed)
    cfg = DeepseekV3Config(hidden_size=H, num_attention_heads=NH, num_key_value_heads=NH, q_lora_rank=q_lora,
                           kv_lora_rank=KV_LORA, qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE, v_head_dim=V,
                           rms_norm_eps=eps, max_position_embeddings=256, rope_theta=THETA,
                           rope_scaling=dict(rope) if rope else None)
    cfg._attn_implementation = "sdpa"  # eager does its softmax in fp32 even for fp64 inputs
    theirs = hf.DeepseekV3Attention(cfg, layer_idx=0).double()
    if in_features != H:  # EAGLE-3 layer 0: the a-projections read [embeds ; hidden]
        for name in ("q_a_proj", "q_proj", "kv_a_proj_with_mqa"):
            old = getattr(theirs, name)
            if old is not None:
                setattr(theirs, name, nn.Linear(in_features, old.out_features, bias=False, dtype=torch.float64))
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
        for name in ("q_a_layernorm", "kv_a_layernorm"):
            norm = getattr(theirs, name)
            if norm is not None:
                norm.weight.copy_(1 + 0.1 * torch.randn_like(norm.weight))
                norm.variance_epsilon = eps  # transformers ignores rms_norm_eps here (always 1e-6), vLLM reads it
    for name in ("q_a_layernorm", "kv_a_layernorm"):
        norm = getattr(theirs, name)
        if norm is not None:
            norm.forward = _wide_norm_forward(norm)
    ours = MLAAttention(mla_args(q_lora, rope, eps), in_features).double()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours, theirs, hf.DeepseekV3RotaryEmbedding(cfg)


def run_hf(theirs, rotary, x, positions, mask, inv_freq=None):
    """transformers' attention. With `inv_freq` (fp64) the cos/sin are built in fp64 from it, times
    transformers' own `attention_scaling` (its rotary module keeps an fp32 inv_freq and fp32 angles, so
    it cannot agree beyond fp32 angle rounding, ~pos·2^-24 rad); without, transformers' own rotary."""
    if inv_freq is None:
        cos, sin = rotary(x, positions)
    else:
        freqs = positions.to(torch.float64)[..., None] * inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = (emb.cos() * rotary.attention_scaling).to(x.dtype)
        sin = (emb.sin() * rotary.attention_scaling).to(x.dtype)
    additive = torch.zeros(mask.shape, dtype=x.dtype).masked_fill(~mask, float("-inf"))[None, None]
    out, _ = theirs(x, (cos, sin), additive)
    return out


CASES = [(q, r) for q in (Q_LORA, None) for r in (None, YARN, YARN_RATIO)]


@pytest.mark.parametrize("in_features", [H, 2 * H])
@pytest.mark.parametrize(("q_lora", "rope"), CASES, ids=[f"q{q}-{(r or {}).get('mscale_all_dim', 'default')}"
                                                          for q, r in CASES])
def test_matches_transformers(q_lora, rope, in_features):
    ours, theirs, rotary = make_pair(q_lora, rope, in_features=in_features)
    B, T = 2, 7
    x = torch.randn(B, T, in_features, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [100, 101, 102, 150, 151, 152, 200]])
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    # fp64, same inv_freq on both sides: everything else (projections, norms, rope pairing, mscale,
    # softmax scale, head layout) must agree to fp64 rounding
    want = run_hf(theirs, rotary, x, positions, mask, inv_freq=ours.inv_freq)
    got = ours(x, positions, mask)
    assert got.shape == (B, T, H)
    assert (got - want).abs().max() <= 1e-12 * want.abs().max()
    # fp32 copies, each with its own inv_freq / rotary: agree to fp32 rounding
    got32 = ours.float()(x.float(), positions, mask)
    want32 = run_hf(theirs.float(), rotary, x.float(), positions, mask)
    assert (got32.double() - want).abs().max() <= 1e-5 * want.abs().max()
    assert (want32.double() - want).abs().max() <= 1e-5 * want.abs().max()
    assert (got32 - want32).abs().max() <= 1e-5 * want32.abs().max()
    # the scale and the cos/sin factor are the same numbers in both
    assert ours.scale == pytest.approx(theirs.scaling, rel=1e-15)
    assert ours.rope_mscale == pytest.approx(rotary.attention_scaling, rel=1e-15)


def test_rms_norm_eps_is_read_by_vllm_not_transformers():
    """vLLM: RMSNorm(q_lora_rank / kv_lora_rank, eps=config.rms_norm_eps) (deepseek_v2.py:1082,1098);
    transformers: DeepseekV3RMSNorm(q_lora_rank) → eps 1e-6 always. make_pair patches transformers' eps."""
    cfg = DeepseekV3Config(hidden_size=H, num_attention_heads=NH, q_lora_rank=Q_LORA, kv_lora_rank=KV_LORA,
                           qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE, v_head_dim=V, rms_norm_eps=1e-5)
    theirs = hf.DeepseekV3Attention(cfg, 0)
    assert theirs.q_a_layernorm.variance_epsilon == 1e-6 and theirs.kv_a_layernorm.variance_epsilon == 1e-6
    # with the eps patched the outputs agree at eps 1e-2 too (the eps really is used)
    ours, theirs, rotary = make_pair(Q_LORA, YARN, eps=1e-2)
    x = torch.randn(1, 5, H, dtype=torch.float64) * 0.05
    pos = torch.arange(5)[None]
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    want = run_hf(theirs, rotary, x, pos, mask, ours.inv_freq)
    assert (ours(x, pos, mask) - want).abs().max() <= 1e-12 * want.abs().max()
    theirs.kv_a_layernorm.variance_epsilon = 1e-6
    assert (run_hf(theirs, rotary, x, pos, mask, ours.inv_freq) - want).abs().max() > 1e-6 * want.abs().max()


def test_interleaved_rope_vs_transformers_layout():
    """transformers' apply_rotary_pos_emb_interleave rotates the same pairs but returns them
    de-interleaved (evens then odds); vLLM's rotate_gptj keeps the interleaved layout. q·k is
    invariant to that shared permutation, so attention agrees; q/k tensors differ by it."""
    torch.manual_seed(1)
    inv = deepseek_yarn_inv_freq(ROPE, THETA, 4.0, 64)
    ratio = yarn_get_mscale(4.0, 1.0) / yarn_get_mscale(4.0, 0.707)
    pos = torch.tensor([[0, 3, 77, 255]])
    q = torch.randn(1, NH, 4, ROPE, dtype=torch.float64)
    k = torch.randn(1, 1, 4, ROPE, dtype=torch.float64)
    freqs = pos[..., None].double() * inv
    emb = torch.cat([freqs, freqs], -1)
    q_hf, k_hf = hf.apply_rotary_pos_emb_interleave(q, k, emb.cos() * ratio, emb.sin() * ratio)
    deinterleave = torch.cat([torch.arange(0, ROPE, 2), torch.arange(1, ROPE, 2)])
    q_ours = apply_interleaved_rope(q, pos, inv, ratio)
    k_ours = apply_interleaved_rope(k, pos, inv, ratio)
    torch.testing.assert_close(q_ours[..., deinterleave], q_hf, rtol=0, atol=1e-13)
    torch.testing.assert_close(k_ours[..., deinterleave], k_hf, rtol=0, atol=1e-13)
    assert not torch.allclose(q_ours, q_hf)  # the layouts really differ


def test_neox_checkpoint_needs_permuted_rope_rows():
    """transformers with rope_interleave=False (rotate_half) computes the same attention only if the
    rope rows of q_b_proj (per head) and kv_a_proj_with_mqa are de-interleaved: vLLM always uses
    interleaved pairs, so a checkpoint permuted for NeoX rope is a different model in vLLM."""
    ours, theirs, rotary = make_pair(Q_LORA, YARN)
    theirs.config.rope_interleave = False
    deint = torch.cat([torch.arange(0, ROPE, 2), torch.arange(1, ROPE, 2)])
    with torch.no_grad():
        w = theirs.q_b_proj.weight.view(NH, NOPE + ROPE, -1)
        w[:, NOPE:] = w[:, NOPE:][:, deint].clone()
        w = theirs.kv_a_proj_with_mqa.weight
        w[KV_LORA:] = w[KV_LORA:][deint].clone()
    x = torch.randn(2, 6, H, dtype=torch.float64)
    pos = torch.arange(6).expand(2, 6) + 9
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    want = run_hf(theirs, rotary, x, pos, mask, ours.inv_freq)
    assert (ours(x, pos, mask) - want).abs().max() <= 1e-12 * want.abs().max()


def test_non_causal_mask_and_chain_layout():
    """attend() with a drafter-style mask (context ≤ t plus own chain) equals per-row masked transformers."""
    ours, theirs, rotary = make_pair(None, YARN)
    T = 5
    x = torch.randn(1, T, H, dtype=torch.float64)
    pos = torch.arange(T)[None]
    mask = torch.tensor([[1, 0, 0, 1, 0], [1, 1, 0, 0, 1], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0], [0, 1, 0, 0, 1]],
                        dtype=torch.bool)
    want = run_hf(theirs, rotary, x, pos, mask, ours.inv_freq)
    assert (ours(x, pos, mask) - want).abs().max() <= 1e-12 * want.abs().max()


@pytest.mark.parametrize("q_lora", [Q_LORA, None])
def test_bf16_and_fp64(q_lora):
    ours, _, _ = make_pair(q_lora, YARN_RATIO)
    x = torch.randn(2, 6, H, dtype=torch.float64)
    pos = torch.arange(6).expand(2, 6) + 40
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    ref = ours(x, pos, mask)
    q, k, v = ours.project(x, pos, ours.inv_freq)
    assert q.shape == (2, NH, 6, NOPE + ROPE) and k.shape == (2, NH, 6, NOPE + ROPE) and v.shape == (2, NH, 6, V)
    assert torch.equal(k[:, 0, :, NOPE:], k[:, 3, :, NOPE:])  # k_pe is shared by every head
    bf = ours.to(torch.bfloat16)
    out = bf(x.to(torch.bfloat16), pos, mask)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert (out.double() - ref).abs().max() <= 0.05 * ref.abs().max()
    assert isinstance(bf.inv_freq, torch.Tensor) and bf.inv_freq.dtype == torch.float64  # not rounded by .to()


# ------------------------------------------------------------------------------ (b) softmax scale m²

def test_softmax_scale_factor_64_fp64():
    """deepseek_yarn with factor 64, mscale_all_dim 1 (DeepSeek-V3 / Kimi-K2 values):
    m = 0.1·1·ln 64 + 1, scale = 192^-0.5 · m² (deepseek_v2.py:1044, 1129-1136)."""
    m = 0.1 * math.log(64.0) + 1.0
    assert m == pytest.approx(1.4158883083359672, abs=1e-15)
    scale = 192 ** -0.5 * m * m
    assert scale == pytest.approx(0.1446796258, abs=1e-10)
    rope = {"rope_type": "yarn", "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32,
            "beta_slow": 1, "original_max_position_embeddings": 4096}
    attn = MLAAttention(mla_args(None, rope, hidden=8, heads=2, kv_lora=4, nope=128, rope_dim=64, v=3), 8).double()
    assert attn.rope_kind == "deepseek_yarn"
    assert attn.scale == scale
    assert attn.rope_mscale == 1.0  # mscale == mscale_all_dim: cos/sin unscaled
    # hand-written attention in fp64 with that scale
    torch.manual_seed(3)
    q = torch.randn(1, 2, 3, 192, dtype=torch.float64)
    k = torch.randn(1, 2, 4, 192, dtype=torch.float64)
    v = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    with torch.no_grad():
        attn.o_proj.weight.copy_(torch.eye(8, 6, dtype=torch.float64))
    got = attn.attend(q, k, v, mask)
    want = torch.zeros(1, 3, 6, dtype=torch.float64)
    for h in range(2):
        for i in range(3):
            logits = [sum(q[0, h, i, d].item() * k[0, h, j, d].item() for d in range(192)) * scale
                      for j in range(4)]
            vis = [j for j in range(4) if mask[i, j]]
            top = max(logits[j] for j in vis)
            w = {j: math.exp(logits[j] - top) for j in vis}
            z = sum(w.values())
            for c in range(3):
                want[0, i, h * 3 + c] = sum(w[j] / z * v[0, h, j, c].item() for j in vis)
    torch.testing.assert_close(got[..., :6], want, rtol=0, atol=1e-13)
    # and transformers agrees on the scale
    cfg = DeepseekV3Config(hidden_size=8, num_attention_heads=2, q_lora_rank=None, kv_lora_rank=4,
                           qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=3, rope_scaling=dict(rope))
    assert hf.DeepseekV3Attention(cfg, 0).scaling == pytest.approx(scale, rel=1e-15)


def test_rope_resolution_matches_vllm_rules():
    dims = MLADims(None, 4, 128, 64, 3)
    s0 = 192 ** -0.5
    r = mla_rope(dims, 10000.0, None)
    assert (r.kind, r.mscale_ratio, r.softmax_scale) == ("default", 1.0, s0)
    # mscale_all_dim absent: m = mscale(f, 0) = 1, cos/sin × mscale(f, 1)
    r = mla_rope(dims, 10000.0, {"rope_type": "yarn", "factor": 40.0,
                                               "original_max_position_embeddings": 4096})
    assert r.kind == "deepseek_yarn" and r.softmax_scale == s0
    assert r.mscale_ratio == pytest.approx(0.1 * math.log(40) + 1)
    # attention_factor == 1.0 → deepseek_llama_scaling: same rope, no m² on the softmax scale
    r = mla_rope(dims, 10000.0, {"rope_type": "yarn", "factor": 40.0, "attention_factor": 1.0,
                                               "mscale": 1.0, "mscale_all_dim": 1.0,
                                               "original_max_position_embeddings": 4096})
    assert (r.kind, r.mscale_ratio, r.softmax_scale) == ("deepseek_llama_scaling", 1.0, s0)
    # legacy "type" key and any non-default type count as yarn
    r = mla_rope(dims, 10000.0, {"type": "yarn", "factor": 40.0, "mscale_all_dim": 1.0,
                                               "original_max_position_embeddings": 4096})
    assert r.softmax_scale == pytest.approx(s0 * (0.1 * math.log(40) + 1) ** 2)


# --------------------------------------------------------------------------- (c) YaRN inv_freq = vLLM

# vLLM 0.32 layers/rotary_embedding/common.py:34-70, copied literally
def _vllm_yarn_find_correction_dim(num_rotations, dim, base=10000, max_position_embeddings=2048):
    return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def _vllm_yarn_find_correction_range(low_rot, high_rot, dim, base=10000, max_position_embeddings=2048,
                                     truncate=True):
    low = _vllm_yarn_find_correction_dim(low_rot, dim, base, max_position_embeddings)
    high = _vllm_yarn_find_correction_dim(high_rot, dim, base, max_position_embeddings)
    if truncate:
        low = math.floor(low)
        high = math.ceil(high)
    return max(low, 0), min(high, dim - 1)  # Clamp values just in case


def _vllm_yarn_linear_ramp_mask(low, high, dim, dtype):
    if low == high:
        high += 0.001  # Prevent singularity
    linear_func = (torch.arange(dim, dtype=dtype) - low) / (high - low)
    ramp_func = torch.clamp(linear_func, 0, 1)
    return ramp_func


# vLLM 0.32 deepseek_scaling_rope.py:73-113 (DeepseekScalingRotaryEmbedding), copied literally
def _vllm_compute_inv_freq(rotary_dim, base, scaling_factor, max_position_embeddings, beta_fast, beta_slow):
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (scaling_factor * pos_freqs)
    low, high = _vllm_yarn_find_correction_range(beta_fast, beta_slow, rotary_dim, base, max_position_embeddings)
    inv_freq_mask = 1 - _vllm_yarn_linear_ramp_mask(low, high, rotary_dim // 2, dtype=torch.float)
    inv_freq = inv_freq_interpolation * (1 - inv_freq_mask) + inv_freq_extrapolation * inv_freq_mask
    return inv_freq


def _vllm_cos_sin_cache(rotary_dim, base, scaling_factor, max_position_embeddings, beta_fast, beta_slow, mscale,
                        mscale_all_dim):
    ratio = float(yarn_get_mscale(scaling_factor, float(mscale)) / yarn_get_mscale(scaling_factor,
                                                                                    float(mscale_all_dim)))
    inv_freq = _vllm_compute_inv_freq(rotary_dim, base, scaling_factor, max_position_embeddings, beta_fast,
                                      beta_slow)
    t = torch.arange(max_position_embeddings * scaling_factor, dtype=torch.float32)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    return torch.cat((freqs.cos() * ratio, freqs.sin() * ratio), dim=-1)


YARN_GRID = [
    # rotary_dim, base, factor, original_max, beta_fast, beta_slow
    (16, 10000.0, 4.0, 64, 32, 1),
    (64, 10000.0, 40.0, 4096, 32, 1),  # DeepSeek-V3
    (64, 50000.0, 32.0, 4096, 32, 1),  # Kimi-K2
    (64, 10000.0, 64.0, 4096, 32, 1),
    (8, 10000.0, 2.0, 16, 32, 1),  # ramp clamped at both ends / low == high corner
]


@pytest.mark.parametrize("dim,base,factor,orig,bf,bs", YARN_GRID)
def test_yarn_inv_freq_equals_vllm(dim, base, factor, orig, bf, bs):
    want = _vllm_compute_inv_freq(dim, base, factor, orig, bf, bs)
    got = deepseek_yarn_inv_freq(dim, base, factor, orig, bf, bs)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got.float(), want, rtol=2e-7, atol=0)
    # transformers' yarn agrees (dim = head_dim = qk_rope_head_dim for DeepseekV3Config)
    cfg = DeepseekV3Config(hidden_size=64, num_attention_heads=4, qk_rope_head_dim=dim, rope_theta=base,
                           rope_scaling={"rope_type": "yarn", "factor": factor, "original_max_position_embeddings":
                                         orig, "beta_fast": bf, "beta_slow": bs})
    inv_hf, _ = hf.ROPE_INIT_FUNCTIONS["yarn"](cfg)
    torch.testing.assert_close(inv_hf, want, rtol=2e-7, atol=0)


def test_rope_cos_sin_equals_vllm_cache():
    """The rotated q_pe equals vLLM's forward_static (cache lookup, repeat_interleave, rotate_gptj) in fp32."""
    dim, base, factor, orig = 16, 10000.0, 4.0, 64
    cache = _vllm_cos_sin_cache(dim, base, factor, orig, 32, 1, 1.0, 0.707)
    torch.manual_seed(5)
    x = torch.randn(1, 3, 5, dim)
    pos = torch.tensor([[0, 1, 63, 64, 255]])
    cos, sin = cache[pos[0]].chunk(2, dim=-1)
    cos = cos.repeat_interleave(2, dim=-1)
    sin = sin.repeat_interleave(2, dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
    want = x * cos + rot * sin
    ratio = yarn_get_mscale(factor, 1.0) / yarn_get_mscale(factor, 0.707)
    got = apply_interleaved_rope(x, pos, deepseek_yarn_inv_freq(dim, base, factor, orig), ratio)
    # vLLM's angles t·inv_freq are fp32 (inv_freq itself computed in fp32): allow a few fp32 ulps of the
    # angle, i.e. ~pos·2^-22, per position; position 0 and 1 must match to fp32 rounding of x
    tol = 2e-6 + pos[0].double() * 2.0 ** -22
    assert ((got - want).abs().amax(dim=(0, 1, 3)).double() <= tol).all()
