"""In-memory metrics of one peer: throughput EMA, byte counters, participation, round latency.

Owns the numbers behind the GetStatus RPC (and `blocktrain status`): a samples/s EMA in the
style of hivemind's utils/performance_ema.py, bytes sent/received on the wire and the raw fp32
bytes behind what was sent (the only byte counters: the PeerClient reports what it dials as a
ByteMeter, gossip what it answers), rejected payloads, mean participation over the rounds, the last
round's wall time. Plain counters, touched only from the daemon's event loop (the worker thread
reports through the loop). No torch, no grpc.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field


@dataclass
class Metrics:
    alpha: float = 0.2  # EMA smoothing of samples/s
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)  # unix time, to line up peers in benchmarks
    samples_per_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    raw_bytes_sent: int = 0
    rejected: int = 0  # payloads refused (validation, stale round, other base)
    rounds: int = 0  # rounds this process merged
    participation_sum: float = 0.0
    last_round_s: float = 0.0
    last_ce: float = float("nan")  # last from-noise CE measured (nats/byte)
    last_train_ce: float = float("nan")  # mean training CE of the last round's local steps (nats/byte)
    consensus_distance: float = float("nan")
    discovery_s: float = float("nan")  # from start until the swarm had min_peers peers
    round_history: list[dict] = field(default_factory=list)  # last rounds, for status / benchmarks

    def observe_throughput(self, samples: int, seconds: float) -> None:
        rate = samples / max(seconds, 1e-9)
        self.samples_per_s = (
            rate if self.samples_per_s == 0 else (1 - self.alpha) * self.samples_per_s + self.alpha * rate
        )

    def observe_train_ce(self, ce: float) -> None:
        """The training CE of a round's local steps; NaN (no step was taken) keeps the last value."""
        if not math.isnan(ce):
            self.last_train_ce = ce

    def add_sent(self, wire_bytes: int, raw_bytes: int = 0) -> None:
        self.bytes_sent += int(wire_bytes)
        self.raw_bytes_sent += int(raw_bytes)

    def add_received(self, wire_bytes: int) -> None:
        self.bytes_received += int(wire_bytes)

    def end_round(self, participation: float, seconds: float, **extra) -> None:
        self.rounds += 1
        self.participation_sum += participation
        self.last_round_s = seconds
        self.round_history.append({"participation": participation, "seconds": seconds, **extra})
        del self.round_history[:-50]

    @property
    def participation(self) -> float:
        """Mean participation over the rounds merged so far (1.0 before the first)."""
        return self.participation_sum / self.rounds if self.rounds else 1.0

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started
