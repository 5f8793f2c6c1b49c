"""Rejoining when the signed DHT records show no quorum anywhere (a healed partition rejoins within a minute).

agreement.sync's record rules (agreeing, diverged_majority) need several records announcing one (round, weights).
After a partition heals the records of a block's replicas often sit at different rounds (records lag a merge
or two, and the peer cut off trained alone for many rounds), so no (round, weights) reaches a quorum and the
cut-off peer trains apart for good: every delta it sends is another round's or another base's, and rejected.

The rule owned here, for a peer that is *isolated* (it has accepted no delta of a kind from any of the peers
whose signed records it holds for ISOLATED_ROUNDS rounds in a row; a peer that merges with others is never
moved by it):
  1. pull a fresh signed state from up to MAX_PULLS of those peers (sorted peer-id order, concurrently); each
     must be signed by the peer asked and hash to the weights its own signed header names;
  2. fresh majority (fresh_majority): a (round, weights) that quorum(pool) of the peers announce in their
     fresh signed states (quorum.quorum of the records: one peer, or a minority of liars, never reaches it)
     and that outnumbers ours (a tie: the group with the higher-ranked peer) is adopted, the round counter
     going back to it if we ran ahead, and forward at most max_round_jump;
  3. no quorum even there (every replica on its own weights, e.g. a three-way split): deterministic
     reconciliation. The peer holds still (no training, so what it serves stays put) and pulls again every
     HOLD_S seconds, up to HOLD_TRIES times; once two pulls in a row saw the same members at the same
     (round, weights) (or a member already holding the reconciliation of that set), it adopts
     reconcile(set): the robust merge (swarmd.averaging.robust: norm clip + coordinate-wise trimmed mean) of
     the member states, own included, in sorted peer-id order, at the lower median of their rounds. Every
     isolated member that saw the same set computes the same bits, so they exchange again from one base; a
     liar among >= 3 members is one row of a trimmed mean and cannot pick the round. A set that never
     settles (a member keeps training) only costs liveness: the peer trains on and tries again.
Pure rules here (fresh_majority, reconcile, stable); agreement.Agreement pulls and adopts. No grpc or hivemind.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from swarmd.averaging.robust import robust_merge
from swarmd.averaging.state import weights_hash

ISOLATED_ROUNDS = 2  # rounds in a row without an accepted delta of a kind before the fresh states are asked
MAX_PULLS = 8  # fresh states pulled per attempt (memory: MAX_PULLS x one block or the byte table)
HOLD_S = 2.0  # seconds between two pulls of a reconciliation
HOLD_TRIES = 8  # pulls per reconciliation attempt before training on (HOLD_TRIES x HOLD_S without training)


@dataclass(frozen=True)
class Held:
    """One peer's fresh signed state: what it holds now (weights hash) at which round."""

    peer_id: str
    round: int
    weights: str
    client_mode: bool = False

    @property
    def key(self) -> tuple[int, str]:
        return (self.round, self.weights)

    @property
    def rank(self) -> tuple:  # quorum.rank's order: highest round, then server mode, then peer id
        return (self.round, not self.client_mode, self.peer_id)


def fresh_majority(me: Held, fresh: list[Held], need: int) -> Held | None:
    """The peer whose state to adopt among the fresh signed states (None: stay, or no quorum anywhere).

    :param me: our own state now
    :param fresh: the other peers' fresh signed states (one per peer)
    :param need: how many of them must hold one (round, weights): quorum.quorum of the other peers whose signed
        records we hold for this kind (counted on the records, so peers that do not answer never lower it)
    """
    latest = {h.peer_id: h for h in fresh if h.peer_id != me.peer_id}
    groups = Counter(h.key for h in latest.values())
    ours = groups.get(me.key, 0) + 1
    best: Held | None = None
    for key, n in groups.items():
        if key == me.key or n < need:
            continue
        top = max((h for h in latest.values() if h.key == key), key=lambda h: h.rank)
        beats_ours = n > ours or (n == ours and top.rank > me.rank)
        if beats_ours and (best is None or (n, top.rank) > (groups[best.key], best.rank)):
            best = top
    return best


def reconcile(
    states: dict[str, dict[str, torch.Tensor]], rounds: dict[str, int], trim_fraction: float = 0.1
) -> tuple[dict[str, torch.Tensor], int, str]:
    """The reconciliation of a set of member states: (merged tensors, round, weights hash).

    The robust merge of the states in sorted peer-id order (a clip at 2x the lower median norm, then a
    coordinate-wise trimmed mean with at least one row trimmed per side from 3 members on) at the lower
    median of the members' rounds; a pure function of the set, so every member that saw it agrees bit for bit.
    """
    if len(states) < 3 or set(states) != set(rounds):
        raise ValueError("reconcile needs the states and rounds of 3 or more members")
    trim = max(trim_fraction, 1.0 / len(states))  # at least one per side: a single liar is always trimmed
    merged = robust_merge({p: {k: v.float() for k, v in s.items()} for p, s in states.items()}, 2.0, trim, -1.0, 0.0)[0]
    ordered = sorted(rounds.values())
    return merged, ordered[(len(ordered) - 1) // 2], weights_hash(merged)


def stable(prev: dict[str, tuple[int, str]], now: dict[str, tuple[int, str]], settled: tuple[int, str]) -> bool:
    """Whether a set of members held still between two pulls: the same members, each at the same (round, weights)
    as before or already at `settled` (the reconciliation of `prev`: a member that adopted it first)."""
    return set(prev) == set(now) and all(now[p] in (prev[p], settled) for p in prev)
