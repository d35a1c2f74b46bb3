"""The rule catalogue as data: `catalogue.toml` holds every rule (id, severity, title, fix and the flags of
`Rule`), in report order. Loading it fills `RULES`. A check module imports it as `rule` and emits a rule by
the constant named after its id (`rule.AUX_IDS_MISSING` is `aux-ids-missing`); a misspelt name raises."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

from .base import RULES, Rule, Severity

CATALOGUE = Path(__file__).with_name("catalogue.toml")


def constant(rule_id: str) -> str:
    """The module constant that names a rule: `nemo-claims-3.1` is NEMO_CLAIMS_3_1."""
    return re.sub(r"[-.]", "_", rule_id).upper()


def _load() -> dict[str, Rule]:
    for id, entry in tomllib.loads(CATALOGUE.read_text(encoding="utf-8")).items():
        RULES[id] = Rule(id, Severity(entry.pop("severity")), entry.pop("title"), entry.pop("fix", None), **entry)
    return {constant(r.id): r for r in RULES.values()}


_BY_CONSTANT = _load()


def __getattr__(name: str) -> Rule:
    try:
        return _BY_CONSTANT[name]
    except KeyError:
        raise AttributeError(f"no rule {name} in {CATALOGUE.name}") from None
