"""Verified adoption: which of the pulled candidate states a peer adopts, judged on its held-out sample.

A peer about to adopt a state (join, re-sync, a split round's move, rejoining after isolation) has pulled and
validated its candidates (signatures, the announced hash, the round rules: swarmd.averaging.agreement) but adopted
none yet. The rules here, whatever number of signed records backs a candidate:
  - options(): the ways a sync can end, in preference order: a block candidate (or the block we hold) with an
    embedding candidate (or the embedding we hold): both parts first, so a block is judged with the byte table it
    would have after the sync and the other way round; the normal re-sync target of each part comes first;
  - choose(): every option is scored (swarmd.averaging.validation.HeldOutCheck.score: CE in nats) against `ours`,
    the score of what the peer holds. The first option in preference order whose CE is at most
    threshold = base + tolerance is adopted, where base is ours for a peer that holds a trained state, and the
    lowest CE of all options (ours included) for a joiner (fresh weights: the initial weights pass almost any
    state, so it takes the best it can pull, preferring the normal target when it is within the tolerance of the
    best). Where the peer is the side that trained apart (rejoining a majority, a rejoin rule's state, a split
    round's move) base is max(ours, agreed), agreed being the score of the last state it held with others: a
    peer that trained alone through a partition and got ahead on its own sample still rejoins, while a state
    worse than both is refused. A candidate in no option under its threshold is refused; its round counter is
    never taken;
  - Refusals: the refused (peer, weights hash) pairs, kept REFUSAL_TTL_S seconds: a hash refused from any peer is
    not pulled again meanwhile (the same bits score the same on the same sample), nor is a peer's state whose
    record announces the weights it was refused under; each pair is logged once.
Pure: no I/O; the scores come from the caller (agreement.Agreement pulls, scores in a worker thread, adopts).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from swarmd.protocol import PayloadKind

REFUSAL_TTL_S = 600.0  # a refused state is not pulled again for this long (the attacker may keep announcing it)
LOGGED_PAIRS = 4096  # refusals remembered for logging once each (oldest forgotten first)

Tensors = dict[str, torch.Tensor]


@dataclass(eq=False)
class Candidate:
    """A pulled, validated state of one part that is not adopted yet.

    :param kind: PayloadKind.BLOCK_STATE or EMBEDDING_STATE
    :param peer_id: who served it ("" for a reconciliation computed here)
    :param round: the round it carries (what the signed records or its own signed header announce)
    :param back: the round counter may move back to `round` (rejoining a majority, or a rejoin rule's state)
    :param round_limit: the round counter never moves past this (None: max_round_jump past ours when adopted)
    :param rejoined: the rejoin rule that chose it ("" for a re-sync target)
    :param announced: the weights the serving peer's record named ("" for none): remembered on a refusal
    :param also_served: (peer id, weights its record named) of the other peers that served the same weights (a
        rejoin's fresh quorum): remembered on a refusal too
    :param apart: we are the side that trained apart (a diverged majority to rejoin, a rejoin rule's state, a split
        round's move): judged against where we last agreed too (choose())
    """

    kind: PayloadKind
    peer_id: str
    weights: str
    round: int
    tensors: Tensors = field(repr=False)
    momentum: Tensors | None = field(default=None, repr=False)
    back: bool = False
    round_limit: int | None = None
    rejoined: str = ""
    announced: str = ""
    also_served: tuple[tuple[str, str], ...] = ()
    apart: bool = False

    @property
    def source(self) -> str:
        """Who it came from, for the logs."""
        return self.peer_id[-6:] if self.peer_id else "the reconciliation"


Option = tuple[Candidate | None, Candidate | None]  # (block, embedding); None: keep the one we hold


def options(blocks: Sequence[Candidate], embs: Sequence[Candidate]) -> list[Option]:
    """Every (block, embedding) way to end a sync but keeping both parts, in preference order: the candidates in
    their order (the normal target first), a candidate before keeping our own part."""
    return [(b, e) for b in (*blocks, None) for e in (*embs, None) if b is not None or e is not None]


@dataclass(frozen=True)
class Verdict:
    """What choose() decided: the option adopted (None: keep what we hold), and the figures behind it."""

    chosen: Option | None
    refused: list[tuple[Candidate, float, float]]  # (candidate, lowest CE of an option holding it, its threshold)
    ours: float  # CE of what we hold
    agreed: float | None  # CE of the state we last held with others (the base for candidates `apart`)


def choose(
    scored: Sequence[tuple[Option, float]], ours: float, tolerance: float, joining: bool, agreed: float | None = None
) -> Verdict:
    """The option to adopt among `scored` (in preference order, each with its CE), see the module doc.

    :param ours: the CE of what we hold (the initial weights for a joiner)
    :param joining: a joiner takes the best that passes (base = the lowest CE, ours included), others
        anything not worse than ours by more than `tolerance`
    :param agreed: the CE of the last state we held with other peers (None: unknown); an option holding a
        candidate that is `apart` (we are the side that trained apart) passes when it is not worse than
        max(ours, agreed) by more than `tolerance`: a peer that trained alone and got ahead still rejoins the
        majority, while a state worse than both what it holds and where it split is refused
    """
    finite = [s for _, s in scored if math.isfinite(s)]
    base = min([ours, *finite]) if joining else ours

    def threshold(opt: Option) -> float:
        b = max(base, agreed) if agreed is not None and any(c is not None and c.apart for c in opt) else base
        return b + tolerance if math.isfinite(b) else math.inf  # nothing we hold scores: any finite state passes

    passing = [(opt, s) for opt, s in scored if math.isfinite(s) and s <= threshold(opt)]
    chosen = passing[0][0] if passing else None
    best: dict[int, tuple[Candidate, float, float]] = {}
    for opt, s in scored:
        for c in opt:
            if c is not None and (id(c) not in best or s < best[id(c)][1]):
                best[id(c)] = (c, s, threshold(opt))
    passed = {id(c) for opt, _ in passing for c in opt if c is not None}
    refused = [entry for key, entry in best.items() if key not in passed]
    return Verdict(chosen, refused, ours, agreed)


class Refusals:
    """The refused states, each kept ttl_s seconds: by the weights served (from any peer) and by what the serving
    peer's record announced (a peer whose record names other weights than it serves); which were logged already."""

    def __init__(self, ttl_s: float = REFUSAL_TTL_S, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.clock = ttl_s, clock
        self._served: dict[tuple[str, str], float] = {}  # (peer id, weights served) -> when it is forgotten
        self._announced: dict[tuple[str, str], float] = {}  # (peer id, weights its record named) -> the same
        self._logged: dict[tuple[str, str], None] = {}  # insertion-ordered set of (peer id, weights served)

    def add(self, peer_id: str, weights: str, announced: str = "") -> bool:
        """Remember a refusal of `weights` served by `peer_id` (whose record named `announced`); True the first
        time this (peer, weights) pair is refused: log it then."""
        until = self.clock() + self.ttl_s
        self._served[(peer_id, weights)] = until
        if announced:
            self._announced[(peer_id, announced)] = until
        if (peer_id, weights) in self._logged:
            return False
        self._logged[(peer_id, weights)] = None
        while len(self._logged) > LOGGED_PAIRS:
            del self._logged[next(iter(self._logged))]
        return True

    def refused(self, weights: str, peer_id: str = "") -> bool:
        """Whether a state with these weights was refused from any peer within ttl_s seconds (the same bits score
        the same), or pulling what `peer_id`'s record announces as `weights` gave a refused state."""
        now = self.clock()
        for table in (self._served, self._announced):
            for key in [k for k, until in table.items() if until <= now]:
                del table[key]
        return any(w == weights for _, w in self._served) or (peer_id, weights) in self._announced
