"""Block balance: which peers move to another block so that no block goes unserved.

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
               lowest (merged a round yet, peer id), so a joiner that merged no round yet goes before a
               peer that did, then the lower peer id. That key only grows, so two peers of one block
               never both see themselves as the mover, however stale each one's record of the other;
               and, the round itself left out, records a round stale (each peer's own is its newest)
               do not make every trained peer see another as the mover, round after round.
               Every move lowers the sum of squared counts (the plan ends); a block that received a
               peer never gives one, so no peer moves twice and no two peers swap blocks. fill_only:
               only moves into a block nobody serves (the first moves of the full plan). open_blocks (the
               grow schedule, swarmd.core.schedule): only blocks 0 .. open_blocks - 1 are open; a free peer on
               a block not open yet is displaced first (to the least-served open block, lowest index on a
               tie, in the movers' order), then the moves above run over the open blocks, so that a
               block's opening makes it the unserved one and pulls exactly one peer in; pinned peers of a
               block not open yet count nowhere until it opens;
  next_move()  where this peer moves now (None: stay): a peer that has trained moves only to fill a
               block nobody serves (its trained replica stays with the peers it leaves); one that has
               not trained yet also evens the counts out (joiners that chose the same block together); a
               peer on a block not open yet moves, trained or not;
  coming_round() the swarm round a peer trains next (the grow schedule's clock): the higher of its own
               and the others' (low) median round, + 1: a joiner goes by the median, which a few peers
               claiming a far round do not move.
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
    closed: bool = False  # the source block is not open yet (the grow schedule)

    def __str__(self) -> str:
        there = "none" if not self.target_peers else f"has {self.target_peers}"
        source = "is not open yet" if self.closed else f"has {self.source_peers} peers"
        return f"block {self.source} {source} and block {self.target} {there}: moving to block {self.target}"


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


def _open(blocks: int, open_blocks: int | None) -> int:
    """How many of the `blocks` blocks are open (None: all; at least block 0 always)."""
    return blocks if open_blocks is None else max(1, min(open_blocks, blocks))


def plan(
    records: list[PeerRecord], blocks: int, fill_only: bool = False, open_blocks: int | None = None
) -> dict[str, int]:
    """peer id -> the block it trains once the rule's moves are made, for every server-mode peer (module doc).

    :param fill_only: only the moves into a block nobody serves (a peer on a block not open yet moves all the same)
    :param open_blocks: how many blocks are open (the grow schedule; None: all of them)
    """
    n = _open(blocks, open_blocks)
    peers = _servers(records, blocks)
    where = {r.peer_id: r.block_index for r in peers}
    free = sorted((r for r in peers if not r.pinned), key=lambda r: (r.round > 0, r.peer_id))
    moved: set[str] = set()

    def counts() -> list[int]:
        out = [0] * n
        for b in where.values():
            if b < n:
                out[b] += 1
        return out

    for r in free:  # displaced: a free peer on a block not open yet goes to the least-served open block
        if where[r.peer_id] >= n:
            now = counts()
            where[r.peer_id] = min(range(n), key=lambda b: (now[b], b))
            moved.add(r.peer_id)
    while n > 1:
        count = counts()
        target = min(range(n), key=lambda b: (count[b], b))
        if fill_only and count[target]:
            break
        mover = next(
            (
                r.peer_id
                for donor in sorted(range(n), key=lambda b: (-count[b], b))
                if count[donor] - count[target] >= 2
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


def next_move(
    records: list[PeerRecord], me: PeerRecord, blocks: int, trained: bool, open_blocks: int | None = None
) -> Move | None:
    """Where this peer moves now, or None (stay); see the module doc.

    :param records: the swarm's verified records of our swarm and config (ours among them or not: `me` replaces it)
    :param me: this peer's current record
    :param trained: whether this peer has trained its block (then it moves only into a block nobody serves)
    :param open_blocks: how many blocks are open at the coming round (the grow schedule; None: all of them)
    """
    if me.pinned or not me.address or me.client_mode or not 0 <= me.block_index < blocks:
        return None
    view = [r for r in records if r.peer_id != me.peer_id] + [me]
    target = plan(view, blocks, fill_only=trained, open_blocks=open_blocks).get(me.peer_id, me.block_index)
    if target == me.block_index:
        return None
    counts = served(view, blocks)
    closed = me.block_index >= _open(blocks, open_blocks)
    return Move(me.block_index, target, counts[me.block_index], counts[target], closed)


def coming_round(records: list[PeerRecord], own_round: int = 0, own_id: str = "") -> int:
    """The swarm round a peer (`own_id`, `own_round` rounds merged) trains next: the higher of its own round and the
    (low) median round of the others' newest records, + 1 (a joiner of a running swarm goes by the median)."""
    rounds = sorted(r.round for r in newest(records).values() if r.peer_id != own_id)
    return max(own_round, rounds[(len(rounds) - 1) // 2] if rounds else 0) + 1
