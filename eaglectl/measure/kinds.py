"""The kinds of text an upgrade learns from, ranks its inits on and reports on: chat, prose, math and code.

Drafters are trained and served on all of them, and an fc_norm init fitted and chosen on one kind keeps less on
the others; so every role reads every kind, and the init kept is the one that keeps most on the kind where it
keeps least. Chat, prose and math are seed prompts written for eaglectl (`eaglectl/data/kinds.jsonl`, released
under eaglectl's licence); code is windows of the held-out code (`heldout-code.txt`, measure/workload.py). With a
runnable target, what is measured is the target's own greedy continuation of each prompt: the text EAGLE drafters
are trained on, in the target's distribution.

The seed prompts of a kind are split into three disjoint roles (the i-th serves ROLES[i % 3]): what an upgrade
fits on (calibration, `fit`), ranks on and reports on never overlap.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..io.jsonio import loads

KINDS = ("chat", "prose", "math", "code")
SEEDED = ("chat", "prose", "math")  # the kinds read from eaglectl's seed prompts (code: the held-out windows)
ROLES = ("calibration", "ranking", "report")
SOURCE = Path(__file__).parents[1] / "data" / "kinds.jsonl"
DESCRIPTION = ("chat, prose and math (eaglectl's seed prompts) and code (windows of held-out code), the target's "
               "greedy continuation of each")

T = TypeVar("T")


@functools.cache
def _seeds() -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {k: [] for k in SEEDED}
    for line in SOURCE.read_bytes().splitlines():
        if line.strip():
            row = loads(line, str(SOURCE))
            out[row["kind"]].append(row["prompt"])
    return {k: tuple(v) for k, v in out.items()}


def _serving(kind: str, role: str) -> tuple[str, ...]:
    """The seed prompts of `kind` that serve `role` (the i-th serves ROLES[i % 3])."""
    return _seeds()[kind][ROLES.index(role)::len(ROLES)]


def available(kind: str, role: str) -> int:
    """How many seed prompts of `kind` serve `role`."""
    return len(_serving(kind, role))


def seed_prompts(tokenizer: Any, kind: str, role: str, count: int, length: int) -> list[list[int]]:
    """Up to `count` seed prompts of a seeded kind for one role, as token ids (at most `length` each)."""
    return [tokenizer(s, add_special_tokens=False).input_ids[:length] for s in _serving(kind, role)[:count]]


def grouped(labels: Sequence[str], items: Sequence[T]) -> dict[str, list[T]]:
    """`items` by the kind each is labelled with, in KINDS order."""
    out: dict[str, list[T]] = {}
    for kind in sorted(set(labels), key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS)):
        out[kind] = [x for label, x in zip(labels, items, strict=True) if label == kind]
    return out
