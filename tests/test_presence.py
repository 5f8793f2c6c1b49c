"""Presence's announce in the background (swarmd.node.presence): a round's announce waits at most a bound while a
slow DHT store goes on, stores coalesce to the newest record, a failure is a warning, and close() lets a store end
within its grace, then cancels it."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

from swarmd.errors import PeerUnavailable
from swarmd.metrics import Metrics
from swarmd.node.config import NetConfig
from swarmd.node.presence import Presence


class SlowDiscovery:
    """A discovery whose stores wait for `release` (a DHT node that does not answer); records what it stored."""

    def __init__(self, fail: bool = False):
        self.release, self.fail = asyncio.Event(), fail
        self.stored: list[int] = []
        self.started = 0

    async def announce(self, record: int, ttl_s: float) -> None:
        self.started += 1
        await self.release.wait()
        if self.fail:
            raise PeerUnavailable("DHT store took longer than 20s")
        self.stored.append(record)


def presence(discovery: SlowDiscovery) -> tuple[Presence, SimpleNamespace]:
    gossip = SimpleNamespace(tag="[block 0 test]", version=0)
    gossip.record = lambda ttl: gossip.version  # the record of now: its version
    return Presence(discovery, gossip, None, Metrics(), NetConfig(), asyncio.Event()), gossip  # type: ignore[arg-type]


def test_a_round_waits_for_a_stalled_store_only_as_long_as_it_was_told_and_the_store_lands_after():
    async def go():
        d = SlowDiscovery()
        p, _ = presence(d)
        began = time.monotonic()
        await p.try_announce(wait_s=0.2)
        waited = time.monotonic() - began
        assert 0.15 <= waited < 2.0 and d.stored == [] and d.started == 1
        d.release.set()
        await asyncio.wait_for(p.storing, 5.0)
        assert d.stored == [0]

    asyncio.run(go())


def test_requests_during_a_store_are_stored_once_after_it_with_the_newest_record():
    async def go():
        d = SlowDiscovery()
        p, gossip = presence(d)
        await p.try_announce(wait_s=0.0)  # version 0 in flight
        for v in (1, 2, 3):
            gossip.version = v
            await p.try_announce(wait_s=0.0)
        assert d.started == 1  # one store at a time
        d.release.set()
        await p.try_announce(wait_s=5.0)  # waits for the store in flight, then the newest record's
        assert d.stored == [0, 3] and d.started == 2 and p.storing.done()

    asyncio.run(go())


def test_a_failed_store_is_a_warning_and_the_next_request_stores_again(caplog):
    async def go():
        d = SlowDiscovery(fail=True)
        d.release.set()
        p, _ = presence(d)
        with caplog.at_level(logging.WARNING, logger="swarmd.node.presence"):
            await p.try_announce(wait_s=5.0)
        assert "announce failed: DHT store took longer than 20s" in caplog.text
        d.fail = False
        await p.try_announce(wait_s=5.0)
        assert d.stored == [0] and d.started == 2

    asyncio.run(go())


def test_close_ends_a_store_still_waiting():
    async def go():
        d = SlowDiscovery()
        p, _ = presence(d)
        await p.try_announce(wait_s=0.0)
        await asyncio.wait_for(p.close(grace_s=0.1), 2.0)
        assert p.storing.cancelled() and d.stored == []

    asyncio.run(go())


def test_close_lets_a_store_that_ends_within_its_grace_land():
    async def go():
        d = SlowDiscovery()
        p, _ = presence(d)
        await p.try_announce(wait_s=0.0)
        asyncio.get_running_loop().call_later(0.1, d.release.set)
        await p.close(grace_s=5.0)
        assert d.stored == [0] and not p.storing.cancelled()

    asyncio.run(go())
