"""DriftTracker: which peers' deltas keep pulling the merge the same way, round after round.

A signed insider can send its honest delta plus a fixed direction v every round. At an honest norm it passes the
norm clip, the trim and the outlier check of swarmd.averaging.robust, and the merge drifts along v with the rounds.
Each round's deviation of a peer from the robust centre (delta_i - merged) looks like noise; what gives the
insider away is that its deviations keep pointing the same way. This module owns that test:

  - each round, every accepted peer's deviation from the centre is reduced to a fixed-seed count-sketch of
    `sketch_size` values (swarmd.averaging.sketch.count_sketch; 0 = the full vector) and scaled to unit length
    u_t (a peer's norm does not matter, only its direction);
  - per peer, the cosines c_st = <u_s, u_t> of rounds at least `gap_rounds` apart are summed, with exponential
    forgetting (horizon `horizon_rounds`): A = sum_p b_p c_p. Honest deviations are correlated with the
    previous round or two (AdamW momentum, error feedback: measured cos +0.36 at lag 1, +0.09 at lag 2, +0.03 at
    lag 3, under 0.01 from lag 5 on, real deltas of swarmd.sim), never across many rounds: far pairs have mean
    0. A fixed v gives every far pair the same positive cosine;
  - z = A / sqrt(m2 * sum_p b_p^2), with m2 the mean squared cosine of far pairs of the honest noise, estimated
    per peer (c^2 at lag `gap_rounds`) and taken as the lower median over the round's peers (a drifting peer's
    own m2 is large, the honest majority's is not), each peer's own m2 honoured up to `spread_cap` x that;
  - threshold: P(z >= sqrt(2x) + sqrt(2) x) <= e^-x (Laurent-Massart / Hanson-Wright for a Gaussian chaos of
    order 2, with the operator norms bounded by the Frobenius ones), whatever the covariance of the honest noise,
    given deviations independent beyond gap_rounds. A peer is tested at every round it is seen, with
    x = ln(pi^2 n^2 / (6 alpha)) at its n-th round, so the chance an honest peer is ever flagged over its whole
    tracked life is at most alpha (`false_positive`, default 1e-4) under that model. Measured, real deltas
    (swarmd.sim, 500 rounds) and synthetic AR(1) noise (isotropic or not, 500 rounds): nobody flagged, honest
    peaks at 0.13-0.29 of the threshold; a 1.0-1.7x-norm fixed direction is flagged within 13-18 rounds (real deltas,
    3 peers) and 13-27 (synthetic, 3-4 peers): tests/test_drift.py;
  - a flagged peer is left out for good (excluded(); the caller merges without it), logged once with its figures,
    and the other peers of that round start their statistics again (the flagged peer pulled the centre they
    were measured against: honest peers drift the other way, at a fraction of the rate). At most (n - 1) // 2 of
    a round's n peers are flagged in one round (two peers are symmetric: neither can be told apart), highest z
    over threshold first.
Bounded: at most `max_peers` tracked (least recently seen, then highest peer id, forgotten first: a stranger with
many identities only pushes out statistics, which restart) and `max_flagged` remembered as flagged; each tracked
peer holds gap_rounds + 1 vectors of sketch_size float64 (256: 12 KiB at the default gap of 5).
Deterministic: peers in sorted order, float64 torch on CPU, no randomness: replicas that accepted the same sets
reach the same verdicts. The sketch seed is public: a peer that reads this code can put its drift in the sketch's
null space; sketch_size=0 (full vectors, gap_rounds + 1 model-sized vectors per peer) closes that.
The byte table: the table deltas of peers of different blocks deviate from the all-block centre persistently
(each block pulls the table its own way: measured lag 5-50 cosines 0.17-0.29), so track the table only among
the peers of one block, against their own centre (centre=None: the robust merge of the deltas given).
Plain torch; no grpc, no gossip state, no threads.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import torch

from swarmd.averaging.robust import robust_merge
from swarmd.averaging.sketch import count_sketch, flatten

logger = logging.getLogger(__name__)

Tensors = dict[str, torch.Tensor]

SKETCH_SIZE = 256  # values a deviation is reduced to (0 = the full vector)
GAP_ROUNDS = 5  # pairs of rounds closer than this are not compared (honest short-range correlation)
HORIZON_ROUNDS = 32  # forgetting: a pair's weight falls by e every this many rounds
MIN_ROUNDS = 10  # rounds a peer is seen before it can be flagged
FALSE_POSITIVE = 1e-4  # chance an honest peer is ever flagged over its tracked life (under the module's model)
SPREAD_CAP = 2.0  # a peer's own mean squared cosine counts up to this x the round's lower median
MAX_PEERS = 256  # peers whose statistics are kept
MAX_FLAGGED = 4096  # flagged peer ids remembered


@dataclass(frozen=True)
class DriftScore:
    """One peer's drift statistic after its latest round (for logs and metrics)."""

    rounds: int  # rounds seen since its statistics (re)started
    z: float  # the drift statistic (0 until two rounds gap_rounds apart were seen)
    threshold: float  # z at which it is flagged (inf before min_rounds)
    m2: float  # the mean squared cosine it was standardised with


@dataclass
class _PeerDrift:
    """Running statistics of one peer (see the module doc for the symbols)."""

    near: deque[torch.Tensor] = field(default_factory=deque)  # the last gap_rounds unit vectors, oldest first
    far: torch.Tensor | None = None  # decayed sum of the older unit vectors
    w2: float = 0.0  # decayed sum of their squared weights
    a: float = 0.0  # sum_p b_p c_p
    p2: float = 0.0  # sum_p b_p^2
    m2_sum: float = 0.0  # decayed sum of c^2 at lag gap_rounds
    m2_n: float = 0.0  # decayed count of those
    rounds: int = 0
    last_round: int = -1
    score: DriftScore = DriftScore(0, 0.0, math.inf, 0.0)

    def m2(self) -> float | None:
        """The mean c^2 of this peer's own samples (None before the first)."""
        return self.m2_sum / self.m2_n if self.m2_n > 0 else None


def threshold(n: int, false_positive: float) -> float:
    """The z above which a peer seen for n rounds is flagged: sqrt(2x) + sqrt(2) x, x = ln(pi^2 n^2 / (6 alpha)).

    Summed over n = 1, 2, ... the per-round chances e^-x add up to alpha = false_positive.
    """
    x = math.log(math.pi**2 * max(n, 1) ** 2 / (6.0 * false_positive))
    return math.sqrt(2.0 * x) + math.sqrt(2.0) * x


class DriftTracker:
    """Per-peer drift statistics of one part (a block, or one block's byte table) across merged rounds.

    :param sketch_size: values each deviation is reduced to (fixed-seed count-sketch); 0 = the full vector
    :param gap_rounds: only rounds at least this far apart are compared
    :param horizon_rounds: forgetting horizon (rounds)
    :param min_rounds: rounds a peer must be seen before it can be flagged
    :param false_positive: chance an honest peer is ever flagged (see the module doc for the model)
    :param spread_cap: a peer's own mean squared cosine is used up to this x the round's lower median
    :param max_peers: peers tracked at most; :param max_flagged: flagged ids remembered at most
    :param me: own peer id: tracked (its deviation is part of the round) but never flagged
    :param part: what is tracked, for the logs ("block 0", "table")
    """

    def __init__(
        self,
        sketch_size: int = SKETCH_SIZE,
        gap_rounds: int = GAP_ROUNDS,
        horizon_rounds: float = HORIZON_ROUNDS,
        min_rounds: int = MIN_ROUNDS,
        false_positive: float = FALSE_POSITIVE,
        spread_cap: float = SPREAD_CAP,
        max_peers: int = MAX_PEERS,
        max_flagged: int = MAX_FLAGGED,
        me: str = "",
        part: str = "block",
    ):
        if sketch_size < 0 or gap_rounds < 1 or horizon_rounds < 1 or min_rounds < gap_rounds + 1:
            raise ValueError("need sketch_size >= 0, gap_rounds >= 1, horizon_rounds >= 1, min_rounds > gap_rounds")
        if not 0 < false_positive < 1 or spread_cap < 1 or max_peers < 1 or max_flagged < 1:
            raise ValueError("need 0 < false_positive < 1, spread_cap >= 1, max_peers >= 1, max_flagged >= 1")
        self.sketch_size, self.gap_rounds, self.min_rounds = sketch_size, gap_rounds, min_rounds
        self.decay = math.exp(-1.0 / horizon_rounds)
        self.false_positive, self.spread_cap = false_positive, spread_cap
        self.max_peers, self.max_flagged = max_peers, max_flagged
        self.me, self.part = me, part
        self._peers: dict[str, _PeerDrift] = {}
        self._flagged: OrderedDict[str, DriftScore] = OrderedDict()

    # -- reading -----------------------------------------------------------------------------------------
    def excluded(self) -> frozenset[str]:
        """The peers flagged as drifting: leave their deltas out of the merge."""
        return frozenset(self._flagged)

    def score(self, peer_id: str) -> DriftScore | None:
        """The latest statistic of a tracked peer (for a flagged one: the one it was flagged with)."""
        if peer_id in self._flagged:
            return self._flagged[peer_id]
        state = self._peers.get(peer_id)
        return state.score if state is not None else None

    def tracked(self) -> int:
        return len(self._peers)

    # -- one round ---------------------------------------------------------------------------------------
    def observe(self, round: int, deltas: dict[str, Tensors], centre: Tensors | None = None) -> set[str]:
        """Take the round's accepted deltas (peer id -> tensors, own included) and the centre they were merged to
        (None: robust_merge of `deltas`); returns the peers newly flagged this round."""
        if centre is None:
            centre = robust_merge(deltas)[0] if deltas else {}
        deviations = {}
        for peer_id in sorted(deltas):
            dev = {name: deltas[peer_id][name].float() - centre[name].float() for name in centre}
            deviations[peer_id] = self.reduce(dev)
        return self.observe_vectors(round, deviations)

    def reduce(self, deviation: Tensors) -> torch.Tensor:
        """The float64 vector a deviation is tracked as: its count-sketch, or all of it (sketch_size 0)."""
        if self.sketch_size == 0:
            return flatten(deviation).double()
        return torch.tensor(count_sketch(deviation, self.sketch_size), dtype=torch.float64)

    def observe_vectors(self, round: int, deviations: dict[str, torch.Tensor]) -> set[str]:
        """observe() on deviations already reduced (peer id -> float64 vector, all of one length)."""
        seen = []
        for peer_id in sorted(deviations):
            if peer_id in self._flagged:
                continue
            v = deviations[peer_id].double().reshape(-1)
            norm = float(v.norm())
            if not (math.isfinite(norm) and norm > 0):
                continue  # nothing to point anywhere this round
            self._update(peer_id, round, v / norm)
            seen.append(peer_id)
        self._evict()
        seen = [p for p in seen if p in self._peers]  # more peers in one round than max_peers: some forgotten
        n = len([p for p in deviations if p not in self._flagged])
        if not seen:
            return set()
        dim = int(deviations[seen[0]].numel())
        m2_null = self._null_m2(seen, dim)
        over: list[tuple[float, str]] = []
        for peer_id in seen:
            state = self._peers[peer_id]
            own = state.m2()
            m2 = m2_null if own is None else max(m2_null, min(own, self.spread_cap * m2_null))
            z = state.a / math.sqrt(m2 * state.p2) if state.p2 > 0 else 0.0
            limit = threshold(state.rounds, self.false_positive) if state.rounds >= self.min_rounds else math.inf
            state.score = DriftScore(state.rounds, z, limit, m2)
            if z > limit and peer_id != self.me:
                over.append((z / limit, peer_id))
        over.sort(key=lambda t: (-t[0], t[1]))
        flagged = {peer_id for _, peer_id in over[: max(0, (n - 1) // 2)]}
        for peer_id in sorted(flagged):
            s = self._peers.pop(peer_id).score
            self._flagged[peer_id] = s
            logger.warning(
                "%s round %d: %s's deltas keep pulling the merge one way (drift z %.1f > %.1f after %d rounds); "
                "leaving its deltas out from now on",
                self.part,
                round,
                peer_id[-6:],
                s.z,
                s.threshold,
                s.rounds,
            )
        while len(self._flagged) > self.max_flagged:
            self._flagged.popitem(last=False)
        if flagged:  # the others were measured against a centre the flagged peers pulled: start them again
            for peer_id in seen:
                if peer_id in self._peers:
                    self._peers[peer_id] = _PeerDrift(last_round=round)
        return flagged

    def _update(self, peer_id: str, round: int, u: torch.Tensor) -> None:
        state = self._peers.get(peer_id)
        if (
            state is None
            or (state.far is not None and state.far.numel() != u.numel())
            or (state.near and state.near[0].numel() != u.numel())
        ):
            state = self._peers[peer_id] = _PeerDrift()
        d = self.decay
        if len(state.near) == self.gap_rounds:
            old = state.near.popleft()  # exactly gap_rounds back: joins the far sum, and samples c^2
            c = float(torch.dot(old, u))
            state.m2_sum, state.m2_n = state.m2_sum + c * c, state.m2_n + 1.0
            state.far = old.clone() if state.far is None else state.far + old
            state.w2 += 1.0
        if state.far is not None:  # the pairs (s, this round), s at least gap_rounds back
            state.a += float(torch.dot(state.far, u))
            state.p2 += state.w2
            state.far = state.far * d
        state.near.append(u)
        state.w2, state.a, state.p2 = state.w2 * d * d, state.a * d, state.p2 * d * d
        state.m2_sum, state.m2_n = state.m2_sum * d, state.m2_n * d
        state.rounds += 1
        state.last_round = round

    def _null_m2(self, seen: list[str], dim: int) -> float:
        """Lower median of the round's peers' own m2 (those with samples), at least 1 / dim."""
        own = sorted(m for m in (self._peers[p].m2() for p in seen) if m is not None)
        floor = 1.0 / max(dim, 1)
        return max(own[(len(own) - 1) // 2], floor) if own else floor

    def _evict(self) -> None:
        if len(self._peers) <= self.max_peers:
            return
        order = sorted(self._peers, key=lambda p: (self._peers[p].last_round, _desc(p)))
        for peer_id in order[: len(self._peers) - self.max_peers]:
            del self._peers[peer_id]


def _desc(peer_id: str) -> tuple[int, ...]:
    """Sort key putting higher peer ids first."""
    return tuple(-ord(c) for c in peer_id)
