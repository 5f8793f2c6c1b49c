"""Swarm quality and communication: daemons (B=3 x 2 replicas) against the single-process run, and replica efficiency.

Codecs: per codec in --codecs a LocalSwarm of --peers daemons; its assembled model's CE against train_blocktrain at
the same per-block steps, participation, wire / raw bytes, the replicas' pre-merge distance. Replicas: B x K daemons
per K in --replicas and outer in --outers against single-replica swarms at --single-mults x the rounds; --sync-lrs adds
sync data parallel (B daemons at K x the batch). --only runs one part. Writes --out and BENCHMARKS.md's sections.

    python benchmarks/swarm.py --data-dir /work/shared/data/wikitext-2 --only replicas --replicas 1 2 4
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import daemons, options, results, sweeps
from benchmarks.replica_sim import steps_to_reach, sync_dp_summary
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import from_noise_ce
from swarmd.core.local_run import train_blocktrain
from swarmd.core.model import ByteEmbedding, DenoisingBlock, count_params
from swarmd.node.config import peer_train_config

SUMMARY = ("participation", "wall_s", "round_seconds_median", "wire_bytes_per_round_per_peer", "rejected")
HEADLINE = ("swarm_ce", "ratio", "participation", "wire_bytes", "raw_bytes")  # of the main codec, at the top level
DOCUMENTED_HELP = "the documented block and noisy targets (ModelConfig.documented(), trajectory 0, z_in trained)"
KEEP_HELP = "reuse the single-replica runs and other rows in --out (same schedule); a repeated row is replaced"
SYNC_HELP = "per K > 1, sync data parallel (B daemons at K x the batch) at these multiples of --lr; best reported"


def parse_args(argv=None):
    p = options.parser(__doc__)
    p.add_argument("--peers", type=int, default=6)
    options.add_swarm_config(p, layers_per_block=1)
    p.add_argument("--codecs", nargs="+", default=["fp32", "bf16", "int8"])
    p.add_argument("--trajectory-prob", type=float, default=None, help="default: the config's (0 if --documented)")
    p.add_argument("--documented", action="store_true", help=DOCUMENTED_HELP)
    options.add_outputs(p, "swarm.json", results.BENCHMARKS)
    p.add_argument("--only", choices=["codecs", "replicas"], help="run one part, keep the other's results")
    p.add_argument("--replicas", type=int, nargs="*", default=[1, 2, 4], help="K: replicas per block")
    p.add_argument("--outers", nargs="+", default=["none", "nesterov"], choices=["none", "nesterov"])
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--single-mults", type=int, nargs="*", default=[1, 2, 4], help="single-replica runs: x rounds")
    p.add_argument("--keep", action="store_true", help=KEEP_HELP)
    p.add_argument("--sync-lrs", type=float, nargs="*", default=[], help=SYNC_HELP)
    p.add_argument("--replica-md", type=Path, default=results.BENCHMARKS)
    a = p.parse_args(argv)
    if a.trajectory_prob is None:
        a.trajectory_prob = 0.0 if a.documented else TrainConfig.trajectory_prob
    a.freeze_z_in = "none" if a.documented else TrainConfig.freeze_z_in
    return a


def train_config(a) -> TrainConfig:
    """Exactly what `blocktrain run` and LocalSwarm build."""
    schedule = dict(trajectory_prob=a.trajectory_prob, freeze_z_in=a.freeze_z_in)
    return peer_train_config(a.steps, batch_size=a.batch_size, lr=a.lr, seed=0, **schedule)


def machine() -> str:
    return f"{results.machine()}, torch {torch.__version__}"


def run_swarm(a, cfg: ModelConfig, codec: str, train_path: Path, eval_xy, peers=None, rounds=None, **kw) -> dict:
    """One LocalSwarm run (a.peers daemons, a.rounds rounds unless given; kw: more LocalSwarm options, e.g. outer,
    or batch_size / lr in place of a's)."""
    peers, rounds = peers or a.peers, rounds or a.rounds
    run = dict(rounds=rounds, steps_per_round=a.steps, codec=codec, seed=0, trajectory_prob=a.trajectory_prob)
    run |= {"freeze_z_in": a.freeze_z_in, "batch_size": a.batch_size, "lr": a.lr} | kw
    with daemons.temporary_swarm(f"swarm-bench-{codec}-", peers, cfg, train_path, **run) as swarm:
        wall = sweeps.run_to_end(swarm, f"swarm run with {codec} failed")[1]
        ce = sweeps.assembled_ce(swarm, eval_xy)
        sums = swarm.summaries()
    history = [h for s in sums for h in s.get("history", [])]
    per_round: dict[int, list[float]] = {}
    for h in history:
        per_round.setdefault(int(h["round"]), []).append(h["premerge_distance"])
    wire, raw = sum(s["bytes_sent"] for s in sums), sum(s["raw_bytes_sent"] for s in sums)
    return {
        "codec": codec,
        "swarm_ce": ce,
        "participation": sum(s["participation"] for s in sums) / len(sums),
        "wire_bytes": wire,
        "raw_bytes": raw,
        "wire_over_raw": wire / raw if raw else float("nan"),
        "wire_bytes_per_round_per_peer": wire / rounds / peers,
        "rounds": min(s["round"] for s in sums),
        "rejected": sum(s.get("rejected", 0) for s in sums),
        "wall_s": wall,
        "premerge_distance_by_round": {r: max(d) for r, d in sorted(per_round.items())},
        "round_seconds_median": sorted(h["seconds"] for h in history)[len(history) // 2] if history else None,
    }


def main(argv=None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(1)
    sys.stdout.reconfigure(line_buffering=True)  # progress lines show as they come
    cfg = options.model_of(a, documented=a.documented)
    train_path, eval_xy = a.data_dir / "train.txt", sweeps.eval_windows(a, cfg.seq_len)
    out = json.loads(a.out.read_text()) if a.only and a.out.exists() else {}  # --only: keep the other part
    if a.only != "replicas":
        out.pop("int8_ce_loss_vs_fp32", None)  # a codecs run without fp32 has no such figure
        out.update(run_codecs(a, cfg, train_path, eval_xy, argv))
        results.write_json(a.out, out)
        write_md(a, out)
        print(json.dumps({k: out[k] for k in ("single_ce", *HEADLINE)}, indent=2))
    if a.only != "codecs":
        previous = out.get("replica_efficiency", {}) if a.keep else {}
        for partial in run_replicas(a, cfg, train_path, eval_xy, argv, previous):
            out["replica_efficiency"] = partial
            results.write_json(a.out, out)  # after every run: a long sweep keeps what it measured
        write_replica_md(a, out["replica_efficiency"])
        print(json.dumps(out["replica_efficiency"]["rows"], indent=2))


def run_codecs(a, cfg: ModelConfig, train_path: Path, eval_xy, argv) -> dict:
    """The codec comparison: the single-process run, then one swarm of a.peers daemons per codec."""
    tcfg = train_config(a)
    start = time.monotonic()
    stack = train_blocktrain(cfg, tcfg, ByteData.from_path(train_path, cfg.seq_len), eval_xy, a.steps, a.rounds)
    single_ce = from_noise_ce(stack.blocks, stack.emb, *eval_xy, cfg)["ce"]
    single_s = time.monotonic() - start
    print(f"single-process: ce {single_ce:.4f} in {single_s:.0f}s")
    by_codec = {}
    for codec in a.codecs:
        r = by_codec[codec] = run_swarm(a, cfg, codec, train_path, eval_xy, outer="none")
        r["ratio"] = r["swarm_ce"] / single_ce
        print(
            f"{codec}: swarm ce {r['swarm_ce']:.4f} ratio {r['ratio']:.4f} participation {r['participation']:.3f} "
            f"wire/raw {r['wire_over_raw']:.3f} in {r['wall_s']:.0f}s"
        )
    main_codec = "int8" if "int8" in by_codec else a.codecs[0]
    out = {
        "command": results.command_line("swarm.py", argv),
        "config": cfg.to_dict(),
        "train": tcfg.to_dict(),
        "peers": a.peers,
        "rounds": a.rounds,
        "steps_per_round": a.steps,
        "per_block_steps": a.rounds * a.steps,
        "block_params": count_params(DenoisingBlock(cfg)),
        "embedding_params": count_params(ByteEmbedding(cfg)),
        "single_ce": single_ce,
        "single_s": single_s,
        "codec": main_codec,
        **{k: by_codec[main_codec][k] for k in HEADLINE},
        "codecs": by_codec,
        "machine": machine(),
    }
    if "fp32" in by_codec and "int8" in by_codec:
        out["int8_ce_loss_vs_fp32"] = by_codec["int8"]["swarm_ce"] - by_codec["fp32"]["swarm_ce"]
    return out


def run_replicas(a, cfg: ModelConfig, train_path: Path, eval_xy, argv, previous: dict) -> Iterator[dict]:
    """Replica efficiency: single-replica swarms at each of a.single_mults x the rounds, then B x K daemons per
    K in a.replicas and outer optimizer in a.outers (K=1 with nesterov: its quality against plain averaging
    at 1 replica). Yields the section after every run (the last one is complete)."""
    B, steps = cfg.blocks, a.rounds * a.steps
    schedule = {"blocks": B, "rounds": a.rounds, "steps_per_round": a.steps}
    section: dict = {
        "command": results.command_line("swarm.py", argv),
        "codec": "int8",
        **schedule,
        "steps_per_replica": steps,
        "outer_lr": a.outer_lr,
        "outer_momentum": a.outer_momentum,
        "train": train_config(a).to_dict(),
        "machine": machine(),
        "single": [],
        "rows": [],
    }

    def summary(r: dict) -> dict:
        return {"ce": r["swarm_ce"], **{k: r[k] for k in SUMMARY}}

    if {k: previous.get(k) for k in schedule} == schedule:  # --keep: this command's runs replace those it repeats
        section["single"] = [s for s in previous.get("single", []) if s["mult"] not in a.single_mults]
        section["rows"] = previous.get("rows", [])
        section["command"] = previous.get("command", "") + "; " + section["command"]
    for mult in a.single_mults:
        r = run_swarm(a, cfg, "int8", train_path, eval_xy, peers=B, rounds=a.rounds * mult, outer="none")
        section["single"].append({"mult": mult, "rounds": a.rounds * mult, "steps": steps * mult, **summary(r)})
        print(f"single replica x{mult} ({steps * mult} steps): ce {r['swarm_ce']:.4f} in {r['wall_s']:.0f}s")
        yield section
    section["single"].sort(key=lambda s: s["mult"])
    points = [(s["steps"], s["ce"]) for s in section["single"]]
    sync_runs: dict[tuple[int, float], float] = {}  # (K, lr multiple) -> CE: one run per pair, whatever the outers
    for K, outer in [(K, o) for K in a.replicas for o in a.outers if (K, o) != (1, "none")]:  # (1, none): single
        extra = {"outer_lr": a.outer_lr, "outer_momentum": a.outer_momentum} if outer != "none" else {}
        r = run_swarm(a, cfg, "int8", train_path, eval_xy, peers=B * K, outer=outer, **extra)
        row = {"replicas": K, "daemons": B * K, "outer": outer, "steps_per_replica": steps, **summary(r), **extra}
        if K > 1 and a.sync_lrs:
            row.update(sync_dp_summary(K, row, sync_dp(a, cfg, train_path, eval_xy, K, sync_runs), points))
        section["rows"] = [x for x in section["rows"] if (x["replicas"], x["outer"]) != (K, outer)] + [row]
        for x in section["rows"] if len(points) >= 2 else []:  # against every single-replica run there is now
            equiv, extrapolated = steps_to_reach(x["ce"], points)
            x.update(single_steps_equiv=equiv, extrapolated=extrapolated, efficiency=equiv / (x["replicas"] * steps))
        eff = row.get("efficiency")
        excess = f" excess over sync DP {row['excess_pct']:+.2f}%" if "excess_pct" in row else ""
        print(
            f"{K} replicas, outer {outer}: ce {r['swarm_ce']:.4f} efficiency {eff if eff is None else f'{eff:.3f}'}"
            f"{' (extrapolated)' if row.get('extrapolated') else ''}{excess} in {r['wall_s']:.0f}s"
        )
        yield section


def sync_dp(a, cfg: ModelConfig, train_path: Path, eval_xy, K: int, done: dict) -> list[dict]:
    """Synchronous data parallel for K replicas: B daemons (one replica per block) at K x the batch, the same
    steps, at each multiple of --lr in a.sync_lrs; replica_sim's sweep rows (runs already in `done` are reused)."""
    for mult in a.sync_lrs:
        if (K, mult) not in done:
            batch, lr = K * a.batch_size, a.lr * mult
            r = run_swarm(a, cfg, "int8", train_path, eval_xy, peers=cfg.blocks, batch_size=batch, lr=lr)
            done[K, mult] = r["swarm_ce"]
            print(f"sync DP K={K} (batch {batch}, lr x{mult:g}): ce {done[K, mult]:.4f}")
    return [{"lr_mult": m, "lr_abs": a.lr * m, "ce": done[(K, m)]} for m in a.sync_lrs]


def replica_row(r: dict) -> str:
    """A row of the replica table ("-": not measured)."""
    measured = r.get("efficiency") is not None
    equiv = f"{r['single_steps_equiv']:.0f}{' (extrap.)' if r['extrapolated'] else ''}" if measured else "-"
    eff = f"{r['efficiency']:.3f}" if measured else "-"
    edge = ", sweep edge" if r.get("sync_dp_lr_at_edge") else ""
    sync = f"{r['sync_dp_ce']:.4f} (x{r['sync_dp_lr_mult']:g}{edge})" if "sync_dp_ce" in r else "-"
    excess = f"{r['excess_pct']:+.2f}%" if "excess_pct" in r else "-"
    return (
        f"{r['replicas']} | {r['daemons']} | {r['outer']} | {r['ce']:.4f} | {sync} | {excess} | {equiv} | {eff} "
        f"| {r['participation']:.3f} | {r['round_seconds_median'] or 0:.2f} | {r['wall_s']:.0f}"
    )


def write_replica_md(a, sec: dict) -> None:
    single = ", ".join(f"{s['steps']} steps: {s['ce']:.4f}" for s in sec["single"])
    train = sec["train"]
    head = (
        "replicas per block | daemons | outer | CE | sync DP at K x the batch (lr x) | excess "
        "| single-replica steps to that CE | efficiency | participation | median round s | wall s"
    )
    lines = results.paragraphs(
        f"### Replica efficiency with real daemons (B={sec['blocks']} x K replicas, loopback)",
        f"Command: `{sec['command']}`",
        f"Config: benchmarks/swarm.py's model and schedule ({sec['rounds']} rounds x H={sec['steps_per_round']} = "
        f"{sec['steps_per_replica']} steps per replica, batch {train['batch_size']}, lr {train['lr']} "
        f"constant after a {train['warmup_steps']}-step warmup), int8 deltas, robust merge. Outer optimizer "
        f"nesterov: lr {sec['outer_lr']:g}, momentum {sec['outer_momentum']:g}. Machine: {sec['machine']} (shared).",
        single and f"Single replica per block ({sec['blocks']} daemons, separate runs): {single} nats/byte.",
        results.table(head, map(replica_row, sec["rows"]), "rrlrrrrrrrr"),
        "Efficiency = (single-replica steps to the run's CE, interpolated in log-steps between the single-replica "
        "runs, extrapolated on the nearest segment outside them) / (replicas x steps per replica): 1.0: K replicas "
        "buy K times the steps. Sync DP: B daemons, one replica per block at K x the batch, the same steps, best of "
        "the lr multiples; excess = CE / sync DP - 1.",
    )
    results.replace_section(a.replica_md, "swarm.py replicas", lines)


def write_md(a, out: dict) -> None:
    cfg, train, first = out["config"], out["train"], next(iter(out["codecs"].values()))
    head = (
        "codec | swarm CE | ratio swarm/single | participation | wire bytes | raw fp32 bytes | wire / raw "
        "| wire bytes per round per peer | median round s | rejected"
    )
    rows = [
        f"{c} | {r['swarm_ce']:.4f} | {r['ratio']:.4f} | {r['participation']:.3f} | {r['wire_bytes']:,} "
        f"| {r['raw_bytes']:,} | {r['wire_over_raw']:.3f} | {r['wire_bytes_per_round_per_peer']:,.0f} "
        f"| {r['round_seconds_median'] or 0:.2f} | {r['rejected']}"
        for c, r in out["codecs"].items()
    ]
    int8 = (
        f"int8 + error feedback + zstd vs fp32: {out['codecs']['int8']['wire_over_raw']:.3f}x the raw fp32 bytes, "
        f"CE difference {out['int8_ce_loss_vs_fp32']:+.4f} nats."
        if "int8_ce_loss_vs_fp32" in out
        else ""
    )
    dist = ", ".join(f"r{r}: {d:.2e}" for r, d in first["premerge_distance_by_round"].items())
    lines = results.paragraphs(
        "### Swarm quality and communication (6 daemons, B=3 x 2 replicas, loopback), "
        + ("the documented block" if a.documented else "the default block (issues 8 and 19)")
        + (f", trajectory training (p={a.trajectory_prob})" if a.trajectory_prob else ", noisy targets"),
        f"Command: `{out['command']}`",
        f"Config: B={cfg['blocks']}, L_b={cfg['layers_per_block']}, d={cfg['d_model']}, seq={cfg['seq_len']}, "
        f"batch {train['batch_size']}, lr {train['lr']}, "
        f"{out['rounds']} rounds x H={out['steps_per_round']} local steps = {out['per_block_steps']} steps per block "
        f"(same in the single-process run, one replica per block). "
        f"Block {out['block_params']:,} params + byte table {out['embedding_params']:,} params. "
        f"Eval: from-noise CE on eval.txt ({a.eval_tokens} bytes). Machine: {out['machine']} (shared).",
        f"Single-process BlockTrain (swarmd.core.local_run.train_blocktrain): CE **{out['single_ce']:.4f}** nats/byte.",
        results.table(head, rows, "lrrrrrrrrr"),
        int8,
        f"Consensus ({first['codec']}): max relative distance between same-block replicas just before each merge "
        f"(local drift during H steps): {dist}; after every merge the replicas are bit-identical (distance 0, equal "
        "base hashes), as the status sketch confirms.",
        "Notes: wire bytes are all a peer sent on gossip streams and state pulls (payload + header, after zstd); raw "
        "bytes are the fp32 size of the same tensors. The swarm trains each block on two data streams per round (two "
        "replicas) and averages them: per block twice the samples of the single-process run at the same steps.",
        a.trajectory_prob
        and "With trajectory training a block-b peer also pulls blocks 0..b-1 (fp32 state, `PullState`) every round "
        "and runs them frozen, forward only: those pulls, counted in the wire bytes, raise wire / raw.",
    )
    results.replace_section(a.md, "swarm.py" + (" documented" if a.documented else ""), lines)


if __name__ == "__main__":
    main()
