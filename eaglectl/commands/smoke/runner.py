"""`smoke --runner`: which of vLLM's model runners a smoke measures, and how (docs/smoke.md#runners).

vLLM picks an EAGLE-3 drafter's target layers with different code in its two model runners (engines/readings.py):
V1 (every CPU build) and Model Runner V2 (the default on a GPU with Triton). `smoke` measures each runner
the user asks for (`--runner v1|v2|both`; by default both when their readings differ, else the one vLLM uses
here) and raises a red flag when they read different layers, or other layers than the drafter's intended
reading (measured by the probe, else as the files declare them).

On a machine without a GPU vLLM always runs V1. There `v2` is emulated: vLLM serves a staged copy of the
drafter folder (every file linked, never copied or modified, except a config.json whose top-level
`eagle_aux_hidden_state_layer_ids`, which V1 reads first, is pinned to V2's selection), so CI measures the
acceptance a GPU server gets. On a GPU the worker sets `VLLM_USE_V2_MODEL_RUNNER` and runs the runner asked
for, unstaged.

For `smoke.measure` this module also plans the runs (`prepare`: readings, runners, the intended reading),
attaches what vLLM reports to each (`attach`) and replays the reading each ran (`replayed`).

The serving options that change acceptance without any change to the checkpoint are forced to their
standard values and recorded (`SERVING_OPTIONS`); a user's `--serving-option KEY=VALUE` is recorded as an
override.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...engines.asking import readings_for
from ...engines.facts import RUNNERS
from ...engines.readings import table_readings
from ...errors import EaglectlError, SmokeFailedError, UsageError
from ...measure.reading import engine_reading
from ...progress import Progress, passthrough

if TYPE_CHECKING:
    from ...checkpoint.drafter import DrafterCheckpoint
    from ...engines.readings import EngineReading, Readings
    from ...measure.probe import Measurement
    from ...measure.reading import ServedReading
    from ...measure.target import Target

RUNNER_CHOICES = ("v1", "v2", "both")
ROLE = {"v1": "V1", "v2": "V2"}
AUX_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class ServingOption:
    """A vLLM speculative-config option that changes acceptance with no change to the checkpoint."""

    key: str
    standard: Any  # the value eaglectl passes (None: the option stays off)
    choices: tuple[str, ...] | None  # the values a user may pass (None: any string)
    why: str


# vLLM 0.33 (config/speculative.py): `fly` rejection sampling is lossy; the draft lm_head can be quantised (V2)
SERVING_OPTIONS = (
    ServingOption("rejection_sample_method", "standard", ("standard", "synthetic", "block", "fly"),
                  "how drafts are verified: `standard` is lossless; `fly` (vLLM 0.33) is lossy and `synthetic` "
                  "accepts at a set rate, so their acceptance is not the drafter's"),
    ServingOption("draft_lm_head_quantization", None, None,
                  "vLLM 0.33, Model Runner V2 only: a quantised draft lm_head drafts other tokens"),
)
OPTION_KEYS = tuple(o.key for o in SERVING_OPTIONS)


def parse_serving_options(items: list[str] | tuple[str, ...] | None) -> dict[str, str]:
    """`KEY=VALUE` items (--serving-option) into {key: value}. Raises ValueError naming the bad item."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"'{item}' is not KEY=VALUE (keys: {', '.join(OPTION_KEYS)})")
        option = next((o for o in SERVING_OPTIONS if o.key == key), None)
        if option is None:
            raise ValueError(f"unknown serving option '{key}' (one of: {', '.join(OPTION_KEYS)})")
        if option.choices is not None and value not in option.choices:
            raise ValueError(f"{key}={value}: not one of {', '.join(option.choices)}")
        if key in out:
            raise ValueError(f"{key} given twice")
        out[key] = value
    return out


def serving_request(overrides: dict[str, str]) -> dict[str, dict[str, Any]]:
    """What the worker passes to vLLM's speculative config, per option: the value and who set it."""
    return {o.key: {"value": overrides.get(o.key, o.standard),
                    "set_by": "user (--serving-option)" if o.key in overrides else "eaglectl (standard)"}
            for o in SERVING_OPTIONS}


def serving_record(request: dict[str, dict[str, Any]], applied: dict[str, Any] | None, *, k: int, dtype: str,
                   max_model_len: int, seed: int, engine: str) -> dict[str, Any]:
    """The conditions that make one acceptance length comparable with another (smoke's `serving_options`):
    the forced or overridden speculative options as the installed vLLM took them, plus k, dtype, the context
    window, the seed and greedy sampling."""
    options = {}
    for key, want in request.items():
        got = (applied or {}).get(key, {})
        row = {"value": want["value"], "set_by": want["set_by"]}
        if engine == "vllm":
            row["in_vllm"] = got.get("in_vllm")
            if got.get("in_vllm") is False:
                row["note"] = "this vLLM has no such option (the standard behaviour)"
        elif engine == "reference":
            row["note"] = "the reference loop verifies as `standard` does"
        options[key] = row
    overridden = [k_ for k_, v in request.items() if v["set_by"].startswith("user")]
    return {"speculative": options, "num_speculative_tokens": k, "dtype": dtype, "max_model_len": max_model_len,
            "seed": seed, "temperature": 0.0, "ignore_eos": True,
            "standard": not overridden, "overridden": overridden}


# ------------------------------------------------------------------------------------------ runners

@dataclass
class RunnerRun:
    """One runner a smoke measures: the reading it applies and how it is run here."""

    runner: str  # v1 | v2
    reading: EngineReading | None
    boundary_ids: tuple[int, ...] | None  # what the runner captures on this target
    emulated: bool = False  # v2 run on the V1 runner with the top-level ids pinned (the engine decides: GPU or not)
    staged: str | None = None  # the staged folder vLLM serves when emulated
    used: str | None = None  # the runner vLLM reported it ran (worker), or the reference loop
    aux_log: str | None = None  # vLLM's "Using ... auxiliary layers from ..." line for this run
    result: Any = None  # smoke.ConfigResult
    engine_reading: ServedReading | None = None
    engine_reading_note: str | None = None
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None  # why this runner cannot serve the drafter (not run)
    name: str = ""  # the smoke configuration's name: "drafter" for the first runner, "drafter@v2" for another

    def label(self) -> str:
        ids = list(self.boundary_ids) if self.boundary_ids is not None else "?"
        if self.emulated:
            return f"V2 emulated on the V1 runner: top-level ids pinned to V2's selection {ids}"
        return f"{ROLE[self.runner]} {ids}"

    def to_json(self) -> dict[str, Any]:
        r = self.result
        al = r.mean_acceptance_length if r is not None else None
        c = r.counters if r is not None else None
        return {"runner": self.runner, "label": self.label(), "emulated": self.emulated,
                "boundary_ids": list(self.boundary_ids) if self.boundary_ids is not None else None,
                "reading": self.reading.to_json() if self.reading is not None else None,
                "runner_used": self.used, "aux_log_line": self.aux_log, "staged": self.staged,
                "mean_acceptance_length": al,
                **{k: c[k] if c else None for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                                                    "accepted_per_pos")},
                "engine_reading": self.engine_reading.to_json() if self.engine_reading is not None else None,
                "engine_reading_note": self.engine_reading_note, "notes": self.notes, "skipped": self.skipped}


def choose(option: str | None, readings: Readings) -> list[str]:
    """The runners to measure: `--runner`, else both when their readings differ, else V1 (what the reference
    loop reproduces, and what vLLM runs on CPU; on a GPU the worker reports the runner vLLM chose); a release
    with one runner (vLLM 0.34 and later: V2) has that one. A runner the release lacks is refused with the reason."""
    if option is not None and option not in RUNNER_CHOICES:
        raise ValueError(f"--runner {option}: one of {', '.join(RUNNER_CHOICES)}")
    has = [r.runner for r in readings.runners] or ["v1", "v2"]
    wanted = ["v1", "v2"] if option == "both" else [option] if option is not None else []
    missing = [w for w in wanted if w not in has]
    if missing:
        gone = next((t.gone for t in RUNNERS if t.runner == missing[0] and t.gone), "")
        raise UsageError(f"--runner {option}: vLLM {readings.release} has no {missing[0].upper()} runner"
                         + (f" ({gone})" if gone else ""), hint="--runner v2, or a vLLM release that has it")
    if wanted:
        return wanted
    if readings.split:
        return ["v1", "v2"]
    return [has[0]]


def plan(option: str | None, readings: Readings) -> list[RunnerRun]:
    """One RunnerRun per runner measured. Raises SmokeFailedError when a runner asked for has no reading (vLLM
    refuses the config under it): there is nothing to serve."""
    runs = []
    for runner in choose(option, readings):
        r = readings.get(runner)
        if r is None or r.error:
            if option is None and runner == "v1":  # the default run: vLLM itself says what it refuses
                runs.append(RunnerRun(runner, r, None, name="drafter"))
                continue
            raise SmokeFailedError(f"vLLM's {ROLE[runner]} runner has no reading of this drafter: "
                                   f"{r.error if r is not None else 'not read'}")
        run = RunnerRun(runner, r, r.boundary_ids, name="drafter" if not runs else f"drafter@{runner}")
        if r.boundary_ids is not None and r.num_aux is not None and len(r.boundary_ids) != r.num_aux:
            run.skipped = (f"{ROLE[runner]} captures {len(r.boundary_ids)} layers but fc takes {r.num_aux} aux states: "
                           "vLLM cannot load the drafter on this runner (aux-ids-runner-count)")
        runs.append(run)
    return runs


def stage_pinned(source: str | Path, ids: tuple[int, ...]) -> Path:
    """A copy of the drafter folder for vLLM to serve with the top-level `eagle_aux_hidden_state_layer_ids`
    set to `ids`: every other file is hard-linked (a symlink across filesystems), never copied or modified;
    config.json is a new file. The caller removes the folder."""
    src = Path(source).resolve()
    if not (src / "config.json").is_file():
        raise SmokeFailedError(f"{source}: no local config.json to pin V2's selection in (--runner v2 emulates "
                               "Model Runner V2 on a local folder)")
    dest = Path(tempfile.mkdtemp(prefix="eaglectl-v2-pinned-"))
    try:
        config = json.loads((src / "config.json").read_text())
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(src)
            if rel.parts[0].startswith(".") or rel == Path("config.json"):
                continue  # the Hub cache's and git's bookkeeping stays behind
            out = dest / rel
            if path.is_dir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path.resolve(), out)
            except OSError:
                out.symlink_to(path.resolve())
        config[AUX_KEY] = [int(i) for i in ids]
        config["eaglectl_staged"] = {"runner": "v2", "emulated_on": "v1", "source": str(src),
                                     "pinned": f"top-level {AUX_KEY} set to Model Runner V2's selection"}
        (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest


def check_staged(staged: Path, ids: tuple[int, ...], target_layers: int | None) -> None:
    """The staged copy must read as V2's selection under V1 (eaglectl's table of V1's code)."""

    got = table_readings(json.loads((staged / "config.json").read_text()), target_layers).get("v1")
    if got is None or got.boundary_ids != tuple(sorted(set(ids))):
        raise SmokeFailedError(f"the staged copy for V2 reads as {got.ids_text() if got else 'nothing'} under V1, "
                               f"not {list(ids)}")


# ------------------------------------------------------------------------------------------ the log

MARK = "eaglectl-smoke: configuration "
_AUX_LINE = re.compile(r"Using (?:Eagle3 )?auxiliary layers from [^\n]*")


def log_sections(log_text: str) -> dict[str, str]:
    """The worker's log split by configuration (the worker prints a marker before each one)."""
    out: dict[str, str] = {}
    name, lines = None, []
    for line in log_text.splitlines():
        if line.startswith(MARK):
            if name is not None:
                out[name] = "\n".join(lines)
            name, lines = line[len(MARK):].strip(), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        out[name] = "\n".join(lines)
    return out


def aux_line(section: str) -> tuple[str | None, str | None]:
    """vLLM's own line naming where the aux layers came from, and the runner it implies: V1 logs "Using
    auxiliary layers from speculative config" (nothing for the model default), V2 "Using Eagle3 auxiliary
    layers from config|model"."""
    m = _AUX_LINE.search(section)
    if m is None:
        return None, None
    line = m.group(0).strip()
    return line, "v2" if line.startswith("Using Eagle3") else "v1"


# ------------------------------------------------------------------------------------------ red flags

def runner_flags(runs: list[RunnerRun], readings: Readings, intended: tuple[int, ...] | None, basis: str,
                 only: str | None = None) -> list[str]:
    """Red flags: vLLM's runners read different layers from each other, or other layers than intended (measured,
    else declared). One line names both lists, the intended one and the AL each runner measured ("not measured"
    for a runner not run). `only` (`--runner v1` or `v2`): that runner alone is judged, against the intended
    reading; a split is then a note on its run."""
    measured = {r.runner: r for r in runs}

    def al(runner: str) -> str:
        run = measured.get(runner)
        if run is not None and run.skipped:
            return f"not measured: {run.skipped}"
        value = run.result.mean_acceptance_length if run is not None and run.result is not None else None
        if value is None:
            return "not measured"
        return f"AL {value:.3f}" + (", emulated on V1" if run is not None and run.emulated else "")

    read = [(r.runner, r) for r in (readings.get("v1"), readings.get("v2"))
            if r is not None and not r.error and r.boundary_ids is not None]
    want = f"; intended {list(intended)} ({basis})" if intended is not None else ""
    if only is not None:
        if readings.split and len(read) == 2:
            for run in runs:
                run.notes.append("vLLM's runners read different layers: " + ", ".join(
                    f"{ROLE[name]} {r.ids_text()}" for name, r in read) + f"; --runner {only} measures "
                    f"{ROLE[only]} only")
        read = [(name, r) for name, r in read if name == only]
    if only is None and readings.split and len(read) == 2:
        (a, ra), (b, rb) = read
        return [f"vLLM's runners read different layers: {ROLE[a]} {ra.ids_text()} ({al(a)}), {ROLE[b]} "
                f"{rb.ids_text()} ({al(b)}){want}"]
    wrong = [(name, r) for name, r in read if intended is not None and tuple(r.boundary_ids) != tuple(intended)]
    if not wrong:
        return []
    names = " and ".join(ROLE[name] for name, _ in wrong)
    als = ", ".join(f"{ROLE[name]} {al(name)}" for name, _ in wrong)
    return [f"vLLM {names} read{'s' if len(wrong) == 1 else ''} {wrong[0][1].ids_text()} ({als}), not the drafter's "
            f"intended reading{want[len('; intended'):]}"]


# ------------------------------------------------------------------------------------------ a smoke's runners

def prepare(d: DrafterCheckpoint, target: Target, engine: str, runner: str | None, reference_layers: str,
            python: str | None, vllm_python: str | None, measured: Measurement | None,
            progress: Progress = passthrough) -> tuple[Readings, list[RunnerRun], Measurement | None,
                                                       dict[str, Any] | None]:
    """The runners' readings (asked of vLLM where it is at hand), the runners to measure, and the drafter's
    intended reading: measured by the probe (always before vLLM runs; for the reference loop when the runners'
    reading is in question or --reference-layers measured), else as the files declare it."""
    from ...measure.probe import try_measure

    if reference_layers not in ("runner", "measured"):
        raise SmokeFailedError(f"--reference-layers {reference_layers}: one of runner, measured")
    readings = readings_for(d, target, vllm_python=python or vllm_python, progress=progress)
    try:
        runs = plan(runner, readings)
    except ValueError as e:
        raise SmokeFailedError(str(e)) from None
    L = target.num_layers
    declared = d.spec.capture_ids(L) if L is not None else None
    in_question = readings.split or any(r.boundary_ids is not None and r.boundary_ids != declared for r in runs)
    why = None
    if measured is None and (engine == "vllm" or in_question or reference_layers == "measured"):
        measured, why = try_measure(d, target)
    if measured is not None and measured.boundary_ids is not None:
        intended = {"boundary_ids": list(measured.boundary_ids), "basis": "measured by the probe"}
    elif declared is not None:
        intended = {"boundary_ids": list(declared), "basis": "as the files declare them, not measured"
                    + (f": {why}" if why else "")}
    else:
        intended = None
    if engine == "reference" and reference_layers == "measured":
        if measured is None or measured.boundary_ids is None:
            raise SmokeFailedError("--reference-layers measured: the probe could not measure this drafter's layers"
                                   + (f" ({why})" if why else ""))
        runs = runs[:1]
        runs[0].boundary_ids, runs[0].skipped = tuple(measured.boundary_ids), None
    return readings, runs, measured, intended


def attach(runs: list[RunnerRun], results: list[Any], raw: dict[str, Any], log: str | None,
           readings: Readings | None) -> None:
    """Each runner's result (a smoke.ConfigResult), the runner vLLM reports it used, and its own aux-layers log
    line."""
    sections = log_sections(Path(log).read_text(errors="replace")) if log else {}
    for run, res, got in zip(runs, results, raw["configs"], strict=False):
        run.result = res
        run.emulated = got.get("mode") == "emulated"
        run.used = got.get("runner_used")
        run.aux_log, implied = aux_line(sections.get(run.name, ""))
        if run.used in ("v1", "v2") and run.used != run.runner and not run.emulated:
            if len(runs) == 1 and readings is not None and readings.get(run.used) is not None:
                # the default with no split: vLLM chose the runner (V2 on a GPU); its reading is the same layers
                run.runner, run.reading = run.used, readings.get(run.used)
                run.boundary_ids = run.reading.boundary_ids
            else:
                run.notes.append(f"asked for {run.runner}, vLLM reports it ran {run.used}")
        if implied is not None and implied != (run.used or "v1"):
            run.notes.append(f"vLLM's log implies runner {implied}: {run.aux_log}")


def replayed(run: RunnerRun, d: DrafterCheckpoint, target: Target, prompts: list[list[int]], *, k: int,
             max_tokens: int, dtype: str, measured: Measurement | None) -> tuple[ServedReading | None, str | None]:
    """Which reading of the drafter one vLLM runner ran (replayed in fp32 only: other precisions do not
    reproduce vLLM's kernels bit for bit)."""
    if dtype != "float32":
        return None, f"not replayed: the reference loop reproduces vLLM's counts exactly in float32, not {dtype}"

    try:
        assert run.result is not None and run.result.counters is not None
        engine = f"vLLM {ROLE[run.runner]}" + (" (emulated on V1)" if run.emulated else "")
        return engine_reading(d, target, prompts, k=k, max_tokens=max_tokens, engine_counts=run.result.counters,
                              measured=measured, runner=run.reading, engine=engine), None
    except EaglectlError as e:
        return None, f"not replayed: {e.message}"


def reference_record(runs: list[RunnerRun], how: str) -> dict[str, Any]:
    """`--engine reference`: the layers the reference loop ran for each runner, and where they came from."""
    if how == "measured":
        ids = list(runs[0].boundary_ids or ())
        return {"from": f"measured by the probe {ids} (--reference-layers measured)",
                "boundary_ids": ids, "flags": "as the files declare them"}

    def one(r: RunnerRun) -> str:
        if r.boundary_ids is None or r.reading is None:
            why = r.reading.error if r.reading is not None and r.reading.error else "not read"
            return f"the files' reading (no vLLM {ROLE[r.runner]} reading: {why})"
        how = "asked of vLLM" if r.reading.asked else "assumed"
        return f"vLLM {ROLE[r.runner]}'s reading {list(r.boundary_ids)} ({how})"

    return {"from": "; ".join(one(r) for r in runs),
            "boundary_ids": {r.runner: list(r.boundary_ids) if r.boundary_ids is not None else None for r in runs},
            "flags": "as the files declare them"}
