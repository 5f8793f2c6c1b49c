"""Issue 9, partition heal: an isolated peer rejoins when the signed records show no quorum anywhere
(swarmd.averaging.rejoin: a quorum of fresh signed states, else a deterministic reconciliation).

Fast: the pure rules, and in-memory Gossip peers (tests/swarm_utils.memory_swarm) whose syncs run concurrently
as separate daemons' would.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from swarm_utils import ROUND_STREAMS, batches, memory_round, memory_swarm

from swarmd.averaging import rejoin
from swarmd.averaging.context import BLOCK, EMB
from swarmd.averaging.rejoin import Held, fresh_majority, reconcile, stable

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def fast_hold(monkeypatch):
    monkeypatch.setattr(rejoin, "HOLD_S", 0.05)


# -- the pure rules -----------------------------------------------------------------------------------
def test_fresh_majority_needs_a_quorum_and_only_moves_the_smaller_or_lower_ranked_side():
    me = Held("c", 118, "mine")
    a, b = Held("a", 65, "theirs"), Held("b", 65, "theirs")
    assert fresh_majority(me, [a, b], need=2) == b  # the highest-ranked member of the quorum's group
    assert fresh_majority(me, [a, Held("b", 66, "later")], need=2) is None  # no quorum anywhere
    liar = Held("z", 1_000_000, "evil")
    assert fresh_majority(me, [a, liar], need=2) is None  # one liar is never a quorum, whatever its round
    assert fresh_majority(me, [a, b, liar], need=2) == b
    # two replicas: the lower-ranked one moves, the other stays (both apply the same rule)
    assert fresh_majority(Held("a", 65, "x"), [Held("c", 118, "y")], need=1) == Held("c", 118, "y")
    assert fresh_majority(Held("c", 118, "y"), [Held("a", 65, "x")], need=1) is None
    # a group as large as ours but ranked below it never moves us; the same weights as ours: nothing to do
    assert fresh_majority(Held("c", 9, "y"), [Held("d", 9, "y"), Held("a", 5, "t"), Held("b", 5, "t")], need=2) is None
    assert fresh_majority(Held("c", 65, "theirs"), [a, b], need=2) is None


def test_reconcile_is_one_pure_function_of_the_set_and_trims_a_liar():
    torch.manual_seed(0)
    honest = {p: {"w": torch.randn(50) * 0.1 + 1.0} for p in ("a", "b", "c")}
    liar = {"w": torch.full((50,), 1e6)}
    rounds = {"a": 10, "b": 20, "c": 30, "z": 1_000_000}
    states = {**honest, "z": liar}
    merged, round, weights = reconcile(states, rounds)
    again, round2, weights2 = reconcile(dict(reversed(list(states.items()))), dict(reversed(list(rounds.items()))))
    assert torch.equal(merged["w"], again["w"]) and (round, weights) == (round2, weights2)  # bit for bit
    assert round == 20  # the lower median of the rounds: the liar's round 1,000,000 does not count
    stack = torch.stack([s["w"] for s in honest.values()])
    assert bool((merged["w"] <= stack.max(0).values + 1e-6).all() and (merged["w"] >= stack.min(0).values - 1e-6).all())
    with pytest.raises(ValueError):
        reconcile({"a": honest["a"], "b": honest["b"]}, {"a": 1, "b": 2})  # two replicas: fresh_majority decides


def test_stable_means_the_same_members_unchanged_or_already_reconciled():
    prev = {"a": (1, "x"), "b": (2, "y"), "c": (3, "z")}
    assert stable(prev, dict(prev), (2, "m"))
    assert stable(prev, {**prev, "a": (2, "m")}, (2, "m"))  # a adopted the reconciliation first
    assert not stable(prev, {**prev, "a": (4, "q")}, (2, "m"))  # a trained on
    assert not stable(prev, {k: v for k, v in prev.items() if k != "c"}, (2, "m"))  # c no longer answers


# -- in-memory swarms ---------------------------------------------------------------------------------
async def _round(peers, records, after_sync=None) -> list:
    """One round on every peer with its sync running concurrently with the others' (as separate daemons);
    after_sync(): the records the merge sees (a daemon announces right after adopting a state)."""
    await asyncio.gather(*(g.sync(records) for g in peers))
    records = records if after_sync is None else after_sync()
    for g in peers:
        await g.open_round()
    for g in peers:
        await asyncio.to_thread(g.state.train_steps, 2, ROUND_STREAMS.setdefault(g, batches(peers.index(g))))
    return await asyncio.gather(*(g.average(records) for g in peers))


def test_a_peer_that_ran_ahead_rejoins_when_the_majoritys_records_sit_at_different_rounds(fast_hold):
    """The benchmark's partition: a and b merge together, c trained alone to round 50; the DHT holds a's record of
    one round and b's of the next (no (round, weights) has a quorum). c rejoins from their fresh signed states."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0], codec="fp32", blocks=1, deadline_max_s=1.0)
        a, b, c = peers
        await memory_round(peers, board, skip={2})
        lagging = a.record()  # a's record stays one round behind b's (records lag a merge)
        await memory_round(peers, board, skip={2})
        c.state.adopt({k: v + 0.05 for k, v in c.state.base_block.items()}, None, 50)
        reports = []
        for _ in range(rejoin.ISOLATED_ROUNDS + 2):
            records, before = [lagging, b.record(), c.record()], lagging
            lagging = a.record()
            reports.append(await _round(peers, records, lambda: [before, b.record(), c.record()]))  # noqa: B023
        return peers, reports

    (a, b, c), reports = asyncio.run(scenario())
    assert reports[0][2].accepted_block == []  # c was isolated
    last = reports[-1]
    assert [r.participation for r in last] == [1.0, 1.0, 1.0]  # every peer merged every expected delta
    assert a.state.block_hash == b.state.block_hash == c.state.block_hash
    assert a.state.emb_hash == b.state.emb_hash == c.state.emb_hash
    assert c.state.round == a.state.round < 50


def test_a_three_way_split_reconciles_to_one_state_and_merges_again(fast_hold):
    """Every replica on its own weights and round (no quorum even among fresh states): they hold, reconcile to the
    same bits at the median round, and the next round merges all of them."""

    async def scenario():
        peers, _, _board = memory_swarm([0, 0, 0], codec="fp32", blocks=1, deadline_max_s=1.0)
        for i, g in enumerate(peers):
            g.state.adopt({k: v + 0.01 * (i + 1) for k, v in g.state.base_block.items()}, None, 10 * (i + 1))
        reports = []
        for _ in range(rejoin.ISOLATED_ROUNDS + 2):
            records = [g.record() for g in peers]
            reports.append(await _round(peers, records, lambda: [g.record() for g in peers]))
        return peers, reports

    peers, reports = asyncio.run(scenario())
    assert all(r.accepted_block == [] for r in reports[0])  # all isolated at first
    assert [r.participation for r in reports[-1]] == [1.0, 1.0, 1.0]
    assert len({g.state.block_hash for g in peers}) == 1 and len({g.state.emb_hash for g in peers}) == 1
    assert len({g.state.round for g in peers}) == 1


def test_a_merging_majority_is_never_moved_by_a_diverged_minority(fast_hold):
    """a, b and c merge together; d (a liar with its own weights at round 1,000,000) is isolated: only d may move."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0, 0], codec="fp32", blocks=1, deadline_max_s=1.0)
        await memory_round(peers, board)
        d = peers[3]
        d.state.adopt({k: v + 1.0 for k, v in d.state.base_block.items()}, None, 1_000_000)
        evil = d.state.block_hash
        d.cfg = d.cfg.__class__(**{**d.cfg.__dict__, "max_round_jump": 1_000_000})
        for _ in range(rejoin.ISOLATED_ROUNDS + 1):
            board[d.me.peer_id] = d.record()
            records = list(board.values())
            await _round(peers, records)
            for g in peers[:3]:
                board[g.me.peer_id] = g.record()
        return peers, evil

    peers, evil = asyncio.run(scenario())
    assert all(g.state.round < 1_000 and g.state.block_hash != evil for g in peers[:3])


def test_a_split_rounds_move_takes_the_states_round_too_so_the_next_round_merges(fast_hold):
    """a and b merge together; c is a round ahead on weights of its own (it closed a round the others did not get
    to merge with it), and d (a replayer) holds weights of its own, so no state has a majority of the records. Last
    round's signed deltas show a and b on another base: c moves to their state and to its round, back one round,
    so its next delta is on their base; kept at its own round it would hold a (round, weights) pair nobody holds
    and every delta it sends would be refused for its base (a split that never heals)."""

    async def scenario():  # a round waits 0.8 s at least for a delta: d never sends, and a loaded machine is slow
        peers, _, board = memory_swarm([0, 0, 0, 0], codec="fp32", blocks=1, deadline_max_s=1.0, deadline_min_s=0.8)
        a, b, c, d = peers
        await memory_round(peers, board)
        r = c.state.round
        for g, shift, at in ((c, 0.05, r + 1), (d, -0.05, r)):  # both parts on weights of their own
            g.state.adopt(*({k: v + shift for k, v in t.items()} for t in (g.state.base_block, g.state.base_emb)), at)
        c.last_split = {kind: (set(), dict.fromkeys((a.me.peer_id, b.me.peer_id), "theirs")) for kind in (BLOCK, EMB)}
        board.update({g.me.peer_id: g.record() for g in (c, d)})
        theirs = a.state.block_hash
        adopted = await c.sync(list(board.values()))
        moved = (c.state.round, c.state.block_hash)
        c.last_split = {}
        reports = await memory_round(peers, board, skip={3})
        return peers, r, adopted, (theirs, moved), reports

    (a, b, c, _), r, adopted, (theirs, moved), reports = asyncio.run(scenario())
    assert "block" in adopted
    assert moved == (r, theirs)  # their state and its round: one round back
    assert [len(x.accepted_block) for x in reports] == [2, 2, 2]  # a, b and c merge each other (d sends nothing)
    assert a.state.block_hash == b.state.block_hash == c.state.block_hash


def test_other_blocks_identities_never_crowd_a_blocks_own_peers_out_of_its_quorum(fast_hold):
    """A public swarm on one host (one address range, capped at identities_per_range identities that count): c's
    standing knows the five other-block peers longer than its own block's a and b. The cap is applied to the
    peers of the quorum being counted, so a and b count for the block and c's split-round move happens; applied
    to the whole swarm first, the five would fill the range and c's block would have nobody to move to."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0, 1, 1, 1, 1, 1], codec="fp32", checks=True, public=True)
        c, a, b = peers[:3]  # (mem:0 parses to no range: c's own record is never counted anyway)
        probation = c.standing.probation
        older = [g.me.peer_id for g in peers[3:]]
        for r in range(1, 4):  # the other block's peers seen first and past probation
            probation.see(r, older)
            probation.observe(r, older, ())
        for r in range(5, 8):
            probation.see(r, [a.me.peer_id, b.me.peer_id])
            probation.observe(r, [a.me.peer_id, b.me.peer_id], ())
        for g in peers:  # past round 0 (a peer at round 0 is a joiner: it counts every record)
            g.state.adopt(dict(g.state.base_block), None, 10)
        theirs = a.state.block_hash
        c.state.adopt({k: v + 0.05 for k, v in c.state.base_block.items()}, None, 10)
        board.update({g.me.peer_id: g.record() for g in peers})
        c.last_split = {BLOCK: (set(), dict.fromkeys((a.me.peer_id, b.me.peer_id), theirs))}
        adopted = await c.sync(list(board.values()))
        return adopted, theirs, c.state.block_hash

    adopted, theirs, now = asyncio.run(scenario())
    assert "block" in adopted and now == theirs


def test_a_swarm_in_pieces_of_two_is_whole_again_within_two_rounds(fast_hold):
    """Six replicas in pieces 2 + 2 + 1 + 1, both parts (after faults: no (round, weights) has a quorum of the 5
    others' records, and the pairs merge each other, so they are never isolated). Last round's signed deltas show
    the pieces: every piece but the largest, highest-ranked one moves to it, and the next round merges everyone;
    under the quorum rule alone the pairs merged apart for good."""

    async def scenario():  # a round waits 0.8 s at least for a delta: what is measured is the pieces, not the deadline
        peers, _, board = memory_swarm([0] * 6, codec="fp32", blocks=1, deadline_max_s=1.0, deadline_min_s=0.8)
        await memory_round(peers, board)
        for g, shift in zip(peers, (0.01, 0.01, -0.01, -0.01, 0.02, -0.02), strict=True):
            g.state.adopt(*({k: v + shift for k, v in t.items()} for t in (g.state.base_block, g.state.base_emb)))
        board.update({g.me.peer_id: g.record() for g in peers})
        return peers, [await memory_round(peers, board) for _ in range(3)]

    peers, reports = asyncio.run(scenario())
    assert all(len(r.accepted_block) <= 1 for r in reports[0])  # in pieces: a pair's partner at most
    assert [len(r.accepted_block) for r in reports[-1]] == [5] * 6
    assert [len(r.accepted_emb) for r in reports[-1]] == [5] * 6
    assert len({g.state.block_hash for g in peers}) == 1 and len({g.state.emb_hash for g in peers}) == 1


def test_a_member_that_does_not_answer_is_asked_once_per_reconciliation(fast_hold):
    """A three-way split plus a paused fourth replica (its pulls time out): each isolated replica asks the paused one
    once per attempt, not once per pull of its hold (each of those waited rpc_timeout_s: tens of seconds of holding
    still in the soak), and the three that answer still reconcile to one state."""
    asked: list[str] = []

    async def scenario():
        peers, _, _board = memory_swarm([0, 0, 0, 0], codec="fp32", blocks=1, deadline_max_s=1.0)
        paused = peers[3].me.peer_id
        for g in peers[:3]:
            real = g.agreement.pulls.fresh_state

            async def fresh_state(peer, kind, real=real):
                if peer.peer_id == paused:
                    asked.append(peer.peer_id)
                    raise TimeoutError("paused")
                return await real(peer, kind)

            g.agreement.pulls.fresh_state = fresh_state
        for i, g in enumerate(peers):
            g.state.adopt({k: v + 0.01 * (i + 1) for k, v in g.state.base_block.items()}, None, 10 * (i + 1))
        live = peers[:3]
        for _ in range(rejoin.ISOLATED_ROUNDS + 2):
            await _round(live, [g.record() for g in peers], lambda: [g.record() for g in peers])
        return live

    live = asyncio.run(scenario())
    assert len({g.state.block_hash for g in live}) == 1
    assert 0 < len(asked) <= 3 * 2  # one pull per attempt (per part), not one per try of the hold
