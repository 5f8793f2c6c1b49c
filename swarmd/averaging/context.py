"""One peer's averaging context: what the round protocol and the state agreement both hold.

PeerContext owns who this peer is (its record `me`, its Identity, the log tag), what it averages (the
BlockState, the group anchors, the error feedback of each part), whom it knows (the newest valid signed
record of each peer, the bans of unreachable peers, a discovery lookup), how it talks (a Transport, its
Metrics), and the payload rules both sides apply:
  - every payload carries this swarm, model config, kind, block, round and peer id (hdr) and is signed by
    this peer's identity; its own record is signed too (record);
  - a payload is decoded (swarmd.averaging.delta.decode) only for this swarm and config, our shapes, and
    within the payload cap; a header's exact byte limit follows from our shapes (payload_limit);
  - a decoded delta whose norm exceeds an absolute bound (max_delta_factor x H x lr x sqrt(values),
    swarmd.averaging.robust.delta_norm_bound, widened by an anchor's age under group averaging) is invalid;
  - only records signed by the peers they name are remembered (swarmd.membership.trust), and a delta counts
    only from a peer whose signed record is for our block and its round, or the one before (sender_problem;
    refresh_known looks the peers up again, at most once a second, for a sender not known yet).
The two pieces that hold it: swarmd.averaging.exchange (the rounds) and swarmd.averaging.agreement (re-sync).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

import torch

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.delta import PAYLOAD_SLACK, ErrorFeedback, decode, payload_size_bound
from swarmd.averaging.groups import Anchor, norm_bound_factor
from swarmd.averaging.outer import with_momentum_shapes
from swarmd.averaging.robust import delta_norm, delta_norm_bound
from swarmd.averaging.standing import Standing
from swarmd.averaging.state import BlockState
from swarmd.averaging.validation import HeldOutCheck
from swarmd.backoff import Backoff
from swarmd.errors import ValidationError
from swarmd.membership.identity import Identity
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import is_valid, sign_record
from swarmd.metrics import Metrics
from swarmd.protocol import Codec, PayloadKind
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)

BLOCK, EMB = PayloadKind.BLOCK_DELTA, PayloadKind.EMBEDDING_DELTA  # the two kinds swapped each round
RECORD_LAG_ROUNDS = 1  # a delta of round r needs its sender's signed record of round r or r - RECORD_LAG_ROUNDS
# ... or of round r + RECORD_LEAD_ROUNDS: a sender that merged at once (its receivers were idle) and announced its next
# round before a receiver still in round r looked it up (the copy task's sequential swarm lost every other round)
RECORD_LEAD_ROUNDS = 1


class Transport(Protocol):
    """Dials peers; it counts the bytes it moves into the peer's Metrics (PeerClient(meter=metrics)),
    while Gossip counts what it answers as the callee (handle_exchange, served_state)."""

    async def exchange(self, address: str, outgoing: Encoded, timeout_s: float) -> Encoded: ...

    async def pull_state(self, address: str, request: pb.PullStateRequest, timeout_s: float) -> Encoded: ...


def payload_kind(value: int) -> PayloadKind | None:
    """The PayloadKind of a proto value (None for one we do not know)."""
    try:
        return PayloadKind.from_pb(value)
    except ValueError:
        return None


class PeerContext:
    """Who this peer is, what it averages, whom it knows, how it talks (see the module doc).

    :param state: the peer's BlockState
    :param transport: dials peers (PeerClient or an in-memory stand-in)
    :param me: this peer's record (peer_id, address, block, client mode, swarm id, config hash)
    :param identity: signs this peer's records and payloads; me.peer_id must be its peer id
    :param lookup: a fresh discovery lookup (None: only the records given to sync/average are known)
    :param check: the peer's held-out sample that adoptions and merges are scored on (swarmd.averaging.validation;
        None: no loss checks)
    :param public: a swarm without a key, open to strangers: probation and the range cap apply (standing)
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
        check: HeldOutCheck | None = None,
        public: bool = False,
    ):
        if me.peer_id != identity.peer_id:
            raise ValueError("me.peer_id must be the identity's peer id")
        self.state, self.transport, self.cfg, self.me, self.metrics = state, transport, cfg, me, metrics
        self.identity, self.lookup, self.check = identity, lookup, check
        self.standing = Standing(me.peer_id, cfg, public, check is not None)  # probation, range cap, drift, work
        self.known: dict[str, PeerRecord] = {}  # peer id -> newest valid signed record seen (sync, average, lookup)
        self._refreshed = 0.0  # monotonic time of the last lookup made for an unknown sender
        self.bans = Backoff(base_s=1.0, max_s=16.0)  # peer id -> ban of an unreachable peer
        self.tag = f"[block {me.block_index} {me.peer_id[-6:]}]"
        self.ef = {BLOCK: ErrorFeedback(), EMB: ErrorFeedback()}
        self.anchors = {BLOCK: Anchor(), EMB: Anchor()}  # group averaging's shared reference (swarmd.averaging.groups)
        # kind -> (peers on our base, peers on another) in the last merged round: the exchange writes it, the
        # next re-sync reads and clears it
        self.last_split: dict[str, tuple[set[str], dict[str, str]]] = {}

    # -- payloads ----------------------------------------------------------------------------------
    def hdr(self, kind: PayloadKind, round: int) -> dict:
        """The header fields of a payload of `kind` this peer sends for `round` (encode()'s keywords)."""
        return dict(
            swarm_id=self.me.swarm_id,
            config_hash=self.me.config_hash,
            kind=kind,
            block_index=self.me.block_index if kind.is_block else -1,
            round=round,
            peer_id=self.me.peer_id,
        )

    def expected_shapes(self, kind: PayloadKind) -> dict[str, tuple[int, ...]]:
        return self.state.block_shapes() if kind.is_block else self.state.emb_shapes()

    def decode(self, enc: Encoded, kind: PayloadKind, block_index: int, outer: bool = False) -> dict[str, torch.Tensor]:
        """decode() a payload of this swarm and model config, of our shapes, within the payload cap.

        :param outer: a state payload that also carries the outer optimizer's buffer (swarmd.averaging.outer)
        """
        shapes = self.expected_shapes(kind)
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
        shapes = self.expected_shapes(kind)
        numel = sum(math.prod(s) for s in shapes.values())
        train = self.state.train_cfg
        lr = train.lr * (1.0 if kind.is_block else max(1.0, train.table_lr_scale))
        return delta_norm_bound(self.cfg.steps_per_round, lr, numel, self.cfg.max_delta_factor)

    def payload_limit(self, header: pb.PayloadHeader) -> int:
        """Bytes a payload with this header may have: the exact size our shapes imply for its kind and codec
        (zstd's worst case and PAYLOAD_SLACK included); 0 for a kind or codec we do not know (refused)."""
        kind = payload_kind(header.kind)
        try:
            codec = Codec.from_pb(header.codec)
        except ValueError:
            return 0
        if kind is None:
            return 0
        shapes = self.expected_shapes(kind)
        if self.state.outer is not None and kind in (PayloadKind.BLOCK_STATE, PayloadKind.EMBEDDING_STATE):
            shapes = with_momentum_shapes(shapes)  # a pulled state may carry the outer buffer
        return payload_size_bound(shapes, codec, bool(header.zstd)) + PAYLOAD_SLACK

    def check_norm(self, tensors: dict[str, torch.Tensor], kind: PayloadKind, scale: float = 1.0) -> None:
        """ValidationError when a decoded delta (or `scale` x bounded buffer) exceeds norm_bound."""
        norm = delta_norm(tensors)
        outer = self.state.outer
        gain = max(1.0, outer.gain()) if outer is not None and outer.local else 1.0  # payloads are outer updates
        bound = self.norm_bound(kind) * scale * gain * norm_bound_factor(self.anchors[kind].age(self.state.round))
        if not norm <= bound:
            raise ValidationError(
                f"delta norm {norm:.3g} exceeds the bound of {bound:.3g} for {self.cfg.steps_per_round} steps"
            )

    # -- weights -----------------------------------------------------------------------------------
    def base(self, kind: PayloadKind) -> tuple[dict[str, torch.Tensor], str]:
        """A part's merged base weights and their hash (kind BLOCK or EMB)."""
        s = self.state
        return (s.base_block, s.block_hash) if kind == BLOCK else (s.base_emb, s.emb_hash)

    def anchor_hash(self, kind: PayloadKind) -> str:
        """The hash a part's payloads and record announce: its anchor's while groups average apart, else the base's."""
        anchor = self.anchors[kind]
        return anchor.hash if anchor.active else self.base(kind)[1]

    # -- records -----------------------------------------------------------------------------------
    def record(self, ttl_s: float = 300.0) -> PeerRecord:
        """This peer's current record (what announce publishes), signed, valid for ttl_s seconds."""
        rec = replace(
            self.me,
            round=self.state.round,
            samples_per_s=self.metrics.samples_per_s,
            base_hash=self.anchor_hash(BLOCK),
            emb_hash=self.anchor_hash(EMB),
        )
        return sign_record(rec, self.identity, ttl_s)

    def remember(self, records: list[PeerRecord]) -> list[PeerRecord]:
        """The records signed by the peers they name and carrying the swarm's proof of work (others dropped),
        remembered as the newest known of each peer."""
        good = [r for r in records if is_valid(r) and self.standing.usable_record(r)]
        for r in good:
            old = self.known.get(r.peer_id)
            if old is None or r.expires >= old.expires:
                self.known[r.peer_id] = r
        return good

    def usable(self, rec: PeerRecord) -> bool:
        """A peer of our swarm and config that is not banned (unreachable peers: 1, 2, 4 ... 16 s)."""
        return (
            rec.peer_id != self.me.peer_id
            and rec.config_hash == self.me.config_hash
            and rec.swarm_id == self.me.swarm_id
            and not self.bans.banned(rec.peer_id)
        )

    def sender_problem(self, h: pb.PayloadHeader, kind: PayloadKind) -> str:
        """Why a delta's sender may not contribute ("" when it holds a valid signed record for this block and round)."""
        me = self.me
        rec = self.known.get(h.peer_id)
        if rec is not None and not is_valid(rec):  # expired meanwhile
            rec = None
        if rec is None:
            return f"no signed record of {h.peer_id[-6:]} is known"
        if rec.swarm_id != me.swarm_id or rec.config_hash != me.config_hash:
            return f"the signed record of {h.peer_id[-6:]} is for another swarm or model config"
        if kind.is_block and rec.block_index != me.block_index:
            return f"the signed record of {h.peer_id[-6:]} is for block {rec.block_index}"
        if not h.round - RECORD_LAG_ROUNDS <= rec.round <= h.round + RECORD_LEAD_ROUNDS:
            return f"the signed record of {h.peer_id[-6:]} is for round {rec.round}, its delta for round {h.round}"
        return ""

    async def refresh_known(self, h: pb.PayloadHeader, kind: PayloadKind) -> None:
        """Look the peers up again when a delta's sender has no matching signed record yet (records lag a
        little behind rounds); at most one lookup per second."""
        if self.lookup is None or not self.sender_problem(h, kind) or time.monotonic() - self._refreshed < 1.0:
            return
        self._refreshed = time.monotonic()
        try:
            self.remember(await self.lookup())
        except Exception as exc:  # a failed lookup only means the delta is judged on what we knew
            logger.debug("%s lookup for an unknown sender failed: %s", self.tag, exc)
