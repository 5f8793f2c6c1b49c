"""A real swarmd.v1 server on 127.0.0.1:0 with a fake handler, driven by a real PeerClient."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from swarmd.averaging.delta import decode, encode, shapes_of
from swarmd.errors import (
    Busy,
    ConfigMismatch,
    NotFound,
    NotReady,
    PeerFailed,
    PeerRejected,
    PeerUnavailable,
    SessionMissing,
    StaleRound,
    SwarmdError,
    ValidationError,
    WrongBlock,
)
from swarmd.metrics import Metrics
from swarmd.protocol import PROTOCOL, PayloadKind, PeerState
from swarmd.transport import PeerClient, error_for, start_server, status_code_for
from swarmd.v1 import swarm_pb2 as pb
from swarmd.wire import from_proto, to_proto

META = dict(swarm_id="swarm-t", config_hash="cfg1", kind="block_delta", block_index=0)
SHAPES = {"w": (32, 16), "b": (16,)}


def delta(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) * 1e-2 for name, shape in SHAPES.items()}


class FakeHandler:
    """Answers exchanges with its own int8 delta; records what it accepted."""

    def __init__(self):
        self.own = delta(100)
        self.received: list[dict[str, torch.Tensor]] = []
        self.exchange_error: Exception | None = None
        self.hang = False
        self.entered = asyncio.Event()

    def status(self) -> pb.PeerStatus:
        return pb.PeerStatus(
            peer_id="peer-b", block_index=0, state=PeerState.TRAINING.to_pb(), round=3, swarm_id=META["swarm_id"]
        )

    def swarm_config(self) -> pb.SwarmConfig:
        return pb.SwarmConfig(swarm_id=META["swarm_id"], config_hash=META["config_hash"], protocol=PROTOCOL)

    async def pull_state(self, request: pb.PullStateRequest):
        if request.config_hash != META["config_hash"]:
            raise ConfigMismatch(f"this swarm runs config {META['config_hash']}, not {request.config_hash}")
        if request.kind != PayloadKind.BLOCK_STATE.to_pb():
            raise NotFound(f"no state of kind {request.kind!r} here")
        state = {"w": torch.arange(4096, dtype=torch.float32).reshape(64, 64)}
        return encode(state, "fp32", **{**META, "kind": "block_state"})

    async def exchange(self, incoming):
        self.entered.set()
        if self.hang:
            await asyncio.Event().wait()
        if self.exchange_error is not None:
            raise self.exchange_error
        self.received.append(decode(incoming, SHAPES, **META))  # ValidationError -> reject
        return encode(self.own, "int8", **META, peer_id="peer-b")

    async def forward(self, request: pb.ForwardRequest) -> pb.ForwardReply:
        if request.session_id == "hang":
            await asyncio.Event().wait()
        if request.session_id == "gone":
            raise SessionMissing("session gone: re-send the prefix from position 0")
        if request.config_hash != META["config_hash"]:
            raise ValidationError(f"forward request for config {request.config_hash!r}")
        z = from_proto(request.z)
        return pb.ForwardReply(z=to_proto(z * 2 + request.step_index), peer_id="peer-b")


def with_peer(body, handler=None, client_kw=None, **server_kw):
    """Run body(client, server, handler) against a fresh server; always stop both."""

    async def main():
        h = handler or FakeHandler()
        server = await start_server(h, **server_kw)
        client = PeerClient(**(client_kw or {}))
        try:
            return await body(client, server, h)
        finally:
            await client.close()
            await server.stop(0)

    return asyncio.run(main())


def test_status_and_config():
    async def body(client, server, h):
        assert server.port > 0 and server.address == f"127.0.0.1:{server.port}"
        status = await client.status(server.address, timeout_s=5)
        config = await client.swarm_config(server.address, timeout_s=5)
        assert (status.peer_id, status.round, PeerState.from_pb(status.state)) == ("peer-b", 3, "training")
        assert config.config_hash == META["config_hash"] and config.protocol == "swarmd.v1"

    with_peer(body)


def test_exchange_both_ways():
    """The caller runs no server (client mode): both deltas travel on the stream it dialled."""
    mine = delta(1)

    async def body(client, server, h):
        out = encode(mine, "int8", **META, peer_id="peer-a")
        reply = await client.exchange(server.address, out, timeout_s=10)
        assert reply.header.peer_id == "peer-b"
        theirs = decode(reply, SHAPES, **META)
        expect = decode(encode(h.own, "int8", **META), SHAPES, **META)
        assert all(torch.equal(theirs[k], expect[k]) for k in SHAPES)
        assert len(h.received) == 1
        sent = decode(out, SHAPES, **META)
        assert all(torch.equal(h.received[0][k], sent[k]) for k in SHAPES)
        assert meter.bytes_sent == out.wire_bytes and meter.bytes_received == reply.wire_bytes

    meter = Metrics()
    with_peer(body, client_kw={"meter": meter})


def test_exchange_of_many_chunks_fp32_is_exact():
    big = {"w": torch.randn(512, 512)}  # 1 MiB raw, 16 KiB chunks

    class Echo(FakeHandler):
        async def exchange(self, incoming):
            return incoming

    async def body(client, server, h):
        reply = await client.exchange(server.address, encode(big, "fp32", **META, zstd=False), timeout_s=20)
        assert torch.equal(decode(reply, shapes_of(big), **META)["w"], big["w"])

    with_peer(body, Echo(), client_kw={"max_chunk_bytes": 16 << 10}, max_chunk_bytes=16 << 10)


def test_pull_state_and_its_errors():
    async def body(client, server, h):
        req = pb.PullStateRequest(
            swarm_id=META["swarm_id"],
            config_hash=META["config_hash"],
            kind=PayloadKind.BLOCK_STATE.to_pb(),
            block_index=0,
        )
        enc = await client.pull_state(server.address, req, timeout_s=10)
        state = decode(enc, {"w": (64, 64)}, **{**META, "kind": "block_state"})
        assert torch.equal(state["w"].flatten(), torch.arange(4096, dtype=torch.float32))
        with pytest.raises(ConfigMismatch, match="failed_precondition: this swarm runs config"):
            await client.pull_state(
                server.address,
                pb.PullStateRequest(config_hash="other", kind=PayloadKind.BLOCK_STATE.to_pb()),
                timeout_s=5,
            )
        with pytest.raises(PeerUnavailable, match="not_found"):
            await client.pull_state(
                server.address,
                pb.PullStateRequest(config_hash=META["config_hash"], kind=PayloadKind.EMBEDDING_STATE.to_pb()),
                timeout_s=5,
            )

    with_peer(body)


def test_a_compact_pull_costs_a_quarter_of_the_pull_budget():
    """A later block pulls its predecessors compact (int8) several times a round: each costs COMPACT_PULL_COST of the
    caller's pull budget, a full state one unit, so a burst of 2 admits 8 compact pulls or 2 full ones."""
    from swarmd.transport.limits import CallerBudget
    from swarmd.transport.server import COMPACT_PULL_COST

    assert COMPACT_PULL_COST == 0.25

    def pulls(n: int, compact: bool):
        async def body(client, server, h):
            request = pb.PullStateRequest(
                config_hash=META["config_hash"], kind=PayloadKind.BLOCK_STATE.to_pb(), compact=compact
            )
            for _ in range(n):
                await client.pull_state(server.address, request, timeout_s=5)
            with pytest.raises(Busy, match="over its rate"):
                await client.pull_state(server.address, request, timeout_s=5)
            return True

        return body

    for n, compact in ((8, True), (2, False)):
        assert with_peer(pulls(n, compact), pulls=CallerBudget.of(rate=0.001, burst=2, host_shares=1))


def test_a_caller_past_its_budget_gets_its_refusals_late_and_a_connection_s_worth_at_a_time():
    """A refusal for a budget is answered server.TARPIT_S late, and a connection carries at most
    hosting.MAX_CONCURRENT_STREAMS calls at once, so 3x that many calls past the budget take at least 3 tarpits (in
    waves), each at least one; another identity's call meanwhile is answered."""
    from swarmd.membership.identity import Identity, verify
    from swarmd.transport.auth import CallerCheck, new_swarm_key, parse_swarm_key
    from swarmd.transport.hosting import MAX_CONCURRENT_STREAMS
    from swarmd.transport.limits import CallerBudget
    from swarmd.transport.server import TARPIT_S

    key = parse_swarm_key(new_swarm_key())
    flooder, honest, callee = Identity.generate(), Identity.generate(), Identity.generate().peer_id

    async def timed(client: PeerClient, address: str) -> tuple[float, BaseException | None]:
        start = time.monotonic()
        try:
            await client.status(address, timeout_s=30)
            return time.monotonic() - start, None
        except Busy as exc:
            return time.monotonic() - start, exc

    async def main():
        budget = CallerBudget.of(rate=0.001, burst=1, host_shares=4)
        server = await start_server(FakeHandler(), swarm_key=key, callers=CallerCheck(verify, callee), requests=budget)
        flood, other = PeerClient(swarm_key=key, signer=flooder), PeerClient(swarm_key=key, signer=honest)
        for c in (flood, other):
            c.bind(server.address, callee)
        try:
            await flood.status(server.address)  # its one call within budget
            start = time.monotonic()
            calls = [asyncio.create_task(timed(flood, server.address)) for _ in range(3 * MAX_CONCURRENT_STREAMS)]
            await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)  # the first wave's refusals are in
            answered = await other.status(server.address, timeout_s=30)  # ... while the next waves are held
            return await asyncio.gather(*calls), time.monotonic() - start, answered
        finally:
            await flood.close()
            await other.close()
            await server.stop(0)

    refused, took, answered = asyncio.run(main())
    assert answered.peer_id == FakeHandler().status().peer_id  # another identity is answered meanwhile
    assert all(isinstance(exc, Busy) and seconds >= TARPIT_S * 0.9 for seconds, exc in refused)
    assert took >= 3 * TARPIT_S * 0.9  # in waves of one connection's streams, not all at once


def test_handler_validation_error_reaches_the_client():
    async def body(client, server, h):
        bad = encode(delta(2), "fp32", **{**META, "config_hash": "wrong"})
        with pytest.raises(PeerRejected, match="config hash 'wrong'"):
            await client.exchange(server.address, bad, timeout_s=10)
        h.exchange_error = ValidationError("delta of round 7 arrived in round 9")
        with pytest.raises(ValidationError, match="round 7"):
            await client.exchange(server.address, encode(delta(2), "fp32", **META), timeout_s=10)
        h.exchange_error = ConfigMismatch("other model")
        with pytest.raises(ConfigMismatch, match="other model"):
            await client.exchange(server.address, encode(delta(2), "fp32", **META), timeout_s=10)
        h.exchange_error = Busy("already exchanging")
        with pytest.raises(PeerUnavailable, match="resource_exhausted"):
            await client.exchange(server.address, encode(delta(2), "fp32", **META), timeout_s=10)
        assert h.received == []

    with_peer(body)


def test_oversize_payload_is_refused_both_ways():
    big = {"w": torch.randn(256, 256)}

    class Echo(FakeHandler):
        async def exchange(self, incoming):
            return incoming

    async def body(client, server, h):
        with pytest.raises(PeerRejected, match="exceeds the limit"):
            await client.exchange(server.address, encode(big, "fp32", **META, zstd=False), timeout_s=10)
        small = PeerClient(max_payload_bytes=64 << 10)
        try:
            ok = encode({"w": torch.randn(200, 200)}, "fp32", **META, zstd=False)  # 160 KB each way
            with pytest.raises(ValidationError, match="exceeds the limit"):
                await small.exchange(server.address, ok, timeout_s=10)
        finally:
            await small.close()

    with_peer(body, Echo(), max_payload_bytes=200 << 10)


def test_hung_handler_hits_the_client_deadline():
    async def body(client, server, h):
        h.hang = True
        await client.status(server.address, timeout_s=5)  # channel is up: no wait_for_ready now
        start = time.monotonic()
        with pytest.raises(PeerUnavailable, match="deadline_exceeded"):
            await client.exchange(server.address, encode(delta(3), "fp32", **META), timeout_s=0.5)
        elapsed = time.monotonic() - start
        assert h.entered.is_set()
        assert 0.45 <= elapsed < 2.0, elapsed

    with_peer(body)


def test_unreachable_peer_fails_by_its_deadline():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"

    async def main():
        client = PeerClient()
        try:
            start = time.monotonic()
            with pytest.raises(PeerUnavailable, match=address):
                await client.status(address, timeout_s=0.5)
            assert time.monotonic() - start < 3.0
        finally:
            await client.close()

    asyncio.run(main())


def test_forward_session_steps_and_recovers():
    async def body(client, server, h):
        session = client.forward_session(server.address, step_timeout_s=5)
        z = torch.randn(1, 4, 8)
        for step_index in range(3):
            req = pb.ForwardRequest(
                session_id="s1", config_hash=META["config_hash"], z=to_proto(z), step_index=step_index
            )
            reply = await session.step(req)
            assert torch.equal(from_proto(reply.z), z * 2 + step_index)
        with pytest.raises(ValidationError, match="forward request for config"):
            await session.step(pb.ForwardRequest(session_id="s1", config_hash="x", z=to_proto(z)))
        reply = await session.step(pb.ForwardRequest(session_id="s1", config_hash=META["config_hash"], z=to_proto(z)))
        assert torch.equal(from_proto(reply.z), z * 2)
        await session.close()

        hung = client.forward_session(server.address)
        start = time.monotonic()
        with pytest.raises(PeerUnavailable, match="timed out"):
            await hung.step(pb.ForwardRequest(session_id="hang", z=to_proto(z)), timeout_s=0.3)
        assert time.monotonic() - start < 2.0
        await hung.close()

    with_peer(body)


def test_health_serving_and_reflection():
    async def body(client, server, h):
        channel = client.channel(server.address)
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "swarmd.v1.Swarm"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5, wait_for_ready=True)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        names = [s.name async for r in call for s in r.list_services_response.service]
        assert "swarmd.v1.Swarm" in names and "grpc.health.v1.Health" in names

    with_peer(body)


def test_status_code_mapping():
    assert status_code_for(ValidationError("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_code_for(PeerRejected("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_code_for(ConfigMismatch("x")) == grpc.StatusCode.FAILED_PRECONDITION
    assert status_code_for(NotFound("x")) == grpc.StatusCode.NOT_FOUND
    assert status_code_for(Busy("x")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_code_for(TimeoutError()) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert status_code_for(RuntimeError("bug")) == grpc.StatusCode.INTERNAL

    class Gone(SwarmdError):
        status = "NOT_FOUND"

    assert status_code_for(Gone("x")) == grpc.StatusCode.NOT_FOUND


def test_the_client_raises_the_class_the_server_raised():
    async def body(client, server, h):
        for raised in (WrongBlock("block 3 is not here"), NotReady("still starting"), StaleRound("round 7")):
            h.exchange_error = raised
            with pytest.raises(type(raised)) as info:
                await client.exchange(server.address, encode(delta(2), "fp32", **META), timeout_s=10)
            assert type(info.value) is type(raised) and str(raised) in str(info.value)
        session = client.forward_session(server.address, step_timeout_s=5)
        with pytest.raises(SessionMissing, match="invalid_argument: session gone"):
            await session.step(pb.ForwardRequest(session_id="gone", z=to_proto(torch.ones(1, 1, 2))))
        await session.close()
        h.exchange_error = RuntimeError("a bug")
        with pytest.raises(PeerFailed, match="internal"):
            await client.exchange(server.address, encode(delta(2), "fp32", **META), timeout_s=10)

    with_peer(body)


def test_a_class_tag_must_match_its_status():
    assert type(error_for(grpc.StatusCode.NOT_FOUND, "x", "WrongBlock")) is WrongBlock
    assert type(error_for(grpc.StatusCode.NOT_FOUND, "x", "SessionMissing")) is NotFound  # tag of another status
    assert type(error_for(grpc.StatusCode.NOT_FOUND, "x", "NoSuchClass")) is NotFound
    assert type(error_for(grpc.StatusCode.INTERNAL, "x", "SwarmdError")) is PeerFailed
    assert type(error_for(grpc.StatusCode.UNAVAILABLE, "x")) is PeerUnavailable
    assert issubclass(WrongBlock, PeerUnavailable) and issubclass(NotReady, PeerUnavailable)


def test_listening_on_a_taken_port_is_a_clear_error():
    async def body(client, server, h):
        with pytest.raises(SwarmdError, match="cannot listen"):
            await start_server(FakeHandler(), port=server.port)

    with_peer(body)


def test_peer_dying_mid_exchange_fails_fast():
    async def main():
        h = FakeHandler()
        h.hang = True
        server = await start_server(h)
        client = PeerClient()
        try:
            await client.status(server.address, timeout_s=5)
            task = asyncio.create_task(client.exchange(server.address, encode(delta(4), "fp32", **META), timeout_s=20))
            await h.entered.wait()
            start = time.monotonic()
            await server.stop(0)
            with pytest.raises(PeerUnavailable, match="unavailable"):
                await task
            assert time.monotonic() - start < 5.0  # retries back off ~0.7 s, far from the 20 s deadline
        finally:
            await client.close()
            await server.stop(0)

    asyncio.run(main())


def test_cancelled_forward_step_never_pairs_a_late_reply():
    async def body(client, server, h):
        session = client.forward_session(server.address, step_timeout_s=5)
        z = torch.ones(1, 2, 4)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(session.step(pb.ForwardRequest(session_id="hang", z=to_proto(z))), 0.2)
        req = pb.ForwardRequest(session_id="s2", config_hash=META["config_hash"], z=to_proto(z), step_index=5)
        reply = await session.step(req)  # a fresh stream: the hung request's reply can never arrive here
        assert torch.equal(from_proto(reply.z), z * 2 + 5)
        await session.close()

    with_peer(body)


def test_a_signed_call_proves_its_caller_next_to_the_swarm_key_proof():
    """A PeerClient with a signer proves its identity on every call (beside a private swarm's key proof): the
    server budgets it by that peer id, so one identity over its budget leaves another on the same host its calls."""
    from swarmd.membership.identity import Identity, verify
    from swarmd.transport.auth import CallerCheck, new_swarm_key, parse_swarm_key
    from swarmd.transport.limits import CallerBudget

    key = parse_swarm_key(new_swarm_key())
    a, b, callee = Identity.generate(), Identity.generate(), Identity.generate().peer_id

    async def main():
        budget = CallerBudget.of(rate=0.01, burst=2, host_shares=4)
        callers = CallerCheck(verify, callee)
        server = await start_server(FakeHandler(), swarm_key=key, callers=callers, requests=budget)
        ca, cb = PeerClient(swarm_key=key, signer=a), PeerClient(swarm_key=key)
        ca.bind(server.address, callee)
        cb.bind(server.address, callee)
        try:
            assert (await ca.swarm_config(server.address)).swarm_id == META["swarm_id"]
            await ca.status(server.address)
            with pytest.raises(Busy, match=a.peer_id[-6:]):
                await ca.status(server.address)
            await cb.status(server.address)  # no signer yet: the host's unproven callers' budget
            cb.signer = b
            await cb.status(server.address)  # now b's own budget
            await cb.status(server.address)
            with pytest.raises(Busy, match=b.peer_id[-6:]):
                await cb.status(server.address)
        finally:
            await ca.close()
            await cb.close()
            await server.stop(0)

    asyncio.run(main())
