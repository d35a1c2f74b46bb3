"""Writing and re-checking a conversion plan (what `convert.execute` runs). Copied tensors move with
`copy_file_range` while another core hashes the source from the page cache (`SourceDigest`, the provenance
digest, patched into the headers afterwards: same length). The checks compare every copied range with its source
byte for byte and every produced tensor with the CRC-32 taken while writing, re-open, detect and inspect the
output, and ask every runner that serves it how it reads it."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ... import formats, threads
from ...checkpoint.drafter import DrafterCheckpoint, interpret
from ...checkpoint.plan import ConversionPlan, TensorAction, reopen
from ...checkpoint.publish import public_value
from ...checkpoint.target import TargetCheckpoint
from ...engines.asking import readings_for
from ...engines.facts import ENGINE_TITLES
from ...engines.readings import FLAG_NAMES, Readings, layers_read
from ...errors import ConversionError
from ...io import cast as casting
from ...io.checkpoint import Checkpoint
from ...io.safetensors import ByteRange, TensorEntry, Written, crc32_range, same_bytes, sha256_range
from ...rules import Context, run_checks
from ...spec import default_aux_ids
from .plan import count_carriers

if TYPE_CHECKING:
    from ...measure.target import Target


class SourceDigest:
    """sha256 of every source tensor (the provenance digest), computed off the main thread.

    Every local tensor is handed to the workers (one per core the main thread leaves, at most two) as soon as
    this is created, largest first so that they end together, and hashed from the page cache while the main
    thread plans, copies and checks. Tensors without a local byte range (pickled, remote) are hashed
    as the main thread reads them (casts) or at the end.
    """

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self.pool = ThreadPoolExecutor(min(2, max(1, threads.cores() - 1)), thread_name_prefix="eaglectl-sha256")
        local = [(name, r) for name, wf in ckpt.tensor_file.items() if (r := wf.byte_range(name)) is not None]
        self.per_tensor: dict[str, Future[str] | str] = {
            name: self.pool.submit(sha256_range, r) for name, r in sorted(local, key=lambda nr: -nr[1].length)}

    def close(self) -> None:
        """Stop hashing (an error, a dry run): what a worker is hashing now finishes, the rest is dropped."""
        self.pool.shutdown(wait=True, cancel_futures=True)

    def chunks(self, stored: str, chunks: Iterable[bytes]) -> Iterator[bytes]:
        if stored in self.per_tensor:  # hashed by a worker already
            yield from chunks
            return
        h = hashlib.sha256()
        for chunk in chunks:
            h.update(chunk)
            yield chunk
        self.per_tensor[stored] = h.hexdigest()

    def result(self) -> str:
        h = hashlib.sha256()
        try:
            for name in sorted(self.ckpt.tensor_file):
                info = self.ckpt.tensors[name]
                got = self.per_tensor.get(name)
                if got is None:
                    digest = hashlib.sha256()
                    for chunk in raw_chunks(self.ckpt, name):
                        digest.update(chunk)
                    got = digest.hexdigest()
                value = got.result() if isinstance(got, Future) else got
                h.update(f"{name}|{info.dtype}|{list(info.shape)}|{value}\n".encode())
        finally:
            self.close()
        return "sha256:" + h.hexdigest()


def raw_chunks(ckpt: Checkpoint, stored: str, chunk: int = 1 << 24) -> Iterator[bytes]:
    wf = ckpt.tensor_file[stored]
    if wf.pickled is not None:
        import torch

        yield wf.pickled[stored].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return
    assert wf.source is not None
    info = wf.header.tensors[stored]
    start = wf.header.data_start + info.begin
    for off in range(0, info.nbytes, chunk):
        yield wf.source.read(start + off, min(chunk, info.nbytes - off))


def _target_table(target: TargetCheckpoint, canon: str) -> str:
    which = canon.split(".")[0]
    name = target.table_name(which)
    if name is None:
        raise ConversionError(f"{target.source}: the target has no {which} tensor", path=target.source)
    return name


def tensor_entry(a: TensorAction, src: DrafterCheckpoint, target: TargetCheckpoint | None, supplied: dict[str, bytes],
                 digest: SourceDigest) -> TensorEntry:
    """How one destination tensor's bytes are produced, exactly as the plan says."""
    if a.action == "copy":
        assert a.source is not None
        r = src.ckpt.tensor_file[a.source].byte_range(a.source)
        if r is not None:
            return TensorEntry(a.dest, a.dtype, a.shape, copy=r)
        return TensorEntry(a.dest, a.dtype, a.shape, lambda: digest.chunks(a.source, raw_chunks(src.ckpt, a.source)))
    if a.action == "cast":
        assert a.source is not None and a.source_dtype is not None
        src_dtype = a.source_dtype

        def cast_chunks() -> Iterator[bytes]:
            for raw in digest.chunks(a.source, raw_chunks(src.ckpt, a.source)):
                yield casting.cast(raw, src_dtype, a.dtype)  # elementwise; 16 MB chunks hold whole elements

        return TensorEntry(a.dest, a.dtype, a.shape, cast_chunks)
    if a.action == "derive":
        if a.canonical in supplied:
            data = supplied[a.canonical]
            return TensorEntry(a.dest, a.dtype, a.shape, lambda: (data,))
        assert a.canonical == "t2d"

        def t2d() -> Iterator[bytes]:
            d2t = src.view.read("d2t").astype(np.int64)
            mask = np.zeros(a.shape[0], dtype=np.bool_)
            mask[np.arange(len(d2t)) + d2t] = True
            yield mask.tobytes()

        return TensorEntry(a.dest, a.dtype, a.shape, t2d)
    assert a.action == "from-target" and target is not None
    name = _target_table(target, a.canonical)

    def table() -> Iterator[bytes]:
        if a.canonical == "lm_head.weight" and "d2t" in src.view:
            rows = (np.arange(a.shape[0]) + src.view.read("d2t").astype(np.int64)).tolist()  # arange + d2t
            yield casting.encode(target.ckpt.read_rows(name, rows), a.dtype)
        else:
            yield casting.encode(target.ckpt.read(name), a.dtype)

    return TensorEntry(a.dest, a.dtype, a.shape, table)


def public_provenance(plan: ConversionPlan) -> None:
    """What a caller added to the plan's provenance (upgrade's calibration record names its target and
    capture) is made public before it is written: Hub ids and basenames only."""

    prov = plan.config.get("eaglectl_provenance")
    if isinstance(prov, dict):
        plan.config["eaglectl_provenance"] = prov = public_value(prov)
        if "eaglectl" in plan.metadata:
            plan.metadata["eaglectl"] = json.dumps(prov, sort_keys=True)


def patch_header(path: Path, old: bytes, new: bytes) -> None:
    """Replace a same-length placeholder inside a safetensors header (the metadata)."""
    assert len(old) == len(new)
    with path.open("r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = f.read(n)
        at = header.find(old)
        if at < 0:
            return
        f.seek(8 + at)
        f.write(new)


def check_tensors(plan: ConversionPlan, written: list[Written], src: DrafterCheckpoint) -> str:
    """Re-read every written tensor: a copied tensor's bytes equal the source's (compared directly), a
    produced one's equal what was written (the CRC-32 taken while writing).

    The comparisons run on every core in 64 MB pieces (memcmp and crc32 release the GIL): this check comes
    after the copy, when the digest's worker may be done and a core would otherwise wait."""
    ranges = {name: (w, r) for w in written for name, r in w.ranges.items()}
    jobs: list[tuple[str, Callable[[], bool]]] = []
    for a in plan.tensors:
        w, r = ranges[a.dest]
        source = src.ckpt.tensor_file[a.source].byte_range(a.source) if a.action == "copy" and a.source else None
        if a.dest not in w.crc32 and source is not None:
            jobs += [(a.dest, functools.partial(same_bytes, x, y)) for x, y in zip(pieces(source), pieces(r),
                                                                                     strict=True)]
        else:
            jobs.append((a.dest, lambda r=r, want=w.crc32.get(a.dest): crc32_range(r) == want))
    with ThreadPoolExecutor(threads.cores(), thread_name_prefix="eaglectl-check") as pool:
        results = list(pool.map(lambda job: job[1](), jobs))
    for (name, _), ok in zip(jobs, results, strict=True):  # the first difference in the plan's order
        if not ok:
            action = next(a.action for a in plan.tensors if a.dest == name)
            raise ConversionError(f"{plan.dest} (staged): tensor '{name}' does not equal its source ({action})",
                                  tensor=name)
    return f"{len(plan.tensors)} tensors equal their source or documented transform (re-read after writing)"


def pieces(r: ByteRange, size: int = 1 << 26) -> list[ByteRange]:
    """`r` in consecutive pieces of at most `size` bytes (at least one)."""
    return [ByteRange(r.path, r.offset + at, min(size, r.length - at)) for at in range(0, r.length, size)] or [r]


def check_checkpoint(stage: Path, plan: ConversionPlan, written: list[Written], target: TargetCheckpoint | None
                     ) -> tuple[DrafterCheckpoint, list[str]]:
    """The finished output opens, holds exactly the planned tensors where they were written, is detected
    as the planned dialect, and inspect finds no errors in it: (the output, interpreted; what was checked)."""
    where = f"{plan.dest} (staged)"
    d = interpret(reopen(stage, plan, written))
    if d.dialect.name != plan.dest_dialect:
        raise ConversionError(f"{where}: written checkpoint is detected as {d.dialect.name}, not {plan.dest_dialect}")
    errors = [f for f in run_checks(Context(d, target)) if f.severity == "error"]
    if errors:
        raise ConversionError(f"{where}: inspect finds [{errors[0].rule_id}] {errors[0].message}",
                              tensor=errors[0].locator)
    return d, [f"detected as {d.dialect.name}", "inspect finds no errors"]


def check_readings(out: DrafterCheckpoint, plan: ConversionPlan, target: TargetCheckpoint | None) -> list[str]:
    """After writing: every vLLM runner's reading of the WRITTEN config (asked of vLLM's own selection code and
    draft model class where its interpreter is available, else the table: asking.readings_for) captures the
    intended boundaries, applies the intended flags and builds fc for as many aux states as fc.weight holds
    (ConversionError naming the runner, the key and both values otherwise: nothing is left at DEST)."""

    intended = plan.intended
    if intended is None:
        return []
    readings = readings_for(out, target, engines=plan.engines)
    want = tuple(intended["boundary_ids"]) if intended["boundary_ids"] is not None else None
    where = f"{plan.dest} (staged)"
    skipped = []
    for r in readings.runners:
        if r.error:
            skipped.append(f"vLLM {r.runner} refuses the config ({r.error})")
            continue
        if want is not None and r.boundary_ids != want:
            got = r.ids_text()
            raise ConversionError(
                f"{where}: vLLM's {r.runner} runner reads {r.source or 'nothing'} as boundaries {got}, but the "
                f"drafter reads {list(want)} ({intended['basis']}); nothing was written",
                path=plan.dest, runner=r.runner, key=r.source, read=got, intended=list(want), dialect=plan.dest_dialect,
                hint="the destination cannot make this runner read the drafter's layers: pick another --to "
                     "(or --for vllm)")
        count = out.spec.num_aux_hidden_states
        if r.num_aux is not None and count is not None and r.num_aux != count:

            carriers = count_carriers(out, count, target)
            raise ConversionError(
                f"{where}: vLLM's {r.runner} runner builds fc for {r.num_aux} aux states from the {plan.dest_dialect} "
                f"config, but fc.weight holds {count}: its weight loader would fail; nothing was written",
                path=plan.dest, runner=r.runner, dialect=plan.dest_dialect,
                hint=(f"--to {' or --to '.join(carriers)} writes the count where vLLM reads it" if carriers else
                      f"no dialect eaglectl writes makes vLLM build fc for {count}"))
        if r.flags is not None:
            flags = intended["flags"]
            wrong = [f for f in FLAG_NAMES if bool(r.flags.get(f)) != bool(flags.get(f))]
            if wrong:
                applies = ", ".join(f"{f}={str(bool(r.flags.get(f))).lower()}" for f in wrong)
                means = ", ".join(f"{f}={str(bool(flags.get(f))).lower()}" for f in wrong)
                raise ConversionError(
                    f"{where}: vLLM's {r.runner} runner applies {applies}, but the drafter has {means} "
                    f"({intended['basis']}); nothing was written", path=plan.dest, runner=r.runner,
                    dialect=plan.dest_dialect, hint="pick another --to (or --for vllm)")
    other = _read_right_by_others(readings, plan, want, where)
    if len(readings.runners) < 2 and not skipped and not other:
        return []
    read = readings.runners[0].ids_text() if want is None else str(list(want))
    line = (f"vLLM's runners read the written config as the drafter means it ({intended['basis']}): "
            f"{' = '.join(r.runner for r in readings.runners if not r.error)} capture {read}, same flags; "
            f"{readings.basis}")
    return [line] + skipped + other


def _read_right_by_others(readings: Readings, plan: ConversionPlan, want: tuple[int, ...] | None,
                          where: str) -> list[str]:
    """After writing, for each other engine the conversion is for (SGLang): its reading of the WRITTEN files (asked
    of its code where an interpreter is given, else eaglectl's table of it) drafts with them on the drafter's
    layers and flags (ConversionError naming the conflict otherwise: nothing is left at DEST)."""
    assert plan.intended is not None
    lines = []
    for engine in (e for e in plan.engines if e != "vllm"):
        r = readings.engine(engine)
        if r is None:
            continue
        flags, got = plan.intended["flags"], r.flags or {}
        wrong = [f for f in FLAG_NAMES if r.flags is not None and bool(got.get(f)) != bool(flags.get(f))]
        problem = (r.error or r.model_error or
                   (f"captures boundaries {r.ids_text()}, not the drafter's {list(want)}"
                    if want is not None and r.boundary_ids != want else None) or
                   (f"applies {', '.join(f'{f}={str(bool(got.get(f))).lower()}' for f in wrong)}" if wrong else None))
        if problem:
            raise ConversionError(f"{where}: {ENGINE_TITLES.get(engine, engine)} {r.version} reads the written files "
                                  f"otherwise: {problem} ({r.basis}); nothing was written", path=plan.dest,
                                  dialect=plan.dest_dialect, engine=engine)
        lines.append(f"{ENGINE_TITLES.get(engine, engine)} {r.version} drafts with the written files "
                     f"({r.model_class}) on boundaries {r.ids_text()}, same flags; {r.basis}")
    return lines


def distinct_readings(out: DrafterCheckpoint, to: str, target: Target, L: int) -> list[tuple[str, tuple[int, ...]]]:
    """(who reads them, boundaries) for each distinct reading of the written files: vLLM's runners (asked of vLLM
    where it is installed, else its table: asking.readings_for) and, for a dialect another engine serves
    (`Dialect.consumer`), that engine's reading (readings.layers_read)."""

    dialect = formats.get(to)
    found: dict[tuple[int, ...], list[str]] = {}
    for r in readings_for(out, target).runners if dialect.vllm_loads else ():  # vLLM loads no GGUF draft
        ids = r.boundary_ids if r.boundary_ids is not None else default_aux_ids(L, "boundary")
        if not r.error:
            found.setdefault(ids, []).append(f"vLLM {r.runner}")
    if dialect.consumer != "vllm":
        other = layers_read(dialect.consumer, out.ckpt.config, L, declared=out.spec.aux_layer_ids, view=out.config)
        assert other.boundary_ids is not None
        found.setdefault(other.boundary_ids, []).append(f"{dialect.consumer} (since {other.version})")
    return [(" and ".join(who), ids) for ids, who in found.items()]
