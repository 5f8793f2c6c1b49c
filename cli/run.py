"""`blocktrain run`: start a swarm peer (a new swarm, or one more peer of a swarm) and serve until stopped.

Prints the lines others need (address, multiaddrs, block) as `key: value` on stdout, then one line
per merged round (swarmd.swarm.runner, shared with `blocktrain join` and `python -m swarmd`).
Ctrl-C / SIGTERM checkpoints and leaves; the same --checkpoint-dir resumes.
"""

from __future__ import annotations

from typing import Annotated

import typer

from cli import options as o
from cli.common import check_device, cli_errors, eval_path_for, resolve_data, setup_logging
from cli.options import DAEMON, GOSSIP, MODEL, NET, TRAIN
from swarmd.swarm.runner import run_foreground


def run(
    ctx: typer.Context,
    data: o.Data = None,
    peers: Annotated[
        list[str] | None,
        typer.Argument(
            help="Peers to join through (DHT multiaddrs, or HOST:PORT with --static); none starts a new swarm.",
            show_default=False,
        ),
    ] = None,
    block: o.BlockOpt = "auto",
    device: o.DeviceOpt = o.DEFAULT_DEVICE,
    listen: o.Listen = NET.listen,
    checkpoint_dir: o.CheckpointDir = None,
    swarm_id: o.SwarmId = NET.swarm_id,
    codec: o.CodecOpt = o.DEFAULT_CODEC,
    client_mode: o.ClientMode = NET.client_mode,
    static: o.Static = False,
    dht_host: o.DhtHost = NET.dht_host,
    steps_per_round: o.StepsPerRound = GOSSIP.steps_per_round,
    rounds: o.Rounds = DAEMON.max_rounds,
    deadline_max: o.DeadlineMax = GOSSIP.deadline_max_s,
    peer_seed: o.PeerSeed = None,
    min_peers: o.MinPeers = DAEMON.min_peers,
    eval_data: o.EvalData = None,
    eval_every: o.EvalEvery = DAEMON.eval_every,
    blocks: o.Blocks = MODEL.blocks,
    layers_per_block: o.LayersPerBlock = MODEL.layers_per_block,
    d_model: o.DModel = MODEL.d_model,
    n_heads: o.NHeads = MODEL.n_heads,
    hidden: o.Hidden = None,
    seq_len: o.SeqLen = MODEL.seq_len,
    sigma_lo: o.SigmaLo = MODEL.sigma_lo,
    sigma_hi: o.SigmaHi = MODEL.sigma_hi,
    batch_size: o.BatchSize = TRAIN.batch_size,
    lr: o.LR = TRAIN.lr,
    seed: o.Seed = TRAIN.seed,
    trajectory_prob: o.TrajectoryProb = TRAIN.trajectory_prob,
    verbose: o.Verbose = False,
) -> None:
    """Start a swarm peer that trains one block; prints the multiaddrs others join with."""
    setup_logging(verbose)
    with cli_errors():
        check_device(device)
        train_path = resolve_data(data, "train")
        eval_path = eval_path_for(train_path, eval_data) if eval_every else None
        model = o.model_config(ctx.params)
        run_foreground(o.peer_config(ctx.params, model, train_path, eval_path, list(peers or []), static))
