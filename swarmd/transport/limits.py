"""Admission limits of a daemon's gRPC server: concurrent payload streams and per-caller request rates.

Owns StreamLimiter (how many ExchangeDeltas / PullState streams run at once, in total and per caller host:
the one over the cap is refused with Busy, i.e. RESOURCE_EXHAUSTED, at once instead of queueing) and
RateLimiter (a token bucket per caller host for Forward requests: a caller over its rate gets Busy; a request
costs forward_cost tokens, one per started 64 KiB of request, so batching rows and tokens buys no extra compute).
A caller is keyed by its host (caller_host of grpc's context.peer()), not its port: one host opening many
channels is still one caller. Pure Python: no grpc, no torch; single-threaded (the server's event loop).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from swarmd.errors import Busy

DEFAULT_MAX_STREAMS = 64  # payload streams (ExchangeDeltas + PullState) served at once, all callers
DEFAULT_MAX_STREAMS_PER_PEER = 32  # ... from one caller host (12 daemons on one host use ~22 at most)
DEFAULT_FORWARD_RATE = 2000.0  # Forward request units (forward_cost) per second per caller host (sustained)
DEFAULT_FORWARD_BURST = 4000.0  # ... and the bucket's size (a burst above the rate)
FORWARD_UNIT_BYTES = 64 << 10  # a Forward request costs one token per started this many bytes


def forward_cost(request: object) -> float:
    """Tokens a Forward request costs: its size in started FORWARD_UNIT_BYTES (at least 1), where a zstd tensor
    counts its decoded size (4 bytes per element of its declared shape) so compression buys no compute.

    A request's compute grows with the hidden states it carries (rows x tokens x d_model), i.e. its size: a
    sampling step of one short sequence costs 1, a request of 64 rows x 1,024 tokens x d 256 in fp32 ~1,000.
    Something that is not a parsed message (refused next anyway) costs 1.
    """
    size = getattr(request, "ByteSize", None)
    if not callable(size):
        return 1.0
    total = size()
    for name in ("z", "message", "context"):
        t = getattr(request, name, None)
        if t is not None and getattr(t, "zstd", False):
            elements = 1
            for dim in t.shape:
                elements = min(elements * max(int(dim), 0), 1 << 40)
            total += max(0, 4 * elements - len(t.data))
    return float(max(1, -(-total // FORWARD_UNIT_BYTES)))


def caller_host(peer: str) -> str:
    """The host of a grpc context.peer() string: "ipv4:1.2.3.4:5" -> "1.2.3.4", "ipv6:[::1]:5" -> "::1"."""
    scheme, sep, rest = peer.partition(":")
    if not sep or scheme not in ("ipv4", "ipv6"):
        return peer  # unix sockets and the like: the whole string is the caller
    host = rest.rpartition(":")[0] or rest
    return host.strip("[]")


class StreamLimiter:
    """Counts running streams; acquire(caller) raises Busy when the total or the caller's count is at its cap.

    :param max_total: streams served at once over all callers (<= 0: unlimited)
    :param max_per_caller: streams served at once for one caller host (<= 0: unlimited)
    """

    def __init__(self, max_total: int = DEFAULT_MAX_STREAMS, max_per_caller: int = DEFAULT_MAX_STREAMS_PER_PEER):
        self.max_total, self.max_per_caller = max_total, max_per_caller
        self.total = 0
        self.by_caller: dict[str, int] = {}
        self.refused = 0

    def acquire(self, caller: str) -> None:
        """Take a stream slot for caller (release() it when the stream ends); raises Busy at a cap."""
        held = self.by_caller.get(caller, 0)
        if 0 < self.max_total <= self.total:
            self.refused += 1
            raise Busy(f"this peer serves {self.total} streams already (limit {self.max_total}); retry later")
        if 0 < self.max_per_caller <= held:
            self.refused += 1
            raise Busy(f"{held} streams from {caller} already (limit {self.max_per_caller} per caller)")
        self.total += 1
        self.by_caller[caller] = held + 1

    def release(self, caller: str) -> None:
        self.total -= 1
        left = self.by_caller.get(caller, 1) - 1
        if left > 0:
            self.by_caller[caller] = left
        else:
            self.by_caller.pop(caller, None)


class RateLimiter:
    """A token bucket per caller: `rate` tokens per second sustained, bursts up to `burst` (take's cost).

    Keeps at most max_callers buckets (least recently seen dropped: a dropped caller starts with a full
    bucket again, which costs at most one burst). rate <= 0: unlimited.
    """

    def __init__(
        self,
        rate: float = DEFAULT_FORWARD_RATE,
        burst: float = DEFAULT_FORWARD_BURST,
        max_callers: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.rate, self.burst, self.max_callers, self.clock = rate, max(burst, 1.0), max_callers, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # caller -> (tokens, at)
        self.refused = 0

    def take(self, caller: str, cost: float = 1.0) -> None:
        """Spend `cost` tokens of the caller's bucket; raises Busy when it holds fewer."""
        if self.rate <= 0:
            return
        now = self.clock()
        tokens, at = self._buckets.pop(caller, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < cost:
            self._buckets[caller] = (tokens, now)
            self.refused += 1
            raise Busy(f"{caller} is over its rate of {self.rate:g} request units/s; slow down")
        self._buckets[caller] = (tokens - cost, now)
        while len(self._buckets) > self.max_callers:
            self._buckets.popitem(last=False)
