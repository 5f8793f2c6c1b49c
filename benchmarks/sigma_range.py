"""Sigma-range benchmark: a low-minimum noise range looks better in training and fails from noise.

Per --ranges range, the same stack (the documented block, ModelConfig.documented(), with noisy
targets and the lr of its time, NOISY_TARGETS) trained for the same steps, then scored
on held-out text by the denoising CE (each block at sigmas of its own interval: a diagnostic) and the from-noise CE
(the Euler sampler from fresh noise: the real score). Writes --out (benchmarks/results/sigma_range.json).

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

NOISY_TARGETS = {"trajectory_prob": 0.0, "lr": 1e-3}  # the setup the documented table measured


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
        mcfg = ModelConfig.documented(sigma_lo=lo, sigma_hi=hi)
        total = args.rounds * args.steps_per_round
        tcfg = TrainConfig(seed=args.seed, total_steps=total, warmup_steps=min(50, total // 10), **NOISY_TARGETS)
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
            "model": ModelConfig.documented().to_dict() | {"sigma_lo": None, "sigma_hi": None},
            **options.picked(args, ("rounds", "steps_per_round")),
            "batch_size": TrainConfig.batch_size,
            **NOISY_TARGETS,
        },
        "eval_tokens": int(y.numel()),
        "command": results.command_line("sigma_range.py", argv),
    }
    results.write_json(args.out, result, sort_keys=False)
    return result


if __name__ == "__main__":
    main()
