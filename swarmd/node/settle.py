"""The end of a run with a last round: the replicas that merged the last round end it on one state.

Peers close the last round at different moments; one whose deadline ran out before a delta came merged another set
than its block's other peers, and with no round after it nothing would re-sync it: the run would end with replicas
apart. settle() runs after the last round's merge, before the peer stops:
  1. it waits (bounded) until the peers whose deltas came in the last round announce that round;
  2. it re-syncs once, by the normal rule (swarmd.averaging.agreement: only a state a quorum of signed records
     announces at the highest round, pulled, hashed and verified) over the records up to the last round (a
     pipeline's later blocks train on), so a peer left in a minority takes the others';
  3. it stays up (bounded) while a peer it merged with announces other weights at that round, so a peer that must
     pull our state still finds us serving.
A peer stopped by a signal, or that never reached the last round, does not wait. Every wait is bounded by the
timeout the caller gives (the round deadline): a peer that never announces the last round, a liar's among them,
costs at most that, once per run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from swarmd.averaging.gossip import Gossip
from swarmd.averaging.state import BlockState
from swarmd.membership.records import PeerRecord

logger = logging.getLogger(__name__)

POLL_S = 0.2  # how often the records are looked up while waiting


class SettlingPeer(Protocol):
    """What settle() needs of a peer (swarmd.node.daemon.Daemon)."""

    state: BlockState
    gossip: Gossip
    stopping: asyncio.Event

    async def records(self) -> list[PeerRecord]: ...

    async def announce(self) -> None: ...

    def update_serving(self) -> None: ...


def last_partners(peer: SettlingPeer) -> tuple[set[str], set[str]]:
    """(every peer whose signed delta came in our last merged round, those of them whose deltas we merged)."""
    came: set[str] = set()
    merged: set[str] = set()
    for same, other in peer.gossip.last_split.values():
        came |= same | set(other)
        merged |= same
    return came, merged


def apart(peer: SettlingPeer, records: list[PeerRecord], ids: set[str], last: int) -> set[str]:
    """The peers of `ids` whose records announce round `last` on other weights than ours: the block's weights for a
    peer of our block, the byte table's for every peer (a peer past it trains on: a pipeline's later block)."""
    me = peer.gossip.record()
    out = set()
    for r in records:
        if r.peer_id in ids and r.round == last:
            block_apart = r.block_index == me.block_index and r.base_hash != me.base_hash
            if block_apart or r.emb_hash != me.emb_hash:
                out.add(r.peer_id)
    return out


async def _poll(peer: SettlingPeer, until: float, done: Callable[[list[PeerRecord]], bool]) -> list[PeerRecord]:
    """Look the records up every POLL_S until done(records) or the monotonic time `until`; the last lookup."""
    while True:
        records = await peer.records()
        if done(records) or time.monotonic() >= until or peer.stopping.is_set():
            return records
        await asyncio.sleep(POLL_S)


async def settle(peer: SettlingPeer, last: int, timeout_s: float) -> list[str]:
    """Agree on the last round's state with the peers of that round (see the module doc); the parts adopted."""
    if not last or peer.state.round < last or peer.stopping.is_set():
        return []
    came, merged = last_partners(peer)
    if not came:
        return []
    until = time.monotonic() + timeout_s
    announced = lambda records: {r.peer_id for r in records if r.round >= last}
    records = await _poll(peer, until, lambda rs: came <= announced(rs))
    adopted = await peer.gossip.sync([r for r in records if r.round <= last])  # the state the run ended with
    if adopted:
        logger.info("%s ended the run on the state its peers hold at round %d (%s)", peer.gossip.tag, last, adopted)
        peer.update_serving()
        await peer.announce()
    # serve while a peer we merged with announces other weights: it may be pulling ours
    await _poll(peer, until, lambda rs: not apart(peer, rs, merged, last))
    return adopted
