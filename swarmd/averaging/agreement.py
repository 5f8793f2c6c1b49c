"""State agreement: which state a peer's block and embedding must hold, and getting there (re-sync).

- re-sync (sync): the reference of a block is its peer with the highest (round, server mode,
  peer id) among the records at the highest round seen; a peer whose base hash differs from its
  reference adopts the reference's state by PullState. The embedding works the same over all
  peers. Joiners go through the same rule before their first step, so nobody sends a delta
  computed from weights the swarm does not share;
- trust: only signed records count; a re-sync target must be announced by a quorum of the
  signed records (swarmd.membership.quorum: agreeing(), round_backed()), the pulled state must come
  signed by the peer asked and hash to what they announce, and the round counter moves at most
  cfg.max_round_jump per re-sync;
- split rounds: when last round's signed deltas showed a quorum of peers on another base, the side with
  fewer peers moves (the DHT records may lag), to the state and its round (at most pulls.SPLIT_BACK_ROUNDS
  back); when the records show no quorum anywhere (a part in pieces), the largest side of 2 or more will do;
  a peer that trained apart (a partition) and is ahead rejoins the majority it split from
  (diverged_majority, over the last HISTORY_ROUNDS own base hashes);
- isolation (swarmd.averaging.rejoin): a peer that accepted no delta of a part for rejoin.ISOLATED_ROUNDS
  rounds asks the fresh signed states and adopts a fresh quorum's, or reconciles with the other members;
- verified adoption (swarmd.averaging.adoption): with a held-out check (PeerContext.check) and a finite
  cfg.adopt_tolerance, every state above is pulled and validated first, both parts, and adopted only after it
  was scored with the other part it would be held with: one worse than what we hold by more than the tolerance
  is refused, whatever number of signed records backs it, and its round counter is not taken; a refused hash
  is not pulled again for adoption.REFUSAL_TTL_S. Where we are the side that trained apart (a diverged majority,
  a rejoin rule's state, a split round's move) the state is judged against the last one we held with others
  too (Agreement.agreed), so a peer that got ahead alone still rejoins. A joiner (round 0: fresh weights) also
  pulls the other states several peers announce (quorum.candidates, JOIN_CANDIDATES per part) and takes the
  best that passes, its initial weights included; the identities whose records announce the states it adopted count
  for it from then on, without probation (Standing.admit_incumbents);
- pulls and serving (swarmd.averaging.pulls.StatePulls): the signed states pulled and validated before any of the
  above adopts one, and served_state, the PullState answer (the base, or the anchor the records announce).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import torch

from swarmd.averaging import rejoin
from swarmd.averaging.adoption import Candidate, Refusals, Verdict, choose, options
from swarmd.averaging.context import BLOCK, EMB, PeerContext
from swarmd.averaging.pulls import StatePulls
from swarmd.errors import ValidationError
from swarmd.membership.quorum import (
    agreeing,
    candidates,
    diverged_majority,
    quorum,
    reference,
    round_backed,
    split_reference,
)
from swarmd.membership.records import PeerRecord
from swarmd.protocol import PayloadKind

logger = logging.getLogger(__name__)

HISTORY_ROUNDS = 16  # rounds of our own base hashes kept to tell a lagging majority from a diverged one
JOIN_CANDIDATES = 3  # distinct states of each part a joiner pulls and scores (the normal target included)


def announced(kind: PayloadKind) -> Callable[[PeerRecord], str]:
    """What a record announces of a part: its block's base hash, or its byte table's hash."""
    return (lambda r: r.base_hash) if kind.is_block else (lambda r: r.emb_hash)


def announcers(adopted: list[Candidate], block_pool: list[PeerRecord], pool: list[PeerRecord]) -> set[str]:
    """The peers that served the adopted states or whose records announce them (a block state among the block's
    records, a byte table among all)."""
    ids = set()
    for c in adopted:
        weights = announced(c.kind)
        ids |= {r.peer_id for r in (block_pool if c.kind.is_block else pool) if weights(r) == c.weights}
        ids |= {c.peer_id} - {""}
    return ids


class Agreement:
    """One peer's state agreement: re-sync, rejoin, verified adoption (see the module doc); its pulls and the states it
    serves are StatePulls' (self.pulls).

    :param peer: the context the round protocol (swarmd.averaging.exchange) holds too
    """

    def __init__(self, peer: PeerContext):
        self.peer = peer
        self.pulls = StatePulls(peer)  # what it pulls from others, and the states it serves
        self.history: dict[str, dict[int, str]] = {"block": {}, "embedding": {}}  # part -> round -> our base hash
        self.isolated = {BLOCK: 0, EMB: 0}  # rounds in a row without an accepted delta of that kind (rejoin)
        self.refusals = Refusals()  # states the held-out check refused (verified adoption)
        # kind -> the last base we held with other peers (merged with them, or adopted): a side that trained apart
        # is judged against it too (adoption.choose); base tensors are rebound, never written, so no copy is made
        self.agreed: dict[PayloadKind, dict[str, torch.Tensor]] = {}

    @property
    def verifying(self) -> bool:
        """Whether adoptions are scored on the held-out sample (a check and a finite adopt_tolerance)."""
        return self.peer.check is not None and self.peer.cfg.adopt_tolerance < float("inf")

    async def sync(self, records: list[PeerRecord]) -> list[str]:
        """Adopt the reference's block and embedding if our base differs (see module doc); returns what was adopted.

        Only signed records count, and only a state that a quorum of them announces (agreeing()) can be
        the reference; the pulled state must hash to what they announce, and the round counter moves
        at most cfg.max_round_jump rounds per adoption. Both parts are pulled before either is adopted, and
        with verified adoption on, adopted only if they pass the held-out check together or alone.
        """
        p = self.peer
        me = p.record()
        others = [
            r
            for r in p.remember(records)
            if r.peer_id != me.peer_id and r.config_hash == me.config_hash and r.swarm_id == me.swarm_id
        ]
        joining = self.verifying and p.state.round == 0  # fresh weights: compare what the swarm offers
        # identities past probation and within the range cap, vouched per quorum: the block's peers among themselves
        # (vouched over the whole swarm first, other blocks' older identities could fill the cap of a shared range
        # and leave the block nobody to count: a split it never moves out of)
        ours = p.standing.vouched([r for r in others if r.block_index == me.block_index], joining=p.state.round == 0)
        others = p.standing.vouched(others, joining=p.state.round == 0)
        found: dict[PayloadKind, list[Candidate]] = {}
        for kind, pool in ((PayloadKind.BLOCK_STATE, ours), (PayloadKind.EMBEDDING_STATE, others)):
            found[kind] = await self._candidates(kind, me, pool, others, joining)
        p.last_split = {}  # consumed
        chosen = await self._adopt_passing(found[PayloadKind.BLOCK_STATE], found[PayloadKind.EMBEDDING_STATE], joining)
        if joining:  # the incumbents whose records announce what we adopted count for us from now on
            p.standing.admit_incumbents(me.round, announcers(chosen, ours, others))
        return [c.kind.part for c in chosen]

    async def _candidates(
        self, kind: PayloadKind, me: PeerRecord, pool: list[PeerRecord], others: list[PeerRecord], joining: bool
    ) -> list[Candidate]:
        """The states of one part this sync may adopt, pulled and validated, none adopted: the re-sync target
        (reference, diverged majority, split round) or the rejoin rule's state, then a joiner's other candidates."""
        p = self.peer
        weights = announced(kind)
        if kind.delta in p.last_split:  # a round was merged since the last sync: were we isolated in it?
            alone = not p.last_split[kind.delta][0] and bool(pool)
            self.isolated[kind.delta] = self.isolated[kind.delta] + 1 if alone else 0
            if p.last_split[kind.delta][0]:  # merged with others: what we hold now is a state we agreed on
                with p.state.lock:
                    self.agreed[kind.delta] = dict(p.base(kind.delta)[0])
        history = self.history[kind.part]
        history[me.round] = weights(me)
        for old in sorted(history)[:-HISTORY_ROUNDS]:
            del history[old]
        held = agreeing(pool, weights)  # the records a quorum announces (none: the part is in pieces)
        ref = reference(me, held, weights)
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
        found: list[Candidate] = []
        target: PeerRecord | None = ref
        expect: tuple[str, int] | None = (weights(ref), ref.round)
        if ref.peer_id == me.peer_id or (weights(ref) == weights(me) and ref.round == me.round):
            split = p.last_split.get(kind.delta, (set(), {}))  # DHT records may lag: use last round's exchanges
            target = split_reference(me, pool, *split, fragmented=not held)
            expect = None  # the signed deltas said where it is; its state must hash as it signs
            if target is None and self.isolated[kind.delta] >= rejoin.ISOLATED_ROUNDS:
                fresh = await self._rejoin(kind, pool)
                found += [fresh] if fresh is not None else []
        if target is not None and self.refusals.refused(weights(target), target.peer_id):
            logger.debug("%s not pulling the %s of %s again: refused", p.tag, kind.part, target.peer_id[-6:])
        elif target is not None:
            limit = me.round + p.cfg.max_round_jump
            apart = majority is not None or expect is None  # rejoining a majority, or a split round's move
            # both move to the state's own round, back too: a peer a round ahead that kept its round counter with
            # the state of a peer a round behind would hold a (round, weights) pair nobody else does, and every
            # delta it sends would be refused for its base (a split that never heals)
            got = await self.pulls.try_fetch(target, kind, expect, limit, back=apart, apart=apart)
            found += [got] if got is not None else []
        if joining:
            found += await self._join_candidates(kind, me, pool, others, {c.weights for c in found})
        return [c for c in found if not self.refusals.refused(c.weights)]

    async def _join_candidates(
        self, kind: PayloadKind, me: PeerRecord, pool: list[PeerRecord], others: list[PeerRecord], have: set[str]
    ) -> list[Candidate]:
        """A joiner's other candidates: the distinct states several peers announce (quorum.candidates), pulled
        concurrently, at most JOIN_CANDIDATES of the part in all (the `have` ones count)."""
        p = self.peer
        weights = announced(kind)

        def can_pull(r: PeerRecord) -> bool:
            fresh = weights(r) not in have and not self.refusals.refused(weights(r), r.peer_id)
            return bool(r.address) and p.usable(r) and fresh

        picked = candidates(me, pool, weights, max(0, JOIN_CANDIDATES - len(have)), can_pull, swarm=others)
        limit = me.round + p.cfg.max_round_jump
        got = await asyncio.gather(*(self.pulls.try_fetch(r, kind, (weights(r), r.round), limit) for r in picked))
        return [c for c in got if c is not None]

    async def _adopt_passing(self, blocks: list[Candidate], embs: list[Candidate], joining: bool) -> list[Candidate]:
        """Adopt the candidates of both parts that pass the held-out check (all first ones when not verifying);
        returns the candidates adopted."""
        if not blocks and not embs:
            return []
        if not self.verifying:
            chosen: tuple[Candidate | None, ...] = (blocks[0] if blocks else None, embs[0] if embs else None)
        else:
            verdict = await self._judge(blocks, embs, joining)
            chosen = verdict.chosen or ()
        adopted = []
        # the higher round last: a part adopted `back` after the other moved the round counter below the first one's
        # round, a (round, weights) pair nobody holds (a restart's block of 112, a table of 110: apart 10 rounds)
        for c in sorted((c for c in chosen if c is not None), key=lambda c: c.round):
            await self._adopt(c)
            adopted.append(c)
        return adopted

    async def _judge(self, blocks: list[Candidate], embs: list[Candidate], joining: bool) -> Verdict:
        """Score every option (adoption.options) on the held-out sample against what we hold and choose; log and
        count each refusal, and remember it (adoption.Refusals)."""
        p = self.peer
        check = p.check
        assert check is not None  # verifying
        _, own_block, own_emb = p.state.snapshot()
        ours = await asyncio.to_thread(check.score, own_block, own_emb)
        agreed = None
        if any(c.apart for c in (*blocks, *embs)) and (BLOCK in self.agreed or EMB in self.agreed):
            then = self.agreed.get(BLOCK, own_block), self.agreed.get(EMB, own_emb)
            agreed = await asyncio.to_thread(check.score, *then)
        scored = []
        for b, e in options(blocks, embs):
            block, emb = (b.tensors if b else own_block), (e.tensors if e else own_emb)
            scored.append(((b, e), await asyncio.to_thread(check.score, block, emb)))
        verdict = choose(scored, ours, p.cfg.adopt_tolerance, joining, agreed)
        for c, ce, threshold in verdict.refused:
            p.metrics.refuse_adoption(c.kind.part)
            for peer_id, named in c.also_served:
                self.refusals.add(peer_id, c.weights, named)
            if self.refusals.add(c.peer_id, c.weights, c.announced):
                logger.warning(
                    "%s refused the %s state of %s (%s, round %d): held-out CE %.4f, ours %.4f%s, limit %.4f",
                    p.tag,
                    c.kind.part,
                    c.source,
                    c.weights,
                    c.round,
                    ce,
                    verdict.ours,
                    f" (last agreed {verdict.agreed:.4f})" if verdict.agreed is not None and c.apart else "",
                    threshold,
                )
        return verdict

    async def _rejoin(self, kind: PayloadKind, pool: list[PeerRecord]) -> Candidate | None:
        """An isolated peer asks the fresh signed states (swarmd.averaging.rejoin): a fresh quorum's state, or after
        holding still the reconciliation of the members; returns the state to adopt (None: none), not adopted.

        Peers whose announced state was refused (verified adoption) are not asked, and a refused fresh state
        does not count."""
        p = self.peer
        self.isolated[kind.delta] = 0  # one attempt per ISOLATED_ROUNDS isolated rounds
        of_record = announced(kind)
        askable = (r for r in pool if r.address and p.usable(r) and not self.refusals.refused(of_record(r), r.peer_id))
        peers = sorted(askable, key=lambda r: r.peer_id)[: rejoin.MAX_PULLS]
        named = {r.peer_id: of_record(r) for r in peers}
        need = quorum(len({r.peer_id for r in pool}))
        prev: dict[str, tuple[int, str]] | None = None
        settled: tuple = ()
        for _ in range(rejoin.HOLD_TRIES):
            answers = await asyncio.gather(*(self.pulls.fresh_state(r, kind) for r in peers), return_exceptions=True)
            # a member that did not answer (a paused or dead peer: each try would wait rpc_timeout_s for it) is not
            # asked again in this attempt: holding still stays HOLD_TRIES x HOLD_S past the first pull
            peers = [r for r, a in zip(peers, answers, strict=True) if not isinstance(a, BaseException)]
            fresh = {
                h.peer_id: (h, t)
                for a in answers
                if not isinstance(a, BaseException)
                for h, t in (a,)
                if not self.refusals.refused(h.weights)
            }
            round, block, emb = p.state.snapshot()
            own_hash = p.state.block_hash if kind.is_block else p.state.emb_hash
            mine = rejoin.Held(p.me.peer_id, round, own_hash, p.me.client_mode)
            target = rejoin.fresh_majority(mine, [h for h, _ in fresh.values()], need)
            if target is not None:
                tensors, what = fresh[target.peer_id][1], "a quorum's fresh signed state"
                group = tuple((pid, named[pid]) for pid, (h, _) in fresh.items() if h.key == target.key)
                return Candidate(
                    kind,
                    target.peer_id,
                    target.weights,
                    target.round,
                    tensors,
                    back=True,
                    rejoined=what,
                    announced=named[target.peer_id],
                    also_served=tuple(g for g in group if g[0] != target.peer_id),
                    apart=True,
                )
            if any(h.key == mine.key for h, _ in fresh.values()):
                return None  # others hold our weights: a group larger than ours would have been adopted above
            members = {**fresh, mine.peer_id: (mine, block if kind.is_block else emb)}
            if len(members) < 3:
                return None  # fresh_majority decides between two; nothing to reconcile
            now = {pid: h.key for pid, (h, _) in members.items()}
            if prev is not None and rejoin.stable(prev, now, settled[1:]):
                what = f"the reconciliation of {len(prev)} members"
                return Candidate(kind, "", settled[2], settled[1], settled[0], back=True, rejoined=what, apart=True)
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
        return None

    async def _adopt(self, c: Candidate) -> None:
        """Adopt a candidate with its round: forward to it (at most its round_limit, default max_round_jump ahead),
        or back to it too for a `back` one (a majority we ran ahead of, a rejoin rule's state)."""
        p = self.peer
        limit = c.round_limit if c.round_limit is not None else p.state.round + p.cfg.max_round_jump
        new_round = min(c.round, limit) if c.back else max(p.state.round, min(c.round, limit))
        if new_round < c.round:
            logger.warning("%s round counter capped at %d (the swarm says %d)", p.tag, new_round, c.round)
        block, emb = (c.tensors, None) if c.kind.is_block else (None, c.tensors)
        momentum = {"block" if c.kind.is_block else "emb": c.momentum} if c.momentum else None
        await asyncio.to_thread(p.state.adopt, block, emb, new_round, momentum)
        p.ef[c.kind.delta].reset()
        self.agreed[c.kind.delta] = c.tensors  # what others hold
        if c.rejoined:
            logger.warning("%s rejoined: adopted the %s of %s (round %d)", p.tag, c.kind.part, c.rejoined, new_round)
            return
        p.anchors[c.kind.delta].clear()  # the adopted state is what the quorum shares: our anchor again
        logger.info("%s adopted the %s of %s (round %d)", p.tag, c.kind.part, c.source, c.round)

    async def pull(
        self,
        peer: PeerRecord,
        kind: PayloadKind,
        expect: tuple[str, int] | None = None,
        round_limit: int | None = None,
        back: bool = False,
    ) -> None:
        """Download a peer's block or embedding state (signed, validated), check it on the held-out sample with the
        other part we hold (verified adoption on), and adopt it with its round.

        :param kind: PayloadKind.BLOCK_STATE or PayloadKind.EMBEDDING_STATE
        :param expect: (weights hash, round) the quorum's signed records announce: the state must hash to it
            and carry that round (None: it must hash to what its own signed header says)
        :param round_limit: the round counter never moves past this (default: cfg.max_round_jump ahead)
        :param back: the round counter may move back to the state's (rejoining a majority we ran ahead of)
        :raises ValidationError: unsigned, not from `peer`, not the announced weights, or refused by the held-out
            check; StaleRound: the peer has moved to another round since its record
        """
        c = await self.pulls.fetch(peer, kind, expect, round_limit, back)
        c.apart = back
        if self.verifying:
            verdict = await self._judge([c] if kind.is_block else [], [] if kind.is_block else [c], joining=False)
            if verdict.chosen is None:
                raise ValidationError(f"the held-out check refused the {kind.part} state of {peer.peer_id[-6:]}")
        await self._adopt(c)
