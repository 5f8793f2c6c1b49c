"""Call proofs bound to their callee: a caller signs the peer id of the server it dials, so a proof one server
received is refused at every other (and an older proof bound to no callee is refused everywhere); the client
learns the callee's peer id from valid signed records (bind_callees), and daemons prove themselves to each other
that way. Servers are real gRPC on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import replace

import grpc
import pytest

from swarmd.errors import Busy
from swarmd.membership.identity import Identity, verify
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import bind_callees, sign_record
from swarmd.transport import PeerClient, start_server
from swarmd.transport.auth import CALLER_HEADER, CallerCheck, call_metadata, make_caller_proof
from swarmd.transport.limits import CallerBudget
from swarmd.v1 import swarm_pb2 as pb
from swarmd.v1 import swarm_pb2_grpc as pb_grpc
from tests.swarm_utils import daemon_config, link_static, running
from tests.test_transport import FakeHandler

STATUS = "/swarmd.v1.Swarm/GetStatus"


class Recording(CallerCheck):
    """A CallerCheck that keeps every identity proof it was shown and every peer id it proved (what a dishonest
    callee could keep, and what an honest one believed)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.proofs: list[str] = []
        self.proved: list[str] = []

    def of(self, method: str, metadata) -> str:
        self.proofs += [v for k, v in metadata or () if k == CALLER_HEADER]
        peer_id = super().of(method, metadata)
        self.proved.append(peer_id)
        return peer_id


def test_a_proof_replayed_at_another_server_is_refused_and_spends_nothing_of_its_signer(caplog):
    """An honest caller's proof, taken by the server it called (A), is worth nothing at B: B refuses it (one log
    line, counted), keys the replay by the replayer's host, and the honest caller's own budget at B is untouched."""
    honest, a_id, b_id = Identity.generate(), Identity.generate().peer_id, Identity.generate().peer_id

    async def go():
        at_a, at_b = Recording(verify, a_id), Recording(verify, b_id)
        a = await start_server(FakeHandler(), callers=at_a)
        b = await start_server(FakeHandler(), callers=at_b, requests=CallerBudget.of(rate=0.01, burst=1, host_shares=4))
        client = PeerClient(signer=honest)
        client.bind(a.address, a_id)
        client.bind(b.address, b_id)
        channel = grpc.aio.insecure_channel(b.address)
        try:
            await client.status(a.address)  # the honest call; A keeps its proof
            assert at_a.proved == [honest.peer_id] and len(at_a.proofs) == 1
            stolen = at_a.proofs[0]
            assert f".{a_id}." in stolen  # signed for A
            with caplog.at_level(logging.INFO, logger="swarmd.transport.auth"):
                replayed = await pb_grpc.SwarmStub(channel).GetStatus(
                    pb.StatusRequest(), metadata=((CALLER_HEADER, stolen),), timeout=5
                )  # answered, as a caller that proved nothing (the host's unproven budget: 1 of 4)
            assert replayed.peer_id == "peer-b"
            assert at_b.proved == [""] and at_b.other_callee == 1 and at_b.unproven == 1
            mine = await client.status(b.address)  # the honest caller's budget at B (burst 1) is whole
            with pytest.raises(Busy, match=honest.peer_id[-6:]):
                await client.status(b.address)
            return mine, at_b.proved
        finally:
            await channel.close()
            await client.close()
            await a.stop(0)
            await b.stop(0)

    mine, proved = asyncio.run(go())
    assert mine.peer_id == "peer-b" and proved[1] == honest.peer_id
    lines = [r.getMessage() for r in caplog.records if "another callee" in r.getMessage()]
    assert len(lines) == 1 and a_id[-6:] in lines[0] and b_id[-6:] in lines[0] and "\n" not in lines[0]


def test_a_proof_for_another_callee_or_without_one_proves_nothing_and_is_counted():
    me, server, elsewhere = Identity.generate(), Identity.generate().peer_id, Identity.generate().peer_id
    counted: list[str] = []
    check = CallerCheck(verify, server, on_refused=counted.append)
    assert check.peer_id(STATUS, make_caller_proof(me, elsewhere, STATUS)) == ""
    assert check.peer_id(STATUS, make_caller_proof(me, "", STATUS)) == ""
    # an older proof (v1: the caller, time, nonce and method signed, no callee) is refused too
    stamp, nonce = str(int(time.time() * 1000)), secrets.token_hex(12)
    old = me.sign(f"blocktrain-caller-v1|{STATUS}|{stamp}|{nonce}".encode()).hex()
    assert check.peer_id(STATUS, f"v1.{me.peer_id}.{stamp}.{nonce}.{old}") == ""
    assert (check.other_callee, check.unproven, counted) == (2, 3, ["other_callee", "other_callee"])
    assert check.peer_id(STATUS, make_caller_proof(me, server, STATUS)) == me.peer_id  # the honest path
    # the callee is signed: a proof for `elsewhere` with its callee field rewritten to ours does not verify
    forged = make_caller_proof(me, elsewhere, STATUS).replace(f".{elsewhere}.", f".{server}.")
    assert check.peer_id(STATUS, forged) == "" and check.unproven == 4


def test_a_client_signs_for_the_peer_bound_to_the_address_it_dials_and_for_no_other():
    me, callee = Identity.generate(), Identity.generate().peer_id
    assert call_metadata(None, me, STATUS) is None  # no callee known: no identity proof at all
    ((header, proof),) = call_metadata(None, me, STATUS, callee) or ()
    assert header == CALLER_HEADER and proof.split(".")[:3] == ["v2", me.peer_id, callee]
    client = PeerClient(signer=me)
    client.bind("127.0.0.1:1", callee)
    assert client.callee("127.0.0.1:1") == callee and client.callee("127.0.0.1:2") == ""
    assert client._auth("127.0.0.1:2", "GetStatus") is None
    client.bind("127.0.0.1:1", "")
    assert client.callee("127.0.0.1:1") == ""


def _record(identity: Identity, address: str, ttl_s: float = 30.0) -> PeerRecord:
    unsigned = PeerRecord(identity.peer_id, address, 0, 0, 0.0, "cfg", "", False, "test")
    return sign_record(unsigned, identity, ttl_s)


def test_bind_callees_takes_the_peer_id_at_each_address_from_valid_signed_records_only():
    me, a, b, stranger = (Identity.generate() for _ in range(4))
    client = PeerClient(signer=me)
    forged = replace(_record(stranger, "10.0.0.3:1"), peer_id=b.peer_id)  # names b, signed by another key
    records = [
        _record(me, "10.0.0.9:1"),  # our own: skipped
        _record(a, "10.0.0.1:1"),
        PeerRecord(b.peer_id, "10.0.0.2:1", 0, 0, 0.0, "cfg", "", False, "test"),  # unsigned
        forged,
        _record(b, "10.0.0.4:1", ttl_s=10),  # b and a stranger name one address: the later expiry wins
        _record(stranger, "10.0.0.4:1", ttl_s=60),
        _record(b, ""),  # client mode: no address
    ]
    bind_callees(client, records, skip=me.peer_id)
    got = {addr: client.callee(addr) for addr in ("10.0.0.9:1", "10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1")}
    assert got == {
        "10.0.0.9:1": "",
        "10.0.0.1:1": a.peer_id,
        "10.0.0.2:1": "",
        "10.0.0.3:1": "",
        "10.0.0.4:1": stranger.peer_id,
    }


def test_daemons_prove_their_identity_to_each_other_signed_for_each_callee(tmp_path, monkeypatch):
    """Two static-discovery daemons run a round: every call each one's server proved came from the other's peer
    id, bound to the server's own (none was refused for another callee)."""
    import swarmd.node.service as service

    checks: list[Recording] = []

    def recording(*args, **kwargs) -> Recording:
        checks.append(Recording(*args, **kwargs))
        return checks[-1]

    monkeypatch.setattr(service, "CallerCheck", recording)
    configs = [daemon_config(tmp_path, 0, seed=s, discovery="static", deadline_max_s=4.0) for s in (0, 1)]

    async def scenario():
        async with running(*configs) as daemons:
            link_static(daemons)
            reports = await asyncio.wait_for(asyncio.gather(*(d.run_round() for d in daemons)), 60)
            return reports, [d.peer_id for d in daemons], [dict(d.metrics.refused_calls) for d in daemons]

    reports, ids, refused = asyncio.run(scenario())
    assert [c.callee for c in checks] == ids
    for check, other in zip(checks, reversed(ids)):
        proved = {p for p in check.proved if p}
        assert proved == {other}, (proved, other)
        assert check.other_callee == 0
    assert refused == [{}, {}]
    assert all(len(r.accepted_block) == 1 for r in reports)  # they averaged with each other
