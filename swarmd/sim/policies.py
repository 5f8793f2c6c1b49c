"""Deadline policies the simulator compares: when does a round stop waiting for updates?

Each policy answers `deadline(ready_s, expected)`: seconds after the round's start at which the swarm
merges what has arrived (None = wait for every worker that did not drop out), given ready_s, the median
time at which this round's workers have their delta ready, and the number of updates expected. After
the round it is told what a daemon can see (`observe`): the arrival times of the updates that came in
time, how many of the expected ones had not arrived at the close (late or dropped alike), and the close.

- lockstep: wait for every non-dropped worker;
- fixed: the regime's fixed deadline (a multiple of the round's median compute time);
- adaptive: the daemon's DeadlinePolicy (swarmd.averaging.deadline) with its EMA rule (target 0): the later
  of 3 x EMA of the arrival lag after ready and 1.5 x EMA of the round length, within the daemon's
  GossipConfig bounds [deadline_min_s, deadline_max_s] after ready;
- quantile: the same DeadlinePolicy with a participation target: the arrival time of the target
  fraction of the updates expected over the last rounds (missing ones count as later than all),
  growing past the latest close while participation stays below the target.
Both daemon rules are the daemon's own class, fed what Gossip.average feeds it, and measured from
ready_s the way a daemon measures from its own delta being ready. Nothing heavy is imported at module
level (the CLI reads POLICIES and DEFAULT_TARGET before torch loads).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

from swarmd.errors import ConfigError

if TYPE_CHECKING:
    from swarmd.averaging.config import GossipConfig
    from swarmd.sim.regimes import Regime

POLICIES = ("lockstep", "fixed", "adaptive", "quantile")
DEFAULT_TARGET = 0.8  # the quantile policy's participation target (fraction of the expected updates)


class Policy(Protocol):
    name: str

    def deadline(self, ready_s: float, expected: int) -> float | None: ...

    def observe(self, arrived_s: list[float], missing: int, closed_s: float, ready_s: float) -> None: ...


def quantile(values: list[float], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics (numpy's default rule)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


class Lockstep:
    name = "lockstep"

    def deadline(self, ready_s: float, expected: int) -> float | None:
        return None

    def observe(self, arrived_s: list[float], missing: int, closed_s: float, ready_s: float) -> None:
        pass


class Fixed:
    name = "fixed"

    def __init__(self, deadline_s: float):
        self.deadline_s = deadline_s

    def deadline(self, ready_s: float, expected: int) -> float | None:
        return self.deadline_s

    def observe(self, arrived_s: list[float], missing: int, closed_s: float, ready_s: float) -> None:
        pass


class Daemon:
    """The daemon's DeadlinePolicy: deadline = ready + its deadline_s(ready), fed as Gossip.average feeds it.

    :param target: its participation target (0: the EMA rule, the "adaptive" policy)
    """

    def __init__(self, target: float = 0.0, cfg: GossipConfig | None = None):
        from swarmd.averaging.config import GossipConfig
        from swarmd.averaging.deadline import DeadlinePolicy

        if not 0 <= target <= 1:
            raise ConfigError(f"the participation target must be in [0, 1], got {target}")
        self.name = "quantile" if target > 0 else "adaptive"
        self.policy = DeadlinePolicy(cfg or GossipConfig(), target=target)

    def deadline(self, ready_s: float, expected: int) -> float | None:
        return ready_s + self.policy.deadline_s(ready_s, expected)

    def observe(self, arrived_s: list[float], missing: int, closed_s: float, ready_s: float) -> None:
        if arrived_s:  # Gossip.average feeds the EMA only rounds that accepted something
            last = max(arrived_s)
            self.policy.observe(max(0.0, last - ready_s), last)
        self.policy.observe_arrivals(arrived_s, missing, closed_s)


def make_policy(name: str, regime: Regime, steps: int, target: float = DEFAULT_TARGET) -> Policy:
    """The named policy for a regime ("fixed" needs the regime's deadline); ConfigError for a bad name."""
    if name == "lockstep":
        return Lockstep()
    if name == "fixed":
        deadline = regime.deadline_s(steps)
        if deadline is None:
            raise ConfigError(f"regime {regime.name} has no fixed deadline (it is lockstep)")
        return Fixed(deadline)
    if name == "adaptive":
        return Daemon(0.0)
    if name == "quantile":
        if not 0 < target <= 1:
            raise ConfigError(f"the participation target must be in (0, 1], got {target}")
        return Daemon(target)
    raise ConfigError(f"unknown deadline policy {name!r}; choose one of {', '.join(POLICIES)}")


def regime_policy(regime: Regime) -> str:
    """The policy a regime row runs: its fixed deadline, or lockstep when it has none."""
    return "lockstep" if regime.deadline is None else "fixed"
