"""gRPC transport between daemons (the only swarmd package that imports grpc).

- server.py: SwarmServicer delegates swarmd.v1.Swarm to a SwarmHandler (the daemon), maps SwarmdErrors to status
  codes and holds each caller to its budgets.
- hosting.py: start_server() -> SwarmServer: the servicer, grpc.health.v1 and server reflection on one address.
- decoding.py: requests parsed leniently (an undecodable message is INVALID_ARGUMENT, not grpc's INTERNAL).
- status.py: the one table SwarmdError class <-> status code, used by both of the above.
- client.py: PeerClient: channel cache, retry policy via service config, per-call deadlines,
  exchange() on one bidirectional stream (works from behind NAT), forward_session().
- framing.py: one encoded payload as a stream of Payload messages (header, chunks, the sha256 at the end) and
  the receiving side's framing checks.
- auth.py: the swarm key file, the proof of it every RPC carries, and the server's check.
- limits.py: admission limits: payload streams at once and request budgets per caller identity and host.
- tls.py: optional TLS for the server and the channels to it, the certificate pinned by fingerprint.
Payload bytes, codecs and validation live in swarmd.averaging.delta.
"""

from swarmd.transport.client import ForwardSession, PeerClient, error_from_rpc
from swarmd.transport.hosting import SwarmServer, start_server
from swarmd.transport.server import SwarmHandler, SwarmServicer
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
