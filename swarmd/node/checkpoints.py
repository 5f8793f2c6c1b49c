"""The daemon's checkpoint writes: the state with the peer's progress counters, and what a failing disk means.

Owns when a write counts as failed and what follows: a failed write (disk full, read-only dir,
non-finite state) is one warning line and keeps the previous generation (the files themselves are
BlockState.save's, atomic per generation); CHECKPOINT_FAILURES_UNHEALTHY in a row turn the gRPC
server's health NOT_SERVING, the next good write turns it SERVING again. SAVED_METRICS names the
Metrics every generation's config.json carries (benchmarks read them). Writes in the worker thread.
resume_block names the block a starting peer's checkpoint dir resumes, once the stale files a crash
left behind (temp files, generations config.json does not name) are removed; saved_standing, the standing (whom
probation knows) the daemon keeps in every generation's config.json and takes back on resume.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from swarmd.averaging.state import BlockState
from swarmd.core import checkpoint as ck
from swarmd.errors import SwarmdError
from swarmd.metrics import Metrics
from swarmd.transport import SwarmServer

logger = logging.getLogger(__name__)

CHECKPOINT_FAILURES_UNHEALTHY = 3  # consecutive failed checkpoint writes that turn gRPC health NOT_SERVING

# Metrics saved with every checkpoint (benchmarks read them): config.json key -> Metrics attribute
SAVED_METRICS = {k: k for k in ("participation", "bytes_sent", "bytes_received", "raw_bytes_sent", "rejected")}
SAVED_METRICS |= {k: k for k in ("last_round_s", "discovery_s", "started_wall")}
SAVED_METRICS |= {"rounds_merged": "rounds", "train_ce": "last_train_ce", "history": "round_history"}


def saved_standing(directory: str, resume: tuple[int, ...]) -> object:
    """The standing a resumed peer's checkpoint kept (config.json's "standing"; None when not resuming or none)."""
    if not (directory and resume):
        return None
    try:
        return ck.read_config(Path(directory)).get("standing")
    except SwarmdError:  # unreadable now: the restore that found it readable a moment ago reported it
        return None


class CheckpointWriter:
    """Checkpoints of one peer into `directory`; `failures`: consecutive failed writes (0 after a good one)."""

    def __init__(self, directory: str, metrics: Metrics):
        self.directory, self.metrics = directory, metrics
        self.failures = 0

    def resume_block(self, block: int) -> int | None:
        """The block the checkpoint dir resumes (None: nothing to resume, or no dir), once the temp files and
        generations a crash left behind are removed; ConfigMismatch if it trains another block than `block` (-1: any).
        """
        if not self.directory:
            return None
        for path in ck.clean_stale(self.directory):  # temp files and generations a crash left behind
            logger.info("removed stale %s", path)
        return ck.peer_block(self.directory, block)

    async def save(self, state: BlockState, server: SwarmServer | None, tag: str, **progress: object) -> bool:
        """Atomically checkpoint `state` (in the worker thread); returns whether it was written.

        :param server: the gRPC server whose health a run of failures turns NOT_SERVING (None: client mode)
        :param tag: the peer's log tag
        :param progress: what config.json carries besides the metrics (swarm id, peer id, standing: JSON-able)
        """
        saved = {k: getattr(self.metrics, a) for k, a in SAVED_METRICS.items()} | progress
        try:
            await asyncio.to_thread(state.save, self.directory, **saved)
        except (OSError, SwarmdError) as exc:
            self.failures += 1
            logger.warning(
                "%s checkpoint of round %d not written (%d in a row), the last one stays: %s",
                tag,
                state.round,
                self.failures,
                exc,
            )
            if self.failures == CHECKPOINT_FAILURES_UNHEALTHY and server is not None:
                logger.error("%s checkpoints keep failing: health NOT_SERVING until one is written", tag)
                await server.set_serving(False)
            return False
        if self.failures >= CHECKPOINT_FAILURES_UNHEALTHY and server is not None:
            logger.warning("%s checkpoint written again: health SERVING", tag)
            await server.set_serving(True)
        self.failures = 0
        return True
