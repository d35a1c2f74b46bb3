"""`smoke --server URL`: the prompts through a running vLLM server's OpenAI-compatible completions API,
acceptance from its Prometheus `/metrics` (spec-decode counters read before and after: deltas, so
earlier traffic does not count; traffic from others during the run would, so run it on a quiet server)."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from .errors import SmokeFailedError

METRICS = {"num_drafts": "vllm:spec_decode_num_drafts", "num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
           "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POSITION = re.compile(r'position="(\d+)"')


def _http(url: str, body: dict[str, Any] | None, timeout_s: float, raw: bool = False) -> Any:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            payload = resp.read()
    except urllib.error.HTTPError as e:
        raise SmokeFailedError(f"{url}: HTTP {e.code}: {e.read()[:300].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SmokeFailedError(f"{url}: {getattr(e, 'reason', e)}", hint="is the server running and reachable?") \
            from None
    if raw:
        return payload.decode("utf-8", errors="replace")
    try:
        return json.loads(payload)
    except ValueError:
        raise SmokeFailedError(f"{url}: the answer is not JSON") from None


def parse_metrics(text: str) -> dict[str, Any] | None:
    """The spec-decode counters in Prometheus text (summed over label sets: engines, models); None when
    the server exposes none (it was started without a speculative config)."""
    out: dict[str, Any] = {k: 0.0 for k in METRICS}
    per_pos: dict[int, float] = {}
    seen = False
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1).removesuffix("_total"), m.group(2) or "", float(m.group(3))
        for key, metric in METRICS.items():
            if name == metric:
                out[key] += value
                seen = True
        if name == PER_POS and (p := _POSITION.search(labels)):
            per_pos[int(p.group(1))] = per_pos.get(int(p.group(1)), 0.0) + value
    if not seen:
        return None
    out["accepted_per_pos"] = [per_pos[i] for i in sorted(per_pos)]
    return out


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out = {k: int(round(after[k] - before[k])) for k in METRICS}
    b = before["accepted_per_pos"] + [0.0] * (len(after["accepted_per_pos"]) - len(before["accepted_per_pos"]))
    out["accepted_per_pos"] = [int(round(a - x)) for a, x in zip(after["accepted_per_pos"], b, strict=True)]
    return out


def run(url: str, prompts: list[list[int]], *, max_tokens: int, timeout_s: float) -> dict[str, Any]:
    """Send every prompt (token ids, greedy, EOS ignored) one at a time; the counters' deltas and outputs."""
    base = url.rstrip("/")
    models = _http(f"{base}/v1/models", None, timeout_s).get("data") or []
    if not models:
        raise SmokeFailedError(f"{base}/v1/models: the server lists no model")
    model = models[0]["id"]
    version = None
    try:
        version = _http(f"{base}/version", None, timeout_s).get("version")
    except SmokeFailedError:
        pass
    before = parse_metrics(_http(f"{base}/metrics", None, timeout_s, raw=True))
    if before is None:
        raise SmokeFailedError(f"{base}/metrics: no vllm:spec_decode_* counters: the server runs no drafter",
                               hint="start it with --speculative-config (eaglectl inspect DRAFTER prints the line)")
    outputs: list[list[int]] = []
    t0 = time.perf_counter()
    for p in prompts:
        doc = _http(f"{base}/v1/completions", {"model": model, "prompt": p, "max_tokens": max_tokens,
                                               "temperature": 0.0, "ignore_eos": True, "return_token_ids": True},
                    timeout_s)
        choice = (doc.get("choices") or [{}])[0]
        outputs.append(list(choice.get("token_ids") or []))
    seconds = time.perf_counter() - t0
    after = parse_metrics(_http(f"{base}/metrics", None, timeout_s, raw=True))
    assert after is not None
    return {"counters": _delta(before, after), "outputs": outputs, "model": model, "vllm_version": version,
            "generate_seconds": seconds}
