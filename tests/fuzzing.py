"""In-process fuzzing of the inspect path: mutated safetensors headers, configs, indexes and target configs.

Every case must end in a report or one of eaglectl's own errors (an EaglectlError with its exit
code): anything else is an internal error (exit 70). Mutations are seeded and structural (JSON trees
with hostile values: deep nesting, huge or non-finite numbers, wrong types, surrogates, control
characters, giant lists) or byte-level (flips, truncation, insertion of structural characters).
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import struct
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglectl import inspect
from eaglectl.errors import EaglectlError

from .conftest import DRAFTERS, TARGET

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

    from eaglectl import report

    json.dumps(result.to_json(), default=str).encode("utf-8")
    saved = report.stdout
    report.stdout = Console(file=io.StringIO(), width=80, highlight=False, soft_wrap=True)
    try:
        report.render_inspect(result)
        report.stdout.file.getvalue().encode("utf-8")  # type: ignore[attr-defined]
    finally:
        report.stdout = saved


def run_case(rep: FuzzReport, label: str, fn: Any, rendered: bool = True) -> None:
    t = time.perf_counter()
    try:
        result = fn()
        if rendered:
            render(result)
        code = result.exit_code
    except EaglectlError as e:
        code = e.exit_code
    except Exception:  # noqa: BLE001 - exactly what the fuzzer hunts
        rep.internal.append(f"{label}: {traceback.format_exc(limit=3).splitlines()[-1]}")
        code = 70
    dt = time.perf_counter() - t
    rep.cases += 1
    rep.codes[code] = rep.codes.get(code, 0) + 1
    if dt > rep.slowest:
        rep.slowest, rep.slowest_case = dt, label


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
        run_case(rep, label, lambda: inspect.run(str(case), target=str(target) if use_target else None,
                                                 scan=rng.random() < 0.2), rendered=i % render_every == 0)
        if use_target:
            (target / "config.json").write_text(json.dumps(target_cfg))
    rep.seconds = time.perf_counter() - t0
    rep.rss_growth_mb = _rss_mb() - rss0
    return rep
