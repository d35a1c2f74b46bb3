"""SpecForge (sgl-project) training exports and sglang serving layout, EAGLE-3 and 3.1.

`midlayer.*` keys, `LlamaForCausalLMEagle3`, aux ids in `eagle_config` in the output-of-layer
convention, top-level `fc_norm` / `norm_output` (PR #568), `d2t`/`t2d` always present. No
`norm_before_fc` and no `norm_before_residual` (raw residual). `norm_output` changed meaning at
PR #879 (2026-09-15): absent means False from then on; before it, absent meant True with plain
EAGLE-3 feedback, and an explicit False meant no final norm before `lm_head` — the release on PyPI
(0.2.0) still reads it that way. `inspect` warns on 3.1 checkpoints and on an explicit False; the
writer leaves a False `norm_output` out, as SpecForge's own configs do (docs/hazards.md#norm-output-window).
"""

from ._base import (
    BOTH_AUX_KEYS,
    BOTH_NUMBERINGS,
    EAGLE_CONFIG_AUX_KEY,
    MIDLAYER,
    MIDLAYER_KEYS,
    VLLM_AUX_KEY,
    Caveat,
    Dialect,
    Signal,
    Writer,
    architectures,
    flag_defaults,
)

DIALECT = Dialect(
    name="specforge",
    title="SpecForge / sglang",
    producers="sgl-project/SpecForge `specforge export`, sglang drafts",
    required=(MIDLAYER,),
    supporting=(
        *architectures("LlamaForCausalLMEagle3"),
        Signal("config-key", EAGLE_CONFIG_AUX_KEY, weight=2),
        Signal("config-key", "fc_norm", weight=0.5),
    ),
    # ModelOpt's eagle_config keys, never SpecForge's: a midlayer checkpoint with them is TorchSpec's template
    forbidden=(Signal("config-key", "eagle_config.use_input_layernorm_in_first_layer"),),
    key_rules=MIDLAYER_KEYS,
    # SpecForge writes its ids in eagle_config only; the top-level key is vLLM's, added for vLLM (by eaglectl
    # or by hand), and read first, as vLLM reads it
    aux_ids_paths=BOTH_AUX_KEYS,
    aux_convention="output",
    aux_path_conventions={VLLM_AUX_KEY: ("boundary", "vLLM's own key (SpecForge never writes it): vLLM's numbering")},
    flag_fields=frozenset({"fc_norm", "norm_output"}),
    flag_defaults=flag_defaults("SpecForge", raw_residual=True,
                                norm_output="SpecForge default since PR #879 (True in the #568..#879 window)"),
    owned_config_keys=("eagle_config",),
    caveats=(Caveat("specforge-norm-output-window", {"fc_norm": True}, "norm_output",
                    "its meaning depends on the SpecForge commit that trained it"),
             # SpecForge 0.2.0 (the only PyPI release) reads an explicit false as "no final norm before lm_head"
             # the weights settle it: trained that way, the final norm never reaches the loss, so it keeps one value
             Caveat("specforge-norm-output-window", {"norm_output": False}, "norm_output",
                    "SpecForge 0.2.0 and commits before PR #879 read an explicit false as no final norm before "
                    "lm_head; engines apply the norm", explicit=("norm_output",), settled_by="norm.weight",
                    untrained="the final norm was never trained, so SpecForge trained it with the meaning false had "
                              "before PR #879 (no final norm before lm_head); engines apply the norm, which scales "
                              "each token's logits: greedy tokens are unchanged, sampled acceptance (temperature > 0) "
                              "is not", untrained_rule="final-norm-untrained")),
    consumer="sglang",
    writer=Writer(
        architectures={"llama": "LlamaForCausalLMEagle3"},
        # vLLM's key in vLLM's numbering (both runners read it; V2 never reads eagle_config's ids), and
        # SpecForge's own field in its numbering (sglang and SpecForge read it as output-of-layer ids)
        aux_ids_paths=BOTH_AUX_KEYS,
        aux_conventions=BOTH_NUMBERINGS,
        flag_paths={"fc_norm": ("fc_norm",), "norm_output": ("norm_output",)},
        explicit_false=("norm_before_residual", "norm_before_fc"),
        # SpecForge's own configs leave norm_output out when it is off: 0.2.0 reads an explicit false as "no
        # final norm before lm_head" (logits off by up to 26 on a fixture); absent is plain EAGLE-3 in every release
        omit_false=("norm_output",),
        warnings=(({"norm_output": True}, "SpecForge 0.2.0 (the PyPI release) always feeds back the pre-norm state: "
                   "its own forward matches this EAGLE-3.1 drafter at step 0 only and diverges after it (sglang and "
                   "SpecForge after PR #879 read norm_output as 3.1)"),),
        max_layers=1,
        exactly_3_aux=True,
        allowed_tensors=(r"(?!input_norm).*",),
    ),
    notes=("one decoder layer only", "exactly 3 aux ids"),
)
