"""`blocktrain dashboard`: a live web map of a swarm (swarmd.tools.dashboard) until Ctrl-C.

Prints `dashboard: URL` as soon as the port is bound, then connects to the swarm; the page (served
once the first survey is done, with it) shows blocks as columns with their peers and a CE-over-time
chart. Imports no torch until it runs.
"""

from __future__ import annotations

import asyncio

import typer

from cli import flags as f
from cli.common import cli_errors, fail, setup_logging
from cli.flags import NET


def dashboard(
    swarm: f.SwarmPeers = None,
    swarm_id: f.SwarmId = NET.swarm_id,
    host: f.DashboardHost = "127.0.0.1",
    port: f.DashboardPort = 8080,
    timeout_s: f.TimeoutS = 2.0,
    verbose: f.Verbose = False,
) -> None:
    """Serve a live web map of the swarm: blocks, peers, rounds, throughput, consensus and CE over time."""
    setup_logging(verbose, hivemind=False)  # the URL first; hivemind (and torch) load after it
    with cli_errors():
        if not swarm:
            fail("pass --swarm MULTIADDR (a `multiaddr:` line of `blocktrain run`) or --swarm HOST:PORT", 2)
        if not 0 <= port <= 65535:
            fail(f"--port must be in 0..65535, got {port}", 2)
        from swarmd.membership.addresses import check_peer_addresses
        from swarmd.membership.discovery import is_multiaddr
        from swarmd.tools.dashboard import run_dashboard

        check_peer_addresses(list(swarm))

        def ready(url: str) -> None:
            typer.echo(f"dashboard: {url} (swarm {swarm_id}; Ctrl-C stops)")
            if any(is_multiaddr(a) for a in swarm or []):
                setup_logging(verbose)  # now route hivemind's logs (imports hivemind) before the DHT starts

        asyncio.run(run_dashboard(list(swarm), swarm_id, host, port, timeout_s, ready))
