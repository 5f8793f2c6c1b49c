"""The daemon's rounds, one after the other: what a round driver needs of its peer, the plain driver, the loop.

RoundPeer is what a round driver drives of its peer (swarmd.node.daemon.Daemon): its state, the round's
steps around the exchange, the end-of-round work. PlainRounds runs a round in order: re-sync if our base
differs (joiners too; an adopted state is announced before this round's deltas; while every peer we should
exchange with is rounds ahead and nothing was adopted, re-sync again CATCH_UP_TRIES times, CATCH_UP_PAUSE_S
apart, rather than merge a round alone: swarmd.averaging.exchange.out_of_reach), open the round,
trajectory training's predecessors, H local steps in the worker thread (more with GossipConfig.balance_steps:
balanced_steps), lookup, Gossip.average, then the
peer's end-of-round work (serving, announce, round time, checkpoint, measurements, on_round). With
gossip.overlap the daemon drives swarmd.node.overlap.OverlapRounds instead: the same interface
(RoundDriver: run_round, rounds_started, drain, cancel), the next round's steps running while a round's
exchange does. round_loop runs the rounds of one run, the peer's rebalance before each, until its stop or
the run's last round (swarmd.node.training.run_plan), then lands what is in flight; cancel_on_stop
abandons a round still running STOP_GRACE_S after the stop.
No grpc here; the training thread is the peer's (train).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.exchange import out_of_reach
from swarmd.averaging.gossip import Gossip
from swarmd.averaging.round import MergeReport
from swarmd.averaging.state import BlockState
from swarmd.core.balanced_rounds import round_steps, slowest_rate
from swarmd.errors import SwarmdError
from swarmd.membership.records import PeerRecord
from swarmd.metrics import Metrics
from swarmd.node.config import DaemonConfig
from swarmd.node.settle import settle
from swarmd.node.training import run_plan, windowed
from swarmd.protocol import PeerState

logger = logging.getLogger(__name__)

STOP_GRACE_S = 2.0  # a stopping daemon lets the round in progress finish this long, then abandons it
CATCH_UP_TRIES = 3  # re-syncs a round makes while every peer it should exchange with is rounds ahead (at most ...
CATCH_UP_PAUSE_S = 1.0  # ... this long apart: what announced rounds can cost a round, whoever announces them)


class RoundPeer(Protocol):
    """What a round driver drives of its peer (swarmd.node.daemon.Daemon): its state, the round's steps around the
    exchange, and the end-of-round work; gossip and state exist once the peer has started."""

    state: BlockState
    gossip: Gossip
    metrics: Metrics
    phase: PeerState
    stopping: asyncio.Event

    async def records(self) -> list[PeerRecord]: ...

    async def announce(self) -> None: ...

    def update_serving(self) -> None: ...

    async def load_predecessors(self) -> int: ...

    async def train(self, steps: int) -> dict: ...

    async def finish_round(
        self, report: MergeReport, records: list[PeerRecord], started: float | None = None
    ) -> None: ...


def balanced_steps(peer: RoundPeer, cfg: GossipConfig, records: list[PeerRecord]) -> int:
    """This round's local steps: H, or with GossipConfig.balance_steps > 1 as many as our steps fit in the time the
    slowest peer of the lookup takes for H (swarmd.core.balanced_rounds: the rates the records announce, at most
    balance_steps x H; the swarm's peers share one batch size)."""
    if cfg.balance_steps <= 1:
        return cfg.steps_per_round
    me = peer.gossip.me.peer_id
    slowest = slowest_rate(r.samples_per_s for r in records if r.peer_id != me)
    return round_steps(cfg.steps_per_round, peer.metrics.samples_per_s, slowest, cfg.balance_steps)


def observe_training(peer: RoundPeer, stats: dict, steps_before: int) -> None:
    """Count a round's local steps (train_steps' `stats`) into the peer's throughput and train CE metrics (a round
    without steps, a pipelined block waiting its turn, counts nothing)."""
    if not stats["samples"]:
        return
    peer.metrics.observe_throughput(stats["samples"], stats["seconds"], peer.state.local_steps - steps_before)
    peer.metrics.observe_train_ce(stats["ce"])


class PlainRounds:
    """The daemon's rounds without overlap (see the module doc).

    :param cfg: the peer's GossipConfig (steps_per_round H)
    """

    def __init__(self, peer: RoundPeer, cfg: GossipConfig):
        self.peer, self.cfg = peer, cfg
        self.last = 0  # the run's last round (round_loop's; 0 = none)

    def rounds_started(self) -> int:
        """Rounds merged: what the loop compares with its last round."""
        return self.peer.state.round

    async def run_round(self) -> MergeReport | None:
        """One round: sync, H local steps, average, the end-of-round work. Returns the MergeReport (None if stopped)."""
        d = self.peer
        g, started = d.gossip, time.monotonic()
        for attempt in range(1, CATCH_UP_TRIES + 1):
            records = await d.records()
            if await g.sync(records):
                d.update_serving()
                with contextlib.suppress(SwarmdError):  # our record names the adopted state before this round's deltas
                    await d.announce()
                if reached_end(d.state, self.last):
                    return None
                break
            if attempt == CATCH_UP_TRIES or not out_of_reach(g.me, d.state.round, records):
                break
            logger.info(
                "round %d: every peer to exchange with is rounds ahead and nothing was adopted yet: re-syncing again",
                d.state.round,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(d.stopping.wait(), CATCH_UP_PAUSE_S)
            if d.stopping.is_set():
                return None
        await g.open_round()
        await d.load_predecessors()
        d.phase = PeerState.TRAINING
        steps_before = d.state.local_steps
        stats = await d.train(balanced_steps(d, self.cfg, records))
        observe_training(d, stats, steps_before)
        g.rounds.idle = not stats.get("samples")  # pipelined, not this block's turn: weight 0, wait for the trainers
        if d.stopping.is_set():
            return None
        d.phase = PeerState.AVERAGING
        records = await d.records()  # one lookup serves the merge, the consensus and the CE of this round
        report = await g.average(records)
        d.phase = PeerState.TRAINING
        await d.finish_round(report, records, started)
        return report

    async def drain(self) -> MergeReport | None:
        """Nothing is ever in flight between two plain rounds."""
        return None

    async def cancel(self) -> None:
        """Nothing to abandon (see drain)."""


def reached_end(state: BlockState, last: int) -> bool:
    """Whether a re-sync took us to the run's last round (or past it): the state adopted is the one the swarm ended
    the run with, so this peer ends there too; training and merging one more round alone would end it a round ahead
    of the others, on weights nobody else holds."""
    if last and state.round >= last:
        logger.info("adopted the state of round %d, the run's last: ending the run with it", state.round)
        return True
    return False


class RoundDriver(Protocol):
    """What the round loop drives: PlainRounds, or swarmd.node.overlap.OverlapRounds."""

    last: int

    def rounds_started(self) -> int: ...

    async def run_round(self) -> MergeReport | None: ...

    async def drain(self) -> MergeReport | None: ...

    async def cancel(self) -> None: ...


class LoopPeer(RoundPeer, Protocol):
    """What the round loop drives of its peer besides its rounds: the run's config and record, rebalance, stop."""

    config: DaemonConfig
    me: PeerRecord
    pipeline_window: tuple[int, int]

    async def rebalance(self) -> bool: ...

    async def run_round(self) -> MergeReport | None: ...

    def stop(self) -> None: ...


async def round_loop(peer: LoopPeer, rounds: RoundDriver) -> None:
    """The rounds of one run: rebalance, then a round (peer.run_round, driven by `rounds`), until the peer stops or
    the run's last round (run_plan) was started; then the last round's merge lands, the replicas of that round
    agree on its state (swarmd.node.settle), and the peer stops. With
    TrainConfig.pipeline the peer's record first names the rounds its block trains in, and is announced."""
    last, window = run_plan(peer.config, peer.state.round)
    rounds.last = last  # a re-sync to the last round ends the run there (reached_end)
    if window is not None:  # TrainConfig.pipeline: the rounds each block trains in
        peer.pipeline_window = window
        peer.me = peer.gossip.me = windowed(peer.me, peer.state.block_index, peer.config.train, window)
        with contextlib.suppress(SwarmdError):  # the peers sitting a round out wait only for its trainers
            await peer.announce()
    try:
        while not peer.stopping.is_set() and not (last and rounds.rounds_started() >= last):
            await peer.rebalance()
            await peer.run_round()
        # with overlap, the last round's merge lands (within the stop grace when stopping)
        await rounds.drain()
        # the replicas of the last round end it on one state (bounded by the round deadline)
        await settle(peer, last, peer.config.gossip.deadline_max_s)
    finally:
        await rounds.cancel()
    peer.stop()


async def cancel_on_stop(peer: RoundPeer, rounds: asyncio.Task) -> None:
    """After the peer's stop, give its round loop STOP_GRACE_S to finish, then cancel it (an exchange or pull waiting
    on a slow peer must not keep a stopping daemon alive); the final checkpoint still holds a consistent state."""
    await peer.stopping.wait()
    done, _ = await asyncio.wait({rounds}, timeout=STOP_GRACE_S)
    if not done:
        logger.info("%s stopping: the round in progress is abandoned", peer.gossip.tag)
        rounds.cancel()
