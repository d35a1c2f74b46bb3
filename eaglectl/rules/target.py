"""Against `--target`: vocab, widths, aux ids for its depth, RoPE, verifier name, table fingerprints; and the
target pre-flight: whether vLLM captures EAGLE-3 aux states from the target's architecture at all."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..engines.facts import TARGET_TABLE_RELEASES, release_key, target_capture
from ..engines.target_support import TARGET_ASSUMED, TargetSupport, captures_in
from ..engines.target_support import said as how_known
from ..io.hub import parse_hub_id
from ..io.safetensors import TensorInfo, decodable
from ..spec import default_aux_ids
from . import catalogue as rule
from .base import Context, check


@check
def against_target(ctx: Context) -> None:
    t = ctx.target
    if t is None:
        return
    spec = ctx.spec
    tv, th, L = t.vocab_size, t.hidden_size, t.num_layers
    support = ctx.readings.target if ctx.readings is not None else None
    counted = ""
    if support is not None and support.asked and support.num_layers is not None and support.num_layers != L:
        # the layers vLLM builds decide which boundaries exist (its own count of the target's config)
        L, counted = support.num_layers, f", as vLLM {support.version} counts its layers"
    vocab = spec.vocab_size
    if "t2d" in ctx.view and len(ctx.view.shape("t2d") or ()) == 1:
        vocab = ctx.view.shape("t2d")[0]  # type: ignore[index]
    if tv is not None and vocab is not None and vocab != tv:
        ctx.emit(rule.TARGET_VOCAB_MISMATCH, f"drafter vocab {vocab}, target vocab_size {tv}", ctx.at("vocab_size"))
    if th is not None and spec.aux_width is not None and spec.aux_width != th:
        ctx.emit(rule.TARGET_HIDDEN_MISMATCH, f"aux width {spec.aux_width}, target hidden_size {th}",
                 ctx.at("target_hidden_size"))
    if L is not None:
        ids = spec.aux_layer_ids
        if ids is not None:
            top = L if spec.aux_convention == "boundary" else L - 1
            bad = [i for i in ids if i > top]
            if bad:
                ctx.emit(rule.TARGET_AUX_RANGE, f"aux ids {bad} exceed {top} ({spec.aux_convention} convention, "
                         f"{L}-layer target{counted})", ctx.where)
        elif spec.num_aux_hidden_states:
            default = default_aux_ids(L, "boundary")
            if len(default) < spec.num_aux_hidden_states:
                ctx.emit(rule.TARGET_AUX_DEFAULT_COLLISION, f"default ids for {L} layers are {list(default)}, "
                         f"fc expects {spec.num_aux_hidden_states} states", ctx.where)
    t_theta = t.rope_theta
    d_theta = spec.rope_theta or 10000.0
    if t_theta is not None and t_theta != d_theta:
        ctx.emit(rule.TARGET_ROPE_DIFFERS, f"drafter rope_theta {d_theta:g}, target {t_theta:g}", ctx.where)
    verifier = ctx.config.str("speculators_config.verifier.name_or_path")
    # only a Hub id names a model anywhere; local paths in a published config are placeholders
    if verifier and parse_hub_id(verifier) and not same_model(verifier, t.hub_id or t.source):
        ctx.emit(rule.TARGET_VERIFIER_MISMATCH, f"verifier '{verifier}', --target '{t.source}'", ctx.where)
    _fingerprint(ctx)


@check
def target_capture_support(ctx: Context) -> None:
    """vLLM captures aux states only from a target class that implements SupportsEagle3: asked of its registry
    where vLLM is at hand, else eaglectl's table (engines/target_support.py). Runs only with a target."""
    s = ctx.readings.target if ctx.readings is not None else None
    if ctx.target is None or s is None:
        return
    s = for_release(s, ctx.engine_version)
    if s.supports_eagle3 is None:
        ctx.emit(rule.TARGET_EAGLE3_UNDECIDED, f"{s.architecture or 'the target'}: whether vLLM captures EAGLE-3 "
                 f"aux states from it is undecided ({s.error or 'no answer'})", ctx.target.source)
        return
    if s.supports_eagle3:
        return  # a hybrid target vLLM supports: nothing concrete differs in what it captures (docs/engines.md)
    kind = {"hybrid": "; hybrid attention/recurrent", "recurrent": "; recurrent, no attention"}.get(s.kind or "", "")
    cls = f"{s.model_class or s.architecture} (its class" + (f", {s.module}" if s.module else "") + f"{kind})"
    how = how_known(s.basis, s.version, f"assumed: eaglectl's table of vLLM {TARGET_TABLE_RELEASES}, not asked")
    if s.later:
        later = f"; from vLLM {s.later} it does (eaglectl's table): serve that release"
    elif s.since is None and target_capture(s.architecture) is not None:
        later = f"; no vLLM release of {TARGET_TABLE_RELEASES} captures from it (eaglectl's table): another target"
    else:
        later = ""
    ctx.emit(rule.TARGET_EAGLE3_UNSUPPORTED, f"in vLLM {s.version} ({how}), {cls} does not implement "
             f"SupportsEagle3: `vllm serve` fails with 'Model does not support EAGLE3 interface'{later}",
             ctx.target.source)


def for_release(s: TargetSupport, engine_version: str | None) -> TargetSupport:
    """The answer for the release the report is for (--engine-version): the table's at that release when it is
    another release than the one answered and the table knows the architecture."""
    wanted, answered = release_key(engine_version), release_key(s.version)
    if wanted is None or (answered is not None and wanted[:2] == answered[:2]):
        return s
    row = target_capture(s.architecture)
    ok = captures_in(row, engine_version) if row is not None else None
    if row is None or ok is None:
        return s
    return replace(s, model_class=row.model_class, module=row.module, supports_eagle3=ok, kind=row.kind,
                   version=engine_version, basis=TARGET_ASSUMED, since=row.since, error=None)


def same_model(a: str, b: str) -> bool:
    """Two model references name the same model (repo id, path or hf:// URI, ignoring revisions)."""

    def norm(s: str) -> str:
        return s.rstrip("/").removeprefix("hf://").split("@")[0].rsplit("/", 2)[-1].lower()

    return a == b or norm(a) == norm(b)


def _decodable(*infos: TensorInfo) -> bool:
    return all(decodable(i.dtype) for i in infos)


def _fingerprint(ctx: Context) -> None:
    """Compare a few rows of the drafter's tables with the target's (reads rows, not tensors)."""
    t = ctx.target
    assert t is not None
    if not t.ckpt.tensor_file:
        return
    t_embed, t_head = t.table_name("embed_tokens"), t.table_name("lm_head")
    parts = []
    view = ctx.view
    if ctx.spec.has_embed_tokens and t_embed and len(view.shape("embed_tokens.weight") or ()) == 2 and \
            _decodable(view.info("embed_tokens.weight"), t.ckpt.tensors[t_embed]):
        rows_n = view.shape("embed_tokens.weight")[0]  # type: ignore[index]
        if rows_n == t.ckpt.tensors[t_embed].shape[0] and rows_n > 0:
            rows = sorted({0, rows_n // 2, rows_n - 1})
            same = np.array_equal(view.ckpt.read_rows(view.stored["embed_tokens.weight"], rows),
                                  t.ckpt.read_rows(t_embed, rows))
            parts.append("embed_tokens " + ("identical to the target's" if same
                                            else "differs from the target's (trained or another target)"))
    d_shape = view.shape("lm_head.weight")
    if ctx.spec.has_lm_head and t_head and d_shape and len(d_shape) == 2 and d_shape[0] > 0 and \
            _decodable(view.info("lm_head.weight"), t.ckpt.tensors[t_head]):
        t_shape = t.ckpt.tensors[t_head].shape
        draft_rows = sorted({0, d_shape[0] // 2, d_shape[0] - 1})
        target_rows = draft_rows
        d2t = view.info("d2t") if "d2t" in view else None
        if d2t is not None and d2t.dtype.startswith("I") and len(d2t.shape) == 1 and d2t.shape[0] == d_shape[0]:
            offsets = ctx.array("d2t")
            target_rows = [int(r + offsets[r]) for r in draft_rows]
        if len(t_shape) == 2 and d_shape[1] == t_shape[1] and all(0 <= r < t_shape[0] for r in target_rows):
            same = np.array_equal(view.ckpt.read_rows(view.stored["lm_head.weight"], draft_rows),
                                  t.ckpt.read_rows(t_head, target_rows))
            parts.append("lm_head " + ("rows equal the target head at the mapped ids" if same
                                       else "trained separately"))
    if parts:
        ctx.emit(rule.TARGET_EMBEDDINGS, "; ".join(parts), t.source)
