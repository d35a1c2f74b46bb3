"""Quantised drafters (ModelOpt FP8 / NVFP4): the layout, vLLM's reading of it, and dequantisation.

A ModelOpt export stores each quantised linear layer as `X.weight` (FP8 E4M3, or NVFP4 packed two
values per byte), `X.weight_scale` (per-tensor FP32 for FP8; FP8 E4M3 per block of 16 inputs for
NVFP4), `X.weight_scale_2` (NVFP4's per-tensor FP32 scale) and `X.input_scale` (static activation
scale). The config says how: `config.json` `quantization_config` in the flat style
(`quant_method`, `quant_algo`, `ignore`, `config_groups`, `producer`) and, for older readers,
`hf_quant_config.json` in the nested style (`producer`, `quantization: {quant_algo, exclude_modules}`).

vLLM reads the flat style's `ignore` (never its `exclude_modules`) and the nested style's
`exclude_modules`, and matches each entry against *its own* module names (`model.fc`,
`model.layers.0.self_attn.qkv_proj`, `lm_head`): exactly (a fused module is excluded when all its
checkpoint shards are listed, and refused when only some are), as a substring, or as an fnmatch
wildcard (`vllm/model_executor/layers/quantization/modelopt.py` `is_layer_excluded`,
`utils/quant_utils.py` `is_layer_skipped`). `vllm_modules` and `excluded` reproduce that.

Dequantisation follows vLLM's own emulation (`nvfp4_emulation_utils.py` `break_fp4_bytes`,
`dequantize_to_dtype`): FP8 value × weight_scale; NVFP4 nibble (low nibble first, 1 sign + 3
magnitude bits: 0, 0.5, 1, 1.5, 2, 3, 4, 6) × FP8 block scale × weight_scale_2. Activation
quantisation (`input_scale`) is not simulated. See docs/inspect.md#quantised-drafters.
"""

from __future__ import annotations

import copy
import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptCheckpointError, IncompatibleDrafterError, ReferenceLimitError
from ..limits import limit
from .dtypes import FLOAT_DTYPES
from .jsonio import ConfigView, loads

QUANT_FILE = "hf_quant_config.json"
# Scale tensors a quantised export stores next to a weight (`X.weight` -> `X.weight_scale`, ...).
SCALE_SUFFIXES = (".weight_scale_2", ".weight_scale_inv", ".weight_scale", ".input_scale", ".k_scale", ".v_scale")
# quant_algo -> scheme eaglectl can dequantise, and the scale tensors vLLM needs per quantised linear
SCHEMES: dict[str, tuple[str, tuple[str, ...]]] = {
    "FP8": ("fp8", (".weight_scale", ".input_scale")),
    "NVFP4": ("nvfp4", (".weight_scale", ".weight_scale_2", ".input_scale")),
}
MODELOPT_METHODS = {"FP8": "modelopt", "NVFP4": "modelopt_fp4"}
# vLLM fuses these checkpoint projections into one module (packed_modules_mapping of its Llama / DeepSeek models)
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
          "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa")}
_FUSED_OF = {shard: fused for fused, shards in PACKED.items() for shard in shards}
_LINEAR = re.compile(r"(fc|lm_head|embed_tokens|layers\.[0-9]{1,6}\.(self_attn|mlp)\.[a-z_]+)\.weight$")


def scale_of(canon: str) -> tuple[str, str] | None:
    """(weight name, suffix) when `canon` is a scale tensor (`X.weight_scale` -> (`X.weight`, `.weight_scale`))."""
    for suffix in SCALE_SUFFIXES:
        if canon.endswith(suffix):
            return canon[: -len(suffix)] + ".weight", suffix
    return None


@dataclass(frozen=True)
class QuantConfig:
    """One quantisation config as vLLM reads it."""

    where: str  # config.json:quantization_config | hf_quant_config.json
    style: str  # flat (config.json) | nested (producer + quantization)
    quant_method: str | None  # as vLLM resolves it (the nested ModelOpt style infers it from quant_algo)
    quant_algo: str | None
    exclusions: tuple[str, ...] | None  # the list vLLM reads: flat `ignore`, nested `exclude_modules`
    exclude_modules: tuple[str, ...] | None  # a flat config's `exclude_modules` (vLLM ignores it)
    problems: tuple[str, ...] = ()  # fields of the wrong type

    @property
    def scheme(self) -> str | None:
        return SCHEMES[self.quant_algo][0] if self.quant_algo in SCHEMES else None


def _entries(value: Any, key: str, problems: list[str]) -> tuple[str, ...] | None:
    """The entries of an exclusion list; beyond `quant_exclusions` entries it is a problem and only those are read
    (each entry is matched against every module: a hostile list of 200,000 would take minutes)."""
    if value is None:
        return None
    most = limit("quant_exclusions")
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value[:most]):
        problems.append(f"'{key}' is not a list of strings")
        return ()
    if len(value) > most:
        problems.append(f"'{key}' holds {len(value)} entries, more than the limit of {most}")
    return tuple(value[:most])


def config_problem(view: ConfigView) -> tuple[str, str] | None:
    """(key, why) when vLLM cannot read the config's quantization_config: it must be an object whose quant_method
    and quant_algo are strings (vLLM lower- and upper-cases them); a list, a string or an int quant_algo stops
    vLLM before the weights. Recorded on `view`; None when it can, or there is none."""
    if view.has("quantization_config") and view.dict("quantization_config") is not None:
        q = view.sub("quantization_config")
        q.str("quant_method")
        q.str("quant_algo")
        if q.dict("quantization") is not None:  # legacy ModelOpt nesting
            q.sub("quantization").str("quant_algo")
    return next((item for item in view.problems.items() if item[0].startswith("quantization_config")), None)


def read_config(data: Any, where: str) -> QuantConfig | None:
    """A quantisation config dict (either style) as vLLM reads it; None when `data` is not an object."""
    if not isinstance(data, dict):
        return None
    problems: list[str] = []
    nested = data.get("quantization")
    if isinstance(nested, dict):  # legacy ModelOpt: {"producer": {"name": "modelopt"}, "quantization": {...}}
        algo = nested.get("quant_algo")
        algo = str(algo).upper() if isinstance(algo, str) else None
        method = data.get("quant_method") if isinstance(data.get("quant_method"), str) else None
        producer = data.get("producer") if isinstance(data.get("producer"), dict) else {}
        if method is None and producer.get("name") == "modelopt" and algo is not None:
            method = MODELOPT_METHODS.get(algo)
        return QuantConfig(where, "nested", method, algo,
                           _entries(nested.get("exclude_modules"), "quantization.exclude_modules", problems), None,
                           tuple(problems))
    algo = data.get("quant_algo")
    method = data.get("quant_method")
    return QuantConfig(where, "flat", method if isinstance(method, str) and method else None,
                       str(algo).upper() if isinstance(algo, str) else None,
                       _entries(data.get("ignore"), "ignore", problems),
                       _entries(data.get("exclude_modules"), "exclude_modules", problems), tuple(problems))


def read_side_file(ckpt: Any) -> tuple[dict[str, Any] | None, str | None]:
    """`hf_quant_config.json` beside a local checkpoint: (object, path); (None, None) when absent or remote."""
    if QUANT_FILE not in getattr(ckpt, "file_names", ()) or ckpt.hub_ref is not None:
        return None, None
    path = Path(ckpt.root) / QUANT_FILE
    try:
        raw = path.read_bytes() if path.is_file() and path.stat().st_size <= limit("json_bytes") else None
    except OSError:
        raw = None
    if raw is None:
        return None, None
    data = loads(raw, str(path))
    if not isinstance(data, dict):
        raise CorruptCheckpointError(f"{path}: not a JSON object", file=str(path))
    return data, str(path)


@dataclass
class QuantLayout:
    """What a checkpoint holds of a quantised export: configs, scales per weight, quantised weights."""

    config: QuantConfig | None  # config.json quantization_config
    side: QuantConfig | None  # hf_quant_config.json
    scales: dict[str, dict[str, str]] = field(default_factory=dict)  # canonical weight -> {suffix: canonical scale}
    orphans: list[str] = field(default_factory=list)  # scales whose weight is absent
    quantized: list[str] = field(default_factory=list)  # canonical weights stored in a quantised dtype

    @property
    def effective(self) -> QuantConfig | None:
        """The config vLLM uses: config.json's, else hf_quant_config.json's."""
        return self.config or self.side

    @property
    def scheme(self) -> str | None:
        eff = self.effective
        return eff.scheme if eff is not None else None

    def describe(self) -> str:
        eff = self.effective
        if eff is None:
            return "no quantization config"
        return f"{eff.quant_algo or '?'} (quant_method {eff.quant_method or 'absent'}, {eff.where})"


def layout_of(d: Any) -> QuantLayout | None:
    """The quantised layout of an interpreted drafter, or None when it holds none (no quantisation config,
    no scale tensors)."""
    cfg_data = d.ckpt.config.get("quantization_config") if isinstance(d.ckpt.config, dict) else None
    config = read_config(cfg_data, "config.json:quantization_config") if cfg_data is not None else None
    side_data, _ = read_side_file(d.ckpt)
    side = read_config(side_data, QUANT_FILE) if side_data is not None else None
    names = set(d.view.stored)
    scales: dict[str, dict[str, str]] = {}
    orphans = []
    for canon in sorted(names):
        got = scale_of(canon)
        if got is None:
            continue
        weight, suffix = got
        if weight in names:
            scales.setdefault(weight, {})[suffix] = canon
        else:
            orphans.append(canon)
    if config is None and side is None and not scales and not orphans:
        return None
    quantized = [c for c in sorted(names) if _LINEAR.match(c) and (
        d.view.info(c).dtype.startswith("F8") or (d.view.info(c).dtype == "U8" and c in scales))]
    return QuantLayout(config, side, scales, orphans, quantized)


# ------------------------------------------------------------------------------------ scales

SCALAR = ((), (1,))  # a per-tensor scale: ModelOpt writes shape [], some exporters [1]; vLLM loads either
SCALE_DTYPES = FLOAT_DTYPES | {"F8_E4M3"}  # a per-tensor / per-channel scale: a float the engines cast to fp32
NVFP4_BLOCK = 16  # inputs per NVFP4 block scale


@dataclass(frozen=True)
class Scale:
    """One scale of a quantised weight as its scheme reads it: its role and, when malformed, why."""

    weight: str  # canonical weight
    suffix: str  # .weight_scale, .weight_scale_2, .input_scale
    canon: str  # canonical scale tensor
    role: str  # tensor (one value) | channel (one per output row) | block (a grid of input blocks)
    problem: str | None = None  # its shape or dtype is not what the scheme stores (None: well formed)


def weight_scheme(dtype: str, got: dict[str, str]) -> str | None:
    """How a quantised weight is stored, from its dtype and scales (the reference reads it the same way)."""
    if dtype == "F8_E4M3":
        return "fp8"
    if dtype == "U8" and ".weight_scale_2" in got:
        return "nvfp4"
    return None


def scales_of(view: Any, weight: str, got: dict[str, str]) -> list[Scale]:
    """The FP8 / NVFP4 scales of `weight` (`got`: suffix -> canonical scale), each with its role and, where its
    shape or dtype is not the scheme's, the problem; from the headers only. Other suffixes (k_scale, ...) and
    weights of neither scheme yield nothing."""
    w = view.info(weight)
    scheme = weight_scheme(w.dtype, got)
    out = []
    for suffix, canon in sorted(got.items()):
        if scheme is None or suffix not in SCHEMES["NVFP4" if scheme == "nvfp4" else "FP8"][1]:
            continue
        role, problem = _form(scheme, suffix, tuple(w.shape), view.info(canon))
        out.append(Scale(weight, suffix, canon, role, problem))
    return out


def _form(scheme: str, suffix: str, wshape: tuple[int, ...], s: Any) -> tuple[str, str | None]:
    """(role, problem) of one scale of shape `s.shape` next to a weight of shape `wshape`."""
    shape = tuple(s.shape)
    if scheme == "nvfp4" and suffix == ".weight_scale":
        if len(wshape) != 2:
            return "block", f"scales a {len(wshape)}-D weight (NVFP4 packs a 2-D one, two values per byte)"
        rows, k = wshape[0], wshape[1] * 2
        want = [rows, k // NVFP4_BLOCK]
        if s.dtype != "F8_E4M3":
            return "block", f"is {s.dtype} (NVFP4 block scales are F8_E4M3)"
        if k % NVFP4_BLOCK or shape != tuple(want):
            return "block", (f"has shape {list(shape)}, expected {want} (one FP8 scale per {NVFP4_BLOCK} inputs, "
                             "unswizzled)" if k % NVFP4_BLOCK == 0 else
                             f"scales {k} inputs, not a multiple of the NVFP4 block ({NVFP4_BLOCK})")
        return "block", None
    if s.dtype not in SCALE_DTYPES:
        return "tensor", f"is {s.dtype} (a scale is a floating-point tensor)"
    if shape in SCALAR:
        return "tensor", None
    if scheme == "fp8" and suffix == ".weight_scale" and len(wshape) == 2:
        rows, cols = wshape
        if shape in ((rows,), (rows, 1)):
            return "channel", None
        if len(shape) == 2 and 0 < shape[0] <= rows and 0 < shape[1] <= cols:
            b = -(-rows // shape[0])  # a block grid: [ceil(rows / b), ceil(cols / b)] for one block size b
            if -(-rows // b) == shape[0] and -(-cols // b) == shape[1]:
                return "block", None
        return "channel", (f"has shape {list(shape)}: an FP8 weight_scale of {list(wshape)} is per-tensor ([] or "
                           f"[1]), per-channel ([{rows}] or [{rows}, 1]) or a block grid")
    return "tensor", f"has shape {list(shape)}, expected [] or [1] (one per-tensor value)"


def value_problem(scale: Scale, values: np.ndarray) -> str | None:
    """Why a scale's values cannot scale anything, or None: NaN/Inf (E4M3 0x7F/0xFF included), a negative value,
    or a per-tensor scale of 0 (it zeroes the layer, or divides the activations by zero). A zero channel or
    block scale is what an all-zero row or block quantises to."""
    v = np.asarray(values, dtype=np.float32).reshape(-1)
    if scale.role == "tensor" and v.size == 1:
        x = float(v[0])
        shown = "NaN" if np.isnan(x) else f"{x:g}".replace("inf", "Inf")
        return None if np.isfinite(x) and x > 0 else f"is {shown} (a per-tensor scale is finite and positive)"
    nonfinite = int(np.count_nonzero(~np.isfinite(v)))
    negative = int(np.count_nonzero(v < 0))
    if not nonfinite and not negative:
        return None
    what = [f"{n} {name}" for n, name in ((nonfinite, "NaN/Inf"), (negative, "negative")) if n]
    return f"has {' and '.join(what)} of {v.size} values (scales are finite and not negative)"


# ------------------------------------------------------------------------------------ vLLM's reading

def vllm_module(canon: str) -> tuple[str, tuple[str, ...]] | None:
    """(vLLM module prefix, checkpoint shard prefixes it fuses) of a canonical linear weight; None if not one."""
    m = _LINEAR.match(canon)
    if m is None:
        return None
    base = canon[: -len(".weight")]
    if base in ("fc", "embed_tokens"):
        return f"model.{base}", ()
    if base == "lm_head":
        return "lm_head", ()
    parent, _, proj = base.rpartition(".")
    fused = _FUSED_OF.get(proj)
    if fused is None:
        return f"model.{base}", ()
    return f"model.{parent}.{fused}", tuple(f"model.{parent}.{s}" for s in PACKED[fused])


def vllm_modules(linears: list[str]) -> dict[str, list[str]]:
    """vLLM module prefix -> the canonical weights it is built from (present ones only)."""
    out: dict[str, list[str]] = {}
    for canon in linears:
        got = vllm_module(canon)
        if got is not None:
            out.setdefault(got[0], []).append(canon)
    return out


def excluded(prefix: str, entries: tuple[str, ...]) -> bool | None:
    """Whether vLLM leaves module `prefix` unquantised under these exclusions; None when it refuses the list
    (some but not all shards of a fused module listed exactly)."""
    if not entries:
        return False
    listed = set(entries)
    proj = prefix.rsplit(".", 1)[-1]
    if proj in PACKED and prefix not in listed:
        shards = [prefix[: -len(proj)] + s for s in PACKED[proj]]
        hits = {s in listed for s in shards}
        if len(hits) > 1:
            return None
        if hits == {True}:
            return True
    elif prefix in listed:
        return True
    if any(e != prefix and e in prefix for e in entries):
        return True
    return any(fnmatch.fnmatchcase(prefix, e) for e in entries)


def matches_any(entry: str, prefixes: list[str]) -> bool:
    """Whether one exclusion entry excludes at least one of these vLLM modules (or one of their shards)."""
    for p in prefixes:
        proj = p.rsplit(".", 1)[-1]
        shards = [p[: -len(proj)] + s for s in PACKED.get(proj, ())]
        if entry == p or entry in shards or (entry in p) or fnmatch.fnmatchcase(p, entry):
            return True
    return False


def rewrite_entries(entries: list[Any], src: Any, dst: Any) -> list[Any]:
    """Exclusion entries renamed from the source dialect's tensor names to the destination's (the dialect
    key rules are prefix renames: `midlayer.` <-> `layers.0.`, NeMo's `model.`); wildcards before a name are
    kept, entries naming no dialect prefix (`*fc`, `lm_head`) stay as they are. Where the destination's names
    are not vLLM's (`midlayer.`: sglang's module names), the canonical spelling, which vLLM's module names
    contain, is kept next to the renamed one, so both engines exclude the same layers."""
    out: list[Any] = []
    seen: set[str] = set()  # a set, not `in out`: a long list stays linear
    for e in entries:
        if not isinstance(e, str):
            out.append(e)
            continue
        body = e.lstrip("*")
        head = e[: len(e) - len(body)]
        canon = src.to_canonical(body)
        for spelled in (head + dst.from_canonical(canon), head + canon):
            if spelled not in seen:
                seen.add(spelled)
                out.append(spelled)
    return out


def dialect_names(prefixes: list[str], dialect: Any) -> list[str]:
    """vLLM module prefixes (`model.layers.0.mlp.down_proj`) spelled in a dialect's tensor names
    (`model.midlayer.mlp.down_proj`: the module names of the engine that serves that layout)."""
    out = []
    for p in prefixes:
        inner = p.removeprefix("model.")
        spelled = ("model." if p.startswith("model.") else "") + dialect.from_canonical(inner)
        if spelled != p:
            out.append(spelled)
    return out


# ------------------------------------------------------------------------------------ dequantisation

def _e4m3_table() -> np.ndarray:
    b = np.arange(256, dtype=np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).astype(np.float64)
    val = np.where(exp == 0, man / 8 * 2.0 ** -6, (1 + man / 8) * 2.0 ** (exp - 7))
    val = np.where((exp == 15) & (man == 7), np.nan, val)  # E4M3FN: no infinities, one NaN pattern
    return (sign * val).astype(np.float32)


E4M3 = _e4m3_table()
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                dtype=np.float32)


def raw_bytes(ckpt: Any, stored: str) -> np.ndarray:
    """A stored tensor's bytes as uint8."""
    wf = ckpt.tensor_file[stored]
    if wf.pickled is not None:
        import torch

        return wf.pickled[stored].contiguous().reshape(-1).view(torch.uint8).numpy()
    info = wf.header.tensors[stored]
    raw = wf.source.read(wf.header.data_start + info.begin, info.nbytes)
    if len(raw) != info.nbytes:  # a file cut short since it was opened: its callers reshape these bytes
        raise CorruptCheckpointError(f"{wf.source.name}: tensor '{stored}': data truncated", file=wf.source.name,
                                     tensor=stored)
    return np.frombuffer(raw, dtype=np.uint8)


def decode(ckpt: Any, stored: str) -> np.ndarray:
    """A tensor as float32, FP8 E4M3 included (the other dtypes through the checkpoint reader)."""
    info = ckpt.tensors[stored]
    if info.dtype == "F8_E4M3":
        return E4M3[raw_bytes(ckpt, stored)].reshape(info.shape)
    return np.asarray(ckpt.read(stored), dtype=np.float32)


def dequantize(d: Any, canon: str, layout: QuantLayout) -> np.ndarray:
    """The float32 values of a quantised weight (weight × scales); CorruptCheckpointError naming a scale whose
    shape, dtype or values its scheme cannot hold, IncompatibleDrafterError naming what the reference cannot
    dequantise."""
    info = d.view.info(canon)
    stored = d.view.stored[canon]
    got = layout.scales.get(canon, {})
    where = f"{d.source}: '{stored}'"
    scales = {s.suffix: s for s in scales_of(d.view, canon, got)}
    for s in scales.values():  # every scale's shape checked before any is read, reshaped or multiplied
        if s.problem is not None:
            raise CorruptCheckpointError(f"{d.source}: '{d.view.stored[s.canon]}' {s.problem}",
                                         tensor=d.view.stored[s.canon])
    decoded: dict[str, np.ndarray] = {}
    for s in scales.values():  # then every scale's values, input_scale too: vLLM would serve them
        if s.suffix == ".weight_scale" and s.role == "block" and info.dtype == "F8_E4M3":
            continue  # an FP8 block grid: refused below, unread
        decoded[s.suffix] = v = decode(d.ckpt, d.view.stored[s.canon])
        if (problem := value_problem(s, v)) is not None:
            raise CorruptCheckpointError(f"{d.source}: '{d.view.stored[s.canon]}' {problem}",
                                         tensor=d.view.stored[s.canon])
    if info.dtype == "F8_E4M3":
        if ".weight_scale" not in scales:
            raise IncompatibleDrafterError(f"{where} is FP8 without a weight_scale", tensor=stored,
                                           hint="the quantiser's export lost the scales: export the drafter again")
        role = scales[".weight_scale"].role
        if role == "block":
            raise ReferenceLimitError(f"{where}: FP8 weight_scale of shape "
                                      f"{list(d.view.info(scales['.weight_scale'].canon).shape)} (a block "
                                      "grid; the reference dequantises per-tensor or per-channel only)",
                                      tensor=stored)
        w = decode(d.ckpt, stored)
        scale = decoded[".weight_scale"]
        if role == "tensor":
            return w * scale.reshape(())
        return w * scale.reshape(-1, 1)  # per output channel (a 2-D weight: scales_of checked)
    if info.dtype == "U8" and ".weight_scale_2" in got:
        if ".weight_scale" not in scales:
            raise IncompatibleDrafterError(f"{where}: NVFP4 needs an FP8 weight_scale", tensor=stored,
                                           hint="the quantiser's export lost the block scales: export it again")
        rows, packed = info.shape  # 2-D, block scales [rows, 2 * packed / 16] in F8_E4M3: scales_of checked
        k = packed * 2
        raw = raw_bytes(d.ckpt, stored).reshape(rows, packed)
        nibbles = np.stack([raw & 0x0F, raw >> 4], axis=-1).reshape(rows, k)  # low nibble first
        values = E2M1[nibbles].reshape(rows, k // NVFP4_BLOCK, NVFP4_BLOCK)
        block = decoded[".weight_scale"].reshape(rows, k // NVFP4_BLOCK, 1)
        glob = decoded[".weight_scale_2"].reshape(())
        return (values * block * glob).reshape(rows, k).astype(np.float32)
    raise ReferenceLimitError(f"{where} is {info.dtype} under {layout.describe()}: the reference drafter "
                              "dequantises FP8 E4M3 (per-tensor or per-channel) and NVFP4 only", tensor=stored)


# ------------------------------------------------------------------------------------ conversion

def converted_configs(d: Any, dst: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(config.json quantization_config, hf_quant_config.json) for a conversion of `d` to dialect `dst`: the
    source's, with every ignore / exclude_modules entry renamed to the destination's tensor names and
    everything else (quant_method, quant_algo, config_groups, producer) kept; (None, None) when unquantised."""
    cfg = d.ckpt.config.get("quantization_config") if isinstance(d.ckpt.config, dict) else None
    side, _ = read_side_file(d.ckpt)
    out = []
    for data in (cfg, side):
        if not isinstance(data, dict):
            out.append(None)
            continue
        data = copy.deepcopy(data)
        for holder, key in ((data, "ignore"), (data, "exclude_modules"), (data.get("quantization"), "exclude_modules")):
            if isinstance(holder, dict) and isinstance(holder.get(key), list):
                holder[key] = rewrite_entries(holder[key], d.dialect, dst)
        out.append(data)
    return out[0], out[1]
