"""The reachability check: a peer asks known peers to dial it back (DialBack) and logs one line saying whether
others can reach it, and what to do if not.

The plain logic (which peers to ask, the line and its fixes, what a dial-back may dial) runs without a network;
the DialBack RPC runs on real gRPC servers on 127.0.0.1:0 (an asker that proves its peer id, one that does not, a
handler without it, the request budget); two and three real daemons on 127.0.0.1 (static discovery) show the
line: reachable, and not reachable at an announced port where nothing listens. The two-namespace test (a listener
on loopback only) is in tests/test_netns.py.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from types import SimpleNamespace

import pytest

from cli.status import reachable
from swarmd.errors import Busy, NotFound, PeerFailed, Unauthenticated, ValidationError
from swarmd.membership.identity import Identity, verify
from swarmd.membership.records import PeerRecord
from swarmd.node.dialback import DialBacks, dial_address, one_line
from swarmd.node.reachability import Reachability, ReachabilityCheck, candidates, fixes, verdict
from swarmd.tools.survey import peer_row, record_row, survey_peer
from swarmd.transport import PeerClient, start_server
from swarmd.transport.auth import CallerCheck
from swarmd.transport.limits import Caller, CallerBudget
from swarmd.transport.server import DIAL_BACK_COST
from swarmd.transport.tls import fingerprint, make_self_signed
from swarmd.v1 import swarm_pb2 as pb
from tests.swarm_utils import daemon_config, running, wait_until

pytestmark = pytest.mark.usefixtures("one_thread")


def rec(peer_id: str, address: str, client_mode: bool = False) -> PeerRecord:
    return PeerRecord(peer_id, address, 0, 0, 0.0, "cfg", "", client_mode, "sw")


# -- the plain logic ---------------------------------------------------------------------------------------------
def test_candidates_are_other_dialable_peers_those_on_another_host_first():
    me = rec("me", "10.0.0.2:50051")
    records = [
        me,
        rec("same-host", "10.0.0.2:50052"),
        rec("client", "", client_mode=True),
        rec("far", "10.0.0.9:50051"),
        rec("stale-me", "10.0.0.2:50051"),  # an old record at our own address
    ]
    assert [r.peer_id for r in candidates(records, me, limit=5)] == ["far", "same-host"]
    assert [r.peer_id for r in candidates(records, me, limit=1)] == ["far"]
    assert candidates([me], me) == []


def test_the_reachable_line_names_the_address_peers_dialled():
    answers = [("10.0.0.1:50051", pb.DialBackReply(reachable=True, dialled="10.0.0.2:50051"))]
    result = verdict(answers, "0.0.0.0:50051", "10.0.0.2:50051")
    assert result == Reachability(pb.REACHABILITY_REACHABLE, "reachable: peers can dial 10.0.0.2:50051")
    assert result.reachable is True and Reachability().reachable is None
    # one reachable answer is enough; another host seen than the one announced is pointed out
    answers = [("10.0.0.1:1", pb.DialBackReply(reason="refused")), ("10.0.0.3:1", answers[0][1])]
    result = verdict(answers, "0.0.0.0:50051", "192.168.1.5:50051")
    assert result.line.startswith("reachable: peers can dial 10.0.0.2:50051 (this peer announces 192.168.1.5:50051")


def test_the_not_reachable_line_says_why_and_what_to_do():
    refused = pb.DialBackReply(dialled="10.0.0.2:50051", reason="peer 10.0.0.2:50051: unavailable: connection refused")
    result = verdict([("10.0.0.1:50051", refused)], "127.0.0.1:50051", "10.0.0.2:50051")
    assert result.state == pb.REACHABILITY_UNREACHABLE and result.reachable is False
    assert result.line == (
        "not reachable from 10.0.0.1: peer 10.0.0.2:50051: unavailable: connection refused; listen on every "
        "interface (--listen 0.0.0.0:50051: it listens on 127.0.0.1 only), set --announce <address others can "
        "dial>, forward TCP port 50051 to this host, or run with --client-mode"
    )
    # behind NAT: the dialler sees another host than the one announced; the listen port 0 takes the announced one
    line = fixes("0.0.0.0:0", "192.168.1.5:50051", "203.0.113.7")
    assert line == (
        "set --announce <address others can dial> (peers see this host as 203.0.113.7), forward TCP port 50051 to "
        "this host, or run with --client-mode"
    )
    assert fixes("127.0.0.1:0", "127.0.0.1:4000", "").startswith("listen on every interface (--listen 0.0.0.0:4000")


def test_what_a_peer_answers_is_cut_to_one_short_printable_line():
    hostile = pb.DialBackReply(dialled="10.0.0.2:1\nFAKE", reason="evil\n\x1b[31mred\r" + "x" * 1000)
    line = verdict([("10.0.0.1:1", hostile)], "0.0.0.0:1", "10.0.0.2:1").line
    assert "\n" not in line and "\x1b" not in line and "\r" not in line and len(line) < 600
    assert one_line("a\n b\t\x00c") == "a b c" and one_line("x" * 50, 10) == "xxxxxxx..."


def test_a_dial_back_dials_only_the_callers_own_host_for_the_peer_id_it_proved():
    request = pb.DialBackRequest(port=50051, peer_id="abc123")
    assert dial_address(request, Caller("10.0.0.2", "abc123")) == "10.0.0.2:50051"
    assert dial_address(request, Caller("::1", "abc123")) == "[::1]:50051"
    assert dial_address(request, Caller("::ffff:10.0.0.2", "abc123")) == "10.0.0.2:50051"  # a dual-stack listener
    for bad, caller in (
        (pb.DialBackRequest(port=0, peer_id="abc123"), Caller("10.0.0.2", "abc123")),
        (pb.DialBackRequest(port=70000, peer_id="abc123"), Caller("10.0.0.2", "abc123")),
        (request, Caller("10.0.0.2", "other")),  # asks for another peer than the one it proved
        (request, Caller("10.0.0.2")),  # proved none
        (request, Caller("unix:/tmp/sock", "abc123")),  # no IP address to dial
    ):
        with pytest.raises(ValidationError):
            dial_address(bad, caller)


def test_status_rows_show_each_peers_own_check_or_that_it_could_not_be_dialled():
    rows = [peer_row(pb.PeerStatus(reachability=v, reachability_detail="x")) for v in range(3)]
    assert [r["reachable"] for r in rows] == [None, True, False] and rows[1]["reachability"] == "x"
    assert [reachable(r) for r in rows] == ["-", "yes", "no"]
    lost, client = record_row(rec("a", "10.0.0.2:1")), record_row(rec("b", "", client_mode=True))
    assert lost["reachable"] is False and lost["reachability"] == "this survey could not dial 10.0.0.2:1"
    assert (reachable(lost), reachable(client), client["reachable"]) == ("no (from here)", "client", None)


class FakePresence:
    def __init__(self, rounds: list[list[PeerRecord]]):
        self.rounds, self.looked = rounds, 0

    async def recent(self, max_age_s: float) -> list[PeerRecord]:
        self.looked += 1
        return self.rounds[min(self.looked, len(self.rounds)) - 1]

    async def pause(self, timeout_s: float) -> None:
        await asyncio.sleep(0.01)


class FakeClient:
    """An old peer (no DialBack: PeerFailed) at 10.0.0.1, one that dials us back at 10.0.0.3."""

    def __init__(self, busy: int = 0):
        self.asked: list[tuple[str, pb.DialBackRequest]] = []
        self.busy = busy  # the first this many calls are refused as Busy

    async def dial_back(self, address: str, request: pb.DialBackRequest, timeout_s: float) -> pb.DialBackReply:
        self.asked.append((address, request))
        if len(self.asked) <= self.busy:
            raise Busy(f"peer {address}: resource_exhausted: a dial-back to 10.0.0.2 runs already")
        if address.startswith("10.0.0.1:"):
            raise PeerFailed(f"peer {address}: unimplemented: Method not found")
        return pb.DialBackReply(reachable=True, dialled=f"10.0.0.2:{request.port}")


class FakeAsker:
    def __init__(self, rounds: list[list[PeerRecord]]):
        self.config = SimpleNamespace(net=SimpleNamespace(listen="0.0.0.0:4000"))
        self.presence, self.client, self.stopping = FakePresence(rounds), FakeClient(), asyncio.Event()
        self.me = replace(rec("me", "10.0.0.2:4000"), tls_fingerprint="ab" * 32)
        self.address, self.server = "10.0.0.2:4000", None


def test_the_check_waits_for_peers_skips_those_that_cannot_answer_and_reports_once(caplog):
    caplog.set_level(logging.INFO, logger="swarmd.node.reachability")
    old, good = rec("old", "10.0.0.1:1"), rec("good", "10.0.0.3:1")
    heard: list[Reachability] = []

    async def go(rounds, window_s=5.0):
        asker = FakeAsker(rounds)
        check = ReachabilityCheck(asker, window_s=window_s, retry_s=0.01)  # type: ignore[arg-type]
        check.on_result = heard.append
        check.start()
        await asyncio.wait_for(check._task, 10)
        return check, asker

    # nobody known at first; then the old peer alone (it cannot answer); then both: the new one is asked
    check, asker = asyncio.run(go([[], [old], [old, good]]))
    assert [a for a, _ in asker.client.asked] == ["10.0.0.1:1", "10.0.0.3:1"]  # each asked once
    request = asker.client.asked[0][1]
    assert (request.port, request.peer_id, request.tls_fingerprint) == (4000, "me", "ab" * 32)
    assert heard == [check.result] and check.result.line == "reachable: peers can dial 10.0.0.2:4000"
    # the window passes with only the old peer known: unknown, said once in the log
    check, _ = asyncio.run(go([[old]], window_s=0.2))
    assert check.result == Reachability() and len(heard) == 1
    (unknown,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reachability unknown")]
    assert "none of 1 peers asked answered (peer 10.0.0.1:1: unimplemented" in unknown


def test_a_peer_that_was_busy_is_asked_again():
    async def go():
        asker = FakeAsker([[rec("good", "10.0.0.3:1")]])
        asker.client.busy = 2
        check = ReachabilityCheck(asker, window_s=5.0, retry_s=0.01)  # type: ignore[arg-type]
        check.start()
        await asyncio.wait_for(check._task, 10)
        return check, asker

    check, asker = asyncio.run(go())
    assert [a for a, _ in asker.client.asked] == ["10.0.0.3:1"] * 3 and check.result.reachable is True


# -- DialBack on real gRPC servers ----------------------------------------------------------------------------------
class Target:
    """A server's handler that answers GetStatus as `peer_id` (the peer dialled back)."""

    def __init__(self, peer_id: str):
        self.peer_id = peer_id

    def status(self) -> pb.PeerStatus:
        return pb.PeerStatus(peer_id=self.peer_id)

    def swarm_config(self) -> pb.SwarmConfig:
        return pb.SwarmConfig()


class Dialler(Target):
    """A handler that answers DialBack (and GetStatus as `peer_id`)."""

    def __init__(self, peer_id: str, dial_backs: DialBacks | None = None):
        super().__init__(peer_id)
        self.dial_backs = dial_backs or DialBacks()

    async def dial_back(self, request: pb.DialBackRequest, caller: Caller) -> pb.DialBackReply:
        return await self.dial_backs.answer(request, caller)


def test_dial_back_answers_reachable_wrong_peer_refused_and_busy():
    asker, other = Identity.generate(), Identity.generate()

    async def go():
        mine, theirs = await start_server(Target(asker.peer_id)), await start_server(Target(other.peer_id))
        backs = DialBacks(timeout_s=2.0)
        caller = Caller("127.0.0.1", asker.peer_id)
        try:
            ok = await backs.answer(pb.DialBackRequest(port=mine.port, peer_id=asker.peer_id), caller)
            wrong = await backs.answer(pb.DialBackRequest(port=theirs.port, peer_id=asker.peer_id), caller)
            await mine.stop(0)
            refused = await backs.answer(pb.DialBackRequest(port=mine.port, peer_id=asker.peer_id), caller)
            request = pb.DialBackRequest(port=theirs.port, peer_id=asker.peer_id)
            backs._hosts.add("127.0.0.1")  # a dial-back to this host in flight: one per caller host
            with pytest.raises(Busy, match="runs already"):
                await backs.answer(request, caller)
            backs._hosts.clear()
            backs.running = backs.max_dials  # as many in flight as allowed, all hosts together
            with pytest.raises(Busy, match="dial-backs run already"):
                await backs.answer(request, caller)
        finally:
            await theirs.stop(0)
        return ok, wrong, refused, mine.port

    ok, wrong, refused, port = asyncio.run(go())
    assert ok == pb.DialBackReply(reachable=True, dialled=f"127.0.0.1:{port}")
    assert not wrong.reachable and "answered as another peer" in wrong.reason
    assert not refused.reachable and "connection refused" in refused.reason and refused.dialled.endswith(f":{port}")


def test_a_dial_back_to_a_tls_server_pins_the_certificate_the_asker_names():
    asker = Identity.generate()
    cert, key = make_self_signed()

    async def go():
        server = await start_server(Target(asker.peer_id), tls=(cert, key))
        backs, caller = DialBacks(timeout_s=3.0), Caller("127.0.0.1", asker.peer_id)
        try:
            request = pb.DialBackRequest(port=server.port, peer_id=asker.peer_id)
            pinned = await backs.answer(replace_fp(request, fingerprint(cert)), caller)
            other = await backs.answer(replace_fp(request, fingerprint(make_self_signed()[0])), caller)
            plain = await backs.answer(request, caller)  # no fingerprint: plaintext, which a TLS server refuses
        finally:
            await server.stop(0)
        return pinned, other, plain

    pinned, other, plain = asyncio.run(go())
    assert pinned.reachable, pinned
    assert not other.reachable and "certificate" in other.reason
    assert not plain.reachable


def replace_fp(request: pb.DialBackRequest, tls_fingerprint: str) -> pb.DialBackRequest:
    return pb.DialBackRequest(port=request.port, peer_id=request.peer_id, tls_fingerprint=tls_fingerprint)


def test_the_dial_back_rpc_needs_a_proven_asker_and_spends_its_request_budget():
    asker, server_id = Identity.generate(), Identity.generate().peer_id

    async def go():
        own = await start_server(Target(asker.peer_id))
        budget = CallerBudget.of(rate=0.01, burst=DIAL_BACK_COST * 1.5, host_shares=4)
        server = await start_server(Dialler(server_id), callers=CallerCheck(verify, server_id), requests=budget)
        bare = await start_server(Target(server_id), callers=CallerCheck(verify, server_id))
        client = PeerClient(signer=asker)
        request = pb.DialBackRequest(port=own.port, peer_id=asker.peer_id)
        errors = []
        try:
            with pytest.raises(Unauthenticated, match="prove the asker's peer id"):
                await client.dial_back(server.address, request)  # no callee bound: the call proves no identity
            client.bind(server.address, server_id)
            client.bind(bare.address, server_id)
            reply = await client.dial_back(server.address, request)
            for address in (server.address, bare.address):
                try:
                    await client.dial_back(address, request)
                except Exception as exc:
                    errors.append(exc)
        finally:
            await client.close()
            for s in (own, server, bare):
                await s.stop(0)
        return reply, errors

    reply, (over_budget, not_served) = asyncio.run(go())
    assert reply.reachable, reply
    assert isinstance(over_budget, Busy)  # a second dial-back within the burst's refill: over its budget
    assert isinstance(not_served, NotFound) and "does not answer dial-back" in str(not_served)


# -- real daemons on 127.0.0.1 ------------------------------------------------------------------------------------
def test_a_joiner_logs_that_peers_can_dial_it_and_its_status_says_so(tmp_path, caplog):
    """A second daemon asks the first to dial it back: one `reachable` line at its own address, in its status; a
    third announcing a port where nothing listens is told it is not reachable, with the fixes."""
    caplog.set_level(logging.INFO, logger="swarmd.node.reachability")
    first = daemon_config(tmp_path, 0, seed=0, discovery="static")

    async def scenario():
        async with running(first) as (d0,):
            joiner = daemon_config(tmp_path, 0, seed=1, discovery="static", initial_peers=(d0.server.address,))
            wrong = replace(joiner, peer_seed=2, net=replace(joiner.net, announce="127.0.0.1:1"))
            async with running(joiner, wrong) as (d1, d2):
                for d in (d1, d2):
                    await wait_until(lambda d=d: d.reachability.result.reachable is not None, 20, what="the check")
                ports = (d1.server.port, d2.server.port)
                rows = [(await survey_peer(d.server.address))["peers"][0] for d in (d0, d1, d2)]
                return d0, d1, d2, d1.service.status(), d2.service.status(), ports, rows

    d0, d1, d2, status1, status2, (port1, port2), rows = asyncio.run(scenario())
    assert [reachable(r) for r in rows] == ["-", "yes", "no"]  # `blocktrain status` of each
    assert rows[1]["reachable"] is True and rows[2]["reachability"].startswith("not reachable from 127.0.0.1")
    assert d0.reachability.result.reachable is None  # the first peer knew no other one
    assert d1.reachability.result.line == f"reachable: peers can dial 127.0.0.1:{port1}"
    assert status1.reachability == pb.REACHABILITY_REACHABLE and status1.reachability_detail.startswith("reachable")
    line = d2.reachability.result.line
    assert line.startswith("not reachable from 127.0.0.1: peer 127.0.0.1:1: unavailable: connection refused")
    assert f"listen on every interface (--listen 0.0.0.0:{port2}: it listens on 127.0.0.1 only)" in line
    assert "forward TCP port 1 to this host, or run with --client-mode" in line
    assert status2.reachability == pb.REACHABILITY_UNREACHABLE and status2.reachability_detail == line
    logged = [r.getMessage() for r in caplog.records if r.name == "swarmd.node.reachability"]
    assert logged.count(d1.reachability.result.line) == 1 and logged.count(line) == 1


def test_a_client_mode_peer_checks_nothing(tmp_path):
    async def scenario():
        async with running(daemon_config(tmp_path, 0, seed=0, discovery="static")) as (d0,):
            cfg = daemon_config(tmp_path, 0, seed=1, discovery="static", initial_peers=(d0.server.address,))
            async with running(replace(cfg, net=replace(cfg.net, client_mode=True))) as (d1,):
                return d1.reachability._task, d1.service.status()

    task, status = asyncio.run(scenario())
    assert task is None and status.reachability == pb.REACHABILITY_UNKNOWN and status.client_mode
