"""Sigma-range benchmark: a low-minimum noise range looks better in training and fails from noise.

The litepaper's sigma-range finding at CPU scale, with the documented mechanics (trajectory_prob=0, truncated-
lognormal sigma sampling): per range, the same stack (B=3, L_b=2, d=128, seq 128, batch 32) trained for the same
steps, then scored on the held-out text by the denoising CE (each block given z = e_hat[y] + sigma eps at sigmas of
its own interval, averaged over blocks: a diagnostic) and the from-noise CE (the Euler sampler from fresh noise with
the true context: the real score). Writes benchmarks/results/sigma_range.json; a few minutes on one CPU thread.

    python benchmarks/sigma_range.py --data-dir $BLOCKTRAIN_DATA
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import options, results
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import denoising_ce, from_noise_ce
from swarmd.core.local_run import train_blocktrain


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = options.parser(__doc__, holds="train.txt and eval.txt")
    options.add_outputs(p, "sigma_range.json")
    p.add_argument("--ranges", default="0.1:2,1:10", help="comma-separated lo:hi noise ranges")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps-per-round", type=int, default=50)
    p.add_argument("--eval-tokens", type=int, default=8192)
    options.add_torch(p)
    return options.parse_checked(p, argv, holds="train.txt and eval.txt")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rows, seq_len = [], ModelConfig().seq_len
    corpus = ByteData.from_path(Path(args.data_dir) / "train.txt", seq_len)
    x, y = ByteData.from_path(Path(args.data_dir) / "eval.txt", seq_len).eval_windows(args.eval_tokens)
    for spec in args.ranges.split(","):
        lo, hi = (float(v) for v in spec.split(":"))
        mcfg = ModelConfig(sigma_lo=lo, sigma_hi=hi)
        total = args.rounds * args.steps_per_round
        tcfg = TrainConfig(seed=args.seed, total_steps=total, warmup_steps=min(50, total // 10))
        t0 = time.perf_counter()
        stack = train_blocktrain(mcfg, tcfg, corpus, (x[:1], y[:1]), args.steps_per_round, args.rounds)
        den = [denoising_ce(blk, stack.emb, b, x, y, mcfg) for b, blk in enumerate(stack.blocks)]
        ev = from_noise_ce(stack.blocks, stack.emb, x, y, mcfg)
        row = {"range": [lo, hi], "denoising_ce": sum(den) / len(den), "denoising_ce_per_block": den}
        row |= {"from_noise_ce": ev["ce"], "from_noise_trace": [s["ce"] for s in ev["trace"]]}
        row["sampler_sigmas"] = [s["sigma"] for s in ev["trace"]]
        rows.append(row | {"seconds": round(time.perf_counter() - t0, 1)})
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "ranges": rows,
        "config": {
            "model": ModelConfig().to_dict() | {"sigma_lo": None, "sigma_hi": None},
            **options.picked(args, ("rounds", "steps_per_round")),
            "batch_size": TrainConfig.batch_size,
            "lr": TrainConfig.lr,
        },
        "eval_tokens": int(y.numel()),
        "command": results.command_line("sigma_range.py", argv),
    }
    results.write_json(args.out, result, sort_keys=False)
    return result


if __name__ == "__main__":
    main()
