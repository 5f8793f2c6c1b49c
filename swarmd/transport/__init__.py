"""gRPC transport between daemons (the only swarmd package that imports grpc).

- server.py: start_server() -> SwarmServer; SwarmServicer delegates swarmd.v1.Swarm to a
  SwarmHandler (the daemon) and maps SwarmdErrors to status codes; also serves grpc.health.v1
  and server reflection.
- status.py: the one table SwarmdError class <-> status code, used by both of the above.
- client.py: PeerClient: channel cache, retry policy via service config, per-call deadlines,
  exchange() on one bidirectional stream (works from behind NAT), forward_session().
Payload bytes, codecs and validation live in swarmd.averaging.delta.
"""

from swarmd.transport.client import ForwardSession, PeerClient, error_from_rpc
from swarmd.transport.server import SwarmHandler, SwarmServer, SwarmServicer, start_server
from swarmd.transport.status import error_for, status_code_for

__all__ = [
    "ForwardSession",
    "PeerClient",
    "SwarmHandler",
    "SwarmServer",
    "SwarmServicer",
    "error_for",
    "error_from_rpc",
    "start_server",
    "status_code_for",
]
