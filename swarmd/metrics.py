"""In-memory metrics of one peer: throughput EMA, steps, byte counters, participation, rejections, durations.

Owns the numbers behind the GetStatus RPC (`blocktrain status`) and the Prometheus endpoint
(swarmd.node.prometheus reads them at scrape time): a samples/s EMA in the style of hivemind's
utils/performance_ema.py, local steps, bytes sent/received on the wire and the raw fp32 bytes
behind them (the only byte counters: the PeerClient reports what it dials as a ByteMeter, gossip
what it answers), rejected payloads by reason, exchanges this peer dialled that failed and calls its
server refused for their swarm key proof, or whose identity proof was for another peer (by reason:
swarmd.node.diagnosis reads them), mean and last
participation, exchange and round durations as fixed-bucket histograms, peers seen per block, the last
round's wall time, the merge loss check (rounds checked, fallbacks, deltas it refused, seconds), the pulled
states verified adoption refused (by part). Plain
counters, written only from the daemon's event loop (the worker thread reports through the loop);
the metrics HTTP thread only reads them. No torch, no grpc, no prometheus_client.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from swarmd.errors import (
    BaseMismatch,
    DeadlineExceeded,
    PeerUnavailable,
    StaleRound,
    SwarmKeyMismatch,
    SwarmKeyRequired,
    Unauthenticated,
    ValidationError,
    WrongBlock,
)

# histogram bucket upper bounds, seconds (an implicit +Inf bucket follows the last)
EXCHANGE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ROUND_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# why gossip refused a payload (Metrics.reject); subclasses come before their bases
_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (StaleRound, "stale_round"),  # another round than ours, or our round is already closed
    (BaseMismatch, "base_mismatch"),  # computed from other weights than our base (re-sync follows)
    (WrongBlock, "wrong_block"),  # a block delta for a block this peer does not train
    (ValidationError, "invalid"),  # another swarm or model config, schema, shape, dtype, size, non-finite values
)
REJECT_REASONS = (*(reason for _, reason in _REASONS), "other")


def reject_reason(exc: BaseException) -> str:
    """The REJECT_REASONS word for an error gossip refused a payload with ("other" for any other error)."""
    return next((reason for cls, reason in _REASONS if isinstance(exc, cls)), "other")


# why a call failed beyond the payload judgements: a private swarm's refusal, a peer out of reach
_FAILURES: tuple[tuple[type[Exception], str], ...] = (
    (SwarmKeyRequired, "swarm_key_required"),  # the call carried no proof of the swarm key the callee requires
    (SwarmKeyMismatch, "swarm_key_mismatch"),  # ... a proof made with another swarm key
    (Unauthenticated, "unauthenticated"),  # ... a stale, replayed or malformed proof
    (DeadlineExceeded, "deadline"),
    (PeerUnavailable, "unavailable"),  # unreachable, busy, not ready, failed
)


def failure_reason(exc: BaseException) -> str:
    """The word for a failed call (Metrics.dial_failed, refuse_call): a _FAILURES one, else reject_reason's."""
    return next((reason for cls, reason in _FAILURES if isinstance(exc, cls)), None) or reject_reason(exc)


@dataclass
class Histogram:
    """Counts of observations per bucket (le = upper bound), their sum and count: a Prometheus histogram's data."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # one per bound, plus the +Inf bucket (not cumulative)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError("histogram bounds must be strictly increasing")
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # value <= bound lands in that bound's bucket
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) for every bucket, +Inf last (== count)."""
        out, acc = [], 0
        for bound, n in zip((*self.bounds, math.inf), list(self.counts), strict=True):
            acc += n
            out.append((bound, acc))
        return out


@dataclass
class Metrics:
    alpha: float = 0.2  # EMA smoothing of samples/s
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)  # unix time, to line up peers in benchmarks
    samples_per_s: float = 0.0
    steps: int = 0  # local optimiser steps this process took
    bytes_sent: int = 0
    bytes_received: int = 0
    raw_bytes_sent: int = 0
    raw_bytes_received: int = 0  # fp32 size the received payloads' headers declare (validated on decode)
    bytes_pulled: int = 0  # of those, other blocks' states pulled (trajectory predecessors, CE measurement)
    raw_bytes_pulled: int = 0  # ... at fp32 (GossipConfig.pull_codec "int8": about a quarter of it on the wire)
    rejected: int = 0  # payloads refused (validation, stale round, other base)
    rejected_by_reason: dict[str, int] = field(default_factory=dict)  # reason -> count; sums to rejected
    dial_failures: dict[str, int] = field(default_factory=dict)  # failure_reason -> exchanges we dialled that failed
    refused_calls: dict[str, int] = field(default_factory=dict)  # reason -> calls our server refused (key, callee)
    adoptions_refused: dict[str, int] = field(default_factory=dict)  # part -> pulled states the held-out check refused
    rounds: int = 0  # rounds this process merged
    participation_sum: float = 0.0
    last_participation: float = float("nan")  # participation of the last merged round
    last_round_s: float = 0.0
    last_train_s: float = 0.0  # seconds of the last round's local steps (its history entry's train_s)
    last_steps: int = 0  # ... and how many (its entry's steps: H, or more in balanced rounds)
    last_ce: float = float("nan")  # last from-noise CE measured (nats/byte)
    last_train_ce: float = float("nan")  # mean training CE of the last round's local steps (nats/byte)
    consensus_distance: float = float("nan")
    discovery_s: float = float("nan")  # from start until the swarm had min_peers peers
    peers_per_block: dict[int, int] = field(default_factory=dict)  # block -> distinct peers of the last lookup
    exchange_s: Histogram = field(default_factory=lambda: Histogram(EXCHANGE_BUCKETS_S))  # dialled exchanges
    round_s: Histogram = field(default_factory=lambda: Histogram(ROUND_BUCKETS_S))  # whole rounds, sync to publish
    round_history: list[dict] = field(default_factory=list)  # last rounds, for status / benchmarks
    merge_checks: int = 0  # rounds whose merge was scored on the held-out sample (swarmd.averaging.merge)
    merge_fallbacks: int = 0  # ... whose merged update scored above the bound: fell back to the deltas that pass
    merge_refused: int = 0  # peer deltas the check kept out of a merge (failed one by one)
    merge_check_s: float = 0.0  # seconds the checks took, all rounds

    def observe_throughput(self, samples: int, seconds: float, steps: int = 0) -> None:
        """One round's local training: `samples` sequences in `steps` optimiser steps over `seconds`."""
        rate = samples / max(seconds, 1e-9)
        self.samples_per_s = (
            rate if self.samples_per_s == 0 else (1 - self.alpha) * self.samples_per_s + self.alpha * rate
        )
        self.steps += int(steps)
        self.last_train_s, self.last_steps = float(seconds), int(steps)

    def observe_train_ce(self, ce: float) -> None:
        """The training CE of a round's local steps; NaN (no step was taken) keeps the last value."""
        if not math.isnan(ce):
            self.last_train_ce = ce

    def add_sent(self, wire_bytes: int, raw_bytes: int = 0) -> None:
        self.bytes_sent += int(wire_bytes)
        self.raw_bytes_sent += int(raw_bytes)

    def add_received(self, wire_bytes: int, raw_bytes: int = 0) -> None:
        self.bytes_received += int(wire_bytes)
        self.raw_bytes_received += int(raw_bytes)

    def add_pulled(self, wire_bytes: int, raw_bytes: int = 0) -> None:
        """Another block's state pulled (already in add_received): its wire and fp32 bytes."""
        self.bytes_pulled += int(wire_bytes)
        self.raw_bytes_pulled += int(raw_bytes)

    def reject(self, reason: str) -> None:
        """Count one refused payload under `reason` (a short snake_case word, e.g. stale_round)."""
        self.rejected += 1
        self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + 1

    def dial_failed(self, reason: str) -> None:
        """Count one exchange this peer dialled that failed, under `reason` (failure_reason)."""
        self.dial_failures[reason] = self.dial_failures.get(reason, 0) + 1

    def refuse_call(self, reason: str) -> None:
        """Count one call this peer's server refused before its handler (no valid swarm key proof), or whose identity
        proof it refused for being signed for another peer ("other_callee": the call goes on, unproven)."""
        self.refused_calls[reason] = self.refused_calls.get(reason, 0) + 1

    def observe_merge_check(self, fell_back: bool, refused: int, seconds: float) -> None:
        """One round's merge loss check: whether it fell back, how many deltas it refused, what it took."""
        self.merge_checks += 1
        self.merge_fallbacks += int(fell_back)
        self.merge_refused += int(refused)
        self.merge_check_s += float(seconds)

    def refuse_adoption(self, part: str) -> None:
        """Count one pulled state of `part` ("block", "embedding") the held-out check refused (verified adoption)."""
        self.adoptions_refused[part] = self.adoptions_refused.get(part, 0) + 1

    def observe_exchange(self, seconds: float) -> None:
        """Wall time of one exchange this peer dialled (send own delta, receive the reply)."""
        self.exchange_s.observe(seconds)

    def observe_round(self, seconds: float) -> None:
        """Wall time of one whole round (re-sync, local steps, averaging, publishing)."""
        self.round_s.observe(seconds)

    def observe_peers(self, peers: Iterable[tuple[str, int]]) -> None:
        """The (peer id, block) pairs of a discovery lookup (self included by the caller): distinct peers per block."""
        seen: dict[int, set[str]] = {}
        for peer_id, block in peers:
            seen.setdefault(block, set()).add(peer_id)
        self.peers_per_block = {b: len(ids) for b, ids in sorted(seen.items())}

    def end_round(self, participation: float, seconds: float, **extra: float | list[str]) -> None:
        """Count one merged round; its entry in round_history: participation, seconds, train_s and steps (its local
        steps' seconds and count: last_train_s, last_steps) and `extra` (the round, its deadline, ..., merged_block:
        the peer ids whose block deltas the merge took, own included)."""
        self.rounds += 1
        self.participation_sum += participation
        self.last_participation = participation
        self.last_round_s = seconds
        times = {"participation": participation, "seconds": seconds, "train_s": self.last_train_s}
        entry = {**times, "steps": self.last_steps, **extra}
        self.round_history.append(entry)
        self.last_train_s, self.last_steps = 0.0, 0  # a round without local steps (a pipelined block waiting): none
        del self.round_history[:-50]

    @property
    def participation(self) -> float:
        """Mean participation over the rounds merged so far (1.0 before the first)."""
        return self.participation_sum / self.rounds if self.rounds else 1.0

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started
