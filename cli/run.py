"""`blocktrain run`: start a swarm peer (a new swarm, or one more peer of a swarm) and serve until stopped.

Prints the lines others need (address, multiaddrs, block) as `key: value` on stdout, then one line
per merged round (swarmd.node.runner, shared with `blocktrain join` and `python -m swarmd`).
Ctrl-C / SIGTERM checkpoints and leaves; the same --checkpoint-dir resumes.
"""

from __future__ import annotations

from typing import Annotated

import typer

from cli import flags as f
from cli import options as o
from cli.common import check_data, check_device, cli_errors, resolve_data, resolve_train_eval, setup_logging
from cli.groups import with_groups
from swarmd.membership.addresses import check_listen_ports, check_peer_addresses, is_multiaddr
from swarmd.node.runner import run_foreground


@with_groups(peer=o.PeerOptions, train=o.TrainOptions, model=o.ModelOptions)
def run(
    peers: Annotated[
        list[str] | None,
        typer.Argument(
            help="Peers to join through (DHT multiaddrs, or HOST:PORT with --static); none starts a new swarm.",
            show_default=False,
        ),
    ] = None,
    *,
    peer: o.PeerOptions,
    train: o.TrainOptions,
    model: o.ModelOptions,
    verbose: f.Verbose = False,
) -> None:
    """Start a swarm peer that trains one block; prints the multiaddrs others join with."""
    with cli_errors():
        check_peer_addresses(peers or [])  # a mistyped peer fails before torch loads
        dht = not (peer.static or peer.client_mode or (peers and not any(is_multiaddr(p) for p in peers)))
        check_listen_ports(peer.listen, peer.dht_host, peer.dht_port, server=not peer.client_mode, dht=dht)
        check_data(peer.data)  # a missing, empty or binary file fails before torch loads
        # so does a bad combination of flags (--overlap-steps above --steps-per-round)
        peer.check(train, list(peers or []))
        model_config = model.config()  # ... or of model flags (--d-model not divisible by --n-heads)
        train_path, eval_path = (
            resolve_train_eval(peer.data, peer.eval_data) if peer.eval_every else (resolve_data(peer.data), None)
        )
        config = peer.config(model_config, train, list(peers or []), train_path, eval_path)
        setup_logging(verbose)  # imports hivemind (and torch): after the instant checks
        check_device(peer.device)
        run_foreground(config)
