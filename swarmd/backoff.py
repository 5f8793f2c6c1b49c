"""Backoff: exponentially growing bans of failing peers, the one policy gossip and inference routing share.

A key (a peer id or an address) that fails is skipped for base_s seconds, then 2x, 4x ... at most
max_s (petals' sequence-manager rule); a sign of life lifts the ban and starts the period over.
Keeps two small dicts; no asyncio, no locks: one owner on one event loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class Backoff:
    """Bans per key: the n-th failure in a row bans for min(max_s, base_s * 2 ** (n - 1)) seconds.

    :param base_s: ban after the first failure, seconds
    :param max_s: longest ban, seconds
    :param clock: monotonic time source in seconds (tests pass a fake one)
    """

    def __init__(self, base_s: float = 1.0, max_s: float = 16.0, clock: Callable[[], float] = time.monotonic):
        if not 0 < base_s <= max_s:
            raise ValueError(f"need 0 < base_s <= max_s, got {base_s} and {max_s}")
        self.base_s, self.max_s, self.clock = base_s, max_s, clock
        self._failures: dict[str, int] = {}
        self._until: dict[str, float] = {}

    def fail(self, key: str) -> float:
        """Ban key after one more failure; returns the ban in seconds."""
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        period = min(self.max_s, self.base_s * 2 ** (n - 1))
        self._until[key] = self.clock() + period
        return period

    def succeed(self, key: str) -> None:
        """A sign of life: lift any ban on key and start its period over."""
        self._failures.pop(key, None)
        self._until.pop(key, None)

    def until(self, key: str) -> float:
        """Clock time at which key's ban ends (-inf when it was never banned)."""
        return self._until.get(key, -math.inf)

    def banned(self, key: str, now: float | None = None) -> bool:
        """Whether key is still banned at `now` (default: the clock's current time)."""
        return (self.clock() if now is None else now) < self.until(key)
