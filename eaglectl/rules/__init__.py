"""The rule catalogue and the checks behind `inspect`.

Severity policy: **error** = vLLM 0.32 (our reference consumer) fails to load the drafter or
serves it silently degraded; **warning** = another engine or tool misreads it, or the files
cannot settle a fact that decides acceptance; **info** = worth knowing, nothing to fix.

Each rule is declared once, with exactly one severity, in the table `catalogue.toml` (read by
`catalogue.py`); a check emits it as the constant named after its id (`rule.AUX_IDS_MISSING`), so
a rule id cannot be misspelt. The catalogue (`RULES`) generates `docs/rules.md` and `eaglectl rules`.
Every config value a check reads goes through the drafter's typed `ConfigView`.
"""

# ruff: noqa: I001  (the check modules register in report order: their import order is the order)
from __future__ import annotations

from .base import (  # noqa: F401  (the package's API)
    CATALOGUE_VALUES,
    CHECKS,
    Context,
    ENGINES,
    Finding,
    RULES,
    Rule,
    SEVERITY_ORDER,
    Severity,
    blocking,
    check,
    explain,
    hint_values,
    run_checks,
    scope,
    summarise,
)

# The catalogue (catalogue.toml, in report order), then the check modules; importing them registers their checks.
from . import catalogue  # noqa: E402, F401, I001
from . import files, layout, vocab, aux, norms, mla, tables, target, measured, card  # noqa: E402, F401, I001
from . import window  # noqa: E402, F401  (sliding-window attention, as each engine applies it)
from . import engine, runners  # noqa: E402, F401
from . import sglang  # noqa: E402, F401  (SGLang's reading, scoped to sglang)
from . import hazards, quant  # noqa: E402, F401  (hazards from the field; quantised drafters)
# the families' checks (P-EAGLE's) register from eaglectl.families, which every command imports
from . import publish  # noqa: E402, F401  (check / upload only: what publishing the folder does)
