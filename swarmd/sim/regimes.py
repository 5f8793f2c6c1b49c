"""Network regimes of the simulator: named presets of the litepaper's Tables 4/5 and `custom`, and their sampling.

Owns Dist (a log-normal: median and log-std; sigma 0 = a constant), Regime (per-step compute time,
one-way latency, upload bandwidth, dropout probability, deadline), PRESETS, regime_named() and
RoundDraw (one round's sampled clock and network for every virtual worker, drawn from a numpy
Generator in a fixed order, so every policy run on a seed sees the same network).

Times are simulated seconds, bandwidth simulated bytes per second. A regime's deadline is a multiple of
the median compute time of one round (H x the compute median), so a preset keeps its meaning when H
changes; None = lockstep (every non-dropped update is waited for). Bandwidths are sized to the small
models the simulator trains on a CPU (a d=64 block's int8+zstd delta is tens of KB), so transfer and
compute times compare the way they do for real blocks on real links. Pure: numpy only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from swarmd.errors import ConfigError


@dataclass(frozen=True)
class Dist:
    """Log-normal: median * exp(sigma * N(0, 1)); sigma 0 gives the median every time."""

    median: float
    sigma: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and self.median >= 0) or not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ConfigError(f"a distribution needs a median >= 0 and a sigma >= 0, got {self.median}, {self.sigma}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.median * np.exp(self.sigma * rng.standard_normal(n))


@dataclass(frozen=True)
class Regime:
    """One simulated network: what each virtual worker's round costs and when the swarm stops waiting.

    :param compute_s: seconds per local optimiser step (one draw per worker and round, times H)
    :param latency_s: one-way latency of a worker's uploads, seconds
    :param bandwidth_Bps: a worker's upload bandwidth, bytes per second
    :param dropout: chance a worker drops out of a round (it sends nothing)
    :param deadline: the fixed deadline, as a multiple of H x compute_s.median (None = lockstep)
    """

    name: str
    compute_s: Dist
    latency_s: Dist
    bandwidth_Bps: Dist
    dropout: float = 0.0
    deadline: float | None = None
    about: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.dropout <= 1:
            raise ConfigError(f"dropout must be in [0, 1], got {self.dropout}")
        if self.deadline is not None and not (math.isfinite(self.deadline) and self.deadline > 0):
            raise ConfigError(
                f"deadline must be > 0 (a multiple of the round's median compute time), got {self.deadline}"
            )
        if self.bandwidth_Bps.median <= 0:
            raise ConfigError("bandwidth must be > 0")

    def deadline_s(self, steps: int) -> float | None:
        """The fixed deadline in seconds after round start for H = steps (None = lockstep)."""
        return None if self.deadline is None else self.deadline * steps * self.compute_s.median

    def to_dict(self) -> dict:
        return asdict(self)


_DC = Regime("dc", Dist(0.1, 0.2), Dist(0.0005), Dist(100e6))  # one data centre: transfers take ~nothing
_WAN = Regime("wan", Dist(0.1, 0.5), Dist(0.08, 0.7), Dist(150e3, 1.2), dropout=0.05)
_EDGE = Regime("edge", Dist(0.25, 0.6), Dist(0.2, 0.8), Dist(30e3, 1.2), dropout=0.1)
_BAD_EDGE = Regime("bad-edge", Dist(0.5, 0.6), Dist(0.6, 0.8), Dist(10e3, 1.2), dropout=0.25)


def _preset(net: Regime, name: str, deadline: float | None, about: str) -> Regime:
    return replace(net, name=name, deadline=deadline, about=about)


PRESETS: dict[str, Regime] = {
    r.name: r
    for r in (
        _preset(_DC, "lockstep", None, "one data centre; every update waited for"),
        _preset(_DC, "async-mild", 1.5, "data centre, a deadline 1.5x the compute"),
        _preset(_WAN, "wan-tight", 1.8, "consumer links (heavy-tailed bandwidth), tight deadline"),
        _preset(_WAN, "wan-mid", 2.5, "the same WAN, a middle deadline"),
        _preset(_WAN, "wan-loose", 3.9, "the same WAN, a loose deadline"),
        _preset(_EDGE, "edge-mid", 3.1, "edge devices: slower, thinner links, more dropout"),
        _preset(_BAD_EDGE, "bad-edge", 0.2, "a deadline far shorter than a round's compute and upload"),
        _preset(_BAD_EDGE, "bad-edge-loose", 2.7, "the same bad edge, a looser deadline"),
    )
}
WAN_REGIMES = ("wan-tight", "wan-mid", "wan-loose")  # one network, three fixed deadlines


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def regime_named(name: str) -> Regime:
    """A preset by name (case, spaces and underscores ignored: 'WAN loose' = 'wan-loose'); ConfigError otherwise."""
    try:
        return PRESETS[_key(name)]
    except KeyError:
        raise ConfigError(f"unknown regime {name!r}; choose one of {', '.join([*PRESETS, 'custom'])}") from None


def custom_regime(
    compute_s: float,
    compute_sigma: float,
    latency_s: float,
    latency_sigma: float,
    bandwidth_kBps: float,
    bandwidth_sigma: float,
    dropout: float,
    deadline: float | None,
) -> Regime:
    """`--regime custom`: the distributions from flags (bandwidth in kB/s)."""
    if bandwidth_kBps <= 0:
        raise ConfigError(f"bandwidth must be > 0 kB/s, got {bandwidth_kBps}")
    return Regime(
        "custom",
        Dist(compute_s, compute_sigma),
        Dist(latency_s, latency_sigma),
        Dist(bandwidth_kBps * 1e3, bandwidth_sigma),
        dropout,
        deadline,
        about="from flags",
    )


@dataclass(frozen=True)
class RoundDraw:
    """One round's sampled clock and network, one entry per virtual worker (arrays of length n)."""

    compute_s: np.ndarray  # seconds of local training (H steps) until the worker's delta is ready
    latency_s: np.ndarray
    bandwidth_Bps: np.ndarray
    dropped: np.ndarray  # bool

    @classmethod
    def sample(cls, regime: Regime, rng: np.random.Generator, n: int, steps: int) -> RoundDraw:
        """Draws in a fixed order (compute, latency, bandwidth, dropout): same generator state, same round."""
        compute = steps * regime.compute_s.sample(rng, n)
        latency = regime.latency_s.sample(rng, n)
        bandwidth = regime.bandwidth_Bps.sample(rng, n)
        dropped = rng.random(n) < regime.dropout
        return cls(compute, latency, bandwidth, dropped)

    def arrival_s(self, i: int, upload_bytes: float) -> float:
        """When worker i's upload has fully arrived: ready + latency + bytes / bandwidth (seconds after start)."""
        return float(self.compute_s[i] + self.latency_s[i] + upload_bytes / self.bandwidth_Bps[i])
