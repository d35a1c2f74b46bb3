"""Which reading of a drafter did the engine run? (`smoke`'s `engine_reading`.)

vLLM and the reference loop agree exactly on greedy counts, so replaying the reference loop under
candidate readings of the same files (aux boundaries, flags) and finding the one whose counts equal
vLLM's tells which reading vLLM actually served. The intended reading is what the probe measured
(or, without a decisive measurement, what the files say); when vLLM matched another one, acceptance
is being lost silently and `smoke` raises a red flag naming the difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..checkpoint.drafter import DrafterCheckpoint
from ..engines.readings import layers_read
from ..spec import FLAGS

if TYPE_CHECKING:
    from ..engines.readings import EngineReading
    from .probe import Measurement
    from .target import Target


CandidateKey = tuple[tuple[int, ...], tuple[tuple[str, bool], ...]]  # boundaries, sorted flags


@dataclass
class Candidate:
    """One reading of the files an engine might run (boundaries, flags), and the counts the reference loop
    replayed under it."""

    name: str
    boundary_ids: tuple[int, ...]
    flags: dict[str, bool]
    counts: dict[str, int | list[int]] | None = None

    def key(self) -> CandidateKey:
        return self.boundary_ids, tuple(sorted(self.flags.items()))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "boundary_ids": list(self.boundary_ids), "flags": self.flags, "counts": self.counts}


@dataclass
class ServedReading:
    """The reading a served engine ran, measured: the candidate whose replay reproduced its counts exactly."""

    engine: str
    intended: Candidate
    matched: Candidate | None
    candidates: list[Candidate] = field(default_factory=list)
    basis: str = ""  # where the intended reading comes from
    runner: str | None = None  # v1 | v2: the runner whose counts were matched

    def difference(self) -> str | None:
        """One line naming how the engine's reading differs from the intended one (None: it does not)."""
        m, i = self.matched, self.intended
        if m is None or m.key() == i.key():
            return None
        parts = []
        if m.boundary_ids != i.boundary_ids:
            parts.append(f"{self.engine} reads boundaries {list(m.boundary_ids)}; the drafter was trained on "
                         f"{list(i.boundary_ids)}")
        for flag in FLAGS:
            if m.flags.get(flag) != i.flags.get(flag):
                parts.append(f"{self.engine} ran with {flag} {'on' if m.flags.get(flag) else 'off'}")
        return "; ".join(parts) + f" ({self.basis})"

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "runner": self.runner, "intended": self.intended.to_json(),
                "matched": self.matched.to_json() if self.matched else None, "basis": self.basis,
                "candidates": [c.to_json() for c in self.candidates]}


def candidate_readings(d: DrafterCheckpoint, target_layers: int, intended: Candidate,
                       runner: EngineReading | None = None) -> list[Candidate]:
    """What vLLM should read, the intended reading, and the near misses: aux ids one boundary off either
    way, and each flag flipped (an engine that drops or defaults a flag). What vLLM should read is the
    runner's own reading (asking.readings_for: asked of vLLM, else its table) when there is one, else the
    table's (readings.layers_read)."""
    spec = d.spec
    flags = {f: bool(getattr(spec, f)) for f in FLAGS}
    if runner is not None and runner.boundary_ids is not None and not runner.error:
        expected = Candidate(f"vllm-{runner.runner} ({'asked' if runner.asked else 'assumed'})",
                           tuple(runner.boundary_ids), flags)
    else:
        table = layers_read("vllm", d.ckpt.config, target_layers)  # None: vLLM refuses the config; the files' reading
        ids = table.boundary_ids if table.boundary_ids is not None else d.spec.capture_ids(target_layers)
        expected = Candidate(f"vllm-{table.runner} (assumed)", tuple(ids), flags)
    out = [expected, intended]
    for shift in (-1, 1):
        ids = tuple(i + shift for i in expected.boundary_ids)
        if all(0 <= i <= target_layers for i in ids):
            out.append(Candidate(f"boundaries {shift:+d}", ids, flags))
    for flag in ("norm_output", "fc_norm", "norm_before_residual", "norm_before_fc"):
        if flag in ("fc_norm", "norm_before_fc") and not flags[flag]:
            continue  # an engine cannot apply norm weights the files do not have
        out.append(Candidate(f"{flag} {'off' if flags[flag] else 'on'}", expected.boundary_ids,
                           {**flags, flag: not flags[flag]}))
    unique: dict[CandidateKey, Candidate] = {}
    for r in out:
        unique.setdefault(r.key(), r)
    return list(unique.values())


def engine_reading(d: DrafterCheckpoint, target: Target, prompts: list[list[int]], *, k: int, max_tokens: int,
                   engine_counts: dict[str, Any], measured: Measurement | None, runner: EngineReading | None = None,
                   engine: str = "vLLM") -> ServedReading:
    """Replay candidate readings (on the target's greedy continuations, decoded once) until one reproduces
    the engine's counts exactly. `runner`: the reading of the runner that produced the counts (tried first);
    `engine` names it in the difference ("vLLM V1", "vLLM V2 (emulated on V1)")."""
    from .probe import flag_overrides, replay_counts

    L = target.num_layers
    assert L is not None
    flags = {f: bool(getattr(d.spec, f)) for f in FLAGS}
    if measured is not None and measured.boundary_ids is not None:
        intended = Candidate("measured", tuple(measured.boundary_ids), {**flags, **flag_overrides(measured)})
        basis = "measured by the probe"
    else:
        intended = Candidate("files", d.spec.capture_ids(L), flags)
        basis = "as the files say (not measured)"
    from ..model.loader import load_reference
    loaded = load_reference(d)
    candidates = candidate_readings(d, L, intended, runner)
    target.need({i for c in candidates for i in c.boundary_ids})
    matched = None
    want = {key: engine_counts[key] for key in ("num_drafts", "num_accepted_tokens", "accepted_per_pos")}
    for c in candidates:
        counts = replay_counts(loaded, target, prompts, boundaries=c.boundary_ids, k=k, max_tokens=max_tokens,
                            **{f: v for f, v in c.flags.items() if v != flags[f]})
        c.counts = {key: getattr(counts, key) for key in want}
        if c.counts == want:
            matched = c
            break
    return ServedReading(engine, intended, matched, [c for c in candidates if c.counts is not None], basis,
                         runner.runner if runner is not None else None)
