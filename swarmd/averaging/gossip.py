"""One gossip round: swap compressed deltas with the peers found, accept what arrives in time, merge.

Owns the averaging protocol (litepaper §2.3-2.4, ../shared/docs/gossip.md):
  - a round r starts from a base every same-block replica shares (identified by a weights hash);
    after H local steps a peer encodes its block delta and embedding delta with ErrorFeedback;
  - exchanges are bidirectional (PeerClient.exchange): for each pair of peers exactly one dials
    the other (the lower peer id dials, client-mode peers always dial), the callee stashes the
    caller's delta and answers with its own delta of the same round;
  - block deltas go to same-block peers, embedding deltas to peers of every block;
  - deltas are validated (swarmd.averaging.delta.decode), and must carry our round and base hash, else they
    are rejected (counted, logged) and cost the round only that peer's contribution;
  - the collection ends when every expected peer answered, or at the deadline of a participation
    target (DeadlinePolicy: the arrival time of the target fraction of the deltas expected over the
    last rounds, measured by the simulator in swarmd.sim); before any round was observed, at an adaptive
    deadline: the later
    of (own delta ready + factor x EMA of the arrival lag) and (round start + 1.5 x EMA of the
    round length until the last arrival), never before ready + deadline_min_s nor after
    ready + deadline_max_s. The second term makes the fastest peer of a round wait for the
    slower ones' training even when it was itself the slowest last round (lags swap roles);
  - a decoded delta whose norm exceeds an absolute bound (max_delta_factor x H x lr x sqrt(values),
    swarmd.averaging.robust.delta_norm_bound) is rejected like any invalid one;
  - merge: base + the robust aggregate (swarmd.averaging.robust.robust_merge: each delta clipped to a
    multiple of the lower median norm, then a coordinate-wise trimmed mean; merge="mean" is the
    plain uniform mean) of the accepted decoded deltas, own decoded delta included, in peer-id
    order, so replicas that accepted the same set end bit-identical. The byte-table deltas get the
    same rule. A merge that is not finite is skipped (the base is kept). AdamW state is kept;
  - overlap (cfg.overlap, delayed averaging): publish() also keeps the exact own deltas, training goes on
    while the round is collected, and the merge lands late with swarmd.averaging.delayed.land_merge (the base
    moves exactly as above, the live weights keep the steps taken since the snapshot);
  - group averaging (cfg.group_size = k, swarmd.averaging.groups): a part with more than k peers averages in
    the round's group of at most k (a grid every peer computes from the signed records and the round),
    as offsets from the part's anchor (the last state all replicas shared), whose hash payloads and
    records announce; with at most k peers the round is the all-to-all one above, bit for bit;
  - nothing non-finite is sent: an own delta that is not finite (local training diverged) is
    replaced by a zero delta and the live weights go back to the base.
  - re-sync (sync): the reference of a block is its peer with the highest (round, server mode,
    peer id) among the records at the highest round seen; a peer whose base hash differs from its
    reference adopts the reference's state by PullState. The embedding works the same over all
    peers. Joiners go through the same rule before their first step, so nobody sends a delta
    computed from weights the swarm does not share;
  - trust (issue 9, swarmd.membership.trust): only records signed by the peers they name count; every
    payload this peer sends is signed, every payload it receives is verified before it is decoded,
    and a delta counts only from a peer whose signed record is for our block and its round (or the
    one before); a re-sync target must be announced by a quorum of the signed records (agreeing(),
    round_backed()), the pulled state must hash to what they announce, and the round counter moves
    at most cfg.max_round_jump per re-sync.
Talks to a Transport protocol (PeerClient, or an in-memory one in tests) and a Discovery; no grpc
or hivemind imports. Every merge is a pure function of the accepted deltas (merge_deltas).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from swarmd.averaging import rejoin
from swarmd.averaging.config import GossipConfig
from swarmd.averaging.delayed import land_merge
from swarmd.averaging.delta import PAYLOAD_SLACK, ErrorFeedback, decode, encode, payload_size_bound
from swarmd.averaging.groups import Anchor, base_step, merged_target, norm_bound_factor, offset_int8_levels, with_offset
from swarmd.averaging.groups import round_members as group_members
from swarmd.averaging.outer import split_momentum, with_momentum, with_momentum_shapes
from swarmd.averaging.robust import MergeStats, delta_norm, delta_norm_bound, mean_in_order, robust_merge
from swarmd.averaging.state import BlockState, relative_distance, weights_hash
from swarmd.backoff import Backoff
from swarmd.errors import (
    BaseMismatch,
    NotReady,
    PeerUnavailable,
    StaleRound,
    SwarmdError,
    ValidationError,
    WrongBlock,
)
from swarmd.membership.identity import Identity
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import is_valid, sign_payload, sign_record, verify_payload
from swarmd.metrics import Metrics, reject_reason
from swarmd.protocol import Codec, PayloadKind
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)

RECORD_LAG_ROUNDS = 1  # a delta of round r needs its sender's signed record of round r or r - RECORD_LAG_ROUNDS
BLOCK, EMB = PayloadKind.BLOCK_DELTA, PayloadKind.EMBEDDING_DELTA  # the two kinds swapped each round


class Transport(Protocol):
    """Dials peers; it counts the bytes it moves into the peer's Metrics (PeerClient(meter=metrics)),
    while Gossip counts what it answers as the callee (handle_exchange, state_payload)."""

    async def exchange(self, address: str, outgoing: Encoded, timeout_s: float) -> Encoded: ...

    async def pull_state(self, address: str, request: pb.PullStateRequest, timeout_s: float) -> Encoded: ...


# ----------------------------------------------------------------------------------------------
# Pure functions (unit-tested directly)
# ----------------------------------------------------------------------------------------------
def _kind(value: int) -> PayloadKind | None:
    """The PayloadKind of a proto value (None for one we do not know)."""
    try:
        return PayloadKind.from_pb(value)
    except ValueError:
        return None


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


def _finite(tensors: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors.values())


def dials(me: PeerRecord, other: PeerRecord) -> bool:
    """Whether `me` opens the exchange with `other`: exactly one side of each pair dials."""
    if other.client_mode or not other.address:
        return False  # nobody can dial a client-mode peer; it dials us
    if me.client_mode:
        return True
    return me.peer_id < other.peer_id


def quorum(others: int) -> int:
    """How many other peers must announce the same (round, weights) before a peer adopts that state:
    a majority of the `others` signed records seen, and at least 2 once 2 or more others exist."""
    return 1 if others <= 1 else max(2, others // 2 + 1)


def agreeing(others: list[PeerRecord], key=lambda r: r.base_hash) -> list[PeerRecord]:
    """The records of `others` whose (round, weights) at least quorum(len(others)) distinct peers announce.

    A state only one record (or a minority) claims, e.g. a stranger's round 1,000,000, is never a
    re-sync target, whatever its round.
    """
    latest = {r.peer_id: r for r in others}
    counts = Counter((r.round, key(r)) for r in latest.values())
    need = quorum(len(latest))
    return [r for r in latest.values() if counts[(r.round, key(r))] >= need]


REJOIN_AHEAD_ROUNDS = 8  # a majority member asked for its state may have merged this many rounds since its record
HISTORY_ROUNDS = 16  # rounds of our own base hashes kept to tell a lagging majority from a diverged one


def diverged_majority(
    me: PeerRecord, others: list[PeerRecord], own_history: dict[int, str], key=lambda r: r.base_hash
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


def reference(me: PeerRecord, others: list[PeerRecord], key=lambda r: r.base_hash) -> PeerRecord:
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


PARTICIPATION_TARGET = 0.8  # DeadlinePolicy's default: wait for this fraction of the expected deltas (issue 11)


class DeadlinePolicy:
    """Collection deadline (see the module doc); max_s until something was measured.

    Two rules. Participation target (target > 0, the default): once rounds were observed with
    observe_arrivals, the deadline is the arrival time (after round open) of the ceil(target x n)-th
    of the n deltas expected over the last `window` rounds, a delta that had not arrived by its round's
    close counting as later than every arrival; when that one is such a missing delta the deadline
    grows to growth x the latest close seen. The simulator (swarmd.sim, benchmarks/async_sim.py)
    measured this rule against lockstep, fixed deadlines and the EMA rule under WAN regimes. EMA rule
    (target 0, until arrivals were observed, and in a round whose target needs every expected delta,
    i.e. fewer than 1 / (1 - target) of them): the later of factor x EMA of the arrival lag after own
    delta was ready and round_factor x EMA of the round length.

    :param round_factor: slack on the measured round length (open -> last arrival), 1.5 = +50 %
    :param target: fraction of the expected deltas to wait for (0 = the EMA rule only)
    :param window: rounds of arrival times the target rule looks at
    :param growth: how much the deadline grows past the latest close while participation is below target
    """

    def __init__(
        self,
        cfg: GossipConfig,
        alpha: float = 0.3,
        round_factor: float = 1.5,
        target: float = PARTICIPATION_TARGET,
        window: int = 5,
        growth: float = 1.5,
    ):
        if not 0 <= target <= 1 or window < 1 or growth < 1:
            raise ValueError("need 0 <= target <= 1, window >= 1 and growth >= 1")
        self.cfg, self.alpha, self.round_factor = cfg, alpha, round_factor
        self.target, self.growth = target, growth
        self.ema: float | None = None  # arrival lag after own delta was ready, seconds
        self.round_ema: float | None = None  # round start -> last accepted arrival, seconds
        self.rounds: deque[tuple[list[float], int, float]] = deque(maxlen=window)  # (arrivals, missing, close)

    def target_after_open_s(self, expected: int | None = None) -> float | None:
        """The target rule's deadline after round open (None: the EMA rule applies).

        :param expected: deltas this round expects; when the target needs every one of them (a small swarm:
            ceil(target x expected) == expected) the EMA rule applies, which waits for the slowest
        """
        if self.target <= 0 or not self.rounds:
            return None
        if expected is not None and math.ceil(self.target * expected - 1e-9) >= expected:
            return None
        arrived = sorted(a for r in self.rounds for a in r[0])
        n = len(arrived) + sum(r[1] for r in self.rounds)
        k = max(1, math.ceil(self.target * n - 1e-9))  # wait for the k-th of the n expected deltas
        if k <= len(arrived):
            return arrived[k - 1]
        return self.growth * max(r[2] for r in self.rounds)

    def deadline_s(self, ready_after_open_s: float = 0.0, expected: int | None = None) -> float:
        """Seconds to wait after own delta is ready; ready_after_open_s = how long training took this round,
        expected = how many deltas it expects (see target_after_open_s)."""
        target = self.target_after_open_s(expected)
        if target is not None:
            wait = target - ready_after_open_s
        elif self.ema is None:
            return self.cfg.deadline_max_s
        else:
            wait = self.cfg.deadline_factor * self.ema
            if self.round_ema is not None:
                wait = max(wait, self.round_factor * self.round_ema - ready_after_open_s)
        return min(self.cfg.deadline_max_s, max(self.cfg.deadline_min_s, wait))

    def observe_arrivals(self, arrived_s: list[float], missing: int, closed_s: float) -> None:
        """One round for the target rule: arrival times (seconds after round open) of the deltas that came
        in time, how many expected deltas had not arrived at the close, and the close (after open)."""
        if arrived_s or missing:
            self.rounds.append((list(arrived_s), int(missing), float(closed_s)))

    def observe(self, lag_s: float, round_s: float | None = None) -> None:
        self.ema = lag_s if self.ema is None else (1 - self.alpha) * self.ema + self.alpha * lag_s
        if round_s is not None:
            self.round_ema = (
                round_s if self.round_ema is None else (1 - self.alpha) * self.round_ema + self.alpha * round_s
            )


# ----------------------------------------------------------------------------------------------
# Round state
# ----------------------------------------------------------------------------------------------
@dataclass
class MergeReport:
    """What one averaging round merged: whose deltas were expected and accepted, and how long it took."""

    round: int  # round index that was merged (rounds completed before it)
    expected_block: list[str]
    expected_emb: list[str]
    accepted_block: list[str]
    accepted_emb: list[str]
    rejected: int
    deadline_s: float
    seconds: float  # from own delta ready to merge
    premerge_distance: float  # max relative distance between own live block and an accepted replica before the merge

    @property
    def participation(self) -> float:
        """Fraction of the expected (peer, kind) deltas that were accepted; 1.0 when none was expected."""
        expected = len(self.expected_block) + len(self.expected_emb)
        got = len(set(self.accepted_block) & set(self.expected_block)) + len(
            set(self.accepted_emb) & set(self.expected_emb)
        )
        return 1.0 if expected == 0 else got / expected


class _Repeat(StaleRound):
    """A second delta of the same peer, kind and round (a peer that re-syncs and retries within our round)."""


@dataclass
class _Round:
    round: int
    hashes: dict[str, str]  # kind -> base hash
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    outgoing: dict[str, Encoded] = field(default_factory=dict)
    own: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    inbox: dict[str, dict[str, dict[str, torch.Tensor]]] = field(default_factory=lambda: {BLOCK: {}, EMB: {}})
    failed: dict[str, set[str]] = field(default_factory=lambda: {BLOCK: set(), EMB: set()})
    closed: bool = False
    mismatched: dict[str, set[str]] = field(
        default_factory=lambda: {BLOCK: set(), EMB: set()}
    )  # senders on another base
    opened_at: float = field(default_factory=time.monotonic)
    ready_at: float = 0.0
    last_arrival: float = 0.0
    arrivals: list[float] = field(default_factory=list)  # seconds after open of each accepted delta
    rejected: int = 0
    senders: dict[str, set[str]] = field(
        default_factory=lambda: {BLOCK: set(), EMB: set()}
    )  # peers whose (signed) delta of this round was judged: one each, accepted or not
    exact: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # own deltas before the codec (overlap)
    members: dict[str, set[str] | None] = field(default_factory=lambda: {BLOCK: None, EMB: None})  # group (None: all)


class Gossip:
    """Averaging rounds of one peer.

    :param state: the peer's BlockState
    :param transport: dials peers (PeerClient or an in-memory stand-in)
    :param me: this peer's record (peer_id, address, block, client mode, swarm id, config hash)
    """

    def __init__(
        self,
        state: BlockState,
        transport: Transport,
        cfg: GossipConfig,
        me: PeerRecord,
        metrics: Metrics,
        *,
        identity: Identity,
        lookup: Callable[[], Awaitable[list[PeerRecord]]] | None = None,
    ):
        """:param identity: signs this peer's records and payloads; me.peer_id must be its peer id
        :param lookup: a fresh discovery lookup, used when a delta arrives from a peer whose signed record
            for that block and round we have not seen yet (None: only the records given to sync/average)"""
        if me.peer_id != identity.peer_id:
            raise ValueError("me.peer_id must be the identity's peer id")
        self.state, self.transport, self.cfg, self.me, self.metrics = state, transport, cfg, me, metrics
        self.identity, self.lookup = identity, lookup
        self.known: dict[str, PeerRecord] = {}  # peer id -> newest valid signed record seen (sync, average, lookup)
        self.history: dict[str, dict[int, str]] = {"block": {}, "embedding": {}}  # part -> round -> our base hash
        self._refreshed = 0.0  # monotonic time of the last lookup made for an unknown sender
        self.deadline = DeadlinePolicy(cfg)
        self.ef = {BLOCK: ErrorFeedback(), EMB: ErrorFeedback()}
        self.current: _Round | None = None
        self.last_split: dict[
            str, tuple[set[str], set[str]]
        ] = {}  # kind -> (peers on our base, peers on another) last round
        self._opened = asyncio.Condition()
        self.bans = Backoff(base_s=1.0, max_s=16.0)  # peer id -> ban of an unreachable peer
        self.tag = f"[block {me.block_index} {me.peer_id[-6:]}]"
        self.isolated = {BLOCK: 0, EMB: 0}  # rounds in a row without an accepted delta of that kind (rejoin)
        self.anchors = {BLOCK: Anchor(), EMB: Anchor()}  # group averaging's shared reference (swarmd.averaging.groups)

    # -- helpers ---------------------------------------------------------------------------------
    def _hdr(self, kind: PayloadKind, round: int) -> dict:
        return dict(
            swarm_id=self.me.swarm_id,
            config_hash=self.me.config_hash,
            kind=kind,
            block_index=self.me.block_index if kind.is_block else -1,
            round=round,
            peer_id=self.me.peer_id,
        )

    def _expected_shapes(self, kind: PayloadKind) -> dict[str, tuple[int, ...]]:
        return self.state.block_shapes() if kind.is_block else self.state.emb_shapes()

    def _decode(
        self, enc: Encoded, kind: PayloadKind, block_index: int, outer: bool = False
    ) -> dict[str, torch.Tensor]:
        """decode() a payload of this swarm and model config, of our shapes, within the payload cap.

        :param outer: a state payload that also carries the outer optimizer's buffer (swarmd.averaging.outer)
        """
        shapes = self._expected_shapes(kind)
        return decode(
            enc,
            with_momentum_shapes(shapes) if outer else shapes,
            swarm_id=self.me.swarm_id,
            config_hash=self.me.config_hash,
            kind=kind,
            block_index=block_index,
            max_bytes=self.cfg.max_payload_bytes,
        )

    def norm_bound(self, kind: PayloadKind) -> float:
        """Largest decoded delta norm of this kind merged (inf: no bound); see robust.delta_norm_bound."""
        if not self.cfg.max_delta_factor:
            return float("inf")
        shapes = self._expected_shapes(kind)
        numel = sum(math.prod(s) for s in shapes.values())
        train = self.state.train_cfg
        lr = train.lr * (1.0 if kind.is_block else max(1.0, train.table_lr_scale))
        return delta_norm_bound(self.cfg.steps_per_round, lr, numel, self.cfg.max_delta_factor)

    def payload_limit(self, header: pb.PayloadHeader) -> int:
        """Bytes a payload with this header may have: the exact size our shapes imply for its kind and codec
        (zstd's worst case and PAYLOAD_SLACK included); 0 for a kind or codec we do not know (refused)."""
        kind = _kind(header.kind)
        try:
            codec = Codec.from_pb(header.codec)
        except ValueError:
            return 0
        if kind is None:
            return 0
        shapes = self._expected_shapes(kind)
        if self.state.outer is not None and kind in (PayloadKind.BLOCK_STATE, PayloadKind.EMBEDDING_STATE):
            shapes = with_momentum_shapes(shapes)  # a pulled state may carry the outer buffer
        return payload_size_bound(shapes, codec, bool(header.zstd)) + PAYLOAD_SLACK

    def _check_norm(self, tensors: dict[str, torch.Tensor], kind: PayloadKind, scale: float = 1.0) -> None:
        norm = delta_norm(tensors)
        bound = self.norm_bound(kind) * scale * norm_bound_factor(self.anchors[kind].age(self.state.round))
        if not norm <= bound:
            raise ValidationError(
                f"delta norm {norm:.3g} exceeds the bound of {bound:.3g} for {self.cfg.steps_per_round} steps"
            )

    def _usable(self, rec: PeerRecord) -> bool:
        """A peer of our swarm and config that is not banned (unreachable peers: 1, 2, 4 ... 16 s)."""
        return (
            rec.peer_id != self.me.peer_id
            and rec.config_hash == self.me.config_hash
            and rec.swarm_id == self.me.swarm_id
            and not self.bans.banned(rec.peer_id)
        )

    # -- re-sync -----------------------------------------------------------------------------------
    def _remember(self, records: list[PeerRecord]) -> list[PeerRecord]:
        """The records signed by the peers they name (others dropped), remembered as the newest known of each peer."""
        good = [r for r in records if is_valid(r)]
        for r in good:
            old = self.known.get(r.peer_id)
            if old is None or r.expires >= old.expires:
                self.known[r.peer_id] = r
        return good

    async def sync(self, records: list[PeerRecord]) -> list[str]:
        """Adopt the reference's block and embedding if our base differs (see module doc); returns what was pulled.

        Only signed records count, and only a state that a quorum of them announces (agreeing()) can be
        the reference; the pulled state must hash to what they announce, and the round counter moves
        at most cfg.max_round_jump rounds per adoption.
        """
        me = self.record()
        others = [
            r
            for r in self._remember(records)
            if r.peer_id != me.peer_id and r.config_hash == me.config_hash and r.swarm_id == me.swarm_id
        ]
        pulled = []
        for kind, pool in (
            (PayloadKind.BLOCK_STATE, [r for r in others if r.block_index == me.block_index]),
            (PayloadKind.EMBEDDING_STATE, others),
        ):
            weights = (lambda r: r.base_hash) if kind.is_block else (lambda r: r.emb_hash)
            if kind.delta in self.last_split:  # a round was merged since the last sync: were we isolated in it?
                alone = not self.last_split[kind.delta][0] and bool(pool)
                self.isolated[kind.delta] = self.isolated[kind.delta] + 1 if alone else 0
            history = self.history[kind.part]
            history[me.round] = weights(me)
            for old in sorted(history)[:-HISTORY_ROUNDS]:
                del history[old]
            ref = reference(me, agreeing(pool, weights), weights)
            majority = diverged_majority(me, pool, history, weights) if ref.peer_id == me.peer_id else None
            if majority is not None:  # we trained apart (a partition) and are ahead: join the majority
                logger.warning(
                    "%s the %s of the majority (round %d) differs from ours (round %d): rejoining it",
                    self.tag,
                    kind.part,
                    majority.round,
                    me.round,
                )
                ref = majority
            elif ref.peer_id != me.peer_id and not round_backed(ref.round, others):
                logger.warning(
                    "%s not adopting the %s of %s: too few of the swarm's signed records announce its round %d",
                    self.tag,
                    kind.part,
                    ref.peer_id[-6:],
                    ref.round,
                )
                ref = me
            expect: tuple[str, int] | None = (weights(ref), ref.round)
            if ref.peer_id == me.peer_id or (weights(ref) == weights(me) and ref.round == me.round):
                split = self._split_reference(kind, me, pool)  # DHT records may lag: use last round's exchanges
                if split is None:
                    if self.isolated[kind.delta] >= rejoin.ISOLATED_ROUNDS and await self._rejoin(kind, pool):
                        pulled.append(kind.part)
                    continue
                ref, expect = split, None  # the signed deltas said where it is; its state must hash as it signs
            try:
                await self.pull(
                    ref, kind, expect, round_limit=me.round + self.cfg.max_round_jump, back=majority is not None
                )
                pulled.append(kind.part)
            except SwarmdError as exc:
                logger.warning("%s re-sync of the %s from %s failed: %s", self.tag, kind.part, ref.peer_id[-6:], exc)
                if not isinstance(exc, (ValidationError, StaleRound)):
                    self.bans.fail(ref.peer_id)
        self.last_split = {}  # consumed
        return pulled

    def _split_reference(self, kind: PayloadKind, me: PeerRecord, pool: list[PeerRecord]) -> PeerRecord | None:
        """Whom to adopt after last round's exchanges showed peers on another base (None: stay).

        The side with fewer peers on its base moves; on a tie the lower-ranked side moves (the
        same rule as reference(), applied to the signed deltas' headers instead of DHT records). The
        other side must also hold a quorum of the peers seen (one stray signer never moves anybody).
        """
        same, other = self.last_split.get(kind.delta, (set(), set()))
        if not other or len(other) < quorum(len({r.peer_id for r in pool})):
            return None
        candidates = [r for r in pool if r.peer_id in other and r.address]
        if not candidates:
            return None
        best = max(candidates, key=rank)
        if len(other) > len(same) or (len(other) == len(same) and rank(best) > rank(me)):
            return best
        return None

    async def _pull_signed(self, peer: PeerRecord, kind: PayloadKind, **extra) -> Encoded:
        """PullState of `kind` from `peer` (extra: PullStateRequest's outer_state / current); the reply must come
        signed by that peer (ValidationError otherwise)."""
        request = pb.PullStateRequest(
            swarm_id=self.me.swarm_id,
            config_hash=self.me.config_hash,
            kind=kind.to_pb(),
            block_index=peer.block_index if kind.is_block else -1,
            **extra,
        )
        enc = await self.transport.pull_state(peer.address, request, self.cfg.rpc_timeout_s)
        self._check_signed(enc, peer.peer_id)
        return enc

    async def _fresh_state(self, peer: PeerRecord, kind: PayloadKind) -> tuple[rejoin.Held, dict[str, torch.Tensor]]:
        """A peer's current state, signed by it and hashing to the weights its own signed header names."""
        enc = await self._pull_signed(peer, kind)
        tensors = self._decode(enc, kind, self.me.block_index if kind.is_block else -1)
        if (got := await asyncio.to_thread(weights_hash, tensors)) != enc.header.base_hash:
            raise ValidationError(f"pulled state hashes to {got}, its signed header says {enc.header.base_hash}")
        return rejoin.Held(peer.peer_id, int(enc.header.round), got, peer.client_mode), tensors

    async def _rejoin(self, kind: PayloadKind, pool: list[PeerRecord]) -> bool:
        """An isolated peer asks the fresh signed states (swarmd.averaging.rejoin): adopt a fresh quorum's state, or
        hold still and reconcile with the other members; returns whether a state was adopted."""
        self.isolated[kind.delta] = 0  # one attempt per ISOLATED_ROUNDS isolated rounds
        peers = sorted((r for r in pool if r.address and self._usable(r)), key=lambda r: r.peer_id)[: rejoin.MAX_PULLS]
        need = quorum(len({r.peer_id for r in pool}))
        prev: dict[str, tuple[int, str]] | None = None
        settled: tuple = ()
        for _ in range(rejoin.HOLD_TRIES):
            answers = await asyncio.gather(*(self._fresh_state(r, kind) for r in peers), return_exceptions=True)
            fresh = {h.peer_id: (h, t) for a in answers if not isinstance(a, BaseException) for h, t in (a,)}
            round, block, emb = self.state.snapshot()
            own_hash = self.state.block_hash if kind.is_block else self.state.emb_hash
            mine = rejoin.Held(self.me.peer_id, round, own_hash, self.me.client_mode)
            target = rejoin.fresh_majority(mine, [h for h, _ in fresh.values()], need)
            if target is not None:
                await self._adopt_fresh(kind, fresh[target.peer_id][1], target.round, "a quorum's fresh signed state")
                return True
            if any(h.key == mine.key for h, _ in fresh.values()):
                return False  # others hold our weights: a group larger than ours would have been adopted above
            members = {**fresh, mine.peer_id: (mine, block if kind.is_block else emb)}
            if len(members) < 3:
                return False  # fresh_majority decides between two; nothing to reconcile
            now = {p: h.key for p, (h, _) in members.items()}
            if prev is not None and rejoin.stable(prev, now, settled[1:]):
                await self._adopt_fresh(kind, settled[0], settled[1], f"the reconciliation of {len(prev)} members")
                return True
            prev = now
            states, rounds = {p: t for p, (_, t) in members.items()}, {p: h.round for p, (h, _) in members.items()}
            settled = await asyncio.to_thread(rejoin.reconcile, states, rounds, self.cfg.trim_fraction)
            logger.warning(
                "%s isolated and no quorum of the %s among %d fresh states: holding still to reconcile",
                self.tag,
                kind.part,
                len(members),
            )
            await asyncio.sleep(rejoin.HOLD_S)  # hold still: what we serve stays put while the others catch up
        return False

    async def _adopt_fresh(self, kind: PayloadKind, tensors: dict[str, torch.Tensor], round: int, what: str) -> None:
        """Adopt a state the rejoin rule chose, the round counter moving back to it or at most max_round_jump ahead."""
        new_round = min(round, self.state.round + self.cfg.max_round_jump)
        block, emb = (tensors, None) if kind.is_block else (None, tensors)
        await asyncio.to_thread(self.state.adopt, block, emb, new_round)
        self.ef[kind.delta].reset()
        logger.warning("%s rejoined: adopted the %s of %s (round %d)", self.tag, kind.part, what, new_round)

    async def pull(
        self,
        peer: PeerRecord,
        kind: PayloadKind,
        expect: tuple[str, int] | None = None,
        round_limit: int | None = None,
        back: bool = False,
    ) -> None:
        """Download a peer's block or embedding state (signed, validated) and adopt it with its round.

        :param kind: PayloadKind.BLOCK_STATE or PayloadKind.EMBEDDING_STATE
        :param expect: (weights hash, round) the quorum's signed records announce: the state must hash to it
            and carry that round (None: it must hash to what its own signed header says)
        :param round_limit: the round counter never moves past this (default: cfg.max_round_jump ahead)
        :param back: the round counter may move back to the state's (rejoining a majority we ran ahead of)
        :raises ValidationError: unsigned, not from `peer`, or not the announced weights; StaleRound: the
            peer has moved to another round since its record
        """
        outer = self.state.outer is not None  # adopt the reference's outer buffer with its weights
        enc = await self._pull_signed(peer, kind, outer_state=outer)
        h = enc.header
        want_hash, want_round = expect if expect is not None else (h.base_hash, int(h.round))
        if back and expect is not None and want_round < int(h.round) <= want_round + REJOIN_AHEAD_ROUNDS:
            # rejoining a majority: the member asked has merged on since its record (fast rounds, lagging
            # records); its own signed, newer state on that trajectory is what the majority holds now
            want_hash, want_round = h.base_hash, int(h.round)
        if h.base_hash != want_hash or int(h.round) != want_round:
            raise StaleRound(f"state of round {h.round} ({h.base_hash}), records announce {want_round} ({want_hash})")
        tensors, momentum = split_momentum(self._decode(enc, kind, self.me.block_index if kind.is_block else -1, outer))
        if momentum is not None:  # not covered by the announced hash: bounded like the merges it sums
            self._check_norm(momentum, kind.delta, 1.0 / (1.0 - self.cfg.outer_momentum))
        if (got := await asyncio.to_thread(weights_hash, tensors)) != want_hash:
            raise ValidationError(f"pulled state hashes to {got}, its peer announced {want_hash}")
        block, emb = (tensors, None) if kind.is_block else (None, tensors)
        limit = round_limit if round_limit is not None else self.state.round + self.cfg.max_round_jump
        new_round = min(want_round, limit) if back else max(self.state.round, min(want_round, limit))
        if new_round < want_round:
            logger.warning("%s round counter capped at %d (the swarm says %d)", self.tag, new_round, want_round)
        part = "block" if kind.is_block else "emb"
        await asyncio.to_thread(self.state.adopt, block, emb, new_round, {part: momentum} if momentum else None)
        self.ef[kind.delta].reset()
        self.anchors[kind.delta].clear()  # the adopted state is what the quorum shares: our anchor again
        logger.info("%s adopted the %s of %s (round %d)", self.tag, kind.part, peer.peer_id[-6:], enc.header.round)

    async def fetch_block(self, peer: PeerRecord) -> dict[str, torch.Tensor]:
        """Download (and validate) another peer's block state without adopting it (CE measurement)."""
        enc = await self._pull_signed(peer, PayloadKind.BLOCK_STATE, current=True)  # its merged block, not its anchor
        return self._decode(enc, PayloadKind.BLOCK_STATE, peer.block_index)

    @staticmethod
    def _check_signed(enc: Encoded, peer_id: str) -> None:
        """A payload we asked `peer_id` for must come signed by it (ValidationError otherwise)."""
        if enc.header.peer_id != peer_id:
            raise ValidationError(f"state signed by {enc.header.peer_id[-6:] or '?'}, asked {peer_id[-6:]}")
        verify_payload(enc)

    def state_payload(self, request: pb.PullStateRequest) -> Encoded:
        """The base (merged) block or embedding as an fp32 payload, for PullState."""
        if request.swarm_id != self.me.swarm_id or request.config_hash != self.me.config_hash:
            raise ValidationError("pull request for another swarm or model config")
        kind = _kind(request.kind)
        if kind not in (PayloadKind.BLOCK_STATE, PayloadKind.EMBEDDING_STATE):
            raise ValidationError(f"unknown state kind {kind or request.kind!r}")
        if kind.is_block and request.block_index != self.me.block_index:
            raise WrongBlock(f"this peer trains block {self.me.block_index}, not {request.block_index}")
        round, block, emb, momentum = self.state.snapshot_outer()
        tensors, base_hash = (block, self.state.block_hash) if kind.is_block else (emb, self.state.emb_hash)
        if (anchor := self.anchors[kind.delta]).active and anchor.tensors is not None and not request.current:
            tensors, base_hash = anchor.tensors, anchor.hash  # what the records announce (group averaging)
        if request.outer_state and momentum is not None:  # the hash stays the weights' (what records announce)
            tensors = with_momentum(tensors, momentum["block" if kind.is_block else "emb"])
        enc = sign_payload(encode(tensors, Codec.FP32, base_hash=base_hash, **self._hdr(kind, round)), self.identity)
        self.metrics.add_sent(enc.wire_bytes, enc.raw_bytes)
        return enc

    def record(self, ttl_s: float = 300.0) -> PeerRecord:
        """This peer's current record (what announce publishes), signed, valid for ttl_s seconds."""
        rec = replace(
            self.me,
            round=self.state.round,
            samples_per_s=self.metrics.samples_per_s,
            base_hash=self._anchor_hash(BLOCK),
            emb_hash=self._anchor_hash(EMB),
        )
        return self._signed(rec, ttl_s)

    def _base(self, kind: PayloadKind) -> tuple[dict[str, torch.Tensor], str]:
        """A part's merged base weights and their hash (kind BLOCK or EMB)."""
        s = self.state
        return (s.base_block, s.block_hash) if kind == BLOCK else (s.base_emb, s.emb_hash)

    def _anchor_hash(self, kind: PayloadKind) -> str:
        """The hash a part's payloads and record announce: its anchor's while groups average apart, else the base's."""
        anchor = self.anchors[kind]
        return anchor.hash if anchor.active else self._base(kind)[1]

    def _signed(self, record: PeerRecord, ttl_s: float) -> PeerRecord:
        return sign_record(record, self.identity, ttl_s)

    # -- the round ----------------------------------------------------------------------------------
    async def open_round(self) -> None:
        """Start accepting deltas for the round we are about to train (call after sync)."""
        async with self._opened:
            self.current = _Round(self.state.round, {BLOCK: self._anchor_hash(BLOCK), EMB: self._anchor_hash(EMB)})
            self._opened.notify_all()

    async def publish(self) -> None:
        """Encode this round's deltas (error feedback) and let waiting callers have them."""
        rs = self.current
        if rs is None:
            raise RuntimeError("publish() needs an open round (call open_round first)")
        block_delta, emb_delta = await asyncio.to_thread(self.state.deltas)
        if not (_finite(block_delta) and _finite(emb_delta)):  # never send (or merge) non-finite values
            logger.error(
                "%s round %d: local training produced non-finite weights; sending a zero delta and "
                "going back to the base",
                self.tag,
                rs.round,
            )
            await asyncio.to_thread(self.state.rollback)
            block_delta = {k: torch.zeros_like(v) for k, v in block_delta.items()}
            emb_delta = {k: torch.zeros_like(v) for k, v in emb_delta.items()}
            for ef in self.ef.values():
                ef.reset()
        rs.exact = {BLOCK: block_delta, EMB: emb_delta}  # what a late merge subtracts again (swarmd.averaging.delayed)
        weight = float(self.cfg.steps_per_round)
        for kind, delta in ((BLOCK, block_delta), (EMB, emb_delta)):
            # group averaging: base - anchor + delta
            delta = with_offset(delta, self.anchors[kind].offset(self._base(kind)[0]))
            enc, decoded = await asyncio.to_thread(
                self.ef[kind].compress,
                delta,
                self.cfg.codec,
                int8_rms_levels=offset_int8_levels(self.anchors[kind]),
                base_hash=rs.hashes[kind],
                weight=weight,
                **self._hdr(kind, rs.round),
            )
            rs.outgoing[kind], rs.own[kind] = sign_payload(enc, self.identity), decoded
        rs.ready_at = time.monotonic()
        rs.ready.set()

    def _sender_problem(self, h: pb.PayloadHeader, kind: PayloadKind) -> str:
        """Why a delta's sender may not contribute ("" when it holds a valid signed record for this block and round)."""
        rec = self.known.get(h.peer_id)
        if rec is not None and not is_valid(rec):  # expired meanwhile
            rec = None
        if rec is None:
            return f"no signed record of {h.peer_id[-6:]} is known"
        if rec.swarm_id != self.me.swarm_id or rec.config_hash != self.me.config_hash:
            return f"the signed record of {h.peer_id[-6:]} is for another swarm or model config"
        if kind.is_block and rec.block_index != self.me.block_index:
            return f"the signed record of {h.peer_id[-6:]} is for block {rec.block_index}"
        if not h.round - RECORD_LAG_ROUNDS <= rec.round <= h.round:  # a record lags its owner by up to a merge
            return f"the signed record of {h.peer_id[-6:]} is for round {rec.round}, its delta for round {h.round}"
        return ""

    async def _refresh_known(self, h: pb.PayloadHeader, kind: PayloadKind) -> None:
        """Look the peers up again when a delta's sender has no matching signed record yet (records lag a
        little behind rounds); at most one lookup per second."""
        if self.lookup is None or not self._sender_problem(h, kind) or time.monotonic() - self._refreshed < 1.0:
            return
        self._refreshed = time.monotonic()
        try:
            self._remember(await self.lookup())
        except Exception as exc:  # a failed lookup only means the delta is judged on what we knew
            logger.debug("%s lookup for an unknown sender failed: %s", self.tag, exc)

    def _accept(self, rs: _Round, enc: Encoded, kind: PayloadKind, verified: bool = False) -> str:
        """Validate a delta against round, base and schema and stash it; returns the sender id.

        :param verified: the caller already checked the payload's signature (verify_payload)
        """
        h = enc.header
        try:
            if rs.closed:
                raise StaleRound(f"round {rs.round} is already closed")
            if h.peer_id == self.me.peer_id or not h.peer_id:
                raise ValidationError("delta without a (foreign) peer id")
            if not verified:
                verify_payload(enc)  # before anything beyond the header is looked at
            if h.peer_id in rs.senders[kind]:  # a peer gets one delta per round and kind judged (decoded) at most
                self.metrics.reject("stale_round")
                logger.debug("%s refused another %s of round %d from %s", self.tag, kind, rs.round, h.peer_id[-6:])
                raise _Repeat(f"a {kind} of round {rs.round} from {h.peer_id[-6:]} was already judged")
            rs.senders[kind].add(h.peer_id)
            if problem := self._sender_problem(h, kind):
                raise ValidationError(problem)
            if h.round != rs.round:
                raise StaleRound(f"delta of round {h.round}, ours is {rs.round}")
            if (group := rs.members[kind]) is not None and h.peer_id not in group:
                raise ValidationError(f"{h.peer_id[-6:]} is not in our {kind} group of round {rs.round}")
            if h.base_hash != rs.hashes[kind]:
                rs.mismatched[kind].add(h.peer_id)
                raise BaseMismatch(f"delta computed from base {h.base_hash}, ours is {rs.hashes[kind]}")
            tensors = self._decode(enc, kind, self.me.block_index if kind == BLOCK else -1)
            self._check_norm(tensors, kind)
        except _Repeat:
            raise
        except SwarmdError as exc:
            rs.rejected += 1
            self.metrics.reject(reject_reason(exc))
            logger.warning("%s rejected a %s from %s: %s", self.tag, kind, (h.peer_id or "?")[-6:], exc)
            if h.peer_id in rs.senders[kind]:  # judged: the round need not wait for this peer any longer
                rs.failed[kind].add(h.peer_id)
                rs.arrived.set()
            raise
        rs.inbox[kind][h.peer_id] = tensors
        rs.last_arrival = time.monotonic()
        rs.arrivals.append(rs.last_arrival - rs.opened_at)
        rs.arrived.set()
        return h.peer_id

    async def handle_exchange(self, incoming: Encoded) -> Encoded:
        """Callee side of ExchangeDeltas: validate and stash the caller's delta, answer with ours."""
        h = incoming.header
        self.metrics.add_received(incoming.wire_bytes, incoming.raw_bytes)
        kind = _kind(h.kind)
        try:
            verify_payload(incoming)  # signed by the peer it names, before we wait for or look at anything else
            self.bans.succeed(h.peer_id)  # it is alive
            if kind not in (BLOCK, EMB):
                raise ValidationError(f"cannot exchange a {kind or h.kind!r} payload")
            if kind == BLOCK and h.block_index != self.me.block_index:
                raise WrongBlock(f"this peer trains block {self.me.block_index}, not {h.block_index}")
            if self.current is not None and h.round > self.current.round + 1:
                raise StaleRound(f"delta of round {h.round} is ahead of ours ({self.current.round})")
            async with self._opened:
                try:  # the caller may be a little ahead: wait (bounded) for our round to open
                    await asyncio.wait_for(
                        self._opened.wait_for(lambda: self.current is not None and self.current.round >= h.round),
                        self.cfg.deadline_max_s,
                    )
                except TimeoutError:
                    raise StaleRound(f"round {h.round} is ahead of ours ({self.state.round})") from None
            rs = self.current
            if rs is None:  # the wait above ends only once a round is open
                raise RuntimeError("no open round")
            if rs.round != h.round or rs.closed:
                if h.round < rs.round and not rs.closed:
                    # a signed delta of a past round: its sender is behind (or replays an old payload) and sends
                    # nothing for this round before it catches up; judged for this round, as a stale reply to our
                    # own dial is, so the round does not wait for it up to the deadline (a delta of this round
                    # that still comes before the round closes is merged all the same)
                    rs.failed[kind].add(h.peer_id)
                    rs.arrived.set()
                raise StaleRound(f"delta of round {h.round}, ours is {rs.round}{' (closed)' if rs.closed else ''}")
        except SwarmdError as exc:
            self.metrics.reject(reject_reason(exc))
            logger.info("%s refused a %s exchange from %s: %s", self.tag, kind, (h.peer_id or "?")[-6:], exc)
            raise
        wait_s = self.cfg.deadline_max_s
        try:
            await asyncio.wait_for(rs.ready.wait(), wait_s)
        except TimeoutError:
            raise NotReady(f"own delta of round {rs.round} not ready in time") from None
        await self._refresh_known(h, kind)
        try:
            self._accept(rs, incoming, kind, verified=True)  # handle_exchange verified it first
        except BaseMismatch:
            pass  # still answer: the caller sees the mismatch too and both apply the re-sync rule
        reply = rs.outgoing[kind]
        self.metrics.add_sent(reply.wire_bytes, reply.raw_bytes)
        return reply

    async def _dial(self, rs: _Round, peer: PeerRecord, kind: PayloadKind, deadline: float) -> None:
        outgoing, started = rs.outgoing[kind], time.monotonic()
        try:
            reply = await self.transport.exchange(peer.address, outgoing, max(0.1, deadline - time.monotonic()))
        except SwarmdError as exc:
            rs.failed[kind].add(peer.peer_id)
            rs.arrived.set()
            if exc.status == PeerUnavailable.status:  # unreachable; a slow, busy or failing peer is not banned
                self.bans.fail(peer.peer_id)
            logger.warning("%s exchange of %s with %s failed: %s", self.tag, kind, peer.peer_id[-6:], exc)
            return
        self.bans.succeed(peer.peer_id)
        self.metrics.observe_exchange(time.monotonic() - started)
        try:
            if reply.header.peer_id != peer.peer_id:
                raise ValidationError(f"reply signed by {reply.header.peer_id[-6:]}, dialled {peer.peer_id[-6:]}")
            await self._refresh_known(reply.header, kind)
            self._accept(rs, reply, kind)
        except SwarmdError:
            rs.failed[kind].add(peer.peer_id)
            rs.arrived.set()

    def _plan_groups(self, rs: _Round, records: list[PeerRecord]) -> None:
        """This round's group of each part (swarmd.averaging.groups) from the signed records; an anchor is taken
        when a part first averages in groups (the base every replica shares then)."""
        ours = [r for r in records if r.config_hash == self.me.config_hash and r.swarm_id == self.me.swarm_id]
        for kind in (BLOCK, EMB):
            pool = [r.peer_id for r in ours if kind == EMB or r.block_index == self.me.block_index]
            salt = f"{self.me.swarm_id}/{'block' + str(self.me.block_index) if kind == BLOCK else 'table'}"
            rs.members[kind] = group_members(self.me.peer_id, pool, rs.round, self.cfg, salt)
            anchor = self.anchors[kind]
            if rs.members[kind] is not None and not anchor.active:
                anchor.set(*self._base(kind), self.state.round)

    async def _apply(self, rs: _Round, merged: dict[str, dict[str, torch.Tensor] | None]) -> None:
        """Apply the round's merges: base + merged (no anchor), or the anchor + merged offsets (group averaging);
        a one-group round of an anchored part sets every replica to that exactly and drops the anchor."""
        steps: dict[str, dict[str, torch.Tensor] | None] = dict(merged)
        exact: dict[str, dict[str, torch.Tensor] | None] = {BLOCK: None, EMB: None}
        for kind in (BLOCK, EMB):
            anchor, value = self.anchors[kind], merged[kind]
            if not anchor.active or anchor.tensors is None or value is None:
                continue
            target = merged_target(anchor.tensors, value)
            steps[kind] = base_step(target, self._base(kind)[0])
            if rs.members[kind] is None:  # everybody merged the same offsets: same bits, the new anchor
                exact[kind] = target
        if self.cfg.overlap:  # the merge lands one round late, live keeps the steps taken since publish() (no groups)
            await asyncio.to_thread(land_merge, self.state, steps[BLOCK], steps[EMB], rs.exact[BLOCK], rs.exact[EMB])
        else:
            await asyncio.to_thread(self.state.apply_merge, steps[BLOCK], steps[EMB])
        if exact[BLOCK] is not None or exact[EMB] is not None:
            await asyncio.to_thread(self.state.adopt, exact[BLOCK], exact[EMB])
            for kind in (BLOCK, EMB):
                if exact[kind] is not None:
                    self.anchors[kind].clear()

    async def average(self, records: list[PeerRecord]) -> MergeReport:
        """Publish own deltas, exchange with the peers in `records`, wait for the deadline, merge."""
        rs = self.current
        if rs is None or rs.closed:
            raise RuntimeError("average() needs an open round (call open_round first)")
        records = self._remember(records)  # signed records only; known before any delta is accepted
        self._plan_groups(rs, records)
        await self.publish()
        peers = [r for r in records if self._usable(r)]
        expected = {
            BLOCK: {r.peer_id for r in peers if r.block_index == self.me.block_index},
            EMB: {r.peer_id for r in peers},
        }
        expected = {k: ids & group if (group := rs.members[k]) is not None else ids for k, ids in expected.items()}
        me = self.record()
        deadline_s = self.deadline.deadline_s(rs.ready_at - rs.opened_at, len(expected[BLOCK]) + len(expected[EMB]))
        deadline = rs.ready_at + deadline_s
        tasks = [
            asyncio.create_task(self._dial(rs, p, kind, deadline))
            for p in peers
            if dials(me, p)
            for kind in ((BLOCK, EMB) if p.block_index == me.block_index else (EMB,))
            if p.peer_id in expected[kind]
        ]

        def complete() -> bool:
            return all(expected[k] <= set(rs.inbox[k]) | rs.failed[k] for k in (BLOCK, EMB))

        try:
            while not complete():
                rs.arrived.clear()
                if complete():
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(rs.arrived.wait(), remaining)
                except TimeoutError:
                    break
        finally:
            rs.closed = True
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        accepted = {k: sorted(rs.inbox[k]) for k in (BLOCK, EMB)}
        if accepted[BLOCK] or accepted[EMB]:
            self.deadline.observe(max(0.0, rs.last_arrival - rs.ready_at), rs.last_arrival - rs.opened_at)
        expected_n = len(expected[BLOCK]) + len(expected[EMB])
        self.deadline.observe_arrivals(
            rs.arrivals, max(0, expected_n - len(rs.arrivals)), min(deadline, time.monotonic()) - rs.opened_at
        )
        if self.cfg.overlap:  # training went on since the snapshot: compare the weights we sent
            live_block = {n: self.state.base_block[n] + d for n, d in rs.exact[BLOCK].items()}
        else:
            live_block, _ = await asyncio.to_thread(self.state.current)
        ref_block, _ = self.anchors[BLOCK].reference(self.state.base_block, "")
        premerge = max(
            (relative_distance(live_block, {n: ref_block[n] + d[n] for n in d}) for d in rs.inbox[BLOCK].values()),
            default=0.0,
        )
        merged: dict[str, dict[str, torch.Tensor] | None] = {}
        for kind in (BLOCK, EMB):
            deltas = {self.me.peer_id: rs.own[kind], **rs.inbox[kind]}
            value, stats = await asyncio.to_thread(merge_with_stats, deltas, self.cfg)  # off the event loop
            if stats is not None and stats.dropped:
                logger.info(
                    "%s round %d: the %s merge dropped %d delta(s) as outliers (far from the others or pointing away)",
                    self.tag,
                    rs.round,
                    kind,
                    stats.dropped,
                )
            merged[kind] = value if _finite(value) else None  # cannot happen with bounded finite inputs
            if merged[kind] is None:
                logger.error("%s round %d: the %s merge is not finite; keeping the base", self.tag, rs.round, kind)
        await self._apply(rs, merged)
        seconds = time.monotonic() - rs.ready_at
        self.last_split = {k: (set(rs.inbox[k]), set(rs.mismatched[k]) - set(rs.inbox[k])) for k in (BLOCK, EMB)}
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
        )
        self.metrics.end_round(
            report.participation,
            seconds,
            round=rs.round,
            premerge_distance=premerge,
            deadline_s=deadline_s,
            accepted=len(accepted[BLOCK]) + len(accepted[EMB]),
            expected=len(expected[BLOCK]) + len(expected[EMB]),
            at_s=self.metrics.uptime_s,
        )
        logger.info(
            "%s round %d merged: block %d/%d, embedding %d/%d peers, %.2fs (deadline %.1fs)",
            self.tag,
            rs.round,
            len(accepted[BLOCK]),
            len(expected[BLOCK]),
            len(accepted[EMB]),
            len(expected[EMB]),
            seconds,
            deadline_s,
        )
        return report
