"""Quality benchmark: BlockTrain versus the end-to-end reference at equal optimiser steps per block.

Trains a BlockTrain stack (B blocks of L_b layers, one block at a time, no gradient crossing
blocks, byte table averaged every round) and the E2E reference (one causal transformer of the
same width and B x L_b layers) on the same training text, with the same batch size, sequence
length, optimiser and as many optimiser steps as each block gets. After every round both are
scored on the held-out text: BlockTrain by from-noise CE (the Euler sampler from a fixed noise
seed, with the CE after every sampler step as `trace`), the E2E model by next-byte CE.

Writes <out>.json (blocktrain_ce, e2e_ce, ratio, config, tokens_per_block, seconds, history,
trace, command) and <out>.png (learning curves). The default run (4 rounds x 100 steps per
block, B=3, L_b=2, d=128, seq 128, batch 32) takes about 15 minutes on one CPU thread; --long
runs 8 rounds x 250 steps. BlockTrain trains with trajectory inputs by default here
(--trajectory-prob 1: each block sees the z the sampler itself holds at its sigma, produced by
the other blocks' round-start snapshots run frozen); --trajectory-prob 0 gives the documented
noisy-target mechanics. The other training-variant flags (--sigma-sampling, ...) are the knobs
screened in benchmarks/results/ISSUE2.md; --only blocktrain skips the E2E run.

    python benchmarks/quality.py --data-dir $BLOCKTRAIN_DATA --out benchmarks/results/quality
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.local_run import RoundReport, train_blocktrain, train_e2e


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--data-dir",
        type=Path,
        default=os.environ.get("BLOCKTRAIN_DATA"),
        help="folder with train.txt and eval.txt (default $BLOCKTRAIN_DATA)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results/quality"),
        help="output path without extension (.json and .png are written)",
    )
    p.add_argument("--long", action="store_true", help="8 rounds x 250 steps per block instead of 4 x 100")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--steps-per-round", type=int, default=None)
    p.add_argument("--eval-tokens", type=int, default=16384)
    p.add_argument("--eval-steps", type=int, default=None, help="sampler steps at eval (default one per block)")
    p.add_argument("--only", choices=("both", "blocktrain", "e2e"), default="both")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    # model
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--layers-per-block", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--sigma-lo", type=float, default=ModelConfig.sigma_lo)
    p.add_argument("--sigma-hi", type=float, default=ModelConfig.sigma_hi)
    p.add_argument("--noise-feature-scale", type=float, default=ModelConfig.noise_feature_scale)
    p.add_argument("--logit-scale", type=float, default=ModelConfig.logit_scale)
    # training
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--trajectory-prob",
        type=float,
        default=1.0,
        help="1 (default here): train every block on the sampler's own trajectory; 0: the documented noisy targets",
    )
    p.add_argument("--trajectory-steps", type=int, default=TrainConfig.trajectory_steps)
    p.add_argument("--trajectory-source", choices=("snapshot", "live"), default="snapshot")
    p.add_argument(
        "--sigma-sampling", choices=("lognormal", "loguniform", "sampler"), default=TrainConfig.sigma_sampling
    )
    p.add_argument("--sigma-jitter", type=float, default=TrainConfig.sigma_jitter)
    p.add_argument("--table-lr-scale", type=float, default=TrainConfig.table_lr_scale)
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (8 if args.long else 4)
    args.steps_per_round = args.steps_per_round or (250 if args.long else 100)
    if args.data_dir is None or not (Path(args.data_dir) / "train.txt").is_file():
        p.error(f"--data-dir must hold train.txt and eval.txt (got {args.data_dir}); set BLOCKTRAIN_DATA")
    return args


def configs(args: argparse.Namespace) -> tuple[ModelConfig, TrainConfig]:
    mcfg = ModelConfig(
        blocks=args.blocks,
        layers_per_block=args.layers_per_block,
        d_model=args.d_model,
        n_heads=args.n_heads,
        hidden=4 * args.d_model,
        seq_len=args.seq_len,
        sigma_lo=args.sigma_lo,
        sigma_hi=args.sigma_hi,
        noise_feature_scale=args.noise_feature_scale,
        logit_scale=args.logit_scale,
    )
    total = args.steps_per_round * args.rounds
    tcfg = TrainConfig(
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        total_steps=total,
        warmup_steps=min(50, total // 10),
        trajectory_prob=args.trajectory_prob,
        trajectory_steps=args.trajectory_steps,
        sigma_sampling=args.sigma_sampling,
        sigma_jitter=args.sigma_jitter,
        table_lr_scale=args.table_lr_scale,
    )
    return mcfg, tcfg


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    bt, e2e = result["history"].get("blocktrain", []), result["history"].get("e2e", [])
    if bt:
        toks = [r["tokens_per_block"] / 1e6 for r in bt]
        ax.plot(toks, [r["eval_ce"] for r in bt], "o-", label="BlockTrain from-noise CE (final step)")
        ax.plot(toks, [r["trace"][0] for r in bt], "s--", alpha=0.6, label="block 0 alone (sampler step 0)")
    if e2e:
        ax.plot([r["tokens_per_block"] / 1e6 for r in e2e], [r["eval_ce"] for r in e2e], "^-", label="E2E reference CE")
    ax.set_xlabel("training tokens per block (millions)")
    ax.set_ylabel("held-out CE (nats/byte)")
    c = result["config"]["model"]
    ax.set_title(
        f"B={c['blocks']} L_b={c['layers_per_block']} d={c['d_model']} seq={c['seq_len']}: "
        f"ratio {result.get('ratio') or float('nan'):.3f}"
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    mcfg, tcfg = configs(args)
    corpus = ByteData.from_path(Path(args.data_dir) / "train.txt", mcfg.seq_len)
    eval_xy = ByteData.from_path(Path(args.data_dir) / "eval.txt", mcfg.seq_len).eval_windows(args.eval_tokens)
    history: dict[str, list] = {}
    seconds: dict[str, float] = {}

    def recorder(kind: str):
        def on_round(r: RoundReport) -> None:
            row = {
                "round": r.round,
                "steps_per_block": r.steps_per_block,
                "tokens_per_block": r.tokens_per_block,
                "train_ce": r.train_ce,
                "eval_ce": r.eval["ce"],
                "seconds": round(r.seconds, 1),
            }
            if "trace" in r.eval:
                row["trace"] = [round(s["ce"], 4) for s in r.eval["trace"]]
            history.setdefault(kind, []).append(row)
            print(
                f"[{kind}] round {r.round}: train ce {r.train_ce:.3f} eval ce {r.eval['ce']:.4f} "
                f"{row.get('trace', '')} ({r.seconds:.0f}s)",
                flush=True,
            )

        return on_round

    if args.only in ("both", "blocktrain"):
        t0 = time.perf_counter()
        train_blocktrain(
            mcfg,
            tcfg,
            corpus,
            eval_xy,
            args.steps_per_round,
            args.rounds,
            on_round=recorder("blocktrain"),
            eval_steps=args.eval_steps,
            trajectory_source=args.trajectory_source,
        )
        seconds["blocktrain"] = round(time.perf_counter() - t0, 1)
    if args.only in ("both", "e2e"):
        t0 = time.perf_counter()
        train_e2e(mcfg, tcfg, corpus, eval_xy, args.steps_per_round, args.rounds, on_round=recorder("e2e"))
        seconds["e2e"] = round(time.perf_counter() - t0, 1)
    bt_ce = history["blocktrain"][-1]["eval_ce"] if "blocktrain" in history else None
    e2e = history["e2e"][-1]["eval_ce"] if "e2e" in history else None
    result = {
        "blocktrain_ce": bt_ce,
        "e2e_ce": e2e,
        "ratio": bt_ce / e2e if bt_ce is not None and e2e is not None else None,
        "block0_alone_ce": history["blocktrain"][-1]["trace"][0] if "blocktrain" in history else None,
        "trace": history["blocktrain"][-1]["trace"] if "blocktrain" in history else None,
        "config": {
            "model": mcfg.to_dict(),
            "train": tcfg.to_dict(),
            "rounds": args.rounds,
            "steps_per_round": args.steps_per_round,
            "eval_steps": args.eval_steps,
            "trajectory_source": args.trajectory_source,
            "threads": args.threads,
        },
        "steps_per_block": args.rounds * args.steps_per_round,
        "tokens_per_block": args.rounds * args.steps_per_round * tcfg.batch_size * mcfg.seq_len,
        "eval_tokens": int(eval_xy[1].numel()),
        "seconds": {**seconds, "total": round(sum(seconds.values()), 1)},
        "history": history,
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "torch": torch.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    if not args.no_plot:
        plot(result, args.out.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in ("blocktrain_ce", "e2e_ce", "ratio", "trace", "seconds")}))
    return result


if __name__ == "__main__":
    main()
