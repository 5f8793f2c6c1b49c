"""The round protocol: swap compressed deltas with the peers found, judge what arrives in time, merge.

Owns one peer's rounds (litepaper §2.3-2.4, ../shared/docs/gossip.md):
  - a round r starts from a base every same-block replica shares (identified by a weights hash);
    after H local steps a peer encodes its block delta and embedding delta with ErrorFeedback (publish);
  - nothing non-finite is sent: an own delta that is not finite (local training diverged) is
    replaced by a zero delta and the live weights go back to the base;
  - exchanges are bidirectional (PeerClient.exchange): for each pair of peers exactly one dials
    the other (dials(): the lower peer id dials, client-mode peers always dial), the callee stashes the
    caller's delta and answers with its own delta of the same round (handle_exchange);
  - block deltas go to same-block peers, embedding deltas to peers of every block;
  - a delta's way is one pass down: its signature is verified here (swarmd.membership.trust.verify_payload,
    before anything beyond the header is looked at), then swarmd.averaging.intake judges it: its sender must
    hold a signed record for our block and its round (or the one before), its round, group and base hash
    must be ours, then it is decoded (swarmd.averaging.delta.decode) and its norm checked against the bound
    (PeerContext.check_norm), and stashed; a delta that fails is rejected (counted, logged) and costs the
    round only that peer's contribution; a peer gets one delta per round and kind judged;
  - the collection ends when every expected peer answered, or at the deadline of swarmd.averaging.deadline;
  - group averaging (cfg.group_size = k, swarmd.averaging.groups): a part with more than k peers averages in
    the round's group of at most k (plan_groups: every peer computes it from the signed records and the round),
    as offsets from the part's anchor (the last state all replicas shared), whose hash payloads and
    records announce; with at most k peers the round is the all-to-all one, bit for bit;
  - the two-phase layout (GossipConfig.group_layout "two-phase"): the groups are the rows of
    swarmd.averaging.phases (plan_groups keeps them in the Round), and after the merge phase 2
    (swarmd.averaging.phase2) swaps each row's merged offsets with the other rows over the same ExchangeDeltas
    (payload header phase 2; handle_exchange hands those to phase2.answer) and lands their count-weighted mean,
    re-anchoring when every row came, each merged from all its members;
  - overlap (cfg.overlap): publish() also keeps the exact own deltas, training goes on while the round
    is collected;
  - the merge, its loss check and its landing are swarmd.averaging.merge's; must_pass (identities on probation or
    beyond their range's cap) and leave_out (drift suspects) come from the peer's Standing
    (swarmd.averaging.standing), which every merge's outcome updates (empty: every accepted delta counts,
    unchecked unless the merged candidate fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable

import torch

from swarmd.averaging import phase2
from swarmd.averaging.context import BLOCK, EMB, PeerContext, payload_kind
from swarmd.averaging.deadline import DeadlinePolicy
from swarmd.averaging.groups import offset_int8_levels, with_offset
from swarmd.averaging.groups import round_members as group_members
from swarmd.averaging.intake import accept, reject
from swarmd.averaging.merge import apply_merged, finite, merge_parts
from swarmd.averaging.round import MergeReport, Round
from swarmd.averaging.state import relative_distance
from swarmd.errors import (
    BaseMismatch,
    Busy,
    NotReady,
    PeerUnavailable,
    StaleRound,
    SwarmdError,
    ValidationError,
    WrongBlock,
)
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import sign_payload, verify_payload
from swarmd.metrics import failure_reason, reject_reason
from swarmd.protocol import PayloadKind
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)

AHEAD_ROUNDS = 1  # a delta (or record) at most this many rounds ahead of ours is of a peer at our round, or about to be
REDIAL_PAUSE_S = 0.5  # a callee still training (Busy: its own delta not ready in time) is dialled again after this


def out_of_reach(me: PeerRecord, round: int, records: list[PeerRecord]) -> bool:
    """Whether a round of ours at `round` would exchange with nobody it should: our block's other peers (with none,
    every other peer of our swarm and config) all announce rounds more than AHEAD_ROUNDS past it, so average() waits
    for none of them (a restart, a paused peer, a joiner whose first re-sync could not adopt yet). Such a round
    merges alone and leaves us on weights nobody holds, a split of our own until a re-sync."""
    others = [
        r for r in records if r.peer_id != me.peer_id and r.swarm_id == me.swarm_id and r.config_hash == me.config_hash
    ]
    mates = [r for r in others if r.block_index == me.block_index] or others
    return bool(mates) and all(r.round > round + AHEAD_ROUNDS for r in mates)


def dials(me: PeerRecord, other: PeerRecord) -> bool:
    """Whether `me` opens the exchange with `other`: exactly one side of each pair dials."""
    if other.client_mode or not other.address:
        return False  # nobody can dial a client-mode peer; it dials us
    if me.client_mode:
        return True
    return me.peer_id < other.peer_id


def plan_groups(p: PeerContext, rs: Round, records: list[PeerRecord]) -> None:
    """This round's group of each part (swarmd.averaging.groups) from the signed records; an anchor is taken when a
    part first averages in groups (the base every replica shares then)."""
    ours = [r for r in records if r.config_hash == p.me.config_hash and r.swarm_id == p.me.swarm_id]
    for kind in (BLOCK, EMB):
        pool = [r.peer_id for r in ours if kind == EMB or r.block_index == p.me.block_index]
        salt = f"{p.me.swarm_id}/{'block' + str(p.me.block_index) if kind == BLOCK else 'table'}"
        rs.members[kind] = group_members(p.me.peer_id, pool, rs.round, p.cfg, salt, table=kind == EMB)
        phase2.plan(p, rs, kind, pool, salt)  # the two-phase layout's rows (phase 1's groups are those rows)
        anchor = p.anchors[kind]
        if rs.members[kind] is not None and not anchor.active:
            anchor.set(*p.base(kind), p.state.round)


async def premerge_distance(p: PeerContext, rs: Round) -> float:
    """The largest relative distance between our live block and an accepted replica's, before the merge."""
    if p.cfg.overlap:  # training went on since the snapshot: compare the weights we sent
        live_block = {n: p.state.base_block[n] + d for n, d in rs.exact[BLOCK].items()}
    else:
        live_block, _ = await asyncio.to_thread(p.state.current)
    ref_block, _ = p.anchors[BLOCK].reference(p.state.base_block, "")
    return max(
        (relative_distance(live_block, {n: ref_block[n] + d[n] for n in d}) for d in rs.inbox[BLOCK].values()),
        default=0.0,
    )


class Exchange:
    """One peer's averaging rounds: open, publish, answer and dial exchanges, collect, merge (see the module doc).

    :param peer: the context the state agreement (swarmd.averaging.agreement) holds too
    """

    def __init__(self, peer: PeerContext):
        self.peer = peer
        self.deadline = DeadlinePolicy(peer.cfg)
        self.current: Round | None = None
        self.previous: Round | None = None  # its phase-2 row values still answer late readers (swarmd.averaging.phase2)
        self._opened = asyncio.Condition()
        # a round this peer did not train (a pipelined block before or after its turn): its deltas carry weight 0,
        # so the receivers (and its own merge) count only the peers that trained; and they are ready at once, so the
        # policy's deadline would close the round before the training peers arrive: it waits up to idle_deadline_s
        # instead (the collection still ends as soon as every expected peer answered)
        self.idle = False

    async def open_round(self) -> None:
        """Start accepting deltas for the round we are about to train (call after sync)."""
        p = self.peer
        async with self._opened:
            self.previous = self.current
            self.current = Round(p.state.round, {BLOCK: p.anchor_hash(BLOCK), EMB: p.anchor_hash(EMB)})
            self._opened.notify_all()

    async def publish(self) -> None:
        """Encode this round's deltas (error feedback) and let waiting callers have them."""
        p, rs = self.peer, self.current
        if rs is None:
            raise RuntimeError("publish() needs an open round (call open_round first)")
        block_delta, emb_delta = await asyncio.to_thread(p.state.deltas)
        if not (finite(block_delta) and finite(emb_delta)):  # never send (or merge) non-finite values
            logger.error(
                "%s round %d: local training produced non-finite weights; sending a zero delta and "
                "going back to the base",
                p.tag,
                rs.round,
            )
            await asyncio.to_thread(p.state.rollback)
            block_delta = {k: torch.zeros_like(v) for k, v in block_delta.items()}
            emb_delta = {k: torch.zeros_like(v) for k, v in emb_delta.items()}
            for ef in p.ef.values():
                ef.reset()
        rs.exact = {BLOCK: block_delta, EMB: emb_delta}  # what a late merge subtracts again (swarmd.averaging.delayed)
        weight = 0.0 if self.idle else float(p.cfg.steps_per_round)
        for kind, delta in ((BLOCK, block_delta), (EMB, emb_delta)):
            if not self.idle:  # a local outer optimizer (group averaging) steps on the own delta: what is sent
                delta = await asyncio.to_thread(p.state.local_outer_step, "block" if kind.is_block else "emb", delta)
            # group averaging: base - anchor + delta
            delta = with_offset(delta, p.anchors[kind].offset(p.base(kind)[0]))
            enc, decoded = await asyncio.to_thread(
                p.ef[kind].compress,
                delta,
                p.cfg.codec,
                int8_rms_levels=offset_int8_levels(p.anchors[kind]),
                base_hash=rs.hashes[kind],
                weight=weight,
                **p.hdr(kind, rs.round),
            )
            rs.outgoing[kind], rs.own[kind] = sign_payload(enc, p.identity), decoded
        rs.ready_at = time.monotonic()
        rs.ready.set()

    # -- a delta's way in (judged by swarmd.averaging.intake) ----------------------------------------
    async def _round_for(self, h: pb.PayloadHeader, kind: PayloadKind) -> Round:
        """The open round a caller's delta of round h.round is for, waiting (bounded) for it to open."""
        async with self._opened:
            try:  # the caller may be a little ahead: wait (bounded) for our round to open
                await asyncio.wait_for(
                    self._opened.wait_for(lambda: self.current is not None and self.current.round >= h.round),
                    self.peer.cfg.deadline_max_s,
                )
            except TimeoutError:
                raise StaleRound(f"round {h.round} is ahead of ours ({self.peer.state.round})") from None
        rs = self.current
        if rs is None:  # the wait above ends only once a round is open
            raise RuntimeError("no open round")
        if rs.round != h.round or rs.closed:
            if h.round < rs.round and not rs.closed:
                # a signed delta of a past round: its sender is behind (or replays an old payload) and sends
                # nothing for this round before it catches up; judged for this round, as a stale reply to our
                # own dial is, so the round does not wait for it up to the deadline (a delta of this round
                # that still comes before the round closes is merged all the same)
                rs.judged(kind, h.peer_id)
            raise StaleRound(f"delta of round {h.round}, ours is {rs.round}{' (closed)' if rs.closed else ''}")
        return rs

    async def handle_exchange(self, incoming: Encoded) -> Encoded:
        """Callee side of ExchangeDeltas: validate and stash the caller's delta, answer with ours."""
        p, h = self.peer, incoming.header
        p.metrics.add_received(incoming.wire_bytes, incoming.raw_bytes)
        if h.phase:  # a row value of a two-phase round
            return await phase2.answer(p, [self.current, self.previous], incoming)
        kind = payload_kind(h.kind)
        try:
            verify_payload(incoming)  # signed by the peer it names, before we wait for or look at anything else
            p.bans.succeed(h.peer_id)  # it is alive
            if kind not in (BLOCK, EMB):
                raise ValidationError(f"cannot exchange a {kind or h.kind!r} payload")
            if kind == BLOCK and h.block_index != p.me.block_index:
                raise WrongBlock(f"this peer trains block {p.me.block_index}, not {h.block_index}")
            if self.current is not None and h.round > self.current.round:
                # a caller on a later round closed ours and sends nothing more of it: our round stops waiting for
                # it (a caller that dials us one round ahead would otherwise hold our round to its deadline, then
                # its own next round for our late delta: block-mates kept each other's rounds at the deadline for
                # minutes after a paused peer came back)
                if not self.current.closed:
                    self.current.judged(kind, h.peer_id)
                if h.round > self.current.round + AHEAD_ROUNDS:
                    raise StaleRound(f"delta of round {h.round} is ahead of ours ({self.current.round})")
            rs = await self._round_for(h, kind)
        except SwarmdError as exc:
            p.metrics.reject(reject_reason(exc))
            logger.info("%s refused a %s exchange from %s: %s", p.tag, kind, (h.peer_id or "?")[-6:], exc)
            raise
        # still training: wait for our delta as the policy bounds a round this long, and no longer than an answer can
        # still reach the caller in time; a later block's round outlasts an earlier one's (swarmd.averaging.deadline)
        answer_by = math.inf if incoming.answer_by is None else incoming.answer_by
        wait_s = min(self.deadline.cap_s(time.monotonic() - rs.opened_at), answer_by - time.monotonic())
        try:
            if not rs.ready.is_set():
                await asyncio.wait_for(rs.ready.wait(), max(0.0, wait_s))
        except TimeoutError:
            raise NotReady(f"own delta of round {rs.round} not ready in time") from None
        await p.refresh_known(h, kind)
        if time.monotonic() > answer_by:  # the caller's round closes before our answer reaches it: its delta merged
            # here and ours not there would leave two states (a split that takes rounds to heal); neither merges either
            raise NotReady(f"our answer of round {rs.round} would reach the caller after its deadline")
        with contextlib.suppress(BaseMismatch):  # still answer: the caller sees the mismatch too; both re-sync
            accept(p, rs, incoming, kind)
        reply = rs.outgoing[kind]
        p.metrics.add_sent(reply.wire_bytes, reply.raw_bytes)
        return reply

    async def _call(self, rs: Round, peer: PeerRecord, kind: PayloadKind, deadline: float) -> Encoded:
        """ExchangeDeltas with `peer` until the deadline: a callee still training (Busy: its own delta was not ready
        within its wait; a later block's round is longer, or we trained nothing) is dialled again while our round
        is open, rather than the round closing without its delta. Raises the last SwarmdError."""
        while True:
            try:
                return await self.peer.transport.exchange(
                    peer.address, rs.outgoing[kind], max(0.1, deadline - time.monotonic())
                )
            except SwarmdError as exc:
                if exc.status != Busy.status or rs.closed or deadline - time.monotonic() < 2 * REDIAL_PAUSE_S:
                    raise
                logger.info(
                    "%s %s is still training: dialling again for its %s", self.peer.tag, peer.peer_id[-6:], kind
                )
                await asyncio.sleep(REDIAL_PAUSE_S)

    async def _dial(self, rs: Round, peer: PeerRecord, kind: PayloadKind, deadline: float) -> None:
        """Caller side: send our delta of `kind` to `peer`, judge and stash its signed reply."""
        p, started = self.peer, time.monotonic()
        try:
            reply = await self._call(rs, peer, kind, deadline)
        except SwarmdError as exc:
            rs.judged(kind, peer.peer_id)
            p.metrics.dial_failed(failure_reason(exc))  # swarmd.node.diagnosis names a cause they share
            if exc.status == PeerUnavailable.status:  # unreachable; a slow, busy or failing peer is not banned
                p.bans.fail(peer.peer_id)
            logger.warning("%s exchange of %s with %s failed: %s", p.tag, kind, peer.peer_id[-6:], exc)
            return
        p.bans.succeed(peer.peer_id)
        p.metrics.observe_exchange(time.monotonic() - started)
        h = reply.header
        try:
            if h.peer_id != peer.peer_id:
                raise ValidationError(f"reply signed by {h.peer_id[-6:]}, dialled {peer.peer_id[-6:]}")
            await p.refresh_known(h, kind)
            try:
                verify_payload(reply)  # before anything beyond the header is looked at
            except SwarmdError as exc:
                reject(p, rs, h, kind, exc)
                raise
            accept(p, rs, reply, kind)
        except SwarmdError:
            rs.judged(kind, peer.peer_id)

    # -- the round -------------------------------------------------------------------------------
    async def average(
        self, records: list[PeerRecord], publish: Callable[[], Awaitable[None]] | None = None
    ) -> MergeReport:
        """Publish own deltas, exchange with the peers in `records`, wait for the deadline, merge.

        :param publish: what publishes this round's deltas (default: publish(); Gossip passes its own)
        """
        p, rs = self.peer, self.current
        if rs is None or rs.closed:
            raise RuntimeError("average() needs an open round (call open_round first)")
        records = p.remember(records)  # signed records only; known before any delta is accepted
        plan_groups(p, rs, records)
        await (publish or self.publish)()
        # a peer whose signed record is two or more rounds ahead of ours sends no delta of our round: not waited for
        peers = [r for r in records if p.usable(r) and r.round <= rs.round + AHEAD_ROUNDS]
        if self.idle:  # a round we sit out: only the peers whose records say they train it have a delta for us
            peers = [r for r in peers if r.trains(rs.round + 1)]
        expected = {
            BLOCK: {r.peer_id for r in peers if r.block_index == p.me.block_index},
            EMB: {r.peer_id for r in peers},
        }
        expected = {k: ids & group if (group := rs.members[k]) is not None else ids for k, ids in expected.items()}
        me = p.record()
        expected_n = len(expected[BLOCK]) + len(expected[EMB])
        deadline_s = (
            self.deadline.idle_deadline_s()
            if self.idle
            else self.deadline.deadline_s(rs.ready_at - rs.opened_at, expected_n)
        )
        deadline = rs.ready_at + deadline_s
        tasks = [
            asyncio.create_task(self._dial(rs, r, kind, deadline))
            for r in peers
            if dials(me, r)
            for kind in ((BLOCK, EMB) if r.block_index == me.block_index else (EMB,))
            if r.peer_id in expected[kind]
        ]
        try:
            await rs.collect(expected, deadline)
        finally:
            rs.closed = True
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        accepted = {k: sorted(rs.inbox[k]) for k in (BLOCK, EMB)}
        if rs.arrivals:  # (the idle senders' deltas teach the policy nothing: see Round.stash)
            self.deadline.observe(max(0.0, rs.last_arrival - rs.ready_at), rs.last_arrival - rs.opened_at)
        missing = expected_n - len(rs.arrivals) - len(rs.idle[BLOCK]) - len(rs.idle[EMB])
        self.deadline.observe_arrivals(rs.arrivals, max(0, missing), min(deadline, time.monotonic()) - rs.opened_at)
        if self.idle:
            self.deadline.observe_idle(missing)
        else:
            self.deadline.observe_training(rs.ready_at - rs.opened_at)
        premerge = await premerge_distance(p, rs)
        senders = sorted(set(rs.inbox[BLOCK]) | set(rs.inbox[EMB]))
        must_pass, leave_out = p.standing.plan(
            rs.round, [p.known[s] for s in senders if s in p.known], p.me.block_index
        )
        active = rs.active()
        merged = await merge_parts(
            p, rs.round, rs.own, active, must_pass=must_pass, leave_out=leave_out, own_counts=not self.idle
        )
        await asyncio.to_thread(
            p.standing.observe,
            rs.round,
            rs.own,
            active,
            merged.parts,
            merged.merged_from,
            merged.passed,
            merged.failed,
        )
        counts = {k: len(ids) for k, ids in merged.merged_from.items()}  # phase 2's row weights
        parts, members = await phase2.run(p, rs, merged.parts, counts, deadline, deadline_s)
        await apply_merged(p, parts, members, rs.exact)
        p.state.set_replicas(len(merged.merged_from.get(BLOCK, ())))  # K of TrainConfig.replica_adam
        seconds = time.monotonic() - rs.ready_at
        p.last_split = {k: (set(rs.inbox[k]), dict(rs.mismatched[k])) for k in (BLOCK, EMB)}
        report = MergeReport(
            rs.round,
            sorted(expected[BLOCK]),
            sorted(expected[EMB]),
            accepted[BLOCK],
            accepted[EMB],
            rs.rejected,
            deadline_s,
            seconds,
            premerge,
            merged.fell_back,
            sorted(merged.passed),
            sorted(merged.failed),
            merged.check_s,
        )
        p.metrics.end_round(
            report.participation,
            seconds,
            round=rs.round,
            premerge_distance=premerge,
            deadline_s=deadline_s,
            check_s=merged.check_s,
            fell_back=float(merged.fell_back),
            accepted=len(accepted[BLOCK]) + len(accepted[EMB]),
            expected=expected_n,
            at_s=p.metrics.uptime_s,
            merged_block=list(merged.merged_from.get(BLOCK, ())),  # whose block deltas it merged: a split's evidence
        )
        logger.info(
            "%s round %d merged: block %d/%d, embedding %d/%d peers, %.2fs (deadline %.1fs)",
            p.tag,
            rs.round,
            len(accepted[BLOCK]),
            len(expected[BLOCK]),
            len(accepted[EMB]),
            len(expected[EMB]),
            seconds,
            deadline_s,
        )
        return report
