"""The target of one command, run: its weights loaded once and its states computed once (`Target`).

`Target` wraps a `TargetCheckpoint` for one command: the HF model is loaded at most once, the states over the
measurement text are captured in one forward pass at every boundary the command declared (`need`), and greedy
continuations of evaluation prompts are decoded once and replayed for every drafter and reading
(model/replay.py). A capture (`--states DIR`) stands in for running it. torch is only imported when the target runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import counters as loads
from ..errors import IncompatibleDrafterError, InvalidStatesError
from ..io.states import Request, States, open_states
from ..measure.workload import measurement_text, text_token_ids
from ..progress import Progress, passthrough

if TYPE_CHECKING:
    import torch

    from ..model.hf import HFModel
    from ..model.replay import Continuation

from ..checkpoint.target import TargetCheckpoint, open_target, target_of_capture


class MemoryStates(States):
    """States computed in this process (the target's run over the measurement text), read like a capture."""

    def __init__(self, description: str, layer_ids: tuple[int, ...], requests: list[Request],
                 target: TargetCheckpoint, num_layers: int, hidden_size: int, vocab_size: int) -> None:
        super().__init__(Path(description), {"target_config": target.config.data}, layer_ids, [], num_layers,
                         hidden_size, vocab_size)
        self.held = requests
        self.description = description

    def requests(self, ids: tuple[int, ...] | None = None, which: slice = slice(None),
                 vocab: int | None = None) -> Iterator[Request]:
        """The held requests (computed here, from the target's own run: nothing to check)."""
        if ids is not None:
            self.require(ids)
        index = [self.layer_ids.index(i) for i in ids] if ids is not None else None
        for r in self.held[which]:
            yield Request(r.name, r.token_ids, r.hidden[:, index] if index is not None else r.hidden, r.target_argmax)

    @property
    def labels_are(self) -> str:
        return "target"

    def embedding_source(self) -> str | None:
        return None if 0 in self.layer_ids else "the run captured no boundary 0"


# positions of a captured continuation where the prefill's argmax may differ from the decoded token: near ties
# in reduced precision (a decode and a prefill sum in other orders); beyond it, the tokens were not decoded greedily
GREEDY_SLACK = 0.05


@dataclass
class Target:
    """The target of one command, as the module says (docs/big-targets.md#one-pass)."""

    checkpoint: TargetCheckpoint
    states: States | None = None
    progress: Progress = passthrough
    text: str | None = None  # the calibration text (default: bundled)
    dtype: str = "float32"  # the precision the target runs at
    _model: HFModel | None = None
    _boundaries: set[int] = field(default_factory=set)
    _tokens: int = 0
    _text_states: MemoryStates | None = None
    _continuations: dict[tuple[int, ...], Continuation] = field(default_factory=dict)
    _table: torch.Tensor | None = None  # the embedding table, made once (from a capture it reads every request)
    _prompts: list[list[int]] | None = None  # the prompts a capture continued, read once

    @classmethod
    def open(cls, target: str | None, states: str | None = None, *, progress: Progress = passthrough,
             text: str | None = None, dtype: str = "float32") -> Target | None:
        """`--target` (its files; runnable when they allow), else what `--states` records of it, else None."""
        captured = open_states(states) if states else None
        if target:
            return cls(open_target(target), captured, progress, text, dtype)
        return cls(target_of_capture(captured), captured, progress, text, dtype) if captured is not None else None

    @property
    def source(self) -> str:
        return self.checkpoint.source

    @property
    def num_layers(self) -> int | None:
        return self.checkpoint.num_layers if self.states is None else self.states.num_layers

    def why_not_runnable(self) -> str | None:
        """Why this target cannot be run here (None: it can); a capture stands in for running it."""
        if self.states is not None:
            return f"{self.states.root}: the capture stands in for the target, which is not run"
        return self.checkpoint.why_not_runnable()

    def why_not_measurable(self) -> str | None:
        """Why the probe cannot measure a drafter on this target (None: it can: weights and a tokenizer, or a
        capture of its states). Asked before the probe is imported: torch and transformers load only for work."""
        return self.why_not_runnable() if self.states is None else None

    @property
    def runnable(self) -> bool:
        """It can be run on text and prompts (weights and a tokenizer), or stands in as a capture? The former."""
        return self.why_not_runnable() is None

    @property
    def replays(self) -> bool:
        """Acceptance can be replayed on it: it runs, or its capture holds greedy continuations."""
        return self.runnable or (self.states is not None and self.states.continuation is not None)

    def captured_prompts(self) -> list[list[int]]:
        """The prompts a capture of greedy continuations continued, in request order."""
        assert self.states is not None and self.states.continuation is not None
        if self._prompts is None:
            lengths = self.states.continuation.prompt_lengths
            self._prompts = [r.token_ids[:n].tolist() for r, n in zip(
                self.states.requests(self.states.layer_ids[:1]), lengths, strict=True)]
        return self._prompts

    def embedding_table(self) -> torch.Tensor:
        """The target's input embedding table (fp32), made once per command: from its weights, else, with only a
        capture, the rows of the tokens seen read off boundary 0 (unseen tokens: zero rows, never drafted from)."""
        if self._table is None:
            self._table = self._embedding_table()
        return self._table

    def _embedding_table(self) -> torch.Tensor:
        import torch

        from ..model.blocks import owned

        if self.states is None:
            return self.model().embedding().float()
        if self.checkpoint.ckpt.tensor_file:
            name = self.checkpoint.table_name("embed_tokens")
            if name is not None:
                return torch.from_numpy(np.asarray(self.checkpoint.ckpt.read(name), dtype=np.float32).copy())
        why = self.states.embedding_source()
        if why is not None:
            raise IncompatibleDrafterError(f"the drafter ships no embedding table and {why}",
                                           hint="capture with boundary 0 (--layers auto does), or pass --target "
                                                "with weights")
        rows: dict[int, np.ndarray] = {}
        for req in self.states.requests((0,)):
            for t, h in zip(req.token_ids.tolist(), req.hidden[:, 0], strict=False):
                rows.setdefault(int(t), h)
        table = torch.zeros(max(rows) + 1, len(next(iter(rows.values()))))
        for t, h in rows.items():
            table[t] = owned(h, np.float32)
        return table

    @property
    def has_states(self) -> bool:
        """Its states can be had: a capture, or weights to run (without a tokenizer, on the text's bytes)."""
        return self.states is not None or bool(self.checkpoint.ckpt.tensor_file)

    def model(self) -> HFModel:
        """The HF model, loaded on first use only."""
        if self._model is None:
            from ..model.hf import load_model
            from ..model.loader import DTYPES

            for _ in self.progress([0], label=f"loading the target {self.source}", total=1):
                self._model = load_model(self.source, dtype=DTYPES[self.dtype], checkpoint=self.checkpoint)
        assert self._model is not None
        return self._model

    def need(self, boundaries: Iterable[int] = (), tokens: int = 0) -> None:
        """Declare boundaries (and a text length) the command will read, before the first capture, so one
        forward pass serves every measurement."""
        self._boundaries |= set(boundaries)
        self._tokens = max(self._tokens, tokens)

    def text_states(self, boundaries: Iterable[int], tokens: int) -> States:
        """The target's states over the measurement text at `boundaries` (>= `tokens` positions, target argmax
        labels): the capture given with --states, else one forward pass of the model (again only when a
        boundary or a length was not declared before the first one)."""
        if self.states is not None:
            return self.states
        wanted = set(boundaries)
        held = self._text_states
        if held is None or not wanted <= set(held.layer_ids) or len(held.held[0].token_ids) < tokens:
            self.need(wanted, tokens)
            self._text_states = held = self._capture_text()
        return held

    def _capture_text(self) -> MemoryStates:
        import torch

        from ..model.hf import forward

        model = self.model()
        head, tail, how = measurement_text(self.text)
        ids = text_token_ids(model.tokenizer, model.vocab_size, head + tail)[: max(self._tokens, 1)]
        wanted = tuple(sorted(self._boundaries))
        loads.count("target_text")
        for _ in self.progress([0], label=f"target: {len(ids)} tokens of {how}", total=1):
            with torch.no_grad():
                logits, aux = forward(model, torch.tensor([ids]), wanted)
        hidden = aux[0].reshape(len(ids), len(wanted), -1).numpy()
        request = Request("text", np.asarray(ids, dtype=np.int64), hidden, logits[0].argmax(-1).numpy())
        calibration = len(text_token_ids(model.tokenizer, model.vocab_size, head))
        desc = f"target {self.source}: {len(ids)} tokens of {how}" + (
            "" if model.tokenizer is not None else " (its bytes as token ids: the target has no tokenizer)")
        out = MemoryStates(desc, wanted, [request], self.checkpoint, model.num_layers, model.hidden_size,
                           model.vocab_size)
        out.meta["calibration_tokens"] = calibration
        return out

    def continuations(self, prompts: list[list[int]], *, max_tokens: int, k: int, boundaries: Iterable[int]
                      ) -> list[Continuation]:
        """Each prompt's greedy continuation (max_tokens + k tokens) with the states at `boundaries`: decoded
        once per prompt for the command, whatever the drafter or reading (model/replay.py)."""
        from ..model.replay import continue_greedily, with_states

        if self.states is not None and self.states.continuation is not None:
            return self._captured(prompts, max_tokens, k, set(boundaries) | self._boundaries)
        if self.states is not None or not self.runnable:
            raise IncompatibleDrafterError(f"{self.source}: acceptance needs a runnable target "
                                           f"({self.why_not_runnable()})",
                                           hint="pass --target with weights and a tokenizer, or --states DIR of a "
                                                "capture made with --max-tokens (greedy continuations)")
        wanted = set(boundaries) | self._boundaries
        held = self._continuations

        def long_enough(c: Continuation | None) -> bool:
            return c is not None and c.max_tokens >= max_tokens and c.max_tokens + c.k >= max_tokens + k

        todo = [p for p in dict.fromkeys(map(tuple, prompts)) if not long_enough(held.get(p))]
        if todo:
            loads.count("target_continuations")
            loads.count("target_prompts_decoded", len(todo))
            made = continue_greedily(self.model(), [list(p) for p in todo], max_tokens=max_tokens, k=k,
                                     boundaries=tuple(sorted(wanted)), progress=self.progress)
            held.update(zip(todo, made, strict=True))
        short = [held[tuple(p)] for p in dict.fromkeys(map(tuple, prompts)) if not wanted <= set(held[tuple(p)].states)]
        if short:  # a boundary nobody declared: one more forward over the same tokens, no decoding
            loads.count("target_continuation_states")
            with_states(self.model(), short, tuple(sorted(wanted | set(short[0].states))))
        return [held[tuple(p)].cut(max_tokens, k) for p in prompts]

    def _captured(self, prompts: list[list[int]], max_tokens: int, k: int, wanted: set[int]) -> list[Continuation]:
        """The capture's greedy continuations of `prompts` at the boundaries `wanted`, read once per command (again
        only for a boundary not read before), cut to `max_tokens` + `k`."""
        import torch

        from ..model.replay import Continuation

        states, held = self.states, self._continuations
        assert states is not None and states.continuation is not None
        c = states.continuation
        if max_tokens > c.max_tokens or max_tokens + k > c.max_tokens + c.k:
            raise IncompatibleDrafterError(
                f"{states.root}: the capture continues each prompt by {c.max_tokens} + {c.k} tokens, fewer than the "
                f"{max_tokens} + {k} asked", hint=f"capture again with --max-tokens {max_tokens} -k {k}")
        ids = tuple(sorted(wanted | {b for h in held.values() for b in h.states}))
        if not held or not set(ids) <= set(next(iter(held.values())).states):
            loads.count("capture_continuations")
            held.clear()
            for req, P in zip(states.requests(ids), c.prompt_lengths, strict=True):
                T = P + c.max_tokens + c.k
                where = str(states.root / req.name)
                if len(req.token_ids) != T:
                    raise InvalidStatesError(f"{where}: {len(req.token_ids)} tokens, not the prompt's {P} and the "
                                             f"continuation's {c.max_tokens} + {c.k} that capture.json records",
                                             file=where, tensor="token_ids")
                if req.target_argmax is not None:  # a continuation is the target's own greedy tokens
                    off = req.target_argmax[P - 1: T - 1] != req.token_ids[P:T]
                    if off.mean() > GREEDY_SLACK:
                        raise InvalidStatesError(
                            f"{where}: the continuation differs from the target's greedy next token at "
                            f"{int(off.sum())} of {T - P} positions: not a greedy continuation", file=where,
                            tensor="token_ids")
                hidden = torch.from_numpy(np.asarray(req.hidden[: T - c.k], dtype=np.float32).copy())
                held[tuple(req.token_ids[:P].tolist())] = Continuation(
                    P, torch.from_numpy(req.token_ids.copy()), {b: hidden[:, j] for j, b in enumerate(ids)},
                    c.max_tokens, c.k)
        missing = [i for i, p in enumerate(prompts) if tuple(p) not in held]
        if missing:
            raise IncompatibleDrafterError(f"{states.root}: the capture holds no continuation of prompt "
                                           f"{missing[0]} of the {len(prompts)} asked",
                                           hint="capture those prompts with --max-tokens, or pass --target")
        return [held[tuple(p)].cut(max_tokens, k) for p in prompts]
