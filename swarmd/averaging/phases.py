"""Two-phase group averaging: every member of a part reaches the mean of all its groups inside one round.

Owns GossipConfig.group_layout "two-phase" (swarmd.averaging.groups.assign hands that layout here):
  - layout (rows): a new order every round (sha256(salt, round, peer id)) laid on c = ceil(n / k) rows, member i
    at row i mod c, column i // c: c groups of at most k whose sizes are within one (the balanced cut);
  - phase 1: each row is a group and merges its members' payloads (anchor offsets + deltas) with the robust
    merge, as any group does; every member of a row that accepted the same payloads holds the same value;
  - phase 2, in the same round (sources): the members are also cut into columns (member j of every row
    together, the second round of the "orthogonal" layout); each peer takes the phase-1 value of every other
    row from that row's member in its own column, or, where that row is shorter (the last column is partial
    when k does not divide n), from its member in column j mod the row's length. A peer sends its row's value
    to the peers that read it (readers: about c - 1 of them) as well as its payload to its row; in the daemon
    (swarmd.averaging.phase2) each reader asks its sources over ExchangeDeltas, its own row value the request;
  - combine: each peer's new offset is the mean of the rows' values weighted by how many payloads each row
    merged, in row order. When every row merged one value for all its members and every peer got every row,
    every peer computes the same bits: with the plain mean merge the exact global mean of the payloads (within
    float rounding), with the robust one the count-weighted mean of the rows' robust means. The replicas are
    then bit-identical and the anchor moves, as after a one-group round (swarmd.averaging.merge.apply_merged;
    the daemon, which cannot see the other peers' rows, moves it where each row it got merged all its members:
    swarmd.averaging.phase2.exact);
  - a missing member: a payload that did not arrive is missing from its row's merge (the count drops); a row
    whose value did not reach a peer by the deadline (its source missing, and the row's other members it asks
    next, fallbacks(), too) is left out of that peer's mean.
    The round completes either way; the peers that missed a row then differ slightly, so the anchor stays
    (complete() says whether a peer got every row).
Why not a reduce-scatter: it needs every member every round and one member reduces each chunk for the whole
part (the robust merge no longer bounds a bad member); here each row is merged robustly by all its members, and
phase 2 moves one row value per other row, int8 like a payload.
The rows' values are combined with each one cut to ROW_CLIP x the rows' lower median norm (combine_clipped), in
the daemon and the simulator alike.
Plain Python and torch: no grpc, no asyncio, no gossip state.
"""

from __future__ import annotations

import hashlib
import math

import torch

from swarmd.averaging.robust import delta_norm

Tensors = dict[str, torch.Tensor]
ROW_CLIP = 2.0  # a row's value is cut to this x the lower median of the rows' norms


def _order_key(salt: str, round: int, peer_id: str) -> bytes:
    return hashlib.sha256(f"{salt}\x00two-phase\x00{round}\x00{peer_id}".encode()).digest()


def rows(members: list[str] | set[str], round: int, k: int, salt: str = "") -> list[list[str]]:
    """The round's rows (the phase-1 groups), in row order, each in column order (see the module doc).

    Deterministic in (members, round, k, salt); k <= 0 or n <= k: one row of everybody (no phase 2)."""
    ids = sorted(set(members))
    if k <= 0 or len(ids) <= k:
        return [ids] if ids else []
    count = -(-len(ids) // k)
    order = sorted(ids, key=lambda p: _order_key(salt, round, p))
    return [order[r::count] for r in range(count)]


def position(layout: list[list[str]], peer_id: str) -> tuple[int, int]:
    """(row, column) of `peer_id` in the layout."""
    for r, row in enumerate(layout):
        if peer_id in row:
            return r, row.index(peer_id)
    raise KeyError(f"{peer_id} is not in the layout")


def sources(layout: list[list[str]], peer_id: str) -> dict[int, str]:
    """Row index -> the member whose phase-1 value `peer_id` takes, for every row but its own."""
    r, j = position(layout, peer_id)
    return {s: row[j % len(row)] for s, row in enumerate(layout) if s != r and row}


def fallbacks(layout: list[list[str]], peer_id: str) -> dict[int, list[str]]:
    """Row index -> its members in the order `peer_id` asks them for the row's value: the source first, then the
    row's next columns (a source that missed the deadline is replaced by a member of its row that has the value)."""
    r, j = position(layout, peer_id)
    return {s: [row[(j + t) % len(row)] for t in range(len(row))] for s, row in enumerate(layout) if s != r and row}


def readers(layout: list[list[str]], peer_id: str) -> list[str]:
    """The peers that take their value of `peer_id`'s row from `peer_id` (whom its phase-2 payload goes to)."""
    r, _ = position(layout, peer_id)
    return [p for s, row in enumerate(layout) if s != r for p in row if sources(layout, p).get(r) == peer_id]


def combine(values: list[tuple[float, Tensors]]) -> Tensors:
    """The count-weighted mean of the rows' values ((weight, value) in row order), fp32, summed in that order:
    the same inputs in the same order give every peer the same bits."""
    live = [(float(w), v) for w, v in values if w > 0]
    if not live:
        raise ValueError("combine needs at least one row with a positive weight")
    total = sum(w for w, _ in live)
    out: Tensors = {}
    for name in live[0][1]:
        acc = torch.zeros_like(live[0][1][name], dtype=torch.float32)
        for w, v in live:
            acc += w * v[name].float()
        out[name] = acc / total
    return out


def combine_clipped(values: list[tuple[float, Tensors]]) -> Tensors:
    """combine() with each row's value cut to ROW_CLIP x the lower median of the rows' norms (from two rows; a
    value within it is used as it is, so honest rows keep the same bits for every peer): one bad row is bounded."""
    norms = [delta_norm(v) for _, v in values]
    cap = ROW_CLIP * sorted(norms)[(len(norms) - 1) // 2] if len(norms) >= 2 else math.inf
    return combine(
        [
            (w, v if norm <= cap else {n: t * (cap / norm if math.isfinite(norm) else 0.0) for n, t in v.items()})
            for (w, v), norm in zip(values, norms, strict=True)
        ]
    )


def complete(layout: list[list[str]], got: set[int]) -> bool:
    """Whether a peer that holds the values of rows `got` (its own included) has every row of the layout."""
    return got >= set(range(len(layout)))
