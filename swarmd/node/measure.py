"""What a daemon measures of the swarm after a round, kept in its Metrics: consensus and the assembled model's CE.

Owns these measurements and the reads they need:
  consensus    the max sketch distance to the same-block replicas at our round, from their GetStatus
               sketches (swarmd.averaging.sketch); kept when none of them answered;
  assembled CE the from-noise CE (nats/byte) of the model built from our block and byte table and the
               other blocks' merged states pulled from peers (swarmd.node.peers; NaN when a block has no
               reachable peer); the model is built and evaluated in the worker thread.
  held-out CE  with TrainConfig.open_gain, the held-out CE of our merged block (its merge check's sample,
               swarmd.averaging.validation) once we trained it, in our record (PeerRecord.held_out_ce) for the
               open-ended grow rule (swarmd.membership.opening).
measure_round takes them after a daemon's merge (the CE every eval_every rounds, with an eval_path).
Best effort: a peer that fails is skipped. No policy, no state of its own.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from swarmd.averaging.gossip import Gossip
from swarmd.averaging.sketch import sketch_distance
from swarmd.averaging.state import BlockState
from swarmd.core.config import ModelConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import from_noise_ce
from swarmd.core.model import ByteEmbedding, DenoisingBlock
from swarmd.membership.records import PeerRecord
from swarmd.metrics import Metrics
from swarmd.node.config import DaemonConfig
from swarmd.node.peers import StateDict, pull_blocks
from swarmd.v1 import swarm_pb2 as pb


class StatusClient(Protocol):
    """What consensus_distance dials (swarmd.transport.PeerClient)."""

    async def status(self, address: str, timeout_s: float) -> pb.PeerStatus: ...


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


async def measure_consensus(
    client: StatusClient, state: BlockState, records: list[PeerRecord], peer_id: str, metrics: Metrics
) -> None:
    """metrics.consensus_distance: max sketch distance to same-block peers that reached our round (kept when none
    answered)."""
    dist = await consensus_distance(client, state, records, peer_id)
    if dist is not None:
        metrics.consensus_distance = dist


async def measure_assembled_ce(
    gossip: Gossip,
    state: BlockState,
    records: list[PeerRecord] | None,
    lookup: Callable[[], Awaitable[list[PeerRecord]]],
    config: DaemonConfig,
    metrics: Metrics,
) -> float:
    """metrics.last_ce: from-noise CE of the assembled model, own block + embedding, other blocks pulled from peers
    (on config.eval_path, config.eval_tokens); NaN, and last_ce kept, when some block could not be pulled.

    :param records: the peers to pull from (None: ask `lookup`, after our own block's snapshot)
    """
    cfg = config.model
    own, (_, own_block, own_emb) = state.block_index, state.snapshot()
    records = records if records is not None else await lookup()
    others = await pull_blocks(gossip, records, (b for b in range(cfg.blocks) if b != own))
    if len(others) < cfg.blocks - 1:
        return float("nan")
    args = (cfg, {**others, own: own_block}, own_emb, config.eval_path, config.eval_tokens)
    metrics.last_ce = await asyncio.to_thread(assembled_ce, *args)
    return metrics.last_ce


async def measure_round(
    client: StatusClient,
    gossip: Gossip,
    state: BlockState,
    records: list[PeerRecord],
    lookup: Callable[[], Awaitable[list[PeerRecord]]],
    config: DaemonConfig,
    metrics: Metrics,
) -> None:
    """A round's measurements (the daemon's, after its merge): the consensus distance, and every config.eval_every
    rounds (with an eval_path) the assembled model's CE over the round's `records`."""
    await measure_consensus(client, state, records, gossip.me.peer_id, metrics)
    if config.train.open_gain and gossip.check is not None and state.local_steps:
        _, block, emb = state.snapshot()
        ce = await asyncio.to_thread(gossip.check.score, block, emb)
        gossip.me = replace(gossip.me, held_out_ce=ce if math.isfinite(ce) and ce > 0 else 0.0)  # the next announce
    if config.eval_every and config.eval_path and state.round % config.eval_every == 0:
        await measure_assembled_ce(gossip, state, records, lookup, config, metrics)
