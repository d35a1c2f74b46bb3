"""The human views of what a command measured: verify, smoke, drift, capture. Each takes its result object;
the JSON form of the same result is its `to_json`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape

from ...text import short_names, short_path
from .. import console
from ..console import safe, say, table
from .parts import num, step_range

if TYPE_CHECKING:
    from ...commands.capture import CaptureResult
    from ...commands.drift import DriftReport
    from ...commands.smoke.report import SmokeReport
    from ...measure.parity import ParityReport


def render_verify(report: ParityReport) -> None:
    out = console.stdout
    c, r = report.candidate, report.reference
    out.print(f"[bold]verify[/] ({report.mode})")
    for label, side in (("candidate", c), ("reference", r)):
        say(f"{label}  ", items=[short_path(side["source"]),
                                 f"({side['dialect']}, EAGLE {side['eagle_version']},",
                                 f"{side['dtype']} on {side['device']})"], indent=11, sep=" ")
    say("inputs     ", f"{report.inputs}; {report.tokens} anchors x {report.steps} steps, teacher-forced")
    warm = report.warm_start
    if report.regime == "upgrade" and warm is not None:
        added = [k for k in report.differing_tensors if k.startswith("fc_norm.")]
        rewritten = [k for k in report.differing_tensors if k not in added]
        say("tensors    ", f"{len(added)} added by the upgrade ({', '.join(added[:5])})"
            + (f", {', '.join(rewritten)} rewritten by it" if rewritten else "") + "; every carried tensor identical")
        did = ", ".join(warm.steps) or "an upgrade"
        say("upgrade    ", f"warm start ({did}" + (f", fc_norm init {warm.init}" if warm.init else "")
            + "), not function-preserving by design; "
            + (f"{len(warm.digests_checked)} written tensor(s) checked against its provenance"
               if warm.digests_checked else "no provenance digests to check the written tensors against"))
        for problem in warm.problems:
            say("           [bold red]FAIL[/] ", problem, indent=11)
        judged = step_range(warm.judged)
        say("judged     ", (f"{judged}" if judged else "no step") + (f"; {step_range(warm.reported)} reported" if
                                                                     warm.reported else "") + f": {warm.why}")
    elif report.differing_tensors:
        say(f"tensors    {len(report.differing_tensors)} differ: ", items=list(report.differing_tensors[:5]), indent=11)
    else:
        out.print("tensors    identical")
    if warm is not None:
        say("tolerance  upgrade: ", items=[f"step {j} KL mean <= {k:.3g}, top-1 >= {100 * t:.1f}%"
                                           for j, (k, t) in sorted(warm.bounds.items())] or ["none"], indent=11)
    elif report.regime:
        say(f"tolerance  {report.regime}: ", items=[f"{k} {v:g}" for k, v in report.tolerances.items()], indent=11)
    else:
        out.print("tolerance  none: fidelity is a measurement")
    rows = []
    for m in report.metrics:
        verdict = {True: "pass", False: "FAIL", None: "reported" if warm is not None else "-"}[m.passed]
        rows.append((str(m.step), num(m.logits_max_abs, ".1e"), num(m.state_max_abs, ".1e"),
                     f"{m.state_cos_min:.6f}", num(m.kl_mean, ".1e"), num(m.kl_max, ".1e"),
                     f"{100 * m.top1_agreement:.1f}%/{m.top1_rows}", str(m.near_ties), verdict))
    out.print(table(None, ["step", "logit Δ", "state Δ", "cos min", "KL mean", "KL max", "top-1", "ties", ""], rows,
                    style={"": {"pass": "green", "FAIL": "bold red"}.get}))
    if report.passed is None:
        out.print("\nfidelity measured (no pass/fail)")
    else:
        out.print("\n" + ("[bold green]PASS[/]" if report.passed else "[bold red]FAIL[/]"))


def _config_label(name: str) -> str:
    """`eagle3:/work/x/fixtures/trained/eagle3.1` → `eagle3:fixtures/trained/eagle3.1`: a baseline is named
    by its path as the user gave it (short_path), so two drafters of one name stay apart."""
    kind, sep, path = name.partition(":")
    return f"{kind}:{short_path(path)}" if sep and path else name


def render_smoke(rep: SmokeReport) -> None:
    out = console.stdout
    doc = rep.payload()  # the drafter's and the baselines' figures, as the JSON gives them
    drafter, target = short_path(rep.drafter), short_path(rep.target)
    say(f"[bold]smoke[/] ({rep.engine})  ", items=[f"{drafter} on {target}",
                                                   f"k={rep.k}", rep.dtype, rep.prompts.description,
                                                   f"{rep.max_tokens} new tokens", "greedy"], indent=2)
    v = rep.versions
    say("versions: ", items=[f"{k} {v[k]}" for k in v if v[k] is not None], indent=2)
    al = doc.get("mean_acceptance_length")
    if al is not None:  # the one headline figure; the other conventions are named after it
        per_request = doc.get("mean_acceptance_length_per_request")
        say(f"[bold]AL {al:.3f}[/]  ", "mean acceptance length: tokens per target step, the bonus token included "
            f"(vLLM's metric); without it (accepted draft length, SpecForge's) {al - 1:.3f}"
            + (f"; averaged per request (SPEED-Bench's) {per_request:.3f}" if per_request is not None else ""),
            indent=2)
    rows, skipped, positions = [], [], []
    for r in [doc, *doc["baselines"]]:
        name = "drafter" if r is doc else _config_label(r["name"])
        if r.get("skipped"):  # below the table: a reason is prose, the table stays narrow
            skipped.append((name, r["skipped"]))
            rows.append((name, "skipped", "", "", "", ""))
            continue
        rows.append((name, num(r.get("mean_acceptance_length"), ".3f"), num(r.get("accepted_draft_length"), ".3f"),
                     "-" if r.get("draft_acceptance_rate") is None else f"{100 * r['draft_acceptance_rate']:.1f}%",
                     num(r.get("num_drafts")),
                     "-" if r.get("greedy_match") is None else f"{100 * r['greedy_match']:.0f}%"))
        if r is not doc and r.get("per_position_acceptance"):  # the drafter's: the bars below
            positions.append((name, [f"{x:.2f}" for x in r["per_position_acceptance"]]))
    # one line a configuration: the per-position rates (as many as k) go below, one line each, never a column
    out.print(table(None, ["config", "AL", "accepted", "rate", "drafts", "match"], rows))
    out.print("[dim]match: greedy output equal to the target's own, without speculation[/]")
    if positions:
        out.print("per-position acceptance (baselines):")
        for name, rates in positions:
            say(f"  {safe(name)}: ", items=rates, sep=" /", indent=4)
    if skipped:
        out.print(table(None, ["config", "reason"], skipped))
    for key, label, column in (("by_context_length", "context tokens", "context"), ("by_category", "category",
                                                                                     "category")):
        configs = [("drafter", doc)] + [(_config_label(b["name"]), b) for b in doc["baselines"] if b.get(key)]
        if doc.get(key):
            rows = [(name, r.get("bucket") or r.get("context_length") if key == "by_context_length" else r["category"],
                     r["requests"], num(r["mean_acceptance_length"], ".3f"),
                     num(r["mean_acceptance_length_per_request"], ".3f"), r["per_position_acceptance"])
                    for name, c in configs for r in c[key]]
            out.print(table(f"\nacceptance by {label}", ["config", column, "requests", "AL pooled", "AL per request"],
                            [row[:5] for row in rows]))
            out.print(f"per-position acceptance by {label}:")  # lines, as many rates as k: never a column
            for name, where, *_, rates in rows:
                say(f"  {safe(name)} {safe(where)}: ", items=[f"{p:.2f}" for p in rates] or ["-"], sep=" /", indent=4)
    per = doc.get("per_position_acceptance") or []
    if per:
        out.print("\nper-position acceptance (drafter):")
        for i, rate in enumerate(per):
            full = max(0, min(30, round(rate * 30)))  # a bar of 30 cells
            out.print(f"  {i + 1:2d} {'█' * full}{'·' * (30 - full)} {100 * rate:5.1f}%")
    speedups = rep.speedups()
    if speedups:
        out.print()
        say("speedup over no speculation ", "(per-user output tokens/s, 1/TPOT: time to first token excluded):",
            indent=2)
        configs = list(dict.fromkeys(s["config"] for s in speedups))
        speedup = {(s["config"], s["concurrency"]): s["speedup"] for s in reversed(speedups)}  # the first wins
        for c in configs:  # one line a configuration, wrapped between concurrencies: as many as were measured
            say(f"  {safe(_config_label(c))}: ", items=[f"c={n} {x:.2f}x" for (name, n), x in sorted(
                speedup.items(), key=lambda kv: kv[0][1]) if name == c], indent=4)
    _render_runners(rep)
    for flag in rep.red_flags:
        say("[bold red]red flag:[/] ", flag, indent=2)
    if rep.log:
        out.print(f"[dim]vLLM log: {safe(rep.log)}[/]")
    if rep.plot:
        out.print(f"plot: {safe(rep.plot)}")


def _render_runners(rep: SmokeReport) -> None:
    """smoke: one line per vLLM runner measured (shown when more than one, one asked for, or V2 emulated),
    and the serving options a user overrode."""
    runs = [r.to_json() for r in rep.runs]
    if runs and (len(runs) > 1 or rep.runner is not None or any(r["emulated"] for r in runs)):
        console.stdout.print("\nvLLM runners measured:")
        for r in runs:
            al = r.get("mean_acceptance_length")
            extra = [f"not run: {r['skipped']}" if r.get("skipped") else f"AL {'-' if al is None else f'{al:.3f}'}"]
            if r.get("aux_log_line"):
                extra.append(f"vLLM: {r['aux_log_line']}")
            extra += r.get("notes") or []
            say(f"  {r['runner']}: ", f"{r['label']}; " + "; ".join(extra), indent=6)
    layers = rep.reference_layers
    if layers and layers.get("from"):
        say("reference layers: ", f"{layers['from']}; flags {layers['flags']}", indent=2)
    serving = rep.serving or {}
    if serving.get("overridden"):
        items = [f"{key}={serving['speculative'][key]['value']}" for key in serving["overridden"]]
        say("[yellow]serving options overridden:[/] ", ", ".join(items) + " (acceptance is not comparable with a "
            "standard run)", indent=2)


def render_capture(result: CaptureResult) -> None:
    if result.recipe is not None:
        console.stdout.print(escape(result.recipe), soft_wrap=True, highlight=False)
        return
    meta = result.meta
    versions = ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items() if v and k != "python")
    say("[bold]capture[/]: ", f"{result.requests} requests, {result.tokens} tokens of "
        f"{meta['prompts']['description']}", indent=2)
    say("  ", f"boundaries {list(result.layer_ids)} (vLLM's numbering; 0 = embeddings, "
        f"{meta['target_config'].get('num_hidden_layers', 'L')} = last layer before the final norm)", indent=4)
    rate = f" ({result.tokens / result.seconds:,.0f} tokens/s)" if result.seconds else ""
    say("  ", f"engine {result.engine}, states stored as {meta['dtype']} ({versions}): {result.seconds:.1f} s{rate}",
        indent=4)
    say("  ", f"wrote {result.out} (one safetensors per request + capture.json); use it with --states {result.out}",
        indent=4)
    if result.log:
        console.stdout.print(f"  [dim]vLLM log: {safe(result.log)}[/]")


def render_drift(rep: DriftReport) -> None:
    out, p = console.stdout, rep.protocol
    source = f"target {rep.target}" if rep.target else f"capture {rep.states}"
    say(f"[bold]drift[/] ({p.name})  ", items=[source, f"depth {rep.depth}", f"sink = first {p.sink_tokens} token(s)",
        f"recent = last {p.recent_window} context positions", f"an anchor every {p.anchor_every} answer tokens"],
        indent=2)
    say("", p.note, style="dim")
    runs = [r.to_json() for r in rep.runs]  # each run's figures by depth
    names = dict(zip(dict.fromkeys(r["drafter"] for r in runs), short_names(list(dict.fromkeys(
        r["drafter"] for r in runs))), strict=True))
    conditions = list(dict.fromkeys((r["context_length"], r["template"]) for r in runs))
    for length, template in conditions:
        group = [r for r in runs if (r["context_length"], r["template"]) == (length, template)]
        what = (f"context {length} tokens" if length else f"template {template}" if template
                else f"{group[0]['prompts']} prompts")
        rows = []
        for d in range(rep.depth):
            cells = []
            for r in group:
                x = r["depths"][d]
                cells.append(" ".join(num(x[m], ".3f") for m in ("sink_mass", "self_mass", "recent_mass"))
                             + f"  {num(x['state_rms'], '.2f')}")
            rows.append((d, *cells))
        out.print(table(f"\n{what}: sink self recent (attention mass)  state RMS, by draft depth", ["depth",
                        *(safe(names[r["drafter"]]) for r in group)], rows))
        als = [(safe(names[r["drafter"]]), num(r["mean_acceptance_length"], ".3f"),
                num(r["mean_acceptance_length_per_request"], ".3f"),
                " / ".join(num(p, ".2f") for p in r["per_position_acceptance"] or []) or "-",
                " ".join(num(x, ".2f") for x in r["aux_chunk_rms"])) for r in group]
        out.print(table(None, ["drafter", "AL pooled", "AL per request", "per position", "aux RMS"], als))
    if rep.acceptance_note:
        say("", rep.acceptance_note, style="dim")
    for r in runs:
        for note in r["notes"]:
            say("", f"{names[r['drafter']]}: {note}", style="dim", indent=2)
        if r["chains_cut"]:
            out.print(f"[yellow]{safe(names[r['drafter']])}: {r['chains_cut']} chains stopped at a token "
                      "without an embedding row[/]")
    if rep.plot:
        out.print(f"plot: {safe(rep.plot)}")
