"""The one output layer: results to stdout (rich tables or JSON), everything else to stderr.

Two module-level consoles (Rich resolves sys.stdout / sys.stderr on every write, so Click's test
runner captures them). No colour when NO_COLOR is set or the stream is not a terminal (Rich's own
rules); no progress bars with --json, NO_COLOR, or a non-terminal stderr.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .errors import EaglectlError

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

T = TypeVar("T")


@dataclass
class Mode:
    json: bool = False


MODE = Mode()


def emit_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")


def warning(message: str) -> None:
    stderr.print(f"[yellow]warning:[/] {escape(message)}")


def error(exc: EaglectlError) -> None:
    """One line on stderr (plus a hint); with --json also the error object on stdout."""
    stderr.print(f"[bold red]{escape(f'error[{exc.reference}]:')}[/] {escape(exc.message)}")
    if exc.hint:
        stderr.print(f"[dim]hint:[/] {escape(exc.hint)}")
    if MODE.json and not exc.reported:
        emit_json({"schema": "eaglectl.error/1", "error": exc.to_json(), "exit_code": exc.exit_code})


def internal_error(exc: BaseException) -> None:
    stderr.print(f"[bold red]internal error:[/] {escape(type(exc).__name__)}: {escape(str(exc).splitlines()[0] if str(exc) else '')}")
    stderr.print("[dim]hint:[/] this is a bug in eaglectl; set EAGLECTL_DEBUG=1 for a traceback and report it")


def progress_enabled() -> bool:
    return not MODE.json and "NO_COLOR" not in os.environ and stderr.is_terminal


def progress(items: Iterable[T], *, label: str, total: int | None = None) -> Iterator[T]:
    """Wrap an iterable in a transient progress bar when a human watches stderr; else pass through."""
    if not progress_enabled():
        yield from items
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=stderr, transient=True, refresh_per_second=6) as bar:
        task = bar.add_task(label, total=total)
        for item in items:
            yield item
            bar.advance(task)


def table(title: str | None, columns: list[str], rows: Iterable[Iterable[Any]]) -> Table:
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, box=None, header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for row in rows:
        t.add_row(*(escape(_text(v)) for v in row))
    return t


def _text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def render_inspect(report: Any) -> None:
    """Human view of an InspectReport."""
    spec = report.spec
    out = stdout
    out.print(f"[bold]{escape(report.source)}[/]")
    out.print(f"dialect  [bold]{report.dialect.name}[/] ({escape(report.dialect.title)})"
              + ("  [dim](--from)[/]" if report.forced else ""))
    for line in report.evidence:
        out.print(f"  [dim]- {escape(line)}[/]")
    others = [d for d in report.detections if d.dialect != report.dialect.name and d.score is not None]
    for d in others:
        out.print(f"  [dim]also fits {d.dialect} (score {d.score:g} vs "
                  f"{next((x.score for x in report.detections if x.dialect == report.dialect.name), 0) or 0:g})[/]")
    out.print(f"EAGLE    [bold]{spec.eagle_version}[/]   arch {spec.arch}")
    out.print()
    fields = ["hidden_size", "target_hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "num_hidden_layers", "vocab_size", "draft_vocab_size", "aux_layer_ids",
              "aux_convention", "num_aux_hidden_states", "rms_norm_eps", "rope_theta", "rope_scaling",
              "max_position_embeddings", "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
              "has_embed_tokens", "has_lm_head", "tie_word_embeddings", "config_dtype"]
    rows = [(f, getattr(spec, f), spec.sources.get(f, "weights" if f.startswith("has_") else "")) for f in fields]
    if spec.aux_layer_ids is not None and spec.aux_convention == "output":
        rows.insert(10, ("aux ids (vLLM)", spec.aux_layer_ids_vllm, "derived: output-of-layer id + 1"))
    out.print(table("spec", ["field", "value", "source"], rows))
    out.print()
    t = report.tensors
    out.print(f"tensors  {t['count']} in {t['files']} file(s), {t['parameters']:,} parameters, "
              f"{human_size(t['bytes'])}, dtypes "
              + ", ".join(f"{k}×{v}" for k, v in t["dtypes"].items()))
    if report.target:
        tg = report.target
        out.print(f"target   {escape(str(tg['source']))}: {tg.get('num_hidden_layers')} layers, hidden "
                  f"{tg.get('hidden_size')}, vocab {tg.get('vocab_size')}")
    out.print()
    if report.findings:
        ft = Table(title="findings", title_justify="left", show_edge=False, pad_edge=False, box=None,
                   header_style="bold")
        for c in ("severity", "rule", "message", "where"):
            ft.add_column(c, overflow="fold")
        for f in report.findings:
            style = SEVERITY_STYLE[f.severity]
            ft.add_row(f"[{style}]{f.severity}[/]", f.rule, escape(f.message), escape(f.locator or ""))
        out.print(ft)
        hints = {f.rule: f.to_json()["hint"] for f in report.findings if f.severity != "info"}
        for rule, hint in hints.items():
            out.print(f"  [dim]{rule}: {escape(hint)}[/]")
        out.print()
    out.print("vLLM:")
    out.print(f"  {escape(report.serve_command)}", soft_wrap=True)
    s = report.summary
    verdict = "[bold red]FAIL[/]" if report.exit_code else "[bold green]OK[/]"
    out.print(f"\n{verdict}  {s['error']} error(s), {s['warning']} warning(s), {s['info']} info"
              + ("  (--strict: warnings fail)" if report.strict else ""))


def _num(x: float | None, fmt: str = ".2e") -> str:
    return "-" if x is None else format(x, fmt)


def render_verify(report: Any) -> None:
    """Human view of a ParityReport."""
    out = stdout
    c, r = report.candidate, report.reference
    out.print(f"[bold]verify[/] ({report.mode})")
    for label, side in (("candidate", c), ("reference", r)):
        out.print(f"{label}  {escape(side['source'])}  ({side['dialect']}, EAGLE {side['eagle_version']}, "
                  f"{side['dtype']} on {side['device']})")
    out.print(f"inputs     {escape(report.inputs)}; {report.tokens} anchors x {report.steps} steps, teacher-forced")
    if report.differing_tensors:
        out.print(f"tensors    {len(report.differing_tensors)} differ: {escape(', '.join(report.differing_tensors[:5]))}")
    else:
        out.print("tensors    identical")
    if report.regime:
        tol = ", ".join(f"{k} {v:g}" for k, v in report.tolerances.items())
        out.print(f"tolerance  {report.regime}: {tol}")
    else:
        out.print("tolerance  none: fidelity is a measurement")
    rows = []
    for m in report.metrics:
        verdict = {True: "[green]pass[/]", False: "[bold red]FAIL[/]", None: "-"}[m.passed]
        rows.append((str(m.step), _num(m.logits_max_abs, ".1e"), _num(m.state_max_abs, ".1e"),
                     f"{m.state_cos_min:.6f}", _num(m.kl_mean, ".1e"), _num(m.kl_max, ".1e"),
                     f"{100 * m.top1_agreement:.1f}%/{m.top1_rows}", str(m.near_ties), verdict))
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in ("step", "logit Δ", "state Δ", "cos min", "KL mean", "KL max", "top-1", "ties", ""):
        t.add_column(col)
    for row in rows:
        t.add_row(*row)
    out.print(t)
    if report.passed is None:
        out.print("\nfidelity measured (no pass/fail)")
    else:
        out.print("\n" + ("[bold green]PASS[/]" if report.passed else "[bold red]FAIL[/]"))


def render_conversion(result: Any) -> None:
    """Human view of a ConversionResult (the plan, and what the check established)."""
    plan, out = result.plan, stdout
    verb = "plan (dry run: nothing written)" if not result.written else "converted"
    out.print(f"[bold]{verb}[/]  {escape(plan.source)} ({plan.source_dialect}) -> {escape(plan.dest)} "
              f"({plan.dest_dialect})")
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in ("tensor", "action", "dtype", "shape", "from"):
        t.add_column(col, overflow="fold")
    for a in plan.tensors:
        src = a.source if a.source and a.source != a.dest else ("" if a.source else a.note)
        t.add_row(escape(a.dest), a.action, a.dtype, _text(list(a.shape)), escape(src or ""))
    out.print(t)
    for name, why in plan.dropped:
        out.print(f"  [yellow]drop[/] {escape(name)}: {escape(why)}")
    out.print("config:")
    for c in plan.config_changes:
        if c["key"] == "eaglectl_provenance":
            continue
        new = json_short(c.get("new"))
        old = json_short(c.get("old"))
        line = {"added": f"+ {c['key']} = {new}", "removed": f"- {c['key']} (was {old})",
                "changed": f"~ {c['key']}: {old} -> {new}"}[c["change"]]
        out.print(f"  {escape(line)}")
    out.print(f"files: {', '.join(plan.file_names())}")
    for check in result.checked:
        out.print(f"[green]checked[/] {escape(check)}")


def json_short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_upgrade(result: Any) -> None:
    out = stdout
    render_conversion(result.conversion)
    out.print()
    if result.changed:
        out.print(f"[bold]upgrade[/]: {', '.join(result.steps)}" + (f" (fc_norm init: {result.init})" if result.init else ""))
    for note in result.notes:
        out.print(f"[yellow]note:[/] {escape(note)}")
    stats = result.statistics
    if stats:
        out.print(f"calibration: {stats['tokens']} tokens of {escape(stats['text_source'])} through "
                  f"{escape(str(stats['target']))}, aux ids {stats['aux_ids_vllm']} (sink excluded)")
        out.print("  chunk RMS mean " + ", ".join(f"{x:.3g}" for x in stats["rms_mean"])
                  + "; harmonic " + ", ".join(f"{x:.3g}" for x in stats["rms_harmonic_mean"]))
        if "fc_output_relative_error" in stats:
            out.print(f"  FC output relative error: {stats['fc_output_relative_error']:.4f} "
                      f"(fc_norm = 1 would give {stats['fc_output_relative_error_ones']:.4f})")
    if result.fidelity is not None:
        out.print(f"fidelity to the source ({escape(result.fidelity.inputs)}):")
        t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
        for col in ("step", "top-1 agreement", "near ties", "KL mean", "KL max"):
            t.add_column(col)
        for m in result.fidelity.metrics:
            t.add_row(str(m.step), f"{100 * m.top1_agreement:.1f}% of {m.top1_rows}", str(m.near_ties),
                      f"{m.kl_mean:.3g}", f"{m.kl_max:.3g}")
        out.print(t)


def _bar(value: float, width: int = 30) -> str:
    full = max(0, min(width, round(value * width)))
    return "█" * full + "·" * (width - full)


def render_smoke(rep: Any) -> None:
    out = stdout
    doc = rep.to_json()
    out.print(f"[bold]smoke[/] ({rep.engine})  {escape(rep.drafter)} on {escape(rep.target)}  k={rep.k}, {rep.dtype}, "
              f"{doc['prompts']['description']}, {rep.max_tokens} new tokens, greedy")
    v = doc["versions"]
    out.print("versions: " + ", ".join(f"{k} {v[k]}" for k in v))
    rows = []
    for r in [doc, *doc["baselines"]]:
        name = "drafter" if r is doc else r["name"]
        if r.get("skipped"):
            rows.append((name, "skipped: " + r["skipped"], "", "", "", "", ""))
            continue
        al = r.get("mean_acceptance_length")
        rows.append((name, "-" if al is None else f"{al:.3f}",
                     "-" if al is None else f"{al - 1:.3f}",
                     "-" if r.get("draft_acceptance_rate") is None else f"{100 * r['draft_acceptance_rate']:.1f}%",
                     " / ".join(f"{x:.2f}" for x in r.get("per_position_acceptance") or []) or "-",
                     "-" if r.get("num_drafts") is None else str(r["num_drafts"]),
                     "-" if r.get("greedy_match") is None else f"{100 * r['greedy_match']:.0f}%"))
    out.print(table(None, ["config", "AL", "accepted len", "accept rate", "per position", "drafts", "= no-spec"], rows))
    per = doc.get("per_position_acceptance") or []
    if per:
        out.print("\nper-position acceptance (drafter):")
        for i, rate in enumerate(per):
            out.print(f"  {i + 1:2d} {_bar(rate)} {100 * rate:5.1f}%")
    if doc["speedup"]:
        out.print("\nspeedup over no speculation (per-user output tokens/s):")
        conc = sorted({s["concurrency"] for s in doc["speedup"]})
        configs = list(dict.fromkeys(s["config"] for s in doc["speedup"]))
        rows = [(c, *(f"{next(s['speedup'] for s in doc['speedup'] if s['config'] == c and s['concurrency'] == n):.2f}x"
                      for n in conc)) for c in configs]
        out.print(table(None, ["config", *(f"c={n}" for n in conc)], rows))
    for flag in rep.red_flags:
        out.print(f"[bold red]red flag:[/] {escape(flag)}")
    if rep.log:
        out.print(f"[dim]vLLM log: {escape(rep.log)}[/]")


STATUS_STYLE = {"pass": "green", "fail": "bold red", "skipped": "yellow"}


def render_check(rep: Any) -> None:
    out = stdout
    out.print(f"[bold]check[/]  {escape(rep.source)}")
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in ("stage", "status", "what was checked", "s"):
        t.add_column(col, overflow="fold")
    for s in rep.stages:
        t.add_row(s.name, f"[{STATUS_STYLE[s.status]}]{s.status}[/]", escape(s.detail), f"{s.seconds:.1f}")
    out.print(t)
    shown = [f for f in rep.findings if f.severity != "info"]
    if shown:
        out.print(table("findings", ["severity", "rule", "message", "where"],
                        ((f.severity, f.rule, f.message, f.locator) for f in shown)))
    if rep.card_written:
        out.print(f"card written: {escape(rep.card_written)}")
    out.print("\n" + ("[bold green]PASS[/]" if rep.exit_code == 0 else "[bold red]FAIL[/]"))


def render_batch(command: str, result: Any) -> None:
    out = stdout
    out.print(table(f"{command}: {len(result.rows)} item(s)", ["source", "dest", "exit", "result"],
                    ((r["source"], r.get("dest", ""), r["exit_code"], r["summary"]) for r in result.rows)))
    ok = sum(r["exit_code"] == 0 for r in result.rows)
    out.print(f"\n{ok} ok, {len(result.rows) - ok} failed; exit {result.exit_code}")
