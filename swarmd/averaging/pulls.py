"""State transfer: the signed states one peer pulls from others (validated, not adopted) and the states it serves.

StatePulls owns the PullState traffic of state agreement (swarmd.averaging.agreement decides what to adopt):
  - fetch: a peer's block or embedding state as an adoption Candidate: signed by the peer asked, at the round
    and hashing to the weights the quorum's records announce (or, rejoining a majority, the member's own
    signed newer state on that trajectory, at most REJOIN_AHEAD_ROUNDS ahead), its outer momentum bounded
    like the merges it sums; try_fetch logs a failure (and bans an unreachable peer) instead of raising;
  - fresh_state: a peer's current state, hashing to what its own signed header names (a rejoin's question);
  - fetch_block: another peer's merged block for the CE measurement (swarmd.node.measure) or trajectory training's
    frozen predecessors (compact: int8 + zstd, swarmd.averaging.compact; chained: after the first pull a step
    along the chain of states both sides hold, swarmd.averaging.pull_chain), never adopted;
  - state_payload: what this peer answers a PullState with: the base, or the anchor its records announce
    (group averaging), with the outer momentum when asked, signed (fp32; a block int8 when asked compact, a chain
    step when asked against a chain state we hold: PullChains);
    served_state answers it once this round ends when the caller asks for the round after ours (min_round):
    a peer a round ahead that re-syncs to us (fetch with `back`) then takes the state we merge at the end of
    the round, at the round it is in, where the state we are leaving would set its round counter back a round
    and leave its other part, and every delta it sends, a round behind the swarm.
Talks to the peer's Transport only (no grpc here); hashes and decodes in the worker thread where costly.
"""

from __future__ import annotations

import asyncio
import logging
import time

import torch

from swarmd.averaging import rejoin
from swarmd.averaging.adoption import Candidate
from swarmd.averaging.compact import compact_decoding, encode_compact, encode_delta
from swarmd.averaging.context import PeerContext, payload_kind
from swarmd.averaging.delta import encode
from swarmd.averaging.outer import split_momentum, with_momentum
from swarmd.averaging.pull_chain import PullChains, chain_step
from swarmd.averaging.state import weights_hash
from swarmd.errors import StaleRound, SwarmdError, ValidationError, WrongBlock
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import sign_payload, verify_payload
from swarmd.protocol import Codec, PayloadKind
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)

REJOIN_AHEAD_ROUNDS = 8  # a majority member asked for its state may have merged this many rounds since its record
SPLIT_BACK_ROUNDS = 2  # a split round's move takes a state at most this many rounds behind ours (and its round)
ROUND_WAIT_S = 5.0  # longest a PullState for the round after ours waits for this round's end (served_state)
ROUND_POLL_S = 0.02  # how often that wait looks at the round counter


def requested_kind(me: PeerRecord, request: pb.PullStateRequest) -> PayloadKind:
    """The state kind a PullState request asks of the peer whose record is `me`, after the checks every pull passes:
    our swarm and model config (ValidationError), a state kind, and our block for a block state (WrongBlock)."""
    if request.swarm_id != me.swarm_id or request.config_hash != me.config_hash:
        raise ValidationError("pull request for another swarm or model config")
    kind = payload_kind(request.kind)
    if kind not in (PayloadKind.BLOCK_STATE, PayloadKind.EMBEDDING_STATE):
        raise ValidationError(f"unknown state kind {kind or request.kind!r}")
    if kind.is_block and request.block_index != me.block_index:
        raise WrongBlock(f"this peer trains block {me.block_index}, not {request.block_index}")
    if request.compact and (not kind.is_block or request.outer_state or request.weights_hash):
        raise ValidationError("a compact pull is of a block state, without outer_state or weights_hash")
    if request.against and not request.compact:
        raise ValidationError("a pull against a held state is a compact pull")
    return kind


class StatePulls:
    """One peer's state transfers (see the module doc).

    :param peer: the context the round protocol and the state agreement hold too
    """

    def __init__(self, peer: PeerContext):
        self.peer = peer
        self._held: tuple[str, dict[str, torch.Tensor]] | None = None  # compact_held's last (hash, decoding)
        # block -> (base_hash, tensors) of the last compact merged state pulled of it (fetch_working's `against`)
        self.pulled_compact: dict[int, tuple[str, dict[str, torch.Tensor]]] = {}
        # block -> (hash, state) of the chain state we hold of it (fetch_block's `against` when chained)
        self.held_chains: dict[int, tuple[str, dict[str, torch.Tensor]]] = {}
        # the chain states our pullers hold of our block (compact_payload)
        self.chains = PullChains(lambda kind: peer.hdr(kind, peer.state.round))

    async def fetch(
        self, peer: PeerRecord, kind: PayloadKind, expect: tuple[str, int] | None, round_limit: int | None, back: bool
    ) -> Candidate:
        """Download a peer's block or embedding state (signed, validated) as a Candidate, not adopted (the parameters
        are Agreement.pull's; with `back` and `expect`, a majority member's own signed state up to REJOIN_AHEAD_ROUNDS
        past the announced round is taken instead: it merged on since its record; with `back` and no `expect`, a split
        round's move, a state at most SPLIT_BACK_ROUNDS behind ours)."""
        p = self.peer
        outer = p.state.outer is not None  # adopt the reference's outer buffer with its weights
        # moving to a state of peers a round behind us: the one they merge at the end of their round (served_state)
        enc = await self.pull_signed(peer, kind, outer_state=outer, min_round=p.state.round if back else 0)
        h = enc.header
        want_hash, want_round = expect if expect is not None else (h.base_hash, int(h.round))
        if back and expect is not None and want_round < int(h.round) <= want_round + REJOIN_AHEAD_ROUNDS:
            # rejoining a majority: the member asked has merged on since its record (fast rounds, lagging
            # records); its own signed, newer state on that trajectory is what the majority holds now
            want_hash, want_round = h.base_hash, int(h.round)
        if back and expect is None and int(h.round) < p.state.round - SPLIT_BACK_ROUNDS:
            raise StaleRound(f"state of round {h.round}, more than {SPLIT_BACK_ROUNDS} behind ours ({p.state.round})")
        if h.base_hash != want_hash or int(h.round) != want_round:
            raise StaleRound(f"state of round {h.round} ({h.base_hash}), records announce {want_round} ({want_hash})")
        tensors, momentum = split_momentum(p.decode(enc, kind, p.me.block_index if kind.is_block else -1, outer))
        if momentum is not None:  # not covered by the announced hash: bounded like the merges it sums
            p.check_norm(momentum, kind.delta, 1.0 / (1.0 - p.cfg.outer_momentum))
        if (got := await asyncio.to_thread(weights_hash, tensors)) != want_hash:
            raise ValidationError(f"pulled state hashes to {got}, its peer announced {want_hash}")
        announced = peer.base_hash if kind.is_block else peer.emb_hash
        return Candidate(
            kind,
            peer.peer_id,
            want_hash,
            want_round,
            tensors,
            momentum,
            back=back,
            round_limit=round_limit,
            announced=announced,
        )

    async def try_fetch(
        self,
        peer: PeerRecord,
        kind: PayloadKind,
        expect: tuple[str, int] | None,
        limit: int,
        back: bool = False,
        apart: bool = False,
    ) -> Candidate | None:
        """fetch, a failure logged (and an unreachable peer banned) instead of raised; `apart`: Candidate.apart."""
        p = self.peer
        try:
            c = await self.fetch(peer, kind, expect, limit, back)
            c.apart = apart
            return c
        except SwarmdError as exc:
            logger.warning("%s re-sync of the %s from %s failed: %s", p.tag, kind.part, peer.peer_id[-6:], exc)
            if not isinstance(exc, (ValidationError, StaleRound)):
                p.bans.fail(peer.peer_id)
            return None

    async def fresh_state(self, peer: PeerRecord, kind: PayloadKind) -> tuple[rejoin.Held, dict[str, torch.Tensor]]:
        """A peer's current state, signed by it and hashing to the weights its own signed header names."""
        p = self.peer
        enc = await self.pull_signed(peer, kind)
        tensors = p.decode(enc, kind, p.me.block_index if kind.is_block else -1)
        if (got := await asyncio.to_thread(weights_hash, tensors)) != enc.header.base_hash:
            raise ValidationError(f"pulled state hashes to {got}, its signed header says {enc.header.base_hash}")
        return rejoin.Held(peer.peer_id, int(enc.header.round), got, peer.client_mode), tensors

    async def fetch_block(
        self, peer: PeerRecord, compact: bool = False, chain: bool = False
    ) -> dict[str, torch.Tensor]:
        """Download (and validate) another peer's block state without adopting it (CE measurement; compact: int8,
        for trajectory training's frozen predecessors; chain: compact, as a step along the chain state we hold of
        the block when the peer holds it too, swarmd.averaging.pull_chain)."""
        b = peer.block_index
        held = self.held_chains.get(b) if chain else None
        against = held[0] if held is not None else ""
        compact = compact or chain
        try:
            enc = await self.pull_signed(peer, PayloadKind.BLOCK_STATE, current=True, compact=compact, against=against)
        except ValidationError:
            if not against:
                raise
            # refused as asked (a peer from before chained pulls) or not as asked: the block itself, a new chain
            held, against = None, ""
            enc = await self.pull_signed(peer, PayloadKind.BLOCK_STATE, current=True, compact=compact)
        if enc.header.kind == PayloadKind.BLOCK_DELTA.to_pb() and held is not None:
            tensors = self.chain_pulled(enc, b, held)
        else:
            tensors = self.decode_block(enc, b)
            if compact:  # what a mid-round pull of its working weights may come as a delta against
                self.pulled_compact[b] = (enc.header.base_hash, tensors)
        if chain:
            self.held_chains[b] = (await asyncio.to_thread(weights_hash, tensors), tensors)
        return tensors

    def chain_pulled(
        self, enc: Encoded, block_index: int, held: tuple[str, dict[str, torch.Tensor]]
    ) -> dict[str, torch.Tensor]:
        """The next chain state from a chain step against `held` (its hash and state): validated, every value
        finite; the bytes counted."""
        if enc.header.base_hash != held[0]:
            raise ValidationError(f"chain step from {enc.header.base_hash[:12] or '?'}, asked from {held[0][:12]}")
        tensors = chain_step(held[1], self.peer.decode(enc, PayloadKind.BLOCK_DELTA, block_index))
        if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
            raise ValidationError(f"block {block_index} chain step gives NaN or infinite values")
        self.peer.metrics.add_pulled(enc.wire_bytes, enc.raw_bytes)
        return tensors

    async def fetch_working(
        self, peer: PeerRecord, compact: bool = False, held: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """Another block's working weights as its peer trains them now (mid-round), signed by that peer; not checked
        against any record (nothing announces mid-round weights): swarmd.node.peers bounds their distance from the
        merged state before trajectory training runs them. compact: int8 instead of fp16, as a delta against `held`
        when that is the compact merged state fetch_block last pulled of the block and the peer still holds it."""
        b = peer.block_index
        against = self.held_hash(b, held) if compact else ""
        enc = await self.pull_signed(peer, PayloadKind.BLOCK_STATE, working=True, compact=compact, against=against)
        if enc.header.kind != PayloadKind.BLOCK_DELTA.to_pb() or not against or held is None:
            return self.decode_block(enc, b)
        if enc.header.base_hash != against:
            raise ValidationError(f"delta against {enc.header.base_hash[:12] or '?'}, asked against {against[:12]}")
        step = self.peer.decode(enc, PayloadKind.BLOCK_DELTA, b)
        tensors = {k: held[k] + step[k] for k in held}
        if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
            raise ValidationError(f"block {b} working weights hold NaN or infinite values")
        self.peer.metrics.add_pulled(enc.wire_bytes, enc.raw_bytes)
        return tensors

    def decode_block(self, enc: Encoded, block_index: int) -> dict[str, torch.Tensor]:
        """A pulled block state, validated (decode: shapes, dtypes, sizes), every value finite; the predecessor
        pulls' bytes counted (Metrics.add_pulled)."""
        tensors = self.peer.decode(enc, PayloadKind.BLOCK_STATE, block_index)
        if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
            raise ValidationError(f"block {block_index} state holds NaN or infinite values")
        self.peer.metrics.add_pulled(enc.wire_bytes, enc.raw_bytes)
        return tensors

    def held_hash(self, block_index: int, held: dict[str, torch.Tensor] | None) -> str:
        """The base_hash of `held` when it is (the very tensors of) the compact merged state last pulled of this
        block, else ""."""
        last = self.pulled_compact.get(block_index)
        if held is None or last is None or last[1].keys() != held.keys():
            return ""
        return last[0] if all(last[1][k] is held[k] for k in held) else ""

    async def pull_signed(self, peer: PeerRecord, kind: PayloadKind, **extra: bool | str | int) -> Encoded:
        """PullState of `kind` from `peer` (extra: PullStateRequest's outer_state / current / working / compact /
        against / min_round); the reply must come signed by that peer (ValidationError otherwise)."""
        p = self.peer
        request = pb.PullStateRequest(
            swarm_id=p.me.swarm_id,
            config_hash=p.me.config_hash,
            kind=kind.to_pb(),
            block_index=peer.block_index if kind.is_block else -1,
            outer_state=bool(extra.get("outer_state", False)),
            current=bool(extra.get("current", False)),
            working=bool(extra.get("working", False)),
            compact=bool(extra.get("compact", False)),
            against=str(extra.get("against", "")),
            min_round=int(extra.get("min_round", 0)),
        )
        enc = await p.transport.pull_state(peer.address, request, p.cfg.rpc_timeout_s)
        self.check_signed(enc, peer.peer_id)
        return enc

    @staticmethod
    def check_signed(enc: Encoded, peer_id: str) -> None:
        """A payload we asked `peer_id` for must come signed by it (ValidationError otherwise)."""
        if enc.header.peer_id != peer_id:
            raise ValidationError(f"state signed by {enc.header.peer_id[-6:] or '?'}, asked {peer_id[-6:]}")
        verify_payload(enc)

    async def served_state(self, request: pb.PullStateRequest) -> Encoded:
        """state_payload; asked for the round after ours (request.min_round), once this round ends, waiting at most
        ROUND_WAIT_S (or half our rpc timeout) and then answering what we hold: never longer than a caller waits."""
        p = self.peer
        if request.min_round == p.state.round + 1:
            end = time.monotonic() + min(ROUND_WAIT_S, p.cfg.rpc_timeout_s / 2)
            while p.state.round < request.min_round and time.monotonic() < end:
                await asyncio.sleep(ROUND_POLL_S)
        return self.state_payload(request)

    def state_payload(self, request: pb.PullStateRequest) -> Encoded:
        """The base (merged) block or embedding as an fp32 payload, for PullState (request.working: the block's
        working weights now as fp16, with the hash of their fp32 values: trajectory inputs of a later block;
        request.compact: either block state int8, swarmd.averaging.compact, the hash still the fp32 weights')."""
        p = self.peer
        kind = requested_kind(p.me, request)
        if request.compact:  # a frozen trajectory input elsewhere, never adopted (requested_kind: a block only)
            enc = sign_payload(self.compact_payload(request), p.identity)
            p.metrics.add_sent(enc.wire_bytes, enc.raw_bytes)
            return enc
        if request.working and kind.is_block:
            # fp16 on the wire: half the bytes; ~5e-4 relative error on weights that only run forward elsewhere
            tensors = p.state.current()[0]
            enc = encode(tensors, Codec.FP16, base_hash=weights_hash(tensors), **p.hdr(kind, p.state.round))
            enc = sign_payload(enc, p.identity)
            p.metrics.add_sent(enc.wire_bytes, enc.raw_bytes)
            return enc
        round, block, emb, momentum = p.state.snapshot_outer()
        tensors, base_hash = (block, p.state.block_hash) if kind.is_block else (emb, p.state.emb_hash)
        if (anchor := p.anchors[kind.delta]).active and anchor.tensors is not None and not request.current:
            tensors, base_hash = anchor.tensors, anchor.hash  # what the records announce (group averaging)
        if request.outer_state and momentum is not None:  # the hash stays the weights' (what records announce)
            tensors = with_momentum(tensors, momentum["block" if kind.is_block else "emb"])
        enc = sign_payload(encode(tensors, Codec.FP32, base_hash=base_hash, **p.hdr(kind, round)), p.identity)
        p.metrics.add_sent(enc.wire_bytes, enc.raw_bytes)
        return enc

    def compact_payload(self, request: pb.PullStateRequest) -> Encoded:
        """A compact pull's answer (unsigned): our merged block int8, or a step along the chain whose state hashes to
        `against` (PullChains.answer); our working weights int8, or, asked `against` the merged state we still hold,
        the working weights less that state's compact decoding as an int8 delta."""
        p = self.peer
        block, block_hash = p.state.named_snapshot()[::2]
        if not request.working:
            return self.chains.answer(block, block_hash, p.state.round, request.against)
        working = p.state.current()[0]
        if request.against and request.against == block_hash:
            held = self.compact_held(block, block_hash)
            step = {k: working[k] - held[k] for k in held}
            return encode_delta(step, base_hash=block_hash, **p.hdr(PayloadKind.BLOCK_DELTA, p.state.round))
        return encode_compact(working, base_hash=weights_hash(working), **p.hdr(PayloadKind.BLOCK_STATE, p.state.round))

    def compact_held(self, block: dict[str, torch.Tensor], block_hash: str) -> dict[str, torch.Tensor]:
        """What a peer holds of our merged block pulled compact: its compact decoding (deterministic; the last one
        kept, by hash)."""
        if self._held is None or self._held[0] != block_hash:
            self._held = (block_hash, compact_decoding(block, self.peer.me.block_index))
        return self._held[1]
