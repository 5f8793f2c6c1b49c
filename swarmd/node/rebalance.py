"""When a --block auto peer moves to another block, and the state it takes there (no empty block).

swarmd.membership.balance says who moves where over one view of the records. A trained peer moves only
when two lookups in a row, the second newer than the first, name the same target: one DHT traversal
that missed a record must not make a trained peer drop its block (Rebalancer.decide; Rebalancer.check
asks it over the verified records of a recent lookup, a new one to confirm a move). The state it then
trains (moved_state) is a fresh state of the new block, its initial weights, the next re-sync pulling
what the block's peers hold, that keeps the peer's round and merged byte table: the swarm shares those
whatever the block, so a moved peer stays in step instead of lagging like a joiner. The trained block it
leaves is dropped, with its optimizer state (its replicas keep the block), and is never checkpointed as
the new one.

Under the grow schedule (TrainConfig.pipeline + grow) the rule counts only the blocks open at the coming
round (grow_open: block b opens at round b x pipeline_stagger + 1 of our record's window, the round being
ours or, when higher, the records' median: a joiner's), so --block auto peers of blocks not open yet
are replicas of the open ones, and a block's opening pulls one peer in. Since an opening is known a round
ahead, the confirm's first lookup is the one a round before it (Rebalancer.decide's `open_next`): the mover
lands for the block's first round, where swarmd.node.training warm-starts it from its predecessor. With
TrainConfig.open_gain the open blocks are the open-ended rule's instead (swarmd.membership.opening, one
Opening per peer, kept across its moves), which names no opening ahead.
"""

from __future__ import annotations

from swarmd.averaging.gossip import Gossip
from swarmd.averaging.state import BlockState
from swarmd.core.schedule import open_blocks
from swarmd.membership.balance import Move, coming_round, next_move
from swarmd.membership.opening import Opening
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import verified
from swarmd.node.config import DaemonConfig
from swarmd.node.presence import Presence
from swarmd.node.startup import new_state


class Rebalancer:
    """The confirm-twice rule of a trained peer over swarmd.membership.balance.next_move."""

    def __init__(self) -> None:
        self._unconfirmed: tuple[int, float] | None = None  # (target, lookup time) the last check named
        self.opening: Opening | None = None  # the open-ended rule's view (TrainConfig.open_gain), from the first check

    def decide(
        self,
        records: list[PeerRecord],
        me: PeerRecord,
        blocks: int,
        *,
        trained: bool,
        looked_up: float,
        open_now: int | None = None,
        open_next: int | None = None,
    ) -> Move | None:
        """The move to make now (None: stay).

        :param records: the verified records of our swarm and model config
        :param trained: whether this peer has taken local steps (then it moves only into an empty block, confirmed)
        :param looked_up: when the lookup that found `records` was made (monotonic seconds)
        :param open_now: blocks open at the coming round (the grow schedule; None: every block)
        :param open_next: ... at the round after it: a move into the block opening then is this lookup's to name,
            the next one (when it opens) confirms it
        """
        move = next_move(records, me, blocks, trained=trained, open_blocks=open_now)
        seen, self._unconfirmed = self._unconfirmed, None
        if move is None:
            if trained and open_next is not None and open_next != open_now:
                ahead = next_move(records, me, blocks, trained=True, open_blocks=open_next)
                if ahead is not None:
                    self._unconfirmed = (ahead.target, looked_up)
            return None
        if trained and (seen is None or seen[0] != move.target or seen[1] >= looked_up):
            self._unconfirmed = (move.target, looked_up)  # the next check, over a newer lookup, confirms it
            return None
        return move

    async def check(
        self, presence: Presence, gossip: Gossip, state: BlockState, config: DaemonConfig, max_age_s: float | None
    ) -> Move | None:
        """decide() for the peer of `gossip` training `state` (trained: it took local steps), over the verified records
        of our swarm and model config in a recent lookup (a new one when the last check named a move to confirm, or
        the round after the coming one opens a block).

        :param max_age_s: how old the lookup may be (None: one announce period; 0: look up now)
        """
        net, trained = config.net, state.local_steps > 0
        me, blocks = gossip.record(net.record_ttl_s), config.model.blocks
        age = net.announce_period_s if max_age_s is None else max_age_s
        if self._unconfirmed is not None or (trained and self.opening_next(config, me)):
            age = 0.0  # a move to confirm, or a block opening next round whose mover this lookup names
        found = await presence.recent(age)
        records = [r for r in verified(found) if r.config_hash == me.config_hash and r.swarm_id == net.swarm_id]
        looked_up = presence.last[0] if presence.last is not None else 0.0
        now, ahead = self.open_counts(config, me, records)
        return self.decide(records, me, blocks, trained=trained, looked_up=looked_up, open_now=now, open_next=ahead)

    def opening_next(self, config: DaemonConfig, me: PeerRecord) -> bool:
        """Whether the round-based grow rule opens a block at the round after our coming one (by our round)."""
        return not config.train.open_gain and grow_open(config, me, [], 1) != grow_open(config, me, [])

    def open_counts(self, config: DaemonConfig, me: PeerRecord, records: list[PeerRecord]) -> tuple[int | None, ...]:
        """(blocks open at the coming round, at the round after it; None: every block): the round-based grow rule's
        (grow_open), or with TrainConfig.open_gain the open-ended rule's over `records` (no opening known ahead)."""
        train = config.train
        if not train.open_gain:
            return grow_open(config, me, records), grow_open(config, me, records, 1)
        if self.opening is None:
            self.opening = Opening(train.open_gain, train.open_patience)
        return self.opening.observe(records, me.round, config.model.blocks), None


def grow_open(config: DaemonConfig, me: PeerRecord, records: list[PeerRecord], ahead: int = 0) -> int | None:
    """Blocks open at the coming round (+ `ahead`) under the grow schedule (TrainConfig.pipeline + grow: block b
    opens at round b x pipeline_stagger + 1 of our record's window); None under any other schedule (all open)."""
    train = config.train
    if not (train.pipeline and train.grow):
        return None
    stagger = train.pipeline_stagger
    start = max(0, me.train_first - 1 - me.block_index * stagger) if me.train_first else 0  # the window's start
    round_no = coming_round(records, me.round, me.peer_id) + ahead - start
    return open_blocks("grow", round_no, config.model.blocks, stagger)


def moved_state(current: BlockState, config: DaemonConfig, block: int, peer_seed: int) -> BlockState:
    """A fresh state of `block` keeping `current`'s round, merged byte table (and its outer momentum) and sample
    count (blocking: run it in the worker thread)."""
    round, _, emb, momentum = current.snapshot_outer()
    state = new_state(config, block, peer_seed)
    state.adopt(None, emb, round, {"emb": momentum["emb"]} if momentum else None)
    state.samples = current.samples
    return state
