"""`smoke --server URL`: the prompts through a running vLLM server's OpenAI-compatible completions API,
acceptance from its Prometheus `/metrics` (spec-decode counters read before and after: deltas, so
earlier traffic does not count; traffic from others during the run would, so run it on a quiet server).

The server's replies are untrusted (engines/http.py): each call is bounded in time and bytes, the whole
run by --timeout-s, every reply is checked for the shape vLLM gives, and counters that go backwards
(a restarted server) are an error, never a negative acceptance."""

from __future__ import annotations

import math
import re
import time
from itertools import zip_longest
from typing import Any

from ...engines.http import Deadline, check_url, get_json, get_text, post_json, server_model
from ...errors import ServerReplyError, SmokeFailedError

# vLLM's spec-decode counters; workers/vllm_smoke.py reads the same names from LLM.get_metrics()
METRICS = {"num_drafts": "vllm:spec_decode_num_drafts", "num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
           "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POSITION = re.compile(r'position="(\d{1,6})"')
VERSION_TIMEOUT_S = 5.0  # /version is optional: a server that does not answer it does not spend the run


def parse_metrics(text: str, where: str = "/metrics") -> dict[str, Any] | None:
    """The spec-decode counters in Prometheus text (summed over label sets: engines, models); None when
    the server exposes none (it was started without a speculative config). A counter that is not a finite
    number is a ServerReplyError."""
    out: dict[str, Any] = {k: 0.0 for k in METRICS}
    per_pos: dict[int, float] = {}
    seen = False
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels = m.group(1).removesuffix("_total"), m.group(2) or ""
        if name not in METRICS.values() and name != PER_POS:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise ServerReplyError(f"{where}: counter {name} has the value {m.group(3)[:40]!r}, not a finite count")
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


def _delta(before: dict[str, Any], after: dict[str, Any], where: str = "/metrics") -> dict[str, Any]:
    """after - before for every counter; a counter that went backwards (a restarted server, a reset) is an error."""
    pairs = [(k, before[k], after[k]) for k in METRICS]
    pairs += [(f"accepted_per_pos[{i}]", b, a) for i, (b, a) in enumerate(
        zip_longest(before["accepted_per_pos"], after["accepted_per_pos"], fillvalue=0.0))]
    back = next(((k, b, a) for k, b, a in pairs if a < b), None)
    if back is not None:
        raise ServerReplyError(f"{where}: counter {back[0]} went backwards ({back[1]:g} -> {back[2]:g}) during the "
                               "run: the server restarted or its counters were reset; nothing can be measured",
                               hint="run again on a server that stays up for the whole run")
    out = {k: int(round(after[k] - before[k])) for k in METRICS}
    out["accepted_per_pos"] = [int(round(a - b)) for _, b, a in pairs[len(METRICS):]]
    return out


def token_ids_of(doc: Any, url: str, most: int) -> list[int]:
    """The generated token ids of a completions reply (`choices[0].token_ids`; absent: none)."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServerReplyError(f"{url}: the reply has no 'choices' list of objects")
    ids = choices[0].get("token_ids")
    if ids is None:
        return []
    if not (isinstance(ids, list) and len(ids) <= most
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**40 for t in ids)):
        raise ServerReplyError(f"{url}: 'choices[0].token_ids' is not a list of at most {most} token ids")
    return ids


def run(url: str, prompts: list[list[int]], *, max_tokens: int, timeout_s: float) -> dict[str, Any]:
    """Send every prompt (token ids, greedy, EOS ignored) one at a time; the counters' deltas and outputs.
    The whole run ends within `timeout_s`."""
    deadline = Deadline(timeout_s)
    base = check_url(url)
    model = server_model(base, timeout_s, deadline)
    version = None
    try:
        got = get_json(f"{base}/version", timeout_s=min(timeout_s, VERSION_TIMEOUT_S), deadline=deadline)
        v = got.get("version") if isinstance(got, dict) else None
        version = v if isinstance(v, str) and len(v) <= 100 else None
    except ServerReplyError:
        pass
    before = parse_metrics(get_text(f"{base}/metrics", timeout_s=timeout_s, deadline=deadline), f"{base}/metrics")
    if before is None:
        raise SmokeFailedError(f"{base}/metrics: no vllm:spec_decode_* counters: the server runs no drafter",
                               hint="start it with --speculative-config (eaglectl inspect DRAFTER prints the line)")
    outputs: list[list[int]] = []
    t0 = time.perf_counter()
    for p in prompts:
        doc = post_json(f"{base}/v1/completions", {"model": model, "prompt": p, "max_tokens": max_tokens,
                                                   "temperature": 0.0, "ignore_eos": True, "return_token_ids": True},
                        timeout_s=timeout_s, deadline=deadline)
        outputs.append(token_ids_of(doc, f"{base}/v1/completions", max_tokens))
    seconds = time.perf_counter() - t0
    after = parse_metrics(get_text(f"{base}/metrics", timeout_s=timeout_s, deadline=deadline), f"{base}/metrics")
    if after is None:
        raise ServerReplyError(f"{base}/metrics: the spec-decode counters disappeared during the run (the server "
                               "restarted?)")
    return {"counters": _delta(before, after, f"{base}/metrics"), "outputs": outputs, "model": model,
            "vllm_version": version, "generate_seconds": seconds}
