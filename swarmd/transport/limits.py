"""Admission limits of a daemon's gRPC server: concurrent payload streams and request budgets, per caller identity
under a ceiling per caller host.

Owns Caller (who a call is from: its host, and the peer id its call proved, swarmd.transport.auth.CallerCheck;
"" = unproven), StreamLimiter (how many ExchangeDeltas / PullState streams run at once: in total, per caller
identity, and per caller host as a ceiling over all identities there; the one over a cap is refused with Busy,
i.e. RESOURCE_EXHAUSTED, at once instead of queueing), RateLimiter (a token bucket per key) and CallerBudget (a
token bucket per caller identity under a bucket per caller host: a caller over its own rate, or a host over its
ceiling, gets Busy; a request refused by its identity's bucket spends nothing of its host's). Budgets: requests
(GetStatus, GetConfig, ExchangeDeltas: 1 unit each; an exchange the handler rejects, e.g. a repeat of a delta
already judged this round, costs its sender REJECT_COST more), PullState requests, and Forward request units
(forward_cost: one per started 64 KiB of request, so batching rows and tokens buys no extra compute).
A proven caller is keyed by its verified peer id: a flooding insider spends only its own budget, not that of an
honest peer on the same host or behind the same NAT. An unproven caller (no proof, a bad one, a replayed one) is
keyed by its host (caller_host of grpc's context.peer(), not its port; an IPv6 host by its /64, host_range): all
the unproven callers of one host share one identity's budget, so a claimed id never spends another identity's
budget and dropping the proof buys nothing. Identities are free (Sybils): the per-host ceilings (HOST_SHARES
identities' worth; streams: max_per_caller) are what bound one host's total, whatever number of identities it
runs; Sybils spread over many hosts are bounded only by the totals (max_total streams).
The DEFAULT_* values and the host shares are the defaults of a daemon's settings (swarmd.node.config.NetConfig).
Pure Python: no grpc, no torch; single-threaded (the server's event loop).
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from swarmd.errors import Busy

DEFAULT_MAX_STREAMS = 64  # payload streams (ExchangeDeltas + PullState) served at once, all callers
DEFAULT_MAX_STREAMS_PER_PEER = 32  # ... from one caller host, all its identities (12 daemons on one host use ~22)
DEFAULT_MAX_STREAMS_PER_IDENTITY = 8  # ... for one caller identity (an honest daemon holds 2-4: block, table, pulls)
HOST_SHARES = 8.0  # a host's request ceiling: this many identities' budgets (several honest daemons per host)
DEFAULT_REQUEST_RATE = 100.0  # GetStatus / GetConfig / ExchangeDeltas per second per caller identity (sustained)
DEFAULT_REQUEST_BURST = 200.0  # ... and the bucket's size (an honest daemon sends ~2 exchanges a round to a peer)
REJECT_COST = 4.0  # units an exchange the handler rejects (a repeat, a stale round, a bad delta) costs its sender
DEFAULT_PULL_RATE = 2.0  # PullState requests per second per caller identity (each serializes a whole state)
DEFAULT_PULL_BURST = 16.0  # ... with bursts of this many (a join or re-sync pulls block, table, outer state)
DEFAULT_FORWARD_RATE = 2000.0  # Forward request units (forward_cost) per second per caller identity (sustained)
DEFAULT_FORWARD_BURST = 4000.0  # ... and the bucket's size (a burst above the rate)
FORWARD_HOST_SHARES = 2.0  # a host's Forward ceiling, in identities' budgets (inference clients mostly prove none)
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


def host_range(host: str) -> str:
    """What one host's ceiling covers: an IPv4 address itself, an IPv6 address's /64 (one machine or one LAN is
    handed a whole /64, so an address of its own costs nothing); anything else (a unix socket) as it is."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip.ipv4_mapped or ip) if isinstance(ip, ipaddress.IPv6Address) else str(ip)


@dataclass(frozen=True)
class Caller:
    """Who a call is from: its host, and the peer id its call proved ("" = unproven: keyed by its host)."""

    host: str
    peer_id: str = ""

    @property
    def ceiling(self) -> str:
        """The host ceiling it counts under: its host's range (host_range: an IPv6 /64)."""
        return host_range(self.host)

    @property
    def key(self) -> str:
        """The budget it spends: its verified peer id's, or (unproven) the one its host's unproven callers share."""
        return f"id:{self.peer_id}" if self.peer_id else f"host:{self.ceiling}"

    def __str__(self) -> str:
        return f"{self.peer_id[-6:]} at {self.host}" if self.peer_id else f"unproven callers of {self.host}"


def as_caller(caller: Caller | str) -> Caller:
    """A Caller; a bare string is a host whose call proved nothing."""
    return caller if isinstance(caller, Caller) else Caller(caller)


class StreamLimiter:
    """Counts running streams; acquire(caller) raises Busy when the total, the caller identity's or the caller
    host's count is at its cap.

    :param max_total: streams served at once over all callers (<= 0: unlimited)
    :param max_per_caller: streams served at once for one caller host, all its identities (<= 0: unlimited)
    :param max_per_identity: streams served at once for one caller identity (a verified peer id; the unproven
        callers of a host together count as one) (<= 0: unlimited)
    """

    def __init__(
        self,
        max_total: int = DEFAULT_MAX_STREAMS,
        max_per_caller: int = DEFAULT_MAX_STREAMS_PER_PEER,
        max_per_identity: int = DEFAULT_MAX_STREAMS_PER_IDENTITY,
    ):
        self.max_total, self.max_per_caller, self.max_per_identity = max_total, max_per_caller, max_per_identity
        self.total = 0
        self.by_caller: dict[str, int] = {}  # host -> streams
        self.by_identity: dict[str, int] = {}  # Caller.key -> streams
        self.refused = 0

    def acquire(self, caller: Caller | str) -> None:
        """Take a stream slot for caller (release() it when the stream ends); raises Busy at a cap."""
        c = as_caller(caller)
        held, mine = self.by_caller.get(c.ceiling, 0), self.by_identity.get(c.key, 0)
        if 0 < self.max_total <= self.total:
            self.refused += 1
            raise Busy(f"this peer serves {self.total} streams already (limit {self.max_total}); retry later")
        if 0 < self.max_per_identity <= mine:
            self.refused += 1
            raise Busy(f"{mine} streams of {c} already (limit {self.max_per_identity} per identity)")
        if 0 < self.max_per_caller <= held:
            self.refused += 1
            raise Busy(f"{held} streams from {c.ceiling} already (limit {self.max_per_caller} per caller host)")
        self.total += 1
        self.by_caller[c.ceiling] = held + 1
        self.by_identity[c.key] = mine + 1

    def full(self, caller: Caller | str) -> bool:
        """Whether the caller's identity holds all the streams it may (acquire would refuse it)."""
        c = as_caller(caller)
        return 0 < self.max_per_identity <= self.by_identity.get(c.key, 0)

    def release(self, caller: Caller | str) -> None:
        c = as_caller(caller)
        self.total -= 1
        for counts, key in ((self.by_caller, c.ceiling), (self.by_identity, c.key)):
            left = counts.get(key, 1) - 1
            if left > 0:
                counts[key] = left
            else:
                counts.pop(key, None)


class RateLimiter:
    """A token bucket per key: `rate` tokens per second sustained, bursts up to `burst` (take's cost).

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

    def tokens(self, caller: str) -> float:
        """The tokens the caller's bucket holds now (burst for one not seen; inf when unlimited)."""
        if self.rate <= 0:
            return float("inf")
        now = self.clock()
        tokens, at = self._buckets.get(caller, (self.burst, now))
        return min(self.burst, tokens + (now - at) * self.rate)

    def take(self, caller: str, cost: float = 1.0) -> None:
        """Spend `cost` tokens of the caller's bucket; raises Busy when it holds fewer."""
        if self.rate <= 0:
            return
        if self.tokens(caller) < cost:
            self.refused += 1
            raise Busy(f"{caller} is over its rate of {self.rate:g} request units/s; slow down")
        self.charge(caller, cost)

    def charge(self, caller: str, cost: float) -> None:
        """Spend `cost` tokens of the caller's bucket whatever it holds (down to -burst: a debt it pays back)."""
        if self.rate <= 0:
            return
        tokens = self.tokens(caller)
        self._buckets.pop(caller, None)
        self._buckets[caller] = (max(-self.burst, tokens - cost), self.clock())
        while len(self._buckets) > self.max_callers:
            self._buckets.popitem(last=False)


class CallerBudget:
    """A token bucket per caller identity (Caller.key) under a ceiling bucket per caller host.

    take(caller, cost) spends from both or from neither: a caller over its own rate is refused without touching
    its host's ceiling, so one flooding identity cannot empty what the other identities of its host share.

    :param per_identity: the bucket of each identity (a verified peer id, or a host's unproven callers together)
    :param per_host: the ceiling of each host over all its identities (None: no ceiling)
    """

    def __init__(self, per_identity: RateLimiter, per_host: RateLimiter | None = None):
        self.per_identity, self.per_host = per_identity, per_host
        self.refused = 0

    @classmethod
    def of(
        cls,
        rate: float,
        burst: float,
        host_shares: float = HOST_SHARES,
        clock: Callable[[], float] = time.monotonic,
    ) -> CallerBudget:
        """rate and burst per identity; a host's ceiling is host_shares identities' worth (rate <= 0: unlimited)."""
        host = RateLimiter(rate * host_shares, burst * host_shares, clock=clock)
        return cls(RateLimiter(rate, burst, clock=clock), host)

    def take(self, caller: Caller | str, cost: float = 1.0) -> None:
        """Spend `cost` of the caller's budget and of its host's ceiling; raises Busy (spending nothing) when
        either holds less."""
        c = as_caller(caller)
        me, host = self.per_identity, self.per_host
        if me.tokens(c.key) < cost:
            self.refused += 1
            me.refused += 1
            raise Busy(f"{c} is over its rate of {me.rate:g} request units/s; slow down")
        if host is not None and host.tokens(c.ceiling) < cost:
            self.refused += 1
            host.refused += 1
            raise Busy(f"caller host {c.ceiling} is over its rate of {host.rate:g} request units/s; slow down")
        me.charge(c.key, cost)
        if host is not None:
            host.charge(c.ceiling, cost)

    def charge(self, caller: Caller | str, cost: float) -> None:
        """Make the caller (and only it: not its host's other identities) pay `cost` more, e.g. for a rejected
        payload; its next requests are refused until its bucket has refilled."""
        self.per_identity.charge(as_caller(caller).key, cost)

    def exhausted(self, caller: Caller | str, cost: float = 1.0) -> bool:
        """Whether the caller's own bucket holds less than `cost` (take would refuse it)."""
        return self.per_identity.tokens(as_caller(caller).key) < cost

    def refund(self, caller: Caller | str, cost: float = 1.0) -> None:
        """Give back what take(caller, cost) spent (the call was refused after all, e.g. at a stream cap)."""
        c = as_caller(caller)
        self.per_identity.charge(c.key, -cost)
        if self.per_host is not None:
            self.per_host.charge(c.ceiling, -cost)


def budget(limiter: RateLimiter | CallerBudget) -> CallerBudget:
    """A CallerBudget; a bare RateLimiter is taken as the per-identity bucket with no host ceiling."""
    return limiter if isinstance(limiter, CallerBudget) else CallerBudget(limiter)
