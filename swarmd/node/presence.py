"""Presence: one running peer in its discovery, announcing its signed record and looking the swarm up.

Owns what the daemon does with its Discovery once it has started:
  announce()        the record Gossip signs, stored for record_ttl_s (a warning when it took longer than
                    the announce period); try_announce(), the same in the background, one store at a time (a
                    request during a store stores the newest record after it), waited for at most
                    ANNOUNCE_WAIT_S, with a warning when the DHT is unreachable: a round's announce never holds
                    the round up for long (a DHT store waits for its slowest node: a SIGSTOPped peer's held its
                    block-mates' rounds up by 6 s); close() lets a store in flight end (bounded), then cancels it;
  records()         every peer discovery knows of now ([] with a warning when the lookup failed), counted
                    per block in the metrics, their addresses bound to their peer ids for our call proofs and
                    their certificates pinned for TLS (swarmd.membership.trust);
  recent()          the last lookup's records while they are fresh enough, else a new lookup (the
                    block balance check before each round reuses the round's own lookups);
  announce_loop()   until the daemon stops: every announce period (with jitter) a DHT node first checks
                    its neighbours (re-bootstrapping after a partition, restarting a DHT process that died
                    alone), then announces; a failed pass is a warning and the next one tries again;
  wait_for_peers()  the first round waits until min_peers peers are known (or the timeout passes);
  pause()           a wait that ends early when the daemon stops.
Which discovery runs, and when it is shut down, is the daemon's (swarmd.node.startup opens it).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from swarmd.averaging.gossip import Gossip
from swarmd.errors import SwarmdError
from swarmd.membership.dht import HivemindDiscovery
from swarmd.membership.discovery import StaticDiscovery
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import bind_callees, pin_tls
from swarmd.metrics import Metrics
from swarmd.node.config import NetConfig
from swarmd.transport import PeerClient

logger = logging.getLogger(__name__)

ANNOUNCE_WAIT_S = 1.0  # try_announce's wait; a healthy store takes well under it (0.1-0.3 s on loopback)


class Presence:
    """:param stopping: the daemon's stop event (ends the loops)"""

    def __init__(
        self,
        discovery: StaticDiscovery | HivemindDiscovery,
        gossip: Gossip,
        client: PeerClient,
        metrics: Metrics,
        net: NetConfig,
        stopping: asyncio.Event,
    ):
        self.discovery, self.gossip, self.client, self.metrics = discovery, gossip, client, metrics
        self.net, self.stopping = net, stopping
        self.last: tuple[float, list[PeerRecord]] | None = None  # (monotonic time, records) of the last good lookup
        self.storing: asyncio.Task | None = None  # try_announce's store in the background
        self.asked = False  # a try_announce came since the background store last read our record

    async def announce(self) -> None:
        started = time.monotonic()
        ttl = self.net.record_ttl_s
        await self.discovery.announce(self.gossip.record(ttl), ttl)
        if (took := time.monotonic() - started) > self.net.announce_period_s:
            logger.warning("%s announce took %.1fs, longer than its period", self.gossip.tag, took)

    async def try_announce(self, wait_s: float = ANNOUNCE_WAIT_S) -> None:
        """announce() in the background, waited for at most wait_s; at most one store runs, and a request made
        while one runs stores the record of then after it. A store that fails (the DHT is unreachable: a timeout) is
        a warning: the announce loop tries again."""
        self.asked = True
        if self.storing is None or self.storing.done():
            self.storing = asyncio.create_task(self._store_asked())
        await asyncio.wait({self.storing}, timeout=wait_s)

    async def _store_asked(self) -> None:
        while self.asked:
            self.asked = False  # announce() reads the record before its first await: a later request stores again
            try:
                await self.announce()
            except SwarmdError as exc:
                logger.warning("%s announce failed: %s", self.gossip.tag, exc)

    async def close(self, grace_s: float = ANNOUNCE_WAIT_S) -> None:
        """The daemon is shutting its discovery down: a store still running gets grace_s to end (the last round's
        record, which its partners wait for: swarmd.node.settle), then is cancelled."""
        if self.storing is not None:
            await asyncio.wait({self.storing}, timeout=grace_s)
            self.storing.cancel()
            await asyncio.gather(self.storing, return_exceptions=True)

    async def records(self) -> list[PeerRecord]:
        """Every peer discovery knows of now ([] with a warning if the lookup failed)."""
        try:
            found = await self.discovery.find_all()
        except Exception as exc:
            logger.warning("%s peer lookup failed: %s", self.gossip.tag, exc)
            return []
        self.last = (time.monotonic(), found)
        self.metrics.observe_peers([(r.peer_id, r.block_index) for r in [*found, self.gossip.me]])
        bind_callees(self.client, found, skip=self.gossip.me.peer_id)  # our call proofs are signed for their callee
        await pin_tls(self.client, found, skip=self.gossip.me.peer_id)
        return found

    async def recent(self, max_age_s: float) -> list[PeerRecord]:
        """The records of the last good lookup if it is at most max_age_s old, else those of a new one (records())."""
        if self.last is not None and time.monotonic() - self.last[0] <= max_age_s:
            return self.last[1]
        return await self.records()

    async def announce_loop(self) -> None:
        period = self.net.announce_period_s
        while not self.stopping.is_set():
            if isinstance(self.discovery, HivemindDiscovery):
                try:
                    await self.discovery.keep_connected()  # no neighbour left: re-bootstrap (partition healed)
                except Exception as exc:
                    logger.warning("%s DHT neighbour check failed: %s", self.gossip.tag, exc)
            try:
                await self.announce()
            except Exception as exc:
                logger.warning("%s announce failed: %s", self.gossip.tag, exc)
            await self.pause(period * (1 + 0.2 * random.random()))

    async def wait_for_peers(self, want: int, timeout_s: float) -> None:
        """Block until discovery sees `want` peers, this one included (or timeout_s passes, with a warning)."""
        deadline = time.monotonic() + timeout_s
        while want > 1 and not self.stopping.is_set() and time.monotonic() < deadline:
            if len({r.peer_id for r in await self.records()} | {self.gossip.me.peer_id}) >= want:
                self.metrics.discovery_s = self.metrics.uptime_s
                return
            await self.pause(1.0)  # each lookup is a DHT traversal: do not hammer it
        if want > 1 and time.monotonic() >= deadline:
            logger.warning("%s started with fewer than %d peers (timeout)", self.gossip.tag, want)

    async def pause(self, timeout_s: float) -> None:
        """Wait timeout_s, or less once the daemon stops."""
        try:
            await asyncio.wait_for(self.stopping.wait(), timeout_s)
        except TimeoutError:
            pass
