"""The merge of a round: the pure rule over the accepted deltas, and landing its result on the replica.

  - merge: base + the robust aggregate (swarmd.averaging.robust.robust_merge: each delta clipped to a
    multiple of the lower median norm, then a coordinate-wise trimmed mean; merge="mean" is the
    plain uniform mean) of the accepted decoded deltas, own decoded delta included, in peer-id
    order, so replicas that accepted the same set end bit-identical. The byte-table deltas get the
    same rule. A merge that is not finite is skipped (the base is kept). AdamW state is kept;
  - overlap (cfg.overlap, delayed averaging): the merge lands late with swarmd.averaging.delayed.land_merge
    (the base moves exactly as above, the live weights keep the steps taken since the snapshot);
  - group averaging (swarmd.averaging.groups): an anchored part merges offsets from its anchor; a round in
    which the part averaged as one group sets every replica to the anchor + merged offsets exactly and
    drops the anchor.
Every merge is a pure function of the accepted deltas (merge_deltas); swarmd.sim runs the same function.
"""

from __future__ import annotations

import asyncio
import logging

import torch

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.context import BLOCK, EMB, PeerContext
from swarmd.averaging.delayed import land_merge
from swarmd.averaging.groups import base_step, merged_target
from swarmd.averaging.robust import MergeStats, mean_in_order, robust_merge

logger = logging.getLogger(__name__)

Tensors = dict[str, torch.Tensor]


def merge_mean(deltas: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Uniform mean of the accepted deltas (peer id -> tensors), summed in sorted peer-id order.

    The order is fixed so that every replica that accepted the same set gets the same bits.
    """
    ids = sorted(deltas)
    if not ids:
        raise ValueError("merge_mean needs at least one delta (own delta included)")
    return {name: mean_in_order([deltas[pid][name].float() for pid in ids]) for name in deltas[ids[0]]}


def merge_deltas(deltas: dict[str, dict[str, torch.Tensor]], cfg: GossipConfig) -> dict[str, torch.Tensor]:
    """The round's merge rule of `cfg` (robust or plain mean) over the accepted deltas, own included."""
    return merge_with_stats(deltas, cfg)[0]


def merge_with_stats(
    deltas: dict[str, dict[str, torch.Tensor]], cfg: GossipConfig
) -> tuple[dict[str, torch.Tensor], MergeStats | None]:
    """merge_deltas and, for the robust rule, what it did (None for the plain mean)."""
    if cfg.merge == "mean":
        return merge_mean(deltas), None
    return robust_merge(deltas, cfg.clip_factor, cfg.trim_fraction, cfg.min_cosine, cfg.distance_factor)


def finite(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether every value of every tensor is finite."""
    return all(bool(torch.isfinite(t).all()) for t in tensors.values())


async def merge_parts(
    peer: PeerContext, round: int, own: dict[str, Tensors], inbox: dict[str, dict[str, Tensors]]
) -> dict[str, Tensors | None]:
    """Each part's merge (merge_with_stats over own + the accepted deltas, in the worker thread); None for a part
    whose merge is not finite (the base is kept)."""
    merged: dict[str, Tensors | None] = {}
    for kind in (BLOCK, EMB):
        deltas = {peer.me.peer_id: own[kind], **inbox[kind]}
        value, stats = await asyncio.to_thread(merge_with_stats, deltas, peer.cfg)  # off the event loop
        if stats is not None and stats.dropped:
            logger.info(
                "%s round %d: the %s merge dropped %d delta(s) as outliers (far from the others or pointing away)",
                peer.tag,
                round,
                kind,
                stats.dropped,
            )
        merged[kind] = value if finite(value) else None  # cannot happen with bounded finite inputs
        if merged[kind] is None:
            logger.error("%s round %d: the %s merge is not finite; keeping the base", peer.tag, round, kind)
    return merged


async def apply_merged(
    peer: PeerContext,
    merged: dict[str, Tensors | None],
    members: dict[str, set[str] | None],
    own_exact: dict[str, Tensors],
) -> None:
    """Apply the round's merges: base + merged (no anchor), or the anchor + merged offsets (group averaging);
    a one-group round of an anchored part sets every replica to that exactly and drops the anchor.

    :param members: the round's group of each part (None: the part averaged as one group)
    :param own_exact: own deltas before the codec (what a late merge subtracts again, cfg.overlap)
    """
    steps: dict[str, Tensors | None] = dict(merged)
    exact: dict[str, Tensors | None] = {BLOCK: None, EMB: None}
    for kind in (BLOCK, EMB):
        anchor, value = peer.anchors[kind], merged[kind]
        if not anchor.active or anchor.tensors is None or value is None:
            continue
        target = merged_target(anchor.tensors, value)
        steps[kind] = base_step(target, peer.base(kind)[0])
        if members[kind] is None:  # everybody merged the same offsets: same bits, the new anchor
            exact[kind] = target
    if peer.cfg.overlap:  # the merge lands one round late, live keeps the steps taken since publish() (no groups)
        await asyncio.to_thread(land_merge, peer.state, steps[BLOCK], steps[EMB], own_exact[BLOCK], own_exact[EMB])
    else:
        await asyncio.to_thread(peer.state.apply_merge, steps[BLOCK], steps[EMB])
    if exact[BLOCK] is not None or exact[EMB] is not None:
        await asyncio.to_thread(peer.state.adopt, exact[BLOCK], exact[EMB])
        for kind in (BLOCK, EMB):
            if exact[kind] is not None:
                peer.anchors[kind].clear()
