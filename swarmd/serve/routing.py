"""Routing of a swarm client's calls: which replica of a block to call, by latency and load, and whom to avoid.

Owns:
  - `Replica`: one holder of a block as the client sees it (its record, latency EMA, calls in flight);
  - `BlockRouter`: finds the holders of every block through a Discovery (anything with find / find_all, e.g.
    swarmd.membership.discovery's), probes each once for its round-trip time, then picks one peer per block by
    latency EMA x (1 + calls this client has in flight to it); a peer that fails or stalls is banned for an
    exponentially growing period (swarmd.backoff), and one found lying (swarmd.serve.verify) is dropped for the
    client's life (`distrust`);
  - `pin_tls()` and `check_coverage()`: TLS pinning from signed records, and the one-line error for a block no
    reachable peer serves.
Talks to peers only through the PeerClient interface of swarmd.transport (status, pin); no torch here.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from swarmd.backoff import Backoff
from swarmd.core.config import ModelConfig
from swarmd.errors import PeerUnavailable, SwarmdError

logger = logging.getLogger(__name__)


@dataclass
class Replica:
    record: Any  # swarmd.membership.records.PeerRecord
    latency_s: float | None = None  # EMA of call round-trip time
    inflight: int = 0

    @property
    def address(self) -> str:
        return self.record.address

    def score(self) -> float:
        return (self.latency_s if self.latency_s is not None else 1.0) * (1 + self.inflight)


class BlockRouter:
    """One peer per block, by measured latency and load; bans failing peers for a while.

    :param discovery: anything with `async find(block_index) -> list[PeerRecord]`
    :param client: a PeerClient (needs `async status(address, timeout_s)`)
    :param probe_timeout_s: deadline of the latency probe of a new replica
    """

    def __init__(
        self,
        discovery,
        client,
        config_hash: str,
        swarm_id: str | None = None,
        probe_timeout_s: float = 5.0,
        ban_s: float = 2.0,
        max_ban_s: float = 60.0,
        refresh_s: float = 30.0,
    ):
        self.discovery, self.client = discovery, client
        self.config_hash, self.swarm_id = config_hash, swarm_id
        self.probe_timeout_s, self.refresh_s = probe_timeout_s, refresh_s
        self.bans = Backoff(base_s=ban_s, max_s=max_ban_s)  # address -> ban of a failing replica
        self._replicas: dict[int, dict[str, Replica]] = {}
        self._refreshed: dict[int, float] = {}  # block -> monotonic time of the last discovery lookup
        self.distrusted: dict[str, str] = {}  # address -> why: dropped for this client's life (a wrong answer)

    async def refresh(self, block_index: int) -> list[Replica]:
        """Look the block's holders up again (new replicas join; stats of known ones are kept)."""
        self._refreshed[block_index] = time.monotonic()
        await self._add(block_index, await self.discovery.find(block_index))
        return list(self._replicas.setdefault(block_index, {}).values())

    async def seed(self, records: list, blocks: range) -> None:
        """Take the holders of these blocks from one swarm-wide lookup's records (a discovery's find_all), as if
        each block had just been refreshed: no lookup per block. A block that none of them serves is looked up
        on its own when chosen (choose refreshes a block with no usable replica)."""
        now = time.monotonic()
        for b in blocks:
            self._refreshed[b] = now
            await self._add(b, [r for r in records if getattr(r, "block_index", None) == b])

    async def _add(self, block_index: int, records: list) -> None:
        known = self._replicas.setdefault(block_index, {})
        for rec in records:
            if not rec.address or getattr(rec, "client_mode", False):
                continue  # client-mode peers accept no inbound calls
            if self.swarm_id and getattr(rec, "swarm_id", "") not in ("", self.swarm_id):
                continue
            if getattr(rec, "config_hash", "") not in ("", self.config_hash):
                continue
            await pin_tls(self.client, rec)
            if rec.address in known:
                known[rec.address].record = rec
            else:
                known[rec.address] = Replica(rec)

    def known(self, block_index: int) -> list[Replica]:
        """The replicas of a block known so far (no lookup), banned and dropped ones included."""
        return list(self._replicas.get(block_index, {}).values())

    async def probe_all(self) -> None:
        """Probe every known replica not measured yet, all at once (each with probe_timeout_s)."""
        todo = [r for replicas in self._replicas.values() for r in replicas.values() if r.latency_s is None]
        await asyncio.gather(*(self._probe(r) for r in todo))

    async def choose(self, block_index: int, exclude: Container[str] = frozenset()) -> Replica:
        """The best usable replica of a block; raises PeerUnavailable when there is none."""
        now = time.monotonic()
        stale = now - self._refreshed.get(block_index, -math.inf) > self.refresh_s
        for attempt in range(int(stale), 2):
            replicas = (
                list(self._replicas.get(block_index, {}).values()) if attempt == 0 else await self.refresh(block_index)
            )
            usable = [
                r
                for r in replicas
                if r.address not in exclude
                and r.address not in self.distrusted
                and not self.bans.banned(r.address, now)
            ]
            for r in usable:
                if r.latency_s is None:
                    await self._probe(r)
            usable = [r for r in usable if not self.bans.banned(r.address)]
            if usable:
                return min(usable, key=Replica.score)
        where = f" of swarm {self.swarm_id!r}" if self.swarm_id else ""
        raise PeerUnavailable(f"no reachable peer serves block {block_index}{where}")

    async def _probe(self, replica: Replica) -> None:
        t0 = time.perf_counter()
        try:
            await self.client.status(replica.address, timeout_s=self.probe_timeout_s)
        except SwarmdError as exc:
            self.report_failure(replica, exc)
            return
        replica.latency_s = time.perf_counter() - t0

    def report_latency(self, replica: Replica, seconds: float) -> None:
        self.bans.succeed(replica.address)
        replica.latency_s = seconds if replica.latency_s is None else 0.8 * replica.latency_s + 0.2 * seconds

    def distrust(self, address: str, why: str) -> None:
        """Never route to this peer again in this client's life (it gave an answer no honest peer gives)."""
        if address not in self.distrusted:
            self.distrusted[address] = why
            logger.warning("dropped peer %s for this session: %s", address, why)

    def report_failure(self, replica: Replica, exc: BaseException) -> None:
        ban = self.bans.fail(replica.address)
        logger.warning(
            "block %d: peer %s failed (%s); banned for %.1f s",
            replica.record.block_index,
            replica.address,
            exc or type(exc).__name__,
            ban,
        )


async def pin_tls(client, record) -> None:
    """A peer whose (signed, verified by discovery) record names a TLS certificate is dialled over TLS pinned
    to it (PeerClient.pin); one that cannot be pinned is logged and its calls fail like an unreachable peer's."""
    fingerprint = getattr(record, "tls_fingerprint", "")
    if fingerprint and record.address and hasattr(client, "pin"):
        try:
            await client.pin(record.address, fingerprint)
        except SwarmdError as exc:
            logger.warning("cannot pin the TLS certificate of %s: %s", record.address, exc)


async def check_coverage(router: BlockRouter, cfg: ModelConfig, records: list | None = None) -> None:
    """Raise PeerUnavailable naming the first block no reachable peer serves.

    :param records: a swarm-wide lookup's records (swarm_model_config's): the router starts from them, with no
        lookup per block (None: one lookup per block); every replica is then probed at once
    """
    if records is None:
        for b in range(cfg.blocks):
            await router.refresh(b)
    else:
        await router.seed(records, range(cfg.blocks))
    await router.probe_all()
    for b in range(cfg.blocks):
        await router.choose(b)
