"""What one peer pulls from the others: their merged blocks.

Owns the order peers of a block are asked in (pull_order: the weights most records share first), the
pulls of other blocks' merged states (one block, several, or all the predecessors trajectory training
runs frozen, or none), the round-start load of those predecessors into the BlockState, and their
mid-round refresh from the predecessors' working weights (bounded by how far our own block moved in the
same steps: WORKING_DRIFT). Predecessor pulls go as GossipConfig.pull_codec says (int8: compact, frozen inputs
only, swarmd.averaging.compact; int8-chain: after the first, round-start pulls as steps along a chain,
swarmd.averaging.pull_chain). Every pull is best effort: a peer that fails is logged and skipped. No
policy, no state of its own. What the pulled blocks are measured with (the assembled model's CE) is
swarmd.node.measure.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable

import torch

from swarmd.averaging.gossip import Gossip
from swarmd.averaging.state import BlockState
from swarmd.core.config import ModelConfig
from swarmd.core.train import trajectory_predecessors
from swarmd.errors import SwarmdError
from swarmd.membership.records import PeerRecord

logger = logging.getLogger(__name__)
StateDict = dict[str, torch.Tensor]
# a predecessor's working weights are run only within this many times our own block's movement this round of its
# merged state (blocks of one config at one learning rate move alike, give or take a few steps of warmup or of a
# faster peer; a peer serving weights further off, hostile or broken, leaves us on the round-start state)
WORKING_DRIFT = 8.0


def pull_order(records: list[PeerRecord], block_index: int) -> list[PeerRecord]:
    """The dialable peers of a block, those whose announced weights (base_hash) most records share first, then
    the newest round, then peer id: a lone peer announcing weights nobody else holds (stale, or hostile in a
    public swarm) is asked last, whatever order the DHT returned the records in."""
    candidates = [r for r in records if r.block_index == block_index and r.address]
    shared = Counter(r.base_hash for r in candidates)
    return sorted(candidates, key=lambda r: (-shared[r.base_hash], -r.round, r.peer_id))


def pulls_compact(gossip: Gossip) -> bool:
    """Whether this peer pulls its trajectory predecessors compact (any but fp32; GossipConfig.pull_codec)."""
    return gossip.cfg.pull_codec != "fp32"


def pulls_chained(gossip: Gossip) -> bool:
    """Whether this peer's round-start predecessor pulls go along chains (GossipConfig.pull_codec "int8-chain")."""
    return gossip.cfg.pull_codec == "int8-chain"


async def pull_block(
    gossip: Gossip, records: list[PeerRecord], block_index: int, compact: bool = False, chain: bool = False
) -> StateDict | None:
    """The merged state of another block from the first peer of pull_order that answers (None if none does)."""
    for r in pull_order(records, block_index):
        try:
            return await gossip.fetch_block(r, compact, chain)
        except SwarmdError as exc:
            logger.info("%s could not pull block %d from %s: %s", gossip.tag, block_index, r.peer_id[-6:], exc)
    return None


async def pull_blocks(
    gossip: Gossip, records: list[PeerRecord], blocks: Iterable[int], compact: bool = False, chain: bool = False
) -> dict[int, StateDict]:
    """block index -> merged state, for each of `blocks` some peer served (one after the other)."""
    pulled = {}
    for b in blocks:
        if (state := await pull_block(gossip, records, b, compact, chain)) is not None:
            pulled[b] = state
    return pulled


async def pull_predecessors(
    gossip: Gossip,
    records: list[PeerRecord],
    cfg: ModelConfig,
    block_index: int,
    held: dict[int, StateDict] | None = None,
) -> dict[int, StateDict] | None:
    """Merged states of every block the sampler runs before block_index (trajectory training). A block with no
    reachable peer keeps the state pulled in an earlier round (`held`, the predecessors the last round ran): a
    block trained on the trajectory is wrecked by rounds of noisy targets (a pipelined swarm whose earlier blocks
    ended and left), a round-old predecessor costs little. None, with a warning, when one was never pulled (the
    round then trains on noisy targets)."""
    needed = sorted({b for b, _ in trajectory_predecessors(cfg, block_index)})
    pulled = await pull_blocks(gossip, records, needed, pulls_compact(gossip), pulls_chained(gossip))
    missing = [b for b in needed if b not in pulled]
    if missing and held is not None and all(b in held for b in missing):
        logger.warning(
            "%s no peer of block(s) %s reachable: this round runs their states pulled before", gossip.tag, missing
        )
        return {**pulled, **{b: held[b] for b in missing}}
    if missing:
        msg = "%s trajectory training needs blocks %s, found %s: this round uses noisy targets"
        logger.warning(msg, gossip.tag, needed, sorted(pulled))
        return None
    return pulled


async def load_predecessors(
    gossip: Gossip,
    state: BlockState,
    lookup: Callable[[], Awaitable[list[PeerRecord]]],
    cfg: ModelConfig,
    trajectory_prob: float,
) -> int:
    """Trajectory training: pull the blocks that run before ours (frozen, forward only; with the merged byte
    table) at round start (see pull_predecessors for one that is unreachable). Returns how many.

    :param lookup: the peers now (called only when trajectory training needs predecessors)
    """
    if trajectory_prob <= 0 or not trajectory_predecessors(cfg, state.block_index):
        return 0
    pulled = await pull_predecessors(gossip, await lookup(), cfg, state.block_index, state.predecessors)
    await asyncio.to_thread(state.use_predecessors, pulled)
    if gossip.check is not None:  # the merge check scores what the round trains on (swarmd.averaging.validation)
        await asyncio.to_thread(gossip.check.use_predecessors, pulled, state.base_table_hat())
    return len(pulled or {})


def within_drift(working: StateDict, merged: StateDict, own_moved: float, factor: float = WORKING_DRIFT) -> bool:
    """Whether a predecessor's working weights are finite, shaped as its merged state, and no further from it than
    `factor` x `own_moved` (||our working block - our base||, the same steps at the same learning rate) in L2."""
    if set(working) != set(merged) or any(working[k].shape != merged[k].shape for k in merged):
        return False
    if not all(bool(torch.isfinite(t).all()) for t in working.values()):
        return False
    dist = sum(float((working[k].float() - merged[k].float()).pow(2).sum()) for k in merged) ** 0.5
    return dist <= factor * own_moved + 1e-6


async def refresh_predecessors(gossip: Gossip, state: BlockState, records: list[PeerRecord]) -> int:
    """Mid-round: pull the working weights of the predecessors trajectory training runs from these peers and run
    those within WORKING_DRIFT of their merged state from the next step on (the rest stay as pulled at round
    start); how many. Nothing is pulled while the round trains without predecessors."""
    fresh = await pull_working(gossip, state, records)
    if fresh:
        await asyncio.to_thread(state.refresh_predecessors, fresh)
    return len(fresh)


async def pull_working(gossip: Gossip, state: BlockState, records: list[PeerRecord]) -> dict[int, StateDict]:
    """The working weights of each predecessor trajectory training runs (all pulled at once), from the first of its
    peers (pull_order) whose weights are within WORKING_DRIFT x our own block's movement so far (BlockState.moved,
    which takes the lock between two steps) of its merged state; a predecessor no peer answers for in bounds is
    left out. Installs nothing: the caller runs them between two steps."""

    async def one(b: int, merged: StateDict) -> StateDict | None:
        for r in pull_order(records, b):
            try:
                delta = gossip.cfg.pull_codec == "int8-delta"  # an int8 delta against the round-start pull
                working = await gossip.fetch_working(r, pulls_compact(gossip), merged if delta else None)
            except SwarmdError as exc:
                logger.info(
                    "%s could not pull block %d's working weights from %s: %s", gossip.tag, b, r.peer_id[-6:], exc
                )
                continue
            if within_drift(working, merged, own_moved):
                return working
            logger.warning(
                "%s block %d's working weights from %s are too far off its merged state: not run",
                gossip.tag,
                b,
                r.peer_id[-6:],
            )
        return None

    if not state.predecessors:
        return {}
    own_moved = await asyncio.to_thread(state.moved)
    async with asyncio.TaskGroup() as group:  # one failing beyond a SwarmdError cancels the others
        tasks = {b: group.create_task(one(b, merged)) for b, merged in sorted(state.predecessors.items())}
    return {b: working for b, t in tasks.items() if (working := t.result()) is not None}
