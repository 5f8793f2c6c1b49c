"""Bounded resources (issue 9 item 5): stream caps, exact payload admission, payload deadline, Forward rate,
undecodable requests, Forward KV-cache byte bound and range checks; budgets per verified caller identity under a
ceiling per host (issue 21 item 5). Servers are real gRPC on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
import math
import time

import grpc
import pytest
import torch

from swarmd.averaging.delta import encode
from swarmd.errors import Busy, SessionMissing, ValidationError
from swarmd.membership.identity import Identity, verify
from swarmd.serve.serving import BlockServing
from swarmd.transport import PeerClient, start_server
from swarmd.transport.auth import CALLER_HEADER, CallerCheck, make_caller_proof
from swarmd.transport.limits import Caller, CallerBudget, RateLimiter, StreamLimiter, caller_host
from swarmd.v1 import swarm_pb2 as pb
from swarmd.v1 import swarm_pb2_grpc as pb_grpc
from swarmd.wire import to_proto
from tests.swarm_utils import wait_until
from tests.test_inference import CFG, tiny_model
from tests.test_transport import META, FakeHandler, delta


# -- pure limiters ---------------------------------------------------------------------------------------------
def test_caller_host_keys_by_host_not_port():
    assert caller_host("ipv4:127.0.0.1:5555") == "127.0.0.1"
    assert caller_host("ipv6:[::1]:5555") == "::1"
    assert caller_host("unix:/tmp/x") == "unix:/tmp/x"


def test_a_host_ceiling_covers_an_ipv6_hosts_whole_64():
    from swarmd.transport.limits import host_range

    assert host_range("1.2.3.4") == "1.2.3.4" and host_range("unix:/tmp/x") == "unix:/tmp/x"
    assert host_range("2001:db8:1:2:aaaa::1") == host_range("2001:db8:1:2:bbbb::7") == "2001:db8:1:2::/64"
    assert host_range("::ffff:1.2.3.4") == "1.2.3.4"
    lim = StreamLimiter(max_total=10, max_per_caller=2, max_per_identity=1)
    lim.acquire("2001:db8:1:2::1")  # unproven: one identity's slot for the whole /64
    with pytest.raises(Busy, match="per identity"):
        lim.acquire("2001:db8:1:2::2")
    lim.acquire(Caller("2001:db8:1:2::3", "id-a"))
    with pytest.raises(Busy, match="per caller host"):
        lim.acquire(Caller("2001:db8:1:2::4", "id-b"))
    lim.acquire(Caller("2001:db8:1:3::4", "id-b"))  # another /64


def test_stream_limiter_caps_total_and_per_caller_and_releases():
    lim = StreamLimiter(max_total=3, max_per_caller=2)
    lim.acquire("a")
    lim.acquire("a")
    with pytest.raises(Busy, match="per caller"):
        lim.acquire("a")
    lim.acquire("b")
    with pytest.raises(Busy, match="limit 3"):
        lim.acquire("c")
    lim.release("a")
    lim.acquire("c")
    assert lim.total == 3 and lim.refused == 2 and lim.by_caller == {"a": 1, "b": 1, "c": 1}
    for caller in ("a", "b", "c"):
        lim.release(caller)
    assert lim.total == 0 and lim.by_caller == {}


def test_rate_limiter_is_a_token_bucket_per_caller():
    now = [0.0]
    lim = RateLimiter(rate=2.0, burst=3.0, clock=lambda: now[0])
    for _ in range(3):
        lim.take("a")
    with pytest.raises(Busy, match="rate"):
        lim.take("a")
    lim.take("b")  # another caller has its own bucket
    now[0] = 1.0  # two tokens back
    lim.take("a")
    lim.take("a")
    with pytest.raises(Busy):
        lim.take("a")
    RateLimiter(rate=0).take("x")  # 0 = unlimited


def test_a_forward_request_costs_one_token_per_started_64_kib():
    from swarmd.transport.limits import FORWARD_UNIT_BYTES, forward_cost
    from swarmd.v1 import swarm_pb2 as pb

    small = pb.ForwardRequest(session_id="s")
    assert forward_cost(small) == 1.0 and forward_cost(object()) == 1.0  # unparsed: refused next, costs 1
    big = pb.ForwardRequest(session_id="s", z=pb.Tensor(data=b"x" * (3 * FORWARD_UNIT_BYTES)))
    assert forward_cost(big) == 4.0  # 3 units of data + the header's few bytes: 4 started units
    bomb = pb.ForwardRequest(z=pb.Tensor(shape=[64, 1024, 64], data=b"tiny zstd frame", zstd=True))
    assert forward_cost(bomb) == 257.0  # compression buys nothing: 64 x 1024 x 64 fp32 = 16 MiB + the header
    lim = RateLimiter(rate=1.0, burst=5.0, clock=lambda: 0.0)
    lim.take("a", forward_cost(big))
    with pytest.raises(Busy):
        lim.take("a", forward_cost(big))  # 1 token left: a second big request waits, a small one passes
    lim.take("a", forward_cost(small))


# -- budgets per identity, under a ceiling per host (issue 21 item 5) -------------------------------------------
FLOODER, HONEST = Caller("10.0.0.1", "id-flooder"), Caller("10.0.0.1", "id-honest")


def test_one_identity_at_its_stream_cap_leaves_the_other_identities_of_its_host_their_slots():
    lim = StreamLimiter(max_total=100, max_per_caller=6, max_per_identity=2)
    lim.acquire(FLOODER)
    lim.acquire(FLOODER)
    with pytest.raises(Busy, match="per identity"):
        lim.acquire(FLOODER)
    assert lim.full(FLOODER) and not lim.full(HONEST)
    lim.acquire(HONEST)  # same host, its own slots
    lim.acquire(HONEST)
    lim.acquire("10.0.0.1")  # the host's unproven callers share one identity's slots
    lim.acquire(Caller("10.0.0.1"))
    with pytest.raises(Busy, match="per identity"):
        lim.acquire("10.0.0.1")
    sybil = Caller("10.0.0.1", "id-sybil")  # a fresh identity is free: the host ceiling still bounds the host
    with pytest.raises(Busy, match="per caller host"):
        lim.acquire(sybil)
    assert lim.by_caller == {"10.0.0.1": 6} and lim.by_identity["id:id-flooder"] == 2
    for c in (FLOODER, FLOODER, HONEST, HONEST, Caller("10.0.0.1"), Caller("10.0.0.1")):
        lim.release(c)
    assert lim.total == 0 and lim.by_caller == {} and lim.by_identity == {}


def test_a_caller_over_its_budget_spends_nothing_of_its_hosts_ceiling():
    now = [0.0]
    b = CallerBudget.of(rate=1.0, burst=3.0, host_shares=2.0, clock=lambda: now[0])  # host: 6 tokens
    for _ in range(3):
        b.take(FLOODER)
    for _ in range(100):  # the flood past its own budget is refused at its own bucket
        with pytest.raises(Busy, match="looder at 10"):
            b.take(FLOODER)
    for _ in range(3):
        b.take(HONEST)  # the host's ceiling still holds the honest identity's share
    with pytest.raises(Busy, match=r"caller host 10\.0\.0\.1"):
        b.take(Caller("10.0.0.1", "id-sybil"))  # a third identity: the host's ceiling (6) is spent
    b.take(Caller("10.0.0.2", "id-sybil"))  # another host has its own ceiling
    assert b.refused == 101
    now[0] = 2.0  # two tokens back for each identity, two for the host
    b.charge(FLOODER, 4.0)  # e.g. a repeated delta: its own debt, nobody else's
    with pytest.raises(Busy):
        b.take(FLOODER)
    b.take(HONEST)
    now[0] = 5.0  # the flooder pays its debt back at its rate: -2 + 3 = 1 token
    assert not b.exhausted(FLOODER)
    b.take(FLOODER)
    assert b.exhausted(FLOODER)
    b.refund(FLOODER)  # refused after all (a stream cap): what it spent comes back
    assert not b.exhausted(FLOODER)


def test_a_bare_rate_limiter_is_a_budget_per_identity_without_a_host_ceiling():
    from swarmd.transport.limits import budget

    b = budget(RateLimiter(rate=0.001, burst=1.0, clock=lambda: 0.0))
    b.take(FLOODER)
    b.take(HONEST)
    with pytest.raises(Busy):
        b.take(FLOODER)
    assert budget(b) is b


def test_only_a_fresh_signed_proof_for_this_method_proves_an_identity():
    me, other, server = Identity.generate(), Identity.generate(), Identity.generate().peer_id
    check = CallerCheck(verify, server)
    method = "/swarmd.v1.Swarm/GetStatus"
    proof = make_caller_proof(me, server, method)
    assert check.peer_id(method, proof) == me.peer_id
    assert check.peer_id(method, proof) == ""  # replayed: unproven (keyed by its host)
    assert check.peer_id("/swarmd.v1.Swarm/PullState", make_caller_proof(me, server, method)) == ""  # another method
    assert check.peer_id(method, make_caller_proof(me, server, method, now=time.time() - 600)) == ""  # stale

    class Claimer:  # claims `me`'s id, signs with its own key
        peer_id = me.peer_id

        def sign(self, data: bytes) -> bytes:
            return other.sign(data)

    assert check.peer_id(method, make_caller_proof(Claimer(), server, method)) == ""
    for bad in ("", None, "v1.x", "v2.a.1.nonce1234.00", f"v2.{me.peer_id}.{server}.1.nonce1234.zz"):
        assert check.peer_id(method, bad) == ""
    assert check.unproven == 7  # calls with no proof at all are not counted
    assert check.of(method, ((CALLER_HEADER, make_caller_proof(other, server, method)),)) == other.peer_id
    claim = ((CALLER_HEADER, make_caller_proof(Claimer(), server, method)),)
    assert CallerCheck.claimed(claim) == me.peer_id and check.of(method, claim) == ""  # named, never proven
    assert CallerCheck.claimed(()) == ""


# -- a real server -----------------------------------------------------------------------------------------------
def _payload():
    return encode(delta(1), "int8", **META, peer_id="peer-a")


def test_a_stream_declaring_more_than_the_config_implies_is_refused_at_once():
    async def go():
        handler = FakeHandler()
        server = await start_server(handler, payload_limit=lambda header: 20_000)
        channel = grpc.aio.insecure_channel(server.address)
        try:
            stub = pb_grpc.SwarmStub(channel)
            header = _payload().header
            header.payload_bytes = 500 << 20  # 500 MiB declared; nothing of it is ever sent

            async def requests():
                yield pb.Payload(header=header)
                await asyncio.Event().wait()  # keep the stream open, like the attacker

            started = time.monotonic()
            call = stub.ExchangeDeltas(requests(), timeout=10)
            first = await call.read()
            elapsed = time.monotonic() - started
            call.cancel()
            return first, elapsed, handler.entered.is_set()
        finally:
            await channel.close()
            await server.stop(0)

    first, elapsed, entered = asyncio.run(go())
    assert first.WhichOneof("part") == "reject" and "20000" in first.reject
    assert elapsed < 2.0 and not entered


def test_the_stream_over_the_cap_is_refused_with_resource_exhausted_and_slots_come_back():
    async def go():
        handler = FakeHandler()
        handler.hang = True
        entered = 0
        all_in = asyncio.Event()
        hang_exchange = handler.exchange

        async def counting(incoming):
            nonlocal entered
            entered += 1
            if entered == 3:
                all_in.set()
            return await hang_exchange(incoming)

        handler.exchange = counting  # type: ignore[method-assign]
        server = await start_server(handler, streams=StreamLimiter(max_total=3, max_per_caller=3))
        client = PeerClient()
        try:
            held = [asyncio.create_task(client.exchange(server.address, _payload(), 30.0)) for _ in range(3)]
            await asyncio.wait_for(all_in.wait(), 10)
            started = time.monotonic()
            with pytest.raises(Busy):
                await client.exchange(server.address, _payload(), 10.0)
            refused_s = time.monotonic() - started
            with pytest.raises(Busy):
                await client.pull_state(server.address, pb.PullStateRequest(**{**_pull(), "kind": 3}), 10.0)
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            handler.hang = False
            deadline = time.monotonic() + 10
            while True:  # the server sees the cancellations shortly after: slots come back
                try:
                    reply = await client.exchange(server.address, _payload(), 10.0)
                    break
                except Busy:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
            return refused_s, reply
        finally:
            await client.close()
            await server.stop(0)

    refused_s, reply = asyncio.run(go())
    assert refused_s < 2.0 and reply.header.peer_id == "peer-b"


class _HangsForOne(FakeHandler):
    """Answers exchanges at once, except those of one sender, which it holds (a stream slot each) until released."""

    def __init__(self, held_sender: str):
        super().__init__()
        self.held_sender, self.release = held_sender, asyncio.Event()
        self.held = 0

    async def exchange(self, incoming):
        if incoming.header.peer_id == self.held_sender:
            self.held += 1
            await self.release.wait()
        return await super().exchange(incoming)


@pytest.mark.parametrize("keyed_by_identity", [True, False])
def test_a_flooding_identity_on_the_same_host_leaves_an_honest_identity_its_calls(keyed_by_identity):
    """One signed identity floods streams, PullState and GetStatus from 127.0.0.1; an honest identity on the same
    host still gets its calls through. Keyed by host only (no CallerCheck, as before issue 21), it is starved."""
    flooder, honest, callee = Identity.generate(), Identity.generate(), Identity.generate().peer_id

    async def go():
        handler = _HangsForOne(flooder.peer_id)
        server = await start_server(
            handler,
            callers=CallerCheck(verify, callee) if keyed_by_identity else None,
            streams=StreamLimiter(max_total=32, max_per_caller=8, max_per_identity=3),
            requests=CallerBudget.of(rate=0.01, burst=12, host_shares=4),  # ~no refill within the test
            pulls=CallerBudget.of(rate=0.01, burst=3, host_shares=4),
        )
        bad, good = PeerClient(signer=flooder), PeerClient(signer=honest)
        bad.bind(server.address, callee)
        good.bind(server.address, callee)
        refused: dict[str, int] = {"streams": 0, "pulls": 0, "status": 0}
        held: list[asyncio.Task] = []
        try:
            for _ in range(10):
                try:
                    await bad.pull_state(server.address, pb.PullStateRequest(**{**_pull(), "kind": 3}), 10.0)
                except Busy:
                    refused["pulls"] += 1
            flood = encode(delta(1), "int8", **META, peer_id=flooder.peer_id)
            held += [asyncio.create_task(bad.exchange(server.address, flood, 30.0)) for _ in range(3)]
            await wait_until(lambda: handler.held == 3, 10, what="the flooder's streams held")
            for _ in range(5):  # its streams past its cap: refused at once
                with pytest.raises(Busy):
                    await bad.exchange(server.address, flood, 10.0)
                refused["streams"] += 1
            for _ in range(40):
                try:
                    await bad.status(server.address)
                except Busy:
                    refused["status"] += 1
            # the honest identity, same host, within its budget: 3 GetStatus, 1 PullState, 1 exchange
            got = [await good.status(server.address) for _ in range(3)]
            state = await good.pull_state(server.address, pb.PullStateRequest(**{**_pull(), "kind": 3}), 10.0)
            reply = await good.exchange(server.address, encode(delta(2), "int8", **META, peer_id=honest.peer_id), 10)
            return refused, got, state, reply
        finally:
            handler.release.set()
            await asyncio.gather(*held, return_exceptions=True)
            await bad.close()
            await good.close()
            await server.stop(0)

    if keyed_by_identity:
        refused, got, state, reply = asyncio.run(go())
        assert refused == {"streams": 5, "pulls": 7, "status": 31}  # requests: 12 = 3 held streams + 9 GetStatus
        assert [st.peer_id for st in got] == ["peer-b"] * 3
        assert state.header.kind == 3 and reply.header.peer_id == "peer-b"
    else:
        with pytest.raises(Busy):  # the host's one budget is the flooder's: the honest calls are refused
            asyncio.run(go())


def test_a_proven_caller_sends_only_its_own_payloads_and_an_unproven_claim_spends_its_hosts_budget():
    me, other, callee = Identity.generate(), Identity.generate(), Identity.generate().peer_id

    class Claimer:  # claims `me`'s id on every call, signs with another key: never proven
        peer_id = me.peer_id

        def sign(self, data: bytes) -> bytes:
            return other.sign(data)

    async def go():
        server = await start_server(
            FakeHandler(),
            callers=CallerCheck(verify, callee),
            requests=CallerBudget.of(rate=0.01, burst=4, host_shares=4),
        )
        client, claimer, third = PeerClient(signer=me), PeerClient(signer=Claimer()), PeerClient(signer=other)
        for c in (client, claimer, third):
            c.bind(server.address, callee)
        try:
            for _ in range(4):
                await claimer.status(server.address)  # the host's unproven budget (4), not `me`'s
            with pytest.raises(Busy, match=r"unproven callers of 127\.0\.0\.1"):
                await claimer.status(server.address)
            with pytest.raises(ValidationError, match="sent by"):  # signed by `other`, sent by `me`
                await client.exchange(server.address, encode(delta(1), "int8", **META, peer_id="peer-a"), 10.0)
            # `me` paid 1 + REJECT_COST (4) for its refused payload: its bucket is spent; another key's is not
            with pytest.raises(Busy, match=me.peer_id[-6:]):
                await client.status(server.address)
            return await third.status(server.address)
        finally:
            await client.close()
            await claimer.close()
            await third.close()
            await server.stop(0)

    assert asyncio.run(go()).peer_id == "peer-b"


def _pull() -> dict:
    return dict(swarm_id=META["swarm_id"], config_hash=META["config_hash"], block_index=0)


def test_a_stalled_payload_is_dropped_after_the_payload_timeout():
    async def go():
        server = await start_server(FakeHandler(), payload_timeout_s=0.5)
        channel = grpc.aio.insecure_channel(server.address)
        try:

            async def requests():
                yield pb.Payload(header=_payload().header)  # then nothing
                await asyncio.Event().wait()

            call = pb_grpc.SwarmStub(channel).ExchangeDeltas(requests(), timeout=10)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as err:
                await call.read()
            return err.value.code(), time.monotonic() - started
        finally:
            await channel.close()
            await server.stop(0)

    code, elapsed = asyncio.run(go())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and elapsed < 3.0


def test_undecodable_requests_are_invalid_argument():
    async def go():
        server = await start_server(FakeHandler())
        channel = grpc.aio.insecure_channel(server.address)
        garbage = b"\xff\xff\xff\x01garbage"
        try:
            codes = {}
            for method, kind in (("GetStatus", "unary_unary"), ("GetConfig", "unary_unary")):
                with pytest.raises(grpc.RpcError) as err:
                    await getattr(channel, kind)(f"/swarmd.v1.Swarm/{method}")(garbage, timeout=5)
                codes[method] = err.value.code()
            with pytest.raises(grpc.RpcError) as err:
                async for _ in channel.unary_stream("/swarmd.v1.Swarm/PullState")(garbage, timeout=5):
                    pass
            codes["PullState"] = err.value.code()

            async def one():
                yield garbage

            with pytest.raises(grpc.RpcError) as err:
                async for _ in channel.stream_stream("/swarmd.v1.Swarm/Forward")(one(), timeout=5):
                    pass
            codes["Forward"] = err.value.code()
            replies = [r async for r in channel.stream_stream("/swarmd.v1.Swarm/ExchangeDeltas")(one(), timeout=5)]
            return codes, pb.Payload.FromString(replies[0])
        finally:
            await channel.close()
            await server.stop(0)

    codes, reply = asyncio.run(go())
    assert set(codes.values()) == {grpc.StatusCode.INVALID_ARGUMENT}, codes
    assert reply.WhichOneof("part") == "reject" and "not a valid swarmd.v1.Payload" in reply.reject


def test_forward_requests_over_the_rate_are_resource_exhausted():
    def ok() -> pb.ForwardRequest:
        return pb.ForwardRequest(config_hash=META["config_hash"], z=to_proto(torch.zeros(2)))

    async def go():
        server = await start_server(FakeHandler(), forward_rate=RateLimiter(rate=0.01, burst=2))
        client = PeerClient()
        try:
            session = client.forward_session(server.address)
            await session.step(ok(), 5)
            await session.step(ok(), 5)
            with pytest.raises(Busy, match="rate"):
                await session.step(ok(), 5)
            await session.close()
        finally:
            await client.close()
            await server.stop(0)

    asyncio.run(go())


# -- Forward: KV-cache bytes and ranges ------------------------------------------------------------------------
def _request(step: int, start: int = 0, t: int = 4, **kw) -> pb.ForwardRequest:
    req = pb.ForwardRequest(
        block_index=0,
        config_hash=CFG.config_hash(),
        sigma=CFG.sigma_hi,
        sigma_next=CFG.sigma_lo,
        session_id="s",
        use_cache=True,
        step_index=step,
        start_position=start,
        **kw,
    )
    req.context.CopyFrom(to_proto(torch.zeros(1, t, dtype=torch.uint8)))
    req.z.CopyFrom(to_proto(torch.randn(1, t, CFG.d_model)))
    if CFG.message_dim and step > 0:  # a config whose steps pass a message takes one from step 1 on
        req.message.CopyFrom(to_proto(torch.zeros(1, t, CFG.message_dim)))
    return req


def _serving(**kw) -> BlockServing:
    blocks, emb = tiny_model()
    s = BlockServing(CFG, 0, **kw)
    s.update_weights(blocks[0].state_dict(), emb.table)
    return s


def test_one_session_with_many_step_indexes_stays_within_the_cache_bytes():
    probe = _serving()
    asyncio.run(probe.forward(_request(0)))
    per_step = probe.cache_bytes
    assert per_step > 0
    s = _serving(max_cache_bytes=5 * per_step)

    async def go():
        for step in range(60):  # the attack: one session, many distinct step_index values
            await s.forward(_request(step))
            assert s.cache_bytes <= 5 * per_step
        await s.forward(_request(59, start=4, t=1))  # the most recent step is still cached
        with pytest.raises(SessionMissing):  # the oldest was evicted: the caller re-sends from position 0
            await s.forward(_request(0, start=4, t=1))

    asyncio.run(go())
    assert s.stats.evicted_caches >= 55 and len(s.session_info("s").cached_positions) <= 5
    asyncio.run(
        s.forward(pb.ForwardRequest(block_index=0, config_hash=CFG.config_hash(), session_id="s", end_session=True))
    )
    assert s.cache_bytes == 0


@pytest.mark.parametrize(
    "field, value, pattern",
    [
        ("sigma", 1e30, "sigma"),
        ("sigma", 1e-30, "sigma"),
        ("sigma_next", 1e30, "sigma_next"),
        ("z", 1e30, "z holds values"),
        ("z", math.inf, "NaN or infinite"),
    ],
)
def test_out_of_range_forward_inputs_are_validation_errors(field, value, pattern):
    s = _serving()
    req = _request(0)
    if field == "z":
        req.z.CopyFrom(to_proto(torch.full((1, 4, CFG.d_model), value)))
    else:
        setattr(req, field, value)
    with pytest.raises(ValidationError, match=pattern):
        asyncio.run(s.forward(req))
    assert s.cache_bytes == 0
