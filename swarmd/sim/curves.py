"""Quality against the clock: CE curves as (seconds, CE) points, read at a time and searched for a target.

Owns ce_at (the CE a run had reached by a time: its last measurement at or before it), time_to (when a run first
reached a target CE, interpolated between its two measurements around the crossing; None if it never did) and
busy_share (peer-seconds spent training over peer-seconds held). Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

Curve = Sequence[tuple[float, float]]  # (seconds, CE), seconds ascending, the first point the start


def ce_at(curve: Curve, t: float) -> float:
    """The CE measured last at or before time t (the first point's before it)."""
    if not curve:
        raise ValueError("an empty curve")
    best = curve[0][1]
    for s, ce in curve:
        if s > t:
            break
        best = ce
    return best


def time_to(curve: Curve, target: float) -> float | None:
    """The first time the curve reaches CE <= target, linearly interpolated between the measurements before and at
    the crossing; None when it never does."""
    prev: tuple[float, float] | None = None
    for s, ce in curve:
        if ce <= target:
            if prev is None or prev[1] == ce:
                return s
            t0, c0 = prev
            return t0 + (s - t0) * (c0 - target) / (c0 - ce)
        prev = (s, ce)
    return None


def busy_share(trained_s: Sequence[float], round_s: Sequence[float], peers: int) -> float:
    """Peer-seconds spent on training steps over the peer-seconds of the run (each round: peers x its length)."""
    held = peers * sum(round_s)
    return sum(trained_s) / held if held > 0 else 0.0
