"""Robust aggregation of the deltas a round accepted: one (or a minority of) malicious peers cannot move it far.

Owns the merge rule of a round (gossip calls robust_merge on the block deltas and on the byte-table deltas)
and the absolute bound beyond which a decoded delta is rejected instead of merged (delta_norm_bound):
  1. norm clipping: each peer's delta (all its tensors as one vector) is scaled down to at most
     clip_factor x the *lower* median of the peers' norms. The lower median (sorted[(n - 1) // 2]) is an
     honest norm whenever honest peers are a majority, and with two peers it is the smaller norm: a x1000
     (or x1e36) delta from one of two peers is cut to clip_factor x the honest one's norm;
  2. coordinate-wise trimmed mean: per coordinate, the `trim` largest and `trim` smallest values are
     dropped and the rest averaged, trim = min((n - 1) // 2, ceil(trim_fraction x n)): 0 for one or two
     peers (the mean of the clipped deltas), 1 for three to ten (three: the median) at the default 0.1.
     This removes a noise delta that has an honest norm, but a sign-flipped one (-own delta) still pulls
     every coordinate it is extreme in toward zero: with 3 honest + 1 flipped the trimmed mean shrinks the
     honest update (measured +0.05 nats after 30 rounds, benchmarks/adversary.py);
  3. outlier check (from three peers): against the clipped trimmed mean of all deltas (the round's robust
     centre), a peer is dropped when its delta points away from the centre (cosine below min_cosine,
     default 0) or, if distance_factor > 0 (default 0: off), lies farther from it than distance_factor x
     the lower median of the clipped deltas' distances; the rest are merged again by 1-2. At most
     (n - 1) // 2 peers are ever dropped: if more look like outliers, the centre itself is noise and
     nobody is dropped. min_cosine = -1 turns the direction test off.
     A sign-flipped delta has an honest norm and survives the trim, pulling the honest update toward zero
     (+0.05 nats after 30 rounds in benchmarks/adversary.py); its cosine with the centre is near -1, and the
     clean runs of that benchmark dropped no honest delta. The distance test also removes a noise delta
     clipped to 2x the median norm, which leaks through the trim (simulator: +0.014 nats, with the test
     -0.001), but it drops honest byte-table deltas too, whose spread across blocks is wide (simulator,
     benchmarks/swarm.py's config: +0.007 nats at 1.5, +0.005 at 2.0), so it is off by default.
With trim 0, nothing clipped and nothing dropped the result is merge_mean's, bit for bit (same peer-id summation order).
Deterministic: peers are taken in sorted peer-id order, norms are summed in float64 in tensor order, and
the per-coordinate sort (exact min / max) and sums run in fixed order, so replicas that accepted the same
set of deltas end bit-identical. No randomness, no threads of its own. Plain torch; no grpc, no gossip state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

Deltas = dict[str, dict[str, torch.Tensor]]  # peer id -> tensor name -> delta


@dataclass(frozen=True)
class MergeStats:
    """What a robust merge did (for logs and metrics)."""

    peers: int
    trimmed: int  # values dropped from each end per coordinate
    clipped: int  # peers whose delta was scaled down
    clip_norm: float  # the norm every delta was clipped to (inf when n == 0)
    dropped: int = 0  # peers dropped by the outlier check (the other fields describe the merge of the rest)


def trim_count(n: int, trim_fraction: float) -> int:
    """Values trimmed from each end per coordinate for n peers: min((n - 1) // 2, ceil(trim_fraction * n))."""
    if n <= 2 or trim_fraction <= 0:
        return 0
    return min((n - 1) // 2, math.ceil(trim_fraction * n - 1e-9))


def delta_norm(delta: dict[str, torch.Tensor]) -> float:
    """L2 norm of all tensors of one delta as one vector (float64, tensor order); inf if any value is not finite."""
    total = 0.0
    for t in delta.values():
        total += float(t.double().pow(2).sum())
    return math.sqrt(total) if math.isfinite(total) else math.inf


def delta_norm_bound(steps: int, lr: float, numel: int, factor: float) -> float:
    """Largest norm an honest delta of `steps` AdamW steps at peak `lr` over `numel` values can have, x factor.

    An Adam step moves each coordinate by about lr at most (grad clipping and the moment ratio keep it within a
    small multiple), so H steps move a vector of numel values by at most ~ H * lr * sqrt(numel); honest deltas
    are far below that (steps do not all point the same way), a x1000 one is far above.
    """
    return factor * steps * lr * math.sqrt(max(numel, 1))


def _sorted_rows(rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """The rows sorted per coordinate (row i holds every coordinate's i-th smallest value); exact values.

    Up to SORT_NETWORK_MAX rows: odd-even transposition sort with elementwise min / max (n passes of
    n / 2 compare-exchanges, ~100x faster than torch.sort along a dimension of a few values); beyond,
    torch.sort. Both give the same values.
    """
    n = len(rows)
    if n > SORT_NETWORK_MAX:
        ordered = torch.stack(rows).sort(dim=0).values
        return list(ordered.unbind(0))
    out = list(rows)
    for p in range(n):
        for i in range(p % 2, n - 1, 2):
            lo, hi = torch.minimum(out[i], out[i + 1]), torch.maximum(out[i], out[i + 1])
            out[i], out[i + 1] = lo, hi
    return out


SORT_NETWORK_MAX = 32  # rows sorted with min / max; more: torch.sort


def mean_in_order(rows: list[torch.Tensor]) -> torch.Tensor:
    """fp32 mean of rows summed in the order given (a fixed order gives every replica the same bits)."""
    acc = torch.zeros_like(rows[0], dtype=torch.float32)
    for x in rows:
        acc += x
    return acc / len(rows)


def _outlier_tests(
    delta: dict[str, torch.Tensor], scale: float, centre: dict[str, torch.Tensor], centre_sq: float, distance: bool
) -> tuple[float, float]:
    """(cosine of the delta with the centre, distance of the clipped delta (x scale) to it, or 0 unless
    `distance`): all tensors as one vector, float64, tensor order; cosine nan and distance inf if undefined or not
    finite. centre_sq: the centre's squared norm (the same for every peer)."""
    dot = a2 = d2 = 0.0
    for name, t in delta.items():
        x, c = t.double(), centre[name].double()
        dot += float((x * c).sum())
        a2 += float(x.pow(2).sum())
        if distance:
            d2 += float((x * scale - c).pow(2).sum())
    den = math.sqrt(a2 * centre_sq)
    cos = dot / den if den > 0 and math.isfinite(den) and math.isfinite(dot) else math.nan
    return cos, math.sqrt(d2) if math.isfinite(d2) else math.inf


def robust_merge(
    deltas: Deltas,
    clip_factor: float = 2.0,
    trim_fraction: float = 0.1,
    min_cosine: float = 0.0,
    distance_factor: float = 0.0,
) -> tuple[dict[str, torch.Tensor], MergeStats]:
    """Clipped, coordinate-wise trimmed mean of the deltas after the outlier check (see the module doc).

    :param deltas: peer id -> {name: fp32 tensor}; every peer must hold the same names and shapes (own included)
    :param clip_factor: each delta's norm is cut to clip_factor x the lower median norm (<= 0: no clipping)
    :param trim_fraction: fraction of peers trimmed from each end per coordinate (0: plain mean of the clipped)
    :param min_cosine: from 3 peers, drop those whose cosine with the robust centre is below this (-1: off)
    :param distance_factor: from 3 peers, drop those farther from the centre than this x the lower median
        distance (0: off)
    :returns: (merged, stats)
    :raises ValueError: no delta, or peers with different tensor names
    """
    ids = sorted(deltas)
    if not ids:
        raise ValueError("robust_merge needs at least one delta (own delta included)")
    names = list(deltas[ids[0]])
    if any(set(deltas[p]) != set(names) for p in ids):
        raise ValueError("robust_merge: peers hold different tensors")
    merged, stats, scales = _clip_trim(deltas, ids, names, clip_factor, trim_fraction)
    n = len(ids)
    if (min_cosine <= -1 and distance_factor <= 0) or n < 3:
        return merged, stats
    centre_sq = sum(float(merged[name].double().pow(2).sum()) for name in names)
    tests = [_outlier_tests(deltas[p], s, merged, centre_sq, distance_factor > 0) for p, s in zip(ids, scales)]
    far = distance_factor * sorted(d for _, d in tests)[(n - 1) // 2] if distance_factor > 0 else math.inf
    # nan cosine (a zero or non-finite delta, already clipped to zero): only the distance test applies
    out = [p for p, (cos, dist) in zip(ids, tests) if cos < min_cosine or dist > far]
    if not 0 < len(out) <= (n - 1) // 2:
        return merged, stats
    rest = [p for p in ids if p not in out]
    merged, stats, _ = _clip_trim(deltas, rest, names, clip_factor, trim_fraction)
    return merged, replace(stats, dropped=len(out))


def _clip_trim(
    deltas: Deltas, ids: list[str], names: list[str], clip_factor: float, trim_fraction: float
) -> tuple[dict[str, torch.Tensor], MergeStats, list[float]]:
    """Steps 1-2 of the module doc over the peers `ids` (sorted): (merged, stats, each peer's clip scale)."""
    n = len(ids)
    norms = [delta_norm(deltas[p]) for p in ids]
    clip_norm = math.inf
    scales = [1.0] * n
    if clip_factor > 0 and n >= 2:
        clip_norm = clip_factor * sorted(norms)[(n - 1) // 2]
        scales = [1.0 if norm <= clip_norm else (clip_norm / norm if math.isfinite(norm) else 0.0) for norm in norms]
    k = trim_count(n, trim_fraction)
    out: dict[str, torch.Tensor] = {}
    for name in names:
        rows = []
        for pid, scale in zip(ids, scales):
            x = deltas[pid][name].float()
            if scale != 1.0:
                x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0) * scale if scale == 0.0 else x * scale
            rows.append(x)
        if k == 0:  # sorted peer-id order: merge_mean's bits when nothing was clipped
            out[name] = mean_in_order(rows)
            continue
        ordered = _sorted_rows(rows)
        acc = ordered[k].clone()
        for i in range(k + 1, n - k):
            acc += ordered[i]
        out[name] = acc / (n - 2 * k)
    return out, MergeStats(n, k, sum(s < 1.0 for s in scales), clip_norm), scales
