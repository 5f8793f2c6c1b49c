"""Which blocks train in which round, and how many peers each gets: the swarm's schedules as pure rules.

Owns SCHEDULES and the three questions every schedule answers, with no torch and no clock:
  - open_blocks: how many blocks have opened by round r (block b opens once, and a later block's first round
    is where TrainConfig.block_init "predecessor" warm-starts it);
  - training_blocks: which open blocks take local steps in round r;
  - allocate: how P peers spread over those blocks (the balance rule: as even as can be, the newest block first
    when the split is uneven), so that no peer waits while a block is training.
The schedules, for B blocks and a turn of T rounds:
  concurrent   every block opens at round 1 and trains every round (what `run` / `join` did);
  sequential   one block after the other: block b trains rounds b T + 1 .. (b + 1) T alone, with every peer on it;
  grow         progressive growth, then joint training: block b opens at round b G + 1 (G = the growth rounds,
               a few percent of the budget) and trains from then on, without end; every open block trains.
open_after is the open-ended rule a swarm with no last round can apply to its own measurements: open the next
block once the frontier's held-out gain per round has stayed below a threshold for `patience` rounds.
"""

from __future__ import annotations

from collections.abc import Sequence

SCHEDULES = ("grow", "concurrent", "sequential")


def _check(schedule: str, blocks: int, turn: int) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if blocks < 1 or turn < 1:
        raise ValueError(f"blocks and turn rounds must be >= 1, got {blocks}, {turn}")


def open_blocks(schedule: str, round_no: int, blocks: int, turn: int) -> int:
    """How many blocks (0 .. n-1) have opened by round `round_no` (1-based): all of them under concurrent; one
    more every `turn` rounds under sequential (its turn length) and grow (its growth rounds)."""
    _check(schedule, blocks, turn)
    if schedule == "concurrent":
        return blocks
    return min(blocks, max(0, (round_no - 1) // turn) + 1)


def training_blocks(schedule: str, round_no: int, blocks: int, turn: int) -> list[int]:
    """The blocks that take local steps in round `round_no`: under sequential only the newest open one (until the
    last block's turn ends: rounds past B T train nothing), otherwise every open block."""
    n = open_blocks(schedule, round_no, blocks, turn)
    if schedule == "sequential":
        return [n - 1] if round_no <= blocks * turn else []
    return list(range(n))


def first_round(schedule: str, block: int, blocks: int, turn: int) -> int:
    """The round in which `block` opens (1-based)."""
    _check(schedule, blocks, turn)
    return 1 if schedule == "concurrent" else block * turn + 1


def allocate(peers: int, training: Sequence[int], blocks: int, pinned: bool = False) -> list[int]:
    """Peers per block (a list of length `blocks`) when the blocks in `training` train: every peer on one of them,
    as evenly as can be, the later blocks first when the split is uneven (they are the newest and furthest from
    converged); 0 for the others. With fewer peers than training blocks the earliest blocks go without.

    pinned: every peer keeps one block (peer i holds block i mod B, as `blocktrain demo` lays a swarm out) and
    sits out the rounds its block does not train: a training block gets its own share of the peers."""
    if peers < 0:
        raise ValueError(f"peers must be >= 0, got {peers}")
    out = [0] * blocks
    if pinned:
        for b in training:
            out[b] = peers // blocks + (b < peers % blocks)
        return out
    order = sorted(training, reverse=True)
    for i in range(peers):
        if order:
            out[order[i % len(order)]] += 1
    return out


def total_rounds(schedule: str, blocks: int, turn: int, rounds_per_block: int) -> int:
    """Rounds a run lasts so that every block takes `rounds_per_block` training rounds: under sequential B turns of
    rounds_per_block (turn = rounds_per_block); under grow the last block opens at (B - 1) G + 1 and trains
    rounds_per_block rounds; under concurrent rounds_per_block."""
    _check(schedule, blocks, turn)
    if schedule == "concurrent":
        return rounds_per_block
    if schedule == "sequential":
        return blocks * rounds_per_block
    return (blocks - 1) * turn + rounds_per_block


def open_after(gains: Sequence[float], threshold: float, patience: int = 2) -> bool:
    """The open-ended rule: whether the next block should open, given the frontier's held-out CE gain of each of
    its rounds so far (previous CE - this round's, oldest first): True once the last `patience` gains are all below
    `threshold` (nats per round)."""
    if patience < 1:
        raise ValueError(f"patience must be >= 1, got {patience}")
    return len(gains) >= patience and all(g < threshold for g in gains[-patience:])
