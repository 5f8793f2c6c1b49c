"""Balanced rounds: how many local steps a peer takes a round so that no peer waits for the slowest.

Every peer of a swarm exchanges the byte table every round, so a round lasts as long as its slowest peer's steps;
a peer whose steps are faster (block 0 runs no predecessor; a faster device) would wait the difference. round_steps
gives it instead as many steps as fit in the time the slowest takes for H, at least H and at most cap x H: the
peers' step rates (the samples per second their records announce) say how many. The cap bounds what a peer that
announces a slow rate it does not have can make the others do: rounds at most cap x as long, every peer busy.
Pure arithmetic; the daemon (swarmd.node.rounds) and the simulator (swarmd.sim.scheduled) use it alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def round_steps(steps: int, own_rate: float, slowest_rate: float, cap: float) -> int:
    """Steps this round: `steps` (H) x own_rate / slowest_rate, rounded down, within [H, cap x H]; H when either
    rate is unknown (<= 0) or cap <= 1 (balancing off)."""
    if cap <= 1 or own_rate <= 0 or slowest_rate <= 0 or not math.isfinite(own_rate / slowest_rate):
        return steps
    return max(steps, min(int(cap * steps), int(steps * own_rate / slowest_rate + 1e-9)))


def slowest_rate(rates: Iterable[float]) -> float:
    """The lowest known rate (> 0) among the swarm's training peers, 0 if none is known."""
    return min((r for r in rates if r > 0 and math.isfinite(r)), default=0.0)
