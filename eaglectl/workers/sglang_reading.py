"""Runs inside an SGLang interpreter: asks SGLang's own code how it reads an EAGLE-3 drafter for a target (which
layers the target captures, the draft class it builds, the flags that class applies, the weights it drops). No
weights are read, nothing runs on a device.

    python sglang_reading.py --serve FD IDLE_S

Standalone like `workers/vllm_reading.py` (stdlib at the top, sglang imported by the first request) and served the
same way: each line on stdin is one REQUEST, answered by one RESULT line on file descriptor FD, until stdin closes or
IDLE_S seconds pass without a request (engine_process.WorkerSession).

REQUEST::

    {"requests": [{"drafter_dir": "/abs/drafter", "target_dir": "/abs/target" or null, "target_layers": 8}]}

For each request, SGLang's launch resolution runs on a real `ServerArgs(model_path=TARGET,
speculative_algorithm="EAGLE3", speculative_draft_model_path=DRAFTER, device="cpu")` (`resolve_once`: a speculators
file, which carries no model_type, is refused there, as at launch). Without `target_dir` the target is a stand-in
Llama config folder of `target_layers` layers. Then:
- the capture: `resolve_spec_aux_hidden_state_config` (the ids `_resolve_eagle_aux_hidden_state` hands the target)
  and the target class the loader resolves, whose own `set_eagle3_layers_to_capture` is called on a stand-in
  instance: `layers_to_capture`;
- the draft: its ModelConfig as the draft worker builds it (`is_draft_model=True`: SGLang's architecture rewrites),
  the class the loader resolves (`model_loader.utils.get_model_architecture`), and for an EAGLE-3 draft class the
  class built on the meta device (no decoder layers: their rotary kernel needs CUDA; the flags and fc are read in
  its `LlamaModel.__init__`), its flags and fc's aux count read; the drafter's tensor names fed to its own
  `load_weights` as meta tensors: the names no parameter takes are the ones SGLang drops without a word.

RESULT: {"ok", "sglang_version", "torch_version", "python", "registry_size", "results": [one per request]}; a
result is {"drafter_dir", "target_dir", "target_layers", "error", "capture": {...}, "model": {...}}. A launch SGLang
refuses is a result (`error`), not a crash.

torchvision: SGLang's config package imports it on a path unrelated to reading (its InternVL and DeepSeek-OCR
configs); no CPU build of it installs beside a CPU torch, so where it does not import a placeholder stands in for it
(`_placeholder_torchvision`), which raises if anything calls it. Nothing here does.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
import struct
import sys
import tempfile
import traceback
import types

EAGLE3_DRAFT_CLASSES = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32", "U8": "uint8",
           "I8": "int8", "BOOL": "bool", "F64": "float64", "F8_E4M3": "float8_e4m3fn"}


def _short(e: BaseException, limit: int = 400) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    text = text.split("Supported architectures:")[0].strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _placeholder_torchvision() -> bool:
    """Serve a placeholder `torchvision` when the real one does not import (see the module's docstring)."""
    import importlib.abc
    import importlib.machinery

    try:
        import torchvision  # noqa: F401
        return False
    except Exception:  # noqa: BLE001 - not installed, or a build that does not load beside this torch
        for name in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[name]

    class Placeholder:
        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, item: str):  # type: ignore[no-untyped-def]
            if item.startswith("__"):
                raise AttributeError(item)
            return Placeholder(f"{self._name}.{item}")

        def __call__(self, *a, **k):  # type: ignore[no-untyped-def]
            raise RuntimeError(f"torchvision placeholder: {self._name} was called")

        def __getitem__(self, item):  # type: ignore[no-untyped-def]
            return Placeholder(f"{self._name}[{item!r}]")

        def __mro_entries__(self, bases):  # type: ignore[no-untyped-def]
            return (object,)

    class Module(types.ModuleType):
        def __getattr__(self, item: str):  # type: ignore[no-untyped-def]
            if item.startswith("__"):
                raise AttributeError(item)
            return Placeholder(f"{self.__name__}.{item}")

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
            if name == "torchvision" or name.startswith("torchvision."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):  # type: ignore[no-untyped-def]
            module = Module(spec.name)
            module.__path__ = []  # type: ignore[attr-defined]
            module.__version__ = "0.0.0+placeholder"  # type: ignore[attr-defined]
            return module

        def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
            return None

    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # transformers caches False before the placeholder exists
    sys.meta_path.append(Finder())  # last: a real torchvision, when one imports, is always found first
    return True


def _names(folder: str) -> dict | None:
    """name -> (shape, dtype) from the drafter's safetensors headers (no tensor data); None without any."""
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        return None
    out = {}
    for name in files:
        with open(os.path.join(folder, name), "rb") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(size))
        out.update({k: (v["shape"], v["dtype"]) for k, v in header.items() if k != "__metadata__"})
    return out


def _stand_in_target_dir(n_layers: int, tmp: str) -> str:
    folder = os.path.join(tmp, f"target-{n_layers}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": n_layers,
                   "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 1, "num_key_value_heads": 1,
                   "head_dim": 64, "vocab_size": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
                   "tie_word_embeddings": False}, f)
    return folder


def _capture(sa, target_mc) -> tuple[dict, object]:  # type: ignore[no-untyped-def]
    """The ids SGLang hands the target, and what the target class's own code makes of them."""
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        resolve_spec_aux_hidden_state_config,
    )
    from sglang.srt.model_loader.utils import get_model_architecture
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    out: dict = {"ids_read": None, "source": None, "target_class": None, "captured": None, "error": None}
    aux = resolve_spec_aux_hidden_state_config(server_args=sa, model_config=target_mc,
                                               spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE3"),
                                               is_draft_worker=False)
    ids = aux.eagle_aux_hidden_state_layer_ids
    out["ids_read"] = list(ids) if isinstance(ids, (list, tuple)) else None
    out["source"] = "eagle_config.eagle_aux_hidden_state_layer_ids" if ids is not None else "model default"
    out["use_aux_hidden_state"] = bool(aux.eagle_use_aux_hidden_state)
    try:
        cls, _ = get_model_architecture(target_mc)
    except Exception as e:  # noqa: BLE001
        out["error"] = "the target: " + _short(e)
        return out, aux
    out["target_class"] = f"{cls.__module__}.{cls.__name__}"
    if not hasattr(cls, "set_eagle3_layers_to_capture"):
        out["error"] = (f"Model {cls.__name__} does not implement set_eagle3_layers_to_capture, which EAGLE3 aux "
                        "hidden-state capture requires.")
        return out, aux
    inst = object.__new__(cls)
    __import__("torch").nn.Module.__init__(inst)
    config = target_mc.hf_config
    n = int(getattr(getattr(config, "text_config", config), "num_hidden_layers"))
    inner = types.SimpleNamespace(layers_to_capture=[], layers=[types.SimpleNamespace() for _ in range(n)],
                                  capture_aux_hidden_states=False)
    object.__setattr__(inst, "config", config)
    object.__setattr__(inst, "pp_group", types.SimpleNamespace(is_last_rank=True, is_first_rank=True))
    inst.__dict__["model"] = inner
    try:
        cls.set_eagle3_layers_to_capture(inst, copy.deepcopy(out["ids_read"]))
        got = inner.layers_to_capture or getattr(getattr(inst, "language_model", None), "layers_to_capture", None)
        out["captured"] = [int(i) for i in (got or [])]
    except Exception as e:  # noqa: BLE001 - the class refuses these ids (an IndexError at start-up)
        out["error"] = "set_eagle3_layers_to_capture: " + _short(e)
    return out, aux


_DIST = {"up": False}


def _init_distributed() -> None:
    if _DIST["up"]:
        return
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with contextlib.suppress(Exception):
        from sglang.srt.runtime_context import get_parallel

        get_parallel().override_permanently(tp_rank=0, pp_rank=0)
    init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                 local_rank=0, backend="gloo")
    initialize_model_parallel(backend="gloo")
    _DIST["up"] = True


def _skipped(model, names: dict) -> list:  # type: ignore[no-untyped-def]
    """The tensor names no parameter of the class takes: its load_weights drops them without a word."""
    import torch
    from sglang.srt.model_loader import weight_utils

    hits: list = []
    for pname, p in model.named_parameters():
        inner = getattr(p, "weight_loader", None) or weight_utils.default_weight_loader

        def record(param, loaded, *a, _n=pname, _f=inner, **k):  # type: ignore[no-untyped-def]
            hits.append(_n)
            return _f(param, loaded, *a, **k)

        p.weight_loader = record
    dropped = []
    for name, (shape, dtype) in names.items():
        if name in ("d2t", "t2d") or "midlayer." in name or ".layers." in f".{name}":
            continue  # d2t becomes hot_token_id, t2d is read; the decoder layer is not built here
        before = len(hits)
        with contextlib.suppress(Exception):  # a shape the class refuses is loud: not a silent drop
            model.load_weights([(name, torch.empty(shape, dtype=getattr(torch, _DTYPES.get(dtype, "float32")),
                                                   device="meta"))])
        if len(hits) == before:
            dropped.append(name)
    return dropped


def _model(draft_mc, drafter: str) -> dict:  # type: ignore[no-untyped-def]
    """The draft class SGLang's loader resolves and, for an EAGLE-3 draft class, what it applies."""
    import torch
    from sglang.srt.model_loader.utils import get_model_architecture

    out: dict = {"class": None, "is_draft": False, "error": None, "flags": None, "num_aux": None, "skipped": []}
    try:
        cls, _ = get_model_architecture(draft_mc)
    except Exception as e:  # noqa: BLE001
        out["error"] = "refused at load: " + _short(e)
        return out
    out["class"] = f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"
    out["is_draft"] = cls.__name__ in EAGLE3_DRAFT_CLASSES
    if not out["is_draft"]:
        out["error"] = f"loads as {out['class']}, not an EAGLE-3 draft class"
        return out
    config = copy.deepcopy(draft_mc.hf_config)
    if cls.__name__ == "Eagle3DeepseekV2ForCausalLM":  # its rotary embedding needs a CUDA kernel to be built
        from sglang.srt.models import kimi_k25_eagle3

        eagle = getattr(config, "eagle_config", None) or {}
        out["num_aux"] = kimi_k25_eagle3._get_eagle_aux_layer_count(config)
        out["flags"] = {"fc_norm": bool(getattr(config, "fc_norm", False) or getattr(config, "use_aux_norm", False)),
                        "norm_output": bool(getattr(config, "norm_output", False)), "norm_before_fc": False,
                        "norm_before_residual": False}
        out["basis"] = "kimi_k25_eagle3 read without building the class" if eagle is not None else ""
        return out
    _init_distributed()
    config.num_hidden_layers = 0
    with torch.device("meta"):
        model = cls(config, None)
    inner = model.model
    out["num_aux"] = int(inner.num_aux_hidden_states)
    out["flags"] = {"fc_norm": getattr(inner, "fc_norm", None) is not None,
                    "norm_output": bool(getattr(inner, "norm_output", False)),
                    "norm_before_fc": getattr(inner, "input_norm", None) is not None,
                    "norm_before_residual": False}  # the class never reads it
    names = _names(drafter)
    if names is not None:
        out["skipped"] = _skipped(model, names)
    return out


def read_one(req: dict, tmp: str) -> dict:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.runtime_context import get_context
    from sglang.srt.server_args import ServerArgs

    drafter, n_layers = req["drafter_dir"], int(req["target_layers"])
    target = req.get("target_dir") or _stand_in_target_dir(n_layers, tmp)
    out: dict = {"drafter_dir": drafter, "target_dir": req.get("target_dir"), "target_layers": n_layers,
                 "error": None, "capture": None, "model": None,
                 "build": "ServerArgs(speculative_algorithm=EAGLE3) resolved for the target" if req.get("target_dir")
                 else f"ServerArgs(speculative_algorithm=EAGLE3) resolved for a stand-in {n_layers}-layer Llama target"}
    try:
        sa = ServerArgs(model_path=target, speculative_algorithm="EAGLE3", speculative_draft_model_path=drafter,
                        device="cpu")
        sa.resolve_once()
        get_context().set_server_args(sa)
        target_mc = ModelConfig.from_server_args(sa)
    except Exception as e:  # noqa: BLE001 - SGLang refuses the launch: that is the reading
        out["error"] = "refused at launch: " + _short(e)
        return out
    try:
        out["capture"], aux = _capture(sa, target_mc)
        draft_mc = getattr(aux, "draft_model_config", None) or ModelConfig.from_server_args(
            sa, model_path=drafter, is_draft_model=True)
        out["model"] = _model(draft_mc, drafter)
    except Exception as e:  # noqa: BLE001
        out["error"] = _short(e)
    return out


def answer(req: dict, tmp: str) -> dict:
    """RESULT for one REQUEST (SGLang imported by the first call); never raises."""
    try:
        _placeholder_torchvision()
        import sglang
        import torch
        from sglang.srt.models.registry import ModelRegistry

        result: dict = {"ok": True, "sglang_version": sglang.__version__, "torch_version": torch.__version__,
                        "python": sys.version.split()[0], "registry_size": len(ModelRegistry.models),
                        "results": [read_one(one, tmp) for one in req["requests"]]}
    except BaseException as e:  # noqa: BLE001 - always answer
        result = {"ok": False, "error": _short(e), "traceback": traceback.format_exc()}
    return result


def serve(answers_fd: int, idle_s: float) -> int:
    import select

    with os.fdopen(answers_fd, "w") as out, tempfile.TemporaryDirectory(prefix="eaglectl-sglang-") as tmp:
        while select.select([sys.stdin], [], [], idle_s)[0]:
            line = sys.stdin.readline()
            if not line:
                return 0
            out.write(json.dumps(answer(json.loads(line), tmp)) + "\n")
            out.flush()
    return 0


def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return serve(int(argv[argv.index("--serve") + 1]), float(argv[argv.index("--serve") + 2]))


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
