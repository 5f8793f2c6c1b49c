"""Issue 8 screening: train some or all blocks of a BlockTrain stack at a short budget and measure.

Prints (and appends as JSON lines to --log) the from-noise CE trace after every round, and at the
end the mutual-information proxy of every later block: its CE at its sampler step with the
trajectory z (and predecessor feature) against pure noise sqrt(1 + sigma^2) eps at the same sigma
(and, with pred_input=feature, against a zero feature). --train-blocks 0 trains block 0 alone (the
other blocks stay at their initial weights; trace[0] is block 0's from-noise CE). --eval-offset
scores held-out windows starting that many bytes into eval.txt (0 = the benchmark's eval bytes).

    python benchmarks/issue8_screen.py --data-dir $BLOCKTRAIN_DATA --steps 400 --rounds 2 --context-input own_table
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import eval_noise, from_noise_ce
from swarmd.core.local_run import BlockStack
from swarmd.core.model import denoise, euler_update, sampler_plan


def eval_slice(path: Path, seq_len: int, offset: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = ByteData.from_path(path, seq_len)
    data.data = data.data[offset:]
    return data.eval_windows(tokens)


@torch.no_grad()
def mi_proxy(blocks, emb, x, y, cfg: ModelConfig, seed: int = 1234, batch_size: int = 64) -> list[dict]:
    """Per sampler step: CE with the trajectory inputs vs pure noise at the same sigma (and zero feature)."""
    for b in blocks:
        b.eval()
    table_hat = emb.normalized()
    plan = sampler_plan(cfg)
    noise = eval_noise(cfg, x, seed)
    gen = torch.Generator().manual_seed(seed + 99)
    sums = [{"traj": 0.0, "noise_z": 0.0, "zero_feature": 0.0, "noise_z_zero_feature": 0.0} for _ in plan]
    for lo in range(0, x.shape[0], batch_size):
        xb, yb = x[lo : lo + batch_size], y[lo : lo + batch_size]
        z, feature = noise[lo : lo + batch_size], None
        for i, (b, s, s_next) in enumerate(plan):
            st = torch.full((xb.shape[0],), s)
            pure = (1 + s * s) ** 0.5 * torch.randn(z.shape, generator=gen)

            def ce(zz, ff, block=blocks[b], xb=xb, yb=yb, st=st) -> float:
                logits = denoise(block, table_hat, xb, zz, st, pred=ff)[0]
                return float(F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="sum"))

            logits, new_feature, _ = denoise(blocks[b], table_hat, xb, z, st, pred=feature)
            sums[i]["traj"] += float(F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="sum"))
            sums[i]["noise_z"] += ce(pure, feature)
            if cfg.message_dim:
                sums[i]["zero_feature"] += ce(z, None)
                sums[i]["noise_z_zero_feature"] += ce(pure, None)
            if s_next is not None:
                z = euler_update(z, logits, table_hat, s, s_next)
            feature = new_feature
    n = y.numel()
    out = []
    for i, (b, s, _) in enumerate(plan):
        kept = {k: round(v / n, 4) for k, v in sums[i].items() if cfg.message_dim or k in ("traj", "noise_z")}
        row = {"step": i, "block": b, "sigma": round(s, 4), **kept}
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=Path(common.SHARED_DATA))
    p.add_argument("--name", default="run")
    p.add_argument("--log", type=Path, default=Path("benchmarks/results/issue8_screen.jsonl"))
    p.add_argument("--steps", type=int, default=200, help="steps per round per block")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--train-blocks", default="all", help="all or comma-separated block indices")
    p.add_argument("--eval-tokens", type=int, default=16384)
    p.add_argument("--other-offset", type=int, default=16385, help="second held-out slice: eval.txt bytes from here")
    p.add_argument("--no-mi", action="store_true")
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--layers-per-block", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    common.add_block_options(p, ModelConfig.documented())  # the documented block, trained on trajectories
    common.add_trajectory_options(p, replace(TrainConfig(), freeze_z_in="none", trajectory_prob=1.0))
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    d = a.d_model
    mcfg = ModelConfig(
        blocks=a.blocks,
        layers_per_block=a.layers_per_block,
        d_model=d,
        n_heads=4,
        hidden=4 * d,
        seq_len=128,
        **common.picked(a, common.BLOCK_OPTIONS),
    )
    total = a.steps * a.rounds
    tcfg = TrainConfig(
        batch_size=32,
        lr=a.lr,
        seed=a.seed,
        total_steps=total,
        warmup_steps=min(50, total // 10),
        **common.picked(a, common.TRAJECTORY_OPTIONS),
    )
    corpus = ByteData.from_path(a.data_dir / "train.txt", 128)
    ev = ByteData.from_path(a.data_dir / "eval.txt", 128).eval_windows(a.eval_tokens)
    other = eval_slice(a.data_dir / "eval.txt", 128, a.other_offset, a.eval_tokens)
    stack = BlockStack(mcfg, tcfg, corpus, trajectory_source=a.trajectory_source)
    train_blocks = list(range(a.blocks)) if a.train_blocks == "all" else [int(b) for b in a.train_blocks.split(",")]
    full = stack.trainers
    t0 = time.perf_counter()
    rows = []
    for r in range(1, a.rounds + 1):
        stack.trainers = [full[b] for b in train_blocks]
        streams = stack.streams
        stack.streams = [streams[b] for b in train_blocks]
        train_ce = stack.train_round(a.steps)
        stack.trainers, stack.streams = full, streams
        if a.train_blocks != "all":  # keep every table copy equal to the trained ones' average
            with torch.no_grad():
                for t in full:
                    t.emb.table.copy_(full[train_blocks[0]].emb.table)
        res = from_noise_ce(stack.blocks, stack.emb, *ev, mcfg)
        row = {
            "name": a.name,
            "round": r,
            "steps": r * a.steps,
            "train_ce": round(train_ce, 4),
            "ce": round(res["ce"], 4),
            "trace": [round(s["ce"], 4) for s in res["trace"]],
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    final = {
        "name": a.name,
        "final": True,
        "args": vars(a) | {"data_dir": str(a.data_dir), "log": str(a.log)},
        "rounds": rows,
    }
    oth = from_noise_ce(stack.blocks, stack.emb, *other, mcfg)
    other_trace = [round(s["ce"], 4) for s in oth["trace"]]
    final["other_text"] = {"offset": a.other_offset, "ce": round(oth["ce"], 4), "trace": other_trace}
    if not a.no_mi:
        final["mi_proxy"] = mi_proxy(stack.blocks, stack.emb, *ev, mcfg)
    final["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(final), flush=True)
    with a.log.open("a") as f:
        f.write(json.dumps(final) + "\n")


if __name__ == "__main__":
    main()
