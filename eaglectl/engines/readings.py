"""Which target layers an engine reads from a drafter's config: the one reading type and eaglectl's tables.

An `EngineReading` is one engine's (one runner's, for vLLM) reading of one drafter: the target boundaries it
captures (and the config key they came from, or the model default), the flags its draft model class applies, and
how many aux states `fc` is built for. `Readings` holds every reading of one drafter on one target depth.

`layers_read` is the one answer to "which boundaries does engine E (release R, runner X) capture from this config"
where the engine was not asked: vLLM's runners from the tables of their selection code (facts.RUNNERS, each with the
releases that have it), SGLang from the tables of its reading and its target classes (sglang.py), any other engine
from the convention it reads ids with (facts.ENGINE_AUX_CONVENTIONS). Every rule, probe candidate and figure asks
it, or the readings asked of the engine itself (asking.py), never a table of its own. Readings from tables are
labelled `assumed`; CI tests check the tables give exactly what each engine's own code gives.

No torch import here: `inspect` stays light.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..formats.speculators import SPECULATORS_READERS
from ..io.jsonio import MISSING, ConfigView, config_get
from ..limits import LIMITS
from ..spec import default_aux_ids
from . import sglang
from .facts import (
    DRAFT_CLASSES,
    VLLM_TABLE_RELEASES,
    RunnerTable,
    engine_convention,
    engine_ids,
    from_release,
    minor,
    release_of,
    runners_at,
)
from .target_support import TargetSupport, engines_own

TABLE_VERSION = "0.32/0.33"  # the vLLM releases the reference release's runner tables hold for
ASSUMED = f"assumed (eaglectl's table of vLLM {TABLE_VERSION})"
FLAG_NAMES = ("fc_norm", "norm_output", "norm_before_residual", "norm_before_fc")


def table_version(release: str | None) -> str:
    """The releases eaglectl's vLLM tables answer for, as a reading names them: the reference's (0.32/0.33), or
    0.34 and later, which have Model Runner V2 only."""
    return "0.34" if from_release(release, "0.34") else TABLE_VERSION


def assumed(release: str | None) -> str:
    return f"assumed (eaglectl's table of vLLM {table_version(release)})"


@dataclass(frozen=True)
class EngineReading:
    """One engine's reading of one drafter (for vLLM: one runner's)."""

    engine: str  # vllm | sglang | ...
    runner: str | None  # v1 | v2 (vLLM's model runners); None: an engine with one code path
    version: str  # vLLM's version (asked) or the table's releases (assumed)
    boundary_ids: tuple[int, ...] | None  # what the runner captures, sorted; None: the target's default, L unknown
    source: str | None  # the config key the ids came from, or "model default"
    shift: int  # added to the ids read at `source` (V2's target_layer_ids: +1)
    flags: dict[str, bool] | None  # what the draft model class applies
    num_aux: int | None  # aux states fc is built for
    basis: str  # "asked vLLM X (its own code)" | "assumed (eaglectl's table ...)"
    error: str | None = None  # vLLM refuses the config, or the runner's code raised: no reading
    build: str | None = None  # how the config was built
    model_class: str | None = None
    model_error: str | None = None  # the engine builds no EAGLE-3 draft model from it: flags and num_aux unknown
    skipped: tuple[str, ...] = ()  # tensors the engine's draft class drops without a word

    @property
    def asked(self) -> bool:
        """The engine's own answer: vLLM asked, or its code verified by hash (not eaglectl's assumption)."""
        return engines_own(self.basis)

    @property
    def default(self) -> bool:
        return self.source == "model default"

    def ids_text(self) -> str:
        if self.boundary_ids is None:
            return "the target's default (2, L//2, L-3)" if self.default else "none"
        return str(list(self.boundary_ids))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "boundary_ids": list(self.boundary_ids) if self.boundary_ids is not None else None,
                "skipped": list(self.skipped)}


@dataclass
class Readings:
    """Every engine's reading of one drafter on one target depth: vLLM's runners (those its release has), and the
    other engines' (SGLang)."""

    drafter: str
    target_layers: int | None
    runners: list[EngineReading] = field(default_factory=list)  # vLLM's, one per runner of its release
    note: str | None = None  # why vLLM was not asked, when it was not
    target: TargetSupport | None = None  # does vLLM capture EAGLE-3 aux states from the target (None: no target)
    others: list[EngineReading] = field(default_factory=list)  # one per other engine (SGLang)
    notes: dict[str, str] = field(default_factory=dict)  # another engine -> why it was not asked

    def get(self, runner: str) -> EngineReading | None:
        return next((r for r in self.runners if r.runner == runner), None)

    def engine(self, name: str) -> EngineReading | None:
        """The reading of another engine than vLLM (None: not read)."""
        return next((r for r in self.others if r.engine == name), None)

    @property
    def release(self) -> str | None:
        """The vLLM release the runners' readings are for."""
        return self.runners[0].version if self.runners else None

    @property
    def asked(self) -> bool:
        return bool(self.runners) and all(r.asked for r in self.runners)

    @property
    def basis(self) -> str:
        return self.runners[0].basis if self.runners else ASSUMED

    @property
    def split(self) -> bool:
        """The runners capture different layers (or one reads the config and the other the target's default
        when the target's depth is unknown, which is a split unless the ids are that default)."""
        v1, v2 = self.get("v1"), self.get("v2")
        if v1 is None or v2 is None or v1.error or v2.error:
            return False
        if v1.boundary_ids is not None and v2.boundary_ids is not None:
            return v1.boundary_ids != v2.boundary_ids
        known = v1 if v1.boundary_ids is not None else v2
        if known.boundary_ids is None:
            return False  # both read the target's default
        ids = known.boundary_ids
        return not (len(ids) == 3 and ids == default_aux_ids(ids[-1] + 3, "boundary"))

    def to_json(self, engines: tuple[str, ...] = ("vllm",)) -> list[dict[str, Any]]:
        """vLLM's runners' readings, then those of the other engines named (a report for vLLM alone lists its
        runners only)."""
        return [r.to_json() for r in (*self.runners, *(x for x in self.others if x.engine in engines))]


# ------------------------------------------------------------------------------------------ the tables

def vllm_view(config: dict[str, Any], release: str | None = None) -> dict[str, Any]:
    """The drafter's config as vLLM (`release`: the reference when None) builds it: a speculators-format config
    becomes its transformer_layer_config updated as vLLM's speculators reader updates it for its
    `speculators_model_type` (SPECULATORS_READERS); an HF-style config stays as it is (EAGLEConfig copies it).
    Raises ValueError where vLLM's reader refuses."""
    kind = config.get("speculators_model_type")
    if kind is None:
        return dict(config)
    reader = SPECULATORS_READERS.get(kind) if isinstance(kind, str) else None  # a list or a dict: unhashable
    if reader is None:
        raise ValueError(f"speculators_model_type '{kind}' is not one vLLM builds an EAGLE-3 drafter from "
                         f"({', '.join(SPECULATORS_READERS)})")
    if reader.until is not None and from_release(release, reader.until):
        raise ValueError(reader.refusal)
    base = config.get("transformer_layer_config")
    view = dict(base) if isinstance(base, dict) else {}
    for key, default in reader.copied.items():
        view[key] = config.get(key, default)
    if config.get("target_hidden_size") is not None:
        view["target_hidden_size"] = config["target_hidden_size"]
    model_type = view.get("model_type", "llama")
    if not isinstance(model_type, str) or model_type not in reader.archs:  # a list: no class vLLM builds
        raise ValueError(f"Unsupported model_type {model_type} for {kind} speculator")
    view["architectures"] = [reader.archs[model_type]]
    for key, built in reader.renamed.items():
        if key not in config:
            raise ValueError(f"KeyError: '{key}' (vLLM's {kind} reader requires it)")
        view[built] = config[key]
    if config.get("eagle_aux_hidden_state_layer_ids"):
        view["eagle_aux_hidden_state_layer_ids"] = config["eagle_aux_hidden_state_layer_ids"]
    return view


def select(view: dict[str, Any], table: RunnerTable) -> tuple[tuple[int, ...] | None, str, int]:
    """The ids a runner's selection code returns for this config (None: the model default), the key they
    came from and the shift it applied: `table`'s lookups, in order."""
    for lk in table.lookups:
        if lk.unless is not None and isinstance(view.get(lk.unless), dict) and view.get(lk.unless):
            continue
        value = config_get(view, lk.key)
        if value is MISSING or not value:
            continue
        shift = lk.shift_if[2] if lk.shift_if is not None and view.get(lk.shift_if[0]) == lk.shift_if[1] else lk.shift
        if not isinstance(value, (list, tuple)):
            return None, "model default", 0  # a truthy non-list ends the search; the runner then uses the default
        if len(value) > LIMITS["aux_ids"].value:
            raise ValueError(f"{lk.key} lists {len(value)} ids (more than {LIMITS['aux_ids'].value})")
        try:
            return tuple(int(i) + shift for i in value), lk.key, shift
        except (TypeError, ValueError, OverflowError):  # vLLM's int() raises too: no list it can use
            return None, "model default", 0
    return None, "model default", 0


def captured(chosen: tuple[int, ...] | None, target_layers: int | None) -> tuple[int, ...] | None:
    """What a runner captures from the ids its selection code chose: sorted and de-duplicated, or the target's
    default when it chose none (None: that default, the target's depth unknown)."""
    if chosen is None:
        return default_aux_ids(target_layers, "boundary") if target_layers is not None else None
    return tuple(sorted(set(chosen)))


def layers_read(engine: str, config: dict[str, Any] | None, target_layers: int | None, *, runner: str | None = None,
                release: str | None = None, declared: tuple[int, ...] | None = None, view: ConfigView | None = None,
                target_arch: str | None = None, canonical: list[str] | None = None) -> EngineReading:
    """Which target boundaries `engine` captures for a drafter with this config.json where the engine itself was not
    asked: the one answer of eaglectl's tables. vLLM (`release`, the reference when None): runner `runner` (its
    first runner when not named) by the table of its selection code. SGLang: its reading of eagle_config's ids by
    the target's class (`target_arch`; a Llama-family target when unknown) and its draft class (`canonical`: the
    drafter's tensor names, for the weights it drops). Any other engine: the ids it reads (facts.AUX_KEYS, else
    `declared`, the ids as the drafter's dialect reads them) numbered by its convention. `view`: the config's typed
    view where the caller holds one (its problems are recorded there)."""
    if engine == "vllm":
        got = table_readings(config, target_layers, release=release)
        one = got.get(runner) if runner is not None else (got.runners[0] if got.runners else None)
        assert one is not None, f"vLLM {release} has no runner {runner}"
        return one
    if engine == "sglang":
        return sglang_reading(config or {}, target_layers, target_arch, canonical)
    convention = engine_convention(engine)
    ids, source = engine_ids(engine, view if view is not None else ConfigView(config, "config.json"), declared)
    basis = f"assumed (eaglectl's table of {engine}, since {convention.since})"
    if ids is None:
        bounds = default_aux_ids(target_layers, "boundary") if target_layers is not None else None
        return EngineReading(engine, None, convention.since, bounds, "model default", 0, None, None, basis)
    bounds = tuple(sorted(set(convention.boundaries(ids))))
    shift = 1 if convention.rule == "output" or (convention.rule == "output-if-first-is-1" and ids[:1] == (1,)) else 0
    return EngineReading(engine, None, convention.since, bounds, source, shift, None, None, basis)


def sglang_reading(config: dict[str, Any], target_layers: int | None, target_arch: str | None = None,
                   canonical: list[str] | None = None) -> EngineReading:
    """SGLang's reading from eaglectl's table of its code (engines/sglang.py): the boundaries its target class
    captures from eagle_config's ids, the draft class it builds and what that class applies."""
    build = "eaglectl's reading of the config" + ("" if target_arch else "; the target's class unknown: a "
                                                  "Llama-family target (adds 1 to every id) assumed")
    klass, why = sglang.draft_class(config)
    capture = sglang.capture_of(target_arch or "LlamaForCausalLM")
    if capture is None:
        return EngineReading("sglang", None, sglang.RELEASE, None, None, 0, None, None, sglang.BASIS, build=build,
                             error=f"the target class {target_arch} captures no EAGLE-3 states in SGLang (no "
                                   "set_eagle3_layers_to_capture: model_runner_components/attention_backend_setup.py "
                                   "raises at start-up)")
    if klass is None:  # refused: at launch (speculators), or no class of that name
        return EngineReading("sglang", None, sglang.RELEASE, None, None, 0, None, None, sglang.BASIS, build=build,
                             error=why)
    ids = sglang.ids_read(config)
    bounds = capture.boundaries(ids, target_layers)
    drafts = why is None
    skipped = tuple(sglang.skipped(canonical or [], klass)) if drafts else ()
    return EngineReading("sglang", None, sglang.RELEASE, tuple(sorted(set(bounds))) if bounds is not None else None,
                         sglang.IDS_KEY if ids is not None else "model default", capture.shift(ids, target_layers),
                         sglang.flags(config, klass) if drafts else None,
                         sglang.num_aux(config, klass) if drafts else None, sglang.BASIS, build=build,
                         model_class=klass, model_error=why, skipped=skipped)


def draft_module(view: dict[str, Any]) -> str | None:
    """The vLLM module whose class the registry resolves for this config (method eagle3), or None."""
    archs = view.get("architectures") or []
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        return None
    arch = archs[0]
    if arch in DRAFT_CLASSES:  # a class the registry lists as it is (the speculators readers' Peagle* classes)
        return DRAFT_CLASSES[arch]
    if not (arch.startswith("Eagle3") or arch.endswith("Eagle3")):
        arch = f"Eagle3{arch}"
    return DRAFT_CLASSES.get(arch)


def model_reads(view: dict[str, Any]) -> tuple[dict[str, bool] | None, int | None, str | None]:
    """The flags vLLM's draft model class applies and the aux count fc is built for (engines.MODEL_READS)."""
    module = draft_module(view)
    if module is None:
        return None, None, None
    eagle = view.get("eagle_config") if isinstance(view.get("eagle_config"), dict) else {}
    nbfc = bool(eagle.get("norm_before_fc", view.get("norm_before_fc", False))) if module != "deepseek_eagle3" \
        else False
    flags = {"fc_norm": bool(view.get("fc_norm", False)), "norm_output": bool(view.get("norm_output", False)),
             "norm_before_residual": bool(view.get("norm_before_residual", False)), "norm_before_fc": nbfc}
    if eagle.get("use_aux_hidden_state", True) is False:
        return flags, None, module
    if module == "qwen3_eagle3":
        n = view.get("num_aux_layers")
        if n is None:
            n = view.get("num_aux_hidden_states")
        if n is None:
            n = _count(view.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids"))
    else:
        n = view.get("num_aux_hidden_states")
        if n is None:
            n = _count(eagle.get("eagle_aux_hidden_state_layer_ids"))
    return flags, n if isinstance(n, int) else None, module


def _count(ids: Any) -> int | None:
    """len(ids) as the model class takes it (3 when absent); None where vLLM's len() would raise."""
    if not ids:
        return 3
    return len(ids) if isinstance(ids, (list, tuple, str, dict)) else None


def table_readings(config: dict[str, Any] | None, target_layers: int | None, drafter: str = "",
                   release: str | None = None) -> Readings:
    """The readings of vLLM's runners (those `release` has; the reference release's when None) from eaglectl's
    tables of their code (labelled assumed)."""
    out = Readings(drafter, target_layers)
    if config is None:
        out.note = "no config.json"
        return out
    version, basis, tables = table_version(release), assumed(release), runners_at(release)
    try:
        view = vllm_view(config, release)
    except ValueError as e:
        for t in tables:
            out.runners.append(EngineReading("vllm", t.runner, version, None, None, 0, None, None, basis,
                                             error=f"ValueError: {e}", build="eaglectl's reading of the config"))
        return out
    flags, n, module = model_reads(view)
    for t in tables:
        try:
            chosen, source, shift = select(view, t)
        except ValueError as e:  # beyond eaglectl's bounds (limits.py): config-field-invalid says so
            out.runners.append(EngineReading("vllm", t.runner, version, None, None, 0, None, None, basis,
                                             error=str(e), build="eaglectl's reading of the config"))
            continue
        ids = captured(chosen, target_layers)
        out.runners.append(EngineReading("vllm", t.runner, version, ids, source, shift, flags, n, basis,
                                         build="eaglectl's reading of the config", model_class=module))
    return out


def scope_note(r: Readings, engine_version: str | None, *, with_note: bool = True) -> str | None:
    """Why vLLM was not asked, and how far the readings hold for --engine-version."""
    parts = [r.note] if r.note and with_note else []
    release = release_of(engine_version, "vllm")
    if release:
        asked = r.runners[0].version if r.asked and r.runners else None
        if minor(release) not in VLLM_TABLE_RELEASES:
            parts.append(f"--engine-version {release}: read from vLLM {asked or table_version(release)}; whether "
                         f"{release} selects the same layers is unconfirmed")
        elif asked and minor(asked) != minor(release):
            parts.append(f"--engine-version {release}: asked vLLM {asked}, whose runners' selection code is the "
                         f"one eaglectl's table of {table_version(release)} holds")
    return "; ".join(parts) or None
