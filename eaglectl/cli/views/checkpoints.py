"""The human views of what a command found in checkpoint files: inspect, convert, upgrade, diff, check, upload
and a batch of them. Each takes its result object; the JSON form of the same result is its `to_json`."""

from __future__ import annotations

import shlex
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape

from ...commands.upgrade.command import WARM_START
from ...engines.facts import ENGINE_TITLES
from ...engines.readings import scope_note
from ...engines.serving import serve_line
from ...text import short_path
from .. import console
from ..console import SETTINGS, safe, say, table
from .parts import STATUS_STYLE, findings, human_size, json_short, num
from .readings import describe, describe_other

if TYPE_CHECKING:
    from ...commands.check import CheckReport
    from ...commands.convert.command import ConversionResult
    from ...commands.diff import DiffReport
    from ...commands.inspect import InspectReport
    from ...commands.upgrade.command import UpgradeResult
    from ...commands.upload import UploadReport
    from ...families.in_target import InTargetReport
    from ...families.inspect import FamilyReport
    from ...result import BatchResult


def render_inspect(report: InspectReport) -> None:
    """Human view of an InspectReport: the verdict first, then findings and the serve line; the spec
    table and the detection evidence with -v (all of it in --json)."""
    d, spec, out = report.drafter, report.drafter.spec, console.stdout
    s = report.summary
    say("", items=[short_path(d.source)], style="bold")
    out.print(f"dialect  [bold]{d.dialect.name}[/] ({safe(d.dialect.title)})"
              + ("  [dim](--from)[/]" if d.forced else ""))
    if SETTINGS.verbose:
        for line in d.evidence:
            say("  [dim]-[/] ", line, style="dim")
    mine = next((x.score for x in d.detections if x.dialect == d.dialect.name), 0) or 0
    for x in d.detections:
        if x.dialect != d.dialect.name and x.score is not None:
            out.print(f"  [dim]also fits {x.dialect}, less well (its score {x.score:g}, {d.dialect.name}'s "
                      f"{mine:g})[/]")
    fam = report.family
    if fam is not None:  # a family in the EAGLE-3 layout (P-EAGLE): its own rules run too
        say("family   ", f"{fam.family.name}: " + "; ".join(fam.evidence))
    if not SETTINGS.verbose:  # a dialect that fits but for its marker (-v lists it among the evidence)
        for line in (e for e in d.evidence if e.startswith("also fits ")):
            say("  ", line, style="dim")
    out.print(f"EAGLE    [bold]{spec.eagle_version}[/]   arch {spec.arch}")
    if spec.sliding_window is not None:  # it changes what is served (and what every measurement runs)
        say("window   ", items=[f"{spec.sliding_window} positions on layer(s) "
                                f"{', '.join(map(str, spec.sliding_layers))} (layer_types)", "vLLM applies it"])
    t = report.tensor_summary()
    dtypes = [f"{k}×{v}" for k, v in t["dtypes"].items()]
    say("tensors  ", items=[f"{t['count']} in {t['files']} file(s)", f"{t['parameters']:,} parameters",
                            human_size(t["bytes"]), *(["dtypes " + ", ".join(dtypes)] if dtypes else [])])
    for f in report.findings:
        if f.rule_id == "scanned":  # --scan confirms what it read
            say("scan     ", f.message)
    if report.target:
        tg = report.target.summary()
        say("target   ", items=[f"{short_path(tg['source'])}: {num(tg.get('num_hidden_layers'))} layers",
                                f"hidden {num(tg.get('hidden_size'))}", f"vocab {num(tg.get('vocab_size'))}"])
        if report.readings is not None and report.readings.target is not None:  # the target pre-flight
            say("         ", report.readings.target.describe())
        if report.measured is None and report.measured_note:  # a fix that measures cannot work with this target
            say("measured ", f"nothing: {report.measured_note}")
    _engine_lines(report)
    verdict = "[bold red]FAIL[/]" if report.exit_code else "[bold green]OK[/]"
    out.print(f"{verdict}  {s['error']} error(s), {s['warning']} warning(s), {s['info']} info"
              + ("  (--strict: warnings fail)" if report.strict else ""))
    rec = report.recommendation()
    if rec:
        say(f"for {' and '.join(ENGINE_TITLES.get(e, e) for e in report.engines)}: ", rec, indent=2)
    findings(report.findings)
    out.print()
    _serve(report)
    if not SETTINGS.verbose:
        out.print("[dim]spec fields and where each was read: add -v (or --json)[/]")
        return
    fields = ["hidden_size", "target_hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "num_hidden_layers", "vocab_size", "draft_vocab_size", "aux_layer_ids",
              "aux_convention", "num_aux_hidden_states", "rms_norm_eps", "rope_theta", "rope_scaling",
              "max_position_embeddings", "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
              "has_embed_tokens", "has_lm_head", "tie_word_embeddings", "config_dtype"]
    rows = [(f, getattr(spec, f), spec.sources.get(f, "weights" if f.startswith("has_") else "")) for f in fields]
    if spec.aux_layer_ids is not None and spec.aux_convention == "output":
        rows.insert(10, ("aux ids (vLLM)", spec.aux_layer_ids_vllm, "derived: output-of-layer id + 1"))
    out.print()
    out.print(table("spec", ["field", "value", "source"], rows))


def _engine_lines(report: InspectReport) -> None:
    """What each engine reads of the drafter (vLLM's runners: V1 on CPU, V2 the GPU default; SGLang's for a report
    that is for it)."""
    if report.readings is None:
        return
    for i, line in enumerate(describe(report.readings)):
        say("vLLM     " if i == 0 else "         ", line)
    note = scope_note(report.readings, report.engine_version, with_note=False)
    if note:
        say("         ", note, style="dim")
    other = report.readings.engine("sglang")
    if other is not None and "sglang" in report.engines:
        for i, line in enumerate(describe_other(other, report.readings.notes.get("sglang"))):
            say("SGLang   " if i == 0 else "         ", line)


def _serve(report: InspectReport) -> None:
    """The serve line of each engine the report is for, or why there is none and what to run first."""
    if "vllm" in report.engines:
        _serve_vllm(report)
    if "sglang" in report.engines:
        _serve_sglang(report)


def _serve_vllm(report: InspectReport) -> None:
    d, out = report.drafter, console.stdout
    serve = report.serve_command()
    if serve is not None:
        out.print("vLLM:")
        out.print(f"  {safe(serve)}", soft_wrap=True)
    elif report.unservable("vllm"):
        ids = sorted({w.split(":", 1)[0] for w in report.unservable("vllm")})
        say("vLLM: ", f"no serve command: vLLM does not serve the drafter as its files are ({', '.join(ids)})",
            indent=2)
    elif report.wrong_layers():
        ids = sorted({w.split(":", 1)[0] for w in report.wrong_layers()})
        say("vLLM: ", f"no serve command: vLLM would serve the drafter on other target layers than it reads "
            f"({', '.join(ids)}); run first:", indent=2)
        fix = report.serve_fix()
        if fix:
            out.print(f"  {safe(fix)}", soft_wrap=True)
    elif not d.dialect.vllm_loads:
        say("vLLM: ", f"no serve command: vLLM does not load {d.dialect.title} files; "
            f"eaglectl convert {shlex.quote(d.source)} DEST --for vllm (writes one it loads)", indent=2)
    else:
        out.print("vLLM: no serve command until the errors above are fixed")


def _serve_sglang(report: InspectReport) -> None:
    out = console.stdout
    serve = report.sglang_serve_command()
    if serve is not None:
        out.print("SGLang:")
        out.print(f"  {safe(serve)}", soft_wrap=True)
        return
    why = sorted({w.split(":", 1)[0] for w in (*report.unservable("sglang"), *report.wrong_layers("sglang"))})
    say("SGLang: ", "no launch command: " + (f"SGLang does not serve the drafter as its files are "
                                            f"({', '.join(why)})" if why else "fix the errors above first"), indent=2)


def render_family(report: FamilyReport) -> None:
    """Human view of a FamilyReport (a DFlash / DSpark drafter, read header-only): the family and its evidence,
    what each vLLM runner captures, the findings and the serve line; the spec with -v (all of it in --json)."""
    d, out = report.drafter, console.stdout
    out.print(f"[bold]{safe(short_path(d.source))}[/]")
    out.print(f"family   [bold]{d.family.name}[/] (not EAGLE-3: read header-only; "
              f"served by {safe(d.family.served_by)})")
    for line in d.evidence if SETTINGS.verbose else d.evidence[:2]:
        say("  [dim]-[/] ", line, style="dim")
    if report.target:
        tg = report.target.summary()
        say("target   ", items=[f"{short_path(tg['source'])}: {num(tg.get('num_hidden_layers'))} layers",
                                f"vocab {num(tg.get('vocab_size'))}"])
    _verdict_and_serve(report, report.target.source if report.target else "<target-model>", strict=report.strict)
    if SETTINGS.verbose:
        out.print(table("spec", ["field", "value"], [(k, v) for k, v in d.spec().items()]))


def render_in_target(report: InTargetReport) -> None:
    """Human view of an InTargetReport (a drafter shipped inside its target, read header-only): what it is, the
    findings and the serve line (the target serves as its own draft)."""
    console.stdout.print(f"[bold]{safe(short_path(report.target.source))}[/]")
    say("drafter  ", items=[f"{report.kind.name} inside the target ({report.where})"])
    _verdict_and_serve(report, report.target.source,
                       engine=f"vLLM {report.kind.releases}" if report.kind.releases else "vLLM")


def _verdict_and_serve(report: FamilyReport | InTargetReport, served: str, *, strict: bool = False,
                       engine: str = "vLLM") -> None:
    """The verdict with its counts, the findings and the serve line (or why there is none): a report read
    header-only, of a family drafter or of one inside its target."""
    out, s = console.stdout, report.summary
    verdict = "[bold red]FAIL[/]" if report.exit_code else "[bold green]OK[/]"
    out.print(f"{verdict}  {s['error']} error(s), {s['warning']} warning(s), {s['info']} info"
              + ("  (--strict: warnings fail)" if strict else ""))
    findings(report.findings)
    out.print()
    cfg = report.speculative_config()
    if cfg is None:
        out.print(f"{engine}: no serve command until the errors above are fixed")
        return
    out.print(f"{engine}:")
    out.print(f"  {safe(serve_line(served, cfg))}", soft_wrap=True)


def render_conversion(result: ConversionResult) -> None:
    """Human view of a ConversionResult (the plan, and what the check established)."""
    plan, out = result.plan, console.stdout
    verb = "plan (dry run: nothing written)" if not result.written else "converted"
    say(f"[bold]{verb}[/]  ", items=[short_path(plan.source), f"({plan.source_dialect}) ->",
                                     short_path(plan.dest), f"({plan.dest_dialect})"], indent=2, sep=" ")
    rows = []
    for a in plan.tensors:
        src = a.source if a.source and a.source != a.dest else ("" if a.source else a.note)
        rows.append((a.dest, a.action, a.dtype, list(a.shape), src or ""))  # layout formats lists
    # a tensor's origin is a name or a note in words: "reason" wraps, names stay whole
    out.print(table(None, ["tensor", "action", "dtype", "shape", "reason" if any(
        a.source is None and a.note for a in plan.tensors) else "from"], rows))
    for name, why in plan.dropped:
        say(f"  [yellow]drop[/] {safe(name)}: ", why, indent=4)
    render_config_changes(plan.config_changes)
    out.print(f"files: {', '.join(plan.file_names())}")
    for label, lines in (("[yellow]note:[/] ", plan.notes), ("[yellow]warning:[/] ", plan.warnings),
                         ("[green]checked[/] ", result.checked)):
        for line in lines:
            say(label, line, indent=2)
    serve = getattr(result, "serve", None)
    if serve:
        say(f"[bold]for {serve['engine']}:[/] {serve['dialect']} ", f"({serve['why']})")
        for c in serve["candidates"]:
            if "refused" in c:
                say(f"  not {c['dialect']}: ", c["refused"], indent=4)
        out.print("serve it with:" if result.written else "once written, serve it with:")
        for key in ("command", "sglang_command"):
            if serve.get(key):
                click.echo(serve[key])  # unwrapped: a command to copy


def render_config_changes(changes: list[dict[str, Any]]) -> None:
    """Key-level config changes (convert.py `_diff`): keys that only changed place are one line per move
    ("moved into transformer_layer_config: hidden_size, ..."), every other change one line with its value."""
    console.stdout.print("config:")
    shown = [c for c in changes if not c["key"].startswith("eaglectl_provenance")]  # provenance: its own record
    moves: dict[tuple[str, str], list[str]] = defaultdict(list)
    def renamed(c: dict[str, Any]) -> bool:  # the same setting under another name (dtype -> torch_dtype)
        return c["key"].rsplit(".", 1)[-1] != c["from"].rsplit(".", 1)[-1]

    for c in shown:
        if c["change"] == "moved" and "old" not in c and not renamed(c):
            leaf = c["key"].rsplit(".", 1)[-1]
            moves[(c["from"][: -len(leaf)].rstrip("."), c["key"][: -len(leaf)].rstrip("."))].append(leaf)
    for (frm, to), keys in moves.items():
        where = f"into {to}" if to else f"out of {frm}"
        say(f"  > moved {safe(where)}: ", items=keys, indent=4)
    for c in shown:
        new, old = json_short(c.get("new")), json_short(c.get("old"))
        if c["change"] == "moved":
            if "old" in c:
                say("  > ", f"{c['from']} -> {c['key']}: {old} -> {new}", indent=4)
            elif renamed(c):
                say("  > ", f"{c['from']} -> {c['key']} (renamed): {new}", indent=4)
            continue
        line = {"added": f"+ {c['key']} = {new}", "removed": f"- {c['key']} (was {old})",
                "changed": f"~ {c['key']}: {old} -> {new}"}[c["change"]]
        say("  ", line, indent=4)


def render_upgrade(result: UpgradeResult) -> None:
    out = console.stdout
    render_conversion(result.conversion)
    out.print()
    if result.changed:
        say("[bold]upgrade[/]: ", ", ".join(result.steps) + (f" (fc_norm init: {result.init})" if result.init else ""),
            indent=2)
    for note in result.notes:
        say("[yellow]note:[/] ", note, indent=2)
    stats = result.statistics
    if stats:
        say("calibration: ", f"{stats['tokens']} tokens of {stats['text_source']} through {stats['target']}, "
            f"aux ids {stats['aux_ids_vllm']} (sink excluded)", indent=2)
        say("  chunk RMS mean ", ", ".join(f"{x:.3g}" for x in stats["rms_mean"])
            + "; harmonic " + ", ".join(f"{x:.3g}" for x in stats["rms_harmonic_mean"]), indent=4)
        if "fc_output_relative_error" in stats:
            say("  FC output relative error: ", f"{stats['fc_output_relative_error']:.4f} "
                f"(fc_norm = 1 would give {stats['fc_output_relative_error_ones']:.4f})", indent=4)
    if result.fit:
        f = result.fit
        fitted = "fc_norm and fc" if f["fit_fc"] else "fc_norm"
        say("fit: ", f"from {f['start']}, {f['parameters']:,} parameters ({fitted}), {f['steps']} steps (kept step "
            f"{f['best_step']}), {f['tokens']:,} anchors (+{f['heldout_tokens']:,} held out), held-out loss "
            f"{f['heldout_loss_before']:.4f} -> {f['heldout_loss_after']:.4f} (gain {f['heldout_gain']:.4f}), "
            f"{f['seconds']:.1f} s", indent=2)
    if result.init_candidates:
        by_loop = "acceptance_kept" in result.init_candidates[0]
        kinds = list(result.init_candidates[0].get("by_kind") or {}) if by_loop else []
        ranked_on = (result.acceptance or {}).get("ranked_on")
        where = ranked_on["description"] if ranked_on else "held-out prompts"
        say("fc_norm inits, ranked by ", (f"the reference loop's acceptance kept on the kind of text where it keeps "
                                          f"least, on {where}" if kinds else
                                          f"the reference loop's acceptance kept on {where}" if by_loop
                                          else "FC-output error on held-out requests of the capture") + ":", indent=2)
        out.print(table(None, ["init", "acceptance kept" if by_loop else "held-out FC error", *kinds], [
            (c["init"], (f"{100 * c['acceptance_kept']:.1f}%" + (f" ({c['worst_kind']})" if kinds else ""))
             if by_loop else f"{c['heldout_fc_output_relative_error']:.4f}",
             *(f"{100 * c['by_kind'][k]['acceptance_kept']:.1f}%" for k in kinds))
            for c in result.init_candidates]))
    if result.fidelity is not None:
        say("fidelity to the source ", f"({result.fidelity.inputs}):", indent=2)
        out.print(table(None, ["step", "top-1 agreement", "near ties", "KL mean", "KL max"], [
            (str(m.step), f"{100 * m.top1_agreement:.1f}% of {m.top1_rows}", str(m.near_ties), f"{m.kl_mean:.3g}",
             f"{m.kl_max:.3g}") for m in result.fidelity.metrics]))
    _upgrade_ending(result)


def _upgrade_ending(result: UpgradeResult) -> None:
    """The last lines of every upgrade: AL before -> after and on which prompts, that it is a warm start, and
    the command to run next."""
    out = console.stdout
    out.print()
    acc = result.acceptance
    if acc is not None:
        p = acc["prompts"]
        kept = f" ({100 * acc['kept']:.1f}% kept)" if acc.get("kept") is not None else ""
        say("[bold]acceptance length[/] ", f"{acc['before']:.3f} -> {acc['after']:.3f}{kept}, k={p['k']}, "
            f"{p['count']} prompts x {p['max_tokens']} tokens: {p['description']}"
            + (f" ({p['source']})" if p["given"] else "") + f"; {acc['reading_description']}, "
            f"boundaries {acc['source_boundary_ids']} -> {acc['dest_boundary_ids']}", indent=2)
        if acc.get("interval"):
            i = acc["interval"]
            say("  ", f"95% bootstrap interval over these prompts: before {i['before'][0]:.3f}-{i['before'][1]:.3f}, "
                f"after {i['after'][0]:.3f}-{i['after'][1]:.3f}, kept {100 * i['kept'][0]:.1f}-"
                f"{100 * i['kept'][1]:.1f}%; pass --prompts FILE for the figure vLLM prints on yours", indent=4)
        else:
            say("  ", "this is the figure vLLM prints on these prompts (greedy, fp32; the reference loop's counts "
                "equal vLLM's)", indent=4)
        if acc.get("reproduce"):
            by = "the reference loop replays this figure from the capture" if " --states " in acc["reproduce"] \
                else "vLLM measures this figure"
            say("  ", f"the inits were ranked on other prompts; {by} with:", indent=4)
            click.echo(f"    {acc['reproduce']}")  # unwrapped: a command to copy
        kinds = (acc.get("by_kind") or {}).get("kinds") or {}
        if kinds:
            worst = acc["by_kind"]["worst_kind"]
            say("  by kind of text ", "(the target's continuations of bundled prompts, never ranked or fitted on; "
                "95% bootstrap interval of kept): " + ", ".join(
                    f"{k} {v['before']:.3f} -> {v['after']:.3f} ({100 * v['kept']:.1f}%, "
                    f"{100 * v['interval']['kept'][0]:.1f}-{100 * v['interval']['kept'][1]:.1f}%)"
                    for k, v in kinds.items()) + f"; least kept: {worst}. These are the bundled kinds"
                + ("" if acc["prompts"]["given"] else "; on your own prompts (ranked, fitted and reported on apart):"),
                indent=4)
        if acc.get("on_your_prompts"):
            click.echo(f"    {acc['on_your_prompts']}")  # unwrapped: a command to copy
    elif result.changed:
        say("acceptance length: ", "not measured (that needs a runnable --target: weights and a tokenizer, or --states "
            "DIR of a capture made with --max-tokens: the target's greedy continuations)", indent=2)
    if result.changed:

        out.print(f"[yellow]{safe(WARM_START)}[/]")
    if not result.conversion.written:
        out.print("dry run: nothing written; run again without --dry-run")
    elif result.next_command:
        out.print("next:")
        click.echo(f"  {result.next_command}")  # unwrapped: a command to copy


def render_check(rep: CheckReport) -> None:
    out = console.stdout
    say("[bold]check[/]  ", items=[short_path(rep.source)], indent=2)
    out.print(table(None, ["stage", "status", "s", "what was checked"],
                    ((s.name, s.status, f"{s.seconds:.1f}", s.detail) for s in rep.stages),
                    style={"status": STATUS_STYLE.get}))
    findings(rep.findings)
    if rep.card_written:
        say("card written: ", short_path(rep.card_written))
    if rep.config_written:
        say("verifier named in: ", short_path(rep.config_written))
    style = {"PASS": "bold green", "FAIL": "bold red"}.get(rep.verdict, "bold yellow")
    out.print(f"\n[{style}]{rep.verdict}[/]")
    undecided = [s.name for s in rep.stages if s.status == "undecided"]
    if rep.verdict == "UNDECIDED":
        say("undecided: ", f"eaglectl could not run {', '.join(undecided)} (its limit, not the drafter's fault); "
            "the reason and what lets it run are in the table", indent=2)


def render_upload(rep: UploadReport) -> None:
    """The gate's report, then the commit: its operations, where it goes, and what happened."""
    render_check(rep.gate)
    rows = rep.operation_rows()
    where = rep.repo_id + (f" (branch {rep.revision})" if rep.revision else "") + (
        ", as a pull request" if rep.create_pr else "") + (", private if created" if rep.private else "")
    console.stdout.print()
    say("[bold]upload[/]  ", f"{len(rows)} file(s) to {where}")
    console.stdout.print(table(None, ["operation", "path_in_repo", "size", "sha256"],
                       ((r["operation"], r["path_in_repo"], human_size(r["size"]), r["sha256"][:12]) for r in rows)))
    say("commit: ", rep.commit_message, indent=2)
    if rep.refused:
        say("[bold red]not uploaded:[/] ", rep.refused, indent=2)
    elif rep.dry_run:
        console.stdout.print("[yellow]dry run: nothing was sent[/]")
    else:
        say("[bold green]uploaded:[/] ", rep.pr_url or rep.commit_url, indent=2)


def batch_item(n: int, total: int, row: dict[str, Any], out: Console) -> None:
    """One finished batch item, printed as it finishes (on stdout, or on stderr beside --json): its exit code and
    result, then what its own run would have said last — why it failed and the hint, each failed or undecided
    stage's reason, the fixes of its errors, AL before -> after, the warm-start note, the command to run next."""
    dest = ["->", short_path(row["dest"])] if row.get("dest") else []  # the arrow apart: a long path takes a line
    say(f"[bold]{escape(f'[{n}/{total}]')}[/] exit {row['exit_code']}  ", items=[short_path(row["source"]), *dest],
        sep=" ", indent=4, out=out)
    doc, error = row.get("result") or {}, row.get("error") or {}
    lines = [("result: ", row["summary_line"]), ("hint: ", error.get("hint"))]
    lines += [(f"{s['name']} {s['status']}: ", s["detail"]) for s in doc.get("stages", ())
              if s["status"] in ("fail", "undecided")]
    if row["exit_code"]:
        fixes = {f["rule_id"]: f["hint"] for f in doc.get("findings", ()) if f["severity"] == "error" and f["hint"]}
        lines += [(f"fix {rule}: ", hint) for rule, hint in fixes.items()]
    acc = doc.get("acceptance")
    if acc:
        kept = f" ({100 * acc['kept']:.1f}% kept)" if acc.get("kept") is not None else ""
        lines.append(("acceptance length ", f"{acc['before']:.3f} -> {acc['after']:.3f}{kept}"))
    smoked = next((s["data"] for s in doc.get("stages", ()) if s["name"] == "smoke" and s.get("data")), None)
    if smoked and smoked.get("mean_acceptance_length") is not None:  # check: the AL its smoke stage measured
        lines.append(("acceptance length ", f"{smoked['mean_acceptance_length']:.3f} ({smoked.get('engine')}, "
                      f"k={smoked.get('k')})"))
    lines += [("", doc.get("warm_start")), ("next: ", doc.get("next_command"))]
    for prefix, text in lines:
        # once each: an upgrade's result line already says its AL and that it is a warm start
        if text and f"{prefix}{text}".strip() not in row["summary_line"] and \
                not (prefix == "acceptance length " and "acceptance length" in row["summary_line"]):
            say(f"    {prefix}", text, indent=6, out=out)


def render_batch(command: str, result: BatchResult) -> None:
    """The end of a batch (each item was printed as it finished): how many passed, and the exit code."""
    ok = sum(r["exit_code"] == 0 for r in result.rows)
    console.stdout.print(f"\n{command}: {len(result.rows)} item(s), {ok} ok, {len(result.rows) - ok} failed; "
                         f"exit {result.exit_code}")


def render_diff(rep: DiffReport) -> None:
    out = console.stdout
    for side, ckpt in (("a", rep.a), ("b", rep.b)):
        say(f"[bold]{side.upper()}[/] ", items=[ckpt.source, f"({ckpt.dialect.name}, EAGLE {ckpt.spec.eagle_version})"],
            indent=2, sep=" ")
    for f in rep.spec:
        say(f"  spec {f['field']}: ", f"{json_short(f['a'])} -> {json_short(f['b'])}", indent=4)
    for side, names in (("a", rep.only_in_a), ("b", rep.only_in_b)):
        for name in names:
            out.print(f"  only in {side.upper()}: {safe(name)}")
    for d in rep.derived_only:
        out.print(f"  [dim]only in {d['in'].upper()}: {safe(d['name'])} (derived from {d['derived_from']}, "
                  "which is equal)[/]")
    for t in rep.tensors:
        parts = []
        if "dtype" in t["differs"]:
            parts.append(f"dtype {t['a']['dtype']} -> {t['b']['dtype']}")
        if "shape" in t["differs"]:
            parts.append(f"shape {t['a']['shape']} -> {t['b']['shape']}")
        if "values" in t["differs"]:
            worst = t.get("max_abs_diff")
            parts.append("values: NaN on one side" if worst is None else f"values: max |A-B| {worst:.6g}")
        out.print(f"  tensor {safe(t['name'])}: {'; '.join(parts)}")
    verdict = "[bold green]EQUIVALENT[/]" if rep.equivalent else "[bold red]DIFFERENT[/]"
    out.print(f"\n{verdict}  {safe(rep.summary_line())}")
