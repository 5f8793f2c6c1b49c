"""Peer discovery: who is in the swarm, which block each peer trains, and where to dial it.

Owns the Discovery protocol, the two implementations without a DHT and the CLI clients' choice:
  StaticDiscovery    a fixed list of "host:port" gRPC addresses, asked for their status;
  MemoryDiscovery    a dict shared by in-process peers (unit tests of gossip);
  connect_discovery  multiaddrs -> a client-mode HivemindDiscovery, "host:port" -> StaticDiscovery.
The hivemind DHT implementation is swarmd.membership.dht (its process: swarmd.membership.dht_process);
records, their DHT keys and the block choice are swarmd.membership.records. No grpc server, no torch,
no hivemind here.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from swarmd.errors import SwarmdError
from swarmd.membership.addresses import check_peer_addresses, is_multiaddr
from swarmd.membership.dht import HivemindDiscovery
from swarmd.membership.records import PeerRecord, record_from_status
from swarmd.membership.trust import is_valid, verified

logger = logging.getLogger(__name__)


class Discovery(Protocol):
    async def announce(self, record: PeerRecord, ttl_s: float) -> None: ...

    async def find(self, block_index: int) -> list[PeerRecord]: ...

    async def find_all(self) -> list[PeerRecord]: ...

    def multiaddrs(self) -> list[str]: ...

    async def shutdown(self) -> None: ...


class MemoryDiscovery:
    """Records in a dict shared by in-process peers; expiry ignored (tests)."""

    def __init__(self, board: dict[str, PeerRecord] | None = None, peer_id: str | None = None):
        self.board = board if board is not None else {}
        self.peer_id = peer_id or uuid.uuid4().hex[:12]

    async def announce(self, record: PeerRecord, ttl_s: float) -> None:
        self.board[record.peer_id] = record

    async def find(self, block_index: int) -> list[PeerRecord]:
        return [r for r in await self.find_all() if r.block_index == block_index]

    async def find_all(self) -> list[PeerRecord]:
        return sorted(verified(list(self.board.values())), key=lambda r: r.peer_id)

    def multiaddrs(self) -> list[str]:
        return []

    async def shutdown(self) -> None:
        self.board.pop(self.peer_id, None)


StatusFn = Callable[[str], Awaitable[Any]]  # address -> pb.PeerStatus (PeerClient.status)


class StaticDiscovery:
    """A fixed list of "host:port" peers; find_all asks each for its status (unreachable ones are skipped).

    What the last find_all skipped stays readable (swarmd.node.diagnosis names the cause): `failures`, the error
    of each peer whose status call failed (a private swarm's refusal included), and `foreign`, the records of
    peers of another swarm id.

    :param status_fn: coroutine address -> pb.PeerStatus, e.g. a bound PeerClient.status with a timeout.
    """

    def __init__(self, addresses: list[str], status_fn: StatusFn, swarm_id: str = "", peer_id: str | None = None):
        self.addresses = list(dict.fromkeys(addresses))
        self.status_fn, self.swarm_id = status_fn, swarm_id
        self.peer_id = peer_id or uuid.uuid4().hex[:12]
        self.own: PeerRecord | None = None
        self.failures: dict[str, BaseException] = {}  # address -> why its status call failed (last find_all)
        self.foreign: list[PeerRecord] = []  # records of peers of another swarm id (last find_all)

    async def announce(self, record: PeerRecord, ttl_s: float) -> None:
        self.own = record  # nothing to publish: peers find us by asking our status

    async def find(self, block_index: int) -> list[PeerRecord]:
        return [r for r in await self.find_all() if r.block_index == block_index]

    async def find_all(self) -> list[PeerRecord]:
        others = [a for a in self.addresses if not self.own or a != self.own.address]
        results = await asyncio.gather(*(self.status_fn(a) for a in others), return_exceptions=True)
        records = [self.own] if self.own else []
        failures: dict[str, BaseException] = {}
        foreign: list[PeerRecord] = []
        for address, st in zip(others, results):
            if isinstance(st, BaseException):
                logger.debug("static peer %s unreachable: %s", address, st)
                failures[address] = st
                continue
            if self.swarm_id and st.swarm_id != self.swarm_id:
                foreign.append(record_from_status(st, address))
                continue
            rec = record_from_status(st, address)
            if st.signed_record and not is_valid(rec):
                logger.debug("static peer %s sent a record that is not signed by the peer it names", address)
                continue
            records.append(rec)  # a status without a signed record (an inference-only peer) is kept unsigned:
        # gossip and re-sync use signed records only (Gossip._remember), the survey and inference may use it
        self.failures, self.foreign = failures, foreign
        return sorted({r.peer_id: r for r in records}.values(), key=lambda r: r.peer_id)

    def multiaddrs(self) -> list[str]:
        return []

    async def shutdown(self) -> None:
        return None


async def connect_discovery(
    swarm: list[str],
    swarm_id: str,
    status_fn: StatusFn | None = None,
    start_timeout_s: float = 30.0,
    quick_start: bool = True,
) -> HivemindDiscovery | StaticDiscovery:
    """Discovery for CLI clients: multiaddrs -> a client-mode hivemind DHT; "host:port" -> static.

    :param quick_start: HivemindDiscovery's (its process-wide part included): off in a process that runs a daemon
        afterwards (`blocktrain join`)
    """
    if not swarm:
        raise SwarmdError("no swarm address given: pass a multiaddr printed by `blocktrain run` or a host:port")
    if any(is_multiaddr(s) for s in swarm) and not all(is_multiaddr(s) for s in swarm):
        raise SwarmdError("mix of multiaddrs and host:port addresses; pass one kind")
    check_peer_addresses(swarm)
    if all(is_multiaddr(s) for s in swarm):
        return await HivemindDiscovery.create(
            swarm_id, swarm, start_timeout_s=start_timeout_s, client_mode=True, quick_start=quick_start
        )
    if status_fn is None:
        raise SwarmdError("static discovery needs a status function")
    return StaticDiscovery(swarm, status_fn, swarm_id)
