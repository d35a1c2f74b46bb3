"""Runs inside the vLLM interpreter (its own virtualenv): JSON request in, JSON result out.

    python vllm_smoke.py REQUEST.json RESULT.json

Standalone on purpose (stdlib + vllm only): eaglectl never imports vLLM in-process, and vLLM's
torch pin stays out of eaglectl's environment. One `LLM` per configuration (k, drafter and dtype
are fixed at construction); counters are deltas around the measured `generate` calls.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time


def counters(llm) -> dict:  # type: ignore[no-untyped-def]
    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}
    # the same metric names as commands/smoke/server.METRICS (this worker imports nothing of eaglectl's)
    names = {"vllm:spec_decode_num_drafts": "num_drafts", "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens"}
    for metric in llm.get_metrics():
        if metric.name in names:
            out[names[metric.name]] += int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values = [int(v) for v in metric.values]
            acc = out["accepted_per_pos"]
            out["accepted_per_pos"] = [a + b for a, b in zip(acc + [0] * len(values), values)] if acc else values
    return out


def delta(after: dict, before: dict) -> dict:
    per = [a - (before["accepted_per_pos"][i] if i < len(before["accepted_per_pos"]) else 0)
           for i, a in enumerate(after["accepted_per_pos"])]
    return {k: after[k] - before[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")} | {
        "accepted_per_pos": per}


def request_stats(out) -> dict:  # type: ignore[no-untyped-def]
    """One request's own counts (vLLM's per-request spec-decode metrics) and decode timing (engine-core
    timestamps: time per output token after the first, and time to first token)."""
    row: dict = {}
    spec = getattr(out.outputs[0], "spec_decode_metrics", None)
    if spec is not None:
        hist = list(spec.histogram)
        row["num_drafts"] = sum(hist)
        row["num_accepted_tokens"] = sum(j * n for j, n in enumerate(hist))
        row["num_draft_tokens"] = spec.num_draft_tokens
        row["accepted_per_pos"] = [sum(hist[i + 1:]) for i in range(len(hist) - 1)]
    m = out.metrics
    n = len(out.outputs[0].token_ids)
    if m is not None and n > 1 and m.last_token_ts > m.first_token_ts:
        row["tpot_s"] = (m.last_token_ts - m.first_token_ts) / (n - 1)
        row["ttft_s"] = m.first_token_latency
    return row


_V2_ENV = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")


def speculative_fields() -> set:
    """The options this vLLM's SpeculativeConfig takes."""
    try:
        from vllm.config import SpeculativeConfig
    except ImportError:
        return set()
    return set(getattr(SpeculativeConfig, "__dataclass_fields__", {}) or getattr(SpeculativeConfig, "model_fields", {}))


def select_runner(cfg: dict, gpu: bool) -> tuple[dict | None, str]:
    """The speculative config to serve for this configuration's runner, and how it is run: on a GPU the runner
    asked for is set with VLLM_USE_V2_MODEL_RUNNER; without one vLLM runs V1, and `v2` serves the staged copy
    whose top-level ids are pinned to V2's selection."""
    spec = dict(cfg["speculative_config"]) if cfg["speculative_config"] is not None else None
    runner = cfg.get("runner")
    if runner is None or spec is None:  # a baseline: vLLM's own choice of runner
        if _V2_ENV is None:
            os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        else:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = _V2_ENV
        return spec, "native"
    if gpu:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
        return spec, "native"
    if runner == "v2":
        spec["model"] = cfg["pinned_model"]
        return spec, "emulated"
    return spec, "native"


def runner_used(llm, gpu: bool):  # type: ignore[no-untyped-def]
    try:
        return "v2" if llm.llm_engine.vllm_config.use_v2_model_runner else "v1"
    except Exception:  # noqa: BLE001 - an engine without the attribute: CPU builds run V1
        return None if gpu else "v1"


def run_config(req: dict, cfg: dict) -> dict:
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    gpu = torch.cuda.is_available()
    with contextlib.suppress(Exception):  # envs read once cached would miss VLLM_USE_V2_MODEL_RUNNER
        import vllm.envs

        vllm.envs.disable_envs_cache()
    spec, mode = select_runner(cfg, gpu)
    applied = {}
    if spec is not None:
        known = speculative_fields()
        for key, want in (req.get("serving_options") or {}).items():
            applied[key] = {"value": want["value"], "in_vllm": key in known if known else None}
            if key in known and (want["value"] is not None or want["set_by"].startswith("user")):
                spec[key] = want["value"]
            elif want["set_by"].startswith("user") and known and key not in known:
                raise SystemExit(f"eaglectl-smoke: this vLLM has no speculative option {key}")
    print(f"eaglectl-smoke: configuration {cfg['name']}", flush=True)  # noqa: T201 - the log's section marker
    t0 = time.perf_counter()
    max_seqs = max(16, max(req["concurrency"]))
    kwargs = dict(model=req["target"], skip_tokenizer_init=True, dtype=req["dtype"], max_model_len=req["max_model_len"],
                  enforce_eager=True, max_num_seqs=max_seqs, disable_log_stats=False, seed=req["seed"],
                  tensor_parallel_size=req["tensor_parallel_size"])
    if req.get("revision"):
        kwargs["revision"] = req["revision"]
    if spec is not None:
        kwargs["speculative_config"] = spec
        kwargs["per_request_spec_decode_metrics"] = "summary"
    try:
        llm = LLM(**kwargs)
    except TypeError:  # a vLLM without per-request spec-decode metrics: pooled counters only
        if kwargs.pop("per_request_spec_decode_metrics", None) is None:
            raise
        llm = LLM(**kwargs)
    load = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=True, seed=req["seed"])
    prompts = [TokensPrompt(prompt_token_ids=p) for p in req["prompts"]]
    llm.generate([TokensPrompt(prompt_token_ids=req["prompts"][0][:8])],
                 SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)  # warm-up
    before = counters(llm)
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    gen = time.perf_counter() - t
    result = {"name": cfg["name"], "load_seconds": round(load, 3), "generate_seconds": round(gen, 4),
              "counters": delta(counters(llm), before),
              "outputs": [list(o.outputs[0].token_ids) for o in outs], "requests": [request_stats(o) for o in outs],
              "throughput": [], "groups": [], "mode": mode, "runner_used": runner_used(llm, gpu),
              "serving_applied": applied}
    for group in req.get("groups", []) if cfg["speculative_config"] is not None else []:
        before = counters(llm)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in group["prompts"]], params, use_tqdm=False)
        result["groups"].append({"label": group["label"], "counters": delta(counters(llm), before),
                                 "requests": [request_stats(o) for o in outs]})
    for c in req["concurrency"]:
        groups = [prompts[i: i + c] for i in range(0, len(prompts) - c + 1, c)] or [prompts[:c]]
        walls, tpots, ttfts = [], [], []
        for group in groups:
            t = time.perf_counter()
            outs = llm.generate(group, params, use_tqdm=False)
            walls.append(time.perf_counter() - t)
            stats = [request_stats(o) for o in outs]
            tpots += [s["tpot_s"] for s in stats if "tpot_s" in s]
            ttfts += [s["ttft_s"] for s in stats if "ttft_s" in s]
        n = sum(len(g) for g in groups)
        result["throughput"].append({
            "concurrency": c, "requests": n, "seconds": round(sum(walls), 4),
            # per-user output speed as 1/TPOT (time to first token excluded), the SPEED-Bench/AIPerf convention
            "per_user_tokens_per_s": round(sum(1 / t for t in tpots) / len(tpots), 3) if tpots else None,
            "per_user_tokens_per_s_e2e": round(sum(req["max_tokens"] / w * len(g) for g, w in zip(groups, walls)) / n,
                                               3),
            "ttft_s": round(sum(ttfts) / len(ttfts), 5) if ttfts else None,
            "total_tokens_per_s": round(req["max_tokens"] * n / sum(walls), 3)})
    del llm
    gc.collect()
    return result


def main() -> None:
    request, result_path = sys.argv[1], sys.argv[2]
    with open(request) as f:
        req = json.load(f)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(req.get("kv_cache_gib", 1)))
    import torch
    import vllm

    out = {"vllm_version": vllm.__version__, "torch_version": torch.__version__,
           "cuda": torch.cuda.is_available(), "python": sys.version.split()[0], "configs": []}
    for cfg in req["configs"]:
        out["configs"].append(run_config(req, cfg))
        with open(result_path, "w") as f:  # partial results survive a later crash
            json.dump(out, f)
    with open(result_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
