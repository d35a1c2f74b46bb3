"""In-process fuzzing of the inspect path: mutated safetensors headers, configs, indexes and target configs.

Every case must end in a report or one of eaglectl's own errors (an EaglectlError with its exit
code): anything else is an internal error (exit 70). Mutations are seeded and structural (JSON trees
with hostile values: deep nesting, huge or non-finite numbers, wrong types, surrogates, control
characters, giant lists) or byte-level (flips, truncation, insertion of structural characters).
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import struct
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglectl.commands import inspect as inspect
from eaglectl.errors import EaglectlError
from eaglectl.progress import passthrough

from .conftest import DRAFTERS, TARGET
from .helpers import capture_run, convert_run, drift_run, inspect_checkpoint, upgrade_run, verify_run

SEEDS_DRAFTERS = ["speculators-3.1", "specforge-3.1", "modelopt-mla", "speculators-sharded", "eagle-3", "nemo-3.1"]


def hostile_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(16)
    if kind == 0:
        return 10 ** rng.choice([19, 40, 400])  # huge integers (400 digits: formatting overflows floats)
    if kind == 1:
        return rng.choice([-1, -(2**63), 2**31, 2**63, 100_000_000, 0])
    if kind == 2:
        return rng.choice([float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 1e-320])
    if kind == 3:
        return rng.choice(["", "x" * 5000, "\ud800", "layers.\u00b2.x", "\x1b[31mred[/]", "[bold]", "\n\t\x00",
                           "../../etc/passwd", "/abs/path", "llama", "qwen3", "kimi_k2", "eagle-3"])
    if kind == 4:
        return rng.choice([True, False, None])
    if kind == 5:
        return [rng.randrange(-5, 100) for _ in range(rng.choice([0, 1, 3, 100, 100_000]))]
    if kind == 6:
        nest: Any = 1
        for _ in range(rng.choice([10, 70, 200])):
            nest = [nest] if rng.random() < 0.5 else {"a": nest}
        return nest
    if kind == 7:
        return {"rope_type": rng.choice(["yarn", "llama3", "linear", "nope", 3]), "factor": hostile_value(rng, depth + 1)}
    if kind == 8 and depth < 2:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 9 and depth < 2:
        return {rng.choice(["a", "eagle_aux_hidden_state_layer_ids", "norm_before_fc", "\ud800"]): hostile_value(
            rng, depth + 1)}
    if kind == 10:
        return [[1, 2], [3]]
    if kind == 11:
        return rng.choice([1.5, 3, "3", "true", [True]])
    return rng.randrange(-3, 70_000)


def mutate_tree(obj: Any, rng: random.Random, n: int) -> Any:
    """Replace, delete or add `n` values at random paths of a JSON tree."""
    obj = json.loads(json.dumps(obj))
    for _ in range(n):
        node = obj
        path: list[Any] = []
        while isinstance(node, (dict, list)) and node and rng.random() < 0.6:
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            path.append(key)
            node = node[key]
        parent: Any = obj
        for key in path[:-1]:
            parent = parent[key]
        if not path:
            if isinstance(obj, dict):
                obj[rng.choice(["num_hidden_layers", "architectures", "eagle_aux_hidden_state_layer_ids", "fc_norm",
                                "eagle_config", "speculators_config", "rope_scaling", "metadata", "weight_map",
                                "__metadata__", "x"])] = hostile_value(rng)
            continue
        op = rng.random()
        if op < 0.15 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = hostile_value(rng)
    return obj


def mutate_bytes(raw: bytes, rng: random.Random) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randrange(1, 6)):
        op = rng.randrange(5)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
        elif op == 1:
            b[i:i] = rng.choice([b"[", b"{", b"]", b"}", b'"', b",", b"9" * 50, b"\xff\xfe", b"\\ud800", b"-"])
        elif op == 2 and b:
            del b[i: i + rng.randrange(1, 8)]
        elif op == 3:
            b[i:i] = b"[" * rng.choice([100, 2000, 50_000]) + b"]" * rng.choice([0, 100])
        else:
            b = b[: rng.randrange(len(b) + 1)]
    return bytes(b)


def rebuild_header(path: Path, header_bytes: bytes, data: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header_bytes)) + header_bytes + data)


def split_safetensors(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8: 8 + n]), raw[8 + n:]


# A case slower than this is a hang or a blow-up (a minute of work on a hostile value), not a busy machine:
# on 2 cores shared with other jobs a normal case takes up to ~2 s.
PATHOLOGICAL_S = 10.0


def clean(rep: FuzzReport, what: str, cases: int, *codes: int) -> None:
    """A fuzz run that found nothing: every case ran, none was an internal error, none pathologically slow, memory
    flat, and each of CODES was an outcome (the run reached those paths)."""
    print(f"{what}: {rep.cases} cases in {rep.seconds:.1f} s, slowest {rep.slowest:.3f} s, codes {rep.codes}, "
          f"rss +{rep.rss_growth_mb:.0f} MB")
    assert rep.cases == cases and not rep.internal, rep.internal[:5]
    assert rep.slowest < PATHOLOGICAL_S, rep.slowest_case
    assert rep.rss_growth_mb < 300
    assert all(rep.codes.get(code) for code in codes), rep.codes


def scale_cases(ci: int) -> int:
    """How many cases a `slow` at-scale fuzz runs: CI's count (`ci`), or EAGLECTL_FUZZ_CASES when set, for a long
    run before a release (CI ran 50,000 inspect and 20,000 capture cases before: about 25 minutes of one core)."""
    value = os.environ.get("EAGLECTL_FUZZ_CASES", "").strip()
    return int(value) if value else ci


@dataclass
class FuzzReport:
    cases: int = 0
    internal: list[str] = field(default_factory=list)
    slowest: float = 0.0
    slowest_case: str = ""
    seconds: float = 0.0
    rss_growth_mb: float = 0.0
    codes: dict[int, int] = field(default_factory=dict)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def render(result: Any) -> None:
    """Both output forms, strictly encoded as a pipe would (a lone surrogate must not reach it)."""
    import io

    from rich.console import Console

    from eaglectl.cli import console, views

    json.dumps(result.to_json(), default=str).encode("utf-8")
    saved = console.stdout
    console.stdout = Console(file=io.StringIO(), width=80, highlight=False, soft_wrap=True)
    try:
        views.render_inspect(result)
        console.stdout.file.getvalue().encode("utf-8")  # type: ignore[attr-defined]
    finally:
        console.stdout = saved


def _timed(rep: FuzzReport, label: str, fn: Any) -> tuple[int, Any]:
    """(exit code, result): an EaglectlError is its code, anything else an internal error (70)."""
    t = time.perf_counter()
    result = None
    try:
        result = fn()
        code = getattr(result, "exit_code", 0)
    except EaglectlError as e:
        code = e.exit_code
    except Exception:  # noqa: BLE001 - exactly what the fuzzer hunts
        rep.internal.append(f"{label}: {traceback.format_exc(limit=4).splitlines()[-1]}")
        code = 70
    dt = time.perf_counter() - t
    if dt > rep.slowest:
        rep.slowest, rep.slowest_case = dt, label
    return code, result


def run_case(rep: FuzzReport, label: str, fn: Any, rendered: bool = True) -> None:
    def call() -> Any:
        result = fn()
        if rendered:
            render(result)
        return result

    code, _ = _timed(rep, label, call)
    rep.cases += 1
    rep.codes[code] = rep.codes.get(code, 0) + 1


def fuzz(work: Path, *, headers: int, configs: int, seed: int = 0, render_every: int = 1) -> FuzzReport:
    """Mutate `headers` safetensors headers and `configs` config / index / target-config files; every
    `render_every`-th report is also rendered (human and JSON)."""
    rng = random.Random(seed)
    rep = FuzzReport()
    rss0 = _rss_mb()
    t0 = time.perf_counter()
    bases = []
    for name in SEEDS_DRAFTERS:
        folder = work / f"base-{name}"
        shutil.copytree(DRAFTERS / name, folder)
        bases.append(folder)
    target = work / "target"
    shutil.copytree(TARGET, target)
    target_cfg = json.loads((target / "config.json").read_text())
    case = work / "case"
    for i in range(headers + configs):
        base = rng.choice(bases)
        shutil.rmtree(case, ignore_errors=True)
        shutil.copytree(base, case)
        weights = sorted(case.glob("*.safetensors"))
        label = f"#{i} {base.name}"
        use_target = False
        if i < headers:
            file = rng.choice(weights)
            header, data = split_safetensors(file)
            if rng.random() < 0.5:
                raw = json.dumps(mutate_tree(header, rng, rng.randrange(1, 4))).encode()
            else:
                raw = mutate_bytes(json.dumps(header).encode(), rng)
            rebuild_header(file, raw, data)
            label += f" header {file.name}"
        else:
            which = rng.random()
            index = case / "model.safetensors.index.json"
            if which < 0.15 and index.exists():
                obj = json.loads(index.read_text())
                index.write_text(json.dumps(mutate_tree(obj, rng, rng.randrange(1, 4))))
                label += " index"
            elif which < 0.3:
                (target / "config.json").write_text(json.dumps(mutate_tree(target_cfg, rng, rng.randrange(1, 4))))
                use_target = True
                label += " target config"
            elif which < 0.4:
                (case / "config.json").write_bytes(mutate_bytes((case / "config.json").read_bytes(), rng))
                label += " config bytes"
            else:
                cfg = json.loads((case / "config.json").read_text())
                (case / "config.json").write_text(json.dumps(mutate_tree(cfg, rng, rng.randrange(1, 5))))
                label += " config"
        run_case(rep, label, lambda: inspect_checkpoint(str(case), target=str(target) if use_target else None,
                                                 scan=rng.random() < 0.2), rendered=i % render_every == 0)
        if use_target:
            (target / "config.json").write_text(json.dumps(target_cfg))
    rep.seconds = time.perf_counter() - t0
    rep.rss_growth_mb = _rss_mb() - rss0
    return rep


# =============================================================================== second round (issue 18)
# Captures (--states), prompt files, manifests and server replies: seeded, in process, structural and value
# mutations of valid inputs made from the trained fixtures. Every case ends in a result or an EaglectlError.

TRAINED = DRAFTERS.parent / "trained"
TRAINED_TARGET = TRAINED / "target"
VOCAB = 320  # the trained fixture target's vocabulary
NP_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
             "U8": "u1", "U64": "<u8", "BOOL": "?"}


def write_dump(path: Path, tensors: dict[str, tuple[str, Any]]) -> None:
    """A safetensors file of (dtype, numpy array) tensors, written by hand (any dtype / shape the test wants)."""
    import numpy as np

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, (dtype, arr) in tensors.items():
        arr = np.asarray(arr)
        if dtype == "BF16":
            raw = (np.ascontiguousarray(arr, dtype="<f4").view("<u4") >> 16).astype("<u2").tobytes()
        else:
            raw = np.ascontiguousarray(arr).astype(NP_DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    rebuild_header(path, json.dumps(header).encode(), b"".join(blobs))


def read_dump(path: Path) -> dict[str, tuple[str, Any]]:
    import numpy as np

    header, data = split_safetensors(path)
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], np.frombuffer(data[b:end], dtype=NP_DTYPES[e["dtype"]]).reshape(e["shape"]).copy())
    return out


def make_capture(out: Path, num_prompts: int = 2, length: int = 32) -> Path:
    """A small valid capture of the trained fixture target (HF engine, boundaries 0..8): what the fuzzer mutates."""

    capture_run(str(TRAINED_TARGET), str(out), engine="hf", drafter=str(TRAINED / "eagle3"), num_prompts=num_prompts,
                length=length)
    return out


def hostile_id(rng: random.Random) -> int:
    return rng.choice([VOCAB, VOCAB + 1, 10**6, 2**31, 2**40, 2**62, -1, -(2**62)])


def mutate_dump(t: dict[str, tuple[str, Any]], rng: random.Random) -> str:
    """One structural or value mutation of a request's tensors, in place; returns its name."""
    import numpy as np

    seq, layers, width = t["hidden_states"][1].shape
    hid = t["hidden_states"][1].astype(np.float64)
    kind = rng.choice(["oov-token", "oov-argmax", "bad-value", "all-nan", "zeros", "zero-layer", "constant",
                       "duplicate", "scale", "truncate", "length-mismatch", "drop", "extra", "dtype", "rank",
                       "layers", "width", "empty-width", "negative-zero"])
    if kind == "oov-token":
        t["token_ids"] = ("I64", t["token_ids"][1].copy())
        t["token_ids"][1][rng.randrange(seq)] = hostile_id(rng)
    elif kind == "oov-argmax":
        t["target_argmax"] = ("I64", t["target_argmax"][1].copy())
        t["target_argmax"][1][rng.randrange(seq)] = hostile_id(rng)
    elif kind == "bad-value":
        hid[rng.randrange(seq), rng.randrange(layers), rng.randrange(width)] = rng.choice(
            [np.nan, np.inf, -np.inf, 1e30, -3e38, 2e9, -1e12])
        t["hidden_states"] = ("F32", hid)
    elif kind == "all-nan":
        t["hidden_states"] = (t["hidden_states"][0], np.full_like(hid, np.nan))
    elif kind == "zeros":
        t["hidden_states"] = ("F32", np.zeros_like(hid))
    elif kind == "zero-layer":
        hid[:, rng.randrange(layers)] = 0.0
        t["hidden_states"] = ("F32", hid)
    elif kind == "constant":
        t["hidden_states"] = ("F32", np.full_like(hid, rng.choice([1.0, -3.5, 1e-30])))
    elif kind == "duplicate":
        t["hidden_states"] = ("F32", np.repeat(hid[:1], seq, axis=0))
    elif kind == "scale":
        t["hidden_states"] = ("F32", hid * rng.choice([1e-30, 1e-8, 1e4, 1e8]))
    elif kind == "truncate":
        n = rng.choice([0, 1, 2, 3, 5])
        for name in list(t):
            t[name] = (t[name][0], t[name][1][:n])
    elif kind == "length-mismatch":
        name = rng.choice(list(t))
        t[name] = (t[name][0], t[name][1][:-1])
    elif kind == "drop":
        del t[rng.choice(list(t))]
    elif kind == "extra":
        t["junk"] = ("F32", np.zeros((3, 3)))
    elif kind == "dtype":
        name = rng.choice(list(t))
        dtype = rng.choice(["I32", "U8", "I8", "U64", "F32", "F16", "BF16", "F64", "BOOL", "I16"])
        arr = t[name][1]
        if dtype in ("U8", "U64"):
            arr = np.abs(arr)
        t[name] = (dtype, arr)
    elif kind == "rank":
        name = rng.choice(list(t))
        arr = t[name][1]
        t[name] = (t[name][0], arr.reshape(arr.shape[0], -1) if arr.ndim > 2 else arr.reshape(-1, 1))
    elif kind == "layers":
        t["hidden_states"] = ("F32", hid[:, :-1] if rng.random() < 0.5 else np.concatenate([hid, hid[:, :1]], 1))
    elif kind == "width":
        t["hidden_states"] = ("F32", hid[..., :64] if rng.random() < 0.5 else np.pad(hid, ((0, 0), (0, 0), (0, 1))))
    elif kind == "empty-width":
        t["hidden_states"] = ("F32", hid[..., :0])
    else:
        t["hidden_states"] = ("F32", -0.0 * hid)
    return kind


def _clear(path: Path) -> Path:
    """Remove whatever an earlier mutation left at `path` (a file, a folder, a link, a FIFO)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    return path


CAPTURE_KEYS = ["layer_ids", "target_config", "convention", "target", "schema", "files", "dtype", "x"]
TARGET_KEYS = ["num_hidden_layers", "hidden_size", "vocab_size", "model_type", "text_config", "rms_norm_eps"]


def mutate_capture(case: Path, rng: random.Random, meta: dict[str, Any]) -> str:
    """One mutation of a capture folder (capture.json, a request's header or tensors, the folder itself)."""
    import os

    dumps = [p for p in sorted(case.glob("0000[01].safetensors")) if p.is_file() and not p.is_symlink()]
    r = rng.random()
    if r < 0.38 and dumps:
        file = rng.choice(dumps)
        try:
            tensors = read_dump(file)
        except Exception:  # noqa: BLE001 - an earlier mutation of this case broke the file: mutate its bytes
            file.write_bytes(mutate_bytes(file.read_bytes(), rng))
            return f"dump {file.name} bytes"
        try:
            kind = mutate_dump(tensors, rng)
        except Exception:  # noqa: BLE001 - an earlier mutation left tensors this one cannot apply to
            file.write_bytes(mutate_bytes(file.read_bytes(), rng))
            return f"dump {file.name} bytes"
        write_dump(file, tensors)
        return f"dump {file.name} {kind}"
    if r < 0.5 and dumps:
        file = rng.choice(dumps)
        try:
            header, data = split_safetensors(file)
        except Exception:  # noqa: BLE001 - as above
            file.write_bytes(mutate_bytes(file.read_bytes(), rng))
            return f"dump {file.name} bytes"
        raw = json.dumps(mutate_tree(header, rng, rng.randrange(1, 3))).encode() if rng.random() < 0.6 else \
            mutate_bytes(json.dumps(header).encode(), rng)
        rebuild_header(file, raw, data)
        return f"header {file.name}"
    if r < 0.62:
        m = json.loads(json.dumps(meta))
        key = rng.choice(TARGET_KEYS)
        m["target_config"][key] = rng.choice([hostile_value(rng), hostile_value(rng), 0, 10**12, "8", None])
        _clear(case / "capture.json").write_text(json.dumps(m))
        return f"capture.json target_config.{key}"
    if r < 0.72:
        m = json.loads(json.dumps(meta))
        key = rng.choice(CAPTURE_KEYS)
        m[key] = rng.choice([hostile_value(rng), [8, 0], [0, 1, 2, 99], [-1, 0], list(range(5000)), [], "boundary",
                             "output", [0, 0, 1], None])
        _clear(case / "capture.json").write_text(json.dumps(m))
        return f"capture.json {key}"
    if r < 0.8:
        _clear(case / "capture.json").write_text(json.dumps(mutate_tree(meta, rng, rng.randrange(1, 4))))
        return "capture.json tree"
    if r < 0.86:
        _clear(case / "capture.json").write_bytes(mutate_bytes(json.dumps(meta).encode(), rng))
        return "capture.json bytes"
    kind = rng.choice(["delete-one", "delete-all", "empty-file", "garbage-file", "dir-named-dump", "fifo",
                       "dev-zero", "json-dir", "json-missing", "json-loop", "json-empty"])
    if kind == "delete-one" and dumps:
        rng.choice(dumps).unlink()
    elif kind == "delete-all":
        for f in dumps:
            f.unlink()
    elif kind == "empty-file":
        _clear(case / "00009.safetensors").write_bytes(b"")
    elif kind == "garbage-file":
        _clear(case / "00009.safetensors").write_bytes(bytes(rng.randrange(256) for _ in range(rng.choice([7, 8, 64]))))
    elif kind == "dir-named-dump":
        _clear(case / "00009.safetensors").mkdir()
    elif kind == "fifo":
        os.mkfifo(_clear(case / "00009.safetensors"))
    elif kind == "dev-zero":
        os.symlink("/dev/zero", _clear(case / "00009.safetensors"))
    elif kind == "json-dir":
        _clear(case / "capture.json").mkdir()
    elif kind == "json-missing":
        _clear(case / "capture.json")
    elif kind == "json-loop":
        os.symlink("capture.json", _clear(case / "capture.json"))
    else:
        _clear(case / "capture.json").write_bytes(b"")
    return f"folder {kind}"


CONSUMERS = ("verify", "drift", "upgrade-dry", "inspect", "upgrade")
CONSUMER_WEIGHTS = (4, 3, 3, 2, 1)


def consume(name: str, case: Path, work: Path) -> Any:
    """Run one --states consumer on a capture, as the CLI would (its library entry point)."""
    from eaglectl.commands import inspect as inspect

    drafter = str(TRAINED / "eagle3")
    if name == "verify":
        return verify_run(drafter, states=str(case), tokens=16)
    if name == "drift":
        return drift_run([drafter], states=str(case), max_tokens=8, num_prompts=2, bootstrap_reps=100, depth=3)
    if name == "inspect":
        return inspect_checkpoint(drafter, states=str(case))
    dest = work / "dest"
    shutil.rmtree(dest, ignore_errors=True)
    try:
        return upgrade_run(drafter, str(dest), states=str(case), init="auto", to="speculators",
                           dry_run=name == "upgrade-dry", fidelity_tokens=16)
    except EaglectlError:
        if dest.exists():  # nothing may be written when the capture is refused
            raise AssertionError(f"{dest} was written by a refused upgrade") from None
        raise


RENDER = {"verify": "render_verify", "drift": "render_drift", "upgrade-dry": "render_upgrade",
          "upgrade": "render_upgrade", "inspect": "render_inspect"}


def render_with(result: Any, renderer: str) -> None:
    """Both output forms of any command, strictly encoded as a pipe would."""
    import io

    from rich.console import Console

    from eaglectl.cli import console, views

    json.dumps(result.to_json(), default=str).encode("utf-8")
    saved = console.stdout
    console.stdout = Console(file=io.StringIO(), width=80, highlight=False, soft_wrap=True)
    try:
        getattr(views, renderer)(result)
        console.stdout.file.getvalue().encode("utf-8")  # type: ignore[attr-defined]
    finally:
        console.stdout = saved


def read_capture(case: Path) -> Any:
    """The reader alone: open, every request checked against the fixture drafter's vocab, the labels' kind."""
    from eaglectl.io.states import open_states

    st = open_states(str(case))
    for _ in st.requests(vocab=VOCAB):
        pass
    st.embedding_source()
    _ = st.labels_are
    return st


def _count(rep: FuzzReport, code: int) -> None:
    rep.cases += 1
    rep.codes[code] = rep.codes.get(code, 0) + 1


class Parts:
    """The --states consumers' own steps on a capture, with the drafters loaded once (cheap enough for every case):
    the probe's session, calibration (split, stream, every init, the held-out error), verify's inputs and drift's
    run. The full commands (`consume`) run on a share of the cases."""

    def __init__(self) -> None:
        from eaglectl.checkpoint.drafter import open_drafter
        from eaglectl.commands.drift import PROTOCOLS
        from eaglectl.model.loader import load_reference

        self.eagle3 = load_reference(open_drafter(str(TRAINED / "eagle3")))
        self.no_table = load_reference(open_drafter(str(TRAINED / "eagle3.1")))  # ships no embedding: reads boundary 0
        self.proto = PROTOCOLS["paper-v1"]

    def run(self, name: str, case: Path) -> Any:
        import numpy as np

        from eaglectl.commands import drift
        from eaglectl.commands.upgrade import calibration
        from eaglectl.commands.upgrade import inits as upgrade_inits
        from eaglectl.io.states import open_states
        from eaglectl.measure import parity, probe

        st = open_states(str(case))
        d = self.eagle3
        if name == "session":
            return probe.states_session(st, {0, 2, 4, 5}, 64, 3, vocab=VOCAB)
        if name == "calibrate":
            W = d.tensors["fc.weight"].double().numpy()
            n, width = d.args.num_aux, d.args.target_hidden_size
            cal, held, _ = upgrade_inits._split_requests(st, (2, 4, 5), rank=True)
            m = calibration.accumulate(W, n, width, 1e-6, cal)
            h = calibration.accumulate(W, n, width, 1e-6, held) if held is not None else None
            for init in ("harmonic", "calibrated", "refit"):
                fitted = calibration.fit(init, n, width, m)
                assert all(np.isfinite(g).all() for g in fitted[0]), "a non-finite fc_norm weight"
                if h is not None and h.tokens:
                    calibration.held_out_error(fitted, h)
            return None
        if name == "inputs":
            d = self.no_table
            ids = d.spec.capture_ids(st.num_layers) if isinstance(st.num_layers, int) else (2, 4, 5)
            return parity.states_inputs(st, ids, 16, 3, shrink=True, vocab=d.args.vocab_size)
        return drift._states_run(self.no_table, st, self.proto, 3, 8, 2, 100, 0)


PARTS = ("session", "calibrate", "inputs", "drift-run")


def fuzz_captures(work: Path, base: Path, *, cases: int, seed: int = 0, full_share: float = 0.3) -> FuzzReport:
    """Mutate a valid capture `cases` times. Each goes through the reader; one the reader accepts then goes through
    one consumer step (`Parts`) or, for `full_share` of them, one whole command (verify, drift, upgrade, inspect)
    and its renderer; a refused one does too, now and then (the commands read subsets: they must refuse or cope)."""
    rng = random.Random(seed)
    rep = FuzzReport()
    meta = json.loads((base / "capture.json").read_text())
    case = work / "case"
    parts = Parts()
    for name in CONSUMERS + PARTS:  # warm-up: first-call imports are not what the per-case bound measures
        shutil.rmtree(case, ignore_errors=True)
        shutil.copytree(base, case)
        consume(name, case, work) if name in CONSUMERS else parts.run(name, case)
    rss0 = _rss_mb()
    t0 = time.perf_counter()
    for i in range(cases):
        shutil.rmtree(case, ignore_errors=True)
        shutil.copytree(base, case)
        label = f"#{i} " + mutate_capture(case, rng, meta)
        if rng.random() < 0.15:
            label += " + " + mutate_capture(case, rng, meta)
        t = time.perf_counter()
        code, _ = _timed(rep, label + " [reader]", lambda: read_capture(case))
        r = rng.random()
        if code == 70 or (code != 0 and r > 0.3):
            _count(rep, code)
            continue
        if r < full_share * (1 if code == 0 else 0.3):
            name = rng.choices(CONSUMERS, CONSUMER_WEIGHTS)[0]
            code2, result = _timed(rep, f"{label} [{name}]", lambda name=name: consume(name, case, work))
            if result is not None and code2 != 70:
                code2, _ = _timed(rep, f"{label} [{name} render]",
                                  lambda result=result, name=name: render_with(result, RENDER[name]))
                code2 = code2 if code2 == 70 else getattr(result, "exit_code", 0)
        else:
            name = rng.choice(PARTS)
            code2, _ = _timed(rep, f"{label} [{name}]", lambda name=name: parts.run(name, case))
        dt = time.perf_counter() - t
        if dt > rep.slowest:
            rep.slowest, rep.slowest_case = dt, f"{label} [reader + {name}]"
        _count(rep, code2)
    rep.seconds = time.perf_counter() - t0
    rep.rss_growth_mb = _rss_mb() - rss0
    return rep


# ------------------------------------------------------------------------------------------ prompt files

GOOD_LINES: list[dict[str, Any]] = [
    {"prompt": "def main():\n    return 1"}, {"prompt_token_ids": [5, 6, 7, 8, 9]},
    {"messages": [{"role": "user", "content": "hi there"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x = "}]},
]
CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'bad' %}{{ raise_exception('no such role') }}{% endif %}"
                 "<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def chat_target(work: Path) -> Path:
    """The trained fixture target's tokenizer and config with a chat template (its own has none)."""
    folder = work / "chat-target"
    folder.mkdir(exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TRAINED_TARGET / name, folder / name)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def hostile_prompt_line(rng: random.Random) -> bytes:
    good = rng.choice(GOOD_LINES)
    kind = rng.randrange(14)
    if kind == 0:
        return rng.choice([b"[1, 2]", b"3", b"null", b'"text"', b"true", b"{}", b'{"x": 1}', b"[]", b"-0.5"])
    if kind == 1:
        return json.dumps({"prompt": hostile_value(rng)}).encode()
    if kind == 2:
        return json.dumps({"prompt_token_ids": rng.choice([
            [], [VOCAB], [-1], [2**63], [10**30], [1.5], [True], ["1"], [[1]], "abc", None, {"a": 1},
            list(range(2000)), [hostile_id(rng)], [rng.randrange(VOCAB) for _ in range(rng.choice([1, 50, 900]))],
            hostile_value(rng)])}).encode()
    if kind == 3:
        return json.dumps({"messages": rng.choice([
            "x", [], [{}], [{"role": "user"}], [{"role": 1, "content": "x"}], [{"role": "user", "content": ["x"]}],
            [{"role": "bad", "content": "x"}], [{"role": "user", "content": None}], [1, 2],
            [{"role": "user", "content": "x"}] * 2000, hostile_value(rng)])}).encode()
    if kind == 4:
        return json.dumps(mutate_tree(good, rng, rng.randrange(1, 3))).encode()
    if kind == 5:
        return mutate_bytes(json.dumps(good).encode(), rng).replace(b"\n", b" ")
    if kind == 6:
        return rng.choice([b"\xff\xfe{}", b"\xef\xbb\xbf" + json.dumps(good).encode(), b'{"prompt": "\\ud800x"}',
                           b'{"prompt": "a\xc3"}', b'{"prompt_token_ids": [' + b"9" * 5000 + b"]}",
                           b'{"prompt_token_ids": [NaN]}', b'{"prompt": "x", "prompt": "y"}'])
    if kind == 7:
        return b"[" * rng.choice([70, 5000]) + b"]" * rng.choice([0, 70, 5000])
    if kind == 8:
        return json.dumps({"prompt": rng.choice(["", " ", "x" * 20_000, "\x00", "\u202e\x1b[31m"])}).encode()
    if kind == 9:
        return json.dumps({**good, "prompt_token_ids": rng.choice([[1, 2], "x", None])}).encode()
    return json.dumps(good).encode()


def write_speed_bench(folder: Path, rng: random.Random) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    kind = rng.choice(["ok", "no-turns", "no-category", "turns-int", "turns-list-int", "turns-empty", "turns-null",
                       "category-int", "placeholder", "garbage", "empty-table", "nested", "none"])
    sub = folder / "throughput_1k" if kind == "nested" else folder
    sub.mkdir(exist_ok=True)
    if kind == "none":
        return kind
    if kind == "garbage":
        (sub / "x.parquet").write_bytes(b"PAR1" + bytes(rng.randrange(256) for _ in range(64)))
        return kind
    n = 0 if kind == "empty-table" else 3
    cols: dict[str, Any] = {"question_id": pa.array([f"q{i}" for i in range(n)], pa.string()),
                            "category": pa.array(["code", "chat", "math"][:n], pa.string()),
                            "turns": pa.array([["write a loop"], ["hello"], ["2 + 2 ="]][:n], pa.list_(pa.string()))}
    if kind == "no-turns":
        del cols["turns"]
    elif kind == "no-category":
        del cols["category"]
    elif kind == "turns-int":
        cols["turns"] = pa.array([1, 2, 3], pa.int64())
    elif kind == "turns-list-int":
        cols["turns"] = pa.array([[1], [2], [3]], pa.list_(pa.int64()))
    elif kind == "turns-empty":
        cols["turns"] = pa.array([[], ["a"], ["b"]], pa.list_(pa.string()))
    elif kind == "turns-null":
        cols["turns"] = pa.array([None, ["a"], [None]], pa.list_(pa.string()))
    elif kind == "category-int":
        cols["category"] = pa.array([1, 2, 3], pa.int64())
    elif kind == "placeholder":
        cols["turns"] = pa.array([["FULL BENCHMARK DATA SHOULD BE FETCHED"], ["a"], ["b"]], pa.list_(pa.string()))
    pq.write_table(pa.table(cols), sub / "part.parquet")
    return kind


def write_prompt_case(path: Path, rng: random.Random) -> str:
    """A hostile --prompts value at `path` (a file, a folder, or nothing); returns its label."""
    import os

    r = rng.random()
    if r < 0.06:
        return "speed-bench " + write_speed_bench(path, rng)
    if r < 0.1:
        kind = rng.choice(["empty", "blank", "missing", "dir", "fifo", "huge-line", "crlf", "no-newline"])
        if kind == "empty":
            path.write_bytes(b"")
        elif kind == "blank":
            path.write_bytes(b"\n  \n\t\n")
        elif kind == "dir":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "huge-line":  # one line over the prompt_line_bytes limit
            from eaglectl.limits import limit

            with path.open("wb") as f:
                f.write(b'{"prompt": "' + b"a" * (limit("prompt_line_bytes") + 10) + b'"}\n')
        elif kind == "crlf":
            path.write_bytes(b"\r\n".join(json.dumps(g).encode() for g in GOOD_LINES) + b"\r\n")
        elif kind == "no-newline":
            path.write_bytes(json.dumps(GOOD_LINES[1]).encode())
        return f"file {kind}"
    lines = []
    for _ in range(rng.randrange(1, 6)):
        lines.append(hostile_prompt_line(rng) if rng.random() < 0.6 else json.dumps(rng.choice(GOOD_LINES)).encode())
        if rng.random() < 0.2:
            lines.append(b"")
    path.write_bytes(b"\n".join(lines) + b"\n")
    return "lines"


def fuzz_prompt_files(work: Path, *, cases: int, seed: int = 0) -> FuzzReport:
    """`cases` hostile prompt files through the workload reader (smoke's, capture's and drift's), with a plain
    tokenizer, a chat one (template that may raise) or none."""
    from eaglectl.measure import workload

    rng = random.Random(seed)
    rep = FuzzReport()
    plain = workload.tokenizer_of(str(TRAINED_TARGET))
    chat = workload.tokenizer_of(str(chat_target(work)), chat=True)
    rss0 = _rss_mb()
    t0 = time.perf_counter()
    for i in range(cases):
        path = work / f"prompts-{i}.jsonl"
        label = f"#{i} " + write_prompt_case(path, rng)
        tok = rng.choice([plain, chat, chat, None])
        if rng.random() < 0.15:
            template = rng.choice(workload.TEMPLATES)
            code, _ = _timed(rep, label + f" [templates {template}]",
                             lambda path=path, template=template: workload.template_prompts(
                                 str(path), chat, template, "Be brief.", 3, VOCAB))
        else:
            count, length = rng.choice([0, 1, 3, 16]), rng.choice([None, None, 40])

            def load(tok: Any = tok, count: int = count, length: int | None = length, path: Path = path) -> Any:
                workload.needs_chat(str(path))
                return workload.load_prompts(str(path), tok, count=count, max_tokens=8, max_model_len=1024, k=3,
                                             seed=0, length=length, vocab=VOCAB)

            code, got = _timed(rep, label + f" [load count={count} length={length}]", load)
            if got is not None and not all(p and all(0 <= t < VOCAB for t in p) for p in got.prompts):
                rep.internal.append(f"{label}: accepted a prompt that is empty or outside the vocabulary")
        _count(rep, code)
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    rep.seconds = time.perf_counter() - t0
    rep.rss_growth_mb = _rss_mb() - rss0
    return rep


# ---------------------------------------------------------------------------------------------- manifests

MANIFEST_COMMANDS = {  # command line, and the items' good shape
    "convert": (["convert", "--to", "modelopt", "--dry-run"], True),
    "upgrade": (["upgrade", "--dry-run", "--no-fidelity"], True),
    "check": (["check", "--no-card", "--no-measure"], False),
}
MANIFEST_KEYS = ["source", "dest", "to", "target", "dtype", "aux_layer_ids", "max_shard_size", "measure", "from",
                 "allow_pickle", "init", "fidelity", "states", "base_model", "strict", "taget", "sourse", ""]


def hostile_manifest_line(rng: random.Random, good: dict[str, Any]) -> bytes:
    kind = rng.randrange(10)
    if kind == 0:
        return rng.choice([b"[1, 2]", b"3", b"null", b'"x"', b"{}", b'{"dest": "x"}', b"[]"])
    if kind == 1:
        return json.dumps({**good, rng.choice(MANIFEST_KEYS): hostile_value(rng)}).encode()
    if kind == 2:
        return json.dumps({**good, rng.choice(["source", "dest", "target", "to"]): rng.choice(
            ["a\x00b", "\ud800", "", " ", "x" * 5000, "/dev/null", "-", "../../x", "hf://", "org/name@"])}).encode()
    if kind == 3:
        return json.dumps(mutate_tree(good, rng, rng.randrange(1, 3))).encode()
    if kind == 4:
        return mutate_bytes(json.dumps(good).encode(), rng).replace(b"\n", b" ")
    if kind == 5:
        return rng.choice([b"\xff\xfe{}", b"\xef\xbb\xbf" + json.dumps(good).encode(), b"# a comment",
                           b'{"source": "a", "source": "b"}', b"[" * 5000, b'{"source": "\\ud800"}'])
    if kind == 6:
        key = rng.choice(["aux_layer_ids", "max_shard_size", "dtype", "measure", "init"])
        return json.dumps({**good, key: rng.choice(["1,,2", "0", "-5GB", "float8", "yes", [1, 2], {"a": 1}, 1e308, -1,
                                                    "nan", "2,16,99999999"])}).encode()
    return json.dumps(good).encode()


def fuzz_manifests(work: Path, *, cases: int, seed: int = 0) -> FuzzReport:
    """`cases` hostile manifests through the CLI (convert / upgrade --dry-run, check): exit 70 is an internal error."""
    import os

    from click.testing import CliRunner

    from eaglectl.cli.app import cli

    rng = random.Random(seed)
    rep = FuzzReport()
    runner = CliRunner()
    sources = []
    for n in ("speculators-3", "specforge-3", "eagle-3", "speculators-3.1"):  # copies: a `card` item writes README
        shutil.copytree(DRAFTERS / n, work / f"src-{n}")
        sources.append(str(work / f"src-{n}"))
    for args, need_dest in MANIFEST_COMMANDS.values():  # warm-up: first-call imports are not what is measured
        warm = work / "warm.jsonl"
        warm.write_text(json.dumps({"source": sources[0], **({"dest": str(work / "warm")} if need_dest else {})}))
        runner.invoke(cli, [*args, "--manifest", str(warm)])
    rss0 = _rss_mb()
    t0 = time.perf_counter()
    for i in range(cases):
        command = rng.choice(list(MANIFEST_COMMANDS))
        args, need_dest = MANIFEST_COMMANDS[command]
        path = work / f"m-{i}.jsonl"
        r = rng.random()
        if r < 0.03:
            with path.open("wb") as f:  # sparse: over the byte limit without writing it
                f.truncate(65 * 2**20)
            label = "sparse huge"
        elif r < 0.05:
            path.write_bytes(b'{"source": "x"}\n' * 10_001)
            label = "too many items"
        elif r < 0.07:
            path.write_bytes(rng.choice([b"", b"\n\n", b"# only a comment\n"]))
            label = "empty"
        else:
            lines = []
            for j in range(rng.randrange(1, 4)):
                good: dict[str, Any] = {"source": rng.choice(sources)}
                if need_dest:
                    good["dest"] = str(work / f"dest-{i}-{j}")
                lines.append(hostile_manifest_line(rng, good) if rng.random() < 0.7 else json.dumps(good).encode())
            path.write_bytes(b"\n".join(lines) + b"\n")
            label = "lines"
        label = f"#{i} {command} {label}"
        t = time.perf_counter()
        result = runner.invoke(cli, [*args, "--manifest", str(path)], catch_exceptions=True)
        dt = time.perf_counter() - t
        code = result.exit_code
        if code == 70 or (result.exception is not None and not isinstance(result.exception, SystemExit)):
            rep.internal.append(f"{label}: exit {code} {result.exception!r} {result.output[-300:]!r}")
            code = 70
        elif '"exit_code": 70' in result.output or "internal error" in result.output:
            rep.internal.append(f"{label}: an item ended in an internal error: {result.output[-300:]!r}")
        if dt > rep.slowest:
            rep.slowest, rep.slowest_case = dt, label
        _count(rep, code)
        written = [p for p in work.glob(f"dest-{i}-*")]
        if written:
            rep.internal.append(f"{label}: a dry run wrote {written[0]}")
        os.unlink(path)
    rep.seconds = time.perf_counter() - t0
    rep.rss_growth_mb = _rss_mb() - rss0
    return rep


# -------------------------------------------------------------------------------------------- server replies

SERVER_FAULTS = ["never", "slow", "drip", "status", "nonjson", "huge-claim", "huge-stream", "chunked-huge",
                 "bad-chunk", "redirect-off", "redirect-same", "redirect-loop", "garbage", "close", "short",
                 "header-flood", "shape", "shape", "shape", "ok"]
ENDPOINTS = ["/v1/models", "/version", "/metrics", "/v1/completions"]


class HostileServer:
    """A real `http.server` on 127.0.0.1 answering as vLLM does, except for one planned fault per case."""

    def __init__(self, work: Path) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.work = work
        self.release = threading.Event()
        self.plan: dict[str, Any] = {}
        self.earlier: Path | None = None  # an earlier capture's dump the server named this case
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.answer(self, None)

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                server.answer(self, json.loads(self.rfile.read(n)))

        class Quiet(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up (broken pipe) is what these faults provoke

        self.srv = Quiet(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.srv.shutdown()
        self.srv.server_close()

    def start(self, plan: dict[str, Any]) -> None:
        self.plan = {**plan, "metrics_calls": 0, "drafts": 10.0, "seq": 0}

    # -- the normal replies ------------------------------------------------------------------------------

    def normal(self, path: str, body: Any) -> tuple[str, Any]:
        plan = self.plan
        if path == "/v1/models":
            return "json", {"data": [{"id": "served-target"}]}
        if path == "/version":
            return "json", {"version": "0.32.0"}
        if path == "/metrics":
            plan["metrics_calls"] += 1
            d = plan["drafts"]
            lines = [f'vllm:spec_decode_num_drafts_total{{engine="0"}} {d}',
                     f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {3 * d}',
                     f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {d}',
                     f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {d}']
            return "text", "\n".join(lines) + "\n"
        plan["drafts"] += 1
        prompt = body.get("prompt") if isinstance(body, dict) else []
        reply: dict[str, Any] = {"choices": [{"text": "x", "token_ids": list(range(int(body.get("max_tokens", 1))))}]}
        if plan["mode"] == "capture":
            plan["seq"] += 1
            dump = self.work / "storage" / f"req-{plan['seq']}.safetensors"
            dump.parent.mkdir(exist_ok=True)
            import numpy as np

            write_dump(dump, {"hidden_states": ("F32", np.ones((len(prompt), 3, 128), dtype=np.float32)),
                              "token_ids": ("I64", np.asarray(prompt, dtype=np.int64))})
            reply["kv_transfer_params"] = {"hidden_states_path": str(dump)}
            reply["choices"][0]["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": -0.1, "rank": 1, "decoded_token": "x"}} for t in prompt[1:]]
            reply["choices"][0]["token_ids"] = [7]
        return "json", reply

    def shape_fault(self, path: str, body: Any, rng: random.Random) -> tuple[str, Any]:
        kind, doc = self.normal(path, body)
        if path == "/v1/models":
            return "json", rng.choice([[], {"data": {}}, {"data": []}, {"data": [{}]}, {"data": [{"id": 5}]},
                                       {"data": [{"id": "x" * 5000}]}, {"data": None}])
        if path == "/version":
            return "json", rng.choice([[], {"version": 5}, {"version": "x" * 500}, None])
        if path == "/metrics":
            calls = self.plan["metrics_calls"]
            d = self.plan["drafts"]
            return "text", rng.choice([
                f"vllm:spec_decode_num_drafts_total {d - 100 if calls > 1 else d}\n",  # backwards after the run
                "vllm:spec_decode_num_drafts_total NaN\n", "vllm:spec_decode_num_drafts_total -5\n",
                "vllm:spec_decode_num_drafts_total abc\n", "vllm:spec_decode_num_drafts_total 1e400\n",
                "vllm:num_requests_running 0\n" if calls > 1 else doc,  # counters gone after the run
                doc + (f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="1"}} {d}\n' if calls == 1
                       else ""),  # a position disappears
                doc + 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="99999999999"} 1\n',
                "\x00\xff garbage\n", "", doc * 3])
        choice = doc["choices"][0]
        if self.plan["mode"] == "capture" and rng.random() < 0.6:
            target = rng.choice(["plp-missing", "plp-short", "plp-rank", "plp-key", "plp-oov", "gen-missing",
                                 "path-missing", "path-relative", "path-nul", "path-dir", "path-link", "path-keep",
                                 "path-earlier", "dump-tokens", "dump-layers", "path-type"])
            kv = doc["kv_transfer_params"]
            if target == "plp-missing":
                del choice["prompt_logprobs"]
            elif target == "plp-short":
                choice["prompt_logprobs"] = choice["prompt_logprobs"][:-1]
            elif target == "plp-rank":
                choice["prompt_logprobs"] = [None] + [{"5": {"rank": 2}}] * (len(choice["prompt_logprobs"]) - 1)
            elif target == "plp-key":
                choice["prompt_logprobs"] = [None] + [{"x1": {"rank": 1}}] * (len(choice["prompt_logprobs"]) - 1)
            elif target == "plp-oov":
                choice["prompt_logprobs"] = [None] + [{str(10**9): {"rank": 1}}] * (len(choice["prompt_logprobs"]) - 1)
            elif target == "gen-missing":
                choice["token_ids"] = rng.choice([[], None, ["7"], [10**12]])
            elif target == "path-missing":
                del doc["kv_transfer_params"]
            elif target == "path-relative":
                kv["hidden_states_path"] = "req.safetensors"
            elif target == "path-nul":
                kv["hidden_states_path"] = "/tmp/a\x00b.safetensors"
            elif target == "path-dir":
                (self.work / "storage" / "d.safetensors").mkdir(exist_ok=True)
                kv["hidden_states_path"] = str(self.work / "storage" / "d.safetensors")
            elif target == "path-link":
                link = self.work / "storage" / "link.safetensors"
                if not link.is_symlink():
                    link.symlink_to(kv["hidden_states_path"])
                kv["hidden_states_path"] = str(link)
            elif target == "path-keep":  # a file of the user's that is no dump: must be refused and kept
                kv["hidden_states_path"] = str(self.work / "keep.safetensors")
            elif target == "path-earlier":  # a real dump of the same prompt outside the storage folder: kept
                self.earlier = self.work / "earlier" / Path(kv["hidden_states_path"]).name
                self.earlier.parent.mkdir(exist_ok=True)
                shutil.copyfile(kv["hidden_states_path"], self.earlier)
                kv["hidden_states_path"] = str(self.earlier)
            elif target == "dump-tokens":
                import numpy as np

                write_dump(Path(kv["hidden_states_path"]), {"hidden_states": ("F32", np.ones((4, 3, 128))),
                                                            "token_ids": ("I64", np.asarray([9, 9, 9, 9]))})
            elif target == "dump-layers":
                import numpy as np

                n = len(body["prompt"])
                write_dump(Path(kv["hidden_states_path"]), {"hidden_states": ("F32", np.ones((n, 2, 128))),
                                                            "token_ids": ("I64", np.asarray(body["prompt"]))})
            else:
                kv["hidden_states_path"] = rng.choice([5, ["x"], {"a": 1}])
            return "json", doc
        return "json", rng.choice([{}, {"choices": []}, {"choices": [5]}, {"choices": [{"token_ids": "x"}]},
                                   {"choices": [{"token_ids": [1.5]}]}, {"choices": [{"token_ids": list(range(99))}]},
                                   {"choices": [{"token_ids": [-1]}]}, [], None])

    # -- answering -----------------------------------------------------------------------------------

    def answer(self, h: Any, body: Any) -> None:
        plan = self.plan
        path = h.path[2:] if h.path.startswith("/r/") else h.path
        fault = plan["fault"] if path == plan["where"] and not plan.get("done") else "ok"
        if fault not in ("ok", "redirect-loop") and path != "/metrics":
            plan["done"] = True  # one faulty reply per case (a /metrics fault may hit the second read)
        rng = plan["rng"]
        wait = plan["timeout"]
        try:
            if fault == "never":
                self.release.wait(4 * wait + 1)
                return
            if fault == "slow":
                time.sleep(3 * wait)
                fault = "ok"
            if fault in ("redirect-off", "redirect-same", "redirect-loop"):
                h.send_response(rng.choice([301, 302, 307, 308]))
                h.send_header("Location", {"redirect-off": f"http://192.0.2.1:9{path}",
                                           "redirect-same": f"/r{path}", "redirect-loop": h.path}[fault])
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            if fault == "garbage":
                h.wfile.write(rng.choice([b"HELLO WORLD\r\n\r\n", b"HTTP/1.1 999 x\r\n\r\n", b"\x00\xff" * 10,
                                          b"HTTP/1.1 200\r\nContent-Length: x\r\n\r\n{}"]))
                return
            if fault == "close":
                return
            if fault == "header-flood":
                h.send_response(200)
                for i in range(rng.choice([150, 1])):
                    h.send_header(f"X-{i}", "y" * rng.choice([10, 70_000]))
                h.end_headers()
                return
            if fault == "status":
                code = rng.choice([500, 502, 503, 404, 400, 429, 418, 204, 302])
                h.send_response(code)
                data = b"<html><body>\x1b[31mInternal Server Error\x00</body></html>"
                h.send_header("Content-Length", str(len(data)))
                h.end_headers()
                h.wfile.write(data)
                return
            if fault == "nonjson":
                data = rng.choice([b"<html>", b"", b"nan", b'{"data": [', b"\xff\xfe", b"[" * 5000,
                                   b"9" * 5000, b"\xef\xbb\xbf{}", b"\x00"])
                kind, doc = "raw", data
            elif fault == "shape":
                kind, doc = self.shape_fault(path, body, rng)
            else:
                kind, doc = self.normal(path, body)
            data = doc if kind == "raw" else (doc.encode("utf-8", errors="surrogateescape") if kind == "text"
                                              else json.dumps(doc).encode())
            from eaglectl.limits import limit

            cap = limit("server_reply_bytes")
            if fault == "huge-claim":
                h.send_response(200)
                h.send_header("Content-Length", str(10**12))
                h.end_headers()
                h.wfile.write(data[:10])
                return
            if fault in ("huge-stream", "chunked-huge", "bad-chunk"):
                h.send_response(200)
                if fault == "huge-stream":
                    h.end_headers()
                    h.wfile.write(b" " * (cap + 10))
                    return
                h.send_header("Transfer-Encoding", "chunked")
                h.end_headers()
                if fault == "bad-chunk":
                    h.wfile.write(b"zz\r\nxx\r\n")
                    return
                block = b" " * 65536
                for _ in range(cap // len(block) + 2):
                    h.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                h.wfile.write(b"0\r\n\r\n")
                return
            h.send_response(200)
            h.send_header("Content-Type", "text/plain" if kind == "text" else "application/json")
            h.send_header("Content-Length", str(len(data) + (90 if fault == "short" else 0)))
            h.end_headers()
            if fault == "drip":
                for b in data:
                    if self.release.wait(wait / 4):
                        return
                    h.wfile.write(bytes([b]))
                    h.wfile.flush()
                return
            h.wfile.write(data)
        except OSError:
            pass  # the client gave up first


def fuzz_server(work: Path, *, cases: int, seed: int = 0, timeout_s: float = 0.2) -> FuzzReport:
    """`cases` runs of smoke --server and capture --engine server against a local server with one hostile reply
    each (or a bad URL); the reply cap is lowered to 1 MiB here so oversized replies are quick to send."""
    from eaglectl.commands import capture
    from eaglectl.commands.smoke import server as server_smoke
    from eaglectl.limits import LIMITS, Limit

    rng = random.Random(seed)
    rep = FuzzReport()
    saved = LIMITS["server_reply_bytes"]
    LIMITS["server_reply_bytes"] = Limit(1 << 20, saved.applies_to)
    keep = work / "keep.safetensors"
    keep.write_bytes(b"the user's file, not a dump")
    srv = HostileServer(work)
    rss0 = _rss_mb()
    t0 = time.perf_counter()
    try:
        for i in range(cases):
            mode = "capture" if rng.random() < 0.35 else "smoke"
            fault, where = rng.choice(SERVER_FAULTS), rng.choice(ENDPOINTS if mode == "smoke" else
                                                                 ["/v1/models", "/v1/completions"])
            url = srv.url
            if rng.random() < 0.04:
                from .conftest import free_port

                url = rng.choice([f"http://127.0.0.1:{free_port()}", "ftp://127.0.0.1/", "http://", "http://:99999",
                                  "127.0.0.1:8000", "http://127.0.0.1:99999/", "http://[::1"])
                fault = "url"
            srv.start({"mode": mode, "fault": fault, "where": where, "rng": rng, "timeout": timeout_s})
            label = f"#{i} {mode} {fault} at {where} ({url})"
            if mode == "smoke":
                def go(url: str = url) -> Any:
                    return server_smoke.run(url, [[1, 2, 3], [4, 5]], max_tokens=4, timeout_s=timeout_s)
            else:
                stage = work / f"stage-{i}"
                stage.mkdir()

                def go(url: str = url, stage: Path = stage) -> Any:
                    return capture._server(url, stage, (2, 4, 5), [[1, 2, 3, 4], [5, 6, 7]], timeout_s, passthrough,
                                           hidden_size=128, vocab=VOCAB, storage=str(work / "storage"))
            t = time.perf_counter()
            code, _ = _timed(rep, label, go)
            if time.perf_counter() - t > 4 * timeout_s + 0.5:
                rep.internal.append(f"{label}: took {time.perf_counter() - t:.2f} s (timeout {timeout_s} s)")
            if not keep.exists():
                rep.internal.append(f"{label}: removed a file the server named that is not a dump")
                keep.write_bytes(b"the user's file, not a dump")
            if srv.earlier is not None and not srv.earlier.exists():
                rep.internal.append(f"{label}: removed a dump outside the storage folder (an earlier capture)")
            srv.earlier = None
            _count(rep, code)
            shutil.rmtree(work / f"stage-{i}", ignore_errors=True)
    finally:
        srv.close()
        LIMITS["server_reply_bytes"] = saved
    rep.seconds = time.perf_counter() - t0
    rep.rss_growth_mb = _rss_mb() - rss0
    return rep


# =============================================================================== third round (issue 30): GGUF
# eaglectl's own GGUF output (the trained EAGLE-3 fixture, `convert --to gguf`) split into its parts, mutated (header,
# KV metadata, tensor infos, data, bytes) and written back. Every case ends in a report or an EaglectlError; the
# cases that exit 0 are offered to llama.cpp's real loader (llama-cpp-python, where installed), which must not
# refuse their tensor ranges.

GGUF_ALIGN = 32
# gguf_type ids (ggml/include/gguf.h) -> struct format; 8 = STRING, 9 = ARRAY
GGUF_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<b", 10: "<Q", 11: "<q", 12: "<d"}
GGML_BYTES = {0: 4, 1: 2, 24: 1, 25: 2, 26: 4, 27: 8, 28: 8, 30: 2}  # the unquantised ggml types: bytes per element


def gguf_value(kind: int, value: Any) -> bytes:
    """A KV's type and value as GGUF stores them (an array: kind 9 with (item kind, items))."""
    if kind == 9:
        sub, items = value
        return struct.pack("<iiQ", 9, sub, len(items)) + b"".join(gguf_value(sub, v)[4:] for v in items)
    if kind == 8:
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
        return struct.pack("<iQ", 8, len(raw)) + raw
    fmt = GGUF_FORMATS[kind]
    if fmt[-1] not in "fd":  # an integer wider than the type wraps, as a C cast would
        bits = 8 * struct.calcsize(fmt)
        value = int(value) % 2**bits
        value = value - 2**bits if fmt[-1].islower() and value >= 2 ** (bits - 1) else value
    return struct.pack("<i", kind) + struct.pack(fmt, value)


@dataclass
class GGUFImage:
    """A GGUF file as parts: raw KV pairs (key, type and value bytes), tensor infos, the data section. `n_tensors` /
    `n_kv` override the counts written; `align` is what the data section is padded to when written."""

    version: int
    kvs: list[tuple[bytes, bytes]]
    tensors: list[dict[str, Any]]  # name (bytes), dims (ggml order), type, offset
    data: bytes
    align: int = GGUF_ALIGN
    n_tensors: int | None = None
    n_kv: int | None = None
    tail: bytes = b""  # bytes after the data section

    @classmethod
    def parse(cls, raw: bytes) -> GGUFImage:
        """A valid file's parts (eaglectl's own output: no general.alignment, so 32)."""
        pos = 4
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", raw, pos)
        pos += 20

        def string() -> bytes:
            nonlocal pos
            (n,) = struct.unpack_from("<Q", raw, pos)
            pos += 8 + n
            return raw[pos - n: pos]

        def skip(kind: int) -> None:
            nonlocal pos
            if kind == 8:
                string()
            elif kind == 9:
                sub, n = struct.unpack_from("<iQ", raw, pos)
                pos += 12
                for _ in range(n):
                    skip(sub)
            else:
                pos += struct.calcsize(GGUF_FORMATS[kind])

        kvs = []
        for _ in range(n_kv):
            key = string()
            start = pos
            (kind,) = struct.unpack_from("<i", raw, pos)
            pos += 4
            skip(kind)
            kvs.append((key, raw[start:pos]))
        tensors = []
        for _ in range(n_tensors):
            name = string()
            (n_dims,) = struct.unpack_from("<I", raw, pos)
            dims = list(struct.unpack_from(f"<{n_dims}q", raw, pos + 4))
            pos += 4 + 8 * n_dims
            kind, offset = struct.unpack_from("<iQ", raw, pos)
            pos += 12
            tensors.append({"name": name, "dims": dims, "type": kind, "offset": offset})
        start = -(-pos // GGUF_ALIGN) * GGUF_ALIGN
        return cls(version, kvs, tensors, raw[start:])

    def to_bytes(self) -> bytes:
        out = bytearray(b"GGUF" + struct.pack("<I", self.version))
        out += struct.pack("<qq", len(self.tensors) if self.n_tensors is None else self.n_tensors,
                           len(self.kvs) if self.n_kv is None else self.n_kv)
        for key, value in self.kvs:
            out += struct.pack("<Q", len(key)) + key + value
        for t in self.tensors:
            out += struct.pack("<Q", len(t["name"])) + t["name"] + struct.pack("<I", len(t["dims"]))
            out += b"".join(struct.pack("<q", d) for d in t["dims"])
            out += struct.pack("<iQ", t["type"], t["offset"] % 2**64)
        # padded as declared, up to 4 KiB (a declared 2^31 leaves the data where 32 puts it: no 2 GiB case files)
        align = self.align if 0 < self.align <= 4096 and not self.align & (self.align - 1) else GGUF_ALIGN
        out += b"\0" * (-len(out) % align)
        return bytes(out + self.data + self.tail)

    def key(self, name: str) -> int | None:
        return next((i for i, (k, _) in enumerate(self.kvs) if k == name.encode()), None)

    def set(self, name: str, kind: int, value: Any) -> None:
        i, raw = self.key(name), (name.encode(), gguf_value(kind, value))
        if i is None:
            self.kvs.append(raw)
        else:
            self.kvs[i] = raw


def hostile_kv(rng: random.Random) -> tuple[int, Any]:
    """(gguf type, value) for an eagle3.* key: wrong types, out-of-range sizes, arrays of the wrong length."""
    kind = rng.randrange(9)
    if kind == 0:
        return 4, rng.choice([0, 1, 3, 2**31, 2**32 - 1, 127, 129, 320, 100_000])  # UINT32
    if kind == 1:
        return 5, rng.choice([-1, -(2**31), 0, 2**31 - 1])  # INT32
    if kind == 2:
        return 6, rng.choice([float("nan"), float("inf"), -1.0, 0.0, 1e-30, 3.0e38])  # FLOAT32
    if kind == 3:
        return 8, rng.choice(["", "eagle3", "x" * 5000, b"\xff\xfe", "\x1b[31m"])
    if kind == 4:
        return 7, rng.choice([0, 1, 2, -1])  # BOOL (any byte)
    if kind == 5:
        n = rng.choice([0, 1, 2, 3, 4, 64, 65, 1000])
        return 9, (5, [rng.choice([-1, 0, 1, 2, 4, 5, 6, 7, 2**31 - 1]) for _ in range(n)])  # INT32 array
    if kind == 6:
        return 9, (8, ["a", "b", "c"])  # an array of strings
    if kind == 7:
        return 10, rng.choice([0, 2**63, 2**64 - 1, 128])  # UINT64
    return 12, rng.choice([0.5, 128.0, float("nan")])  # FLOAT64


def mutate_gguf(img: GGUFImage, rng: random.Random) -> str:
    """1-3 mutations of header, KV metadata, tensor infos or data, in place; a label naming them."""
    done = []
    for _ in range(rng.randrange(1, 4)):
        op = rng.random()
        t = rng.choice(img.tensors) if img.tensors else None
        if op < 0.06:
            img.version = rng.choice([0, 1, 2, 4, 0x03000000, 2**32 - 1])
            done.append(f"version {img.version}")
        elif op < 0.12:
            which = rng.choice(["n_tensors", "n_kv"])
            n = len(img.tensors) if which == "n_tensors" else len(img.kvs)
            setattr(img, which, rng.choice([n - 1, n + 1, 0, -1, 2**62, 2**40]))
            done.append(f"{which} {getattr(img, which)}")
        elif op < 0.2:
            value = rng.choice([0, 1, 2, 3, 8, 16, 48, 64, 2**31, 4096])
            kind = rng.choice([4, 4, 4, 10, 0, 5])
            img.set("general.alignment", kind, value)
            if rng.random() < 0.7:  # the data section padded as declared (else as before)
                img.align = value
            done.append(f"general.alignment {value} (type {kind})")
        elif op < 0.36:
            key = rng.choice(["eagle3.target_layers", "eagle3.block_count", "eagle3.embedding_length",
                              "eagle3.attention.head_count", "eagle3.attention.head_count_kv", "eagle3.vocab_size",
                              "eagle3.feed_forward_length", "eagle3.attention.layer_norm_rms_epsilon",
                              "eagle3.rope.freq_base", "eagle3.target_hidden_size", "eagle3.norm_before_residual",
                              "eagle3.norm_before_fc", "eagle3.context_length", "eagle3.attention.key_length",
                              "general.architecture"])
            kind, value = hostile_kv(rng)
            img.set(key, kind, value)
            done.append(f"{key} = type {kind}")
        elif op < 0.44 and img.kvs:
            i = rng.randrange(len(img.kvs))
            key, value = img.kvs[i]
            how = rng.randrange(6)
            if how == 0:
                del img.kvs[i]
            elif how == 1:
                img.kvs.append((key, value))  # a duplicate key
            elif how == 2:
                img.kvs[i] = (b"", value)
            elif how == 3:  # another type id over the same value bytes
                img.kvs[i] = (key, struct.pack("<i", rng.choice([-1, 9, 13, 99, 2, 6, 8, 11])) + value[4:])
            elif how == 4 and value[:4] in (struct.pack("<i", 8), struct.pack("<i", 9)):  # a huge length
                at = 4 if value[:4] == struct.pack("<i", 8) else 8
                img.kvs[i] = (key, value[:at] + struct.pack("<Q", rng.choice([2**63, 2**40, 10**9, 1 << 22]))
                              + value[at + 8:])
            else:
                img.kvs[i] = (rng.choice([b"\xff\xfe", b"x" * 300, b"general.architecture"]), value)
            done.append(f"kv {key[:40]!r} op {how}")
        elif op < 0.62 and t is not None:
            how = rng.randrange(7)
            other = rng.choice(img.tensors)
            if how == 0:
                t["offset"] += rng.choice([1, 2, 16, 31, 32, 64, -32, -1])
            elif how == 1:
                t["offset"] = rng.choice([2**64 - 32, 2**64 - 1, 2**63, len(img.data), len(img.data) - 32, 0])
            elif how == 2:
                t["offset"], other["offset"] = other["offset"], t["offset"]
            elif how == 3:  # wrap past 2^64 back into the header
                t["offset"] = 2**64 - rng.choice([32, 64, 4096])
            elif how == 4:  # two tensors on the same bytes
                t["offset"] = other["offset"]
            elif how == 5:
                img.tensors.remove(t)
                img.tensors.insert(rng.randrange(len(img.tensors) + 1), t)  # reordered, offsets kept
            else:  # infos and data consistent, tensors dropped from the end (a smaller, valid layout)
                t["offset"] = t["offset"]
                img.tensors.pop()
            done.append(f"tensor {t['name']!r} offset op {how}")
        elif op < 0.76 and t is not None:
            how = rng.randrange(6)
            dims = t["dims"]
            if how == 0:
                t["dims"] = rng.choice([[], [0], dims + [1], dims + [1, 1, 1], [1] * 5, list(reversed(dims))])
            elif how == 1 and dims:
                dims[rng.randrange(len(dims))] = rng.choice([0, -1, 2, 2**31, 2**40 + 1, 2**62, -(2**63)])
            elif how == 2 and dims:
                dims[rng.randrange(len(dims))] *= 2  # a tensor widened over its neighbour
            elif how == 3:
                t["dims"] = [2**32, 2**32, 2**32, 2**32][: rng.randrange(2, 5)]
            else:
                t["dims"] = [d // 2 for d in dims] or [1]
            done.append(f"tensor {t['name']!r} dims {t['dims']}")
        elif op < 0.86 and t is not None:
            t["type"] = rng.choice([0, 1, 30, 27, 26, 24, 28, 8, 2, 4, 31, 42, 43, 200, -1])
            done.append(f"tensor {t['name']!r} type {t['type']}")
        elif op < 0.92 and t is not None:
            other = rng.choice(img.tensors)
            t["name"] = rng.choice([other["name"], b"t2d", b"x" * 64, b"x" * 63, b"\xff", b"", b"blk.1.attn_q.weight",
                                    b"d2t"])
            done.append(f"tensor renamed {t['name'][:20]!r}")
        elif op < 0.96:
            cut = rng.randrange(len(img.data) + 1)
            img.data = img.data[:cut] if rng.random() < 0.8 else img.data + b"\0" * rng.choice([1, 31, 32, 4096])
            done.append(f"data {len(img.data)} bytes")
        else:
            done.append("bytes")
            img.tail = b"\x00"  # the byte-level mutation is applied to the written file (gguf_case)
    return "; ".join(done)


def gguf_case(img: GGUFImage, rng: random.Random, label: str) -> bytes:
    raw = img.to_bytes()
    if label.endswith("bytes"):
        b = bytearray(raw)
        for _ in range(rng.randrange(1, 6)):
            i = rng.randrange(min(len(b), 4096))
            b[i] = rng.randrange(256)
        raw = bytes(b)
    return raw


# llama.cpp's own loader on one file, in its own process (it may abort): "loaded N_EMBD [ids]" or its refusal
LLAMA_CPP_LOAD = r"""
import ctypes, sys
import llama_cpp
from llama_cpp import llama_cpp as _ll
llama_cpp.llama_backend_init()
params = llama_cpp.llama_model_default_params()
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), params)
if not model:
    print("refused")
    sys.exit(3)
lib = _ll._lib


def symbol(*names):  # the C name first; this build exports the accessors C++-mangled
    for name in names:
        try:
            return getattr(lib, name)
        except AttributeError:
            continue
    raise SystemExit(f"llama.cpp exports none of {names}")


ids = symbol("llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model")
count = symbol("llama_model_target_layer_ids_n", "_Z30llama_model_target_layer_ids_nPK11llama_model")
ids.restype, ids.argtypes = ctypes.POINTER(ctypes.c_int32), [ctypes.c_void_p]
count.restype, count.argtypes = ctypes.c_uint32, [ctypes.c_void_p]
p = ids(model)
print("loaded", llama_cpp.llama_model_n_embd(model), [p[i] for i in range(count(model))])
"""
# what llama.cpp says when it refuses a file's structure or tensor ranges (ggml/src/gguf.cpp, llama-model-loader.cpp),
# as opposed to refusing the model it describes (a shape against the hyperparameters, a missing key)
LLAMA_CPP_RANGE_REFUSALS = ("gguf_init_from_", "not within the file bounds", "cannot mmap", "failed to read",
                            "must be aligned")


def llama_cpp_available() -> str | None:
    """None when llama-cpp-python imports here; else why not (the reason a test skips with)."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return ("llama-cpp-python is not installed in this interpreter (make's test venv installs it from "
                "../shared/wheels when that wheel cache exists)")
    return None


def llama_cpp_load(path: Path, timeout: float = 120) -> tuple[str, str]:
    """(outcome, detail) of llama.cpp loading PATH: loaded | range (refused, or aborted on, the file's structure or
    tensor ranges) | model (refused, or aborted on, the model the file describes: a shape against the
    hyperparameters, a missing key, a layer count its GGML_ASSERTs refuse); detail: the loaded line or its errors."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", LLAMA_CPP_LOAD, str(path)], capture_output=True, text=True,
                         timeout=timeout, errors="replace")
    if out.returncode == 0 and out.stdout.startswith("loaded"):
        return "loaded", out.stdout.strip()
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower() or "failed" in line.lower()
              or any(m in line for m in LLAMA_CPP_RANGE_REFUSALS)]
    detail = " | ".join(errors[-3:]) or out.stderr[-300:]
    if out.returncode not in (0, 3):  # an abort (GGML_ASSERT): a refusal too, of whatever it asserted
        detail = f"aborted ({out.returncode}): {detail}"
    return ("range" if any(m in line for line in errors for m in LLAMA_CPP_RANGE_REFUSALS) else "model"), detail


@dataclass
class GGUFFuzzReport(FuzzReport):
    accepted: list[tuple[str, Path]] = field(default_factory=list)  # (label, kept copy) of sampled cases read
    exit0: int = 0
    read: int = 0  # exit 0 or 1 (findings): the file was read
    llama: dict[str, int] = field(default_factory=dict)  # llama.cpp's outcomes on the sampled cases read
    refused_by_llama: list[str] = field(default_factory=list)  # read here, structure or ranges refused there: bugs
    model_refusals: list[str] = field(default_factory=list)  # read here, the model refused there (reported)


def gguf_seed(work: Path) -> Path:
    """eaglectl's GGUF output of the trained EAGLE-3 fixture (the fuzzers' seed)."""

    out = work / "seed"
    convert_run(str(TRAINED / "eagle3"), str(out), "gguf", target=str(TRAINED_TARGET), measure=False)
    return out / "model.gguf"


def fuzz_gguf(work: Path, *, cases: int, seed: int = 0, llama_sample: int = 0, convert_share: float = 0.1
              ) -> GGUFFuzzReport:
    """`cases` mutated GGUF files through inspect (a share with --scan) and convert (to speculators, streaming the
    tensors); up to `llama_sample` of the cases that exit 0 are then loaded by llama.cpp (where installed), each in
    its own process: a refusal of their structure or tensor ranges (or an abort) is a bug here."""

    rng = random.Random(seed)
    rep = GGUFFuzzReport()
    base = gguf_seed(work).read_bytes()
    kept = work / "accepted"
    kept.mkdir()
    rss0 = _rss_mb()
    t0 = time.perf_counter()
    for i in range(cases):
        img = GGUFImage.parse(base)
        label = mutate_gguf(img, rng)
        case = work / "case" / "model.gguf"
        _clear(case.parent).mkdir()
        case.write_bytes(gguf_case(img, rng, label))
        label = f"#{i} {label}"
        if rng.random() < convert_share:
            dest = work / "converted"
            shutil.rmtree(dest, ignore_errors=True)
            code, _ = _timed(rep, label + " (convert)", lambda: convert_run(str(case), str(dest), "speculators",  # noqa: B023
                                                                            measure=False))
        else:
            def go(scan: bool = rng.random() < 0.3) -> Any:
                result = inspect_checkpoint(str(case), scan=scan)  # noqa: B023 - called at once
                render(result)
                return result

            code, _ = _timed(rep, label, go)
        rep.cases += 1
        rep.codes[code] = rep.codes.get(code, 0) + 1
        if code in (0, 1):  # read (findings or none): its structure and tensor ranges were accepted
            rep.exit0 += code == 0
            rep.read += 1
            # reservoir sampling: the llama.cpp check sees an even sample of all the cases read
            if len(rep.accepted) < llama_sample:
                rep.accepted.append((label, kept / f"{len(rep.accepted)}.gguf"))
                shutil.copyfile(case, rep.accepted[-1][1])
            elif llama_sample and (j := rng.randrange(rep.read)) < llama_sample:
                rep.accepted[j] = (label, rep.accepted[j][1])
                shutil.copyfile(case, rep.accepted[j][1])
    rep.seconds = time.perf_counter() - t0
    rep.rss_growth_mb = _rss_mb() - rss0
    if llama_sample and llama_cpp_available() is None:
        for label, path in rep.accepted:
            outcome, detail = llama_cpp_load(path)
            rep.llama[outcome] = rep.llama.get(outcome, 0) + 1
            if outcome == "range":
                rep.refused_by_llama.append(f"{label}: {detail}")
            elif outcome == "model":
                rep.model_refusals.append(f"{label}: {detail}")
    return rep


# ================================================================================ fourth round (issue 44)
# Drafter families (DFlash, DSpark, P-EAGLE: their configs and weights) and target configs, through inspect (with
# --scan or --target), check --no-card and convert --dry-run. Every case ends in a result or an EaglectlError.

FAMILY_SEEDS = [DRAFTERS.parent / "families" / n for n in ("dflash", "dspark", "peagle")] + [
    TRAINED / "dflash", TRAINED / "peagle"]
# the keys vLLM's DFlash / DSpark code and the EAGLE-3 rules read, where a mutation at the config's root lands
FAMILY_KEYS = ["num_hidden_layers", "hidden_size", "vocab_size", "block_size", "layer_types", "sliding_window",
               "num_target_layers", "markov_rank", "dflash_config", "target_layer_ids", "mask_token_id",
               "draft_vocab_size", "target_hidden_size", "num_key_value_heads", "head_dim", "quantization_config",
               "aux_hidden_state_layer_ids", "speculators_model_type", "architectures", "parallel_drafting"]
TARGET_CONFIG_KEYS = ["num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "rms_norm_eps", "rope_parameters", "rope_theta", "model_type",
               "architectures", "tie_word_embeddings", "text_config", "max_position_embeddings", "dtype"]


def mutate_keys(obj: dict[str, Any], rng: random.Random, n: int, keys: list[str]) -> dict[str, Any]:
    """`n` mutations of a config: half set one of KEYS (at the root, or inside dflash_config /
    transformer_layer_config when the config has one) to a hostile value, half anywhere (mutate_tree)."""
    obj = json.loads(json.dumps(obj))
    for _ in range(n):
        if rng.random() < 0.5:
            obj = mutate_tree(obj, rng, 1)
            continue
        nests = [obj] + [obj[k] for k in ("dflash_config", "transformer_layer_config") if isinstance(obj.get(k), dict)]
        node = rng.choice(nests)
        key = rng.choice(keys)
        if rng.random() < 0.15:
            node.pop(key, None)
        else:
            node[key] = hostile_value(rng)
    return obj


def mutate_weights(path: Path, rng: random.Random) -> str:
    """One edit of a safetensors file's tensors, written back whole: drop one, add a stray layer, change a shape or a
    dtype in the header (the data then disagrees: refused as corrupt), or fill one with NaN."""
    header, data = split_safetensors(path)
    names = [n for n in header if n != "__metadata__"]
    name = rng.choice(names)
    op = rng.randrange(5)
    if op == 0 and len(names) > 1:
        del header[name]
        return f"dropped {name}"
    if op == 1:
        info = dict(header[name])
        header[f"layers.{rng.choice([1, 5, 99, 10**6])}.mlp.up_proj.weight"] = info
        rebuild_header(path, json.dumps(header).encode(), data)
        return f"stray layer beside {name}"
    if op == 2:
        header[name]["shape"] = [rng.choice([0, 1, 3, 2**20])] + list(header[name]["shape"])[1:]
    elif op == 3:
        header[name]["dtype"] = rng.choice(["I64", "I32", "BOOL", "F8_E4M3", "U8", "F64"])
    else:
        begin, end = header[name]["data_offsets"]
        raw = bytearray(data)
        raw[begin:end] = b"\xff" * (end - begin)  # NaN in every float dtype
        data = bytes(raw)
        rebuild_header(path, json.dumps(header).encode(), data)
        return f"NaN in {name}"
    rebuild_header(path, json.dumps(header).encode(), data)
    return f"header of {name} ({'shape' if op == 2 else 'dtype'})"


def render_any(result: Any) -> None:
    """The JSON form and the human view of any command's result, strictly encoded."""
    import io

    from rich.console import Console

    from eaglectl.cli import console
    from eaglectl.cli.views import RENDERERS

    json.dumps(result.to_json(), default=str).encode("utf-8")
    saved = console.stdout
    console.stdout = Console(file=io.StringIO(), width=80, highlight=False, soft_wrap=True)
    try:
        RENDERERS[type(result).__name__](result)
        console.stdout.file.getvalue().encode("utf-8")  # type: ignore[attr-defined]
    finally:
        console.stdout = saved


def _and_render(result: Any, draw: bool) -> Any:
    if draw:  # every fourth case: both output forms too
        render_any(result)
    return result


def check_no_card(source: str, target: str | None = None, measure: bool = True) -> Any:
    from eaglectl.commands import check
    from eaglectl.commands.requests import CheckRequest

    return check.run(CheckRequest(source, target=target, card=False, measure=measure), passthrough)


def run_target(target: str) -> Any:
    """The target loaded and run over 8 tokens of the measurement text at boundaries 0 and 2 (what every measuring
    command does first), its states returned."""
    from eaglectl.measure.target import Target

    t = Target.open(target)
    assert t is not None
    return t.text_states((0, 2), 8)


def fuzz_families(work: Path, *, cases: int, seed: int = 0) -> FuzzReport:
    """`cases` mutated family drafters (config tree, config bytes or weights), each through one of inspect (with
    --scan or --target at random), check --no-card and, for DFlash in its own layout, convert --dry-run."""
    rng = random.Random(seed)
    rep = FuzzReport()
    rss0, t0 = _rss_mb(), time.perf_counter()
    case = work / "case"
    for i in range(cases):
        base = rng.choice(FAMILY_SEEDS)
        shutil.copytree(base, _clear(case))
        label = f"#{i} {base.parent.name}/{base.name}"
        which = rng.random()
        if which < 0.6:
            cfg = json.loads((case / "config.json").read_text())
            (case / "config.json").write_text(json.dumps(mutate_keys(cfg, rng, rng.randrange(1, 4), FAMILY_KEYS)))
            label += " config"
        elif which < 0.7:
            (case / "config.json").write_bytes(mutate_bytes((case / "config.json").read_bytes(), rng))
            label += " config bytes"
        else:
            label += " " + mutate_weights(case / "model.safetensors", rng)
        command = rng.random()
        if command < 0.5:
            target = str(TRAINED_TARGET) if rng.random() < 0.3 else None
            scan = rng.random() < 0.3
            label += " inspect" + (" --target" if target else "") + (" --scan" if scan else "")
            fn = lambda t=target, s=scan: inspect_checkpoint(str(case), target=t, scan=s, measure=False)  # noqa: E731
        elif command < 0.75 or "dflash" not in base.name:
            label += " check --no-card"
            fn = lambda: check_no_card(str(case))  # noqa: E731
        else:
            label += " convert --dry-run"
            fn = lambda: convert_run(str(case), str(work / "out"), "dflash-speculators",  # noqa: E731
                                     base_model="a/b", dry_run=True)
        run_case(rep, label, lambda fn=fn, draw=i % 4 == 0: _and_render(fn(), draw), rendered=False)
    rep.seconds = time.perf_counter() - t0
    rep.rss_growth_mb = _rss_mb() - rss0
    return rep


def fuzz_targets(work: Path, *, cases: int, seed: int = 0) -> FuzzReport:
    """`cases` mutated target configs (the trained target: weights and tokenizer beside them), each through inspect
    --target (unmeasured; measured in one case of ten), a run of the target over a few tokens (load and forward),
    or check --no-card --target (its parity stage runs the target). A measured case costs seconds: they are few."""
    rng = random.Random(seed)
    rep = FuzzReport()
    target = work / "target"
    shutil.copytree(TRAINED_TARGET, target)
    good = json.loads((target / "config.json").read_text())
    run_target(str(target))  # imports and first-run costs, before the clock starts
    rss0, t0 = _rss_mb(), time.perf_counter()
    for i in range(cases):
        label = f"#{i} target config"
        if rng.random() < 0.85:
            mutated = mutate_keys(good, rng, rng.randrange(1, 3), TARGET_CONFIG_KEYS)
            (target / "config.json").write_text(json.dumps(mutated))
        else:
            (target / "config.json").write_bytes(mutate_bytes(json.dumps(good).encode(), rng))
            label += " bytes"
        drafter = str(rng.choice([TRAINED / "eagle3", TRAINED / "dflash", TRAINED / "peagle"]))
        op = rng.random()
        if op < 0.45:
            label += f" inspect {Path(drafter).name} --target"
            fn = lambda d=drafter: inspect_checkpoint(d, target=str(target), measure=False)  # noqa: E731
        elif op < 0.7:
            label += " run"
            fn = lambda: run_target(str(target))  # noqa: E731
        elif op < 0.9:
            label += f" check {Path(drafter).name} --no-card --target"
            fn = lambda d=drafter: check_no_card(d, str(target), measure=False)  # noqa: E731
        else:
            label += f" inspect {Path(drafter).name} --target (measured)"
            fn = lambda d=drafter: inspect_checkpoint(d, target=str(target))  # noqa: E731
        run_case(rep, label, fn, rendered=False)
    rep.seconds = time.perf_counter() - t0
    rep.rss_growth_mb = _rss_mb() - rss0
    return rep
