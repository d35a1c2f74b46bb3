"""`eaglectl drift`: where a drafter's attention goes as speculation deepens (docs/drift.md).

Free-running chain drafting in the reference drafter (vLLM's kernels never return attention
probabilities) from anchor positions inside real text: the target's greedy answer to each prompt
(target mode, the sequences the acceptance loop of the same run produced) or the last `max_tokens`
positions of each captured request (`--states`). Anchor t: the drafter's context entries 0..t come
from the target's states; step d's query sits at position t + d and sees the context ≤ t and its own
chain entries t+1..t+d. Per step, per head: mass on the sink, on the chain (`self`), on the last w
context positions (`recent`), attention entropy, and the RMS of the state fed to the next step.
Averaged over heads, then anchors, then prompts; a two-level bootstrap (prompts, then anchors in each)
gives the 95 % intervals.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import __version__
from ..checkpoint.drafter import open_drafter
from ..errors import IncompatibleDrafterError, InvalidStatesError, UsageError
from ..io.atomic import check_outputs, local_inputs
from ..measure.target import Target
from ..measure.workload import load_prompts, template_prompts
from ..progress import Progress, passthrough
from ..result import Result
from .requests import PROTOCOLS, DriftRequest, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..io.states import States
    from ..model.loader import LoadedDrafter
    from ..model.reference import Attention, Drafter, StepOutput
    from ..model.replay import LoopCounts

METRICS = ("sink_mass", "self_mass", "recent_mass", "prompt_mass", "entropy", "state_rms")


# ------------------------------------------------------------------------------------ measurement

@dataclass
class Chains:
    """One sequence's anchors × depths (× heads) measurements; NaN where a chain was cut."""

    anchors: list[int]
    masses: dict[str, np.ndarray]  # metric -> float64 [anchors, depth, heads] (heads = layers × attention heads)
    state_rms: np.ndarray  # float64 [anchors, depth]
    drafts: np.ndarray  # int64 [anchors, depth] target ids
    cut: int = 0  # chains stopped at a token the capture has no embedding row for


def masses(probs: torch.Tensor, anchors: torch.Tensor, sink_tokens: int, recent_window: int, ctx_len: int,
           self_cols: torch.Tensor) -> dict[str, np.ndarray]:
    """Attention masses of softmax rows `probs` [A, heads, keys]: keys 0..ctx_len-1 are context positions
    (row a sees those ≤ anchors[a]); `self_cols` [A, keys] marks each row's own chain entries.

    sink = the first `sink_tokens` positions; recent = the last `recent_window` context positions up to
    the anchor, sink excluded (so the three masses are disjoint); prompt = 1 − sink − self."""
    import torch

    A, _, K = probs.shape
    col = torch.arange(K)[None, :]
    t = anchors[:, None]
    ctx = col < ctx_len
    sink = ctx & (col < sink_tokens)
    recent = ctx & (col <= t) & (col > t - recent_window) & ~sink
    p = probs.double()
    out = {
        "sink_mass": (p * sink[:, None]).sum(-1),
        "self_mass": (p * self_cols[:, None]).sum(-1),
        "recent_mass": (p * recent[:, None]).sum(-1),
        "entropy": -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1),
    }
    out["prompt_mass"] = 1 - out["sink_mass"] - out["self_mass"]
    return {k: v.numpy() for k, v in out.items()}


def measure_chains(model: Drafter, aux: torch.Tensor, tokens: torch.Tensor, anchors: list[int], depth: int, *,
                   sink_tokens: int, recent_window: int, embed: torch.Tensor | None = None,
                   token_rows: torch.Tensor | None = None, chunk: int = 256, group: int = 64,
                   attention: bool = True) -> Chains:
    """Draft `depth` tokens from every anchor (≤ T−2) of one sequence: aux [1, T, W], tokens [1, T].

    `token_rows` maps a target id to a row of `embed` (−1: no row; the chain stops there) when the table
    is a capture's compact one; None when `embed` (or the drafter's own table) covers the vocabulary.
    `attention=False` drafts the same chains without reading attention (the benchmark's baseline)."""
    import torch

    T = tokens.shape[1]
    if not anchors or max(anchors) > T - 2:
        raise ValueError(f"anchors must lie in 0..{T - 2}")
    run = _ChainRun(model, anchors, depth, (sink_tokens, recent_window), token_rows, attention)
    with torch.no_grad(), run.keeping_probs():
        context, first = run.context_step(aux, tokens[0], embed, T - 1, chunk)
        table = model.table(embed)
        cut = sum(run.chain_steps(context, first, table, idx, T - 1) for idx in torch.arange(len(anchors)).split(group))
    return Chains(anchors, run.masses, run.state, run.drafts, cut)


class _ChainRun:
    """One sequence's chains as they are drafted, and what they fill in: per mass metric [anchors, depth, heads],
    the fed-back state's RMS and the drafted target ids [anchors, depth]; NaN (-1) where a chain was cut."""

    def __init__(self, model: Drafter, anchors: list[int], depth: int, window: tuple[int, int],
                 token_rows: torch.Tensor | None, attention: bool) -> None:
        import torch

        self.model, self.at, self.depth, self.window = model, torch.tensor(anchors), depth, window
        self.token_rows, self.attention = token_rows, attention
        self.attns: list[Attention] = [layer.self_attn for layer in model.layers]
        shape, heads = (len(anchors), depth), len(self.attns) * model.a.num_heads
        self.masses = {m: np.full((*shape, heads), np.nan) for m in METRICS if m != "state_rms"}
        self.state, self.drafts = np.full(shape, np.nan), np.full(shape, -1, dtype=np.int64)

    @contextmanager
    def keeping_probs(self) -> Iterator[None]:
        """The drafter's attention layers keep their softmax rows (when attention is read) while inside."""
        try:
            for a in self.attns:
                a.kept_probs = [] if self.attention else None
            yield
        finally:
            for a in self.attns:
                a.kept_probs = None

    def rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the embedding rows of target ids `ids`, which of them have one)."""
        import torch

        if self.token_rows is None:
            return ids, torch.ones_like(ids, dtype=torch.bool)
        r = self.token_rows[ids.clamp(0, len(self.token_rows) - 1)]
        return r.clamp(min=0), (r >= 0) & (ids < len(self.token_rows))

    def take(self, queries: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Each layer's softmax rows of the last forward (the query rows `queries` when given), then cleared."""
        kept = [a.kept_probs[-1] if queries is None else a.kept_probs[-1][:, :, queries]
                for a in self.attns if a.kept_probs is not None]
        for a in self.attns:
            if a.kept_probs is not None:
                a.kept_probs.clear()
        return kept

    def record(self, idx: torch.Tensor, d: int, kept: list[torch.Tensor], ctx_len: int, self_cols: torch.Tensor,
               out: StepOutput, alive: torch.Tensor) -> None:
        """Step `d` of the chains from anchors `idx`; a chain no longer `alive` is NaN."""
        import torch

        dead, rows = ~alive.numpy(), idx.numpy()
        if self.attention:
            probs = torch.cat([k[0].transpose(0, 1) for k in kept], dim=1)  # [rows, layers·heads, keys]
            for name, v in masses(probs, self.at[idx], *self.window, ctx_len, self_cols).items():
                v[dead] = np.nan
                self.masses[name][rows, d] = v
        rms = out.feedback[0].double().pow(2).mean(-1).sqrt().numpy()
        rms[dead] = np.nan
        self.state[rows, d] = rms
        self.drafts[rows, d] = out.target_ids[0].numpy()

    def context_step(self, aux: torch.Tensor, tokens: torch.Tensor, embed: torch.Tensor | None, n_ctx: int, chunk: int
                     ) -> tuple[list[tuple[torch.Tensor, ...]], tuple[torch.Tensor, torch.Tensor]]:
        """Step 0: the context entries (features p, token p+1), `chunk` positions at a time, recording each
        anchor's first draft. (each layer's context keys, values and positions, (each anchor's fed-back state,
        drafted id))."""
        import torch

        from ..model.reference import ChainCache, StepOutput, prefill

        at, cache, tok_rows = self.at, ChainCache(), self.rows(tokens)[0]
        first_fb, first_ids = torch.zeros(len(at), self.model.a.hidden_size), torch.zeros(len(at), dtype=torch.long)
        for s in range(0, n_ctx, chunk):
            e = min(n_ctx, s + chunk)
            out = prefill(self.model, aux[:, s:e], tok_rows[None, s + 1:e + 1], torch.arange(s, e)[None], cache, embed)
            sel = ((at >= s) & (at < e)).nonzero().flatten()
            rows = at[sel] - s
            kept = self.take(rows)
            if len(sel):
                sub = StepOutput(out.logits[:, rows], out.feedback[:, rows], out.target_ids[:, rows],
                                 out.pre_norm[:, rows])
                self.record(sel, 0, kept, e, torch.zeros(len(sel), e, dtype=torch.bool), sub,
                            torch.ones(len(sel), dtype=torch.bool))
                first_fb[sel], first_ids[sel] = sub.feedback[0], sub.target_ids[0]
        return [(kv.k, kv.v, kv.positions) for kv in cache.layers], (first_fb, first_ids)  # type: ignore[misc]

    def chain_steps(self, context: list[tuple[torch.Tensor, ...]], first: tuple[torch.Tensor, torch.Tensor],
                    table: torch.Tensor, idx: torch.Tensor, n_ctx: int) -> int:
        """Chain steps 1..depth-1 from the anchors `idx` (drafted together, each seeing the context up to its
        anchor and its own chain); returns how many chains were cut at a token without an embedding row."""
        import torch
        import torch.nn.functional as F

        from ..model.reference import LayerKV

        G, at = len(idx), self.at[idx]
        kvs = [LayerKV(k, v, p) for k, v, p in context]
        hidden, ids = first[0][idx][None], first[1][idx][None]
        alive, cut = torch.ones(G, dtype=torch.bool), 0
        causal = torch.arange(n_ctx)[None, :] <= at[:, None]
        for d in range(1, self.depth):
            rows, ok = self.rows(ids[0])
            cut += int((alive & ~ok).sum())
            alive &= ok
            mask = torch.cat([causal] + [torch.eye(G, dtype=torch.bool)] * d, dim=1)
            out = self.model(hidden, F.embedding(rows[None], table), (at + d)[None], kvs, mask)
            self_cols = torch.cat([torch.zeros(G, n_ctx, dtype=torch.bool)] + [torch.eye(G, dtype=torch.bool)] * d, 1)
            self.record(idx, d, self.take(), n_ctx, self_cols, out, alive)
            hidden, ids = out.feedback, out.target_ids
        return cut


# -------------------------------------------------------------------------------------- statistics

def bootstrap(values: list[np.ndarray], reps: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Mean over prompts of the mean over anchors, with a 95 % interval from resampling prompts and then
    anchors within each (values: one 1-D array per prompt, NaN = missing)."""

    vals = [v[~np.isnan(v)] for v in values]
    vals = [v for v in vals if len(v)]
    if not vals:
        return math.nan, math.nan, math.nan
    point = float(np.mean([v.mean() for v in vals]))
    rng = np.random.default_rng(seed)
    P, width = len(vals), max(len(v) for v in vals)
    pad = np.full((P, width), np.nan)
    for i, v in enumerate(vals):
        pad[i, : len(v)] = v
    n = np.array([len(v) for v in vals])
    pick = rng.integers(0, P, size=(reps, P))
    inner = (rng.random((reps, P, width)) * n[pick][..., None]).astype(np.int64)
    cols = np.arange(width)[None, None, :] < n[pick][..., None]
    sample = np.where(cols, pad[pick[..., None], inner], np.nan)
    stats = np.nanmean(np.nanmean(sample, axis=2), axis=1)
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return point, float(lo), float(hi)


def summarize(chains: list[Chains], depth: int, loop: LoopCounts | None, reps: int, seed: int) -> list[dict[str, Any]]:
    """The `depths` objects: per depth, each metric's mean, its 95 % interval, its spread over heads,
    and the loop's per-position acceptance where depth < k."""

    out = []
    for d in range(depth):
        row: dict[str, Any] = {"depth": d}
        for m in METRICS:
            # a cut chain is NaN in every head, so the plain head mean keeps it missing
            per_prompt = [c.state_rms[:, d] if m == "state_rms" else c.masses[m][:, d].mean(-1) for c in chains]
            mean, lo, hi = bootstrap(per_prompt, reps, seed + d)
            row[m], row[f"{m}_ci"] = _f(mean), [_f(lo), _f(hi)]
        for m in ("sink_mass", "self_mass"):
            by_head = np.stack([_nanmean(c.masses[m][:, d], 0) for c in chains])  # [prompts, heads]
            row[f"{m}_by_head"] = [_f(x) for x in _nanmean(by_head, 0)]
        sink0 = out[0]["sink_mass"] if out else row["sink_mass"]
        row["sink_retention"] = _f(row["sink_mass"] / sink0) if sink0 and row["sink_mass"] is not None else None
        row["drift_ratio"] = (_f(row["self_mass"] / row["sink_mass"])
                              if row["sink_mass"] and row["self_mass"] is not None else None)
        row["anchors"] = int(sum(np.sum(~np.isnan(c.state_rms[:, d])) for c in chains))
        rates = _per_position(loop)
        row["acceptance_rate"] = _f(rates[d]) if d < len(rates) else None
        out.append(row)
    return out


def _per_position(loop: LoopCounts | None) -> list[float]:
    return [a / loop.num_drafts for a in loop.accepted_per_pos] if loop and loop.num_drafts else []


def _nanmean(x: np.ndarray, axis: int) -> np.ndarray:
    """Mean over non-NaN entries (NaN where there are none), without numpy's empty-slice warning."""

    ok = ~np.isnan(x)
    n = ok.sum(axis)
    total = np.where(ok, x, 0.0).sum(axis)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def _f(x: float) -> float | None:
    x = float(x)
    return None if math.isnan(x) else round(x, 6)  # JSON has no NaN; 6 places is far below the intervals


# ------------------------------------------------------------------------------------------ report

@dataclass
class DriftRun:
    drafter: str
    context_length: int | None
    template: str | None
    prompts: int
    depths: list[dict[str, Any]]
    loop: LoopCounts | None  # the reference speculative loop of the same run (smoke --engine reference's)
    aux_chunk_rms: list[float]
    fc_rms: float | None
    chains_cut: int = 0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        loop = self.loop
        per_request = [r.mean_acceptance_length for r in loop.per_request if r.num_drafts] if loop else []
        return {
            "drafter": self.drafter, "context_length": self.context_length, "template": self.template,
            "prompts": self.prompts, "depths": self.depths,
            "mean_acceptance_length": loop.mean_acceptance_length if loop and loop.num_drafts else None,
            "mean_acceptance_length_per_request": sum(per_request) / len(per_request) if per_request else None,
            "num_drafts": loop.num_drafts if loop else None,
            "num_accepted_tokens": loop.num_accepted_tokens if loop else None,
            "per_position_acceptance": _per_position(loop) if loop else None,
            "aux_chunk_rms": self.aux_chunk_rms, "fc_rms": self.fc_rms, "chains_cut": self.chains_cut,
            "notes": self.notes,
        }


@dataclass
class DriftReport(Result):
    SCHEMA, COMMAND = "eaglectl.drift/1", "drift"

    target: str | None
    states: str | None
    protocol: Protocol
    depth: int
    k: int
    max_tokens: int
    prompts: str
    runs: list[DriftRun]
    versions: dict[str, Any]
    acceptance_note: str | None = None
    plot: str | None = None
    exit_code: int = 0

    def payload(self) -> dict[str, Any]:
        main = self.runs[0].to_json()
        return {
            "protocol": self.protocol.name, "protocol_note": self.protocol.note,
            "sink_tokens": self.protocol.sink_tokens, "recent_window": self.protocol.recent_window,
            "anchor_every": self.protocol.anchor_every, "depth": self.depth, "num_speculative_tokens": self.k,
            "max_tokens": self.max_tokens, "prompts": self.prompts, "target": self.target, "states": self.states,
            "drafter": main["drafter"], "depths": main["depths"],
            "mean_acceptance_length": main["mean_acceptance_length"],
            "mean_acceptance_length_per_request": main["mean_acceptance_length_per_request"],
            "acceptance_note": self.acceptance_note,
            "runs": [r.to_json() for r in self.runs], "versions": self.versions, "plot": self.plot,
        }


# --------------------------------------------------------------------------------------------- run

@dataclass
class Sequence:
    tokens: list[int]
    aux: torch.Tensor  # [1, T, W] at the drafter's aux ids
    anchors: list[int]


def anchor_positions(start: int, end: int, every: int) -> list[int]:
    return list(range(max(0, start), end + 1, every))


def run(req: DriftRequest, progress: Progress = passthrough) -> DriftReport:
    """Measure drift for each drafter under each condition (context length × template)."""
    import torch

    from ..measure.probe import measured_layers

    drafters, target, states, prompts, context_lengths, templates = (req.drafters, req.target, req.states,
                                                                     req.prompts, req.context_lengths, req.templates)
    depth, k, max_tokens, reps, seed, plot = req.depth, req.k, req.max_tokens, req.bootstrap_reps, req.seed, req.plot
    given = {"sink_tokens": req.sink_tokens, "recent_window": req.recent_window, "anchor_every": req.anchor_every}
    proto = replace(PROTOCOLS[req.protocol], **{k: v for k, v in given.items() if v is not None})
    if not drafters:
        raise UsageError("name at least one drafter")
    if context_lengths and templates:
        raise UsageError("--context-lengths and --templates are separate axes: run one at a time")
    if (target is None) == (states is None):
        raise UsageError("pass --target (runs the target and the acceptance loop) or --states (a capture)")
    if states is not None and (context_lengths or templates):
        raise UsageError("--context-lengths and --templates build prompts for the target: with --states the "
                         "capture's requests are the workload")
    opened = [open_drafter(d) for d in drafters]
    t = Target.open(target, states, progress=progress)
    assert t is not None
    check_outputs({"--plot": plot}, local_inputs(*opened, t, prompts))
    from ..model.loader import load_reference
    loaded = [load_reference(o) for o in opened]
    # the layers each drafter reads: the one measured reading (probe.measure) when it decides them, else the files'
    layers = {id(d): measured_layers(o, t)[0] or d.spec.capture_ids(t.num_layers)  # type: ignore[arg-type]
              for o, d in zip(opened, loaded, strict=True)}
    runs: list[DriftRun] = []
    note = None
    if target is not None:
        conditions = _conditions(t.model().tokenizer, prompts, req.num_prompts, max_tokens, k, seed, context_lengths,
                                 templates, req.system_prompt, t.model().vocab_size)
        t.need({i for ids in layers.values() for i in ids})
        for (length, template, prompt_ids), d in progress([(c, d) for c in conditions for d in loaded],
                                                          label="drift"):
            runs.append(_target_run(d, t, prompt_ids, length, template, proto, depth, k, max_tokens,
                                    reps, seed, layers[id(d)]))
    else:
        assert t.states is not None
        note = "no acceptance loop: the target does not run with --states (run drift with --target for it)"
        for d in progress(loaded, label="drift"):
            runs.append(_states_run(d, t.states, proto, depth, max_tokens, req.num_prompts, reps, seed,
                                    layers[id(d)]))
    versions = {"eaglectl_version": __version__, "torch_version": torch.__version__,
                "python": sys.version.split()[0]}
    rep = DriftReport(target, states, proto, depth, k, max_tokens, prompts if states is None else states, runs,
                      versions, note)
    if plot:
        from .plot import plot_drift

        plot_drift(rep.to_json(), plot)
        rep.plot = plot
    return rep


def _conditions(tokenizer: Any, prompts: str, num_prompts: int, max_tokens: int, k: int, seed: int,
                context_lengths: tuple[int, ...], templates: tuple[str, ...],
                system_prompt: str, vocab: int | None = None) -> list[tuple[int | None, str | None, list[list[int]]]]:
    def load(length: int | None) -> list[list[int]]:
        room = (length or 0) + max_tokens + k + 2
        return load_prompts(prompts, tokenizer, count=num_prompts, max_tokens=max_tokens,
                            max_model_len=max(1024, room), k=k, seed=seed, length=length, vocab=vocab).prompts

    if context_lengths:
        return [(n, None, load(n)) for n in context_lengths]
    if templates:
        return [(None, t, template_prompts(prompts, tokenizer, t, system_prompt, num_prompts, vocab))
                for t in templates]
    return [(None, None, load(None))]


def _target_run(d: LoadedDrafter, tgt: Target, prompt_ids: list[list[int]], length: int | None,
                template: str | None, proto: Protocol, depth: int, k: int, max_tokens: int, reps: int,
                seed: int, ids: tuple[int, ...]) -> DriftRun:
    """The acceptance loop (smoke --engine reference's, replayed on the target's greedy continuations),
    then chains from anchors inside each answer, on the same continuations' states, at boundaries `ids`."""
    import torch

    from ..model.replay import replay

    model = d.build(torch.float32, "cpu")
    embed = None if d.has_embed else tgt.model().embedding().float()
    conts = tgt.continuations(prompt_ids, max_tokens=max_tokens, k=k, boundaries=ids)
    loop = replay(model, conts, aux_ids=ids, embed=embed)
    seqs = []
    for prompt, c in zip(prompt_ids, conts, strict=True):
        tokens = prompt + c.output
        aux = c.aux(ids)[None, : len(tokens)]
        # the loop's first chain is drafted from position len(prompt) - 1; anchors step through the answer
        seqs.append(Sequence(tokens, aux, anchor_positions(len(prompt) - 1, len(tokens) - 2, proto.anchor_every)))
    return _measure(d, model, seqs, proto, depth, reps, seed, embed, None, loop, (length, template), [])


def _states_run(d: LoadedDrafter, captured: States, proto: Protocol, depth: int, max_tokens: int, count: int,
                reps: int, seed: int, ids: tuple[int, ...] | None = None) -> DriftRun:
    """Chains from anchors in the last `max_tokens` positions of each captured request, one request in memory
    at a time (a first pass collects the embedding rows a drafter without its own table needs)."""
    import torch

    from ..model.blocks import owned

    model = d.build(torch.float32, "cpu")
    ids = ids or d.spec.capture_ids(captured.num_layers)  # type: ignore[arg-type]  # the measured layers when given
    fetch = ids + ((0,) if not d.has_embed and 0 not in ids else ())
    notes: list[str] = []
    embed = token_rows = None
    if not d.has_embed:  # the target's rows of every token the capture saw, read off boundary 0
        why = captured.embedding_source()
        if why is not None:
            raise IncompatibleDrafterError(f"{captured.root}: the drafter ships no embedding table and {why}",
                                           hint="capture boundary 0 too, or pass --target for its embedding table")
        found: dict[int, np.ndarray] = {}
        for r in captured.requests(fetch, slice(0, count), vocab=d.args.vocab_size):
            for t, tok in enumerate(r.token_ids.tolist()):
                if tok not in found:
                    found[tok] = np.asarray(r.hidden[t, fetch.index(0)], dtype=np.float32)
        if found:
            order = sorted(found)
            lookup = np.full(order[-1] + 1, -1, dtype=np.int64)
            lookup[order] = np.arange(len(order))
            embed = torch.from_numpy(np.stack([found[t] for t in order]))
            token_rows = torch.from_numpy(lookup)
        notes.append("embedding rows read off the capture's boundary 0; a chain stops at a token the capture "
                     "never saw (chains_cut)")

    def sequences() -> Iterator[Sequence]:
        for r in captured.requests(fetch, slice(0, count), vocab=d.args.vocab_size):
            T = len(r.token_ids)
            aux = owned(r.hidden[:, : len(ids)], np.float32).reshape(1, T, -1)
            anchors = anchor_positions(T - 1 - max_tokens, T - 2, proto.anchor_every)
            if anchors:
                yield Sequence(r.token_ids.tolist(), aux, anchors)

    run = _measure(d, model, sequences(), proto, depth, reps, seed, embed, token_rows, None, (None, None), notes)
    if not run.prompts:
        raise InvalidStatesError(f"{captured.root}: no captured request has 2 tokens or more: too few states")
    return run


def _measure(d: LoadedDrafter, model: Drafter, seqs: Iterable[Sequence], proto: Protocol, depth: int, reps: int,
             seed: int, embed: torch.Tensor | None, token_rows: torch.Tensor | None, loop: LoopCounts | None,
             condition: tuple[int | None, str | None], notes: list[str]) -> DriftRun:
    """One drafter's chains over the sequences of one condition (context length, template)."""
    import torch

    length, template = condition

    chains = []
    chunk_sq = torch.zeros(d.args.num_aux, dtype=torch.float64)
    fc_sq, n, count = 0.0, 0, 0
    for s in seqs:
        count += 1
        tokens = torch.tensor([s.tokens])
        chains.append(measure_chains(model, s.aux, tokens, s.anchors, depth, sink_tokens=proto.sink_tokens,
                                     recent_window=proto.recent_window, embed=embed, token_rows=token_rows))
        with torch.no_grad():
            parts = s.aux[0].double().split(d.args.target_hidden_size, dim=-1)
            chunk_sq += torch.stack([p.pow(2).mean(-1).sum() for p in parts])
            fc_sq += float(model.combine(s.aux)[0].double().pow(2).mean(-1).sum())
        n += s.aux.shape[1]
    cut = sum(c.cut for c in chains)
    if not count:
        return DriftRun(d.source, length, template, 0, [], loop, [], None, 0, notes)
    return DriftRun(d.source, length, template, count, summarize(chains, depth, loop, reps, seed), loop,
                    [_f(math.sqrt(x / n)) for x in chunk_sq.tolist()], _f(math.sqrt(fc_sq / n)), cut, notes)
