"""A peer's local training: which swarm rounds its block takes local steps in, and one round's steps.

Owns the daemon's side of TrainConfig's schedule (the steps themselves are BlockState.train_steps'):
  run_plan     where this run's round loop ends (max_rounds from the round it starts at, stop_at_round the
               swarm's counter) and, with TrainConfig.pipeline, the window each block trains in;
  windowed     our record's template for a block, with the rounds it trains in (train_first, train_last;
               swarmd.core.pipeline), so that a peer sitting a round out waits only for the trainers;
  train_round  a round's local AdamW steps in the worker thread: none when it is not this block's turn, the
               warm start of a pipelined turn's first round (block_init=predecessor; also the first round of a
               --block auto peer that moved into a block nobody trained: never_trained), TrainConfig.predecessor_pulls
               chunks with trajectory training's predecessors refreshed between them (swarmd.node.peers), each
               refresh pulled while the chunk before it trains its second half (TrainConfig.prefetch_pulls).
No grpc here; one worker thread at a time (asyncio.to_thread).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Protocol

import torch

from swarmd.averaging.gossip import Gossip
from swarmd.averaging.state import BlockState, merge_train_stats, weights_hash
from swarmd.core.config import TrainConfig
from swarmd.core.pipeline import pipeline_rounds
from swarmd.core.train import init_block, split_steps
from swarmd.membership.records import PeerRecord
from swarmd.node.config import DaemonConfig
from swarmd.node.peers import pull_working, refresh_predecessors
from swarmd.node.presence import Presence

logger = logging.getLogger(__name__)


class TrainingPeer(Protocol):
    """What a round's training reads of its peer (swarmd.node.daemon.Daemon, once started)."""

    config: DaemonConfig
    state: BlockState
    me: PeerRecord
    gossip: Gossip
    presence: Presence
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    stopping: asyncio.Event


def run_plan(config: DaemonConfig, round: int) -> tuple[int, tuple[int, int] | None]:
    """(the round the loop ends at, 0 = never; with TrainConfig.pipeline the pipeline window: the rounds each block
    trains, 0 = no end, and the round they count from; else None) of a run starting at `round`."""
    # max_rounds counts from the round this run starts at (a resumed checkpoint's, else 0: a fresh joiner stops
    # with the swarm's counter); stop_at_round is the swarm's counter itself (LocalSwarm: a restarted peer
    # stops with the rest)
    todo, stop_at = config.max_rounds, config.stop_at_round
    ends = [n for n in (todo and round + todo, stop_at) if n]
    last = min(ends, default=0)
    if not config.train.pipeline:
        return last, None
    # block b trains rounds b S + 1 .. b S + R: everyone runs (B - 1) S more
    start = round if todo else 0
    window = (last - start if last and not config.train.grow else 0, start)  # grow: every block trains to the end
    return last and last + config.train.extra_rounds(config.model.blocks), window


def windowed(me: PeerRecord, block: int, train: TrainConfig, window: tuple[int, int]) -> PeerRecord:
    """Our record's template for block `block`, with the swarm rounds it takes local steps in (train_first,
    train_last; 0, 0 = every round): TrainConfig.pipeline's window of this run (swarmd.core.pipeline; none for a
    --block auto peer under TrainConfig.open_gain, whose blocks open when the records say, swarmd.membership.opening:
    it trains whichever open block it is on; a pinned peer keeps the rounds' window).

    :param window: (rounds each block trains, 0 = no end; the round they count from), run_plan's
    """
    first, last = (0, 0)
    if train.pipeline and not (train.open_gain and not me.pinned):  # open-ended: an auto peer trains where it is
        first, last = pipeline_rounds(block, *window, train.pipeline_stagger)
    return replace(me, block_index=block, train_first=first, train_last=last)


def never_trained(state: BlockState) -> bool:
    """Whether nobody trained this block's weights yet: no local steps of ours and its initial weights (after the
    round's re-sync, which adopts what the block's peers hold): a peer that moved into a block just opened."""
    if state.local_steps or not state.block_index:
        return False
    return state.block_hash == weights_hash(init_block(state.cfg, state.block_index, state.train_cfg.seed).state_dict())


async def train_round(peer: TrainingPeer, steps: int, stop: threading.Event) -> dict:
    """`steps` local AdamW steps in the worker thread (the round's batches; ends at the next step once `stop` is set),
    in TrainConfig.predecessor_pulls chunks with trajectory training's predecessors refreshed between them; with
    TrainConfig.prefetch_pulls the pulls for a chunk start halfway through the one before and run while it ends."""
    train, state = peer.config.train, peer.state
    if not peer.me.trains(state.round + 1):
        return {"ce": float("nan"), "samples": 0, "seconds": 0.0, "samples_per_s": 0.0}  # not this block's turn
    warm = train.pipeline and train.block_init == "predecessor"  # our turn's first round: start as block b - 1
    first = warm and (state.round + 1 == peer.me.train_first or await asyncio.to_thread(never_trained, state))
    if first and await asyncio.to_thread(state.warm_start):
        b = state.block_index
        logger.info("%s warm start: block %d from block %d", peer.gossip.tag, b, b - 1)
    parts: list[dict] = []
    chunks = split_steps(steps, train.predecessor_pulls)
    ahead: asyncio.Task | None = None  # the next chunk's predecessors, pulled while this chunk's second half trains
    try:
        for i, chunk in enumerate(chunks):
            if i and ahead is not None:
                fresh, ahead = await ahead, None
                if fresh:
                    await asyncio.to_thread(state.refresh_predecessors, fresh)
            elif i and state.predecessors:  # the peers of the last lookup within an announce period
                await refresh_predecessors(peer.gossip, state, await recent(peer))
            if train.prefetch_pulls and state.predecessors and i + 1 < len(chunks) and chunk > 1:
                parts.append(await asyncio.to_thread(state.train_steps, chunk // 2, peer.batches, stop))
                if stop.is_set() or peer.stopping.is_set():
                    break
                ahead = asyncio.create_task(prefetch(peer))
                chunk -= chunk // 2
            parts.append(await asyncio.to_thread(state.train_steps, chunk, peer.batches, stop))
            if peer.stopping.is_set():
                break
    finally:
        if ahead is not None:
            ahead.cancel()
            error: object = (await asyncio.gather(ahead, return_exceptions=True))[0]
            if isinstance(error, Exception):  # the round ended before it was needed: its failure is logged here
                logger.warning("%s a predecessor pull failed: %s", peer.gossip.tag, error)
    return merge_train_stats(parts)


async def recent(peer: TrainingPeer) -> list[PeerRecord]:
    """The peers of the last lookup within an announce period (whom a mid-round pull asks)."""
    return await peer.presence.recent(peer.config.net.announce_period_s)


async def prefetch(peer: TrainingPeer) -> dict[int, dict[str, torch.Tensor]]:
    """The predecessors' working weights for the next chunk, pulled while the steps go on (TrainConfig.prefetch_pulls):
    the lookup too runs in this task, off the steps' path."""
    return await pull_working(peer.gossip, peer.state, await recent(peer))
