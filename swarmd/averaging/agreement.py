"""State agreement: which state a peer's block and embedding must hold, and getting there (re-sync).

- re-sync (sync): the reference of a block is its peer with the highest (round, server mode,
  peer id) among the records at the highest round seen; a peer whose base hash differs from its
  reference adopts the reference's state by PullState. The embedding works the same over all
  peers. Joiners go through the same rule before their first step, so nobody sends a delta
  computed from weights the swarm does not share;
- trust (issue 9): only signed records count; a re-sync target must be announced by a quorum of the
  signed records (swarmd.membership.quorum: agreeing(), round_backed()), the pulled state must come
  signed by the peer asked and hash to what they announce, and the round counter moves at most
  cfg.max_round_jump per re-sync;
- split rounds: when last round's signed deltas showed a quorum of peers on another base, the side with
  fewer peers moves (the DHT records may lag); a peer that trained apart (a partition) and is ahead
  rejoins the majority it split from (diverged_majority, over the last HISTORY_ROUNDS own base hashes);
- isolation (swarmd.averaging.rejoin): a peer that accepted no delta of a part for rejoin.ISOLATED_ROUNDS
  rounds asks the fresh signed states and adopts a fresh quorum's, or reconciles with the other members;
- serving: state_payload answers PullState with the base (or the anchor the records announce), signed.
"""

from __future__ import annotations

import asyncio
import logging

import torch

from swarmd.averaging import rejoin
from swarmd.averaging.context import BLOCK, EMB, PeerContext, payload_kind
from swarmd.averaging.delta import encode
from swarmd.averaging.outer import split_momentum, with_momentum
from swarmd.averaging.state import weights_hash
from swarmd.errors import StaleRound, SwarmdError, ValidationError, WrongBlock
from swarmd.membership.quorum import agreeing, diverged_majority, quorum, rank, reference, round_backed
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import sign_payload, verify_payload
from swarmd.protocol import Codec, PayloadKind
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)

REJOIN_AHEAD_ROUNDS = 8  # a majority member asked for its state may have merged this many rounds since its record
HISTORY_ROUNDS = 16  # rounds of our own base hashes kept to tell a lagging majority from a diverged one


class Agreement:
    """One peer's state agreement: re-sync, rejoin, pulls, and the states it serves (see the module doc).

    :param peer: the context the round protocol (swarmd.averaging.exchange) holds too
    """

    def __init__(self, peer: PeerContext):
        self.peer = peer
        self.history: dict[str, dict[int, str]] = {"block": {}, "embedding": {}}  # part -> round -> our base hash
        self.isolated = {BLOCK: 0, EMB: 0}  # rounds in a row without an accepted delta of that kind (rejoin)

    async def sync(self, records: list[PeerRecord]) -> list[str]:
        """Adopt the reference's block and embedding if our base differs (see module doc); returns what was pulled.

        Only signed records count, and only a state that a quorum of them announces (agreeing()) can be
        the reference; the pulled state must hash to what they announce, and the round counter moves
        at most cfg.max_round_jump rounds per adoption.
        """
        p = self.peer
        me = p.record()
        others = [
            r
            for r in p.remember(records)
            if r.peer_id != me.peer_id and r.config_hash == me.config_hash and r.swarm_id == me.swarm_id
        ]
        pulled = []
        for kind, pool in (
            (PayloadKind.BLOCK_STATE, [r for r in others if r.block_index == me.block_index]),
            (PayloadKind.EMBEDDING_STATE, others),
        ):
            weights = (lambda r: r.base_hash) if kind.is_block else (lambda r: r.emb_hash)
            if kind.delta in p.last_split:  # a round was merged since the last sync: were we isolated in it?
                alone = not p.last_split[kind.delta][0] and bool(pool)
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
                    p.tag,
                    kind.part,
                    majority.round,
                    me.round,
                )
                ref = majority
            elif ref.peer_id != me.peer_id and not round_backed(ref.round, others):
                logger.warning(
                    "%s not adopting the %s of %s: too few of the swarm's signed records announce its round %d",
                    p.tag,
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
                    ref, kind, expect, round_limit=me.round + p.cfg.max_round_jump, back=majority is not None
                )
                pulled.append(kind.part)
            except SwarmdError as exc:
                logger.warning("%s re-sync of the %s from %s failed: %s", p.tag, kind.part, ref.peer_id[-6:], exc)
                if not isinstance(exc, (ValidationError, StaleRound)):
                    p.bans.fail(ref.peer_id)
        p.last_split = {}  # consumed
        return pulled

    def _split_reference(self, kind: PayloadKind, me: PeerRecord, pool: list[PeerRecord]) -> PeerRecord | None:
        """Whom to adopt after last round's exchanges showed peers on another base (None: stay).

        The side with fewer peers on its base moves; on a tie the lower-ranked side moves (the
        same rule as reference(), applied to the signed deltas' headers instead of DHT records). The
        other side must also hold a quorum of the peers seen (one stray signer never moves anybody).
        """
        p = self.peer
        same, other = p.last_split.get(kind.delta, (set(), set()))
        if not other or len(other) < quorum(len({r.peer_id for r in pool})):
            return None
        candidates = [r for r in pool if r.peer_id in other and r.address]
        if not candidates:
            return None
        best = max(candidates, key=rank)
        if len(other) > len(same) or (len(other) == len(same) and rank(best) > rank(me)):
            return best
        return None

    async def _pull_signed(self, peer: PeerRecord, kind: PayloadKind, **extra: bool) -> Encoded:
        """PullState of `kind` from `peer` (extra: PullStateRequest's outer_state / current); the reply must come
        signed by that peer (ValidationError otherwise)."""
        p = self.peer
        request = pb.PullStateRequest(
            swarm_id=p.me.swarm_id,
            config_hash=p.me.config_hash,
            kind=kind.to_pb(),
            block_index=peer.block_index if kind.is_block else -1,
            **extra,
        )
        enc = await p.transport.pull_state(peer.address, request, p.cfg.rpc_timeout_s)
        self._check_signed(enc, peer.peer_id)
        return enc

    async def _fresh_state(self, peer: PeerRecord, kind: PayloadKind) -> tuple[rejoin.Held, dict[str, torch.Tensor]]:
        """A peer's current state, signed by it and hashing to the weights its own signed header names."""
        p = self.peer
        enc = await self._pull_signed(peer, kind)
        tensors = p.decode(enc, kind, p.me.block_index if kind.is_block else -1)
        if (got := await asyncio.to_thread(weights_hash, tensors)) != enc.header.base_hash:
            raise ValidationError(f"pulled state hashes to {got}, its signed header says {enc.header.base_hash}")
        return rejoin.Held(peer.peer_id, int(enc.header.round), got, peer.client_mode), tensors

    async def _rejoin(self, kind: PayloadKind, pool: list[PeerRecord]) -> bool:
        """An isolated peer asks the fresh signed states (swarmd.averaging.rejoin): adopt a fresh quorum's state, or
        hold still and reconcile with the other members; returns whether a state was adopted."""
        p = self.peer
        self.isolated[kind.delta] = 0  # one attempt per ISOLATED_ROUNDS isolated rounds
        peers = sorted((r for r in pool if r.address and p.usable(r)), key=lambda r: r.peer_id)[: rejoin.MAX_PULLS]
        need = quorum(len({r.peer_id for r in pool}))
        prev: dict[str, tuple[int, str]] | None = None
        settled: tuple = ()
        for _ in range(rejoin.HOLD_TRIES):
            answers = await asyncio.gather(*(self._fresh_state(r, kind) for r in peers), return_exceptions=True)
            fresh = {h.peer_id: (h, t) for a in answers if not isinstance(a, BaseException) for h, t in (a,)}
            round, block, emb = p.state.snapshot()
            own_hash = p.state.block_hash if kind.is_block else p.state.emb_hash
            mine = rejoin.Held(p.me.peer_id, round, own_hash, p.me.client_mode)
            target = rejoin.fresh_majority(mine, [h for h, _ in fresh.values()], need)
            if target is not None:
                await self._adopt_fresh(kind, fresh[target.peer_id][1], target.round, "a quorum's fresh signed state")
                return True
            if any(h.key == mine.key for h, _ in fresh.values()):
                return False  # others hold our weights: a group larger than ours would have been adopted above
            members = {**fresh, mine.peer_id: (mine, block if kind.is_block else emb)}
            if len(members) < 3:
                return False  # fresh_majority decides between two; nothing to reconcile
            now = {pid: h.key for pid, (h, _) in members.items()}
            if prev is not None and rejoin.stable(prev, now, settled[1:]):
                await self._adopt_fresh(kind, settled[0], settled[1], f"the reconciliation of {len(prev)} members")
                return True
            prev = now
            states, rounds = (
                {pid: t for pid, (_, t) in members.items()},
                {pid: h.round for pid, (h, _) in members.items()},
            )
            settled = await asyncio.to_thread(rejoin.reconcile, states, rounds, p.cfg.trim_fraction)
            logger.warning(
                "%s isolated and no quorum of the %s among %d fresh states: holding still to reconcile",
                p.tag,
                kind.part,
                len(members),
            )
            await asyncio.sleep(rejoin.HOLD_S)  # hold still: what we serve stays put while the others catch up
        return False

    async def _adopt_fresh(self, kind: PayloadKind, tensors: dict[str, torch.Tensor], round: int, what: str) -> None:
        """Adopt a state the rejoin rule chose, the round counter moving back to it or at most max_round_jump ahead."""
        p = self.peer
        new_round = min(round, p.state.round + p.cfg.max_round_jump)
        block, emb = (tensors, None) if kind.is_block else (None, tensors)
        await asyncio.to_thread(p.state.adopt, block, emb, new_round)
        p.ef[kind.delta].reset()
        logger.warning("%s rejoined: adopted the %s of %s (round %d)", p.tag, kind.part, what, new_round)

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
        p = self.peer
        outer = p.state.outer is not None  # adopt the reference's outer buffer with its weights
        enc = await self._pull_signed(peer, kind, outer_state=outer)
        h = enc.header
        want_hash, want_round = expect if expect is not None else (h.base_hash, int(h.round))
        if back and expect is not None and want_round < int(h.round) <= want_round + REJOIN_AHEAD_ROUNDS:
            # rejoining a majority: the member asked has merged on since its record (fast rounds, lagging
            # records); its own signed, newer state on that trajectory is what the majority holds now
            want_hash, want_round = h.base_hash, int(h.round)
        if h.base_hash != want_hash or int(h.round) != want_round:
            raise StaleRound(f"state of round {h.round} ({h.base_hash}), records announce {want_round} ({want_hash})")
        tensors, momentum = split_momentum(p.decode(enc, kind, p.me.block_index if kind.is_block else -1, outer))
        if momentum is not None:  # not covered by the announced hash: bounded like the merges it sums
            p.check_norm(momentum, kind.delta, 1.0 / (1.0 - p.cfg.outer_momentum))
        if (got := await asyncio.to_thread(weights_hash, tensors)) != want_hash:
            raise ValidationError(f"pulled state hashes to {got}, its peer announced {want_hash}")
        block, emb = (tensors, None) if kind.is_block else (None, tensors)
        limit = round_limit if round_limit is not None else p.state.round + p.cfg.max_round_jump
        new_round = min(want_round, limit) if back else max(p.state.round, min(want_round, limit))
        if new_round < want_round:
            logger.warning("%s round counter capped at %d (the swarm says %d)", p.tag, new_round, want_round)
        part = "block" if kind.is_block else "emb"
        await asyncio.to_thread(p.state.adopt, block, emb, new_round, {part: momentum} if momentum else None)
        p.ef[kind.delta].reset()
        p.anchors[kind.delta].clear()  # the adopted state is what the quorum shares: our anchor again
        logger.info("%s adopted the %s of %s (round %d)", p.tag, kind.part, peer.peer_id[-6:], enc.header.round)

    async def fetch_block(self, peer: PeerRecord) -> dict[str, torch.Tensor]:
        """Download (and validate) another peer's block state without adopting it (CE measurement)."""
        p = self.peer
        enc = await self._pull_signed(peer, PayloadKind.BLOCK_STATE, current=True)  # its merged block, not its anchor
        return p.decode(enc, PayloadKind.BLOCK_STATE, peer.block_index)

    @staticmethod
    def _check_signed(enc: Encoded, peer_id: str) -> None:
        """A payload we asked `peer_id` for must come signed by it (ValidationError otherwise)."""
        if enc.header.peer_id != peer_id:
            raise ValidationError(f"state signed by {enc.header.peer_id[-6:] or '?'}, asked {peer_id[-6:]}")
        verify_payload(enc)

    def state_payload(self, request: pb.PullStateRequest) -> Encoded:
        """The base (merged) block or embedding as an fp32 payload, for PullState."""
        p = self.peer
        if request.swarm_id != p.me.swarm_id or request.config_hash != p.me.config_hash:
            raise ValidationError("pull request for another swarm or model config")
        kind = payload_kind(request.kind)
        if kind not in (PayloadKind.BLOCK_STATE, PayloadKind.EMBEDDING_STATE):
            raise ValidationError(f"unknown state kind {kind or request.kind!r}")
        if kind.is_block and request.block_index != p.me.block_index:
            raise WrongBlock(f"this peer trains block {p.me.block_index}, not {request.block_index}")
        round, block, emb, momentum = p.state.snapshot_outer()
        tensors, base_hash = (block, p.state.block_hash) if kind.is_block else (emb, p.state.emb_hash)
        if (anchor := p.anchors[kind.delta]).active and anchor.tensors is not None and not request.current:
            tensors, base_hash = anchor.tensors, anchor.hash  # what the records announce (group averaging)
        if request.outer_state and momentum is not None:  # the hash stays the weights' (what records announce)
            tensors = with_momentum(tensors, momentum["block" if kind.is_block else "emb"])
        enc = sign_payload(encode(tensors, Codec.FP32, base_hash=base_hash, **p.hdr(kind, round)), p.identity)
        p.metrics.add_sent(enc.wire_bytes, enc.raw_bytes)
        return enc
