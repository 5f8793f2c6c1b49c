"""When a round stops waiting for deltas: DeadlinePolicy and its participation target.

The collection of a round ends when every expected peer answered, or at the deadline this policy gives:
  - participation target (the default, PARTICIPATION_TARGET): the arrival time of the target fraction of
    the deltas expected over the last rounds, measured by the simulator in swarmd.sim (swarmd.sim.policies,
    benchmarks/async_sim.py);
  - before any round was observed, at an adaptive deadline: the later of (own delta ready + factor x EMA
    of the arrival lag) and (round start + 1.5 x EMA of the round length until the last arrival), never
    before ready + deadline_min_s nor after ready + the cap. The second term makes the fastest peer
    of a round wait for the slower ones' training even when it was itself the slowest last round (lags
    swap roles).
The cap (cap_s) is deadline_max_s, or round_factor x this round's own training time when that is longer: the
peers of different blocks exchange the byte table every round, and a later block's round is inherently longer
(trajectory training runs its predecessors forward at every step: about 2x block 0's at B=4); at 200 steps a
round its peers outlasted block 0's 30 s cap, and the table exchanges of the last rounds closed apart
(benchmarks/quality.py --pipeline at 1,600 steps: participation 0.46). A peer waits at most half again as long
as it computed; a dead peer still costs the others no more than that. A peer that trained nothing this round
(a pipelined block before or after its turn) waits up to idle_deadline_s: the cap for the round length
measured so far, at least IDLE_WAIT_FACTOR x deadline_max_s and IDLE_TRAIN_FACTOR x the longest round this
peer trained itself (another block's round runs its predecessors forward: longer than ours, by ~2x at B=4); the
floor grows growth x after each idle round that closed with a trainer's delta missing (up to growth **
IDLE_GROWTH_STEPS; the growth multiplied the whole wait once, and a B=3 swarm's idle peer, its own rounds 96 s
long on a loaded machine, waited 1,462 s a round for peers that had ended). Waiting costs an idle peer nothing,
while closing before the trainers' deltas come splits the swarm's rounds: the copy task's sequential swarm
(500 steps a round, a later block's rounds ~35 s against block 0's 30 s cap) lost its byte table that way.
Pure bookkeeping over the times it is told (no clock, no I/O); swarmd.averaging.exchange feeds it each round.
"""

from __future__ import annotations

import math
from collections import deque

from swarmd.averaging.config import GossipConfig

PARTICIPATION_TARGET = 0.8  # DeadlinePolicy's default: wait for this fraction of the expected deltas
IDLE_WAIT_FACTOR = 2.0  # an idle round waits at least this x deadline_max_s for the training peers' deltas
IDLE_GROWTH_STEPS = 4  # ... and growth x longer after each idle round that missed one, at most this many times
IDLE_TRAIN_FACTOR = 3.0  # ... and at least this x the longest round it trained itself (of the last `window`)


class DeadlinePolicy:
    """Collection deadline (see the module doc); max_s until something was measured.

    Two rules. Participation target (target > 0, the default): once rounds were observed with
    observe_arrivals, the deadline is the arrival time (after round open) of the ceil(target x n)-th
    of the n deltas expected over the last `window` rounds, a delta that had not arrived by its round's
    close counting as later than every arrival; when that one is such a missing delta the deadline
    grows to growth x the latest close seen. The simulator (swarmd.sim, benchmarks/async_sim.py)
    measured this rule against lockstep, fixed deadlines and the EMA rule under WAN regimes. EMA rule
    (target 0, until arrivals were observed, and in a round whose target needs every expected delta,
    i.e. fewer than 1 / (1 - target) of them): the later of factor x EMA of the arrival lag after own
    delta was ready and round_factor x EMA of the round length.

    :param round_factor: slack on the measured round length (open -> last arrival), 1.5 = +50 %
    :param target: fraction of the expected deltas to wait for (0 = the EMA rule only)
    :param window: rounds of arrival times the target rule looks at
    :param growth: how much the deadline grows past the latest close while participation is below target
    """

    def __init__(
        self,
        cfg: GossipConfig,
        alpha: float = 0.3,
        round_factor: float = 1.5,
        target: float = PARTICIPATION_TARGET,
        window: int = 5,
        growth: float = 1.5,
    ):
        if not 0 <= target <= 1 or window < 1 or growth < 1:
            raise ValueError("need 0 <= target <= 1, window >= 1 and growth >= 1")
        self.cfg, self.alpha, self.round_factor = cfg, alpha, round_factor
        self.target, self.growth = target, growth
        self.ema: float | None = None  # arrival lag after own delta was ready, seconds
        self.round_ema: float | None = None  # round start -> last accepted arrival, seconds
        self.rounds: deque[tuple[list[float], int, float]] = deque(maxlen=window)  # (arrivals, missing, close)
        self.idle_missed = 0  # idle rounds in a row that closed with an expected delta missing
        self.trained: deque[float] = deque(maxlen=window)  # own training time of the last rounds it trained, s

    def target_after_open_s(self, expected: int | None = None) -> float | None:
        """The target rule's deadline after round open (None: the EMA rule applies).

        :param expected: deltas this round expects; when the target needs every one of them (a small swarm:
            ceil(target x expected) == expected) the EMA rule applies, which waits for the slowest
        """
        if self.target <= 0 or not self.rounds:
            return None
        if expected is not None and math.ceil(self.target * expected - 1e-9) >= expected:
            return None
        arrived = sorted(a for r in self.rounds for a in r[0])
        n = len(arrived) + sum(r[1] for r in self.rounds)
        k = max(1, math.ceil(self.target * n - 1e-9))  # wait for the k-th of the n expected deltas
        if k <= len(arrived):
            return arrived[k - 1]
        return self.growth * max(r[2] for r in self.rounds)

    def cap_s(self, ready_after_open_s: float = 0.0) -> float:
        """The longest wait after own delta is ready (see the module doc)."""
        return max(self.cfg.deadline_max_s, self.round_factor * ready_after_open_s)

    def idle_deadline_s(self) -> float:
        """The wait of a round this peer trained nothing in (its delta ready at once), so that the training peers'
        deltas still come in: the cap for the round length measured so far (open -> last arrival), at least
        IDLE_WAIT_FACTOR x deadline_max_s (grown after idle rounds that missed a delta) and IDLE_TRAIN_FACTOR x the
        longest own training round (module doc)."""
        floor = IDLE_WAIT_FACTOR * self.cfg.deadline_max_s * self.growth ** min(self.idle_missed, IDLE_GROWTH_STEPS)
        return max(self.cap_s(self.round_ema or 0.0), floor, IDLE_TRAIN_FACTOR * max(self.trained, default=0.0))

    def observe_training(self, seconds: float) -> None:
        """A round this peer trained took `seconds` from round open to its own delta ready."""
        self.trained.append(seconds)

    def observe_idle(self, missing: int) -> None:
        """An idle round closed with `missing` expected deltas not in (0: the trainers' all came)."""
        self.idle_missed = self.idle_missed + 1 if missing > 0 else 0

    def deadline_s(self, ready_after_open_s: float = 0.0, expected: int | None = None) -> float:
        """Seconds to wait after own delta is ready; ready_after_open_s = how long training took this round,
        expected = how many deltas it expects (see target_after_open_s)."""
        target = self.target_after_open_s(expected)
        cap = self.cap_s(ready_after_open_s)
        if target is not None:
            wait = target - ready_after_open_s
        elif self.ema is None:
            return cap
        else:
            wait = self.cfg.deadline_factor * self.ema
            if self.round_ema is not None:
                wait = max(wait, self.round_factor * self.round_ema - ready_after_open_s)
        return min(cap, max(self.cfg.deadline_min_s, wait))

    def observe_arrivals(self, arrived_s: list[float], missing: int, closed_s: float) -> None:
        """One round for the target rule: arrival times (seconds after round open) of the deltas that came
        in time, how many expected deltas had not arrived at the close, and the close (after open)."""
        if arrived_s or missing:
            self.rounds.append((list(arrived_s), int(missing), float(closed_s)))

    def observe(self, lag_s: float, round_s: float | None = None) -> None:
        self.ema = lag_s if self.ema is None else (1 - self.alpha) * self.ema + self.alpha * lag_s
        if round_s is not None:
            self.round_ema = (
                round_s if self.round_ema is None else (1 - self.alpha) * self.round_ema + self.alpha * round_s
            )
