"""The merge of a round: the pure rule over the accepted deltas, its loss check, and landing its result on the replica.

  - merge: base + the robust aggregate (swarmd.averaging.robust.robust_merge: each delta clipped to a
    multiple of the lower median norm, then a coordinate-wise trimmed mean; merge="mean" is the
    plain uniform mean) of the accepted decoded deltas, own decoded delta included, in peer-id
    order, so replicas that accepted the same set end bit-identical. The byte-table deltas get the
    same rule. A merge that is not finite is skipped (the base is kept). AdamW state is kept;
  - the loss check (Zeno: Xie, Koyejo, Gupta 2019), when the peer holds a held-out sample
    (PeerContext.check, swarmd.averaging.validation) and cfg.merge_check_tolerance is finite: the
    candidate the merge would land (block and byte table together: base + merged step; under group
    averaging the anchor + merged offsets; with an outer optimizer base + its step on the merged delta,
    previewed on a copy of its buffers, so what is scored is exactly what apply_merge will write) is
    scored against the same landing of our own delta alone, and against the base (no step). It passes
    when it is within the round's allowance of our own delta alone: the tolerance (nats) plus
    PROGRESS_SLACK x the progress our own delta makes on the sample (base CE - own CE, at least 0).
    The slack is measured, not cosmetic: at benchmarks/swarm.py's config two honest replicas drift
    ~10% apart in H=25 steps and their average scores up to 0.1 nats worse than either alone (giving
    up to 0.39 of a round's own progress beyond 0.02 nats with 16 windows, benchmarks/merge_check.py),
    and the byte table, tuned by every block, scores a little worse on one block's sample than that
    block's own table; a strict "not worse than own alone + 0.02" fell back in 7-11 of 48 honest
    checks (4-32 windows), with the slack in none (8-32 windows). When the
    candidate fails, the round falls back: each accepted peer's delta is scored one by one in the
    place of ours (a same-block peer: its block and byte-table deltas; an other-block peer: its
    byte-table delta merged with ours, as the round lands it, with our own block delta: each block tunes the
    table to its own noise levels, so another block's table delta in place of ours failed on our sample
    often enough that peers of different blocks judged one table differently and their tables split, 0.01-0.03
    apart after 8 rounds of 12 daemons), those within the same allowance pass, and own + the
    passing deltas are merged by the same rule in peer-id order; if even that fails the allowance, our
    own delta lands alone. Honest rounds cost three forward passes on the sample; a fallback one more
    per peer, plus one. Whatever the number of signed identities sending the same poison, a peer never
    lands a merge that gives up more than the allowance of its own round's progress (on its sample);
    what an attacker can still take is that allowance each round (training slows, it does not turn);
  - the seam for the trust rules (check_merge's must_pass and leave_out; what Exchange.must_pass and
    Exchange.leave_out hand in): deltas of peers on probation count only when they pass the one-by-one
    check even in a round whose candidate passes, deltas of peers left out (slow-drift suspects) do
    not count at all; MergeOutcome says who passed and who failed an individual check;
  - consensus: every verdict is a deterministic function of the sample, our own delta and the
    accepted set (CPU fp32 scores, peer-id order), so replicas with the same inputs decide alike, and a
    round whose candidate passes everywhere (every honest round measured) lands exactly the unchecked
    merge. Replicas of a block do differ in their own delta, peers of other blocks (and peers on other
    text) hold other samples, so in a round where a candidate sits near the bound one peer may fall back
    while another does not; their block or byte-table hashes then differ, and the next re-sync
    (swarmd.averaging.agreement: the state the quorum of signed records announces is adopted, itself
    scored by the adoption check) brings them back to one state, as after any split round;
  - overlap (cfg.overlap, delayed averaging): the merge lands late with swarmd.averaging.delayed.land_merge
    (the base moves exactly as above, the live weights keep the steps taken since the snapshot);
  - group averaging (swarmd.averaging.groups): an anchored part merges offsets from its anchor; a round in
    which the part averaged as one group sets every replica to the anchor + merged offsets exactly and
    drops the anchor.
Every merge is a pure function of the accepted deltas (merge_deltas); swarmd.sim runs the same function.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import time
from dataclasses import dataclass, field, replace

import torch

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.context import BLOCK, EMB, PeerContext
from swarmd.averaging.delayed import land_merge
from swarmd.averaging.groups import base_step, merged_target
from swarmd.averaging.outer import OuterOptimizer
from swarmd.averaging.robust import MergeStats, mean_in_order, robust_merge
from swarmd.averaging.validation import HeldOutCheck

logger = logging.getLogger(__name__)

Tensors = dict[str, torch.Tensor]
KINDS = (BLOCK, EMB)
# share of our own delta's progress on the sample (base CE - own CE) a merge may give up beyond the tolerance
# before it falls back (honest averages gave up to ~0.4 of it at benchmarks/swarm.py's config; see the module doc)
PROGRESS_SLACK = 0.5
# the bound of a round we trained nothing in (own_counts False: a pipelined block before or after its turn): with no
# own progress to protect, the check only keeps out what would wreck our block, base CE + this many nats. A table
# step of the block that trains moves the idle blocks' CE by far less; a random or scaled table costs nats. The
# usual tolerance would have the idle peers refuse the trainers' step, and the swarm's tables split.
IDLE_SLACK = 0.5


def merge_mean(deltas: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Uniform mean of the accepted deltas (peer id -> tensors), summed in sorted peer-id order.

    The order is fixed so that every replica that accepted the same set gets the same bits.
    """
    ids = sorted(deltas)
    if not ids:
        raise ValueError("merge_mean needs at least one delta (own delta included)")
    return {name: mean_in_order([deltas[pid][name].float() for pid in ids]) for name in deltas[ids[0]]}


def merge_deltas(deltas: dict[str, dict[str, torch.Tensor]], cfg: GossipConfig) -> dict[str, torch.Tensor]:
    """The round's merge rule of `cfg` (robust or plain mean) over the accepted deltas, own included."""
    return merge_with_stats(deltas, cfg)[0]


def merge_with_stats(
    deltas: dict[str, dict[str, torch.Tensor]], cfg: GossipConfig
) -> tuple[dict[str, torch.Tensor], MergeStats | None]:
    """merge_deltas and, for the robust rule, what it did (None for the plain mean)."""
    if cfg.merge == "mean":
        return merge_mean(deltas), None
    return robust_merge(deltas, cfg.clip_factor, cfg.trim_fraction, cfg.min_cosine, cfg.distance_factor)


def finite(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether every value of every tensor is finite."""
    return all(bool(torch.isfinite(t).all()) for t in tensors.values())


# ----------------------------------------------------------------------------------------------
# The loss check
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Landing:
    """Where a round's merged values land on this replica (what apply_merged will write), for scoring.

    :param base: kind -> the part's base weights
    :param anchor: kind -> the part's group anchor (None: no anchor, the merged value is a step from the base)
    :param outer: a copy of the outer optimizer (None: plain averaging); previews never move the peer's buffers
    """

    base: dict[str, Tensors]
    anchor: dict[str, Tensors | None]
    outer: OuterOptimizer | None = None

    @classmethod
    def of(cls, peer: PeerContext) -> Landing:
        """The landing of `peer`'s state as it is now (its outer optimizer copied under the state's lock)."""
        with peer.state.lock:
            outer = copy.deepcopy(peer.state.outer) if peer.state.outer is not None else None
            base: dict[str, Tensors] = {
                k: dict(peer.base(k)[0]) for k in KINDS
            }  # apply_merge rebinds, never writes, base tensors
        anchor: dict[str, Tensors | None] = {
            k: peer.anchors[k].tensors if peer.anchors[k].active else None for k in KINDS
        }
        return cls(base, anchor, outer)

    def part(self, kind: str, value: Tensors | None) -> Tensors:
        """A part's weights after `value` lands (None: the base is kept)."""
        base, anchor = self.base[kind], self.anchor[kind]
        if value is None:
            return base
        if anchor is not None:
            return merged_target(anchor, value)
        if self.outer is not None and not self.outer.local:  # apply_merge's step, on a copy of the buffers
            value = copy.deepcopy(self.outer).step("block" if kind == BLOCK else "emb", value)
        return {k: base[k] + value[k] for k in base}

    def weights(self, values: dict[str, Tensors | None]) -> tuple[Tensors, Tensors]:
        """(block, byte table) after `values` (kind -> merged value or None) land."""
        return self.part(BLOCK, values[BLOCK]), self.part(EMB, values[EMB])


@dataclass(frozen=True)
class MergeOutcome:
    """What merge_parts decided for a round: the merged parts and what the loss check found.

    passed / failed: the peers whose delta was scored one by one (in a fallback, or on probation) and was
    within the round's bound (bound_ce: see the module doc), or not (failed deltas were kept out of the merge).
    """

    parts: dict[str, Tensors | None]  # kind -> merged value (None: the part's base is kept)
    merged_from: dict[str, tuple[str, ...]]  # kind -> peer ids whose deltas were merged (own included), sorted
    passed: frozenset[str] = frozenset()
    failed: frozenset[str] = frozenset()
    left_out: frozenset[str] = frozenset()  # accepted peers kept out unchecked (leave_out; must_pass with no check)
    fell_back: bool = False  # the merged candidate scored above bound_ce: the merge fell back
    candidate_ce: float = math.nan  # CE (nats) of the candidate of every counted delta (nan: not scored)
    own_ce: float = math.nan  # CE of our own delta alone (nan: no check ran)
    base_ce: float = math.nan  # CE of the base (no step)
    bound_ce: float = math.nan  # the most a candidate may score: own_ce + tolerance + slack x own progress
    landed_ce: float = math.nan  # CE of what lands (the candidate's, the fallback merge's, or own_ce)
    scores: int = 0  # forward passes the check took
    check_s: float = 0.0  # seconds the check took (scores and the fallback's merges)
    stats: dict[str, MergeStats | None] = field(default_factory=dict)  # kind -> the robust merge's stats


def _merge(
    me: str,
    own: dict[str, Tensors],
    inbox: dict[str, dict[str, Tensors]],
    ids: set[str],
    cfg: GossipConfig,
    own_counts: bool = True,
) -> tuple[dict[str, Tensors], dict[str, MergeStats | None], dict[str, tuple[str, ...]]]:
    """The rule of cfg over own + the deltas of `ids` (each part over the peers of `ids` it holds); without
    own_counts (we trained nothing this round), own only where no other delta of the part is counted."""
    values: dict[str, Tensors] = {}
    stats: dict[str, MergeStats | None] = {}
    used: dict[str, tuple[str, ...]] = {}
    for kind in KINDS:
        others = {p: d for p, d in inbox[kind].items() if p in ids}
        deltas = {me: own[kind], **others} if own_counts or not others else others
        values[kind], stats[kind] = merge_with_stats(deltas, cfg)
        used[kind] = tuple(sorted(deltas))
    return values, stats, used


def check_merge(
    me: str,
    own: dict[str, Tensors],
    inbox: dict[str, dict[str, Tensors]],
    cfg: GossipConfig,
    check: HeldOutCheck | None,
    landing: Landing | None,
    *,
    must_pass: frozenset[str] | set[str] = frozenset(),
    leave_out: frozenset[str] | set[str] = frozenset(),
    own_counts: bool = True,
) -> MergeOutcome:
    """The round's merge of own + the accepted deltas under the loss check (see the module doc). Blocking.

    :param me: our peer id (own delta's key)
    :param own: kind -> our decoded delta; :param inbox: kind -> peer id -> accepted decoded delta
    :param check: the held-out sample (None, or cfg.merge_check_tolerance inf: no check, the plain merge)
    :param landing: where merged values land (Landing.of(peer); None: no check)
    :param must_pass: peers whose deltas count only when they pass the one-by-one check (probation)
    :param leave_out: peers whose deltas do not count this round (they are not scored)
    :param own_counts: False when we trained nothing this round (own delta zero, weight 0): own joins a part's
        merge only where no other delta is counted, so the peers that trained land unaveraged with our zeros
    """
    started = time.perf_counter()
    accepted = set(inbox[BLOCK]) | set(inbox[EMB])
    left_out = accepted & set(leave_out)
    pool = accepted - left_out
    tolerance = cfg.merge_check_tolerance
    if check is None or landing is None or not math.isfinite(tolerance) or not pool:
        unchecked = pool & set(must_pass)  # nothing can pass without a check
        values, stats, used = _merge(me, own, inbox, pool - unchecked, cfg, own_counts)
        return MergeOutcome(dict(values), used, left_out=frozenset(left_out | unchecked), stats=stats)
    scored = check.scores

    def score(values: dict[str, Tensors | None]) -> float:
        return check.score(*landing.weights(values))

    own_values: dict[str, Tensors | None] = {BLOCK: own[BLOCK], EMB: own[EMB]}
    own_ce = score(own_values)
    base_ce = score({BLOCK: None, EMB: None})
    # a base or own delta that scores inf (garbage) makes the bound inf: there is no progress to protect
    if own_counts:
        bound = own_ce + tolerance + PROGRESS_SLACK * max(0.0, base_ce - own_ce)
    else:  # no own step to protect (see IDLE_SLACK)
        bound = base_ce + max(tolerance, IDLE_SLACK)
    verdicts: dict[str, bool] = {}

    def judge(ids: set[str]) -> None:
        """Score each peer's delta in the place of ours (sorted order): within the bound or not."""
        for pid in sorted(ids - set(verdicts)):
            alone: dict[str, Tensors | None] = {kind: inbox[kind].get(pid, own[kind]) for kind in KINDS}
            if own_counts and pid not in inbox[BLOCK] and pid in inbox[EMB]:  # another block's: joins our table delta
                alone[EMB] = merge_deltas({me: own[EMB], pid: inbox[EMB][pid]}, cfg)
            verdicts[pid] = score(alone) <= bound  # inf (garbage) never passes

    judge(pool & set(must_pass))
    counted = {p for p in pool if verdicts.get(p, True)}
    values, stats, used = _merge(me, own, inbox, counted, cfg, own_counts)
    candidate_ce = landed_ce = score(dict(values))
    fell_back = not candidate_ce <= bound
    if fell_back:
        judge(pool)
        kept = {p for p in pool if verdicts[p]}
        if kept != counted:  # (the same set is the candidate again)
            values, stats, used = _merge(me, own, inbox, kept, cfg, own_counts)
            landed_ce = score(dict(values))
        if not landed_ce <= bound:  # even the passing deltas together: our own delta alone
            values, stats, used = _merge(me, own, inbox, set(), cfg)
            landed_ce = own_ce
    return MergeOutcome(
        dict(values),
        used,
        passed=frozenset(p for p, ok in verdicts.items() if ok),
        failed=frozenset(p for p, ok in verdicts.items() if not ok),
        left_out=frozenset(left_out),
        fell_back=fell_back,
        candidate_ce=candidate_ce,
        own_ce=own_ce,
        base_ce=base_ce,
        bound_ce=bound,
        landed_ce=landed_ce,
        scores=check.scores - scored,
        check_s=time.perf_counter() - started,
        stats=stats,
    )


async def merge_parts(
    peer: PeerContext,
    round: int,
    own: dict[str, Tensors],
    inbox: dict[str, dict[str, Tensors]],
    *,
    must_pass: frozenset[str] | set[str] = frozenset(),
    leave_out: frozenset[str] | set[str] = frozenset(),
    own_counts: bool = True,
) -> MergeOutcome:
    """Each part's merge (check_merge over own + the accepted deltas, in the worker thread); a part whose merge is
    not finite gets None (the base is kept). Logs a fallback once, with its figures, and counts it in the
    peer's Metrics.

    :param must_pass: peers whose deltas count only when they pass the one-by-one check (probation)
    :param leave_out: peers whose deltas do not count this round
    :param own_counts: see check_merge
    """
    checking = peer.check is not None and math.isfinite(peer.cfg.merge_check_tolerance)
    landing = Landing.of(peer) if checking else None  # (copies the outer buffers: only when they are scored)
    out = await asyncio.to_thread(
        check_merge,
        peer.me.peer_id,
        own,
        inbox,
        peer.cfg,
        peer.check,
        landing,
        must_pass=frozenset(must_pass),
        leave_out=frozenset(leave_out),
        own_counts=own_counts,
    )
    if out.fell_back:
        logger.warning(
            "%s round %d: the merged update scores %.4f nats on the held-out sample, own delta alone %.4f, "
            "the base %.4f (bound %.4f): merged own + the %d delta(s) that pass one by one (%.4f), refused %s",
            peer.tag,
            round,
            out.candidate_ce,
            out.own_ce,
            out.base_ce,
            out.bound_ce,
            len(out.passed),
            out.landed_ce,
            ", ".join(p[-6:] for p in sorted(out.failed)) or "none",
        )
    elif out.failed:
        logger.info(
            "%s round %d: kept %d delta(s) on probation out of the merge (worse than own delta alone): %s",
            peer.tag,
            round,
            len(out.failed),
            ", ".join(p[-6:] for p in sorted(out.failed)),
        )
    if not own_counts and out.scores:
        logger.info(
            "%s round %d (idle): the trainers' update scores %.4f nats on our sample, the base %.4f",
            peer.tag,
            round,
            out.candidate_ce,
            out.base_ce,
        )
    if out.scores:
        peer.metrics.observe_merge_check(out.fell_back, len(out.failed), out.check_s)
    parts: dict[str, Tensors | None] = {}
    for kind in KINDS:
        stats, value = out.stats.get(kind), out.parts[kind]
        if stats is not None and stats.dropped:
            logger.info(
                "%s round %d: the %s merge dropped %d delta(s) as outliers (far from the others or pointing away)",
                peer.tag,
                round,
                kind,
                stats.dropped,
            )
        parts[kind] = value if value is not None and finite(value) else None  # cannot happen with bounded inputs
        if parts[kind] is None:
            logger.error("%s round %d: the %s merge is not finite; keeping the base", peer.tag, round, kind)
    return replace(out, parts=parts)


async def apply_merged(
    peer: PeerContext,
    merged: dict[str, Tensors | None],
    members: dict[str, set[str] | None],
    own_exact: dict[str, Tensors],
) -> None:
    """Apply the round's merges: base + merged (no anchor), or the anchor + merged offsets (group averaging);
    a one-group round of an anchored part sets every replica to that exactly and drops the anchor.

    :param members: the round's group of each part (None: the part averaged as one group)
    :param own_exact: own deltas before the codec (what a late merge subtracts again, cfg.overlap)
    """
    steps: dict[str, Tensors | None] = dict(merged)
    exact: dict[str, Tensors | None] = {BLOCK: None, EMB: None}
    for kind in (BLOCK, EMB):
        anchor, value = peer.anchors[kind], merged[kind]
        if not anchor.active or anchor.tensors is None or value is None:
            continue
        target = merged_target(anchor.tensors, value)
        steps[kind] = base_step(target, peer.base(kind)[0])
        if members[kind] is None:  # everybody merged the same offsets: same bits, the new anchor
            exact[kind] = target
    if peer.cfg.overlap:  # the merge lands one round late, live keeps the steps taken since publish()
        await asyncio.to_thread(land_merge, peer.state, steps[BLOCK], steps[EMB], own_exact[BLOCK], own_exact[EMB])
    else:
        await asyncio.to_thread(peer.state.apply_merge, steps[BLOCK], steps[EMB])
    if exact[BLOCK] is not None or exact[EMB] is not None:  # (rebase keeps live's steps since publish)
        await asyncio.to_thread(peer.state.rebase, exact[BLOCK], exact[EMB])
        for kind in (BLOCK, EMB):
            if exact[kind] is not None:
                peer.anchors[kind].clear()
