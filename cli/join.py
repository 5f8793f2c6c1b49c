"""`blocktrain join`: join a running swarm with the swarm's own model config (asked of a peer).

Model flags are optional here: each one given must match the swarm's config (else a clear error),
the rest come from the swarm. Then it runs exactly like `blocktrain run`: picks a block, downloads
the block and embedding state from peers before its first step, and starts contributing. With
--swarm-key the config is asked with a proof of that key too (a private swarm answers nothing else).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from cli import flags as f
from cli import options as o
from cli.common import check_data, check_device, cli_errors, resolve_data, setup_logging
from cli.groups import with_groups
from swarmd.errors import ConfigMismatch
from swarmd.membership.addresses import check_listen_ports, check_peer_addresses, is_multiaddr
from swarmd.node.runner import run_foreground
from swarmd.tools.survey import fetch_swarm_config

# run's flags less --eval-data, --min-peers, --eval-every, --static and the sigma range; model flags None = the swarm's
PEER = o.PeerOptions.without("eval_data", "min_peers", "eval_every", "static")
MODEL = o.ModelOptions.optional().without("sigma_lo", "sigma_hi")


@with_groups(peer=PEER, train=o.TrainOptions, model=MODEL)
def join(
    peers: Annotated[
        list[str], typer.Argument(help="DHT multiaddrs printed by `blocktrain run` (or HOST:PORT gRPC addresses).")
    ],
    peer: o.PeerOptions,
    train: o.TrainOptions,
    model: o.ModelOptions,
    verbose: f.Verbose = False,
) -> None:
    """Join a running swarm: fetch its model config from a peer, download state, train a block.

    Model flags are optional: each one given must match the swarm's config.
    """
    with cli_errors():
        check_peer_addresses(peers)  # a mistyped peer fails before torch loads
        dht = not peer.client_mode and any(is_multiaddr(p) for p in peers)
        check_listen_ports(peer.listen, peer.dht_host, peer.dht_port, server=not peer.client_mode, dht=dht)
        check_data(peer.data)  # a missing, empty or binary file fails before torch loads
        peer.check(train, list(peers))  # so does a bad combination of flags (the model's wait for the swarm's)
        setup_logging(verbose)  # imports hivemind (and torch): after the instant checks
        check_device(peer.device)
        if peer.swarm_key is not None:  # the config request proves the key as well (not only the daemon's calls)
            from swarmd.transport.auth import load_swarm_key, use_swarm_key

            use_swarm_key(load_swarm_key(peer.swarm_key))
        swarm_model = asyncio.run(fetch_swarm_config(list(peers), peer.swarm_id))
        swarm_values = swarm_model.to_dict()
        wrong = {k: (v, swarm_values[k]) for k, v in model.given().items() if v != swarm_values[k]}
        if wrong:
            detail = ", ".join(f"--{k.replace('_', '-')} {v} (swarm: {s})" for k, (v, s) in wrong.items())
            raise ConfigMismatch(
                f"local model flags do not match the swarm's config: {detail}; drop them to use the swarm's"
            )
        typer.echo(
            f"swarm config {swarm_model.config_hash()}: B={swarm_model.blocks} L_b={swarm_model.layers_per_block} "
            f"d={swarm_model.d_model} seq={swarm_model.seq_len}"
        )
        train_path = resolve_data(peer.data, "train")
        run_foreground(peer.config(swarm_model, train, list(peers), train_path, None))
