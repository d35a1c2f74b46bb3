"""How often a command opened or ran the expensive things (tests pin them: open once, load once).

Kinds: `drafter` (a checkpoint interpreted), `drafter_fp32` (a drafter read into fp32 for the reference),
`target_config` (a target's config opened), `target_model` (HF weights loaded), `target_text` (a forward
pass over the bundled text), `target_continuations` (a batch of greedy continuations decoded) and
`target_prompts_decoded` (prompts in them), `target_continuation_states` (states added to decoded ones),
`engine_worker` (a vLLM reading worker started: one per process, however many configs are asked).
"""

from __future__ import annotations

from collections import Counter

COUNTS: Counter[str] = Counter()


def count(kind: str, n: int = 1) -> None:
    COUNTS[kind] += n


def reset() -> None:
    COUNTS.clear()
