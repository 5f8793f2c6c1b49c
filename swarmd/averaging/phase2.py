"""Phase 2 of a two-phase round (GossipConfig.group_layout "two-phase", swarmd.averaging.phases) in the daemon.

Owns what a peer does between its phase-1 merge (its row's merge, swarmd.averaging.merge.merge_parts) and the
landing (swarmd.averaging.merge.apply_merged):
  - plan: each part that averages in groups this round keeps its rows, phases.rows(pool + me, round, k, salt), in
    the Round (the groups of phase 1 are those rows: swarmd.averaging.groups.assign);
  - publish: a peer encodes its row's merged offsets without error feedback (deterministic: every member of a row
    that merged the same payloads sends the same bytes), at the anchored payloads' int8 step, stamped with the
    anchor hash, weight = the row's merged count, header phase PHASE_ROW, signed; its own row's value is that
    relay decoded, so its bits are what the readers of the row decode;
  - exchange: over ExchangeDeltas, a peer asks the source of every other row (phases.sources, then the row's next
    members, phases.fallbacks, when one fails) with its own row value as the request; the callee (answer) judges
    that value too (swarmd.averaging.intake.accept_row) and answers with its row value once its own phase-1 merge
    is done (it waits, bounded; a callee not yet at the round answers Busy and is dialled again). Phase 2 has its
    own deadline, as long as the round's phase 1 and after it (a source's phase 1 may wait for a missing member to
    its deadline); it ends early once every row is present;
  - combine: the count-weighted mean (phases.combine) over the rows present, in row order, own row included, each
    row's value clipped to 2x the lower median of the rows' norms (phases.combine_clipped: one bad row is
    bounded; honest rows are not touched, so their bits stay the same for every peer);
  - landing: a peer that holds every row (phases.complete), each merged from all its members' payloads (its
    weight is the row's size: every member of such a row merged the same payloads, so every source sends the same
    bits), lands its combined value as a one-group round does: base = anchor + combined exactly, the new anchor
    (bit-identical replicas); a peer that missed a row, or got a row that merged fewer than its members, lands
    the mean of the rows it got and keeps its anchor (the existing rules handle anchored members, and the re-sync
    rule a replica that landed apart).
A callee keeps the previous round's row values to answer late readers while it trains the next round.
"""

from __future__ import annotations

import asyncio
import logging
import time

import torch

from swarmd.averaging import phases
from swarmd.averaging.context import BLOCK, EMB, PeerContext, payload_kind
from swarmd.averaging.delta import encode
from swarmd.averaging.groups import offset_int8_levels
from swarmd.averaging.intake import PHASE_ROW, accept_row
from swarmd.averaging.round import Round
from swarmd.errors import Busy, NotReady, StaleRound, SwarmdError, ValidationError
from swarmd.membership.trust import sign_payload, verify_payload
from swarmd.metrics import reject_reason
from swarmd.protocol import PayloadKind
from swarmd.transport.framing import Encoded

logger = logging.getLogger(__name__)

Tensors = dict[str, torch.Tensor]
REDIAL_PAUSE_S = 0.2  # a source not yet at our round (or still merging phase 1) is dialled again after this


def plan(p: PeerContext, rs: Round, kind: PayloadKind, pool: list[str], salt: str) -> None:
    """Keep the part's rows in the Round when it averages in groups under the two-phase layout."""
    if p.cfg.group_layout != "two-phase" or rs.members[kind] is None:
        rs.rows[kind] = None
        return
    k = p.cfg.table_group_size if kind == EMB else p.cfg.group_size
    rs.rows[kind] = phases.rows({*pool, p.me.peer_id}, rs.round, k, salt)


def active(rs: Round) -> bool:
    """Whether the round has a phase 2 (some part averages in two-phase rows)."""
    return any(rows is not None for rows in rs.rows.values())


def _relay(p: PeerContext, rs: Round, kind: PayloadKind, value: Tensors, count: int) -> tuple[Encoded, Tensors]:
    """Own row value as sent (signed) and as every reader decodes it. Blocking."""
    enc = encode(
        value,
        p.cfg.codec,
        int8_rms_levels=offset_int8_levels(p.anchors[kind]),
        base_hash=rs.hashes[kind],
        weight=float(count),
        **p.hdr(kind, rs.round),
    )
    enc.header.phase = PHASE_ROW
    sign_payload(enc, p.identity)
    return enc, p.decode(enc, kind, p.me.block_index if kind == BLOCK else -1)


async def publish(p: PeerContext, rs: Round, parts: dict[str, Tensors | None], counts: dict[str, int]) -> None:
    """Encode own row values after the phase-1 merge (parts: kind -> merged offsets, counts: payloads merged) and
    let waiting callers have them; a part without a value sends none (its readers ask the row's next member)."""
    try:
        for kind, rows in rs.rows.items():
            value = parts.get(kind)
            if rows is None or value is None or counts.get(kind, 0) <= 0:
                continue
            enc, decoded = await asyncio.to_thread(_relay, p, rs, PayloadKind(kind), value, counts[kind])
            rs.phase2.outgoing[kind] = enc
            rs.phase2.got[kind][phases.position(rows, p.me.peer_id)[0]] = (float(counts[kind]), decoded)
    finally:
        rs.phase2.ready.set()


async def answer(p: PeerContext, rounds: list[Round | None], incoming: Encoded) -> Encoded:
    """Callee side of a phase-2 ExchangeDeltas: judge the caller's row value, answer with ours (rounds: the open
    round and the one before, whose values late readers still ask for)."""
    h = incoming.header
    kind = payload_kind(h.kind)
    try:
        verify_payload(incoming)  # signed by the peer it names, before anything else is looked at
        if kind not in (BLOCK, EMB) or h.phase != PHASE_ROW:
            raise ValidationError(f"cannot exchange a phase-{h.phase} {kind or h.kind!r} payload")
        rs = next((r for r in rounds if r is not None and r.round == h.round), None)
        if rs is None:
            newest = max((r.round for r in rounds if r is not None), default=-1)
            if h.round > newest:  # we are behind: the caller dials again
                raise Busy(f"row value of round {h.round}: our round is {newest}")
            raise StaleRound(f"row value of round {h.round} is too old")
        if rs.rows.get(kind) is None:
            raise ValidationError(f"no two-phase {kind} rows in round {rs.round}")
        try:  # still merging phase 1: wait (bounded; the caller's call has its own deadline)
            await asyncio.wait_for(rs.phase2.ready.wait(), p.cfg.deadline_max_s)
        except TimeoutError:
            raise NotReady(f"row value of round {rs.round} not ready in time") from None
        if kind not in rs.phase2.outgoing:
            raise StaleRound(f"no {kind} row value in round {rs.round}")  # not Busy: the caller asks the next member
    except SwarmdError as exc:
        p.metrics.reject(reject_reason(exc))
        logger.info("%s refused a %s row exchange from %s: %s", p.tag, kind, (h.peer_id or "?")[-6:], exc)
        raise
    await p.refresh_known(h, kind)
    try:
        accept_row(p, rs, incoming, kind)
    except SwarmdError:
        pass  # counted; still answer
    reply = rs.phase2.outgoing[kind]
    p.metrics.add_sent(reply.wire_bytes, reply.raw_bytes)
    return reply


async def _ask(p: PeerContext, rs: Round, kind: PayloadKind, source: str, deadline: float) -> bool:
    """Ask `source` for its row value until the deadline (a Busy source is dialled again); whether one came."""
    rec = p.known.get(source)
    if rec is None or rec.client_mode or not rec.address:
        return False  # nobody dials a client-mode peer
    while True:
        try:
            reply = await p.transport.exchange(
                rec.address, rs.phase2.outgoing[kind], max(0.1, deadline - time.monotonic())
            )
            break
        except SwarmdError as exc:
            if exc.status != Busy.status or deadline - time.monotonic() < 2 * REDIAL_PAUSE_S:
                logger.info("%s row value of %s from %s failed: %s", p.tag, kind, source[-6:], exc)
                return False
            await asyncio.sleep(REDIAL_PAUSE_S)
    try:
        if reply.header.peer_id != source:
            raise ValidationError(f"reply signed by {reply.header.peer_id[-6:]}, dialled {source[-6:]}")
        verify_payload(reply)
        accept_row(p, rs, reply, kind)
    except SwarmdError as exc:
        logger.info("%s row value of %s from %s refused: %s", p.tag, kind, source[-6:], exc)
        return False
    return True


async def _fetch(p: PeerContext, rs: Round, kind: PayloadKind, row: int, order: list[str], deadline: float) -> None:
    """Get row `row`'s value: its members in `order` (phases.fallbacks), each until it answers or fails."""
    try:
        for source in order:
            if row in rs.phase2.got[kind] or time.monotonic() >= deadline:
                return
            await _ask(p, rs, kind, source, deadline)
    finally:
        rs.phase2.arrived.set()


def _complete(rs: Round) -> bool:
    return all(rows is None or phases.complete(rows, set(rs.phase2.got[k])) for k, rows in rs.rows.items())


async def collect(p: PeerContext, rs: Round, deadline: float) -> None:
    """Fetch every other row's value of every two-phase part we have a value of, until all came or the deadline."""
    tasks = [
        asyncio.create_task(_fetch(p, rs, PayloadKind(kind), row, order, deadline))
        for kind, rows in rs.rows.items()
        if rows is not None and kind in rs.phase2.outgoing
        for row, order in phases.fallbacks(rows, p.me.peer_id).items()
    ]
    try:
        while not _complete(rs) and not all(t.done() for t in tasks):
            rs.phase2.arrived.clear()
            if _complete(rs) or all(t.done() for t in tasks):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(rs.phase2.arrived.wait(), remaining)
            except TimeoutError:
                break
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def exact(rows: list[list[str]], got: dict[int, tuple[float, Tensors]]) -> bool:
    """Whether the combined value is the one every replica lands (the part re-anchors): every row present
    (phases.complete) and each merged every member's payload (its count is the row's size). A row that merged
    fewer may hold another value at each member (one missed a payload its row-mate merged), and its readers,
    who ask different members, another combined value each: such a round keeps the anchor."""
    return phases.complete(rows, set(got)) and all(got[r][0] >= len(rows[r]) for r in got)


async def run(
    p: PeerContext,
    rs: Round,
    parts: dict[str, Tensors | None],
    counts: dict[str, int],
    deadline: float,
    deadline_s: float,
) -> tuple[dict[str, Tensors | None], dict[str, set[str] | None]]:
    """Phase 2 after the phase-1 merge: (kind -> the value to land, kind -> the members apply_merged is told: None
    where the value is exact(), so the part lands it exactly and re-anchors). A round without a
    two-phase part returns parts and rs.members as they are.

    :param deadline: phase 1's (time.monotonic()); :param deadline_s: its length. Phase 2 ends deadline_s after
        phase 1's deadline: a source whose phase 1 waited for a missing member to its deadline still answers
    """
    await publish(p, rs, parts, counts)
    if not active(rs):
        return parts, rs.members
    await collect(p, rs, max(deadline, time.monotonic()) + deadline_s)
    out, members = dict(parts), dict(rs.members)
    for kind, rows in rs.rows.items():
        got = rs.phase2.got[kind]
        if rows is None or not got:
            continue
        out[kind] = await asyncio.to_thread(phases.combine_clipped, [got[r] for r in sorted(got)])
        if exact(rows, got):
            members[kind] = None
        else:
            logger.warning(
                "%s round %d: %s rows %d/%d in phase 2: the anchor stays", p.tag, rs.round, kind, len(got), len(rows)
            )
    return out, members
