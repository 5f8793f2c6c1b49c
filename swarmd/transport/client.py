"""gRPC client of the swarm: PeerClient dials peers and turns RPC failures into SwarmdErrors.

Owns one grpc.aio channel per address (cached until close), the retry policy (service config
retryPolicy for UNAVAILABLE, no Python retry loops), per-call deadlines, and fast failure: a refused
or unknown address fails within about a second with a message that names the cause (wait_for_ready
on a fresh channel only when asked for). exchange() sends our payload and reads the peer's on the same
bidirectional stream, so a peer behind NAT (client mode) can gossip without accepting
connections. Picking another peer after a failure is gossip's job, not this module's.
Runs on the caller's asyncio loop; starts no threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from swarmd.errors import DeadlineExceeded, SwarmdError, ValidationError
from swarmd.transport import framing
from swarmd.transport.auth import CallSigner, call_metadata, default_swarm_key
from swarmd.transport.framing import Encoded
from swarmd.transport.server import MAX_MESSAGE_BYTES, SERVICE_NAME
from swarmd.transport.status import class_tag, error_for
from swarmd.transport.tls import fetch_pinned_cert, pinned_credentials
from swarmd.v1 import swarm_pb2 as pb
from swarmd.v1 import swarm_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

SERVICE_CONFIG = {
    "methodConfig": [
        {
            "name": [{"service": SERVICE_NAME}],
            "retryPolicy": {
                "maxAttempts": 4,
                "initialBackoff": "0.1s",
                "maxBackoff": "1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ]
}


# why a channel could not connect, as grpc's details say it (lower case) -> the cause a message leads with
CONNECT_FAILURES = (
    ("connection refused", "connection refused (is a daemon listening there?)"),
    ("domain name not found", "unknown host"),
    ("dns resolution failed", "unknown host"),
    ("no route to host", "no route to host"),
    ("network is unreachable", "network is unreachable"),
    ("connection timed out", "connection timed out"),
)


def error_from_rpc(address: str, exc: grpc.RpcError) -> SwarmdError:
    """The SwarmdError for a failed call, with a one-line message naming the peer and the code.

    The class is the one the peer raised when it named it (swarmd.transport.status), else the
    default class of the status code: ValidationError, ConfigMismatch, NotFound, Busy,
    DeadlineExceeded, PeerUnavailable, or PeerFailed (the last five are PeerUnavailables).
    """
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = " ".join(str(exc.details() if hasattr(exc, "details") else exc).split())
    tag = class_tag(exc.trailing_metadata()) if hasattr(exc, "trailing_metadata") else ""
    cause = next((name for text, name in CONNECT_FAILURES if text in details.lower()), "")
    if code == grpc.StatusCode.UNAVAILABLE and cause:  # never connected: say why first
        return error_for(code, f"peer {address}: unavailable: {cause}", tag)
    return error_for(code, f"peer {address}: {code.name.lower()}: {details or 'no details'}", tag)


class ByteMeter(Protocol):
    """Where a PeerClient reports the payload bytes it moves (swarmd.metrics.Metrics is one)."""

    def add_sent(self, wire_bytes: int, raw_bytes: int = 0) -> None: ...

    def add_received(self, wire_bytes: int, raw_bytes: int = 0) -> None: ...


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, object]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # a connection of this client's own, never one another client in the process shares (daemons in one
        # process, as in tests, then call as separate processes do; a server's stream cap is per connection)
        ("grpc.use_local_subchannel_pool", 1),
    ]


class ForwardSession:
    """One bidirectional Forward stream to a peer: one request, one reply per step, in order.

    The stream opens on the first step. A failed or timed-out step cancels the stream; the next
    step opens a new one (the peer's KV cache for the session is then gone: start_position 0).
    """

    def __init__(self, client: PeerClient, address: str, step_timeout_s: float):
        self.client, self.address, self.step_timeout_s = client, address, step_timeout_s
        self._call: grpc.aio.StreamStreamCall | None = None
        self._lock = asyncio.Lock()  # one step in flight: replies pair with requests by order

    async def step(self, request: pb.ForwardRequest, timeout_s: float | None = None) -> pb.ForwardReply:
        """Send one request and wait at most timeout_s (default step_timeout_s) for its reply.

        Concurrent steps on one session run one after the other. A step cancelled from outside
        drops the stream, so a late reply can never be paired with a later request.
        """
        async with self._lock:
            return await self._step(request, timeout_s)

    async def _step(self, request: pb.ForwardRequest, timeout_s: float | None) -> pb.ForwardReply:
        if self._call is None:
            stub, fresh = self.client._stub(self.address)
            self._call = stub.Forward(wait_for_ready=fresh, metadata=self.client._auth(self.address, "Forward"))
        call = self._call
        try:
            async with asyncio.timeout(timeout_s if timeout_s is not None else self.step_timeout_s):
                await call.write(request)
                reply = await call.read()
        except TimeoutError:
            self._drop()
            raise DeadlineExceeded(
                f"peer {self.address}: forward step timed out after {timeout_s or self.step_timeout_s:g} s"
            ) from None
        except grpc.RpcError as exc:
            self._drop()
            raise self.client._error(self.address, exc) from None
        except asyncio.InvalidStateError:  # write after the call ended: read its status
            self._drop()
            raise self.client._error(self.address, await _status_error(call)) from None
        except asyncio.CancelledError:
            self._drop()
            raise
        if reply is grpc.aio.EOF:
            self._drop()
            raise self.client._error(self.address, await _status_error(call)) from None
        self.client._mark_used(self.address)
        return reply

    def _drop(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def close(self) -> None:
        """Half-close the stream and let the peer finish it (cancel after a short wait)."""
        call, self._call = self._call, None
        if call is None:
            return
        try:
            async with asyncio.timeout(1.0):
                await call.done_writing()
                await call.code()
        except (TimeoutError, grpc.RpcError, asyncio.InvalidStateError):
            call.cancel()


async def _status_error(call) -> grpc.RpcError:
    """An RpcError-like object carrying the final status of a finished call."""
    code, details, metadata = await call.code(), await call.details(), await call.trailing_metadata()
    if code == grpc.StatusCode.OK:
        return _Status(grpc.StatusCode.UNAVAILABLE, details or "stream ended early")
    return _Status(code, details or "stream ended early", metadata)


class _Status(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, metadata=()):
        self._code, self._details, self._metadata = code, details, metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self):
        return self._metadata


class PeerClient:
    """Calls to peers, one cached channel per address; every call takes a deadline in seconds.

    :param max_payload_bytes: largest payload accepted from a peer, in bytes
    :param max_chunk_bytes: chunk size sent, and the largest chunk accepted, in bytes
    :param wait_for_ready: on a fresh channel, wait (within the call's deadline) for a peer that is
        not listening yet; off (default), a refused or unresolvable address fails at once with its
        cause (the retry policy still retries UNAVAILABLE a few times, within about a second)
    :param meter: gets the wire bytes of every payload exchange() and pull_state() move (and the
        fp32 size their headers declare); the client keeps no counters of its own
    :param payload_limit: the largest payload admitted for a header (the exact size its kind has under
        our config); settable later (`client.payload_limit = ...`), None = max_payload_bytes only
    :param signer: signs every call with the caller's identity (a daemon's Identity; the servers key their budgets
        by the peer id it proves, swarmd.transport.auth.CallerCheck), bound to the callee's peer id (bind()): a call
        to an address with no peer id bound proves no identity; settable later; None = calls prove no identity
    :note: create and use it on one asyncio loop; close() it before the loop ends.
    """

    def __init__(
        self,
        *,
        max_payload_bytes: int = framing.DEFAULT_MAX_PAYLOAD_BYTES,
        max_chunk_bytes: int = framing.MAX_CHUNK_BYTES,
        swarm_key: bytes | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        meter: ByteMeter | None = None,
        wait_for_ready: bool = False,
        payload_limit: framing.PayloadLimit | None = None,
        signer: CallSigner | None = None,
    ):
        self.signer = signer
        self.max_payload_bytes, self.max_chunk_bytes, self.meter = max_payload_bytes, max_chunk_bytes, meter
        self.payload_limit = payload_limit
        self.wait_for_ready = wait_for_ready
        # a private swarm's key: every call carries a fresh proof of it (swarmd.transport.auth)
        self.swarm_key = swarm_key if swarm_key is not None else default_swarm_key()
        # address -> (fingerprint, certificate PEM) its signed record pins: dial TLS
        self._pins: dict[str, tuple[str, bytes]] = {}
        # address -> the peer id its signed record places there: our identity proofs to it are signed for that peer
        self._callees: dict[str, str] = {}
        self._options = channel_options(max_message_bytes)
        self._channels: dict[str, tuple[grpc.aio.Channel, pb_grpc.SwarmStub]] = {}
        self._fresh: set[str] = set()

    def channel(self, address: str) -> grpc.aio.Channel:
        """The cached channel to address (dialled lazily on first use)."""
        if address not in self._channels:
            pinned = self._pins.get(address)
            if pinned is not None:
                creds, name = pinned_credentials(pinned[1])
                channel = grpc.aio.secure_channel(address, creds, options=self._options + name)
            else:
                channel = grpc.aio.insecure_channel(address, options=self._options)
            self._channels[address] = (channel, _payload_stub(channel))
            self._fresh.add(address)
        return self._channels[address][0]

    async def pin(self, address: str, fingerprint: str) -> None:
        """Dial address over TLS from now on, trusting only the certificate whose sha256 is `fingerprint`
        (from the peer's signed record); the certificate is fetched and checked once.

        :raises ValidationError: the peer presents another certificate; PeerUnavailable: no TLS answer
        """
        if address in self._pins and fingerprint == self._pins[address][0]:
            return
        self._pins[address] = (fingerprint, await fetch_pinned_cert(address, fingerprint))
        await self.forget(address, keep_pin=True)

    def bind(self, address: str, peer_id: str) -> None:
        """Sign our calls to address for peer_id (the peer a valid signed record places there), so a proof that peer
        received is worth nothing at any other; until then calls to address prove no identity."""
        if peer_id:
            self._callees[address] = peer_id
        else:
            self._callees.pop(address, None)

    def callee(self, address: str) -> str:
        """The peer id our calls to address are signed for ("" = none bound: they prove no identity)."""
        return self._callees.get(address, "")

    def _auth(self, address: str, method: str) -> tuple[tuple[str, str], ...] | None:
        """Metadata proving the swarm key (private swarms) and our identity (with a signer, to a bound callee) for one
        call of `method` to address."""
        return call_metadata(self.swarm_key, self.signer, f"/{SERVICE_NAME}/{method}", self.callee(address))

    def _stub(self, address: str) -> tuple[pb_grpc.SwarmStub, bool]:
        self.channel(address)
        return self._channels[address][1], self.wait_for_ready and address in self._fresh

    def _mark_used(self, address: str) -> None:
        """The peer answered once: later calls fail fast instead of waiting for it to come up."""
        self._fresh.discard(address)

    def _error(self, address: str, exc: grpc.RpcError) -> SwarmdError:
        if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            self._mark_used(address)  # the peer itself answered with this status
        return error_from_rpc(address, exc)

    async def forget(self, address: str, keep_pin: bool = False) -> None:
        """Close and drop the channel to address (e.g. the peer left)."""
        if not keep_pin:
            self._pins.pop(address, None)
            self._callees.pop(address, None)
        entry = self._channels.pop(address, None)
        self._fresh.discard(address)
        if entry is not None:
            await entry[0].close()

    async def close(self) -> None:
        for address in list(self._channels):
            await self.forget(address)

    async def _unary(self, address: str, method: str, request, timeout_s: float):
        stub, fresh = self._stub(address)
        try:
            reply = await getattr(stub, method)(
                request, timeout=timeout_s, wait_for_ready=fresh, metadata=self._auth(address, method)
            )
        except grpc.RpcError as exc:
            raise self._error(address, exc) from None
        self._mark_used(address)
        return reply

    async def status(self, address: str, timeout_s: float = 5.0) -> pb.PeerStatus:
        return await self._unary(address, "GetStatus", pb.StatusRequest(), timeout_s)

    async def dial_back(self, address: str, request: pb.DialBackRequest, timeout_s: float = 6.0) -> pb.DialBackReply:
        """Ask the peer at address to dial us back (DialBack): at our host as it sees us, at request.port."""
        return await self._unary(address, "DialBack", request, timeout_s)

    async def health(self, address: str, timeout_s: float = 3.0, service: str = SERVICE_NAME) -> str:
        """The grpc.health.v1 status of a service at address: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN", ...

        :raises PeerUnavailable: nothing answers there (refused, unknown host) or not within timeout_s
        """
        stub = health_pb2_grpc.HealthStub(self.channel(address))
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # the server runs, the service is not registered
                return "SERVICE_UNKNOWN"
            raise self._error(address, exc) from None
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    async def swarm_config(self, address: str, timeout_s: float = 5.0) -> pb.SwarmConfig:
        return await self._unary(address, "GetConfig", pb.ConfigRequest(), timeout_s)

    async def pull_state(self, address: str, request: pb.PullStateRequest, timeout_s: float = 60.0) -> Encoded:
        """Download a block or embedding state (framing checked; decode() it to validate)."""
        stub, fresh = self._stub(address)
        metadata = self._auth(address, "PullState")
        call = stub.PullState(request, timeout=timeout_s, wait_for_ready=fresh, metadata=metadata)
        enc = await self._read(address, call)
        if self.meter is not None:
            self.meter.add_received(enc.wire_bytes, enc.raw_bytes)
        return enc

    async def exchange(self, address: str, outgoing: Encoded, timeout_s: float = 30.0) -> Encoded:
        """Stream our payload to the peer and read its answer on the same stream.

        :param timeout_s: deadline of the whole exchange, sending and receiving, in seconds
        :raises PeerRejected: the peer refused our payload (a ValidationError subclass);
            PeerUnavailable: unreachable or deadline; ValidationError: its answer is malformed
        """
        stub, fresh = self._stub(address)
        chunk = self.max_chunk_bytes

        async def requests():
            for msg in framing.wire_messages(outgoing, chunk):
                yield msg

        call = stub.ExchangeDeltas(
            requests(), timeout=timeout_s, wait_for_ready=fresh, metadata=self._auth(address, "ExchangeDeltas")
        )
        reply = await self._read(address, call)
        if self.meter is not None:
            self.meter.add_sent(outgoing.wire_bytes, outgoing.raw_bytes)
            self.meter.add_received(reply.wire_bytes, reply.raw_bytes)
        return reply

    async def _read(self, address: str, call) -> Encoded:
        """Read one payload from a response stream; cancel the call on any failure."""
        try:
            enc = await framing.read_payload(
                _responses(call), self.max_payload_bytes, self.max_chunk_bytes, self.payload_limit
            )
        except grpc.RpcError as exc:
            raise self._error(address, exc) from None
        except ValidationError as exc:
            call.cancel()
            self._mark_used(address)
            raise type(exc)(f"peer {address}: {exc}") from None
        except BaseException:
            call.cancel()
            raise
        self._mark_used(address)
        return enc

    def forward_session(self, address: str, step_timeout_s: float = 30.0) -> ForwardSession:
        """A Forward stream to address; each step() waits at most step_timeout_s for its reply."""
        return ForwardSession(self, address, step_timeout_s)


def _payload_stub(channel: grpc.aio.Channel) -> pb_grpc.SwarmStub:
    """The generated stub, with the Payload streams (de)serialized by framing (chunks without protobuf copies)."""
    stub = pb_grpc.SwarmStub(channel)
    stub.ExchangeDeltas = channel.stream_stream(
        f"/{SERVICE_NAME}/ExchangeDeltas",
        request_serializer=framing.serialize_message,
        response_deserializer=framing.parse_message,
    )
    stub.PullState = channel.unary_stream(
        f"/{SERVICE_NAME}/PullState",
        request_serializer=pb.PullStateRequest.SerializeToString,
        response_deserializer=framing.parse_message,
    )
    return stub


async def _responses(call):
    """Response messages of a streaming call; a stream that ends with an error raises it."""
    while True:
        msg = await call.read()
        if msg is grpc.aio.EOF:
            code = await call.code()
            if code != grpc.StatusCode.OK:
                raise _Status(code, await call.details(), await call.trailing_metadata())
            return
        yield msg
