"""Benchmark: `eaglectl capture` by engine on the fixture target, and the memory of `--states` statistics.

1. Capture: tokens/s and peak RSS of `eaglectl capture --engine hf` and `--engine vllm` (16 windows of 256
   tokens, all 9 boundaries). Baselines, measured in the same run, are the same prefill with nothing
   extracted: for hf a plain forward pass of the same prompts in one process, for vllm the same engine
   (same worker, same flags) without the extraction method, connector or prompt logprobs; the vLLM
   ratio compares the `generate` phases (engine start-up is reported apart). eaglectl's peak RSS is
   its own process (vLLM runs in its own processes, whose memory is vLLM's).
2. `--states` statistics (calibration.py): peak RSS and tokens/s of the streamed float64 moments over a
   synthetic bf16 dump of 8 and of 32 requests x 4096 tokens x 3 layers x 1024 wide (fc 1024 x 3072). Flat memory means
   the two peaks are equal. The work is compute-bound (4·D² flops a token), so the speed baseline is
   its arithmetic floor: the same float64 matrix products on one block, timed in the same process.

    python benchmarks/bench_capture.py [--work DIR] [--keep]     (EAGLECTL_VLLM_PYTHON for part 1's vllm row)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import measure, scratch, work_args  # noqa: E402

TARGET = ROOT / "fixtures" / "trained" / "target"
CAPTURE = "from eaglectl.cli.app import main\nsys.argv = ['eaglectl', 'capture', *sys.argv[1:]]\nmain()\n"
PLAIN_HF = """
import time, torch
from eaglectl import capture
from eaglectl.model.hf import load_model
from eaglectl.checkpoint.target import open_target
prompts, _ = capture.prompt_set(open_target(sys.argv[1]), 'builtin:calibration', 16, 256, 0)
model = load_model(sys.argv[1])
t = time.perf_counter()
with torch.no_grad():
    for p in prompts:
        model.model(torch.tensor([p]))
print(json.dumps({'seconds': time.perf_counter() - t, 'tokens': sum(map(len, prompts))}))
"""
STATS = """
import time
import numpy as np
from eaglectl import calibration
from eaglectl.io.states import open_states
st = open_states(sys.argv[1])
W = np.random.default_rng(0).normal(size=(1024, 3072))  # the drafter's fc: hidden 1024 from 3 x 1024
t = time.perf_counter()
m = calibration.accumulate(W, 3, 1024, 1e-6, (r.hidden.reshape(r.hidden.shape[0], -1) for r in st.requests()))
took = time.perf_counter() - t
# the arithmetic floor of the same work: the three float64 products of one 4096-token block, timed here
c = np.random.default_rng(1).normal(size=(4096, 3072))
t = time.perf_counter()
c.T @ c, c.T @ c, c @ W.T
block = time.perf_counter() - t
print(json.dumps({'seconds': took, 'tokens': m.tokens, 'floor': block * m.tokens / 4096}))
"""


def capture_rows(work: Path) -> list[tuple[str, float, float, float, str]]:
    py = sys.executable
    rows = []
    wall, rss, _ = measure(py, CAPTURE, str(TARGET), "--out", str(work / "hf"), "--force", "--json")
    doc = json.loads((work / "hf" / "capture.json").read_text())
    _, _, out = measure(py, "import json\n" + PLAIN_HF, str(TARGET))
    plain = json.loads(out)
    loop = doc["timings_s"]["capture"]
    rows.append(("hf", doc["tokens"] / loop, rss, loop / plain["seconds"],
                 f"capture loop {loop:.2f} s vs a plain forward of the same prompts {plain['seconds']:.2f} s; "
                 f"whole command {wall:.1f} s"))
    vpy = os.environ.get("EAGLECTL_VLLM_PYTHON")
    if vpy:
        from eaglectl.checkpoint.target import open_target
        from eaglectl.commands import capture
        from eaglectl.commands.smoke.command import WorkerRun

        wall, rss, _ = measure(py, CAPTURE, str(TARGET), "--out", str(work / "vllm"), "--force", "--engine",
                                    "vllm", "--vllm-python", vpy, "--json")
        doc = json.loads((work / "vllm" / "capture.json").read_text())
        timings = doc["timings_s"]
        prompts, _ = capture.prompt_set(open_target(str(TARGET)), "builtin:calibration", 16, 256, 0)
        res, _ = WorkerRun(vpy, {"target": str(TARGET), "dtype": "float32", "layer_ids": list(range(9)),
                                 "prompts": prompts, "out_dir": str(work / "plain"), "max_model_len": 264,
                                 "plain": True}, 1800, worker=capture.WORKER).result()
        gen, base = timings["generate"] + timings["collect"], res["timings_s"]["generate"]
        rows.append(("vllm", doc["tokens"] / gen, rss, gen / base,
                     f"generate+collect {gen:.2f} s vs plain generate {base:.2f} s; engine start "
                     f"{timings['engine_init']:.1f} s; whole command {wall:.1f} s"))
    return rows


def synthetic_dump(folder: Path, requests: int) -> None:
    import numpy as np

    from eaglectl.io.safetensors import entry_from_bytes, write_safetensors

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    hidden = (rng.normal(size=(4096, 3, 1024)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    tokens = np.arange(4096, dtype=np.int64).tobytes()
    for i in range(requests):  # the same bytes each time: what is measured is streaming, not the values
        write_safetensors(folder / f"{i:05d}.safetensors", [
            entry_from_bytes("hidden_states", "BF16", (4096, 3, 1024), hidden),
            entry_from_bytes("token_ids", "I64", (4096,), tokens)])
    (folder / "capture.json").write_text(json.dumps({"schema": "eaglectl.capture/1", "layer_ids": [2, 4, 5],
                                                      "convention": "boundary", "target": "synthetic",
                                                      "target_config": {"num_hidden_layers": 8, "hidden_size": 1024}}))


def stats_rows(work: Path) -> list[tuple[int, float, float, float]]:
    rows = []
    for n in (8, 32):
        folder = work / f"dump-{n}"
        synthetic_dump(folder, n)
        _, rss, out = measure(sys.executable, "import json\n" + STATS, str(folder))
        doc = json.loads(out)
        rows.append((doc["tokens"], rss, doc["tokens"] / doc["seconds"], doc["seconds"] / doc["floor"]))
        shutil.rmtree(folder)
    return rows


def main() -> None:
    args = work_args(__doc__.splitlines()[0])
    with scratch(args.work / "capture", args.keep, fresh=True) as work:
        work.mkdir(parents=True)
        print("capture on the fixture target (16 x 256 tokens, 9 boundaries)")
        print(f"{'engine':8} {'tokens/s':>10} {'peak RSS':>10} {'x baseline':>11}  baseline")
        for engine, tps, rss, ratio, note in capture_rows(work):
            print(f"{engine:8} {tps:10.0f} {rss:8.0f} MB {ratio:10.2f}x  {note}")
        print("\n--states statistics (3 x 1024 wide, float64 moments) over a synthetic bf16 dump")
        print(f"{'tokens':>8} {'peak RSS':>10} {'tokens/s':>10} {'x GEMM floor':>13}")
        rows = stats_rows(work)
        for tokens, rss, tps, ratio in rows:
            print(f"{tokens:8d} {rss:8.0f} MB {tps:10.0f} {ratio:12.2f}x")
        print(f"memory ratio 32 vs 8 requests: {rows[1][1] / rows[0][1]:.2f} (flat = 1.00)")


if __name__ == "__main__":
    main()
