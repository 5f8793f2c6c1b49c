"""OverlapRounds: the daemon's rounds with overlap on (GossipConfig.overlap), training never waiting for the network.

Owns the order of one round when a round's exchange runs beside the next round's training (the rule
that lands the merge, with its correction, is swarmd.averaging.delayed's; Gossip.average applies it):

    round r:  load predecessors -> start H local steps in the worker thread
              meanwhile: await round r-1's exchange (a task since the end of round r-1; its merge lands
                         into the live weights mid-training) -> the daemon's end-of-round work for r-1
                         (serving, announce, checkpoint, consensus, on_round) -> sync -> open round r
              -> the H steps end -> lookup -> Gossip.average(r) as a task; once its own deltas are
                 snapshotted (the round's `ready` event) round r+1's training may start

The first round (nothing in flight) syncs and opens before training, as without overlap. Round numbers,
deltas, deadlines and records are the ones of the plain loop: round r's delta is the exact
live - base_r at the snapshot; peers see a round open a little later (once the previous merge landed),
which handle_exchange's bounded wait for our round already covers. A round's H steps never start
before round r-1's snapshot and the snapshot of round r waits for round r-1's merge, so a merge lands
at most H steps late; GossipConfig.overlap_steps = k caps that at k: after k steps training waits for
the merge (a peer faster than the others would otherwise spend its whole wait for them on a stale base).
Checkpoints stay what they are (the merged base and its round, with AdamW state), written when a merge
lands: a resumed peer restarts from the base, losing at most the steps taken since its last snapshot, as
a peer stopped mid-training does. Serving and PullState read the merged base.
Stop: the training thread ends at its next step, the round in flight gets the daemon's grace to land
(drain), then it is cancelled with the round loop; a merge already running in its thread finishes under
the state's lock, so the final checkpoint is one generation either way.
"""

from __future__ import annotations

import asyncio
import logging
import time

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.round import MergeReport
from swarmd.membership.records import PeerRecord
from swarmd.node.rounds import RoundPeer, balanced_steps, observe_training, reached_end
from swarmd.protocol import PeerState

logger = logging.getLogger(__name__)


def combined(a: dict, b: dict) -> dict:
    """Two train_steps results as one (samples and seconds added, CE weighted by samples)."""
    n, seconds = a["samples"] + b["samples"], a["seconds"] + b["seconds"]
    ces = [(s["ce"], s["samples"]) for s in (a, b) if s["samples"]]
    ce = sum(c * k for c, k in ces) / n if ces else float("nan")
    return {"ce": ce, "samples": n, "seconds": seconds, "samples_per_s": n / max(seconds, 1e-9)}


class OverlapRounds:
    """The round loop of one daemon with overlap on; `pending` is the exchange in flight (None between runs).

    :param cfg: the peer's GossipConfig (steps_per_round H, overlap_steps)
    """

    def __init__(self, peer: RoundPeer, cfg: GossipConfig):
        self.peer, self.cfg = peer, cfg
        self.pending: asyncio.Task[MergeReport] | None = None
        self.pending_records: list[PeerRecord] = []  # the lookup the exchange in flight merges with
        self.last_landed: float | None = None  # monotonic time of the last merge landed (round time)
        self.last = 0  # the run's last round (round_loop's; 0 = none)

    def rounds_started(self) -> int:
        """Rounds merged plus the one in flight: what the loop compares with its last round."""
        return self.peer.state.round + (self.pending is not None)

    async def run_round(self) -> MergeReport | None:
        """Train round r while round r-1's exchange finishes; returns r-1's MergeReport (None if none landed)."""
        d = self.peer
        g, records = d.gossip, self.pending_records
        if self.pending is None:
            records = await d.records()
            if await g.sync(records):
                d.update_serving()
                if reached_end(d.state, self.last):
                    return None
            await g.open_round()
        H = balanced_steps(d, self.cfg, records)  # the lookup of this round's start, or of the exchange in flight
        await d.load_predecessors()
        d.phase = PeerState.TRAINING
        steps_before = d.state.local_steps
        # with a merge in flight, at most overlap_steps steps (0: all H) run before it lands, then the rest
        first = min(H, self.cfg.overlap_steps or H) if self.pending is not None else H
        training = asyncio.ensure_future(d.train(first))
        report = None
        try:
            if self.pending is not None:
                report = await self.land()
                if await g.sync(await d.records()):
                    d.update_serving()
                await g.open_round()
            stats = await training
            if first < H and not d.stopping.is_set():
                training = asyncio.ensure_future(d.train(H - first))
                stats = combined(stats, await training)
        finally:
            if not training.done():  # cancelled: the thread ends at its next step once stop() was called
                training.cancel()
        observe_training(d, stats, steps_before)
        if d.stopping.is_set():
            return report
        d.phase = PeerState.AVERAGING
        records = await d.records()
        rs = g.current
        if rs is None:
            raise RuntimeError("no open round to publish")
        task = asyncio.ensure_future(g.average(records))
        self.pending, self.pending_records = task, records
        ready = asyncio.ensure_future(rs.ready.wait())
        try:  # the snapshot of our deltas must be taken before the next round's steps start
            await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if task.done() and task.exception() is not None:
            self.pending = None
            raise task.exception()  # type: ignore[misc]
        d.phase = PeerState.TRAINING
        return report

    async def land(self) -> MergeReport:
        """Wait for the exchange in flight, then the daemon's end-of-round work for its round."""
        task, records = self.pending, self.pending_records
        if task is None:
            raise RuntimeError("no exchange in flight")
        try:
            report = await task
        finally:
            self.pending = None
        now = time.monotonic()
        if self.last_landed is not None:
            self.peer.metrics.observe_round(now - self.last_landed)
        self.last_landed = now
        await self.peer.finish_round(report, records)
        return report

    async def drain(self) -> MergeReport | None:
        """Land the exchange in flight, if any (the loop's end: max rounds or stop)."""
        return await self.land() if self.pending is not None else None

    async def cancel(self) -> None:
        """Abandon the exchange in flight (the round loop was cancelled); its merge thread, if it already runs,
        finishes under the state's lock."""
        task, self.pending = self.pending, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
