"""llama.cpp's GGUF EAGLE-3 draft (`general.architecture = eagle3`, served with `--spec-type draft-eagle3`).

One `.gguf` file: metadata keys `eagle3.*` instead of a config.json, llama.cpp tensor names (`blk.0.attn_q`,
`fc`, `enc.output_norm`, `d2t` as absolute I64 target ids), q/k rows permuted for llama.cpp's RoPE. io/gguf.py
reads the header into the same Checkpoint every dialect is read from (names as stored, a config synthesised from
the metadata, q/k un-permuted and d2t made relative on read), so detection and the spec go through this table.
What llama.cpp's loader cannot hold is refused on writing: exactly 3 aux layers, one decoder layer, Llama
attention only, no fc_norm and no norm_output (docs/gguf.md).
"""

from ._base import VLLM_AUX_KEY, Dialect, Signal, Writer

_LOADER = "llama.cpp's eagle3 loader has no such tensor or key (src/models/eagle3.cpp)"

DIALECT = Dialect(
    name="gguf",
    title="llama.cpp GGUF",
    producers="llama.cpp `convert_hf_to_gguf.py` (EAGLE-3 drafts), `eaglectl convert --to gguf`",
    required=(Signal("tensor-prefix", "blk.", weight=2), Signal("tensor", "fc.weight")),
    # io/gguf.py sets it from `general.architecture`: no safetensors file has it
    markers=(Signal("config-value", "gguf_architecture", "eagle3", weight=2),),
    key_rules=(
        ("embed_tokens.", "token_embd."), ("norm.", "output_norm."), ("lm_head.", "output."),
        ("input_norm.", "enc.output_norm."),
        ("layers.0.input_layernorm.", "blk.0.attn_norm."), ("layers.0.hidden_norm.", "blk.0.attn_norm_2."),
        ("layers.0.self_attn.q_proj.", "blk.0.attn_q."), ("layers.0.self_attn.k_proj.", "blk.0.attn_k."),
        ("layers.0.self_attn.v_proj.", "blk.0.attn_v."), ("layers.0.self_attn.o_proj.", "blk.0.attn_output."),
        ("layers.0.post_attention_layernorm.", "blk.0.ffn_norm."), ("layers.0.mlp.gate_proj.", "blk.0.ffn_gate."),
        ("layers.0.mlp.up_proj.", "blk.0.ffn_up."), ("layers.0.mlp.down_proj.", "blk.0.ffn_down."),
    ),
    aux_ids_paths=(VLLM_AUX_KEY,),  # `eagle3.target_layers`, as io/gguf.py synthesises it
    # id k = the input of target layer k (common/speculative.cpp: llama_set_embeddings_layer_inp(ctx_tgt, k); k = L
    # is the final hidden state), vLLM's numbering; the converter copies eagle_aux_hidden_state_layer_ids unchanged
    aux_convention="boundary",
    flag_fields=frozenset({"norm_before_residual", "norm_before_fc"}),
    flag_defaults={
        "norm_before_residual": (False, "llama.cpp default (eagle3.norm_before_residual optional)"),
        "norm_before_fc": (False, "llama.cpp default (eagle3.norm_before_fc optional)"),
        "fc_norm": (False, _LOADER),
        "norm_output": (False, _LOADER),
    },
    writer=Writer(
        architectures={"llama": "LlamaForCausalLMEagle3"},
        aux_ids_paths=(VLLM_AUX_KEY,),
        aux_convention="boundary",
        flag_paths={"norm_before_residual": ("norm_before_residual",), "norm_before_fc": ("norm_before_fc",)},
        explicit_false=("norm_before_residual", "norm_before_fc"),
        max_layers=1,
        exactly_3_aux=True,
        t2d=False,  # llama.cpp's converter skips t2d: it is derived from d2t on reading
        allowed_tensors=(r"(?!fc_norm|layers\.0\.self_attn\.[qk]_norm|.*bias$).*",),
    ),
    owned_config_keys=("gguf_architecture",),
    consumer="llama.cpp",
    vllm_loads=False,  # vLLM reads no GGUF drafter: convert it --for vllm first
    notes=("one .gguf file; header-only unless --scan", "q/k permuted for llama.cpp RoPE; d2t stored as absolute ids",
           "no tokenizer is written: llama.cpp's converter copies the target's"),
)
