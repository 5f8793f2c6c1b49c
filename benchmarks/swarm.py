"""Swarm quality and communication: 6 daemons (B=3 x 2 replicas) versus the single-process run.

For each codec (--codecs, default fp32 bf16 int8) it runs a LocalSwarm of --peers daemon
processes on loopback (block i mod B, joined through peer 0's DHT multiaddr, --rounds rounds of
--steps local steps), assembles the model from the peers' checkpoints (replicas of a block are
bit-identical after a merge) and measures its from-noise CE on held-out text. The reference is
swarmd.core.local_run.train_blocktrain with the same config, the same TrainConfig and the same per-block
steps (rounds x steps), one replica per block. Reports swarm_ce, single_ce, ratio, participation,
wire and raw bytes, wire bytes per round per peer relative to the raw fp32 delta size, and the
replicas' pre-merge distance per round (post-merge they are identical).

Writes --out (JSON) and --md (markdown fragment with table and command).

    python benchmarks/swarm.py --data-dir /work/shared/data/wikitext-2
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import from_noise_ce
from swarmd.core.local_run import train_blocktrain
from swarmd.core.model import ByteEmbedding, DenoisingBlock, count_params
from swarmd.swarm.peer_config import peer_train_config


def parse_args(argv=None):
    p = common.parser(__doc__)
    p.add_argument("--peers", type=int, default=6)
    common.add_swarm_config(p)
    p.add_argument("--layers-per-block", type=int, default=1)
    p.add_argument("--codecs", nargs="+", default=["fp32", "bf16", "int8"])
    p.add_argument(
        "--trajectory-prob",
        type=float,
        default=None,
        help="train on the sampler's own trajectory (swarm and single-process alike; default: the config's)",
    )
    p.add_argument(
        "--documented",
        action="store_true",
        help="the documented DiffusionBlocks block and noisy targets (ModelConfig.documented(), trajectory 0, "
        "block 0's noise path trained) instead of the default block",
    )
    common.add_outputs(p, "swarm")
    a = p.parse_args(argv)
    if a.trajectory_prob is None:
        a.trajectory_prob = 0.0 if a.documented else TrainConfig.trajectory_prob
    a.freeze_z_in = "none" if a.documented else TrainConfig.freeze_z_in
    return a


def model_config(a) -> ModelConfig:
    return (ModelConfig.documented if a.documented else ModelConfig)(
        blocks=a.blocks,
        layers_per_block=a.layers_per_block,
        d_model=a.d_model,
        n_heads=4,
        hidden=4 * a.d_model,
        seq_len=a.seq_len,
    )


def train_config(a) -> TrainConfig:
    # exactly what `blocktrain run` and LocalSwarm build
    return peer_train_config(
        a.steps, batch_size=a.batch_size, lr=a.lr, seed=0, trajectory_prob=a.trajectory_prob, freeze_z_in=a.freeze_z_in
    )


def run_swarm(a, cfg: ModelConfig, codec: str, train_path: Path, eval_xy) -> dict:
    with common.temporary_swarm(
        f"swarm-bench-{codec}-",
        a.peers,
        cfg,
        train_path,
        rounds=a.rounds,
        steps_per_round=a.steps,
        codec=codec,
        batch_size=a.batch_size,
        lr=a.lr,
        seed=0,
        trajectory_prob=a.trajectory_prob,
        freeze_z_in=a.freeze_z_in,
    ) as swarm:
        start = time.monotonic()
        try:
            swarm.start(timeout_s=300)
            finished = swarm.wait(timeout_s=1800)
        finally:
            swarm.stop()
        wall = time.monotonic() - start
        if not finished or any(p.proc.returncode != 0 for p in swarm.peers):
            raise SystemExit(
                f"swarm run with {codec} failed: {[swarm.tail(p) for p in swarm.peers if p.proc.returncode != 0]}"
            )
        blocks, emb = swarm.assemble()
        ce = from_noise_ce(blocks, emb, *eval_xy, cfg)["ce"]
        sums = swarm.summaries()
    rounds = [h for s in sums for h in s.get("history", [])]
    per_round = {}
    for h in rounds:
        per_round.setdefault(h["round"], []).append(h)
    wire, raw = sum(s["bytes_sent"] for s in sums), sum(s["raw_bytes_sent"] for s in sums)
    return {
        "codec": codec,
        "swarm_ce": ce,
        "participation": sum(s["participation"] for s in sums) / len(sums),
        "wire_bytes": wire,
        "raw_bytes": raw,
        "wire_over_raw": wire / raw if raw else float("nan"),
        "wire_bytes_per_round_per_peer": wire / a.rounds / a.peers,
        "rounds": min(s["round"] for s in sums),
        "rejected": sum(s.get("rejected", 0) for s in sums),
        "wall_s": wall,
        "premerge_distance_by_round": {
            int(r): max(h["premerge_distance"] for h in hs) for r, hs in sorted(per_round.items())
        },
        "round_seconds_median": sorted(h["seconds"] for h in rounds)[len(rounds) // 2] if rounds else None,
    }


def main(argv=None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(1)
    cfg = model_config(a)
    tcfg = train_config(a)
    train_path, eval_path = a.data_dir / "train.txt", a.data_dir / "eval.txt"
    data = ByteData.from_path(train_path, cfg.seq_len)
    eval_xy = ByteData.from_path(eval_path, cfg.seq_len).eval_windows(a.eval_tokens)
    block_params = count_params(DenoisingBlock(cfg))
    emb_params = count_params(ByteEmbedding(cfg))

    start = time.monotonic()
    stack = train_blocktrain(cfg, tcfg, data, eval_xy, a.steps, a.rounds)
    single_ce = from_noise_ce(stack.blocks, stack.emb, *eval_xy, cfg)["ce"]
    single_s = time.monotonic() - start
    print(f"single-process: ce {single_ce:.4f} in {single_s:.0f}s", flush=True)

    results = {}
    for codec in a.codecs:
        r = run_swarm(a, cfg, codec, train_path, eval_xy)
        r["ratio"] = r["swarm_ce"] / single_ce
        results[codec] = r
        print(
            f"{codec}: swarm ce {r['swarm_ce']:.4f} ratio {r['ratio']:.4f} participation {r['participation']:.3f} "
            f"wire/raw {r['wire_over_raw']:.3f} in {r['wall_s']:.0f}s",
            flush=True,
        )

    main_codec = "int8" if "int8" in results else a.codecs[0]
    out = {
        "command": common.command_line("swarm.py", argv),
        "config": cfg.to_dict(),
        "train": tcfg.to_dict(),
        "peers": a.peers,
        "rounds": a.rounds,
        "steps_per_round": a.steps,
        "per_block_steps": a.rounds * a.steps,
        "block_params": block_params,
        "embedding_params": emb_params,
        "single_ce": single_ce,
        "single_s": single_s,
        "codec": main_codec,
        "swarm_ce": results[main_codec]["swarm_ce"],
        "ratio": results[main_codec]["ratio"],
        "participation": results[main_codec]["participation"],
        "wire_bytes": results[main_codec]["wire_bytes"],
        "raw_bytes": results[main_codec]["raw_bytes"],
        "codecs": results,
        "machine": f"{common.machine()}, torch {torch.__version__}",
    }
    if "fp32" in results and "int8" in results:
        out["int8_ce_loss_vs_fp32"] = results["int8"]["swarm_ce"] - results["fp32"]["swarm_ce"]
    common.write_json(a.out, out)
    write_md(a, out)
    print(
        json.dumps(
            {k: out[k] for k in ("single_ce", "swarm_ce", "ratio", "participation", "wire_bytes", "raw_bytes")},
            indent=2,
        )
    )


TRAJECTORY_NOTE = (
    "With trajectory training every block-b peer also pulls blocks 0..b-1 (fp32 state, `PullState`) "
    "at the start of every round and runs them frozen, forward only; those pulls are counted in the wire bytes above, "
    "which is why wire / raw is higher than for the block deltas alone."
)


def write_md(a, out: dict) -> None:
    cfg = out["config"]
    lines = [
        "### Swarm quality and communication (6 daemons, B=3 x 2 replicas, loopback), "
        + ("the documented block" if a.documented else "the default block (issue 8)")
        + (f", trajectory training (p={a.trajectory_prob})" if a.trajectory_prob else ", noisy targets"),
        "",
        f"Command: `{out['command']}`",
        "",
        f"Config: B={cfg['blocks']}, L_b={cfg['layers_per_block']}, d={cfg['d_model']}, seq={cfg['seq_len']}, "
        f"batch {out['train']['batch_size']}, lr {out['train']['lr']}, "
        f"{out['rounds']} rounds x H={out['steps_per_round']} local steps = {out['per_block_steps']} steps per block "
        f"(same in the single-process run, one replica per block). "
        f"Block {out['block_params']:,} params + byte table {out['embedding_params']:,} params. "
        f"Eval: from-noise CE on eval.txt ({a.eval_tokens} bytes). Machine: {out['machine']} (shared).",
        "",
        f"Single-process BlockTrain (swarmd.core.local_run.train_blocktrain): CE **{out['single_ce']:.4f}** nats/byte.",
        "",
        "| codec | swarm CE | ratio swarm/single | participation | wire bytes | raw fp32 bytes | wire / raw "
        "| wire bytes per round per peer | median round s | rejected |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, r in out["codecs"].items():
        lines.append(
            f"| {c} | {r['swarm_ce']:.4f} | {r['ratio']:.4f} | {r['participation']:.3f} | {r['wire_bytes']:,} "
            f"| {r['raw_bytes']:,} | {r['wire_over_raw']:.3f} | {r['wire_bytes_per_round_per_peer']:,.0f} "
            f"| {r['round_seconds_median'] or 0:.2f} | {r['rejected']} |"
        )
    if "int8_ce_loss_vs_fp32" in out:
        lines += [
            "",
            f"int8 + error feedback + zstd vs fp32: {out['codecs']['int8']['wire_over_raw']:.3f}x the raw fp32 bytes, "
            f"CE difference {out['int8_ce_loss_vs_fp32']:+.4f} nats.",
        ]
    first = next(iter(out["codecs"].values()))
    dist = first["premerge_distance_by_round"]
    lines += [
        "",
        f"Consensus ({first['codec']}): max relative distance between same-block replicas just before each merge "
        "(local drift during H steps): "
        + ", ".join(f"r{r}: {d:.2e}" for r, d in dist.items())
        + "; after every merge the replicas are bit-identical (distance 0, equal base hashes), "
        "which the status sketch confirms.",
        "",
        "Notes: wire bytes are everything a peer sent on gossip streams and state pulls "
        "(payload + header, after zstd); raw bytes are the fp32 size of the same tensors. "
        "The swarm trains each block on two data streams per round (two replicas) and averages them, "
        "so per block it sees twice the samples of the single-process run at the same step count.",
        "",
    ]
    if a.trajectory_prob:
        lines += [TRAJECTORY_NOTE, ""]
    common.replace_section(a.md, "swarm.py" + (" documented" if a.documented else ""), lines)


if __name__ == "__main__":
    main()
