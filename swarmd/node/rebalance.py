"""When a --block auto peer moves to another block, and the state it takes there (issue 22: no empty block).

swarmd.membership.balance says who moves where over one view of the records. A trained peer moves only
when two lookups in a row, the second newer than the first, name the same target: one DHT traversal
that missed a record must not make a trained peer drop its block (Rebalancer.decide). The state it
then trains (moved_state) is a fresh state of the new block, its initial weights, the next re-sync
pulling what the block's peers hold, that keeps the peer's round and merged byte table: the swarm
shares those whatever the block, so a moved peer stays in step instead of lagging like a joiner. The
trained block it leaves is dropped (its replicas keep it) and is never checkpointed as the new one.
"""

from __future__ import annotations

from swarmd.averaging.state import BlockState
from swarmd.membership.balance import Move, next_move
from swarmd.membership.records import PeerRecord
from swarmd.node.config import DaemonConfig
from swarmd.node.startup import new_state


class Rebalancer:
    """The confirm-twice rule of a trained peer over swarmd.membership.balance.next_move."""

    def __init__(self) -> None:
        self._unconfirmed: tuple[int, float] | None = None  # (target, lookup time) the last check named

    def decide(
        self, records: list[PeerRecord], me: PeerRecord, blocks: int, *, trained: bool, looked_up: float
    ) -> Move | None:
        """The move to make now (None: stay).

        :param records: the verified records of our swarm and model config
        :param trained: whether this peer has taken local steps (then it moves only into an empty block, confirmed)
        :param looked_up: when the lookup that found `records` was made (monotonic seconds)
        """
        move = next_move(records, me, blocks, trained=trained)
        seen, self._unconfirmed = self._unconfirmed, None
        if move is None:
            return None
        if trained and (seen is None or seen[0] != move.target or seen[1] >= looked_up):
            self._unconfirmed = (move.target, looked_up)  # the next check, over a newer lookup, confirms it
            return None
        return move


def moved_state(current: BlockState, config: DaemonConfig, block: int, peer_seed: int) -> BlockState:
    """A fresh state of `block` keeping `current`'s round, merged byte table (and its outer momentum) and sample
    count (blocking: run it in the worker thread)."""
    round, _, emb, momentum = current.snapshot_outer()
    state = new_state(config, block, peer_seed)
    state.adopt(None, emb, round, {"emb": momentum["emb"]} if momentum else None)
    state.samples = current.samples
    return state
