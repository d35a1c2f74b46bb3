"""Train an MLA EAGLE-3 (3.0: no fc_norm, no norm_output) drafter on the committed MLA fixture target, for judging
`upgrade` on MLA (issue 21). The committed MLA drafter is 3.1-trained: dropping its fc_norm gives a drafter at
chance, which `upgrade` rightly refuses, so the MLA row needs a drafter trained as 3.0. Written under
benchmarks/_work/ (git-ignored), never into fixtures/.

Everything but the two flags and the seeds (weights 21, batches 22) is fixtures/train_mla_fixtures.py's: the same
target, aux boundaries (2, 3, 4), training-time test over 3 steps, layout (TorchSpec's vLLM export of Kimi-K2
drafters).

    flock /tmp/eaglectl-heavy.lock python benchmarks/train_mla30_drafter.py [--steps 600] [--threads 1]

About 8 minutes on one quiet CPU core. `benchmarks/bench_upgrade.py` then uses it for the eagle3.1-mla row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "fixtures"))

import train_mla_fixtures as tm  # noqa: E402

from eaglectl.model.reference import Drafter  # noqa: E402

OUT = ROOT / "benchmarks" / "_work" / "mla-3.0-drafter"
SEED_WEIGHTS, SEED_BATCHES = 21, 22


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    from transformers import DeepseekV3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    train, held, _ = tm.load_data()
    target = DeepseekV3ForCausalLM.from_pretrained(ROOT / "fixtures" / "trained" / "target-mla", dtype=torch.float32)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    torch.manual_seed(SEED_WEIGHTS)
    d = Drafter(dataclasses.replace(tm.drafter_args(), fc_norm=False, norm_output=False), own_embedding=False)
    embed = target.get_input_embeddings().weight.detach()
    opt = torch.optim.AdamW(d.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.0)
    g, log = torch.Generator().manual_seed(SEED_BATCHES), []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = tm.lr_at(step, args.steps, 50, 2e-3, 0.05)
        loss, accs = tm.ttt_loss(d, target, tm.batches(train, g, seq=tm.SEQ), embed)
        tm.optimise(opt, loss, d, step, args.steps, log, "mla-3.0", f" acc {[round(a, 3) for a in accs]}")
    with torch.no_grad():
        _, accs = tm.ttt_loss(d, target, tm.batches(held, torch.Generator().manual_seed(3), n=32, seq=tm.SEQ), embed)
    tm.save_drafter(d, args.out)
    config_path = args.out / "config.json"
    config = json.loads(config_path.read_text())
    config.update(fc_norm=False, norm_output=False)  # the layout's writer assumes 3.1; this drafter is 3.0
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    report = {"steps": args.steps, "seeds": [SEED_WEIGHTS, SEED_BATCHES], "aux_layer_ids": list(tm.AUX),
              "heldout_step_accuracy": [round(a, 4) for a in accs], "seconds": round(time.time() - t0, 1)}
    (args.out / "training_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
