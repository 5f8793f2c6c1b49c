"""`blocktrain run`: start a swarm peer (a new swarm, or one more peer of a swarm) and serve until stopped.

Prints the lines others need (address, multiaddrs, block) as `key: value` on stdout, then one line
per merged round. Ctrl-C / SIGTERM checkpoints and leaves; the same --checkpoint-dir resumes.
`blocktrain join` shares run_daemon() below.
"""

from __future__ import annotations

import asyncio
import signal
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from cli import options as o
from cli.common import check_device, cli_errors, model_config, resolve_data, setup_logging
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.swarm.peer_config import DaemonConfig, GossipConfig, NetConfig

S, N = "Swarm", "Network"


class Codec(str, Enum):
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"
    int8 = "int8"


BlockOpt = Annotated[
    str,
    typer.Option(
        "--block",
        help="Block to train: a number, or 'auto' for the block with the least combined throughput.",
        envvar="BLOCKTRAIN_BLOCK",
        rich_help_panel=S,
    ),
]
Listen = Annotated[
    str,
    typer.Option(
        "--listen",
        help="HOST:PORT of this peer's gRPC server (port 0 = any free port).",
        envvar="BLOCKTRAIN_LISTEN",
        rich_help_panel=N,
    ),
]
CheckpointDir = Annotated[
    Path | None,
    typer.Option(
        "--checkpoint-dir",
        help="Checkpoint here after every round and resume from it on restart.",
        envvar="BLOCKTRAIN_CHECKPOINT_DIR",
        rich_help_panel=S,
    ),
]
SwarmId = Annotated[
    str,
    typer.Option(
        "--swarm-id",
        help="Swarm name; peers only talk to peers of the same swarm.",
        envvar="BLOCKTRAIN_SWARM_ID",
        rich_help_panel=S,
    ),
]
CodecOpt = Annotated[
    Codec,
    typer.Option(
        "--codec",
        help="Delta codec on the wire (always followed by zstd; int8 uses error feedback).",
        case_sensitive=False,
        rich_help_panel=S,
    ),
]
ClientMode = Annotated[
    bool,
    typer.Option(
        "--client-mode",
        help="Accept no inbound connections (behind NAT): dial out for exchanges only.",
        rich_help_panel=N,
    ),
]
StepsPerRoundOpt = Annotated[
    int, typer.Option("--steps-per-round", help="H: local optimiser steps between averaging rounds.", rich_help_panel=S)
]
RoundsOpt = Annotated[
    int,
    typer.Option("--rounds", help="Stop after this many averaging rounds (0 = run until stopped).", rich_help_panel=S),
]
PeerSeed = Annotated[
    int,
    typer.Option(
        "--peer-seed",
        help="Seed of this peer's data stream and noise (use a different one per peer).",
        envvar="BLOCKTRAIN_PEER_SEED",
        rich_help_panel=S,
    ),
]
DeadlineMax = Annotated[
    float,
    typer.Option(
        "--deadline-max",
        help="Longest a round waits for peers' deltas, in seconds (the adaptive deadline stays below).",
        rich_help_panel=S,
    ),
]
Static = Annotated[
    bool,
    typer.Option(
        "--static",
        help="PEERS are HOST:PORT gRPC addresses of a fixed peer list instead of DHT multiaddrs.",
        rich_help_panel=N,
    ),
]
DhtHost = Annotated[
    str,
    typer.Option("--dht-host", help="Interface the DHT listens on.", envvar="BLOCKTRAIN_DHT_HOST", rich_help_panel=N),
]
EvalEvery = Annotated[
    int,
    typer.Option(
        "--eval-every",
        help="Every this many rounds, pull the other blocks from peers and measure the from-noise CE shown by `status` (0 = never).",
        rich_help_panel=S,
    ),
]
MinPeers = Annotated[
    int,
    typer.Option(
        "--min-peers",
        help="Wait before the first round until the swarm has this many peers (self included).",
        rich_help_panel=S,
    ),
]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log every round and exchange to stderr.")]


def build_config(
    model: ModelConfig,
    *,
    data: Path | None,
    block: str,
    device: str,
    listen: str,
    checkpoint_dir: Path | None,
    swarm_id: str,
    codec: Codec,
    client_mode: bool,
    steps_per_round: int,
    rounds: int,
    batch_size: int,
    lr: float,
    seed: int,
    peer_seed: int,
    deadline_max: float,
    initial_peers: list[str],
    static: bool,
    dht_host: str,
    min_peers: int = 0,
    eval_data: Path | None = None,
    eval_every: int = 0,
    trajectory_prob: float = 0.0,
) -> DaemonConfig:
    if block != "auto" and not block.isdigit():
        raise ValueError(f"--block must be a number or 'auto', got {block!r}")
    train_path = resolve_data(data, "train")
    if eval_every and eval_data is None:
        sibling = train_path.parent / "eval.txt"
        eval_data = sibling if sibling.is_file() else train_path
    static = static or (bool(initial_peers) and not any(p.startswith("/") for p in initial_peers))
    return DaemonConfig(
        model=model,
        train=TrainConfig(
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            warmup_steps=min(50, steps_per_round),
            trajectory_prob=trajectory_prob,
        ),
        gossip=GossipConfig(steps_per_round=steps_per_round, codec=codec.value, deadline_max_s=deadline_max),
        net=NetConfig(
            swarm_id=swarm_id,
            listen=listen,
            initial_peers=tuple(initial_peers),
            discovery="static" if static else "hivemind",
            client_mode=client_mode,
            dht_host=dht_host,
        ),
        data_path=str(train_path),
        eval_path=str(eval_data) if eval_data else "",
        eval_every=eval_every,
        block=-1 if block == "auto" else int(block),
        device=device,
        checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else "",
        peer_seed=peer_seed,
        max_rounds=rounds,
        min_peers=min_peers,
    )


def run_daemon(config: DaemonConfig) -> None:
    """Start a Daemon, print how to reach it, serve until SIGINT/SIGTERM or max_rounds."""
    from swarmd.swarm.daemon import Daemon

    async def main() -> None:
        daemon = Daemon(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, daemon.stop)
        try:
            await daemon.start()
        except BaseException:
            await daemon.shutdown()
            raise
        st = daemon.status()
        typer.echo(
            f"swarm: {config.net.swarm_id}\npeer: {st.peer_id}\nblock: {st.block_index}\nround: {st.round}\naddress: {st.address or '(client mode)'}"
        )
        for m in st.multiaddrs:
            typer.echo(f"multiaddr: {m}")
        if st.multiaddrs:
            typer.echo(f"join with: blocktrain join {st.multiaddrs[0]} --data FILE --swarm-id {config.net.swarm_id}")
        typer.echo("ready", nl=True)

        original = daemon.run_round

        async def run_round():
            report = await original()
            if report is not None:
                m = daemon.metrics
                typer.echo(
                    f"round {daemon.state.round}: block {daemon.state.block_index} train ce {m.last_train_ce:.4f} participation {report.participation:.2f} sent {m.bytes_sent} B in {report.seconds:.2f}s"
                )
            return report

        daemon.run_round = run_round
        await daemon.serve()
        typer.echo(
            f"stopped at round {daemon.state.round}"
            + (f", checkpoint in {config.checkpoint_dir}" if config.checkpoint_dir else "")
        )

    asyncio.run(main())


def run(
    data: o.Data = None,
    peers: Annotated[
        list[str] | None,
        typer.Argument(
            help="Peers to join through (DHT multiaddrs, or HOST:PORT with --static); none starts a new swarm.",
            show_default=False,
        ),
    ] = None,
    block: BlockOpt = "auto",
    device: o.DeviceOpt = "cpu",
    listen: Listen = "127.0.0.1:0",
    checkpoint_dir: CheckpointDir = None,
    swarm_id: SwarmId = "blocktrain",
    codec: CodecOpt = Codec.int8,
    client_mode: ClientMode = False,
    static: Static = False,
    dht_host: DhtHost = "127.0.0.1",
    steps_per_round: StepsPerRoundOpt = 20,
    rounds: RoundsOpt = 0,
    deadline_max: DeadlineMax = 30.0,
    peer_seed: PeerSeed = 0,
    min_peers: MinPeers = 0,
    eval_data: o.EvalData = None,
    eval_every: EvalEvery = 0,
    blocks: o.Blocks = 3,
    layers_per_block: o.LayersPerBlock = 2,
    d_model: o.DModel = 128,
    n_heads: o.NHeads = 4,
    hidden: o.Hidden = None,
    seq_len: o.SeqLen = 128,
    sigma_lo: o.SigmaLo = 1.0,
    sigma_hi: o.SigmaHi = 10.0,
    batch_size: o.BatchSize = 32,
    lr: o.LR = 1e-3,
    seed: o.Seed = 0,
    trajectory_prob: o.TrajectoryProb = 0.0,
    verbose: Verbose = False,
) -> None:
    """Start a swarm peer that trains one block; prints the multiaddrs others join with."""
    setup_logging(verbose)
    with cli_errors():
        dev = check_device(device)
        model = model_config(blocks, layers_per_block, d_model, n_heads, hidden, seq_len, sigma_lo, sigma_hi)
        config = build_config(
            model,
            data=data,
            block=block,
            device=dev,
            listen=listen,
            checkpoint_dir=checkpoint_dir,
            swarm_id=swarm_id,
            codec=codec,
            client_mode=client_mode,
            steps_per_round=steps_per_round,
            rounds=rounds,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            peer_seed=peer_seed,
            deadline_max=deadline_max,
            initial_peers=list(peers or []),
            static=static,
            dht_host=dht_host,
            min_peers=min_peers,
            eval_data=eval_data,
            eval_every=eval_every,
            trajectory_prob=trajectory_prob,
        )
        run_daemon(config)
