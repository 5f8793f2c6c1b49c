"""Discovery: key helpers, block choice, records, a real hivemind DHT on loopback, static lists."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from swarm_utils import wait_until

from swarmd.errors import PeerUnavailable, SwarmdError
from swarmd.membership.dht import HivemindDiscovery
from swarmd.membership.discovery import StaticDiscovery, connect_discovery
from swarmd.membership.identity import Identity
from swarmd.membership.records import PeerRecord, block_key, block_throughput, choose_block, parse_block_key
from swarmd.membership.trust import sign_record
from swarmd.v1 import swarm_pb2 as pb


def rec(pid: str, block: int, sps: float = 10.0, round: int = 0, address: str = "127.0.0.1:1") -> PeerRecord:
    return PeerRecord(pid, address, block, round, sps, "cfg", "base", False, "sw", "emb")


def test_block_key_round_trip_and_errors():
    assert block_key("sw", 3) == "sw.block.3"
    assert parse_block_key(block_key("my.swarm", 12)) == ("my.swarm", 12)
    assert parse_block_key(block_key("sw", None)) == ("sw", None)
    for bad in ("sw", "sw.block.x", ".block.1", "sw.blocks.1"):
        with pytest.raises(ValueError):
            parse_block_key(bad)


def test_choose_block_picks_least_throughput_then_lowest_index():
    assert choose_block([], 3) == 0
    assert choose_block([rec("a", 0), rec("b", 2)], 3) == 1
    assert choose_block([rec("a", 0, 5.0), rec("b", 1, 50.0), rec("c", 2, 20.0)], 3) == 0
    assert choose_block([rec("a", 0, 30.0), rec("b", 1, 10.0), rec("c", 1, 10.0), rec("d", 2, 20.0)], 3) == 1
    assert choose_block([rec("a", 0, 0.0)], 2) == 1  # a new peer (no EMA yet) still counts
    assert block_throughput([rec("a", 0, 5.0), rec("b", 0, 7.0)], 2) == [
        {"block": 0, "peers": 2, "samples_per_s": 12.0},
        {"block": 1, "peers": 0, "samples_per_s": 0},
    ]


def test_malformed_records_are_ignored():
    good = rec("a", 0).to_value()
    assert PeerRecord.from_value(good) == rec("a", 0)
    assert PeerRecord.from_value({**good, "round": "x"}) is None
    assert PeerRecord.from_value({**good, "evil": 1}) is None
    assert PeerRecord.from_value([1, 2]) is None
    assert PeerRecord.from_value({**good, "peer_id": 5}) is None


async def retrying(call, attempts: int = 3):
    """`call()` again after a PeerUnavailable (a DHT call past its bound), as the daemon's announce loop does:
    twice, in full suite runs on a loaded 2-core machine (CI), one store took longer than call_timeout_s."""
    for attempt in range(attempts):
        try:
            return await call()
        except PeerUnavailable:
            if attempt == attempts - 1:
                raise


async def announce_retrying(discovery: HivemindDiscovery, record: PeerRecord, identity: Identity, ttl_s: float):
    """Announce `record` signed afresh on every attempt (a record signed before a timed-out try may have expired)."""
    await retrying(lambda: discovery.announce(sign_record(record, identity, ttl_s), ttl_s=ttl_s))


async def _announce_find_and_expiry():
    first = await HivemindDiscovery.create("sw", [], start_timeout_s=20)
    second = None
    id1, id2 = Identity.generate(), Identity.generate()  # records are signed by the peers they name
    try:
        second = await HivemindDiscovery.create("sw", first.multiaddrs(), start_timeout_s=20)
        assert first.multiaddrs() and all(m.startswith("/ip4/127.0.0.1/tcp/") for m in first.multiaddrs())
        await announce_retrying(first, rec(id1.peer_id, 0, address="127.0.0.1:5000"), id1, 30)
        await announce_retrying(second, rec(id2.peer_id, 1, address="127.0.0.1:5001"), id2, 1.5)
        found0 = await retrying(lambda: second.find(0))
        all_found = await retrying(first.find_all)
        assert [r.peer_id for r in found0] == [id1.peer_id] and found0[0].address == "127.0.0.1:5000"
        assert sorted(r.peer_id for r in all_found) == sorted([id1.peer_id, id2.peer_id])
        other_swarm = HivemindDiscovery.__new__(HivemindDiscovery)
        other_swarm.dht, other_swarm.swarm_id = first.dht, "other"
        assert await other_swarm.find_all() == []  # keys are scoped by swarm id

        async def expired():
            return [r.peer_id for r in await first.find(1)] == []

        await wait_until(expired, timeout_s=10, poll_s=0.2, what="the block-1 record to expire")
    finally:
        if second is not None:
            await second.shutdown()
        await first.shutdown()


@pytest.mark.swarm
def test_hivemind_dht_announce_find_and_expiry():
    """Two DHT nodes: records stored, found across nodes, scoped by swarm id, expired. Run in a fresh interpreter:
    the tests before it in this process fork and kill dozens of DHT processes, and in some CI runs every DHT call
    of this test then hung (three tries of 20 s) while it passed alone and on the same commit elsewhere; one cause
    is fixed (fresh_mpfuture_backend, test below), a likely second (a collection in the forked DHT process) too
    (gc_paused, the last tests of this file)."""
    here = Path(__file__).resolve().parent
    code = "import asyncio, test_discovery as t; asyncio.run(t._announce_find_and_expiry())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"the scenario failed in its own process:\n{proc.stderr[-3000:]}"


async def _killed_while_busy() -> None:
    """A DHT process killed (SIGKILL, then SIGTERM) while it answers a busy peer; the next DHT of the same process
    starts, stores and finds."""
    identity = Identity.generate()

    async def busy(discovery: HivemindDiscovery) -> None:
        with contextlib.suppress(PeerUnavailable):
            for _ in range(400):
                await discovery.announce(sign_record(rec(identity.peer_id, 0), identity, 30), ttl_s=30)
                await discovery.find_all()

    for sig in (signal.SIGKILL, signal.SIGTERM):
        first = await HivemindDiscovery.create("sw", [], start_timeout_s=20)
        task = asyncio.create_task(busy(first))
        await asyncio.sleep(0.5)
        os.kill(first.dht.pid, sig)
        await asyncio.wait_for(task, 30)
        second = await HivemindDiscovery.create("sw", [], start_timeout_s=20)
        try:
            await second.announce(sign_record(rec(identity.peer_id, 1), identity, 30), ttl_s=30)
            assert [r.peer_id for r in await second.find(1)] == [identity.peer_id]
        finally:
            await second.shutdown()
            await first.shutdown()


@pytest.mark.swarm
def test_a_dht_killed_while_busy_does_not_wedge_the_next_one():
    """Every DHT result comes back through one pipe per parent, under one lock shared with the DHT processes: a DHT
    process killed while answering left them wedged, and the next DHT of the process never got ready (the CI flake of
    test_hivemind_dht_announce_find_and_expiry, after earlier tests' kills). A fresh backend per start ends that.
    Run in a fresh interpreter, as the test above: in the full suite the DHTs earlier tests forked and killed can
    still slow this process's DHT calls past their 20 s bound (seen once in a CI rehearsal), which is not what this
    test asks about."""
    here = Path(__file__).resolve().parent
    code = "import asyncio, test_discovery as t; asyncio.run(t._killed_while_busy())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"the scenario failed in its own process:\n{proc.stderr[-3000:]}"


@pytest.mark.swarm
def test_dht_that_cannot_start_fails_fast_with_cause_and_hint():
    start = time.monotonic()
    with pytest.raises(SwarmdError) as info:
        HivemindDiscovery(
            "sw", ["/ip4/127.0.0.1/tcp/1/p2p/QmXnnt3xYtRb1Y4RrTC8mkThQGr5rhr7DVvbTNmY5bMwPi"], start_timeout_s=15
        )
    assert time.monotonic() - start < 20
    message = str(info.value)
    assert "could not start the DHT" in message and "check that the multiaddrs" in message
    # the multiaddr tried is named, with why it did not answer (swarmd.membership.bootstrap)
    assert "/ip4/127.0.0.1/tcp/1/p2p/QmXnnt3xYtRb1Y4RrTC8mkThQGr5rhr7DVvbTNmY5bMwPi: connection refused" in message
    with pytest.raises(SwarmdError, match="could not start the DHT"):
        HivemindDiscovery("sw", ["not-a-multiaddr"], start_timeout_s=5)


def test_static_discovery_asks_each_address_and_skips_the_unreachable():
    ids = {a: Identity.generate() for a in ("1", "3")}

    async def status(address: str):
        if address == "127.0.0.1:2":
            raise PeerUnavailable("down")
        me = ids[address[-1]]
        signed = sign_record(PeerRecord(me.peer_id, address, 1, 4, 3.0, "cfg", "b", False, "sw", "e"), me, 30)
        return pb.PeerStatus(
            peer_id=me.peer_id,
            signed_record=json.dumps(signed.to_value()),
            block_index=1,
            round=4,
            swarm_id="sw",
            config_hash="cfg",
            address=address,
            base_hash="b",
            emb_hash="e",
            samples_per_s=3.0,
        )

    async def scenario():
        d = StaticDiscovery(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], status, "sw")
        records = await d.find_all()
        return records, await d.find(0)

    records, none = asyncio.run(scenario())
    assert [r.peer_id for r in records] == sorted(i.peer_id for i in ids.values())
    assert records[0].base_hash == "b" and records[0].emb_hash == "e"
    assert none == []


def test_connect_discovery_refuses_mixed_or_empty_addresses():
    async def scenario(addresses):
        return await connect_discovery(addresses, "sw", status_fn=None)

    with pytest.raises(SwarmdError, match="no swarm address"):
        asyncio.run(scenario([]))
    with pytest.raises(SwarmdError, match="mix of"):
        asyncio.run(scenario(["/ip4/127.0.0.1/tcp/1", "127.0.0.1:5"]))


@pytest.mark.parametrize("held", [False, True], ids=["dropped", "held"])
def test_a_dht_call_task_nobody_references_survives_garbage_collection_only_when_held(held):
    """hivemind's DHT process starts each call with asyncio.create_task and drops the task; a call awaiting a
    future only it references is then collected mid-await (seen once in a 30-round benchmark run: GeneratorExit
    in _run_coroutine). ParentBoundDHT runs every call under dht_process._held, which keeps the task alive."""
    import gc
    import weakref

    from swarmd.membership.dht_process import _held

    async def main():
        futures: list[weakref.ref] = []
        done = asyncio.Event()

        async def call():
            fut = asyncio.get_running_loop().create_future()
            futures.append(weakref.ref(fut))
            await fut
            done.set()

        asyncio.create_task(_held(call()) if held else call())  # noqa: RUF006 - dropped, as hivemind does
        await asyncio.sleep(0)
        gc.collect()
        fut = futures[0]()
        if fut is None:
            return False
        fut.set_result(None)
        await asyncio.wait_for(done.wait(), 5)
        return True

    assert asyncio.run(main()) is held


async def _collector_state(dht, node) -> tuple[bool, int]:
    """Run in a DHT process (DHT.run_coroutine): whether it collects garbage, and how many objects it froze."""
    import gc

    return gc.isenabled(), gc.get_freeze_count()


@pytest.mark.swarm
def test_a_dht_process_never_collects_what_the_fork_copied_and_collects_the_rest():
    """The daemon forks its DHT process while gRPC's threads run; a collection in the child that reached objects
    copied mid-use segfaulted one DHT process of the default suite ("Garbage-collecting" in its first neighbour check)
    and very likely hung another (every DHT call of its daemon timed out). The fork happens with the collector off,
    and the child freezes what it inherited before it collects again; the parent collects again once the fork is
    done."""
    import gc

    async def main():
        discovery = await HivemindDiscovery.create("sw", [], start_timeout_s=20)
        try:
            return gc.isenabled(), await discovery.dht.run_coroutine(_collector_state, return_future=True)
        finally:
            await discovery.shutdown()

    parent_collects, (child_collects, child_frozen) = asyncio.run(main())
    assert parent_collects and child_collects
    assert child_frozen > 10_000  # the daemon's modules and objects: the interpreter's whole inheritance


def test_the_collector_is_paused_across_a_dht_fork_and_restored_as_it_was():
    import gc

    from swarmd.membership.dht_process import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a process that runs without the collector stays without it
    finally:
        gc.enable()
