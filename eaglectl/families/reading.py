"""What vLLM 0.32 reads of a DFlash / DSpark drafter's config: the config as its speculators reader builds it
(`family_view`), the layers each runner captures (`family_readings`), and for DFlash every key its model, proposer
and runners read (`reading`: model_executor/models/qwen3_dflash.py, v1/spec_decode/dflash.py, the runners' layer
selection).

`convert` between DFlash layouts compares this reading of the source with that of what it writes (before writing
and again on the written files): equal readings mean vLLM builds the same drafter from both. Labelled as a table
(engines/readings.ASSUMED); tests call vLLM 0.32's functions (both runners) and 0.34's (V2, its only runner) on the
same configs.
"""

from __future__ import annotations

from typing import Any

from ..engines.facts import RUNNERS
from ..engines.readings import ASSUMED, TABLE_VERSION, EngineReading, Readings, captured, select
from ..formats.families import MASK_TOKEN_KEYS
from ..io.jsonio import MISSING, config_get
from ..limits import limit

SLIDING = "sliding_attention"
DEFAULT_ROPE_THETA = 1000000  # qwen3_dflash.py: set_default_rope_theta(config, default_theta=1000000)

# decoder keys the DFlash model reads as they stand
DECODER_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "rms_norm_eps", "hidden_act", "max_position_embeddings",
                "attention_bias", "vocab_size", "rope_scaling", "rope_parameters", "layer_types", "is_neox_style",
                "logit_scale")
# dflash_config keys vLLM reads, with the value it assumes when absent
DFLASH_KEYS = {"sample_from_anchor": False, "use_aux_hidden_state": True, "attention_value_scale": None}
# what vLLM's speculators reader carries over from a DSpark config (algos.py update_dspark), and the architectures it
# keeps (any other becomes Qwen3DSparkModel)
DSPARK_SPECULATORS_KEYS = ("draft_vocab_size", "target_hidden_size", "mask_token_id", "markov_rank",
                           "markov_head_type", "block_size", "enable_confidence_head", "confidence_head_with_markov",
                           "use_aux_hidden_state")
DSPARK_SPECULATORS_ARCHS = ("Qwen3DSparkModel", "Qwen3OmniDSparkModel")


def drafter_config(view: dict[str, Any]) -> dict[str, Any]:
    """`dflash_config` as vLLM's model reads it (anything but an object reads as none: config-field-invalid says so)."""
    dc = view.get("dflash_config")
    return dc if isinstance(dc, dict) else {}


def with_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """A config with its `text_config` promoted over the top level, as vLLM 0.34 reads MiniMax-M3's DSpark draft."""
    text = config.get("text_config")
    return {**config, **(text if isinstance(text, dict) else {})}


def family_view(config: dict[str, Any]) -> dict[str, Any]:
    """A DFlash / DSpark config as vLLM 0.32 builds it: a speculators config's boundary-numbered
    `aux_hidden_state_layer_ids` become vLLM's top-level key and the family's own field one lower
    (transformers_utils/configs/speculators/algos.py update_dflash / update_dspark); any other config as it is."""
    kind = config.get("speculators_model_type")
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and archs[0] == "DSparkMiniMaxDraftModel":
        # vLLM 0.34's hf_config_override: text_config promoted, its markov_rank from dspark_markov_rank
        view = with_text_config(config)
        view["markov_rank"] = view.get("dspark_markov_rank")
        return view
    if kind not in ("dflash", "dflash2", "dspark"):
        return dict(config)
    base = config.get("transformer_layer_config")
    view = dict(base) if isinstance(base, dict) else {}
    aux = config.get("aux_hidden_state_layer_ids")
    view["eagle_aux_hidden_state_layer_ids"] = aux
    try:
        own = [int(i) - 1 for i in aux] if isinstance(aux, list) else None
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
        own = None
    if kind == "dspark":
        archs = [a for a in config.get("architectures") or [] if a in DSPARK_SPECULATORS_ARCHS]
        view["architectures"] = archs or ["Qwen3DSparkModel"]
        view["sample_from_anchor"] = config.get("sample_from_anchor", False)
        view["dspark_bonus_anchor"] = not view["sample_from_anchor"]
        view["target_layer_ids"] = own
        view.update({k: config[k] for k in DSPARK_SPECULATORS_KEYS if config.get(k) is not None})
        return view
    view["architectures"] = ["DFlash2DraftModel" if kind == "dflash2" else "DFlashDraftModel"]
    view["draft_vocab_size"] = config.get("draft_vocab_size")
    if config.get("target_hidden_size") is not None:
        view["target_hidden_size"] = config["target_hidden_size"]
    # an absent sliding_window_non_causal reads as true, so as causal false (the speculators class default is false)
    view["dflash_config"] = {"mask_token_id": config.get("mask_token_id"), "target_layer_ids": own,
                             "sample_from_anchor": config.get("sample_from_anchor", False),
                             "causal": not config.get("sliding_window_non_causal", True)}
    return view


def family_readings(config: dict[str, Any] | None, runners_serving: dict[str, str | None],
                    target_layers: int | None, drafter: str = "") -> Readings:
    """What each vLLM runner captures for a DFlash / DSpark drafter, from the tables of its selection code
    (labelled assumed): a runner that does not serve the family's method gets the reason as its error."""
    out = Readings(drafter, target_layers)
    if config is None:
        out.note = "no config.json"
        return out
    view = family_view(config)
    for t in RUNNERS:
        chosen, source, shift, why = None, None, 0, runners_serving.get(t.runner)
        if why is None:
            try:
                chosen, source, shift = select(view, t)
            except ValueError as e:
                why = str(e)
        ids = None if why else captured(chosen, target_layers)
        out.runners.append(EngineReading("vllm", t.runner, TABLE_VERSION, ids, source, shift, None, None, ASSUMED,
                                         error=why, build="eaglectl's reading of the config"))
    return out


def layer_attention(view: dict[str, Any]) -> list[list[Any]] | str:
    """[sliding window or None, causal] per draft layer (qwen3_dflash.py _resolve_layer_attention and
    _dflash_layer_causal), or why vLLM refuses the config."""
    dc = drafter_config(view)
    types = view.get("layer_types")
    n = view.get("num_hidden_layers")
    # bounded before the loop below: a hostile 10**12 layers made convert allocate gigabytes
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= limit("drafter_layers") or (
            types is not None and (not isinstance(types, list) or len(types) < n)):
        return "num_hidden_layers / layer_types unreadable"
    use_swa = bool(dc.get("use_swa", False))
    any_sliding = types is not None and SLIDING in types
    out: list[list[Any]] = []
    for i in range(n):
        sliding = use_swa if types is None or (use_swa and not any_sliding) else types[i] == SLIDING
        window = dc.get("swa_window_size", view.get("sliding_window")) if sliding else None
        if sliding and window is None:
            return "a sliding layer without dflash_config.swa_window_size or sliding_window"
        if view.get("is_causal") is not None:
            causal = bool(view["is_causal"])
        elif dc.get("causal") is not None:
            causal = bool(dc["causal"])
        else:
            causal = bool(types) and types[i] == SLIDING
        out.append([window, causal])
    return out


def mask_token(view: dict[str, Any]) -> Any:
    """The mask token id, where vLLM's proposer looks for it first (MASK_TOKEN_KEYS)."""
    for key in MASK_TOKEN_KEYS:
        value = config_get(view, key)
        if value is not MISSING and value is not None:
            return value
    return None


def reading(config: dict[str, Any]) -> dict[str, Any]:
    """{what vLLM reads: the value it reads} for a DFlash config in the hf or the speculators layout."""
    view = family_view(config)
    dc = drafter_config(view)
    out: dict[str, Any] = {k: view.get(k) for k in DECODER_KEYS}
    out["rope_theta"] = view.get("rope_theta", DEFAULT_ROPE_THETA)
    out["draft_vocab_size"] = view.get("draft_vocab_size") or view.get("vocab_size")
    out["target_hidden_size"] = view.get("target_hidden_size") or view.get("hidden_size")
    out["mask_token_id"] = mask_token(view)
    out["attention per layer [sliding window, causal]"] = layer_attention(view)
    out["attention_sink_bias"] = bool(dc.get("attention_sink_bias", view.get("add_swa_attention_sink_bias", False)))
    out.update({f"dflash_config.{k}": dc.get(k, default) for k, default in DFLASH_KEYS.items()})
    for r in family_readings(view, {"v1": None, "v2": None}, None).runners:
        out[f"layers vLLM's {r.runner} runner captures"] = r.error or (list(r.boundary_ids) if r.boundary_ids
                                                                         else None)
    return out


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(what, the source's, the output's) for every read value that differs."""
    return [(k, before.get(k), after.get(k)) for k in before if before.get(k) != after.get(k)]
