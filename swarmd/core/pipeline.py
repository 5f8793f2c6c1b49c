"""The pipelined schedule's rounds (TrainConfig.pipeline): which swarm rounds each block takes its local steps in.

Pure arithmetic, no torch: the daemon and the one-process stack (swarmd.core.local_run) decide their turns with
it, and a peer's record (swarmd.membership.records.PeerRecord.train_first/train_last) carries its window.
"""

from __future__ import annotations


def pipeline_rounds(block_index: int, train_rounds: int = 0, start: int = 0, stagger: int = 1) -> tuple[int, int]:
    """TrainConfig.pipeline: the first and last swarm round (1-based; last 0 = without end) in which block
    `block_index` takes its local steps, in a run that started after round `start`: from round start + block_index x
    stagger + 1 on, for `train_rounds` rounds (0 = without end). Block 0 starts at once; block b, b x stagger rounds
    later (TrainConfig.pipeline_stagger), once its predecessors have ended that many rounds. A peer's record carries
    it (PeerRecord.train_first/train_last), so the peers that sit a round out know whom to wait for."""
    first = start + block_index * stagger + 1
    return first, first + train_rounds - 1 if train_rounds else 0


def in_window(round_no: int, first: int, last: int) -> bool:
    """Whether swarm round `round_no` lies in [first, last] (last 0 = without end; (0, 0) = every round)."""
    return first <= round_no and (last == 0 or round_no <= last)


def pipeline_trains(round_no: int, block_index: int, train_rounds: int = 0, start: int = 0, stagger: int = 1) -> bool:
    """Whether block `block_index` takes its local steps in swarm round `round_no` (see pipeline_rounds)."""
    return in_window(round_no, *pipeline_rounds(block_index, train_rounds, start, stagger))
