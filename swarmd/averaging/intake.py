"""A delta's way in: judge one incoming delta of the open round, then stash it or reject it.

Owns the judgement of a delta whose signature the caller already verified (swarmd.membership.trust.verify_payload,
before anything beyond the header is looked at; swarmd.averaging.exchange calls it on both sides of an exchange):
  accept   the round must be open, the sender foreign and not judged yet for this round and kind (a peer gets one
           delta per round and kind judged), holding a signed record for our block and its round (or the one
           before: PeerContext.sender_problem), of our round, in our group (swarmd.averaging.groups) and computed
           from our base hash; then it is decoded (swarmd.averaging.delta.decode) within our shapes, its norm
           checked against the bound (PeerContext.check_norm), and stashed in the Round;
  reject   a delta that fails is counted (by reason) and logged, and its sender judged: the collection stops
           waiting for it, and the round loses only that peer's contribution;
  accept_row  a row's value in phase 2 of a two-phase round (swarmd.averaging.phase2; header phase PHASE_ROW):
           its sender must hold a signed record for our block, be a member of one of the part's rows of our
           round and announce our anchor hash, its weight (the row's merged count) within the row's size; then
           it is decoded, its norm checked against the payload bound, and kept as that row's value (the first
           accepted per row); one that fails is counted and logged (phase 2 asks the row's next member).
No I/O and no waiting here: plain checks over the Round and the PeerContext.
"""

from __future__ import annotations

import logging

from swarmd.averaging import phases
from swarmd.averaging.context import BLOCK, PeerContext
from swarmd.averaging.round import Round
from swarmd.errors import BaseMismatch, StaleRound, SwarmdError, ValidationError
from swarmd.metrics import reject_reason
from swarmd.protocol import PayloadKind
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)

PHASE_ROW = 2  # PayloadHeader.phase of a row's merged offsets (phase 2 of a two-phase round); 0: a delta


class Repeat(StaleRound):
    """A second delta of the same peer, kind and round (a peer that re-syncs and retries within our round)."""


def reject(p: PeerContext, rs: Round, h: pb.PayloadHeader, kind: PayloadKind, exc: SwarmdError) -> None:
    """Count and log a rejected delta; a judged sender is not waited for any longer."""
    rs.rejected += 1
    p.metrics.reject(reject_reason(exc))
    logger.warning("%s rejected a %s from %s: %s", p.tag, kind, (h.peer_id or "?")[-6:], exc)
    if h.peer_id in rs.senders[kind]:
        rs.judged(kind, h.peer_id)


def accept(p: PeerContext, rs: Round, enc: Encoded, kind: PayloadKind) -> str:
    """Judge a delta (its signature already verified by the caller) against round, sender, group, base, schema and
    norm bound, and stash it; returns the sender id.

    :raises Repeat: a second delta of the sender's for this round and kind (counted, not judged again)
    :raises SwarmdError: the delta was rejected (counted, logged, its sender judged)
    """
    h = enc.header
    try:
        if rs.closed:
            raise StaleRound(f"round {rs.round} is already closed")
        if h.peer_id == p.me.peer_id or not h.peer_id:
            raise ValidationError("delta without a (foreign) peer id")
        if h.peer_id in rs.senders[kind]:  # a peer gets one delta per round and kind judged (decoded) at most
            p.metrics.reject("stale_round")
            logger.debug("%s refused another %s of round %d from %s", p.tag, kind, rs.round, h.peer_id[-6:])
            raise Repeat(f"a {kind} of round {rs.round} from {h.peer_id[-6:]} was already judged")
        rs.senders[kind].add(h.peer_id)
        if problem := p.sender_problem(h, kind):
            raise ValidationError(problem)
        if h.round != rs.round:
            raise StaleRound(f"delta of round {h.round}, ours is {rs.round}")
        if (group := rs.members[kind]) is not None and h.peer_id not in group:
            raise ValidationError(f"{h.peer_id[-6:]} is not in our {kind} group of round {rs.round}")
        if h.base_hash != rs.hashes[kind]:
            rs.mismatched[kind][h.peer_id] = h.base_hash
            raise BaseMismatch(f"delta computed from base {h.base_hash}, ours is {rs.hashes[kind]}")
        tensors = p.decode(enc, kind, p.me.block_index if kind == BLOCK else -1)
        p.check_norm(tensors, kind)
    except Repeat:
        raise
    except SwarmdError as exc:
        reject(p, rs, h, kind, exc)
        raise
    # weight 0: nothing trained behind it (a claim that can only take its own sender out of the merge)
    rs.stash(kind, h.peer_id, tensors, idle=h.weight == 0)
    return h.peer_id


def accept_row(p: PeerContext, rs: Round, enc: Encoded, kind: PayloadKind) -> int:
    """Judge a row value of phase 2 (its signature already verified by the caller) and keep it as its row's value
    unless that row has one already; returns the row index.

    :raises SwarmdError: the value was rejected (counted, logged)
    """
    h, rows = enc.header, rs.rows.get(kind)
    try:
        if rows is None or h.phase != PHASE_ROW:
            raise ValidationError(f"no two-phase {kind} rows in round {rs.round}")
        if h.peer_id == p.me.peer_id or not h.peer_id:
            raise ValidationError("row value without a (foreign) peer id")
        if problem := p.sender_problem(h, kind):
            raise ValidationError(problem)
        if h.round != rs.round:
            raise StaleRound(f"row value of round {h.round}, ours is {rs.round}")
        try:
            row = phases.position(rows, h.peer_id)[0]
        except KeyError:
            raise ValidationError(f"{h.peer_id[-6:]} is in no {kind} row of round {rs.round}") from None
        if h.base_hash != rs.hashes[kind]:
            raise BaseMismatch(f"row value on anchor {h.base_hash}, ours is {rs.hashes[kind]}")
        if not 0 < h.weight <= len(rows[row]):  # a row merges at most its members' payloads
            raise ValidationError(f"row value of weight {h.weight} from a row of {len(rows[row])}")
        tensors = p.decode(enc, kind, p.me.block_index if kind == BLOCK else -1)
        p.check_norm(tensors, kind)
    except SwarmdError as exc:
        rs.rejected += 1
        p.metrics.reject(reject_reason(exc))
        logger.warning("%s rejected a %s row value from %s: %s", p.tag, kind, (h.peer_id or "?")[-6:], exc)
        raise
    rs.phase2.got[kind].setdefault(row, (float(h.weight), tensors))
    rs.phase2.arrived.set()
    return row
