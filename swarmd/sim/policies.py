"""Deadline policies the simulator compares: when does a round stop waiting for updates?

Each policy answers `deadline(ready_s)`: seconds after the round's start at which the swarm merges
what has arrived (None = wait for every worker that did not drop out), given ready_s, the median
time at which this round's workers have their delta ready. After the round it is told every
arrival time it could have seen (`observe`): the non-dropped workers' arrivals, late ones included
(a late delta still reaches its peers, after the merge), and the time of the last accepted one.

- lockstep: wait for every non-dropped worker;
- fixed: the regime's fixed deadline (a multiple of the round's median compute time);
- adaptive: the daemon's own swarmd.swarm.gossip.DeadlinePolicy with the daemon's GossipConfig
  defaults, measured from ready_s the way a daemon measures from its own delta being ready;
- quantile: a participation target: the q-quantile of the arrival times seen over the last rounds
  (the first round waits for everyone).
Pure Python over floats; imports nothing heavy at module level (the CLI reads POLICIES and
DEFAULT_TARGET before torch loads); the adaptive policy loads the daemon's gossip module when built.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Protocol

from swarmd.errors import ConfigError

if TYPE_CHECKING:
    from swarmd.sim.regimes import Regime
    from swarmd.swarm.peer_config import GossipConfig

POLICIES = ("lockstep", "fixed", "adaptive", "quantile")
DEFAULT_TARGET = 0.8  # the quantile policy's participation target (fraction of non-dropped arrivals)


class Policy(Protocol):
    name: str

    def deadline(self, ready_s: float) -> float | None: ...

    def observe(self, arrivals_s: list[float], last_accepted_s: float | None, ready_s: float) -> None: ...


def quantile(values: list[float], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics (numpy's default rule)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


class Lockstep:
    name = "lockstep"

    def deadline(self, ready_s: float) -> float | None:
        return None

    def observe(self, arrivals_s: list[float], last_accepted_s: float | None, ready_s: float) -> None:
        pass


class Fixed:
    name = "fixed"

    def __init__(self, deadline_s: float):
        self.deadline_s = deadline_s

    def deadline(self, ready_s: float) -> float | None:
        return self.deadline_s

    def observe(self, arrivals_s: list[float], last_accepted_s: float | None, ready_s: float) -> None:
        pass


class Adaptive:
    """The daemon's DeadlinePolicy: deadline = ready + its deadline_s(ready); fed what Gossip.average feeds it."""

    name = "adaptive"

    def __init__(self, cfg: GossipConfig | None = None):
        from swarmd.swarm.gossip import DeadlinePolicy
        from swarmd.swarm.peer_config import GossipConfig

        self.policy = DeadlinePolicy(cfg or GossipConfig())

    def deadline(self, ready_s: float) -> float | None:
        return ready_s + self.policy.deadline_s(ready_s)

    def observe(self, arrivals_s: list[float], last_accepted_s: float | None, ready_s: float) -> None:
        if last_accepted_s is not None:  # Gossip.average observes only rounds that accepted something
            self.policy.observe(max(0.0, last_accepted_s - ready_s), last_accepted_s)


class Quantile:
    """Participation target: the target-quantile of the arrival times of the last `window` rounds."""

    name = "quantile"

    def __init__(self, target: float = DEFAULT_TARGET, window: int = 5):
        if not 0 < target <= 1:
            raise ConfigError(f"the participation target must be in (0, 1], got {target}")
        if window < 1:
            raise ConfigError(f"the arrival window must be >= 1 round, got {window}")
        self.target = target
        self.rounds: deque[list[float]] = deque(maxlen=window)

    def deadline(self, ready_s: float) -> float | None:
        seen = [a for r in self.rounds for a in r]
        return quantile(seen, self.target) if seen else None

    def observe(self, arrivals_s: list[float], last_accepted_s: float | None, ready_s: float) -> None:
        if arrivals_s:
            self.rounds.append(list(arrivals_s))


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
        return Adaptive()
    if name == "quantile":
        return Quantile(target)
    raise ConfigError(f"unknown deadline policy {name!r}; choose one of {', '.join(POLICIES)}")


def regime_policy(regime: Regime) -> str:
    """The policy a regime row runs: its fixed deadline, or lockstep when it has none."""
    return "lockstep" if regime.deadline is None else "fixed"
