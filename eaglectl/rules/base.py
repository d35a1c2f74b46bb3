"""The rule machinery: severities, rules, findings, the check context and the check registry (`check`, `run`).

The package's face (`rules/__init__.py`) re-exports it and imports the check modules, which register here."""

from __future__ import annotations

import difflib
import enum
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import formats
from ..checkpoint.drafter import CanonicalView, DrafterCheckpoint
from ..checkpoint.target import TargetCheckpoint, is_hub_id
from ..engines.facts import RELEASED_ENGINES, engines_of
from ..errors import UsageError
from ..formats import Dialect
from ..io.checkpoint import Checkpoint
from ..io.jsonio import ConfigView
from ..progress import Progress, passthrough
from ..spec import DrafterSpec

if TYPE_CHECKING:
    import numpy as np

    from ..engines.readings import Readings
    from ..measure.probe import Measurement


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    def __str__(self) -> str:
        return self.value


ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


# Placeholders a rule's fix may hold, so that a printed hint is a command that runs as printed:
# {source}, {target}; {convert}: rewrite in the drafter's own dialect (speculators when eaglectl
# cannot write that one), with --target only where the conversion needs one; {convert_t}: the
# same, always with --target; {to_vllm}: to speculators (modelopt for MLA) with --target; {pickle}: --allow-pickle for
# a .bin source (the three commands carry it already); {measure}: `inspect --target` when no target was
# given (never the command just run). Only DEST is left to fill;
# a command runs to the next "(", ";" or the end (tests/test_ux_errors.py runs each one).
# The catalogue (docs, `eaglectl rules`) shows them as SOURCE / TARGET / DIALECT.
CATALOGUE_VALUES = {"source": "SOURCE", "target": "TARGET", "pickle": "",
                    "measure": "eaglectl inspect SOURCE --target TARGET (measures it); or ",
                    "convert": "eaglectl convert SOURCE DEST --to DIALECT",
                    "convert_t": "eaglectl convert SOURCE DEST --to DIALECT --target TARGET",
                    "to_vllm": "eaglectl convert SOURCE DEST --to speculators --target TARGET",
                    "to_runners": "eaglectl convert SOURCE DEST --to speculators --target TARGET",
                    "to_count": "eaglectl convert SOURCE DEST --to DIALECT",
                    "to_named": "eaglectl convert SOURCE DEST --to speculators --base-model ORG/NAME",
                    "to_mla": "eaglectl convert SOURCE DEST --to modelopt",
                    "to_both": "eaglectl convert SOURCE DEST --for vllm,sglang --target TARGET"}


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    title: str
    fix: str | None  # None: nothing to do (info); may hold the placeholders above
    repaired_by_convert: bool = False  # a conversion fixes it by construction, so it does not block one
    # the one engine whose reading the rule is about (None: vLLM, the reference consumer, or every reader);
    # a finding scoped to another engine says nothing about vLLM
    engine: str | None = None
    # a finding means `vllm serve` as printed would capture other target layers than the drafter reads: inspect
    # withholds the serve line and prints the fix instead
    wrong_layers: bool = False
    # a finding means the rule's engine does not serve the drafter as its files are (it refuses them, loads them
    # as another model, or applies another architecture): no serve line for that engine
    unservable: bool = False
    # eaglectl could not decide what the engine reads (its limit, not the drafter's): a gate for that engine is
    # undecided, never a pass
    undecided: bool = False

    def hint(self, values: dict[str, str] | None = None) -> str | None:
        return None if self.fix is None else self.fix.format(**(values or CATALOGUE_VALUES))

    def to_json(self) -> dict[str, Any]:
        return {"rule_id": self.id, "severity": self.severity.value, "title": self.title, "hint": self.hint(),
                "repaired_by_convert": self.repaired_by_convert, "engine": self.engine}


def hint_values(drafter: DrafterCheckpoint, target: TargetCheckpoint | None = None) -> dict[str, str]:
    """The placeholders filled in for this drafter (and target, when one was given)."""
    source = shlex.quote(drafter.ckpt.source)
    tgt = shlex.quote(target.source) if target is not None and getattr(target, "source", None) else "TARGET"
    name = drafter.dialect.name
    own = name if name in formats.writable() else "speculators"
    pickle = " --allow-pickle" if drafter.ckpt.layout == "pickle" else ""
    convert = f"eaglectl convert {source} DEST --to {own}"
    # speculators names its verifier: a source that does not already name one needs the target's name
    named = "" if own != "speculators" or name == "speculators" else (
        f" --target {tgt}" if tgt != "TARGET" else " --base-model ORG/NAME")
    to_vllm = "modelopt" if drafter.spec.arch == "mla" else "speculators"  # speculators cannot hold MLA
    return {"source": source, "target": tgt, "pickle": pickle,
            # the measurement a target decides: offered only when no --target was given (else it was just run,
            # and the finding's message says why it did not decide)
            "measure": "" if tgt != "TARGET" else
                       f"eaglectl inspect {source} --target TARGET{pickle} (measures it); or ",
            "convert": convert + named + pickle,
            "convert_t": f"{convert} --target {tgt}{pickle}",
            "to_vllm": f"eaglectl convert {source} DEST --to {to_vllm}{target_args(drafter, target, to_vllm)}{pickle}",
            # a dialect that writes the ids at the top level: the drafter's own when it does (then the
            # numbering question does not arise), else speculators (modelopt for MLA: speculators has none)
            "to_runners": f"eaglectl convert {source} DEST --to {(top := _top_level_dialect(drafter, own))}"
                          f"{target_args(drafter, target, top)}{pickle}",
            # the dialect whose written config vLLM reads the aux count from: `inspect` plans each and fills it in
            "to_count": convert + named + pickle,
            # speculators naming its verifier by Hub id; modelopt writing vLLM's registered MLA class name
            "to_named": f"eaglectl convert {source} DEST --to speculators --base-model ORG/NAME{pickle}",
            "to_mla": f"eaglectl convert {source} DEST --to modelopt{pickle}",
            # one file vLLM and SGLang both read right: SGLang numbers the ids by the target's class
            "to_both": f"eaglectl convert {source} DEST --for vllm,sglang --target {tgt}{pickle}"}


def target_args(drafter: DrafterCheckpoint, target: TargetCheckpoint | None, to: str | None) -> str:
    """What a conversion of `drafter` to `to` (None: `--for vllm`, which may pick speculators) needs of the
    target, as options: the given --target (it measures the aux numbering too); else --target TARGET only when
    the target's depth decides the ids (the drafter stores none); else --base-model ORG/NAME where speculators
    must name its verifier, which needs no download of the target (a 120B target is hundreds of GB)."""
    if target is not None and getattr(target, "source", None):
        return f" --target {shlex.quote(target.source)}"
    if drafter.spec.aux_layer_ids is None:
        return " --target TARGET"
    names = is_hub_id(drafter.config.str("speculators_config.verifier.name_or_path"))  # kept by speculators
    may_name = to == "speculators" or (to is None and drafter.spec.arch != "mla")  # speculators holds no MLA
    return " --base-model ORG/NAME" if may_name and not names else ""


def _top_level_dialect(drafter: DrafterCheckpoint, own: str) -> str:
    writer = formats.get(own).writer if own in formats.writable() else None
    if writer is not None and "eagle_aux_hidden_state_layer_ids" in writer.aux_ids_paths and (
            drafter.spec.arch in writer.architectures) and formats.get(own).consumer == "vllm":
        return own
    return "modelopt" if drafter.spec.arch == "mla" else "speculators"


RULES: dict[str, Rule] = {}  # filled by catalogue.py (a TOML table cannot declare a rule twice)


@dataclass
class Finding:
    rule: Rule
    message: str
    locator: str | None = None
    values: dict[str, str] | None = None  # hint placeholders for this drafter (hint_values)
    # the engine the report is for (inspect --for), when the rule is about another one: then it is advice for
    # that engine, shown as info and never failing a command
    other_engine: str | None = None

    @property
    def hint(self) -> str | None:
        return self.rule.hint(self.values)

    @property
    def rule_id(self) -> str:
        return self.rule.id

    @property
    def severity(self) -> str:
        return "info" if self.other_engine is not None else self.rule.severity.value

    def to_json(self) -> dict[str, Any]:
        return {"rule_id": self.rule.id, "severity": self.severity, "message": self.message,
                "hint": self.hint, "locator": self.locator}


ENGINES = RELEASED_ENGINES  # what inspect --for scopes a report to


def scope(findings: list[Finding], for_engine: str) -> list[Finding]:
    """Findings for the engines `for_engine` names: a rule about another engine --for can name is advice for that
    engine (info), re-sorted. Rules about engines --for does not name (tokenspeed) keep their severity."""
    engines = engines_of(for_engine)
    for f in findings:
        f.other_engine = for_engine if f.rule.engine in ENGINES and f.rule.engine not in engines else None
    # an error no conversion repairs comes first: convert refuses the source until it is fixed, so the fixes
    # that convert are not the next step
    findings.sort(key=lambda f: (SEVERITY_ORDER[f.severity], f.severity != "error" or f.rule.repaired_by_convert))
    return findings


def blocking(findings: list[Finding]) -> list[Finding]:
    """The errors no conversion repairs: convert refuses the source while one stands."""
    return [f for f in findings if f.severity == "error" and not f.rule.repaired_by_convert]


@dataclass
class Context:
    drafter: DrafterCheckpoint
    target: TargetCheckpoint | None = None
    scan: bool = False
    measured: Measurement | None = None  # when --target could be run
    readings: Readings | None = None  # each vLLM runner's reading (None: not computed; runner rules skip)
    engine_version: str | None = None  # inspect --engine-version: the vLLM release the findings are for
    for_engines: tuple[str, ...] = ("vllm",)  # inspect --for: the engines the report is for
    progress: Progress = passthrough
    findings: list[Finding] = field(default_factory=list)
    _arrays: dict[str, np.ndarray] = field(default_factory=dict)
    # the drafter's parts every check reads, taken from `drafter`
    spec: DrafterSpec = field(init=False)
    view: CanonicalView = field(init=False)
    ckpt: Checkpoint = field(init=False)
    dialect: Dialect = field(init=False)
    config: ConfigView = field(init=False)

    def __post_init__(self) -> None:
        d = self.drafter
        self.spec, self.view, self.ckpt, self.dialect, self.config = d.spec, d.view, d.ckpt, d.dialect, d.config

    def emit(self, r: Rule, message: str, locator: str | None = None) -> None:
        self.findings.append(Finding(r, message, locator, hint_values(self.drafter, self.target)))

    def array(self, canon: str) -> np.ndarray:
        if canon not in self._arrays:
            self._arrays[canon] = self.view.read(canon)
        return self._arrays[canon]

    def constant_norm(self, canon: str) -> float | None:
        """The one value a stored norm weight holds everywhere (a norm no loss reached keeps its init), or None:
        absent, not a float vector of at most 2^20 values (read without --scan: norm vectors are small), or
        trained (its values vary)."""
        if canon not in self.view:
            return None
        info = self.view.info(canon)
        if len(info.shape) != 1 or not 0 < info.numel <= 1 << 20 or info.dtype not in ("BF16", "F16", "F32", "F64"):
            return None
        values = self.array(canon)
        return float(values[0]) if bool((values == values[0]).all()) else None

    @property
    def where(self) -> str:
        return self.ckpt.config_name or f"{self.ckpt.root}/config.json"

    def at(self, key: str) -> str:
        return f"{self.where}:{key}"


CHECKS: list[Callable[[Context], None]] = []


def check(fn: Callable[[Context], None]) -> Callable[[Context], None]:
    CHECKS.append(fn)
    return fn


SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def run_checks(ctx: Context) -> list[Finding]:
    """Every check, then the config fields any check found invalid; sorted by severity."""
    for fn in CHECKS:
        fn(ctx)
    # last: any check may have read an invalid field; emitting one reads the config again (hint_values), which may
    # record another, so each round reports what the last one added until none is new
    reported: set[str] = set()
    while new := [(p, m) for p, m in list(ctx.config.problems.items()) if p not in reported]:
        for path, message in new:
            reported.add(path)
            ctx.emit(RULES["config-field-invalid"], message, ctx.at(path))
    ctx.findings.sort(key=lambda f: SEVERITY_ORDER[f.severity])
    return ctx.findings


def explain(rule_id: str | None = None) -> list[Rule]:
    """The rule `rule_id` (every rule with None); an unknown id is a usage error naming the closest ones."""
    if rule_id is None:
        return list(RULES.values())
    if rule_id not in RULES:
        near = difflib.get_close_matches(rule_id, list(RULES), n=3, cutoff=0.5)
        raise UsageError(f"no rule '{rule_id}'", hint=(f"did you mean {' or '.join(near)}? " if near else "")
                         + "eaglectl rules lists them all")
    return [RULES[rule_id]]


def summarise(findings: list[Finding]) -> dict[str, int]:
    out = {"error": 0, "warning": 0, "info": 0}
    for f in findings:
        out[f.severity] += 1
    return out
