"""SafeAILab/EAGLE reference layout (`yuhuili/EAGLE3-*`).

`midlayer.*` keys, `d2t`/`t2d`, no aux ids (hard-coded (2, L//2, L-3), boundary convention) and no
3.1 flags: the layout can only express EAGLE-3 with a raw residual, so every flag is False by
definition. Ships `pytorch_model.bin`. Source: SafeAILab/EAGLE `eagle/model/cnets.py`,
`eagle/traineagle3/config.json` (docs/hazards.md#dialects).
"""

from ._base import FLAGS, MIDLAYER, MIDLAYER_KEYS, Dialect, Signal, Writer, architectures

_ALL_OFF = "SafeAILab layout cannot express it: EAGLE-3 semantics"

DIALECT = Dialect(
    name="eagle",
    title="SafeAILab/EAGLE",
    producers="SafeAILab EAGLE-3 training (yuhuili/EAGLE3-* heads)",
    required=(MIDLAYER,),
    supporting=(*architectures("LlamaForCausalLM"), Signal("file", "pytorch_model.bin")),
    forbidden=(  # the layout stores no aux ids and no 3.1 flags
        Signal("config-key", "eagle_config"),
        Signal("config-key", "eagle_aux_hidden_state_layer_ids"),
        Signal("config-key", "fc_norm"),
        Signal("config-key", "norm_output"),
        Signal("tensor-prefix", "fc_norm."),
    ),
    key_rules=MIDLAYER_KEYS,
    aux_convention="boundary",
    flag_defaults={f: (False, _ALL_OFF) for f in FLAGS},
    writer=Writer(
        architectures={"llama": "LlamaForCausalLM"},
        max_layers=1,
        allowed_tensors=(r"(?!fc_norm|input_norm).*",),
    ),
    notes=("one decoder layer only", "attention uses hidden/heads, ignoring an explicit head_dim"),
)
