"""An upgrade measured the way it will be served: the prompts (`Workload`), the vLLM runner whose reading of a
config's aux ids counts (`Setup.runner`: engines/readings.layers_read), the fc_norm inits ranked by the
acceptance they keep (`rank_by_acceptance`), the acceptance length before and after with a bootstrap interval
(`before_after`), and the written files replayed to the counts reported (`check_written`).

Every figure is the reference loop's greedy fp32 replay of the target's greedy continuations, decoded once per
command (model/replay.py); those counts equal vLLM's (docs/smoke.md#engine-parity). Values are rounded to the
stored dtype first: what is measured is what is written.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...checkpoint.drafter import DrafterCheckpoint
from ...engines.readings import layers_read
from ...errors import BehaviourChangedError
from ...io import cast as casting
from ...measure import kinds as text_kinds
from ...measure.target import Target
from ...measure.workload import (
    PROMPT_TOKENS,
    heldout_prompts,
    heldout_spans,
    load_prompts,
    needs_chat,
    tokenizer_of,
)
from ...progress import Progress, passthrough
from .calibration import Fit

if TYPE_CHECKING:
    import torch

    from ...model.loader import LoadedDrafter
    from ...model.replay import LoopCounts

RANK_SEED = 3  # of the bundled held-out windows the inits are ranked on
STEPS = 3  # draft steps (k) of the ranking loop, as smoke's default
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 2000, 0
# smoke's defaults (commands/requests.SmokeRequest; a test holds them equal): the acceptance is reported on its
# default prompts, so that `eaglectl smoke DEST --target T` reproduces the figure count for count
SMOKE_PROMPTS, SMOKE_MAX_MODEL_LEN, SMOKE_SEED, SMOKE_NUM_PROMPTS, SMOKE_MAX_TOKENS = "builtin:short", 1024, 0, 16, 64


@dataclass
class Workload:
    """Prompts the reference loop replays: the inits are ranked on one workload, the acceptance is reported on
    another (`workloads_for`)."""

    prompts: list[list[int]]
    source: str  # the --prompts spec, smoke's default spec, or "bundled"
    description: str
    given: bool  # the user's --prompts
    max_tokens: int
    num_prompts: int
    k: int = STEPS
    kinds: tuple[str, ...] = ()  # the kind of text of each prompt (measure/kinds.py); empty: one, the user's
    states: str | None = None  # the capture of greedy continuations the prompts are replayed from

    def identity(self) -> dict[str, Any]:
        digest = hashlib.sha256(json.dumps(self.prompts, separators=(",", ":")).encode()).hexdigest()
        return {"source": self.source, "given": self.given, "count": len(self.prompts), "description":
                self.description, "digest": f"sha256:{digest}", "max_tokens": self.max_tokens, "k": self.k}

    def smoke_command(self, drafter: str, target: str, runner: str) -> str:
        """The `smoke` command that measures `drafter` on exactly these prompts, as it runs when pasted."""
        q = shlex.quote
        given = [("--prompts", self.source, SMOKE_PROMPTS), ("--num-prompts", self.num_prompts, SMOKE_NUM_PROMPTS),
                 ("--max-tokens", self.max_tokens, SMOKE_MAX_TOKENS), ("--runner", runner, "v1")]
        if self.states is not None:  # the capture's prompts, replayed by the reference loop
            given[0] = ("--engine", "reference", None)
        where = f"--states {q(self.states)}" if self.states is not None else f"--target {q(target)}"
        return f"eaglectl smoke {q(drafter)} {where}" + "".join(
            f" {flag} {q(str(value))}" for flag, value, default in given if value != default)


def workloads_for(tgt: Target, prompts: str | None, num_prompts: int,
                  max_tokens: int) -> tuple[Workload | None, Workload, Workload | None, list[list[int]]]:
    """(ranking, report, report by kind, the user's prompts calibration and `fit` read).

    With the user's `--prompts`, their own text comes first: the first third of up to 3 × `num_prompts` of them
    (at most `num_prompts`) is reported on, loaded as `smoke --num-prompts` loads them; the inits are ranked on the
    next part and calibrated and fitted on the rest (`split_given`), so no figure reported was ranked or fitted
    on. Without them (or with fewer than three), the acceptance is reported on smoke's default prompts or theirs,
    and the inits are ranked on the bundled kinds of text (measure/kinds.py: chat, prose, math, code; the code
    windows apart from smoke's default prompts). Each kind of bundled text is reported on its own prompts too."""

    if tgt.states is not None:
        return _of_capture(tgt, num_prompts)
    spec = prompts if prompts is not None else SMOKE_PROMPTS
    tok = tokenizer_of(tgt.source, chat=needs_chat(spec))

    def loaded(count: int) -> Any:
        return load_prompts(spec, tok, count=count, max_tokens=max_tokens, max_model_len=SMOKE_MAX_MODEL_LEN,
                            k=STEPS, seed=SMOKE_SEED)

    given = loaded(3 * num_prompts).prompts if prompts is not None else []
    shown, ranked = split_given(len(given), num_prompts)
    got = loaded(shown or num_prompts)
    said = (": smoke's default prompts, never ranked on" if prompts is None else
            f": the first {shown} of yours, never ranked or fitted on" if ranked else
            ": yours (too few to hold any out: the inits are ranked on the bundled kinds of text)")
    report = Workload(got.prompts, spec, got.description + said, prompts is not None, max_tokens,
                      shown or num_prompts)
    tokenizer = tgt.model().tokenizer
    per = per_kind(num_prompts)
    by_kind = _of_kinds(tokenizer, "report", per, max_tokens, num_prompts, code=heldout_prompts(
        tokenizer, per, PROMPT_TOKENS, seed=SMOKE_SEED))  # code: the first of smoke's default prompts
    if ranked:  # the user's prompts apart from those reported on (smoke's loader may order a set differently)
        reported = {tuple(p) for p in got.prompts}
        rest = [p for p in given if tuple(p) not in reported]
        ranking = Workload(rest[:ranked], spec, f"{len(rest[:ranked])} of your prompts ({spec}; after the {shown} "
                           "reported on)", True, max_tokens, num_prompts)
        return ranking, report, by_kind, rest[ranked:]
    ranking = _of_kinds(tokenizer, "ranking", per, max_tokens, num_prompts, code=heldout_prompts(
        tokenizer, per, PROMPT_TOKENS, seed=RANK_SEED, avoid=smoke_spans(num_prompts)))
    return ranking, report, by_kind, []


def _of_capture(tgt: Target, num_prompts: int) -> tuple[Workload | None, Workload, None, list[list[int]]]:
    """From a capture of greedy continuations, the user's prompts are the capture's, split as `split_given` splits
    them, in request order; calibration and `fit` read the requests after the two (`measured_requests`). Too few
    to split: all are reported on and nothing ranks by acceptance (None)."""
    assert tgt.states is not None and tgt.states.continuation is not None
    given, where, c = tgt.captured_prompts(), str(tgt.states.root), tgt.states.continuation
    shown, ranked = split_given(len(given), num_prompts)
    said = "never ranked or fitted on" if ranked else "too few to hold any out: ranked and calibrated on them too"
    shown_prompts = given[:shown or num_prompts]
    report = Workload(shown_prompts, where, f"the first {len(shown_prompts)} of the {len(given)} prompts the capture "
                      f"continued ({said})", True, c.max_tokens, shown or num_prompts, states=where)
    ranking = Workload(given[shown:shown + ranked], where, f"{ranked} prompts the capture continued (after the "
                       f"{shown} reported on)", True, c.max_tokens, num_prompts, states=where) if ranked else None
    return ranking, report, None, []


def measured_requests(s: Setup) -> int:
    """The requests of a capture the figures are measured on (the first ones): calibration and `fit` read the rest."""
    if s.tgt is None or s.tgt.states is None or s.work is None or s.report is None:
        return 0
    return len(s.report.prompts) + len(s.work.prompts)


def split_given(count: int, num_prompts: int) -> tuple[int, int]:
    """(reported on, ranked on) of `count` prompts of the user's: a third each (the report at most `num_prompts`),
    the rest calibrated and fitted on; fewer than three: (0, 0), none held out."""
    if count < 3:
        return 0, 0
    shown = min(num_prompts, -(-count // 3))
    return shown, -(-(count - shown) // 2)


def per_kind(num_prompts: int) -> int:
    """Prompts of each kind a role reads: half the report's count, within what every kind has for a role."""
    return max(2, min(num_prompts // 2, *(text_kinds.available(k, "ranking") for k in text_kinds.SEEDED)))


def _of_kinds(tokenizer: Any, role: str, per: int, max_tokens: int, num_prompts: int,
              code: list[list[int]]) -> Workload:
    prompts, labels = [], []
    for kind in text_kinds.KINDS:
        got = code if kind == "code" else text_kinds.seed_prompts(tokenizer, kind, role, per, PROMPT_TOKENS)
        prompts += got
        labels += [kind] * len(got)
    seed = RANK_SEED if role == "ranking" else SMOKE_SEED
    return Workload(prompts, "bundled", f"{len(prompts)} prompts, {per} of each kind: {text_kinds.DESCRIPTION} "
                    f"(the {role} prompts; code: seed {seed})", False, max_tokens, num_prompts, kinds=tuple(labels))


def smoke_spans(num_prompts: int) -> list[tuple[int, int]]:
    """The held-out spans smoke's default prompts read: what ranking and fitting stay apart from."""

    return heldout_spans(num_prompts, PROMPT_TOKENS, SMOKE_SEED)


def ranking_spans(num_prompts: int) -> list[tuple[int, int]]:
    """The held-out spans the inits are ranked on, apart from smoke's default prompts."""

    return heldout_spans(num_prompts, PROMPT_TOKENS, RANK_SEED, avoid=smoke_spans(num_prompts))


def reserved_spans(num_prompts: int) -> list[tuple[int, int]]:
    """What ranking and reporting read: calibration and `fit` draw their windows apart from them."""
    return smoke_spans(num_prompts) + ranking_spans(num_prompts)


@dataclass(frozen=True)
class Setup:
    """What the stages of one upgrade share."""

    src: DrafterCheckpoint
    tgt: Target | None  # None: nothing to measure
    flags: dict[str, bool]  # fc_norm / norm_output of the output
    dtype: str  # the stored dtype of the tensors the upgrade writes
    runner: str = "v1"  # the vLLM runner whose reading of the files the figures follow (v1: every CPU build)
    progress: Progress = passthrough
    ids: tuple[int, ...] | None = None  # the boundaries the drafter was measured to read (None: not measured)
    work: Workload | None = None  # the prompts the inits are ranked on (None: no runnable target)
    report: Workload | None = None  # the prompts the acceptance is reported on, never ranked on
    kinds_report: Workload | None = None  # the acceptance on each kind of text, never ranked on
    fitting: tuple[tuple[int, ...], ...] = ()  # the user's prompts calibration and `fit` read (never ranked on)


def boundaries(s: Setup, config: dict[str, Any]) -> tuple[int, ...]:
    """The boundaries the engine captures for a config, as the setup's runner reads it."""

    assert s.tgt is not None and s.tgt.num_layers is not None
    got = layers_read("vllm", config, s.tgt.num_layers, runner=s.runner).boundary_ids
    assert got is not None
    return got


def reading_name(s: Setup) -> tuple[str, str]:
    """The reading the figures follow: its name and how it is said."""
    return f"vllm-{s.runner}", f"as vLLM's {s.runner.upper()} runner reads the files"


def rank_by_acceptance(s: Setup, fits: dict[str, Fit], ranked: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Each candidate init on the ranking prompts (never the calibration text, never what `fit` fitted on),
    ranked by the acceptance it keeps, among the candidates `ranked` before.

    The ranking uses the reference loop's acceptance length on the target's greedy continuations of the
    workload's prompts (decoded once, replayed for every init) at the measured boundaries; ties go to the chain
    acceptance estimated teacher-forced over every anchor of those continuations. The top-1 agreement with
    the source drafter is reported too."""
    import torch

    from ...model.loader import load_reference
    from ...model.replay import chains, correct, counts_of

    tgt, work = s.tgt, s.work
    assert tgt is not None and work is not None and s.ids is not None
    loaded = load_reference(s.src)
    ids = tuple(sorted(set(s.ids)))
    table = None if loaded.has_embed else tgt.embedding_table()
    conts = tgt.continuations(work.prompts, max_tokens=work.max_tokens, k=work.k, boundaries=ids)

    def chain(drafted: list[torch.Tensor]) -> float:  # leading correct steps per anchor, over every anchor
        right = torch.cat([correct(c, d) for c, d in zip(conts, drafted, strict=True)], dim=1)
        return 1 + float(right.long().cumprod(0).sum(0).float().mean())

    groups = text_kinds.grouped(work.kinds, range(len(conts))) if work.kinds else {"all": list(range(len(conts)))}

    def by_kind(drafted: list[torch.Tensor]) -> dict[str, float]:
        return {k: counts_of([conts[i] for i in idx], [drafted[i] for i in idx]).mean_acceptance_length
                for k, idx in groups.items()}

    source = chains(loaded.build(torch.float32, "cpu"), conts, aux_ids=ids, embed=table)
    source_chain, source_al, source_kinds = chain(source), counts_of(conts, source).mean_acceptance_length, \
        by_kind(source)
    out = []
    for init, (gammas, new_fc, _) in s.progress(list(fits.items()), label="upgrade: fc_norm inits measured"):
        drafter = loaded.build(torch.float32, "cpu", replace=stored(gammas, new_fc, s.dtype), **s.flags)
        cand = chains(drafter, conts, aux_ids=ids, embed=table)
        agreement = [float(torch.cat([(c[j] == r[j]).float() for c, r in zip(cand, source, strict=True)]).mean())
                     for j in range(work.k)]
        al, kinds_al = counts_of(conts, cand).mean_acceptance_length, by_kind(cand)
        kept = {k: kinds_al[k] / source_kinds[k] for k in kinds_al}
        worst = min(kept, key=lambda k: kept[k])  # the init is judged where it keeps least
        out.append({"init": init, "agreement_with_source": [round(a, 4) for a in agreement],
                    "estimated_acceptance_kept": round(chain(cand) / source_chain, 4),
                    "acceptance_length": round(al, 4), "source_acceptance_length": round(source_al, 4),
                    "acceptance_kept": round(kept[worst], 4), "pooled_acceptance_kept": round(al / source_al, 4),
                    "worst_kind": worst if work.kinds else None,
                    "by_kind": {k: {"acceptance_length": round(kinds_al[k], 4),
                                    "source_acceptance_length": round(source_kinds[k], 4),
                                    "acceptance_kept": round(kept[k], 4)} for k in kept} if work.kinds else {}})
    # best first: acceptance kept on its worst kind, then the chain estimate; `fit` must beat a closed-form init,
    # not tie it
    return sorted([*ranked, *out], key=lambda r: (-r["acceptance_kept"], -r["estimated_acceptance_kept"],
                                                  r["init"] == "fit"))


def stored(gammas: list[np.ndarray], new_fc: np.ndarray | None, dtype: str) -> dict[str, torch.Tensor]:
    """The added / changed tensors as they will be stored (rounded to `dtype`), fp32 for the reference."""
    import torch

    def as_stored(values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(casting.decode(casting.encode(values, dtype), dtype).astype(np.float32).reshape(
            values.shape).copy())

    out = {f"fc_norm.{j}.weight": as_stored(g) for j, g in enumerate(gammas)}
    if new_fc is not None:
        out["fc.weight"] = as_stored(new_fc)
    return out


def before_after(s: Setup, fitted: Fit, dest_config: dict[str, Any], written: bool) -> dict[str, Any]:
    """The reference loop's acceptance on the report's prompts (never the ranking's) for the source (read as the
    engine reads its files) and for the output about to be written (as the engine will read the written config):
    greedy fp32 counts, which equal vLLM's. Without `--prompts`, a seeded bootstrap 95 % interval over them."""
    from ...measure.probe import replay_counts
    from ...model.loader import load_reference

    tgt, work = s.tgt, s.report
    assert tgt is not None and work is not None and tgt.num_layers is not None
    src_b = boundaries(s, s.src.ckpt.config or {})
    dst_b = boundaries(s, dest_config)
    tgt.need(set(src_b) | set(dst_b))
    loaded = load_reference(s.src)
    before = replay_counts(loaded, tgt, work.prompts, boundaries=src_b, k=work.k, max_tokens=work.max_tokens)
    after = replay_counts(loaded, tgt, work.prompts, boundaries=dst_b, k=work.k, max_tokens=work.max_tokens,
                       replace=stored(fitted[0], fitted[1], s.dtype), **s.flags)
    al_b, al_a = before.mean_acceptance_length, after.mean_acceptance_length
    return {
        "before": round(al_b, 4), "after": round(al_a, 4), "kept": round(al_a / al_b, 4) if al_b else None,
        "reading": reading_name(s)[0], "reading_description": reading_name(s)[1],
        "source_boundary_ids": list(src_b), "dest_boundary_ids": list(dst_b),
        "measured_boundary_ids": list(s.ids) if s.ids is not None else None,
        "prompts": work.identity(), "ranked_on": s.work.identity() if s.work is not None else None,
        "counts_before": counts_json(before), "counts_after": counts_json(after),
        "predicted_for": "the written files" if written else "the files a run without --dry-run would write",
        "how": "the reference loop's greedy fp32 counts on the target's greedy continuations (replayed), which "
               "equal vLLM's (docs/smoke.md#engine-parity)",
        "interval": None if work.given else bootstrap(before, after),
        "by_kind": _by_kind(s, loaded, src_b, dst_b, fitted) if s.kinds_report is not None else None,
    }


def _by_kind(s: Setup, loaded: LoadedDrafter, src_b: tuple[int, ...], dst_b: tuple[int, ...],
             fitted: Fit) -> dict[str, Any]:
    """The acceptance before and after on each kind of bundled text (prompts never ranked or fitted on), each with
    its bootstrap interval, and the kind where the output keeps least."""
    from ...measure.probe import replay_counts

    tgt, work = s.tgt, s.kinds_report
    assert tgt is not None and work is not None
    before = replay_counts(loaded, tgt, work.prompts, boundaries=src_b, k=work.k, max_tokens=work.max_tokens)
    after = replay_counts(loaded, tgt, work.prompts, boundaries=dst_b, k=work.k, max_tokens=work.max_tokens,
                          replace=stored(fitted[0], fitted[1], s.dtype), **s.flags)
    kinds = {}
    for kind, pairs in text_kinds.grouped(work.kinds, list(zip(before.per_request, after.per_request,
                                                                 strict=True))).items():
        b, a = (np.array([[r.num_drafts, r.num_accepted_tokens] for r in side], dtype=np.float64)
                for side in zip(*pairs, strict=True))
        al_b, al_a = 1 + b[:, 1].sum() / max(b[:, 0].sum(), 1), 1 + a[:, 1].sum() / max(a[:, 0].sum(), 1)
        kinds[kind] = {"before": round(float(al_b), 4), "after": round(float(al_a), 4),
                       "kept": round(float(al_a / al_b), 4), "prompts": len(pairs), "interval": _interval(b, a),
                       "smoke_prompts": f"builtin:{'short' if kind == 'code' else kind}"}
    return {"kinds": kinds, "worst_kind": min(kinds, key=lambda k: kinds[k]["kept"]), "prompts": work.identity()}


def counts_json(c: LoopCounts) -> dict[str, Any]:
    return {"num_drafts": c.num_drafts, "num_accepted_tokens": c.num_accepted_tokens,
            "accepted_per_pos": c.accepted_per_pos,
            "per_request": [[r.num_drafts, r.num_accepted_tokens] for r in c.per_request]}


def bootstrap(before: LoopCounts, after: LoopCounts) -> dict[str, Any]:
    """Percentile 95 % intervals of AL before, after and kept, resampling prompts with replacement (paired:
    one draw of prompts serves all three). AL of a draw = 1 + accepted / drafts over its prompts, as vLLM
    pools a batch."""
    b = np.array([[r.num_drafts, r.num_accepted_tokens] for r in before.per_request], dtype=np.float64)
    a = np.array([[r.num_drafts, r.num_accepted_tokens] for r in after.per_request], dtype=np.float64)
    return _interval(b, a)


def _interval(b: np.ndarray, a: np.ndarray) -> dict[str, Any]:
    """`bootstrap` of per-request [drafts, accepted] rows before (`b`) and after (`a`)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    pick = rng.integers(0, len(b), size=(BOOTSTRAP_RESAMPLES, len(b)))
    al_b = 1 + b[pick, 1].sum(1) / np.maximum(b[pick, 0].sum(1), 1)
    al_a = 1 + a[pick, 1].sum(1) / np.maximum(a[pick, 0].sum(1), 1)

    def ci(x: np.ndarray) -> list[float]:
        return [round(float(np.percentile(x, 2.5)), 4), round(float(np.percentile(x, 97.5)), 4)]

    return {"confidence": 0.95, "resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED, "before": ci(al_b),
            "after": ci(al_a), "kept": ci(al_a / al_b)}


def check_written(s: Setup, out: DrafterCheckpoint, reported: dict[str, Any]) -> list[str]:
    """After writing: the written files, read back and read as the engine reads them, replay to the counts
    that were reported (else nothing is written)."""
    from ...measure.probe import replay_counts
    from ...model.loader import load_reference

    tgt, work = s.tgt, s.report
    assert tgt is not None and work is not None and tgt.num_layers is not None
    read = boundaries(s, out.ckpt.config or {})
    got = counts_json(replay_counts(load_reference(out), tgt, work.prompts, boundaries=read, k=work.k,
                                    max_tokens=work.max_tokens))
    if list(read) != reported["dest_boundary_ids"] or got != reported["counts_after"]:
        raise BehaviourChangedError(
            f"the written files replay to {got['num_accepted_tokens']} accepted in {got['num_drafts']} drafts at "
            f"boundaries {list(read)}, not the reported {reported['counts_after']['num_accepted_tokens']} in "
            f"{reported['counts_after']['num_drafts']} at {reported['dest_boundary_ids']}; nothing was written",
            path=out.root)
    return [f"the written files replay to AL {reported['after']:.3f} {reading_name(s)[1]} (boundaries "
            f"{list(read)}) on {work.identity()['count']} prompts, as reported"]
