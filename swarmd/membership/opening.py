"""The open-ended grow rule over signed records (TrainConfig.open_gain): how many blocks are open, in one peer's view.

Under the round-based grow schedule block b opens at round b x G + 1; a swarm with no last round may instead open
the next block when the newest open block (the frontier) stops gaining. Every peer of a --block auto swarm applies
this rule to the verified records it looks up (PeerRecord.held_out_ce: the held-out CE of the peer's block after
its last merged round, 0 = not measured) and the balance rule (swarmd.membership.balance) over the blocks it says
are open:
  trained_open()  1 + the highest block b such that server-mode records report a held-out CE of every block
                  1 .. b (someone trained each), so a block counts as open once a record of a peer that trains
                  it is out, its predecessors' too;
  Opening         one peer's view, kept across its lookups: at most one observation per own round, and only
                  when the frontier's records changed (a stale lookup is no plateau), of the frontier's CE (the
                  median of its records'); the next block opens once the last `patience` gains per round are all
                  below `gain` (swarmd.core.schedule.open_after), or once a record reports training it; either
                  only `patience` + 1 own rounds or more after the frontier opened in this view. Blocks never close.
What a lying peer can do: report a flat CE, or a CE for the next block; either opens one block early, and no faster
than one block per patience + 1 rounds of each honest peer's own clock, since no record makes an honest peer's
rounds pass: at worst the swarm grows at G = patience + 1, the round-based rule, and a block it opens early is
warm-started from its predecessor like any other. A peer's first look (a joiner, a restart) takes the records'
trained blocks as they are: a liar without a record on each block before it opens none of them even there.
Pure: no I/O, no clock but the rounds passed in.
"""

from __future__ import annotations

from swarmd.core.schedule import open_after
from swarmd.membership.balance import newest
from swarmd.membership.records import PeerRecord


def _measured(records: list[PeerRecord], blocks: int) -> list[PeerRecord]:
    """The newest record of each server-mode peer that reports a held-out CE of one of the `blocks` blocks."""
    return [
        r
        for r in newest(records).values()
        if r.address and not r.client_mode and 0 <= r.block_index < blocks and r.held_out_ce > 0
    ]


def trained_open(records: list[PeerRecord], blocks: int) -> int:
    """1 + the highest block b such that server-mode records report a held-out CE of each block 1 .. b (1: block 0
    alone)."""
    trained, n = {r.block_index for r in _measured(records, blocks)}, 1
    while n < blocks and n in trained:
        n += 1
    return n


def frontier_ce(records: list[PeerRecord], block: int) -> float | None:
    """The (low) median held-out CE the records of `block` report; None when none does."""
    ces = sorted(r.held_out_ce for r in _measured(records, block + 1) if r.block_index == block)
    return ces[(len(ces) - 1) // 2] if ces else None


class Opening:
    """One peer's view of the open-ended rule (see the module doc).

    :param gain: nats per round below which the frontier counts as stalled (TrainConfig.open_gain)
    :param patience: stalled rounds in a row before the next block opens (TrainConfig.open_patience)
    """

    def __init__(self, gain: float, patience: int):
        if gain <= 0 or patience < 1:
            raise ValueError(f"gain must be > 0 and patience >= 1, got {gain}, {patience}")
        self.gain, self.patience = gain, patience
        self.opened = 0  # blocks open in this view (0: no look yet)
        self.since = 0  # our round when the frontier (block opened - 1) opened in this view
        self.seen: list[tuple[int, float]] = []  # (our round, the frontier's CE) observations since then
        self._last: frozenset[tuple[str, int, float]] = frozenset()  # the frontier's records last observed

    def observe(self, records: list[PeerRecord], own_round: int, blocks: int) -> int:
        """Blocks open at our coming round, given the verified records of a lookup made at our round `own_round`."""
        if not self.opened:  # a first look: the trained blocks as they are
            self.opened, self.since = min(blocks, trained_open(records, blocks)), own_round
        frontier = self.opened - 1
        mine = frozenset(
            (r.peer_id, r.round, r.held_out_ce) for r in _measured(records, blocks) if r.block_index == frontier
        )
        ce = frontier_ce(records, frontier)
        if ce is not None and mine != self._last and (not self.seen or self.seen[-1][0] < own_round):
            self.seen.append((own_round, ce))
            self._last = mine
        if self.opened < blocks and own_round - self.since > self.patience and self._opens(records):
            self.opened, self.since, self.seen, self._last = self.opened + 1, own_round, [], frozenset()
        return self.opened

    def gains(self) -> list[float]:
        """The frontier's CE gain per round between consecutive observations, oldest first."""
        return [(a - b) / (rb - ra) for (ra, a), (rb, b) in zip(self.seen, self.seen[1:], strict=False)]

    def _opens(self, records: list[PeerRecord]) -> bool:
        """Whether the block after the frontier opens now: the frontier stalled, or a record reports training it."""
        return (
            open_after(self.gains(), self.gain, self.patience) or trained_open(records, self.opened + 1) > self.opened
        )
