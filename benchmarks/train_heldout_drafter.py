"""Train one more EAGLE-3 drafter on the committed fixture target, for judging `upgrade` on a drafter the tests
never saw (issue 21). It is written under benchmarks/_work/ (git-ignored), never into fixtures/.

What differs from the committed drafters (fixtures/train_fixtures.py, whose loss and loop it reuses):
- other aux layers: target boundaries (2, 4, 7), stored SpecForge-style as output-of-layer ids (1, 3, 6) in
  `eagle_config` and, as some published SpecForge exports do, in vLLM's numbering (2, 4, 7) at the top level;
- other seeds (weights 7, batches 12, self-distilled prompts 15) and another data slice: only the training
  files whose index is even (the held-out files, index % 10 == 9, stay out as in every fixture), so
  heldout-code.txt is text this drafter never trained on either.

    flock /tmp/eaglectl-heavy.lock python benchmarks/train_heldout_drafter.py [--steps 400] [--out DIR]

About 5 minutes on 2 CPU cores. Then `benchmarks/bench_upgrade.py --drafter benchmarks/_work/heldout-drafter`
measures every init on it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "fixtures"))

import train_fixtures as tf  # noqa: E402

from eaglectl.model.reference import Drafter  # noqa: E402

BOUNDARIES = (2, 4, 7)
OUTPUT_IDS = tuple(b - 1 for b in BOUNDARIES)  # SpecForge's output-of-layer numbering
SEED_WEIGHTS, SEED_BATCHES, SEED_DISTILL = 7, 12, 15


def even_files_data() -> torch.Tensor:
    files = tf.stdlib_files()
    train: list[int] = []
    for i, f in enumerate(files):
        if i % 10 != 9 and i % 2 == 0:
            train += tf.encode(f.read_bytes())
    return torch.tensor(train)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "_work" / "heldout-drafter")
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(2)
    t0 = time.time()
    train = even_files_data()
    _, held, _ = tf.load_data()
    target = LlamaForCausalLM.from_pretrained(ROOT / "fixtures" / "trained" / "target", dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    distilled = tf.self_distilled(target, train, torch.Generator().manual_seed(SEED_DISTILL), 128)
    ids = tf.draft_vocab(train)
    torch.manual_seed(SEED_WEIGHTS)
    d = Drafter(tf.drafter_args(), own_embedding=False)
    with torch.no_grad():
        d.d2t.copy_(ids - torch.arange(tf.DRAFT_VOCAB))
    embed = target.get_input_embeddings().weight.detach()
    opt = torch.optim.AdamW(d.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(SEED_BATCHES)
    log: list = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = tf.lr_at(step, args.steps, 50, 2e-3, 0.05)
        x = tf.batches(train, g) if step % 2 == 0 else distilled[torch.randint(0, len(distilled), (tf.BATCH,),
                                                                                generator=g)]
        loss, accs = tf.ttt_loss(d, target, x, ids, embed, BOUNDARIES)
        tf.optimise(opt, loss, d, step, args.steps, log, "heldout-drafter", f" acc {[round(a, 3) for a in accs]}")
    with torch.no_grad():
        _, accs = tf.ttt_loss(d, target, tf.batches(held, torch.Generator().manual_seed(3), n=32), ids, embed,
                              BOUNDARIES)
    tf.save_drafter(d, args.out, "specforge", ids, {})
    config_path = args.out / "config.json"
    config = json.loads(config_path.read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(OUTPUT_IDS)
    config["eagle_aux_hidden_state_layer_ids"] = list(BOUNDARIES)  # also top level, in vLLM's numbering
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    report = {"boundaries": list(BOUNDARIES), "output_ids": list(OUTPUT_IDS), "steps": args.steps,
              "seeds": [SEED_WEIGHTS, SEED_BATCHES, SEED_DISTILL], "train_tokens": len(train),
              "heldout_step_accuracy": [round(a, 4) for a in accs], "seconds": round(time.time() - t0, 1), "log": log}
    (args.out / "training_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "log"}, indent=1))


if __name__ == "__main__":
    main()
