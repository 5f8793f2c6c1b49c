"""Hosting a daemon's gRPC server: start_server() binds swarmd.v1.Swarm (a SwarmServicer over the daemon's
SwarmHandler, requests parsed leniently by swarmd.transport.decoding), grpc.health.v1 (SERVING while up) and
server reflection on one address, with the swarm key's interceptors (swarmd.transport.auth) and TLS when given
(swarmd.transport.tls); SwarmServer is the started server (its port and address, health, stop).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from swarmd.errors import SwarmdError
from swarmd.transport.decoding import lenient
from swarmd.transport.framing import serialize_message
from swarmd.transport.server import MAX_MESSAGE_BYTES, SERVICE_NAME, SwarmHandler, SwarmServicer
from swarmd.transport.status import one_line
from swarmd.v1 import swarm_pb2 as pb

if TYPE_CHECKING:
    from swarmd.transport.auth import OnRefusal

logger = logging.getLogger(__name__)


def add_servicer(servicer: SwarmServicer, server: grpc.aio.Server) -> None:
    """pb_grpc.add_SwarmServicer_to_server, with requests parsed leniently (undecodable -> INVALID_ARGUMENT)."""
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["Swarm"].methods:
        request_cls, reply_cls = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        handlers[method.name] = kinds[(method.client_streaming, method.server_streaming)](
            getattr(servicer, method.name),
            request_deserializer=lenient(request_cls),
            response_serializer=serialize_message if reply_cls is pb.Payload else reply_cls.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class SwarmServer:
    """A started server: `.port`, `.address` ("host:port") and `await stop(grace_s)`."""

    def __init__(self, server: grpc.aio.Server, health_servicer: health.aio.HealthServicer, host: str, port: int):
        self._server, self._health = server, health_servicer
        self.host, self.port = host, port
        self.address = format_address(host, port)

    async def set_serving(self, serving: bool) -> None:
        """grpc.health.v1 SERVING or NOT_SERVING (the swarm service and the server as a whole)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in (SERVICE_NAME, ""):
            await self._health.set(service, status)

    async def stop(self, grace_s: float = 1.0) -> None:
        """Report NOT_SERVING, let in-flight calls finish for up to grace_s seconds, then close."""
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_s)

    async def wait_for_termination(self, timeout_s: float | None = None) -> bool:
        return await self._server.wait_for_termination(timeout_s)


# calls one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): more wait in the caller's
# channel at no cost to us; with server.TARPIT_S it bounds the refusals a caller past its budget gets a second
MAX_CONCURRENT_STREAMS = 32


def server_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),  # port 0 must give this server its own port
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


async def start_server(
    handler: SwarmHandler,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    swarm_key: bytes | None = None,
    tls: tuple[bytes, bytes] | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    on_refusal: OnRefusal | None = None,
    **limits: Any,
) -> SwarmServer:
    """Start swarmd.v1.Swarm + health + reflection on host:port (0 = an ephemeral port).

    :param swarm_key: a private swarm's key: every call but health checks must prove it (swarmd.transport.auth)
    :param tls: (certificate PEM, private key PEM): serve TLS only (swarmd.transport.tls); None = plaintext
    :param max_message_bytes: gRPC per-message limit both ways (Forward activations), in bytes
    :param on_refusal: with a swarm key, called with the error of every call refused for its proof
    :param limits: SwarmServicer's keyword arguments (max_payload_bytes, max_chunk_bytes, payload_limit, streams,
        forward_rate, payload_timeout_s, callers, requests, pulls: what callers may send and hold)
    :raises SwarmdError: the address cannot be bound
    """
    from swarmd.transport.auth import server_interceptors
    from swarmd.transport.tls import add_port

    interceptors = server_interceptors(swarm_key, on_refusal)
    server = grpc.aio.server(options=server_options(max_message_bytes), interceptors=interceptors)
    servicer = SwarmServicer(handler, **limits)
    add_servicer(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    try:
        bound = add_port(server, format_address(host, port), tls)
    except RuntimeError as exc:
        raise SwarmdError(f"cannot listen on {format_address(host, port)}: {one_line(exc)}") from None
    if not bound:
        raise SwarmdError(f"cannot listen on {format_address(host, port)}: the address is in use or invalid")
    await server.start()
    await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    logger.info("gRPC server listening on %s", format_address(host, bound))
    return SwarmServer(server, health_servicer, host, bound)
