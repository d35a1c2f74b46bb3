"""The command table: each command's options (types and shared options from `params.py`, validated at parse time),
its one library call (`<command>.run`, imported when the command runs: the one place eaglectl imports lazily, so
that `--help` and a light command import nothing heavy), and its result handed to `report.finish` (through
`batch.single_or_batch` where a --manifest can run a batch). `app.py` adds them to the group in help order."""

from __future__ import annotations

from typing import Any

import click

from ..commands.requests import (
    PROTOCOLS,
    CaptureRequest,
    CheckRequest,
    ConvertRequest,
    DiffRequest,
    DriftRequest,
    InspectRequest,
    SmokeRequest,
    UpgradeRequest,
    UploadRequest,
    VerifyRequest,
    build,
)
from ..measure.workload import TEMPLATES
from . import params as params
from . import report
from .batch import single_or_batch


@click.command("inspect", short_help="Name a drafter's dialect and check its files.", epilog="""\b
Examples:
  eaglectl inspect ./my-drafter
  eaglectl inspect yuhuili/EAGLE3-LLaMA3.1-Instruct-8B --target meta-llama/Llama-3.1-8B-Instruct
  eaglectl inspect hf://org/drafter@v2 --json --strict
""")
@click.argument("source")
@params.target_option("Target model folder or Hub id: checks against its config and a few table rows.")
@params.from_option
@click.option("--revision", metavar="REV", help="Hub revision (not with an id that pins one).")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@params.for_option("The engines the report is for (vllm, sglang, or vllm,sglang): advice scoped to another engine "
                   "is shown as info.", InspectRequest.for_engine)
@click.option("--scan", is_flag=True, help="Stream every tensor and report NaN/Inf values.")
@params.engine_version_option
@params.measure_option
@params.states_option
@params.vllm_python_option("asked what each model runner reads", without="eaglectl's table")
@params.sglang_python_option
@params.allow_pickle_option
@params.json_option
def inspect_cmd(source: str, **options: Any) -> None:
    """Name the dialect of a drafter checkpoint and check everything the files can tell.

    SOURCE is a folder, a .safetensors file, a *.index.json, a .bin (with --allow-pickle) or a Hub
    repo (org/name, org/name@rev, hf://org/name@rev/subfolder). Only headers, config.json and
    small tensors (d2t, t2d) are read; --scan reads everything.
    """
    from ..commands import inspect as inspection

    report.finish("inspect", inspection.run(build(InspectRequest, options, source=source), report.progress))


@click.command("convert", short_help="Convert a drafter between dialects, checked after writing.", epilog="""\b
Examples:
  eaglectl convert ./eagle-head ./out --to speculators --target meta-llama/Llama-3.1-8B-Instruct
  eaglectl convert ./nemo-draft ./vllm-draft --to modelopt --dry-run
  eaglectl convert ./head ./head-fp16 --to specforge --dtype float16 --max-shard-size 2GB
  eaglectl convert ./head ./served --for vllm --target ./target  # picks the dialect, prints vllm serve
""")
@click.argument("source", required=False, metavar="SOURCE")
@click.argument("dest", required=False, metavar="DEST")
@click.option("--to", "to", type=params.DialectChoice(writable=True, layouts=True),
              help="Destination dialect (or DFlash layout). [required unless --for]")
@params.for_option("Instead of --to: the dialect these engines serve the drafter from best (vllm, sglang, or "
                   "vllm,sglang: one file every engine listed reads right; docs/engines.md); prints the serve lines "
                   "for DEST.", None)
@params.from_option
@params.dtype_option(None, "Cast float tensors to this precision.", shown="keep")
@params.target_option("Target model: verifier name, default aux ids, missing tables (folder or Hub id).")
@click.option("--aux-layer-ids", type=params.IntList(0, 1 << 16, "2,16,29"), metavar="IDS",
              help="Aux ids in vLLM's (boundary) convention, e.g. 2,16,29.")
@click.option("--source-aux-convention", type=click.Choice(["boundary", "output"]),
              help="What the source's aux ids mean, when the files cannot say (ModelOpt).")
@click.option("--max-shard-size", type=params.SIZE, metavar="SIZE", help="Shard the output (e.g. 5GB); must be > 0.")
@click.option("--embed-from-target", is_flag=True,
              help="Ship embed_tokens.weight from --target when the drafter has none (speculators' loader leaves a "
                   "missing one uninitialised; engines share the target's anyway).")
@params.base_model_option
@params.measure_option
@params.states_option
@params.write_options
@params.allow_pickle_option
@params.manifest_options()
@params.json_option
def convert_cmd(**options: Any) -> None:
    """Convert the drafter SOURCE to DEST in another dialect: planned, streamed, fail-closed, checked.

    Every source tensor is copied (byte ranges), cast, dropped by a named rule, or the conversion
    fails naming it. Semantic flags, aux ids (translated between conventions) and the vocabulary
    mapping are written explicitly. DEST appears only when complete and re-checked.
    """
    from ..commands.convert import command as convert

    single_or_batch("convert", lambda o: convert.run(build(ConvertRequest, o), report.progress))


@click.command("upgrade", short_help="Take an EAGLE-3 drafter to the EAGLE-3.1 layout.", epilog="""\b
Examples:
  eaglectl upgrade ./speculators-head ./head-31                        # fc_norm = 1, norm_output on
  eaglectl upgrade ./head ./head-31 --init calibrated --target ./target  # least-squares fc_norm
  eaglectl upgrade ./safeailab-head ./out --to speculators --target org/target
  eaglectl upgrade ./head ./head-31 --init calibrated --states ./states  # from eaglectl capture
  eaglectl upgrade ./head ./head-31 --target ./target --prompts my.jsonl  # AL as vLLM prints it on yours
""")
@click.argument("source", required=False, metavar="SOURCE")
@click.argument("dest", required=False, metavar="DEST")
@click.option("--fc-norm/--no-fc-norm", default=UpgradeRequest.fc_norm, show_default=True,
              help="Add per-aux fc_norm weights.")
@click.option("--norm-output/--no-norm-output", default=UpgradeRequest.norm_output, show_default=True,
              help="Feed back the post-norm state.")
@click.option("--init", type=click.Choice(["auto", "ones", "harmonic", "calibrated", "refit", "fit"]),
              default=UpgradeRequest.init,
              show_default=True, help="How fc_norm starts; auto measures every init with --target (acceptance on "
              "held-out prompts, or --prompts) or --states (FC-output error on held-out requests) and keeps the "
              "best; ones without either. fit: the best closed-form init tuned by the target's likelihood.")
@click.option("--fit-fc", is_flag=True, help="With the fit init: tune fc.weight too (not only fc_norm).")
@params.target_option("Target model (calibration, fidelity inputs, verifier name).")
@params.base_model_option
@params.states_option
@click.option("--prompts", metavar="FILE|DIR", help="Your prompts (smoke's loaders: builtin:NAME, JSONL, SPEED-Bench "
              "folder), up to 3 x --num-prompts of them: the acceptance before and after is reported on the first "
              "third (what vLLM prints on them: greedy, fp32), the inits are ranked on the next and calibrated and "
              "fitted on the rest; needs --target.")
@click.option("--num-prompts", type=click.IntRange(1, 10000), default=UpgradeRequest.num_prompts, show_default=True,
              help="Prompts reported on (as smoke's --num-prompts); the inits are ranked on as many of yours, or on "
              "half as many of each bundled kind of text.")
@click.option("--max-tokens", type=click.IntRange(1, 32768), default=UpgradeRequest.max_tokens, show_default=True,
              help="New tokens per prompt (as smoke's --max-tokens).")
@click.option("--calibration-text", type=params.TextFile(),
              help="UTF-8 text for calibration and fidelity (default: bundled).")
@click.option("--to", "to", type=params.DialectChoice(writable=True), help="Output dialect (default: the source's).")
@params.for_option("Instead of --to: the dialect these engines serve the upgraded drafter from best (vllm, sglang, "
                   "or vllm,sglang: one file every engine listed reads right).", None)
@params.from_option
@click.option("--fidelity/--no-fidelity", default=UpgradeRequest.fidelity, show_default=True,
              help="Measure the result against the source through the reference drafter.")
@params.write_options
@params.allow_pickle_option
@params.manifest_options()
@params.json_option
def upgrade_cmd(**options: Any) -> None:
    """Take the EAGLE-3 drafter SOURCE to the EAGLE-3.1 layout (fc_norm, norm_output) at DEST.

    Not function-preserving: the result is a warm start for 3.1 fine-tuning, recorded as such in
    its config and metadata. Reports its fidelity to the source (per-step top-1 agreement and KL).
    Upgrading a drafter that already has the features changes nothing and says so.
    """
    from ..commands.upgrade import command as upgrade

    single_or_batch("upgrade", lambda o: upgrade.run(build(UpgradeRequest, o), report.progress))


@click.command("verify", short_help="Numerical parity through the reference drafter.", epilog="""\b
Examples:
  eaglectl verify ./converted --against ./original          # conversion parity, fp32 CPU
  eaglectl verify ./drafter --dtype bfloat16 --device cuda  # precision parity vs fp32 CPU
  eaglectl verify ./drafter --target ./target-model --steps 5 --json
""")
@click.argument("candidate")
@click.option("--against", metavar="REFERENCE", help="Compare with this checkpoint (any dialect) on the same inputs.")
@params.target_option("Real aux states from this HF target (folder or Hub id); default: seeded synthetic states.")
@params.states_option
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=VerifyRequest.device, show_default=True,
              help="Where CANDIDATE runs (the reference of a precision check stays on CPU).")
@params.dtype_option(None, "Precision CANDIDATE runs at (a precision check compares it with fp32).",
              shown="float32 with --against, else bfloat16")
@click.option("--steps", type=click.IntRange(1, 32), default=VerifyRequest.steps, show_default=True,
              help="Draft steps per anchor.")
@click.option("--tokens", type=click.IntRange(2, 8192), default=VerifyRequest.tokens, show_default=True,
              help="Anchors (positions).")
@params.seed_option("Seed of the synthetic inputs.")
@click.option("--text", type=params.TextFile(), help="UTF-8 text for --target (default: bundled).")
@params.from_option
@click.option("--against-from", type=params.DialectChoice(), help="Dialect of REFERENCE.")
@params.allow_pickle_option
@params.json_option
def verify_cmd(candidate: str, **options: Any) -> None:
    """Numerical parity of a drafter through the reference drafter.

    With --against: conversion parity (identical tensors must give identical outputs; a dtype
    change gets that precision's tolerance; an upgrade of REFERENCE gets the upgrade regime: carried
    tensors identical, outputs a warm start). Without: CANDIDATE at --dtype (default bfloat16) on
    --device against its own fp32 CPU run. Reports per draft step; exit 8 when a step fails.
    """
    from ..commands import verify

    report.finish("verify", verify.run(build(VerifyRequest, options, candidate=candidate), report.progress))


@click.command("diff", epilog="""\b
Examples:
  eaglectl diff ./head ./head-speculators                  # a conversion: equivalent, exit 0
  eaglectl diff ./head-3.0 ./head-3.1 --json               # flags and fc_norm tensors differ, exit 1
  eaglectl diff ./safeailab-head ./converted --target ./target   # default aux ids resolved on the target
""")
@click.argument("a")
@click.argument("b")
@click.option("--values/--no-values", default=DiffRequest.values, show_default=True,
              help="Compare tensor values (max |A-B|, streamed); --no-values compares names, dtypes and shapes only.")
@click.option("--atol", type=params.Number(0.0), default=DiffRequest.atol, show_default=True,
              help="Values within this max absolute difference count as equal.")
@params.target_option("Target model (its config): compare aux ids as the boundaries vLLM captures on it, so "
               "'no ids' (engine default) equals the default written out.")
@click.option("--from-a", type=params.DialectChoice(), help="A's dialect, when detection cannot tell.")
@click.option("--from-b", type=params.DialectChoice(), help="B's dialect, when detection cannot tell.")
@params.allow_pickle_option
@params.json_option
def diff_cmd(a: str, b: str, **options: Any) -> None:
    """Compare two drafters by meaning, across dialects.

    Reports differing spec fields (aux ids in vLLM's boundary numbering, flags, sizes), tensors only
    in A or only in B, dtype and shape differences, and value differences (max |A-B|). Exit 0 when
    equivalent, 1 when they differ.
    """
    from ..commands import diff

    report.finish("diff", diff.run(build(DiffRequest, options, a=a, b=b), report.progress))


@click.command("smoke", short_help="Measure acceptance under vLLM or the reference loop.", epilog="""\b
Examples:
  eaglectl smoke ./drafter --target ./target --baseline none,ngram
  eaglectl smoke ./drafter --target org/model --num-speculative-tokens 5 --prompts builtin:long
  eaglectl smoke ./drafter --target ./target --engine reference --json
  eaglectl smoke ./drafter --states ./conts --engine reference     # replayed from capture --max-tokens
""")
@click.argument("drafter")
@params.target_option("Target model folder or Hub id (with a tokenizer).")
@click.option("--states", metavar="DIR", type=click.Path(exists=True, file_okay=False),
              help="Instead of --target, with --engine reference: a capture of greedy continuations (made with "
                   "capture --max-tokens N); the loop replays its prompts, in order, as many tokens as it holds "
                   "(or --max-tokens).")
@click.option("--engine", type=click.Choice(["vllm", "reference"]), default=SmokeRequest.engine, show_default=True,
              help="Real vLLM (its own interpreter) or eaglectl's reference loop (same counts, no vLLM needed).")
@click.option("-k", "--num-speculative-tokens", "k", type=click.IntRange(1, 16), default=SmokeRequest.k,
              show_default=True,
              help="Draft tokens per step (k).")
@click.option("--prompts", default=SmokeRequest.prompts, show_default=True,
              help="builtin:short (code), builtin:long, builtin:calibration, builtin:chat, builtin:prose, "
                   "builtin:math (upgrade's report prompts of each kind), a JSONL file ({'prompt': text}, {'messages': "
                   "[...]} or {'prompt_token_ids'}), or a local SPEED-Bench folder (parquet; reported per category).")
@click.option("--num-prompts", type=click.IntRange(1, 10000), default=SmokeRequest.num_prompts, show_default=True,
              help="How many prompts to run.")
@click.option("--max-tokens", type=click.IntRange(1, 32768), default=SmokeRequest.max_tokens, show_default=True,
              help="New tokens per prompt (greedy, EOS ignored).")
@click.option("--max-model-len", type=click.IntRange(16, 1 << 20), default=SmokeRequest.max_model_len,
              show_default=True,
              help="Context window given to vLLM.")
@click.option("--concurrency", type=params.IntList(1, 4096), default=",".join(map(str, SmokeRequest.concurrency)),
              show_default=True,
              help="Concurrency levels for throughput and speedup (vLLM engine).")
@click.option("--baseline", "baselines", type=params.BASELINES, default="none", show_default=True,
              help="Comma list: none, ngram, draft_model:PATH, eagle3:PATH (or a drafter path).")
@params.dtype_option("float32", "Precision the target (and the drafter) runs at.")
@params.tensor_parallel_option("vLLM tensor parallelism of the target.")
@params.vllm_python_option("running the drafter (--engine vllm)")
@click.option("--server", metavar="URL", help="Measure an already running vLLM server serving TARGET with DRAFTER: "
              "prompts via its completions API, acceptance from its /metrics counters (deltas around the run).")
@click.option("--min-acceptance", type=params.Number(1.0, 65.0),
              help="Fail (exit 9) below this mean acceptance length.")
@click.option("--timeout-s", type=params.Number(0.0, 86400.0, lo_open=True), default=SmokeRequest.timeout_s,
              show_default=True,
              help="Give up on vLLM after this many seconds.")
@params.seed_option("Seed for prompt sampling and vLLM.")
@click.option("--context-lengths", type=params.IntList(16, 1 << 20, example="2k,8k", k_suffix=True),
              help="Also run prompts of exactly these lengths (1k = 1024 tokens, built from the workload) and report "
                   "acceptance per length; --max-model-len grows to fit.")
@params.plot_option("per-position acceptance, AL by context length and speedup by concurrency")
@click.option("--profile", type=params.OutputFile(), help="Also write the measured acceptance as ModelOpt's "
              "speculation_profile.json (conditional and marginal rates per position, histogram, conditions).")
@click.option("--runner", type=click.Choice(["v1", "v2", "both"]), help="vLLM model runner(s) to measure: V1 (every "
              "CPU build), V2 (the GPU default; emulated on CPU by pinning its layers in a staged copy), or both. "
              "Default: both when their readings differ, else the one vLLM uses here.")
@click.option("--reference-layers", type=click.Choice(["runner", "measured"]),
              default=SmokeRequest.reference_layers, show_default=True,
              help="--engine reference: run the layers each vLLM runner reads, or the layers the probe measured.")
@click.option("--serving-option", "serving_options", multiple=True, type=params.SERVING_OPTION, metavar="KEY=VALUE",
              callback=params.merge_serving_options,
              help="Override a serving option that changes acceptance (rejection_sample_method, "
                   "draft_lm_head_quantization); recorded as an override. Default: vLLM's standard ones, forced.")
@params.json_option
def smoke_cmd(**options: Any) -> None:
    """Run DRAFTER on TARGET under real vLLM (or the reference loop) and measure acceptance.

    Greedy, fixed prompts, counters around the measured batch. Reports mean acceptance length
    (with the bonus token), accepted draft length, draft acceptance rate, per-position acceptance,
    greedy-output match against no speculation, per-user throughput and speedup by concurrency,
    and baselines side by side. Red flags (no drafts, acceptance ~1, ~k+1 with repetition, below
    --min-acceptance, vLLM's runners reading different layers from each other or from the drafter's
    intended reading) exit 9 after the report.
    """
    from ..commands.smoke import command as smoke

    if not options["target"] and not options["states"]:
        raise click.UsageError("Missing option '--target' (or --states DIR with --engine reference).")
    if options["states"] and click.get_current_context().get_parameter_source("max_tokens") is \
            click.core.ParameterSource.DEFAULT:
        options["max_tokens"] = 0  # the capture's continuations, as long as they are
    report.finish("smoke", smoke.run(build(SmokeRequest, options, target=options["target"] or ""), report.progress))


@click.command("check", short_help="The pre-publish gate: inspect, parity, smoke, card.", epilog="""\b
Examples:
  eaglectl check ./drafter --target ./target                 # inspect + parity + card lint
  eaglectl check ./drafter --target ./target --smoke --card  # + vLLM smoke, write README.md
  eaglectl check ./drafter --target ./target --engine reference --num-prompts 8   # a CPU runner's smoke
  eaglectl check --manifest drafters.jsonl --sarif eaglectl.sarif --json
""")
@click.argument("sources", nargs=-1, metavar="SOURCE...")
@params.gate_options
@click.option("--sarif", "sarif_path", type=params.OutputFile(), help="Also write the findings as SARIF 2.1.0.")
@params.manifest_options(dest=False)
@params.json_option
def check_cmd(sarif_path: str | None, **options: Any) -> None:
    """The pre-publish gate for each drafter in SOURCE... (or each --manifest line): inspect, parity
    self-check, optional smoke, model card, and the files that would be uploaded (no local path).

    A stage you asked for (--smoke, --engine, --min-acceptance, --card) that cannot run is a failure,
    never "skipped". Exit 0 when every stage that ran passed, 1 when one failed on the drafter, 10
    when a requested stage cannot run on this machine (no vLLM); a batch: the worst item's code.
    """
    from ..commands import check

    with check.gates(sarif_path, report.progress) as gate:
        single_or_batch("check", lambda o: gate(build(CheckRequest, o)), need_dest=False)


@click.command("upload", short_help="After a PASS: the gate, then the folder to the Hub.", epilog="""\b
Examples:
  eaglectl upload ./head-31 my-org/head-31 --target ./target --dry-run   # the gate and the planned commit
  eaglectl upload ./head-31 my-org/head-31 --target ./target --card --base-model org/target
  eaglectl upload ./head-31 my-org/head-31 --revision v2 --create-pr     # a pull request against branch v2
""")
@click.argument("folder", metavar="DEST")
@click.argument("repo_id", metavar="ORG/NAME", type=params.HubId())
@click.option("--revision", metavar="BRANCH", help="Commit to this branch (created when missing; the PR's base with "
              "--create-pr); default: the repo's main branch.")
@click.option("--create-pr", is_flag=True, help="Open a pull request instead of committing to the branch.")
@click.option("--private", is_flag=True, help="Create the repo private when it does not exist (an existing repo's "
              "visibility is not changed).")
@click.option("--commit-message", metavar="TEXT", help="The commit's title (default: made from the gate's report; "
              "the description always lists the stages).")
@click.option("--dry-run", is_flag=True, help="Run the gate and list the commit's operations; send nothing.")
@params.gate_options
@params.json_option
def upload_cmd(folder: str, repo_id: str, revision: str | None, create_pr: bool, private: bool,
               commit_message: str | None, dry_run: bool, **options: Any) -> None:
    """Run the pre-publish gate on DEST (as `eaglectl check`, same options), then upload DEST to the
    Hub repo ORG/NAME in one commit.

    Refuses, uploading nothing, when the gate fails, cannot finish here (exit 10), or finds a local
    path in any file that would be uploaded. The files are those check lists (all but dot-files;
    never one outside DEST: a link out of it, to a folder or to nothing, a FIFO or a device refuses
    the upload, named); the commit message and description are made from the gate's report. The token is HF_TOKEN (or
    the one `hf auth login` stored); the network is touched only after the gate passed.
    """
    from ..commands import upload

    req = UploadRequest(folder, repo_id, build(CheckRequest, options, source=folder), revision, create_pr, private,
                        commit_message, dry_run)
    report.finish("upload", upload.run(req, report.progress))


@click.command("capture", short_help="Capture a target's hidden states for --states.", epilog="""\b
Examples:
  eaglectl capture ./target --out ./states                               # HF transformers, layers auto
  eaglectl capture org/big-target --engine vllm --drafter ./head --tensor-parallel-size 8 --out ./states
  eaglectl capture org/big-target --drafter ./head --print-recipe --out ./states   # for your own vllm serve
  eaglectl upgrade ./head ./head-31 --states ./states                    # then use it
  eaglectl capture ./target --prompts mine.jsonl --max-tokens 64 --out ./conts  # acceptance from a capture
""")
@click.argument("target")
@click.option("--out", required=True, metavar="DIR", help="Folder to write (must not exist, unless --force).")
@click.option("--engine", type=click.Choice(["hf", "vllm", "server"]), default=CaptureRequest.engine, show_default=True,
              help="hf: HF transformers (one device); vllm: vLLM in its own interpreter (whatever it serves); "
                   "server: your running vllm serve (--server-url; start it as --print-recipe says).")
@click.option("--server-url", metavar="URL", help="The vllm serve to drive with --engine server.")
@click.option("--server-storage", metavar="DIR", help="--engine server: the shared_storage_path the server dumps into; "
              "only dumps in it are read and removed (default: OUT.raw, as --print-recipe configures).")
@click.option("--layers", default=CaptureRequest.layers, show_default=True, metavar="IDS|auto",
              help="Boundary ids (vLLM's numbering, 0..L), or auto: the drafter's readings and their neighbours "
                   "(what the probe compares), plus 0 and L.")
@click.option("--drafter", metavar="DRAFTER", help="The drafter whose layers --layers auto captures.")
@click.option("--prompts", default=CaptureRequest.prompts, show_default=True,
              help="builtin:calibration, builtin:short, builtin:long, builtin:chat, builtin:prose, builtin:math, or "
                   "a JSONL file ({'prompt'}, {'messages'} or {'prompt_token_ids'}).")
@click.option("--num-prompts", type=click.IntRange(1, 1_000_000), default=CaptureRequest.num_prompts, show_default=True,
              help="Requests to capture.")
@click.option("--length", type=click.IntRange(8, 1 << 20), default=CaptureRequest.length, show_default=True,
              help="Tokens per request of the built-in prompt sets.")
@click.option("--max-tokens", type=click.IntRange(0, 32768), default=CaptureRequest.max_tokens, show_default=True,
              help="Also decode each prompt's greedy continuation of this many tokens (+k) and capture prompt and "
                   "continuation in one prefill: acceptance then replays from the capture (upgrade, inspect, smoke "
                   "--engine reference --states). --engine hf or vllm.")
@click.option("-k", "--num-speculative-tokens", "k", type=click.IntRange(1, 16), default=CaptureRequest.k,
              show_default=True, help="Draft steps the continuations serve (with --max-tokens).")
@params.dtype_option("float32", "Precision the target runs at (the states are stored at it).")
@params.tensor_parallel_option("vLLM tensor parallelism of the target (--engine vllm, --print-recipe).")
@click.option("--max-model-len", type=click.IntRange(16, 1 << 24), help="vLLM context window (default: fits the "
              "longest prompt).")
@click.option("--vllm-arg", "vllm_args", type=params.EngineArg(), multiple=True, metavar="KEY=VALUE",
              help="Extra vLLM engine argument, repeatable (e.g. quantization=fp8, gpu_memory_utilization=0.9).")
@params.vllm_python_option("running the target (--engine vllm)")
@click.option("--print-recipe", is_flag=True, help="Run nothing: print the vllm serve flags and client loop that "
              "write the same folder from your own server.")
@click.option("--timeout-s", type=params.Number(0.0, 7 * 86400.0, lo_open=True), default=CaptureRequest.timeout_s,
              show_default=True,
              help="Give up on vLLM after this many seconds.")
@params.seed_option("Seed for prompt sampling.")
@click.option("--force", is_flag=True, help="Replace an existing --out folder that holds only a capture.")
@params.json_option
def capture_cmd(vllm_args: tuple[tuple[str, Any], ...], **options: Any) -> None:
    """Capture TARGET's hidden states at chosen boundaries, for --states on the other commands.

    Writes vLLM's own dump layout (one safetensors per request: token_ids, hidden_states
    [seq, layers, hidden], and the target's greedy next tokens) plus capture.json (boundaries,
    target identity and config, engine and versions, prompts). Both engines write the same layout.
    """
    from ..commands import capture

    flags = params.given_flags("prompts", "num_prompts", "length", "seed")  # what the recipe's client loop repeats
    req = build(CaptureRequest, options, vllm_args=dict(vllm_args), recipe_flags=flags)
    report.finish("capture", capture.run(req, report.progress))


@click.command("drift", short_help="Measure attention drift and state growth by depth.", epilog="""\b
Examples:
  eaglectl drift ./eagle3 ./eagle3.1 --target ./target               # side by side, depth 0..7
  eaglectl drift ./drafter --target ./target --context-lengths 1k,4k,16k --plot drift.png
  eaglectl drift ./drafter --target ./target --prompts chat.jsonl --templates training,changed,none
  eaglectl drift ./drafter --states ./states --json                  # a capture of a big target
""")
@click.argument("drafters", nargs=-1, required=True)
@params.target_option("Target model (folder or Hub id): runs the acceptance loop and gives the states.")
@params.states_option
@click.option("--protocol", type=click.Choice(list(PROTOCOLS)), default=DriftRequest.protocol, show_default=True,
              help="Named definitions of sink, window and anchors (docs/drift.md); the options below override them.")
@click.option("--depth", type=click.IntRange(1, 64), default=DriftRequest.depth, show_default=True,
              help="Draft steps per chain (deeper than training shows extrapolation).")
@click.option("-k", "--num-speculative-tokens", "k", type=click.IntRange(1, 16), default=DriftRequest.k,
              show_default=True,
              help="k of the acceptance loop (the same loop as smoke --engine reference).")
@click.option("--prompts", default=DriftRequest.prompts, show_default=True,
              help="builtin:short, builtin:long, builtin:calibration, builtin:chat, builtin:prose, builtin:math, or a "
                   "JSONL file (as smoke).")
@click.option("--num-prompts", type=click.IntRange(1, 10000), default=DriftRequest.num_prompts, show_default=True,
              help="Prompts per "
              "condition (with --states: captured requests).")
@click.option("--max-tokens", type=click.IntRange(2, 32768), default=DriftRequest.max_tokens, show_default=True,
              help="Answer tokens per prompt; anchors step through the answer.")
@click.option("--context-lengths", type=params.IntList(16, 1 << 20, example="1k,4k", k_suffix=True),
              help="Axis: prompts of exactly these lengths (1k = 1024 tokens), built from the workload.")
@click.option("--templates", type=params.ChoiceList(TEMPLATES),
              help="Axis: the JSONL chat prompts as written, with --system-prompt instead, or with no system prompt.")
@click.option("--system-prompt", default=DriftRequest.system_prompt, show_default=True,
              help="The system prompt of the `changed` template.")
@click.option("--sink-tokens", type=click.IntRange(1, 1 << 20), help="Positions counted as the sink (protocol: 1).")
@click.option("--recent-window", type=click.IntRange(1, 1 << 20), help="Context positions counted as recent "
              "(protocol: 16).")
@click.option("--anchor-every", type=click.IntRange(1, 1 << 20), help="Anchor spacing in the answer (protocol: 8).")
@click.option("--bootstrap", "bootstrap_reps", type=click.IntRange(100, 100_000),
              default=DriftRequest.bootstrap_reps, show_default=True,
              help="Bootstrap resamples for the 95 % intervals.")
@params.seed_option("Seed for prompt sampling and the bootstrap.")
@params.plot_option("attention masses and state RMS by depth, drafters overlaid")
@params.json_option
def drift_cmd(**options: Any) -> None:
    """Measure attention drift of DRAFTERS: where each one's attention goes as speculation deepens.

    Free-running chains from anchors inside real text, in the reference drafter. Per depth:
    attention mass on the sink, on the chain's own tokens and on recent context, attention
    entropy, and the RMS of the state fed back (what EAGLE 3.1's norm_output bounds), with
    95 % bootstrap intervals and the spread over heads; plus the acceptance length of the same
    run (--target). Several drafters side by side; context-length and template axes.
    """
    from ..commands import drift

    report.finish("drift", drift.run(build(DriftRequest, options), report.progress))


COMMANDS = (inspect_cmd, convert_cmd, upgrade_cmd, verify_cmd, diff_cmd, smoke_cmd, check_cmd, upload_cmd, capture_cmd,
            drift_cmd)
