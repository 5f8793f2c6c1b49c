"""Block balance: which peers move to another block so that no block goes unserved (issue 22).

Petals' rebalancing is the anchor (a peer re-checks the swarm and moves where it is needed), made
deterministic so that every auto-placed peer, running the same rule over the same signed records,
agrees on who moves without talking. A block is served when a server-mode peer (one with an
address: PullState, exchanges and inference can reach it) trains it; client-mode peers serve no
block, so they count for none and never move. Peers pinned to their block (an explicit --block,
PeerRecord.pinned) count but never move.
  served()     server-mode peers per block, each peer counted once (its newest record);
  plan()       where every server-mode peer trains once the rule's moves are made. One move at a
               time until none is left: the target is the least-served block (lowest index on a tie),
               the donor the most-served block (lowest index on a tie) that holds a peer free to move
               and has at least two peers more than the target; its mover is the free peer with the
               lowest (round, peer id), so a joiner that merged no round yet goes before a peer that
               did, then the lower peer id. A peer's round only grows, so two peers of one block
               never both see themselves as the mover, however stale each one's record of the other.
               Every move lowers the sum of squared counts (the plan ends); a block that received a
               peer never gives one, so no peer moves twice and no two peers swap blocks. fill_only:
               only moves into a block nobody serves (the first moves of the full plan);
  next_move()  where this peer moves now (None: stay): a peer that has trained moves only to fill a
               block nobody serves (its trained replica stays with the peers it leaves); one that has
               not trained yet also evens the counts out (joiners that chose the same block together).
Pure: no I/O. The caller passes the verified records of its swarm and model config.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarmd.membership.records import PeerRecord


@dataclass(frozen=True)
class Move:
    """One peer's move, with the server-mode peer counts of both blocks as the records show them now."""

    source: int
    target: int
    source_peers: int
    target_peers: int

    def __str__(self) -> str:
        there = "none" if not self.target_peers else f"has {self.target_peers}"
        return (
            f"block {self.source} has {self.source_peers} peers and block {self.target} {there}: "
            f"moving to block {self.target}"
        )


def newest(records: list[PeerRecord]) -> dict[str, PeerRecord]:
    """peer id -> its newest record (latest expiry, then highest round)."""
    out: dict[str, PeerRecord] = {}
    for r in records:
        old = out.get(r.peer_id)
        if old is None or (r.expires, r.round) > (old.expires, old.round):
            out[r.peer_id] = r
    return out


def _servers(records: list[PeerRecord], blocks: int) -> list[PeerRecord]:
    """The newest record of each server-mode peer that trains one of the `blocks` blocks."""
    return [r for r in newest(records).values() if r.address and not r.client_mode and 0 <= r.block_index < blocks]


def served(records: list[PeerRecord], blocks: int) -> list[int]:
    """Server-mode peers per block (index = block)."""
    counts = [0] * blocks
    for r in _servers(records, blocks):
        counts[r.block_index] += 1
    return counts


def plan(records: list[PeerRecord], blocks: int, fill_only: bool = False) -> dict[str, int]:
    """peer id -> the block it trains once the rule's moves are made, for every server-mode peer (module doc).

    :param fill_only: only the moves into a block nobody serves
    """
    peers = _servers(records, blocks)
    where = {r.peer_id: r.block_index for r in peers}
    free = sorted((r for r in peers if not r.pinned), key=lambda r: (r.round, r.peer_id))
    moved: set[str] = set()
    while blocks > 1:
        counts = [0] * blocks
        for b in where.values():
            counts[b] += 1
        target = min(range(blocks), key=lambda b: (counts[b], b))
        if fill_only and counts[target]:
            break
        mover = next(
            (
                r.peer_id
                for donor in sorted(range(blocks), key=lambda b: (-counts[b], b))
                if counts[donor] - counts[target] >= 2
                for r in free
                if where[r.peer_id] == donor and r.peer_id not in moved
            ),
            None,
        )
        if mover is None:
            break
        where[mover] = target
        moved.add(mover)
    return where


def next_move(records: list[PeerRecord], me: PeerRecord, blocks: int, trained: bool) -> Move | None:
    """Where this peer moves now, or None (stay); see the module doc.

    :param records: the swarm's verified records of our swarm and config (ours among them or not: `me` replaces it)
    :param me: this peer's current record
    :param trained: whether this peer has trained its block (then it moves only into a block nobody serves)
    """
    if me.pinned or not me.address or me.client_mode or not 0 <= me.block_index < blocks:
        return None
    view = [r for r in records if r.peer_id != me.peer_id] + [me]
    target = plan(view, blocks, fill_only=trained).get(me.peer_id, me.block_index)
    if target == me.block_index:
        return None
    counts = served(view, blocks)
    return Move(me.block_index, target, counts[me.block_index], counts[target])
