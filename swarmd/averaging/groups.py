"""Group averaging: who averages with whom each round, and the anchor that keeps group payloads int8-sized.

Owns the group assignment (balanced random groups by default; a Moshpit-style grid, Ryabinin et al. 2021) and
the anchored merge arithmetic that Gossip.average applies when a round splits the swarm into groups
(GossipConfig.group_size = k > 0):

  - assignment (assign), GossipConfig.group_layout "balanced" (the default): the members of a part (the
    same-block peers for a block, every peer for the byte table; the signed DHT records plus this peer) are
    ordered by sha256(salt, round, peer id) and cut into the fewest groups of at most k, of equal size (within
    one), a new cut every round. Layout "orthogonal": as balanced, but in pairs of rounds whose second
    round's groups each take an equal share of every group of the first (exact global mean in two rounds
    when the counts divide). Layout "grid": the members are ordered by sha256(salt, epoch, peer id) and laid on a
    d-dimensional grid, d = ceil(log_k n), of sides at most k whose product is the least >= n; in round r
    the groups are the grid lines along dimension r mod d, and every epoch of d rounds draws a new order.
    Layout "two-phase": the rows of swarmd.averaging.phases (balanced groups), whose merged values the daemon's
    round also averages across the rows in the same round (swarmd.averaging.phase2), the simulator too
    (swarmd.sim.grouping). Every peer computes the same groups from the same records and round; each peer is
    in exactly one group of at most k peers; the groups change every round; when n is the grid's product (8 = 4 x 2,
    24 = 4 x 3 x 2), d rounds of plain averaging give every member the exact global mean (the grid
    all-reduce), and the reshuffle each epoch mixes incomplete grids. n <= k:
    one group of everybody, which is the all-to-all round of before, bit for bit;
  - the anchor: once groups average apart, the replicas of a block no longer share a base, so a delta on
    one base cannot be merged with a delta on another (base differences would never shrink, and the
    BaseMismatch / re-sync rules would fire every round). Each part keeps an anchor A: the last state
    every replica shared bit for bit (the base when the swarm left one-group rounds, or a state adopted by
    the quorum re-sync). A peer with base x sends int8(x - A + delta) (error feedback on), stamped with A's
    hash; its group merges those with the robust merge (swarmd.averaging.robust: one bad member is clipped to
    2x the median norm and, from 3 members, trimmed) and every member's new base is A + merged: Moshpit
    averaging of the parameters, carried as int8 offsets from a shared point instead of dense fp32
    parameters. Replicas of a group end equal, and regrouping every round drives every replica to the one
    mean. Records and payloads announce the anchor's hash, so the re-sync rule (quorum of signed records)
    sees one state per part and never fires on group differences; a joiner pulls the anchor (what the
    quorum announces, hash-checked) and catches up through its groups, while predecessor and CE pulls ask
    for a peer's own merged block (PullStateRequest.current). A round that is one group again
    (the swarm shrank, or every group_full_every-th round) merges the same way, sets the base to A + merged
    exactly (bit-identical replicas) and makes it the new anchor;
  - why not the alternatives (numbers in README "Group averaging"): a butterfly / reduce-scatter all-reduce
    moves ~2x the delta per peer and keeps bases identical, but each chunk is reduced by one owner, so one
    bad member sets its chunk of the mean for the whole block (the robust merge no longer bounds it), and it
    needs every member every round; dense fp32 parameters (plain Moshpit) move ~7x the bytes of an int8
    delta per partner. The anchored offset costs an int8 delta per partner and keeps the robust merge.
    Its price: the offset x - A grows with the rounds since the anchor (the int8 step is relative to it),
    so the norm bound of a payload grows with the anchor's age (norm_bound_factor), and group_full_every
    re-anchors periodically.
Plain Python and torch: no grpc, no asyncio, no gossip state.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math

import torch

from swarmd.averaging import phases
from swarmd.averaging.config import GossipConfig
from swarmd.averaging.delta import INT8_RMS_LEVELS


def grid_dims(n: int, k: int) -> int:
    """Dimensions d of the grid for n members in groups of at most k: the least d with k ** d >= n (1 if n <= k)."""
    if k < 2 or n <= k:
        return 1
    d = 1
    while k**d < n:
        d += 1
    return d


@functools.lru_cache(maxsize=256)
def grid_sides(n: int, k: int) -> tuple[int, ...]:
    """Sides of the grid for n members in groups of at most k: d = grid_dims(n, k) sides of at most k each,
    the least product >= n (an exact product means the grid all-reduce is exact), larger sides first."""
    d = grid_dims(n, k)
    if d == 1:
        return (max(1, n),)
    best: tuple[int, ...] | None = None
    for sides in itertools.combinations_with_replacement(range(2, k + 1), d):
        p = math.prod(sides)
        if p >= n and (best is None or p < math.prod(best)):
            best = sides
    assert best is not None  # k ** d >= n
    return tuple(sorted(best, reverse=True))


def _order_key(salt: str, epoch: int, peer_id: str) -> bytes:
    return hashlib.sha256(f"{salt}\x00{epoch}\x00{peer_id}".encode()).digest()


def assign(members: list[str] | set[str], round: int, k: int, salt: str = "", layout: str = "grid") -> list[list[str]]:
    """The groups of `round` (see the module doc): a partition of `members` into groups of at most k peers.

    Deterministic in (members, round, k, salt, layout); each group is sorted by peer id; groups are listed by
    their first member. k <= 0 or len(members) <= k: one group of everybody.

    :param salt: separates independent assignments (e.g. per block, and the byte table)
    :param layout: "grid" (the module doc), "balanced": every round a new order cut into the fewest groups
        of at most k, their sizes within one of each other (8 in groups of 4: two groups of 4 every round,
        where the grid's 4 x 2 averages pairs every other round; no exact all-reduce in d rounds), or
        "orthogonal" (_orthogonal): balanced groups whose second round of each pair mixes the first's, or
        "two-phase": the rows of swarmd.averaging.phases (phase 1's groups; phase 2 mixes them in the same round)
    """
    ids = sorted(set(members))
    n = len(ids)
    if k <= 0 or n <= k:
        return [ids] if ids else []
    if k == 1:
        return [[p] for p in ids]
    if layout == "balanced":
        count = -(-n // k)
        order = sorted(ids, key=lambda p: _order_key(salt, round, p))
        return sorted((sorted(order[i::count]) for i in range(count)), key=lambda g: g[0])
    if layout == "orthogonal":
        return _orthogonal(ids, round, k, salt)
    if layout == "two-phase":
        return sorted((sorted(g) for g in phases.rows(ids, round, k, salt)), key=lambda g: g[0])
    sides = grid_sides(n, k)
    epoch, dim = divmod(round, len(sides))
    order = sorted(ids, key=lambda p: _order_key(salt, epoch, p))
    lines: dict[tuple[int, ...], list[str]] = {}
    for index, pid in enumerate(order):
        digits = []
        for side in sides:  # mixed radix
            index, digit = divmod(index, side)
            digits.append(digit)
        digits[dim] = -1  # members that differ only along `dim` share a line
        lines.setdefault(tuple(digits), []).append(pid)
    return sorted((sorted(g) for g in lines.values()), key=lambda g: g[0])


def _orthogonal(ids: list[str], round: int, k: int, salt: str) -> list[list[str]]:
    """Layout "orthogonal": rounds in pairs (epochs) over one order per epoch laid on c rows, c = ceil(n / k),
    member i at row i mod c, column i // c (rows of at most m = ceil(n / c) <= k). The epoch's first round
    groups the rows; its second the diagonals, (row + column) mod c, each of which takes about m / c members
    from every row: when c divides m (8 in groups of 4, 4 in pairs, 18 in groups of 6) the two rounds give
    every member the exact global mean, as the grid does, but with groups as large as balanced ones."""
    count = -(-len(ids) // k)
    epoch, phase = divmod(round, 2)
    order = sorted(ids, key=lambda p: _order_key(salt, epoch, p))
    groups: list[list[str]] = [[] for _ in range(count)]
    for i, pid in enumerate(order):
        row, col = i % count, i // count
        groups[row if phase == 0 else (row + col) % count].append(pid)
    return sorted((sorted(g) for g in groups if g), key=lambda g: g[0])


def group_of(
    peer_id: str, members: list[str] | set[str], round: int, k: int, salt: str = "", layout: str = "grid"
) -> list[str]:
    """The group of `peer_id` in `round` (peer_id is counted as a member)."""
    for g in assign({*members, peer_id}, round, k, salt, layout):
        if peer_id in g:
            return g
    raise AssertionError("unreachable: every member is in one group")


# ----------------------------------------------------------------------------------------------
# The anchor (per part: block or byte table)
# ----------------------------------------------------------------------------------------------
Tensors = dict[str, torch.Tensor]


class Anchor:
    """The shared reference point of one part while groups average apart (None: the base is the anchor).

    :ivar tensors: anchor weights (fp32 copies), None while the part's base is its own anchor
    :ivar hash: weights hash of the anchor (what records and payloads announce)
    :ivar round: the round the anchor was the shared base of (its age bounds honest offsets)
    """

    def __init__(self) -> None:
        self.tensors: Tensors | None = None
        self.hash = ""
        self.round = 0

    @property
    def active(self) -> bool:
        return self.tensors is not None

    def set(self, base: Tensors, base_hash: str, round: int) -> None:
        """Freeze `base` (the state every replica shares now) as the anchor."""
        self.tensors = {k: v.detach().to("cpu", torch.float32).clone() for k, v in base.items()}
        self.hash, self.round = base_hash, int(round)

    def clear(self) -> None:
        """The base is the anchor again (after a one-group round or an adopted state)."""
        self.tensors, self.hash, self.round = None, "", 0

    def reference(self, base: Tensors, base_hash: str) -> tuple[Tensors, str]:
        """(anchor tensors, anchor hash): the anchor's, or the base's when no anchor is held."""
        return (self.tensors, self.hash) if self.tensors is not None else (base, base_hash)

    def offset(self, base: Tensors) -> Tensors | None:
        """base - anchor (None when no anchor is held: the offset is zero)."""
        if self.tensors is None:
            return None
        return {k: base[k].float() - self.tensors[k] for k in base}

    def age(self, round: int) -> int:
        """Rounds since the anchor was the shared base (0 without an anchor)."""
        return max(0, int(round) - self.round) if self.tensors is not None else 0


OFFSET_INT8_RMS_LEVELS: float | None = 16.0  # int8 step of an anchored payload: max(absmax / 127, rms / this)


def offset_int8_levels(anchor: Anchor) -> float | None:
    """The int8 step rule of a part's payload (swarmd.averaging.delta.encode's int8_rms_levels): the delta's own
    (INT8_RMS_LEVELS) without an anchor, finer with one (the offset's common drift sets the step; a coarse
    step would leave that much noise between the replicas)."""
    return OFFSET_INT8_RMS_LEVELS if anchor.active else INT8_RMS_LEVELS


def with_offset(delta: Tensors, offset: Tensors | None) -> Tensors:
    """What a group member sends: offset + delta (the delta itself without an anchor)."""
    if offset is None:
        return delta
    return {k: offset[k] + delta[k] for k in delta}


def merged_target(anchor: Tensors, merged: Tensors) -> Tensors:
    """The group's new base: anchor + merged offsets (fp32, in tensor order)."""
    return {k: anchor[k] + merged[k] for k in anchor}


def base_step(target: Tensors, base: Tensors) -> Tensors:
    """The change to apply to a base to reach `target` (what BlockState.apply_merge adds)."""
    return {k: target[k] - base[k].float() for k in target}


def norm_bound_factor(age: int) -> float:
    """How much larger than one round's delta an honest anchored payload may be: 1 + the anchor's age.

    An offset is the sum of the merged deltas since the anchor (each within one round's bound), so a
    payload of an anchor `age` rounds old is within (1 + age) bounds; the robust merge still clips each
    member to 2x the group's median norm.
    """
    return 1.0 + max(0, int(age))


def round_members(
    me: str, pool: list[str], round: int, cfg: GossipConfig, salt: str, table: bool = False
) -> set[str] | None:
    """The other members of `me`'s group this round (None: one group of everybody, the all-to-all round).

    :param pool: peer ids of the part's signed records (me may be among them)
    :param cfg: the GossipConfig (group_size, group_full_every, group_layout; table_group_size for the byte table)
    :param table: the part is the byte table (its own group size)
    """
    k, full_every = (cfg.table_group_size if table else cfg.group_size), cfg.group_full_every
    members = {*pool, me}
    if k <= 0 or len(members) <= k or (full_every and round % full_every == 0):
        return None
    return set(group_of(me, members, round, k, salt, cfg.group_layout)) - {me}
