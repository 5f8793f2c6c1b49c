"""The daemon's round, one after the other: what a round driver needs of its peer, and the plain driver.

RoundPeer is what a round driver drives of its peer (swarmd.node.daemon.Daemon): its state, the round's
steps around the exchange, the end-of-round work. PlainRounds runs a round in order: re-sync if our base
differs (joiners too; an adopted state is announced before this round's deltas), open the round,
trajectory training's predecessors, H local steps in the worker thread, lookup, Gossip.average, then the
peer's end-of-round work (serving, announce, round time, checkpoint, measurements, on_round). With
gossip.overlap the daemon drives swarmd.node.overlap.OverlapRounds instead: the same interface
(run_round, rounds_started, drain, cancel), the next round's steps running while a round's exchange does.
No grpc here; the training thread is the peer's (train).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.gossip import Gossip
from swarmd.averaging.round import MergeReport
from swarmd.averaging.state import BlockState
from swarmd.errors import SwarmdError
from swarmd.membership.records import PeerRecord
from swarmd.metrics import Metrics
from swarmd.protocol import PeerState


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

    def rounds_started(self) -> int:
        """Rounds merged: what the loop compares with its last round."""
        return self.peer.state.round

    async def run_round(self) -> MergeReport | None:
        """One round: sync, H local steps, average, the end-of-round work. Returns the MergeReport (None if stopped)."""
        d = self.peer
        g, H, started = d.gossip, self.cfg.steps_per_round, time.monotonic()
        if await g.sync(await d.records()):
            d.update_serving()
            with contextlib.suppress(SwarmdError):  # our record names the adopted state before this round's deltas
                await d.announce()
        await g.open_round()
        await d.load_predecessors()
        d.phase = PeerState.TRAINING
        steps_before = d.state.local_steps
        stats = await d.train(H)
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
