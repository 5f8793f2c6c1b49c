"""Issue 21 item 1, verified adoption: a peer scores every state it would adopt on its held-out sample
(swarmd.averaging.validation.HeldOutCheck) and refuses one worse than what it holds, whatever number of signed
records backs it (swarmd.averaging.adoption, swarmd.averaging.agreement).

Fast: the pure rules, and in-memory Gossip peers (tests/swarm_utils.memory_swarm with checks=True: the real
HeldOutCheck on the tiny model) where three signed identities announce a higher round and serve a poisoned state.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import replace

import pytest
import torch
from swarm_utils import batches, memory_round, memory_swarm, tiny_train

from swarmd.averaging import rejoin
from swarmd.averaging.adoption import Candidate, Refusals, choose, options
from swarmd.averaging.context import BLOCK, EMB
from swarmd.averaging.state import weights_hash
from swarmd.membership.quorum import candidates
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import sign_record
from swarmd.protocol import PayloadKind
from swarmd.v1 import swarm_pb2 as pb

pytestmark = pytest.mark.usefixtures("one_thread")

HONEST, SYBILS, JOINER = (0, 1), (2, 3, 4), 5
# every peer holds the real held-out check; the merge check (issue 21 item 2, swarmd.averaging.merge) is off, so
# what these tests see is the adoption check alone
CHECKED = dict(checks=True, deadline_max_s=1.0, merge_check_tolerance=math.inf)


# -- the pure rules -----------------------------------------------------------------------------------
def _cand(kind: PayloadKind, name: str) -> Candidate:
    return Candidate(kind, name, name, 1, {})


def test_options_put_both_parts_first_and_the_normal_target_before_the_others():
    b1, b2, e1 = _cand(BLOCK.state, "b1"), _cand(BLOCK.state, "b2"), _cand(EMB.state, "e1")
    assert options([b1, b2], [e1]) == [(b1, e1), (b1, None), (b2, e1), (b2, None), (None, e1)]
    assert options([], [e1]) == [(None, e1)] and options([], []) == []


def test_choose_refuses_a_worse_state_and_keeps_the_part_that_passes():
    b, e = _cand(BLOCK.state, "b"), _cand(EMB.state, "e")
    # both parts together pass: both adopted
    v = choose([((b, e), 2.40), ((b, None), 2.41), ((None, e), 2.39)], ours=2.38, tolerance=0.05, joining=False)
    assert v.chosen == (b, e) and v.refused == []
    # a poisoned block: refused (its best figure logged), the embedding alone is adopted
    v = choose([((b, e), 8.7), ((b, None), 8.6), ((None, e), 2.37)], ours=2.38, tolerance=0.05, joining=False)
    assert v.chosen == (None, e) and [(c.peer_id, s, round(t, 2)) for c, s, t in v.refused] == [("b", 8.6, 2.43)]
    # garbage that does not even score (inf) is refused, and nothing is adopted
    v = choose([((b, None), math.inf)], ours=2.38, tolerance=0.05, joining=False)
    assert v.chosen is None and [c for c, *_ in v.refused] == [b]


def test_a_joiner_takes_the_best_that_passes_preferring_the_normal_target_within_the_tolerance():
    b1, b2 = _cand(BLOCK.state, "b1"), _cand(BLOCK.state, "b2")
    # both beat the initial weights (5.6), b2 by far: a joiner takes b2, a trained peer would have taken b1
    v = choose([((b1, None), 4.6), ((b2, None), 3.3)], ours=5.6, tolerance=0.05, joining=True)
    assert v.chosen == (b2, None) and [c for c, *_ in v.refused] == [b1]
    assert choose([((b1, None), 4.6), ((b2, None), 3.3)], ours=5.6, tolerance=0.05, joining=False).chosen == (b1, None)
    # within the tolerance of the best: the normal target (first) wins, nothing refused
    v = choose([((b1, None), 3.32), ((b2, None), 3.30)], ours=5.6, tolerance=0.05, joining=True)
    assert v.chosen == (b1, None) and v.refused == []


def test_a_side_that_trained_apart_is_judged_against_where_it_last_agreed_too():
    """A peer that trained alone (2.1) rejoins a majority (4.1) that is no worse than the state it split from (4.6);
    a poisoned majority (8.7) is worse than both and refused; a re-sync target not apart gets no such leeway."""
    majority, poison, resync = _cand(BLOCK.state, "m"), _cand(BLOCK.state, "p"), _cand(BLOCK.state, "r")
    majority.apart = poison.apart = True
    assert choose([((majority, None), 4.1)], ours=2.1, tolerance=0.05, joining=False, agreed=4.6).chosen
    assert choose([((poison, None), 8.7)], ours=2.1, tolerance=0.05, joining=False, agreed=4.6).chosen is None
    assert choose([((resync, None), 4.1)], ours=2.1, tolerance=0.05, joining=False, agreed=4.6).chosen is None
    assert choose([((majority, None), 4.1)], ours=2.1, tolerance=0.05, joining=False).chosen is None  # never agreed


def test_refusals_are_remembered_for_a_while_and_logged_once_per_peer_and_hash():
    now = [0.0]
    r = Refusals(ttl_s=10.0, clock=lambda: now[0])
    assert r.add("peer-a", "h1") and not r.add("peer-a", "h1") and r.add("peer-b", "h1")
    assert r.refused("h1") and not r.refused("h2")
    now[0] = 11.0
    assert not r.refused("h1") and not r.add("peer-a", "h1")  # forgotten for pulling, still logged once
    # a peer whose record names the honest weights but serves others: that peer's claim is refused, nobody else's
    r.add("liar", "poison", announced="honest")
    assert r.refused("honest", "liar") and not r.refused("honest", "peer-a") and r.refused("poison")


def test_candidates_are_the_distinct_states_several_peers_announce_most_announced_first():
    def rec(pid: str, rnd: int, base: str, address: str = "h:1") -> PeerRecord:
        return PeerRecord(pid, address, 0, rnd, 0.0, "c", base, False, "s", "emb")

    me = rec("me", 0, "init")
    pool = [
        rec("s1", 9, "evil"),
        rec("s2", 9, "evil"),
        rec("s3", 9, "evil"),
        rec("h1", 4, "honest"),
        rec("h2", 4, "honest"),
        rec("z", 1_000_000, "lone"),  # one signed stranger alone: never a candidate among several peers
        rec("j", 0, "init"),  # our own state
        rec("c1", 3, "old", address=""),
        rec("c2", 3, "old", address=""),  # nobody dialable holds it
    ]
    assert [r.peer_id for r in candidates(me, pool)] == ["s3", "h2"]
    assert [r.peer_id for r in candidates(me, pool, limit=1)] == ["s3"]
    assert [r.peer_id for r in candidates(me, pool, can_pull=lambda r: r.address != "" and r.peer_id != "s3")] == [
        "s2",
        "h2",
    ]
    assert [r.peer_id for r in candidates(me, pool[5:6])] == ["z"]  # the only other peer: it is the swarm


# -- in-memory swarms ---------------------------------------------------------------------------------
def _poisoned(tensors: dict[str, torch.Tensor], seed: int, scale: float = 3.0) -> dict[str, torch.Tensor]:
    """An honest state plus large noise (scale x each tensor's RMS): still the right shapes, a far worse model."""
    gen = torch.Generator().manual_seed(seed)
    return {k: v + scale * v.pow(2).mean().sqrt() * torch.randn(v.shape, generator=gen) for k, v in tensors.items()}


async def _trained_swarm(rounds: int = 6):
    """Six in-memory peers of one block, each with the real HeldOutCheck: the two honest ones train `rounds`
    rounds together (5 steps each); the sybils and the joiner hold the initial weights at round 0."""
    peers, _, board = memory_swarm([0] * 6, blocks=1, **CHECKED)
    honest = {peers[i].me.peer_id: board[peers[i].me.peer_id] for i in HONEST}
    for _ in range(rounds):
        await memory_round(peers, honest, steps=5, skip={*SYBILS, JOINER})
    board.update(honest)
    return peers, board


def _serve(peers, board, block, emb, round: int) -> None:
    """The sybils adopt (block, emb) at `round` and announce it in their own valid signed records."""
    for i in SYBILS:
        peers[i].state.adopt(block, emb, round)
        board[peers[i].me.peer_id] = peers[i].record()


def _served_bytes(peers) -> int:
    return sum(peers[i].metrics.bytes_sent for i in SYBILS)


def test_honest_peers_and_a_joiner_refuse_a_poisoned_state_three_signed_identities_announce(caplog):
    """The issue's row: 3 signed identities at a plausible higher round serve the honest state plus large noise.
    Honest peers keep theirs and their round; a joiner takes the honest state and its round; nobody pulls the
    refused state again; without the check the same sync adopts the poison (the attack is real)."""

    async def scenario():
        peers, board = await _trained_swarm()
        h0, h1, joiner = peers[HONEST[0]], peers[HONEST[1]], peers[JOINER]
        r, block, emb = h0.state.snapshot()
        _serve(peers, board, _poisoned(block, 1), _poisoned(emb, 2), r + 5)
        figures = {
            "honest": h0.check.score(block, emb),
            "poisoned": h0.check.score(peers[SYBILS[0]].state.base_block, peers[SYBILS[0]].state.base_emb),
            "initial": joiner.check.score(joiner.state.base_block, joiner.state.base_emb),
        }
        hashes = (h0.state.block_hash, h0.state.emb_hash)
        records = list(board.values())
        with caplog.at_level(logging.WARNING, logger="swarmd.averaging.agreement"):
            pulled = {"h0": await h0.sync(records), "joiner": await joiner.sync(records)}
            served = _served_bytes(peers)
            again = await h0.sync(records)  # the refused (peer, hash) is remembered: no second pull
            served_again = _served_bytes(peers)
        after = {g: (p.state.round, p.state.block_hash, p.state.emb_hash) for g, p in (("h0", h0), ("joiner", joiner))}
        refused = (dict(h0.metrics.adoptions_refused), dict(joiner.metrics.adoptions_refused))
        h1.check = None  # the control: a peer without the check, same records
        control = await h1.sync(records)
        return r, hashes, figures, pulled, again, served, served_again, after, refused, control, h1, peers

    r, hashes, figures, pulled, again, served, served_again, after, refused, control, h1, peers = asyncio.run(
        scenario()
    )
    assert figures["poisoned"] > figures["honest"] + 0.5 and figures["honest"] < figures["initial"] - 0.5
    assert pulled["h0"] == [] and after["h0"] == (r, *hashes)  # kept its state and its round
    assert sorted(pulled["joiner"]) == ["block", "embedding"] and after["joiner"] == (r, *hashes)  # not round r + 5
    assert refused[0] == {"block": 1, "embedding": 1} and refused[1] == {"block": 1, "embedding": 1}
    assert served > 0 and again == [] and served_again == served
    logs = [m for m in caplog.messages if "refused the" in m]
    assert len(logs) == 4 and all("held-out CE" in m and "ours" in m for m in logs)  # once per peer and state
    # without the check the same records move the peer onto the poison and its round
    assert sorted(control) == ["block", "embedding"] and h1.state.round == r + 5
    assert h1.state.block_hash == peers[SYBILS[0]].state.block_hash


def test_an_honest_resync_still_adopts_and_is_scored():
    """A peer that missed two rounds adopts the others' (better) state as before; the check scored it."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0], blocks=1, **CHECKED)
        await memory_round(peers, board, steps=5)
        for _ in range(2):
            await memory_round(peers, board, steps=5, skip={0})
        a, b = peers[:2]
        scores = a.check.scores
        pulled = await a.sync(list(board.values()))
        return pulled, a, b, a.check.scores - scores

    pulled, a, b, scored = asyncio.run(scenario())
    assert sorted(pulled) == ["block", "embedding"] and scored >= 2
    assert (a.state.round, a.state.block_hash, a.state.emb_hash) == (
        b.state.round,
        b.state.block_hash,
        b.state.emb_hash,
    )
    assert a.metrics.adoptions_refused == {}


def test_a_joiner_picks_the_better_of_two_candidate_states():
    """Both states beat the joiner's initial weights: an early snapshot that three signed peers announce at a
    higher round, and the honest pair's trained state. The joiner takes the better one (and its round); the
    normal rule alone would have taken the highest round."""

    async def scenario():
        peers, _, board = memory_swarm([0] * 6, blocks=1, **CHECKED)
        honest = {peers[i].me.peer_id: board[peers[i].me.peer_id] for i in HONEST}
        await memory_round(peers, honest, steps=5, skip={*SYBILS, JOINER})
        _, early_block, early_emb = peers[0].state.snapshot()
        for _ in range(5):
            await memory_round(peers, honest, steps=5, skip={*SYBILS, JOINER})
        board.update(honest)
        h0, joiner = peers[HONEST[0]], peers[JOINER]
        r, block, emb = h0.state.snapshot()
        _serve(peers, board, early_block, early_emb, r + 3)
        states = ((joiner.state.base_block, joiner.state.base_emb), (early_block, early_emb), (block, emb))
        figures = [joiner.check.score(b, e) for b, e in states]
        pulled = await joiner.sync(list(board.values()))
        return r, figures, pulled, joiner, h0

    r, (initial, early, trained), pulled, joiner, h0 = asyncio.run(scenario())
    assert trained < early - 0.2 and early < initial - 0.2  # both pass against the initial weights
    assert sorted(pulled) == ["block", "embedding"]
    assert (joiner.state.round, joiner.state.block_hash, joiner.state.emb_hash) == (
        r,
        h0.state.block_hash,
        h0.state.emb_hash,
    )


def test_rejoin_and_split_round_moves_are_verified_too(monkeypatch):
    """The records of three signed peers copy the honest one (nothing to re-sync to) but they serve a poisoned
    fresh state: an isolated peer's rejoin (a fresh quorum) and a split round's move (last round's deltas came
    from their base) both pull it, score it and refuse it."""
    monkeypatch.setattr(rejoin, "HOLD_S", 0.05)

    async def scenario():
        peers, board = await _trained_swarm(rounds=3)
        h0, h1 = peers[HONEST[0]], peers[HONEST[1]]
        r, block, emb = h0.state.snapshot()
        for i in SYBILS:  # poisoned weights one round ahead, records that claim the honest state
            s = peers[i]
            s.state.adopt(_poisoned(block, 10), _poisoned(emb, 20), r + 1)
            claim = replace(h0.record(), peer_id=s.me.peer_id, address=s.me.address)
            board[s.me.peer_id] = sign_record(claim, s.identity, 60)
        del board[peers[JOINER].me.peer_id]
        records = list(board.values())
        h0.agreement.isolated = {BLOCK: rejoin.ISOLATED_ROUNDS, EMB: rejoin.ISOLATED_ROUNDS}  # no delta for 2 rounds
        h0.last_split = {}  # (the last round's split, consumed by the sync that saw it)
        sybil_ids = {peers[i].me.peer_id for i in SYBILS}
        h1.last_split = {
            BLOCK: (set(), dict.fromkeys(sybil_ids, "poisoned")),
            EMB: (set(), dict.fromkeys(sybil_ids, "poisoned")),
        }
        pulled = await asyncio.gather(h0.sync(records), h1.sync(records))
        served = _served_bytes(peers)
        h0.agreement.isolated = {BLOCK: rejoin.ISOLATED_ROUNDS, EMB: rejoin.ISOLATED_ROUNDS}  # the same again
        h1.last_split = {
            BLOCK: (set(), dict.fromkeys(sybil_ids, "poisoned")),
            EMB: (set(), dict.fromkeys(sybil_ids, "poisoned")),
        }
        again = await asyncio.gather(h0.sync(records), h1.sync(records))
        return r, (block, emb), pulled, again, served, _served_bytes(peers), h0, h1

    r, (block, emb), pulled, again, served, served_again, h0, h1 = asyncio.run(scenario())
    assert pulled == [[], []] and again == [[], []]
    assert served > 0 and served_again == served  # their records name the honest state: that claim is remembered
    for g in (h0, h1):
        assert (g.state.round, g.state.block_hash, g.state.emb_hash) == (r, weights_hash(block), weights_hash(emb))
        assert g.metrics.adoptions_refused == {"block": 1, "embedding": 1}


def test_a_peer_that_trained_apart_and_got_ahead_still_rejoins_the_majority():
    """A partition: a and b merge together, c trains alone for more rounds and scores far better on its sample than
    the majority it split from. Judged only against what it holds it would refuse the majority forever; judged
    against where it last agreed too, it rejoins, and the next rounds merge every peer again."""

    async def scenario():
        # the hand-off term off: c's lead on the next-byte CE alone is what this test needs within 36 steps
        no_handoff = replace(tiny_train(), handoff_weight=0.0)
        peers, _, board = memory_swarm([0, 0, 0], blocks=1, train=no_handoff, **CHECKED)
        a, b, c = peers
        await memory_round(peers, board, steps=3)
        pair, alone = {g.me.peer_id: board[g.me.peer_id] for g in (a, b)}, {c.me.peer_id: board[c.me.peer_id]}
        for _ in range(3):
            await memory_round(peers, pair, steps=3, skip={2})
        for _ in range(12):
            await memory_round(peers, alone, steps=3, skip={0, 1})
        figures = [c.check.score(g.state.base_block, g.state.base_emb) for g in (b, c)]
        board.update({**pair, **alone})
        reports = [await memory_round(peers, board, steps=3) for _ in range(3)]
        return figures, reports, peers

    (majority, own), reports, (a, b, c) = asyncio.run(scenario())
    assert own < majority - 1.0  # c's own state is far better on its sample than the majority's
    assert [r.participation for r in reports[-1]] == [1.0, 1.0, 1.0]
    assert a.state.block_hash == b.state.block_hash == c.state.block_hash and c.state.round == a.state.round
    assert c.metrics.adoptions_refused == {}


def test_two_parts_adopted_in_one_sync_leave_the_round_counter_at_the_higher_round():
    """A restarted peer's re-sync took a block of round 112 and then a table reconciliation of round 110, both
    allowed to move the counter back: the counter ended at 110 beside a block of 112, a pair nobody held, and every
    delta it sent was refused for 10 rounds. The higher round is adopted last, in either order of the parts."""

    async def scenario(block_round: int, table_round: int) -> tuple[int, list[str]]:
        (me, other), _, _ = memory_swarm([0, 0], codec="fp32")
        me.state.round = 108
        _, block, emb = other.state.snapshot()
        chosen = [
            Candidate(BLOCK.state, "b", weights_hash(block), block_round, block, back=True, round_limit=120),
            Candidate(EMB.state, "e", weights_hash(emb), table_round, emb, back=True, round_limit=120),
        ]
        # no held-out check here: the plain path adopts each part's first candidate
        adopted = await me.agreement._adopt_passing(chosen[:1], chosen[1:], joining=False)
        return me.state.round, [c.kind.part for c in adopted]

    for block_round, table_round in ((112, 110), (110, 112)):
        round_no, parts = asyncio.run(scenario(block_round, table_round))
        assert round_no == 112 and sorted(parts) == ["block", "embedding"]


def test_a_peer_a_round_ahead_rejoins_the_majority_at_the_round_it_ends_not_a_round_back():
    """Soak logs: a peer that merged alone at a deadline finished its round first, saw its block-mates' majority
    still in the round it had left, took the state they were leaving and went back a round with it, a round behind
    them again and its byte table with it. Asked for the round after theirs, they answer once their round ends."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0], blocks=1, codec="fp32")
        a, b, c = peers
        await memory_round(peers, board, steps=2)
        pair = {g.me.peer_id: board[g.me.peer_id] for g in (a, b)}
        await memory_round(peers, pair, steps=2, skip={2})  # a and b merge together
        await memory_round(peers, {c.me.peer_id: board[c.me.peer_id]}, steps=2, skip={0, 1})  # c alone
        await memory_round(peers, {c.me.peer_id: board[c.me.peer_id]}, steps=2, skip={0, 1})  # c a round ahead
        board.update({g.me.peer_id: g.record() for g in peers})
        behind = a.state.round
        assert c.state.round == behind + 1 and c.state.block_hash != a.state.block_hash
        records = list(board.values())
        rejoining = asyncio.create_task(c.sync(records))  # while a and b are still in their round
        for g in (a, b):
            await g.open_round()
            await asyncio.to_thread(g.state.train_steps, 2, batches(peers.index(g)))
        await asyncio.gather(a.average(list(pair.values())), b.average(list(pair.values())))
        adopted = await asyncio.wait_for(rejoining, 10)
        return adopted, behind, a, b, c

    adopted, behind, a, b, c = asyncio.run(scenario())
    assert sorted(adopted) == ["block", "embedding"]
    assert a.state.round == b.state.round == c.state.round == behind + 1
    assert c.state.block_hash == a.state.block_hash == b.state.block_hash
    assert c.state.emb_hash == a.state.emb_hash


def test_a_state_asked_for_the_round_after_ours_comes_at_this_rounds_end_and_never_waits_otherwise():
    async def scenario():
        (peer, _), _, _ = memory_swarm([0, 0], codec="fp32")
        request = pb.PullStateRequest(
            swarm_id=peer.me.swarm_id, config_hash=peer.me.config_hash, kind=BLOCK.state.to_pb(), block_index=0
        )
        now = peer.state.round
        at_once = [await peer.served_state(replace_request(request, min_round=r)) for r in (0, now, now + 2)]
        waiting = asyncio.create_task(peer.served_state(replace_request(request, min_round=now + 1)))
        done, _ = await asyncio.wait({waiting}, timeout=0.3)
        assert not done  # still in round `now`
        await asyncio.to_thread(peer.state.apply_merge, None, None)  # the round ends
        answer = await asyncio.wait_for(waiting, 5)
        return now, at_once, answer

    now, at_once, answer = asyncio.run(scenario())
    assert [int(e.header.round) for e in at_once] == [now, now, now]
    assert int(answer.header.round) == now + 1


def replace_request(request, **fields):
    out = type(request)()
    out.CopyFrom(request)
    for k, v in fields.items():
        setattr(out, k, v)
    return out
