"""The command line. Each command parses options, calls one library function and hands the result
to `report`. torch is never imported here; heavy modules are imported inside command bodies."""

from __future__ import annotations

import os
from typing import Any

import click

from . import __version__, formats, report
from .errors import EXIT_INTERNAL, EaglectlError


class EaglectlGroup(click.Group):
    """Turns library errors into one line + exit code, and bugs into exit 70."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EaglectlError as e:
            report.error(e)
            ctx.exit(e.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit, KeyboardInterrupt):
            raise
        except Exception as e:
            if os.environ.get("EAGLECTL_DEBUG"):
                raise
            report.internal_error(e)
            ctx.exit(EXIT_INTERNAL)


def json_option(fn: Any) -> Any:
    def set_mode(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        report.MODE.json = value
        return value

    return click.option("--json", "as_json", is_flag=True, is_eager=True, callback=set_mode, expose_value=True,
                        help="Print one JSON document on stdout (schema id in 'schema').")(fn)


@click.group(cls=EaglectlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="eaglectl")
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors (same as EAGLECTL_DEBUG=1).")
def cli(debug: bool) -> None:
    """Inspect, convert, upgrade, verify and smoke-test EAGLE-3 / EAGLE-3.1 drafters.

    Exit codes: 0 ok, 1 findings at error level (warnings too with --strict), 2 usage,
    3-13 specific failures (see docs/errors.md), 70 internal error.
    """
    report.MODE.json = False
    if debug:
        os.environ["EAGLECTL_DEBUG"] = "1"


@cli.command("inspect", epilog="""\b
Examples:
  eaglectl inspect ./my-drafter
  eaglectl inspect yuhuili/EAGLE3-LLaMA3.1-Instruct-8B --target meta-llama/Llama-3.1-8B-Instruct
  eaglectl inspect hf://org/drafter@v2 --json --strict
""")
@click.argument("source")
@click.option("--target", metavar="TARGET", help="Target model folder or Hub id (config and a few rows only).")
@click.option("--from", "from_dialect", type=click.Choice(formats.names()), help="Dialect, when detection cannot tell.")
@click.option("--revision", metavar="REV", help="Hub revision (not with an id that pins one).")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option("--scan", is_flag=True, help="Stream every tensor and report NaN/Inf values.")
@click.option("--allow-pickle", is_flag=True, help="Read .bin weights with torch.load(weights_only=True).")
@json_option
def inspect_cmd(source: str, target: str | None, from_dialect: str | None, revision: str | None, strict: bool,
                scan: bool, allow_pickle: bool, as_json: bool) -> None:
    """Name the dialect of a drafter checkpoint and check everything the files can tell.

    SOURCE is a folder, a .safetensors file, a *.index.json, a .bin (with --allow-pickle) or a Hub
    repo (org/name, org/name@rev, hf://org/name@rev/subfolder). Only headers, config.json and
    small tensors (d2t, t2d) are read; --scan reads everything.
    """
    from .inspection import inspect_checkpoint

    result = inspect_checkpoint(source, target=target, from_dialect=from_dialect, strict=strict, scan=scan,
                                allow_pickle=allow_pickle, revision=revision, progress=report.progress)
    if as_json:
        report.emit_json(result.to_json())
    else:
        report.render_inspect(result)
    click.get_current_context().exit(result.exit_code)


@cli.command("verify", epilog="""\b
Examples:
  eaglectl verify ./converted --against ./original          # conversion parity, fp32 CPU
  eaglectl verify ./drafter --dtype bfloat16 --device cuda  # precision parity vs fp32 CPU
  eaglectl verify ./drafter --target ./target-model --steps 5 --json
""")
@click.argument("candidate")
@click.option("--against", metavar="REFERENCE", help="Compare with this checkpoint (any dialect) on the same inputs.")
@click.option("--target", metavar="TARGET", help="Real aux states from this HF target (folder or Hub id).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--steps", type=click.IntRange(1, 32), default=3, show_default=True, help="Draft steps per anchor.")
@click.option("--tokens", type=click.IntRange(2, 8192), default=64, show_default=True, help="Anchors (positions).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--text", type=click.Path(exists=True, dir_okay=False), help="Text for --target (default: bundled).")
@click.option("--from", "from_dialect", type=click.Choice(formats.names()), help="Dialect of CANDIDATE.")
@click.option("--against-from", type=click.Choice(formats.names()), help="Dialect of REFERENCE.")
@click.option("--allow-pickle", is_flag=True, help="Read .bin weights with torch.load(weights_only=True).")
@json_option
def verify_cmd(candidate: str, against: str | None, target: str | None, device: str, dtype: str, steps: int,
               tokens: int, seed: int, text: str | None, from_dialect: str | None, against_from: str | None,
               allow_pickle: bool, as_json: bool) -> None:
    """Numerical parity of a drafter through the reference drafter.

    With --against: conversion parity (identical tensors must give identical outputs; a dtype
    change gets that precision's tolerance). Without: CANDIDATE at --dtype on --device against its
    own fp32 CPU run. Reports per draft step; exit 8 when a step fails (the report prints first).
    """
    from pathlib import Path

    from .errors import ParityMismatchError
    from .parity import verify

    result = verify(candidate, against=against, target=target, device=device, dtype=dtype, steps=steps,
                    tokens=tokens, seed=seed, text=Path(text).read_text() if text else None,
                    from_dialect=from_dialect, against_from=against_from, allow_pickle=allow_pickle)
    if as_json:
        report.emit_json(result.to_json())
    else:
        report.render_verify(result)
    if result.passed is False:
        failed = [str(m.step) for m in result.metrics if m.passed is False]
        raise ParityMismatchError(f"{candidate}: step(s) {', '.join(failed)} exceed the {result.regime} tolerance",
                                  reported=True)


def manifest_options(fn: Any) -> Any:
    fn = click.option("--fail-fast", is_flag=True, help="Stop a batch at the first failure.")(fn)
    return click.option("--manifest", type=click.Path(exists=True, dir_okay=False),
                        help="JSONL, one item per line: {\"source\": ..., \"dest\": ...} (+ per-item options).")(fn)


def _single_or_batch(command: str, source: str | None, dest: str | None, manifest: str | None, fail_fast: bool,
                     one: Any, defaults: dict[str, Any], render: Any) -> None:
    """SOURCE DEST runs once and renders; --manifest runs the batch."""
    if _run_manifest(command, manifest, fail_fast, one, defaults, need_dest=True):
        return
    if source is None or dest is None:
        raise click.UsageError("give SOURCE and DEST, or --manifest FILE")
    _, _, result = one({"source": source, "dest": dest, **defaults})
    if report.MODE.json:
        report.emit_json(result.to_json())
    else:
        render(result)


def _run_manifest(command: str, manifest: str | None, fail_fast: bool, one: Any, defaults: dict[str, Any],
                  need_dest: bool, items: list[dict[str, Any]] | None = None) -> bool:
    """Run a batch when a manifest (or several sources) is given; prints the summary and exits."""
    from .batch import read_manifest, run_batch

    if manifest is None and items is None:
        return False
    rows = items if items is not None else read_manifest(manifest, need_dest)  # type: ignore[arg-type]
    result = run_batch([{**{k: v for k, v in defaults.items() if v is not None}, **r} for r in rows],
                       lambda item: _row(one, item), fail_fast)
    if report.MODE.json:
        report.emit_json(result.to_json(command))
    else:
        report.render_batch(command, result)
    click.get_current_context().exit(result.exit_code)
    return True


def _row(one: Any, item: dict[str, Any]) -> tuple[int, str, Any]:
    code, summary, result = one(item)
    return code, summary, result.to_json() if hasattr(result, "to_json") else result


def _aux_ids(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(x) for x in value.replace(" ", "").split(",") if x)
    except ValueError:
        raise click.BadParameter("comma-separated integers, e.g. 2,16,29") from None


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from .convert import parse_size

    try:
        return None if value is None else parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


WRITABLE = [name for name in formats.names() if formats.get(name).writer is not None]


@cli.command("convert", epilog="""\b
Examples:
  eaglectl convert ./eagle-head ./out --to speculators --target meta-llama/Llama-3.1-8B-Instruct
  eaglectl convert ./nemo-draft ./vllm-draft --to modelopt --dry-run
  eaglectl convert ./head ./head-fp16 --to specforge --dtype float16 --max-shard-size 2GB
""")
@click.argument("source", required=False)
@click.argument("dest", type=click.Path(file_okay=False), required=False)
@click.option("--to", "to", type=click.Choice(WRITABLE), help="Destination dialect (per item in a manifest: 'to').")
@click.option("--from", "from_dialect", type=click.Choice(formats.names()), help="Source dialect, if detection cannot tell.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), help="Cast float tensors (default: keep).")
@click.option("--target", metavar="TARGET", help="Target model: verifier name, vocab, default aux ids, missing tables.")
@click.option("--aux-layer-ids", callback=_aux_ids, metavar="IDS", help="Aux ids in vLLM's (boundary) convention.")
@click.option("--source-aux-convention", type=click.Choice(["boundary", "output"]),
              help="What the source's aux ids mean, when the files cannot say (ModelOpt).")
@click.option("--max-shard-size", callback=_size, metavar="SIZE", help="Shard the output (e.g. 5GB).")
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option("--force", is_flag=True, help="Replace an existing DEST.")
@click.option("--allow-pickle", is_flag=True, help="Read .bin weights with torch.load(weights_only=True).")
@manifest_options
@json_option
def convert_cmd(source: str | None, dest: str | None, to: str | None, from_dialect: str | None, dtype: str | None,
                target: str | None, aux_layer_ids: tuple[int, ...] | None, source_aux_convention: str | None,
                max_shard_size: int | None, dry_run: bool, force: bool, allow_pickle: bool, manifest: str | None,
                fail_fast: bool, as_json: bool) -> None:
    """Convert a drafter between dialects: planned, streamed, fail-closed, checked after writing.

    Every source tensor is copied (byte ranges), cast, dropped by a named rule, or the conversion
    fails naming it. Semantic flags, aux ids (translated between conventions) and the vocabulary
    mapping are written explicitly. DEST appears only when complete and re-checked.
    """
    from .convert import ConversionResult, execute, open_source, plan_conversion
    from .inspection import open_target

    def one(item: dict[str, Any]) -> tuple[int, str, Any]:
        if not item.get("to"):
            raise click.UsageError("--to is required (or a 'to' key per manifest line)")
        src = open_source(item["source"], from_dialect, allow_pickle)
        tgt = open_target(item["target"]) if item.get("target") else None
        plan = plan_conversion(src, item["dest"], item["to"], dtype=dtype, target=tgt, aux_layer_ids=aux_layer_ids,
                               source_aux_convention=source_aux_convention, max_shard_size=max_shard_size)
        result = (ConversionResult(plan, False, []) if dry_run
                  else execute(plan, src, target=tgt, force=force, progress=report.progress))
        return 0, f"{plan.source_dialect} -> {plan.dest_dialect}: {len(plan.tensors)} tensors", result

    _single_or_batch("convert", source, dest, manifest, fail_fast, one, {"to": to, "target": target},
                     report.render_conversion)


@cli.command("upgrade", epilog="""\b
Examples:
  eaglectl upgrade ./eagle3-head ./eagle31-head                        # fc_norm = 1, norm_output on
  eaglectl upgrade ./head ./head-31 --init calibrated --target ./target  # least-squares fc_norm
  eaglectl upgrade ./safeailab-head ./out --to speculators --target org/target
""")
@click.argument("source", required=False)
@click.argument("dest", type=click.Path(file_okay=False), required=False)
@click.option("--fc-norm/--no-fc-norm", default=True, show_default=True, help="Add per-aux fc_norm weights.")
@click.option("--norm-output/--no-norm-output", default=True, show_default=True, help="Feed back the post-norm state.")
@click.option("--init", type=click.Choice(["ones", "harmonic", "calibrated", "refit"]), default="ones",
              show_default=True, help="How fc_norm starts (all but ones run --target over calibration text).")
@click.option("--target", metavar="TARGET", help="Target model (calibration; fidelity inputs; verifier).")
@click.option("--calibration-text", type=click.Path(exists=True, dir_okay=False), help="Default: bundled text.")
@click.option("--to", "to", type=click.Choice(WRITABLE), help="Output dialect (default: the source's).")
@click.option("--from", "from_dialect", type=click.Choice(formats.names()), help="Source dialect.")
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option("--force", is_flag=True, help="Replace an existing DEST.")
@click.option("--allow-pickle", is_flag=True, help="Read .bin weights with torch.load(weights_only=True).")
@manifest_options
@json_option
def upgrade_cmd(source: str | None, dest: str | None, fc_norm: bool, norm_output: bool, init: str,
                target: str | None, calibration_text: str | None, to: str | None, from_dialect: str | None,
                dry_run: bool, force: bool, allow_pickle: bool, manifest: str | None, fail_fast: bool,
                as_json: bool) -> None:
    """Take an EAGLE-3 drafter to the EAGLE-3.1 layout (fc_norm, norm_output).

    Not function-preserving: the result is a warm start for 3.1 fine-tuning, recorded as such in
    its config and metadata. Reports its fidelity to the source (per-step top-1 agreement and KL).
    Upgrading a drafter that already has the features changes nothing and says so.
    """
    from pathlib import Path

    from .upgrade import upgrade

    text = Path(calibration_text).read_text() if calibration_text else None

    def one(item: dict[str, Any]) -> tuple[int, str, Any]:
        res = upgrade(item["source"], item["dest"], fc_norm=fc_norm, norm_output=norm_output, init=init,
                      target=item.get("target"), calibration_text=text, to=item.get("to"), from_dialect=from_dialect,
                      allow_pickle=allow_pickle, force=force, dry_run=dry_run, progress=report.progress)
        return 0, ", ".join(res.steps) or "nothing to change", res

    _single_or_batch("upgrade", source, dest, manifest, fail_fast, one, {"to": to, "target": target},
                     report.render_upgrade)


def _int_list(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter("comma-separated integers, e.g. 1,4,16") from None
    if not out or min(out) < 1:
        raise click.BadParameter("positive integers")
    return out


@cli.command("smoke", epilog="""\b
Examples:
  eaglectl smoke ./drafter --target ./target --baseline none,ngram
  eaglectl smoke ./drafter --target org/model --num-speculative-tokens 5 --prompts builtin:long
  eaglectl smoke ./drafter --target ./target --engine reference --json
""")
@click.argument("drafter")
@click.option("--target", required=True, metavar="TARGET", help="Target model folder or Hub id (with a tokenizer).")
@click.option("--engine", type=click.Choice(["vllm", "reference"]), default="vllm", show_default=True)
@click.option("-k", "--num-speculative-tokens", "k", type=click.IntRange(1, 16), default=3, show_default=True)
@click.option("--prompts", default="builtin:short", show_default=True,
              help="builtin:short, builtin:long, or a JSONL file ({'prompt': text} or {'messages': [...]}).")
@click.option("--num-prompts", type=click.IntRange(1, 10000), default=16, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1, 32768), default=64, show_default=True)
@click.option("--max-model-len", type=click.IntRange(16, 1 << 20), default=1024, show_default=True)
@click.option("--concurrency", callback=_int_list, default="1,4,16", show_default=True,
              help="Concurrency levels for throughput and speedup (vLLM engine).")
@click.option("--baseline", "baselines", default="none",
              help="Comma list: none, ngram, draft_model:PATH, or other EAGLE drafters (PATH or eagle3:PATH).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--tensor-parallel-size", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--vllm-python", metavar="PATH", help="Interpreter with vLLM (default: $EAGLECTL_VLLM_PYTHON, then this one).")
@click.option("--min-acceptance", type=float, help="Fail (exit 9) below this mean acceptance length.")
@click.option("--timeout-s", type=float, default=900.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@json_option
def smoke_cmd(drafter: str, target: str, engine: str, k: int, prompts: str, num_prompts: int, max_tokens: int,
              max_model_len: int, concurrency: tuple[int, ...], baselines: str, dtype: str, tensor_parallel_size: int,
              vllm_python: str | None, min_acceptance: float | None, timeout_s: float, seed: int,
              as_json: bool) -> None:
    """Run DRAFTER on TARGET under real vLLM (or the reference loop) and measure acceptance.

    Greedy, fixed prompts, counters around the measured batch. Reports mean acceptance length
    (with the bonus token), accepted draft length, draft acceptance rate, per-position acceptance,
    greedy-output match against no speculation, per-user throughput and speedup by concurrency,
    and baselines side by side. Red flags (no drafts, acceptance ~1, ~k+1 with repetition, below
    --min-acceptance) exit 9 after the report.
    """
    from .errors import SmokeFailedError
    from .smoke import parse_baselines, smoke

    rep = smoke(drafter, target, engine=engine, k=k, prompts=prompts, num_prompts=num_prompts, max_tokens=max_tokens,
                concurrency=concurrency, baselines=parse_baselines(baselines), dtype=dtype,
                tensor_parallel_size=tensor_parallel_size, vllm_python=vllm_python, min_acceptance=min_acceptance,
                max_model_len=max_model_len, seed=seed, timeout_s=timeout_s)
    if as_json:
        report.emit_json(rep.to_json())
    else:
        report.render_smoke(rep)
    if rep.red_flags:
        raise SmokeFailedError(rep.red_flags[0], reported=True)


@cli.command("check", epilog="""\b
Examples:
  eaglectl check ./drafter --target ./target                 # inspect + parity + card lint
  eaglectl check ./drafter --target ./target --smoke --card  # + vLLM smoke, write README.md
  eaglectl check --manifest drafters.jsonl --sarif eaglectl.sarif --json
""")
@click.argument("sources", nargs=-1)
@click.option("--target", metavar="TARGET", help="Target model (inspect against it; parity inputs; smoke).")
@click.option("--smoke", "run_smoke", is_flag=True, help="Also run the drafter under vLLM (needs --target).")
@click.option("--min-acceptance", type=float, help="Smoke fails below this mean acceptance length.")
@click.option("--card/--no-card", default=None,
              help="Write/update README.md (--card) or skip the card (--no-card); default: lint it if present.")
@click.option("--strict", is_flag=True, help="Inspect warnings fail the gate too.")
@click.option("--sarif", "sarif_path", type=click.Path(dir_okay=False), help="Also write the findings as SARIF 2.1.0.")
@click.option("--vllm-python", metavar="PATH", help="Interpreter with vLLM (default: $EAGLECTL_VLLM_PYTHON).")
@click.option("--allow-pickle", is_flag=True, help="Read .bin weights with torch.load(weights_only=True).")
@manifest_options
@json_option
def check_cmd(sources: tuple[str, ...], target: str | None, run_smoke: bool, min_acceptance: float | None,
              card: bool | None, strict: bool, sarif_path: str | None, vllm_python: str | None, allow_pickle: bool,
              manifest: str | None, fail_fast: bool, as_json: bool) -> None:
    """The pre-publish gate: inspect, parity self-check, optional smoke, model card — one exit code.

    Stages that cannot run here are reported as skipped with the reason, never as passed. Exit 0
    when every stage that ran passed, 1 otherwise (a batch: the worst item's code).
    """
    import json as _json
    from pathlib import Path

    from .check import check, sarif

    reports = []

    def one(item: dict[str, Any]) -> tuple[int, str, Any]:
        rep = check(item["source"], target=item.get("target"), run_smoke=run_smoke, card=card, strict=strict,
                    min_acceptance=min_acceptance, vllm_python=vllm_python, allow_pickle=allow_pickle)
        reports.append(rep)
        return rep.exit_code, ", ".join(f"{s.name} {s.status}" for s in rep.stages), rep

    def write_sarif() -> None:
        if sarif_path:
            Path(sarif_path).write_text(_json.dumps(sarif(reports), indent=1) + "\n")

    if manifest or len(sources) > 1:
        items = None if manifest else [{"source": s} for s in sources]
        try:
            _run_manifest("check", manifest, fail_fast, one, {"target": target}, need_dest=False, items=items)
        finally:
            write_sarif()
        return
    if not sources:
        raise click.UsageError("give SOURCE (or several, or --manifest FILE)")
    code, _, rep = one({"source": sources[0], "target": target})
    write_sarif()
    if as_json:
        report.emit_json(rep.to_json())
    else:
        report.render_check(rep)
    click.get_current_context().exit(code)


@cli.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion_cmd(shell: str) -> None:
    """Print the shell completion script, e.g. `eval "$(eaglectl completion bash)"`."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    click.echo(cls(cli, {}, "eaglectl", "_EAGLECTL_COMPLETE").source())


@cli.command("formats")
@json_option
def formats_cmd(as_json: bool) -> None:
    """List the dialects eaglectl reads, with their detection signals."""
    from .docs_data import dialect_rows

    rows = dialect_rows()
    if as_json:
        report.emit_json({"schema": "eaglectl.formats/1", "dialects": rows})
        return
    report.stdout.print(report.table(None, ["id", "name", "aux-id convention", "flags it records"], [
        (r["id"], r["title"], r["aux_convention"] + ("" if r["aux_ids_paths"] else " (ids not stored)"),
         ", ".join(r["flag_fields"]) or "none") for r in rows]))
    report.stdout.print("\n[dim]detection signals and key renames: eaglectl formats --json, docs/formats.md[/]")


@cli.command("rules")
@json_option
def rules_cmd(as_json: bool) -> None:
    """List every inspect rule with its severity and fix."""
    from .rules import RULES

    if as_json:
        report.emit_json({"schema": "eaglectl.rules/1",
                          "rules": [{"id": r.id, "severity": r.severity, "title": r.title, "fix": r.fix}
                                    for r in RULES.values()]})
        return
    report.stdout.print(report.table(None, ["rule", "severity", "meaning", "fix"],
                                     ((r.id, r.severity, r.title, r.fix) for r in RULES.values())))


def main() -> None:
    cli(prog_name="eaglectl")
