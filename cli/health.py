"""`blocktrain health ADDRESS`: is the daemon at HOST:PORT serving? (the Docker image's HEALTHCHECK)

Asks the daemon's standard gRPC health service (grpc.health.v1, service swarmd.v1.Swarm) once and
exits 0 when it answers SERVING; 1 with a one-line `error: ...` when it answers anything else
(NOT_SERVING while it shuts down), refuses the connection or does not answer within --timeout-s;
2 for an address that is not HOST:PORT. Loads no torch and no hivemind: it answers in about a second.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from cli import flags as f
from cli.common import cli_errors, fail
from swarmd.errors import ConfigError
from swarmd.membership.addresses import check_peer_address


async def serving_status(address: str, timeout_s: float) -> str:
    from swarmd.transport import PeerClient

    client = PeerClient()
    try:
        return await client.health(address, timeout_s)
    finally:
        await client.close()


def health(
    address: Annotated[str, typer.Argument(help="HOST:PORT of a daemon's gRPC server, e.g. 127.0.0.1:50051.")],
    timeout_s: f.TimeoutS = 3.0,
) -> None:
    """Exit 0 if the daemon at ADDRESS reports SERVING on the gRPC health service, else 1."""
    with cli_errors():
        if check_peer_address(address) != "hostport":
            raise ConfigError(f"health needs the HOST:PORT of a daemon's gRPC server, not a multiaddr: {address}")
        status = asyncio.run(serving_status(address, timeout_s))
        if status != "SERVING":
            fail(f"{address} is {status}", 1)
        typer.echo(status)
