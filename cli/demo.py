"""`blocktrain demo`: a whole swarm on this machine: N daemons as processes, live view, final CE.

Starts --peers `blocktrain run` processes on loopback (block i mod B, joined through peer 0's
DHT multiaddr), shows each peer's round as it trains and averages, and ends with the assembled
model's from-noise CE on held-out text (before and after), the participation and the bytes moved.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli import options as o
from cli.common import cli_errors, model_config, print_json, resolve_data
from cli.run import Codec, CodecOpt
from cli.train import eval_path_for
from swarmd.core.config import ModelConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import from_noise_ce
from swarmd.core.train import init_block, init_embedding
from swarmd.errors import SwarmdError
from swarmd.swarm.launch import LocalSwarm


def assembled_ce(blocks, emb, cfg: ModelConfig, eval_xy) -> float:
    return from_noise_ce(blocks, emb, *eval_xy, cfg)["ce"]


def demo(
    peers: Annotated[int, typer.Option("--peers", help="Daemons to start (processes on loopback).")] = 6,
    data: o.Data = None,
    eval_data: o.EvalData = None,
    rounds: Annotated[int, typer.Option("--rounds", help="Averaging rounds every peer runs.")] = 5,
    steps_per_round: Annotated[
        int, typer.Option("--steps-per-round", help="H: local steps between averaging rounds.")
    ] = 20,
    codec: CodecOpt = Codec.int8,
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Where peers keep checkpoints and logs (default: a temp dir).")
    ] = None,
    blocks: o.Blocks = 3,
    layers_per_block: o.LayersPerBlock = 1,
    d_model: o.DModel = 64,
    n_heads: o.NHeads = 4,
    hidden: o.Hidden = None,
    seq_len: o.SeqLen = 64,
    sigma_lo: o.SigmaLo = 1.0,
    sigma_hi: o.SigmaHi = 10.0,
    batch_size: o.BatchSize = 16,
    lr: o.LR = 3e-3,
    seed: o.Seed = 0,
    trajectory_prob: o.TrajectoryProb = 0.0,
    eval_tokens: o.EvalTokens = 4096,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Give up (and stop every peer) after this many seconds.")
    ] = 900.0,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON summary (ce_start, ce_end, participation, bytes_sent, rounds, ...)."
        ),
    ] = False,
) -> None:
    """Run a whole swarm on this machine and report the assembled model's from-noise CE."""
    with cli_errors():
        if peers < 1 or rounds < 1 or steps_per_round < 1:
            raise ValueError("--peers, --rounds and --steps-per-round must be >= 1")
        cfg = model_config(blocks, layers_per_block, d_model, n_heads, hidden, seq_len, sigma_lo, sigma_hi)
        train_path = resolve_data(data, "train")
        eval_xy = ByteData.from_path(eval_path_for(train_path, eval_data), cfg.seq_len).eval_windows(eval_tokens)
        ce_start = assembled_ce(
            [init_block(cfg, b, seed) for b in range(cfg.blocks)], init_embedding(cfg, seed), cfg, eval_xy
        )
        tmp = None if workdir else tempfile.TemporaryDirectory(prefix="blocktrain-demo-")
        root = Path(workdir or tmp.name)
        swarm = LocalSwarm(
            peers,
            cfg,
            train_path,
            root,
            rounds=rounds,
            steps_per_round=steps_per_round,
            codec=codec.value,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            extra=["--trajectory-prob", str(trajectory_prob)],
        )
        start = time.monotonic()
        try:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                disable=json_out,
            ) as view:
                if not json_out:
                    view.console.print(
                        f"starting {peers} peers (B={cfg.blocks}, L_b={cfg.layers_per_block}, d={cfg.d_model}, seq={cfg.seq_len}) in {root}; initial from-noise CE {ce_start:.4f}"
                    )
                swarm.start(timeout_s=min(timeout, 300))
                tasks = [view.add_task(f"peer {p.index} block {p.block}", total=rounds) for p in swarm.peers]
                while any(p.alive() for p in swarm.peers):
                    if time.monotonic() - start > timeout:
                        raise SwarmdError(
                            f"the swarm did not finish {rounds} rounds within {timeout:.0f}s (logs in {root})"
                        )
                    for p, st, task in zip(swarm.peers, asyncio.run(swarm.statuses()), tasks):
                        done = len(p.rounds_seen)
                        extra = (
                            f" {st.state} part {st.participation:.2f} sent {st.bytes_sent / 1e6:.2f} MB"
                            if st is not None
                            else (" done" if not p.alive() else "")
                        )
                        view.update(task, completed=done, description=f"peer {p.index} block {p.block}{extra}")
                    swarm.wait(0.5) if not any(p.alive() for p in swarm.peers) else time.sleep(0.5)
        finally:
            swarm.stop()
        failed = [p.index for p in swarm.peers if p.proc.returncode != 0]
        if failed:
            raise SwarmdError(f"peers {failed} failed; see their logs in {root}: {swarm.tail(swarm.peers[failed[0]])}")
        model_blocks, emb = swarm.assemble()
        ce_end = assembled_ce(model_blocks, emb, cfg, eval_xy)
        sums = swarm.summaries()
        result = {
            "peers": peers,
            "blocks": cfg.blocks,
            "rounds": min(int(s.get("round", 0)) for s in sums),
            "steps_per_round": steps_per_round,
            "codec": codec.value,
            "ce_start": ce_start,
            "ce_end": ce_end,
            "participation": sum(float(s.get("participation", 0)) for s in sums) / len(sums),
            "bytes_sent": sum(int(s.get("bytes_sent", 0)) for s in sums),
            "raw_bytes_sent": sum(int(s.get("raw_bytes_sent", 0)) for s in sums),
            "wall_s": time.monotonic() - start,
            "config": cfg.to_dict(),
        }
        if tmp is not None:
            tmp.cleanup()
        if json_out:
            print_json(result)
        else:
            typer.echo(
                f"from-noise CE {ce_start:.4f} -> {ce_end:.4f} nats/byte after {result['rounds']} rounds x {steps_per_round} steps; participation {result['participation']:.2f}; {result['bytes_sent'] / 1e6:.2f} MB sent ({result['raw_bytes_sent'] / 1e6:.2f} MB raw fp32) in {result['wall_s']:.0f}s"
            )
