"""`eaglectl capture`: target hidden states at chosen boundaries, through vLLM or HF transformers.

Both engines write vLLM's own dump layout — one safetensors file per request with `token_ids` [seq]
and `hidden_states` [seq, n_layers, hidden] — plus `capture.json` (boundary ids, target identity and
config, engine and versions, prompt source), so the two are interchangeable and comparable, and any
command that needs target states takes the folder as `--states DIR` (`io/states.py`).

`--engine vllm` runs vLLM's `extract_hidden_states` speculative method in its own interpreter (the
worker `workers/vllm_capture.py`): on CPU with eaglectl's synchronous connector (`workers/`, loaded by
module path, never a patch), on GPU with vLLM's stock connector. It scales to whatever the user's vLLM
runs (tensor parallelism, quantized targets); HF transformers runs one device.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..checkpoint.drafter import open_drafter
from ..checkpoint.target import TargetCheckpoint, open_target
from ..engines.engine_process import WORKERS, WorkerRun, engine_path, find_vllm_python
from ..engines.http import Deadline, check_url, post_json, server_model
from ..errors import CaptureFailedError, CorruptCheckpointError, ServerReplyError, UsageError, filesystem_error
from ..io import cast as casting
from ..io.atomic import local_inputs, staged_output
from ..io.dtypes import CONFIG_NAMES
from ..io.safetensors import (
    ByteRange,
    LocalFile,
    TensorEntry,
    entry_from_bytes,
    read_header,
    read_tensor,
    write_safetensors,
)
from ..io.states import CAPTURE_JSON, SCHEMA
from ..measure.workload import load_prompts, needs_chat, tokenizer_of
from ..progress import Progress, passthrough
from ..result import Result
from ..spec import default_aux_ids
from .requests import CaptureRequest

WORKER = WORKERS / "vllm_capture.py"


@dataclass
class CaptureResult(Result):
    SCHEMA, COMMAND = "eaglectl.capture-result/1", "capture"

    out: str
    engine: str
    layer_ids: tuple[int, ...]
    requests: int
    tokens: int
    seconds: float
    meta: dict[str, Any] = field(default_factory=dict)
    log: str | None = None
    recipe: str | None = None  # --print-recipe: nothing was run

    def summary_line(self) -> str:
        return f"{self.requests} requests, {self.tokens} tokens, boundaries {list(self.layer_ids)}"

    def payload(self) -> dict[str, Any]:
        return {"out": self.out, "engine": self.engine, "layer_ids": list(self.layer_ids), "requests": self.requests,
                "tokens": self.tokens, "seconds": round(self.seconds, 3),
                "tokens_per_second": round(self.tokens / self.seconds, 1) if self.seconds else None,
                "capture": self.meta, "log": self.log, "recipe": self.recipe}


def choose_layers(t: TargetCheckpoint, layers: str, drafter: str | None) -> tuple[int, ...]:
    """Explicit ids, or `auto`: the drafter's possible readings (stored ids read both ways and shifted
    once more each way, or the engines' default and its neighbours) so the probe can decide from one
    capture, plus 0 (the embeddings) and L (the last layer before the final norm)."""
    L = t.num_layers
    if L is None:
        raise UsageError(f"{t.source}: the target config has no num_hidden_layers")
    if layers != "auto":
        try:
            ids = tuple(sorted({int(x) for x in layers.split(",")}))
        except ValueError:
            raise UsageError(f"--layers {layers!r}: comma-separated boundary ids or auto") from None
        bad = [i for i in ids if not 0 <= i <= L]
        if bad:
            raise UsageError(f"--layers: {bad} outside 0..{L} (boundaries of this {L}-layer target)")
        return ids
    base: tuple[int, ...] = default_aux_ids(L, "boundary")
    if drafter is not None:

        stored = open_drafter(drafter).spec.aux_layer_ids
        base = tuple(stored) if stored is not None else base
    return tuple(sorted({0, L} | {i + s for i in base for s in (-1, 0, 1, 2) if 0 <= i + s <= L}))


def prompt_set(t: TargetCheckpoint, prompts: str, count: int, length: int, seed: int) -> tuple[list[list[int]], str]:

    tok = tokenizer_of(t.source, chat=needs_chat(prompts))
    if tok is None:
        raise UsageError(f"{t.source}: the target has no tokenizer; give --prompts as JSONL with prompt_token_ids")
    ps = load_prompts(prompts, tok, count=count, max_tokens=1, max_model_len=length + 3, k=0, seed=seed,
                      vocab=t.vocab_size)
    return ps.prompts, ps.description


def run(req: CaptureRequest, progress: Progress = passthrough) -> CaptureResult:
    """Capture `target`'s states at boundaries `layers` for the prompts into OUT (staged, then renamed); with
    `print_recipe`, run nothing: the serve flags and client loop that write the same folder."""
    if req.print_recipe:
        return recipe(req.target, req.layers, req.drafter, req.out, req.tensor_parallel_size, req.recipe_flags)
    target, out, engine, prompts, dtype, timeout_s = req.target, req.out, req.engine, req.prompts, req.dtype, \
        req.timeout_s
    if engine == "server" and not req.server_url:
        raise UsageError("--engine server needs --server-url (a vllm serve started as --print-recipe says)")
    if req.max_tokens and engine == "server":
        raise UsageError("--max-tokens with --engine server: continuations are decoded by --engine hf or vllm (a "
                         "server's dumps are read one request at a time)",
                         hint="capture with --engine vllm (or hf), or without --max-tokens (the prompts alone)")
    t = open_target(target)
    ids = choose_layers(t, req.layers, req.drafter)
    token_lists, how = prompt_set(t, prompts, req.num_prompts, req.length, req.seed)
    started = time.perf_counter()
    with staged_output(out, force=req.force, sources=local_inputs(t, req.drafter, prompts)) as stage:
        if engine == "vllm":
            (versions, timings), log = _vllm(target, stage, ids, token_lists, dtype, req.tensor_parallel_size,
                                             req.max_model_len, dict(req.vllm_args or {}), req.vllm_python,
                                             timeout_s, progress, req.max_tokens + req.k if req.max_tokens else 0)
        elif engine == "server":
            (versions, timings), log = _server(req.server_url, stage, ids, token_lists, timeout_s, progress,
                                               t.hidden_size, t.vocab_size, req.server_storage or storage_folder(out)
                                               ), None
        else:
            (versions, timings), log = _hf(target, stage, ids, token_lists, dtype, progress,
                                           (req.max_tokens, req.k)), None
        stored = read_header(LocalFile(stage / "00000.safetensors")).tensors["hidden_states"].dtype
        meta = {"schema": SCHEMA, "tool_version": __version__, "layer_ids": list(ids), "convention": "boundary",
                "target": target, "target_hub_id": t.hub_id, "target_config": t.config.data, "engine": engine,
                "dtype": stored, "versions": versions, "timings_s": timings,
                "prompts": {"source": prompts, "description": how, "count": len(token_lists)},
                "tokens": sum(len(p) + (req.max_tokens + req.k if req.max_tokens else 0) for p in token_lists),
                "files": [f"{i:05d}.safetensors" for i in range(len(token_lists))]}
        if req.max_tokens:  # each request: the prompt, then its greedy continuation (io/states.py)
            meta["continuation"] = {"max_tokens": req.max_tokens, "k": req.k,
                                    "prompt_lengths": [len(p) for p in token_lists]}
        try:
            (stage / CAPTURE_JSON).write_text(json.dumps(meta, indent=1) + "\n")
        except OSError as e:
            raise filesystem_error(e, "write the capture in", stage) from None
    return CaptureResult(str(out), engine, ids, len(token_lists), meta["tokens"], time.perf_counter() - started, meta,
                         log)


def _write_dump(path: Path, entries: list[TensorEntry]) -> None:
    """One request's dump; a refused write (a full disk, a quota) is one FilesystemError line, as convert's."""
    try:
        write_safetensors(path, entries, {"format": "pt"})
    except OSError as e:
        raise filesystem_error(e, "write the capture in", path.parent) from None


def _hf(target: str, stage: Path, ids: tuple[int, ...], prompts: list[list[int]], dtype: str, progress: Progress,
        continuation: tuple[int, int] = (0, 0)) -> tuple[dict[str, Any], dict[str, float]]:
    """With `continuation` (max_tokens, k), each prompt is first continued by max_tokens + k greedy tokens (as the
    reference loop's target decodes them, model/replay.py), and the states of prompt and continuation are
    captured in one prefill."""
    import torch

    from ..model.hf import forward, load_model
    from ..model.loader import DTYPES
    from ..model.replay import decode_greedily

    started = time.perf_counter()
    model = load_model(target, dtype=DTYPES[dtype])
    loaded = time.perf_counter()
    if continuation[0]:
        prompts = [seq.tolist() for seq in decode_greedily(model, prompts, sum(continuation), progress)]
    st_dtype = CONFIG_NAMES[dtype]
    for i, p in enumerate(progress(prompts, label="capturing (HF)", total=len(prompts))):
        with torch.no_grad():
            logits, aux = forward(model, torch.tensor([p]), ids)
        hidden = aux[0].reshape(len(p), len(ids), -1).numpy()  # (seq, n_layers, H): concatenation order = ids
        tokens = torch.tensor(p, dtype=torch.int64).numpy().tobytes()
        argmax = logits[0].argmax(-1).to(torch.int64).numpy().tobytes()
        data = casting.encode(hidden, st_dtype)
        _write_dump(stage / f"{i:05d}.safetensors", [
            TensorEntry("hidden_states", st_dtype, hidden.shape, lambda data=data: (data,)),
            TensorEntry("target_argmax", "I64", (len(p),), lambda argmax=argmax: (argmax,)),
            TensorEntry("token_ids", "I64", (len(p),), lambda tokens=tokens: (tokens,))])
    import transformers

    versions = {"transformers": transformers.__version__, "torch": torch.__version__, "python": sys.version.split()[0]}
    return versions, {"load": round(loaded - started, 3), "capture": round(time.perf_counter() - loaded, 3)}


def _vllm(target: str, stage: Path, ids: tuple[int, ...], prompts: list[list[int]], dtype: str, tp: int,
          max_model_len: int | None, args: dict[str, Any], vllm_python: str | None, timeout_s: float,
          progress: Progress, continue_tokens: int = 0) -> tuple[tuple[dict[str, Any], dict[str, float]], str]:
    """`continue_tokens`: the worker first decodes that many greedy tokens per prompt (the engine's own greedy
    continuation), then captures prompt and continuation in one prefill."""
    python = find_vllm_python(vllm_python)
    request = {"target": engine_path(target), "dtype": dtype, "layer_ids": list(ids),
               "prompts": prompts, "out_dir": str(stage), "tensor_parallel_size": tp,
               "max_model_len": max_model_len or max(len(p) for p in prompts) + continue_tokens + 8,
               "engine_args": args, "continue_tokens": continue_tokens}
    run = WorkerRun(python, request, timeout_s, worker=WORKER, error=CaptureFailedError)

    def written() -> int:  # the connector's dumps as requests finish, then the worker's renamed files
        return sum(1 for _ in (stage / ".vllm_hidden_states").glob("*.safetensors")) + \
            sum(1 for _ in stage.glob("*.safetensors"))

    for _ in progress(run.ticks(written), label="capturing (vLLM)", total=len(prompts), weight=lambda n: n):
        pass
    result, log = run.result()
    if not result.get("ok"):
        raise CaptureFailedError(f"vLLM capture failed: {result.get('error')} (log: {log})")
    run.discard()  # succeeded: no scratch folder left in the temp directory
    return (result.get("versions", {}), result.get("timings_s", {})), None


def storage_folder(out: str) -> str:
    """Where the --print-recipe server dumps its states: beside OUT, as OUT.raw."""
    return str(Path(out).resolve()) + ".raw"


def _server(url: str, stage: Path, ids: tuple[int, ...], prompts: list[list[int]], timeout_s: float, progress: Progress,
            hidden_size: int | None, vocab: int | None, storage: str) -> tuple[dict[str, Any], dict[str, float]]:
    """Through a running `vllm serve` with hidden-state extraction (the --print-recipe flags): each prompt
    as token ids with max_tokens=1 and prompt_logprobs=1; the server writes the dump into its storage
    folder (same filesystem as here), which is read, completed with the target's greedy next tokens
    and written into OUT. The replies are untrusted (engines/http.py, the whole capture within `timeout_s`):
    a dump is used, and removed, only when it lies in `storage` (the folder the server was told to dump into)
    and is a regular file holding exactly the prompt sent; any other path is neither read nor removed."""



    started = time.perf_counter()
    deadline = Deadline(timeout_s)
    base = check_url(url)
    model = server_model(base, timeout_s, deadline, CaptureFailedError)
    endpoint = f"{base}/v1/completions"
    folder = Path(os.path.realpath(storage))
    for i, p in enumerate(progress(prompts, label="capturing (server)", total=len(prompts))):
        r = post_json(endpoint, {"model": model, "prompt": p, "max_tokens": 1, "temperature": 0.0,
                                 "prompt_logprobs": 1, "return_token_ids": True},
                      timeout_s=timeout_s, deadline=deadline)
        kv = r.get("kv_transfer_params") if isinstance(r, dict) else None
        path = kv.get("hidden_states_path") if isinstance(kv, dict) else None
        if not path:
            raise CaptureFailedError(f"{base}: no hidden_states_path in the response (is the server started with "
                                     "the extract_hidden_states method and the hidden-states connector?)")
        if not isinstance(path, str) or "\x00" in path or not Path(path).is_absolute() \
                or not path.endswith(".safetensors"):
            raise ServerReplyError(f"{endpoint}: hidden_states_path {str(path)[:200]!r} is not an absolute "
                                   "*.safetensors path", url=endpoint)
        argmax = _greedy_next(r, endpoint, len(p), vocab)
        dump = Path(os.path.realpath(Path(path).parent)) / Path(path).name  # the name itself stays unfollowed
        if dump.parent != folder and not dump.parent.is_relative_to(folder):
            raise CaptureFailedError(f"{path}: the server names a dump outside the storage folder {folder}; only "
                                     "dumps there are read and removed", path=path,
                                     hint="start the server as --print-recipe says, or pass --server-storage with "
                                          "the shared_storage_path it was started with")
        _wait_for_unlocked(dump, max(0.0, deadline.left()))
        if not _regular(dump):
            raise CaptureFailedError(f"{path}: the dump the server names is not a regular file")
        src = LocalFile(dump)
        try:
            header = read_header(src)
            info, tok = header.tensors.get("hidden_states"), header.tensors.get("token_ids")
            if info is None or tok is None:
                raise CaptureFailedError(f"{path}: not a hidden-states dump (no hidden_states / token_ids)")
            if tok.dtype not in ("I64", "I32") or len(tok.shape) != 1 or info.dtype not in ("F32", "BF16", "F16"):
                raise CaptureFailedError(f"{path}: token_ids {tok.dtype} / hidden_states {info.dtype}: not a dump of "
                                         "integer ids and float states")
            tokens = read_tensor(src, header, "token_ids").astype(np.int64)
        except CorruptCheckpointError as e:
            raise CaptureFailedError(f"{path}: not a hidden-states dump ({e.message})") from None
        if tokens.tolist() != list(p):
            raise CaptureFailedError(f"{path}: the dump holds other tokens than the prompt sent (another request's "
                                     "dump?)")
        if len(info.shape) != 3 or info.shape[0] != len(p) or info.shape[1] != len(ids) or (
                hidden_size is not None and info.shape[2] != hidden_size):
            raise CaptureFailedError(f"{path}: the server captures hidden_states {list(info.shape)}, not {len(p)} "
                                     f"tokens x {len(ids)} layers {list(ids)}; start it with the --print-recipe "
                                     "flags for these --layers")
        _write_dump(stage / f"{i:05d}.safetensors", [
            TensorEntry("hidden_states", info.dtype, info.shape,
                        copy=ByteRange(dump, header.data_start + info.begin, info.nbytes)),
            entry_from_bytes("target_argmax", "I64", (len(p),), argmax.tobytes()),
            entry_from_bytes("token_ids", "I64", tokens.shape, tokens.tobytes())])
        dump.unlink(missing_ok=True)
        lock = Path(str(dump) + ".lock")
        if _regular(lock):
            lock.unlink(missing_ok=True)
    return {"server": base, "model": model}, {"capture": round(time.perf_counter() - started, 3)}


def _regular(path: Path) -> bool:
    """A regular file itself (not a link, a FIFO or a device): the only kind a dump may be, or be removed as."""

    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _greedy_next(reply: Any, url: str, n: int, vocab: int | None) -> Any:
    """The target's greedy next token after each of the `n` prompt positions: the rank-1 entry of each
    prompt position's logprobs (positions 1..n-1), then the generated token."""

    bound = vocab or 2**40
    choices = reply.get("choices") if isinstance(reply, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    plp = choice.get("prompt_logprobs") if choice is not None else None
    gen = choice.get("token_ids") if choice is not None else None
    if not isinstance(plp, list) or len(plp) != n or not isinstance(gen, list) or not gen:
        raise ServerReplyError(f"{url}: the reply has no prompt_logprobs for the {n} prompt positions and generated "
                               "token_ids (a vLLM server with prompt_logprobs and return_token_ids)", url=url)
    out = []
    for j, entry in enumerate(plp[1:], 1):
        top = next((t for t, lp in entry.items() if isinstance(lp, dict) and lp.get("rank") == 1), None) \
            if isinstance(entry, dict) else None
        if not (isinstance(top, str) and top.isdigit() and len(top) <= 12 and int(top) < bound):
            raise ServerReplyError(f"{url}: prompt_logprobs[{j}] has no rank-1 token id within the vocabulary",
                                   url=url)
        out.append(int(top))
    first = gen[0]
    if not (isinstance(first, int) and not isinstance(first, bool) and 0 <= first < bound):
        raise ServerReplyError(f"{url}: choices[0].token_ids[0] is not a token id within the vocabulary", url=url)
    return np.asarray(out + [first], dtype="<i8")


def _wait_for_unlocked(path: Path, timeout_s: float) -> None:
    """The server publishes the dump's path before writing it, holding `PATH.lock` while it writes."""

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lock = Path(str(path) + ".lock")
        if path.exists():
            if not lock.exists():
                return
            if not _regular(lock):
                raise CaptureFailedError(f"{lock}: the dump's lock is not a regular file")
            fd = os.open(lock, os.O_RDONLY | os.O_NONBLOCK)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            finally:
                os.close(fd)
        time.sleep(0.02)
    raise CaptureFailedError(f"{path}: the server did not write the dump within {timeout_s:.0f} s (is its storage "
                             "folder on this machine's filesystem?)")


def server_args(ids: tuple[int, ...], storage: str, cpu: bool = False) -> list[str]:
    """`vllm serve` flags that make a server dump the states at boundaries `ids` into `storage`: vLLM's
    stock connector on GPU, eaglectl's synchronous one (loaded by module path) on a CPU server."""
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(ids)}}}
    kv: dict[str, Any] = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                          "kv_connector_extra_config": {"shared_storage_path": storage}}
    if cpu:
        kv.update(kv_connector="CpuHiddenStatesConnector", kv_connector_module_path="eaglectl_cpu_connector")
    return ["--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv)]


def recipe(target: str, layers: str, drafter: str | None, out: str, tensor_parallel_size: int = 1,
           capture_flags: tuple[str, ...] = ()) -> CaptureResult:
    """The `vllm serve` flags for a user's own (multi-GPU) server and the capture command that drives it."""
    t = open_target(target)
    ids = choose_layers(t, layers, drafter)
    name = t.hub_id or target
    storage = storage_folder(out)
    serve = ["vllm", "serve", name, "--tensor-parallel-size", str(tensor_parallel_size), *server_args(ids, storage)]
    cpu = server_args(ids, storage, cpu=True)[3]
    drive = ["eaglectl", "capture", target, "--engine", "server", "--server-url", "http://localhost:8000",
             "--layers", ",".join(map(str, ids)), "--out", out, *capture_flags]
    text = f"""# 1. serve the target, dumping hidden states at boundaries {list(ids)} (vLLM's numbering) into {storage}
#    (add your usual flags: --pipeline-parallel-size, --data-parallel-size, quantization, ...)
{_shell(serve)}
#    on a CPU server use eaglectl's synchronous connector instead (the stock one waits on CUDA events):
#    PYTHONPATH={shlex.quote(str(WORKERS))} ... --kv-transfer-config {shlex.quote(cpu)}

# 2. on a machine that sees {storage} (same filesystem), send the prompts and collect the dumps
{_shell(drive)}

# 3. use the folder
eaglectl upgrade DRAFTER DEST --states {shlex.quote(out)}      # or inspect / convert / verify / check --states
"""
    meta = {"layer_ids": list(ids), "convention": "boundary", "target": name, "storage": storage,
            "serve": serve, "capture": drive}
    return CaptureResult(out, "vllm serve (recipe)", ids, 0, 0, 0.0, meta, None, text)


def _shell(argv: list[str]) -> str:
    parts = [shlex.quote(a) for a in argv]
    lines, line = [], ""
    for part in parts:
        if line and len(line) + len(part) > 100:
            lines.append(line + " \\")
            line = "  "
        line += ("" if line.strip() == "" else " ") + part
    return "\n".join(lines + [line])
