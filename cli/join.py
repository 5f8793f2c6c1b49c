"""`blocktrain join`: join a running swarm with the swarm's own model config (asked of a peer).

Model flags are optional here: each one given must match the swarm's config (else a clear error),
the rest come from the swarm. Then it runs exactly like `blocktrain run`: picks a block, downloads
the block and embedding state from peers before its first step, and starts contributing.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from cli import options as o
from cli.common import check_device, cli_errors, resolve_data, setup_logging
from cli.options import DAEMON, GOSSIP, NET, TRAIN
from swarmd.errors import ConfigMismatch
from swarmd.swarm.runner import run_foreground
from swarmd.swarm.survey import fetch_swarm_config


def join(
    ctx: typer.Context,
    peers: Annotated[
        list[str], typer.Argument(help="DHT multiaddrs printed by `blocktrain run` (or HOST:PORT gRPC addresses).")
    ],
    data: o.Data = None,
    block: o.BlockOpt = "auto",
    device: o.DeviceOpt = o.DEFAULT_DEVICE,
    listen: o.Listen = NET.listen,
    checkpoint_dir: o.CheckpointDir = None,
    swarm_id: o.SwarmId = NET.swarm_id,
    codec: o.CodecOpt = o.DEFAULT_CODEC,
    client_mode: o.ClientMode = NET.client_mode,
    dht_host: o.DhtHost = NET.dht_host,
    steps_per_round: o.StepsPerRound = GOSSIP.steps_per_round,
    rounds: o.Rounds = DAEMON.max_rounds,
    deadline_max: o.DeadlineMax = GOSSIP.deadline_max_s,
    peer_seed: o.PeerSeed = None,
    blocks: o.Blocks = None,  # model flags: None = the swarm's
    layers_per_block: o.LayersPerBlock = None,
    d_model: o.DModel = None,
    n_heads: o.NHeads = None,
    hidden: o.Hidden = None,
    seq_len: o.SeqLen = None,
    batch_size: o.BatchSize = TRAIN.batch_size,
    lr: o.LR = TRAIN.lr,
    seed: o.Seed = TRAIN.seed,
    trajectory_prob: o.TrajectoryProb = TRAIN.trajectory_prob,
    verbose: o.Verbose = False,
) -> None:
    """Join a running swarm: fetch its model config from a peer, download state, train a block.

    Model flags are optional: each one given must match the swarm's config.
    """
    setup_logging(verbose)
    with cli_errors():
        check_device(device)
        model = asyncio.run(fetch_swarm_config(list(peers), swarm_id))
        swarm_values = model.to_dict()
        given = {k: v for k in o.MODEL_OPTIONS if (v := ctx.params.get(k)) is not None}
        wrong = {k: (v, swarm_values[k]) for k, v in given.items() if v != swarm_values[k]}
        if wrong:
            detail = ", ".join(f"--{k.replace('_', '-')} {v} (swarm: {s})" for k, (v, s) in wrong.items())
            raise ConfigMismatch(
                f"local model flags do not match the swarm's config: {detail}; drop them to use the swarm's"
            )
        typer.echo(
            f"swarm config {model.config_hash()}: B={model.blocks} L_b={model.layers_per_block} "
            f"d={model.d_model} seq={model.seq_len}"
        )
        train_path = resolve_data(data, "train")
        run_foreground(o.peer_config(ctx.params, model, train_path, None, list(peers)))
