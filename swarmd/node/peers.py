"""What one peer reads from the others: their merged blocks and their status sketches.

Owns three reads the daemon makes around a round: other blocks' merged states (all the
predecessors trajectory training runs frozen, or none; every block for the assembled model's CE),
the from-noise CE of a model assembled from pulled states (blocking torch: call it in the worker
thread), and the consensus distance to same-block replicas from their GetStatus sketches. Every
pull is best effort: a peer that fails is logged and skipped. No policy, no state of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

import torch

from swarmd.averaging.gossip import Gossip
from swarmd.averaging.sketch import sketch_distance
from swarmd.averaging.state import BlockState
from swarmd.core.config import ModelConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import from_noise_ce
from swarmd.core.model import ByteEmbedding, DenoisingBlock
from swarmd.core.train import trajectory_predecessors
from swarmd.errors import SwarmdError
from swarmd.membership.records import PeerRecord
from swarmd.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)
StateDict = dict[str, torch.Tensor]


class StatusClient(Protocol):
    """What consensus_distance dials (swarmd.transport.PeerClient)."""

    async def status(self, address: str, timeout_s: float) -> pb.PeerStatus: ...


def pull_order(records: list[PeerRecord], block_index: int) -> list[PeerRecord]:
    """The dialable peers of a block, those whose announced weights (base_hash) most records share first, then
    the newest round, then peer id: a lone peer announcing weights nobody else holds (stale, or hostile in a
    public swarm) is asked last, whatever order the DHT returned the records in."""
    candidates = [r for r in records if r.block_index == block_index and r.address]
    shared = Counter(r.base_hash for r in candidates)
    return sorted(candidates, key=lambda r: (-shared[r.base_hash], -r.round, r.peer_id))


async def pull_block(gossip: Gossip, records: list[PeerRecord], block_index: int) -> StateDict | None:
    """The merged state of another block from the first peer of pull_order that answers (None if none does)."""
    for r in pull_order(records, block_index):
        try:
            return await gossip.fetch_block(r)
        except SwarmdError as exc:
            logger.info("%s could not pull block %d from %s: %s", gossip.tag, block_index, r.peer_id[-6:], exc)
    return None


async def pull_blocks(gossip: Gossip, records: list[PeerRecord], blocks: Iterable[int]) -> dict[int, StateDict]:
    """block index -> merged state, for each of `blocks` some peer served (one after the other)."""
    pulled = {}
    for b in blocks:
        if (state := await pull_block(gossip, records, b)) is not None:
            pulled[b] = state
    return pulled


async def pull_predecessors(
    gossip: Gossip, records: list[PeerRecord], cfg: ModelConfig, block_index: int
) -> dict[int, StateDict] | None:
    """Merged states of every block the sampler runs before block_index (trajectory training), or None,
    with a warning, when one of them has no reachable peer (the round then trains on noisy targets)."""
    needed = sorted({b for b, _ in trajectory_predecessors(cfg, block_index)})
    pulled = await pull_blocks(gossip, records, needed)
    if len(pulled) < len(needed):
        msg = "%s trajectory training needs blocks %s, found %s: this round uses noisy targets"
        logger.warning(msg, gossip.tag, needed, sorted(pulled))
        return None
    return pulled


def assembled_ce(
    cfg: ModelConfig, blocks: dict[int, StateDict], emb: StateDict, eval_path: str, eval_tokens: int
) -> float:
    """From-noise CE (nats/byte) of the model built from every block's state and the byte table (blocking)."""
    modules = [DenoisingBlock(cfg) for _ in range(cfg.blocks)]
    for b, module in enumerate(modules):
        module.load_state_dict(blocks[b])
    table = ByteEmbedding(cfg)
    table.load_state_dict(emb)
    x, y = ByteData.from_path(eval_path, cfg.seq_len).eval_windows(eval_tokens)
    return from_noise_ce(modules, table, x, y, cfg)["ce"]


async def consensus_distance(
    client: StatusClient, state: BlockState, records: list[PeerRecord], peer_id: str, timeout_s: float = 2.0
) -> float | None:
    """Max sketch distance to the same-block peers at our round; 0.0 without any such peer,
    None when there are peers but none answered at our round (keep the last figure)."""
    peers = [r for r in records if r.block_index == state.block_index and r.peer_id != peer_id and r.address]
    results = await asyncio.gather(*(client.status(r.address, timeout_s) for r in peers), return_exceptions=True)
    dists = [
        sketch_distance(state.sketch, list(st.sketch), state.param_norm)
        for st in results
        if not isinstance(st, BaseException) and st.round == state.round
    ]
    return max(dists) if dists else (0.0 if not peers else None)
