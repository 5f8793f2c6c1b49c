"""`blocktrain join`: join a running swarm with the swarm's own model config (asked of a peer).

Model flags are optional here: each one given must match the swarm's config (else a clear error),
the rest come from the swarm. Then it runs exactly like `blocktrain run`: picks a block, downloads
the block and embedding state from peers before its first step, and starts contributing.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Annotated

import typer

from cli import options as o
from cli.common import check_device, cli_errors, setup_logging
from cli.run import (
    BlockOpt,
    CheckpointDir,
    ClientMode,
    Codec,
    CodecOpt,
    DeadlineMax,
    DhtHost,
    Listen,
    PeerSeed,
    RoundsOpt,
    StepsPerRoundOpt,
    SwarmId,
    Verbose,
    build_config,
    run_daemon,
)
from swarmd.errors import ConfigMismatch
from swarmd.swarm.survey import fetch_swarm_config

M = "Model"
Opt = lambda flag, what: Annotated[
    int | None, typer.Option(flag, help=f"{what} (must match the swarm; default: the swarm's).", rich_help_panel=M)
]


def join(
    peers: Annotated[
        list[str], typer.Argument(help="DHT multiaddrs printed by `blocktrain run` (or HOST:PORT gRPC addresses).")
    ],
    data: o.Data = None,
    block: BlockOpt = "auto",
    device: o.DeviceOpt = "cpu",
    listen: Listen = "127.0.0.1:0",
    checkpoint_dir: CheckpointDir = None,
    swarm_id: SwarmId = "blocktrain",
    codec: CodecOpt = Codec.int8,
    client_mode: ClientMode = False,
    dht_host: DhtHost = "127.0.0.1",
    steps_per_round: StepsPerRoundOpt = 20,
    rounds: RoundsOpt = 0,
    deadline_max: DeadlineMax = 30.0,
    peer_seed: PeerSeed = 1,
    blocks: Opt("--blocks", "B: number of denoising blocks") = None,
    layers_per_block: Opt("--layers-per-block", "L_b: layers per block") = None,
    d_model: Opt("--d-model", "Model width") = None,
    n_heads: Opt("--n-heads", "Attention heads") = None,
    hidden: Opt("--hidden", "FFN width") = None,
    seq_len: Opt("--seq-len", "Bytes per window") = None,
    batch_size: o.BatchSize = 32,
    lr: o.LR = 1e-3,
    seed: o.Seed = 0,
    trajectory_prob: o.TrajectoryProb = 0.0,
    verbose: Verbose = False,
) -> None:
    """Join a running swarm: fetch its model config from a peer, download state, train a block."""
    setup_logging(verbose)
    with cli_errors():
        dev = check_device(device)
        model = asyncio.run(fetch_swarm_config(list(peers), swarm_id))
        given = {
            "blocks": blocks,
            "layers_per_block": layers_per_block,
            "d_model": d_model,
            "n_heads": n_heads,
            "hidden": hidden,
            "seq_len": seq_len,
        }
        swarm_values = asdict(model)
        wrong = {k: (v, swarm_values[k]) for k, v in given.items() if v is not None and v != swarm_values[k]}
        if wrong:
            detail = ", ".join(f"--{k.replace('_', '-')} {v} (swarm: {s})" for k, (v, s) in wrong.items())
            raise ConfigMismatch(
                f"local model flags do not match the swarm's config: {detail}; drop them to use the swarm's"
            )
        typer.echo(
            f"swarm config {model.config_hash()}: B={model.blocks} L_b={model.layers_per_block} d={model.d_model} seq={model.seq_len}"
        )
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
            initial_peers=list(peers),
            static=False,
            dht_host=dht_host,
            trajectory_prob=trajectory_prob,
        )
        run_daemon(config)
