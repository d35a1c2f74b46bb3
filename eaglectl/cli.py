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
    3-12 specific failures (see docs/errors.md), 70 internal error.
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
@click.argument("source")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--to", "to", type=click.Choice(WRITABLE), required=True, help="Destination dialect.")
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
@json_option
def convert_cmd(source: str, dest: str, to: str, from_dialect: str | None, dtype: str | None, target: str | None,
                aux_layer_ids: tuple[int, ...] | None, source_aux_convention: str | None, max_shard_size: int | None,
                dry_run: bool, force: bool, allow_pickle: bool, as_json: bool) -> None:
    """Convert a drafter between dialects: planned, streamed, fail-closed, checked after writing.

    Every source tensor is copied (byte ranges), cast, dropped by a named rule, or the conversion
    fails naming it. Semantic flags, aux ids (translated between conventions) and the vocabulary
    mapping are written explicitly. DEST appears only when complete and re-checked.
    """
    from .convert import ConversionResult, execute, open_source, plan_conversion
    from .inspection import open_target

    src = open_source(source, from_dialect, allow_pickle)
    tgt = open_target(target) if target else None
    plan = plan_conversion(src, dest, to, dtype=dtype, target=tgt, aux_layer_ids=aux_layer_ids,
                           source_aux_convention=source_aux_convention, max_shard_size=max_shard_size)
    result = (ConversionResult(plan, False, []) if dry_run
              else execute(plan, src, target=tgt, force=force, progress=report.progress))
    if as_json:
        report.emit_json(result.to_json())
    else:
        report.render_conversion(result)


@cli.command("upgrade", epilog="""\b
Examples:
  eaglectl upgrade ./eagle3-head ./eagle31-head                        # fc_norm = 1, norm_output on
  eaglectl upgrade ./head ./head-31 --init calibrated --target ./target  # least-squares fc_norm
  eaglectl upgrade ./safeailab-head ./out --to speculators --target org/target
""")
@click.argument("source")
@click.argument("dest", type=click.Path(file_okay=False))
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
@json_option
def upgrade_cmd(source: str, dest: str, fc_norm: bool, norm_output: bool, init: str, target: str | None,
                calibration_text: str | None, to: str | None, from_dialect: str | None, dry_run: bool, force: bool,
                allow_pickle: bool, as_json: bool) -> None:
    """Take an EAGLE-3 drafter to the EAGLE-3.1 layout (fc_norm, norm_output).

    Not function-preserving: the result is a warm start for 3.1 fine-tuning, recorded as such in
    its config and metadata. Reports its fidelity to the source (per-step top-1 agreement and KL).
    Upgrading a drafter that already has the features changes nothing and says so.
    """
    from pathlib import Path

    from .upgrade import upgrade

    text = Path(calibration_text).read_text() if calibration_text else None
    result = upgrade(source, dest, fc_norm=fc_norm, norm_output=norm_output, init=init, target=target,
                     calibration_text=text, to=to, from_dialect=from_dialect, allow_pickle=allow_pickle, force=force,
                     dry_run=dry_run, progress=report.progress)
    if as_json:
        report.emit_json(result.to_json())
    else:
        report.render_upgrade(result)


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
