"""Pure rules over signed PeerRecords: whose announced state a peer may adopt (the quorum rules).

quorum()            how many other peers must announce a state before anybody adopts it
agreeing()          the records whose (round, weights) a quorum announces: the only re-sync targets
round_backed()      whether a quorum of the whole swarm's records announces a round (a lone block record is not)
rank(), reference() the reference of a part: highest round, then the largest group, then server mode, peer id
diverged_majority() the majority a peer that trained apart (a partition) rejoins, even at a lower round
candidates()        the distinct states a joiner pulls to compare on its held-out sample, bounded
split_reference()   whom a peer moves to when last round's signed deltas showed a quorum on another base (or, the
                    records showing no quorum anywhere, the largest side of 2 or more)

The records given are the signed ones (swarmd.membership.trust.is_valid); nothing here checks signatures,
does I/O or imports torch. swarmd.averaging.agreement applies these rules to a peer's re-sync.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from swarmd.membership.records import PeerRecord

WeightsOf = Callable[[PeerRecord], str]  # the weights hash a record announces for a part (block or byte table)


def block_weights(record: PeerRecord) -> str:
    """The default part: the block weights its record announces."""
    return record.base_hash


def quorum(others: int) -> int:
    """How many other peers must announce the same (round, weights) before a peer adopts that state:
    a majority of the `others` signed records seen, and at least 2 once 2 or more others exist."""
    return 1 if others <= 1 else max(2, others // 2 + 1)


def agreeing(others: list[PeerRecord], key: WeightsOf = block_weights) -> list[PeerRecord]:
    """The records of `others` whose (round, weights) at least quorum(len(others)) distinct peers announce.

    A state only one record (or a minority) claims, e.g. a stranger's round 1,000,000, is never a
    re-sync target, whatever its round.
    """
    latest = {r.peer_id: r for r in others}
    counts = Counter((r.round, key(r)) for r in latest.values())
    need = quorum(len(latest))
    return [r for r in latest.values() if counts[(r.round, key(r))] >= need]


def diverged_majority(
    me: PeerRecord,
    others: list[PeerRecord],
    own_history: dict[int, str],
    key: WeightsOf = block_weights,
) -> PeerRecord | None:
    """A state more than half of `[me] + others` hold (at least 2 peers), that is not one we held at its round:
    the majority we split from, whose highest-ranked dialable peer we adopt even at a lower round.

    A peer that trained alone through a partition may be rounds ahead of the majority it rejoins;
    reference() (highest round first) would keep it on its own state forever. A majority whose
    (round, weights) we did hold at that round (own_history: round -> our base hash) is only behind
    us on our own trajectory (DHT records lag a round or two): None then.
    """
    latest = {r.peer_id: r for r in others if r.peer_id != me.peer_id}
    groups = Counter((r.round, key(r)) for r in latest.values())
    for (round, weights), n in groups.most_common():
        if n < 2 or 2 * n <= len(latest) + 1:
            return None
        if (round, weights) == (me.round, key(me)) or own_history.get(round) == weights:
            return None
        dialable = [r for r in latest.values() if (r.round, key(r)) == (round, weights) and r.address]
        return max(dialable, key=rank) if dialable else None
    return None


def candidates(
    me: PeerRecord,
    others: list[PeerRecord],
    key: WeightsOf = block_weights,
    limit: int = 3,
    can_pull: Callable[[PeerRecord], bool] = lambda r: bool(r.address),
    swarm: list[PeerRecord] | None = None,
) -> list[PeerRecord]:
    """One record per distinct (round, weights) of `others` a joiner may pull to compare (at most `limit`).

    A state counts when two or more distinct peers announce it, or when a quorum of the whole swarm's records
    (`swarm`, default `others`: round_backed()) announces its round; so one signed stranger alone at a round of
    its own is never a candidate, while the only peer of a block at the swarm's round is. Not ours; the
    most-announced states first (ties: the one holding the highest-ranked peer, as reference()), each represented
    by its highest-ranked record that can_pull() accepts (dialable, not banned, not refused). Which state wins is
    the held-out score's call (swarmd.averaging.adoption), not the count: the count only bounds what is pulled.
    """
    latest = {r.peer_id: r for r in others if r.peer_id != me.peer_id}
    groups: dict[tuple[int, str], list[PeerRecord]] = {}
    for r in latest.values():
        groups.setdefault((r.round, key(r)), []).append(r)
    everyone = others if swarm is None else swarm
    out: list[PeerRecord] = []
    for (round, weights), group in sorted(
        groups.items(), key=lambda kv: (len(kv[1]), max(rank(r) for r in kv[1])), reverse=True
    ):
        if len(out) >= limit:
            break
        pullable = [r for r in group if can_pull(r)]
        counts = len(group) >= 2 or round_backed(round, everyone)
        if counts and (round, weights) != (me.round, key(me)) and pullable:
            out.append(max(pullable, key=rank))
    return out


def round_backed(round: int, others: list[PeerRecord]) -> bool:
    """Whether a quorum of all the other signed records (every block) announces `round`.

    Every block advances one round per averaging round, so the swarm shares its round counter: a lone
    record of a block (the only other peer there, so agreeing() alone would let it through) whose round
    the rest of the swarm does not announce is not a re-sync target.
    """
    latest = {r.peer_id: r for r in others}
    return sum(r.round == round for r in latest.values()) >= quorum(len(latest))


def rank(record: PeerRecord) -> tuple:
    """Who is the reference when weights differ: highest round, then server mode, then peer id."""
    return (record.round, not record.client_mode, record.peer_id)


def reference(me: PeerRecord, others: list[PeerRecord], key: WeightsOf = block_weights) -> PeerRecord:
    """The peer whose state everyone in `[me] + others` converges to (me if I am in its group).

    Among the records at the highest round, the weights (key: block or embedding hash) held by
    the most peers win (ties: the group holding the highest-ranked peer); the reference is that
    group's highest-ranked peer that can be dialled. A lone diverged peer (a restarted one that
    merged alone) thus adopts the majority's state instead of imposing its own.
    """
    pool = [me, *[o for o in others if o.peer_id != me.peer_id]]
    top = max(r.round for r in pool)
    groups: dict[str, list[PeerRecord]] = {}
    for r in pool:
        if r.round == top:
            groups.setdefault(key(r), []).append(r)
    for group in sorted(groups.values(), key=lambda g: (len(g), max(rank(r) for r in g)), reverse=True):
        if any(r.peer_id == me.peer_id for r in group):
            return me
        dialable = [r for r in group if r.address]
        if dialable:
            return max(dialable, key=rank)
    return me


def split_reference(
    me: PeerRecord, pool: list[PeerRecord], same: set[str], other: dict[str, str], fragmented: bool = False
) -> PeerRecord | None:
    """Whom to adopt after last round's exchanges showed peers on another base (None: stay).

    `same`: the peer ids whose signed deltas of last round were on our base; `other`: peer id -> the other base its
    signed delta was on. The signers of one base are a side, ours counting us. We move to the largest other side when
    it is larger than ours, or as large and holding the higher-ranked peer (server mode, then peer id: every signer
    was at that round, so both sides of a tie order the same way and exactly one of them moves). The side moved to
    must hold a quorum of the peers seen in `pool` (one stray signer, or strays on several bases, never move anybody),
    or, `fragmented` (the pool's records show no (round, weights) a quorum announces: the part is in pieces, say
    2 + 2 + 1 + 1 + 1 of eight byte tables after faults), at least 2 signers: every piece then moves to the same
    largest, highest-ranked one and the part is whole again a round later, where a quorum rule alone would leave the
    pieces merging apart for good. A majority the records show is never moved by 2 signers.
    """
    records = {r.peer_id: r for r in pool}
    need = quorum(len(records))
    if fragmented:
        need = min(2, need)
    records[me.peer_id] = me
    sides: dict[str, set[str]] = {}
    for peer_id, base in other.items():
        if peer_id not in same:
            sides.setdefault(base, set()).add(peer_id)

    def order(ids: set[str]) -> tuple:
        ranked = [(not records[i].client_mode, i) for i in ids if i in records]
        return (len(ids), max(ranked, default=(False, "")))

    if not sides:
        return None
    theirs = max(sides.values(), key=order)
    if len(theirs) < need or order(theirs) <= order(same | {me.peer_id}):
        return None
    dialable = [records[i] for i in theirs if i in records and records[i].address]
    return max(dialable, key=rank) if dialable else None
