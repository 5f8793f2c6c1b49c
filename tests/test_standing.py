"""swarmd.averaging.standing: probation, the range cap, drift and proof of work as the round sees them (issue 21)."""

from __future__ import annotations

import asyncio

import torch
from swarm_utils import memory_round, memory_swarm

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.context import BLOCK, EMB
from swarmd.averaging.standing import Standing
from swarmd.membership.identity import Identity
from swarmd.membership.pow import solve_pow
from swarmd.membership.records import PeerRecord


def rec(pid: str, address: str = "203.0.113.7:5000", nonce: int = 0) -> PeerRecord:
    return PeerRecord(pid, address, 0, 0, 1.0, "cfg", "base", False, "sw", "emb", pow_nonce=nonce)


def test_a_new_identity_must_pass_alone_until_its_probation_is_over():
    standing = Standing("me", GossipConfig(probation_rounds=3), public=True, checked=True)
    for round in range(3):
        must_pass, leave_out = standing.plan(round, [rec("a"), rec("me")])
        assert must_pass == {"a"} and not leave_out  # own id never counted as a stranger
        standing.observe(round, {}, {BLOCK: {}, EMB: {}}, {}, {}, passed={"a"}, failed=set())
    assert standing.plan(3, [rec("a")])[0] == frozenset()
    # a failure on probation makes it longer: another newcomer that failed once needs more rounds
    standing.plan(3, [rec("b")])
    standing.observe(3, {}, {BLOCK: {}, EMB: {}}, {}, {}, passed=set(), failed={"b"})
    assert standing.probation.rounds_left("b") > 3


def test_private_swarms_and_peers_without_a_check_have_no_probation():
    for public, checked in ((False, True), (True, False)):
        standing = Standing("me", GossipConfig(), public=public, checked=checked)
        assert standing.plan(0, [rec("a"), rec("b")])[0] == frozenset()
        assert standing.vouched([rec("a")], joining=False) == [rec("a")]


def test_beyond_the_range_cap_the_youngest_identities_must_pass_alone():
    standing = Standing("me", GossipConfig(probation_rounds=0, identities_per_range=2), public=True, checked=True)
    standing.plan(0, [rec("p1", "198.51.100.1:1"), rec("p2", "198.51.100.2:1")])  # seen first: the oldest
    later = [rec(f"p{i}", f"198.51.100.{i}:1") for i in range(1, 6)] + [rec("q", "192.0.2.9:1")]
    must_pass, _ = standing.plan(1, later)
    assert must_pass == {"p3", "p4", "p5"}  # one /24 keeps its two oldest; another range is not affected
    assert [r.peer_id for r in standing.vouched(later, joining=False)] == ["p1", "p2", "q"]
    assert standing.vouched(later, joining=True) == later  # a joiner knows nobody: verified adoption guards it
    fresh = Standing("me", GossipConfig(), public=True, checked=True)  # restarted from a checkpoint: knows nobody
    assert fresh.vouched(later, joining=False) == later  # else it could never re-sync to the swarm it left


def test_the_range_cap_counts_a_blocks_own_peers_among_themselves():
    """Two older identities of another block fill a shared /24's cap of 2: our block's peers still count for our
    block's merge (the cap among its own peers), and stay capped for the swarm-wide count."""

    def at(pid: str, block: int) -> PeerRecord:
        return PeerRecord(pid, f"198.51.100.{len(pid)}:1", block, 0, 1.0, "cfg", "base", False, "sw", "emb")

    standing = Standing("me", GossipConfig(probation_rounds=0, identities_per_range=2), public=True, checked=True)
    standing.plan(0, [at("x1", 1), at("x2", 1)])  # the other block's peers, seen first: the oldest
    records = [at("x1", 1), at("x2", 1), at("a", 0), at("b", 0), at("c", 0)]
    assert standing.plan(1, records)[0] == {"a", "b", "c"}  # the swarm-wide cap alone
    assert standing.plan(2, records, block=0)[0] == {"c"}  # among block 0's own: the two oldest count


def test_a_peer_that_keeps_pulling_one_way_is_left_out():
    torch.manual_seed(0)
    standing = Standing("me", GossipConfig(), public=False, checked=True)
    ids = ["me", "h1", "h2", "liar"]
    v = torch.randn(64)
    v = v / v.norm()
    flagged_at = None
    for round in range(80):
        step = 0.3 * torch.randn(64)
        deltas = {p: {"w": step + torch.randn(64)} for p in ids}
        deltas["liar"]["w"] = deltas["liar"]["w"] + v * deltas["h1"]["w"].norm()  # v at 1.0x the honest norm
        merged = {"w": torch.stack([d["w"] for d in deltas.values()]).mean(0)}
        own = {BLOCK: deltas["me"], EMB: {}}
        inbox = {BLOCK: {p: deltas[p] for p in ids if p != "me"}, EMB: {}}
        standing.observe(round, own, inbox, {BLOCK: merged, EMB: None}, {BLOCK: tuple(ids)}, set(), set())
        if "liar" in standing.plan(round, [rec(p) for p in ids])[1]:
            flagged_at = round
            break
    assert flagged_at is not None and flagged_at < 40
    assert standing.plan(99, [rec(p) for p in ids])[1] == {"liar"}  # for good; nobody honest with it


def test_a_drifting_peer_kept_out_of_the_merge_in_some_rounds_is_still_tracked_in_every_one():
    """Its delta accepted but left out of the merge (probation's held-out check failed) every other round: the
    tracker sees it every round and flags it as soon as when it is merged every round."""

    def flagged_round(merged_every_round: bool) -> int | None:
        torch.manual_seed(0)
        standing = Standing("me", GossipConfig(), public=False, checked=True)
        ids = ["me", "h1", "h2", "liar"]
        v = torch.randn(64)
        v = v / v.norm()
        for round in range(80):
            step = 0.3 * torch.randn(64)
            deltas = {p: {"w": step + torch.randn(64)} for p in ids}
            deltas["liar"]["w"] = deltas["liar"]["w"] + v * deltas["h1"]["w"].norm()
            used = ids if merged_every_round or round % 2 else [p for p in ids if p != "liar"]
            merged = {"w": torch.stack([deltas[p]["w"] for p in used]).mean(0)}
            inbox = {BLOCK: {p: deltas[p] for p in ids if p != "me"}, EMB: {}}
            failed = set() if used == ids else {"liar"}
            standing.observe(
                round,
                {BLOCK: deltas["me"], EMB: {}},
                inbox,
                {BLOCK: merged, EMB: None},
                {BLOCK: tuple(used)},
                set(),
                failed,
            )
            if "liar" in standing.plan(round, [rec(p) for p in ids])[1]:
                return round
        return None

    every, half = flagged_round(True), flagged_round(False)
    assert every is not None and half is not None
    assert half <= every + 5


def test_records_without_the_swarms_proof_of_work_are_not_used():
    identity = Identity.generate()
    standing = Standing("me", GossipConfig(pow_bits=8), public=True, checked=True)
    assert not standing.usable_record(rec(identity.peer_id))
    nonce = solve_pow(identity.public_key, 8)
    assert standing.usable_record(rec(identity.peer_id, nonce=nonce))
    assert Standing("me", GossipConfig(), public=True, checked=True).usable_record(rec(identity.peer_id))


def test_a_fresh_public_swarm_merges_from_its_first_round_and_stays_bit_identical():
    """Everyone is new to everyone: probation deltas merge when they pass alone, so the swarm merges at once; after
    the probation rounds the deltas count as usual. The replicas end on one base."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0], blocks=1, checks=True, public=True, probation_rounds=2)
        first = await memory_round(peers, board)
        assert all(len(r.accepted_block) == 2 and sorted(r.passed) == sorted(r.accepted_block) for r in first)
        for _ in range(2):
            await memory_round(peers, board)
        last = await memory_round(peers, board)
        assert all(not r.passed and len(r.accepted_block) == 2 for r in last)  # past probation: merged as usual
        assert len({g.state.block_hash for g in peers}) == 1

    asyncio.run(scenario())


def test_a_peer_whose_record_is_rounds_ahead_is_not_waited_for():
    """Insiders announcing a round ahead of the swarm send no delta of ours: the round does not expect them (it
    used to wait for them up to the deadline every round: the poisoned-state insider row's 10 s rounds)."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0], blocks=1)
        ahead = peers[2]
        ahead.state.round = 5
        board[ahead.me.peer_id] = ahead.record()
        reports = await memory_round(peers, board, skip={2})
        return reports, ahead.me.peer_id

    reports, ahead_id = asyncio.run(scenario())
    assert all(ahead_id not in r.expected_block and ahead_id not in r.expected_emb for r in reports)
    assert all(len(r.accepted_block) == 1 for r in reports)


def test_a_joiner_counts_the_incumbents_whose_state_it_adopted():
    """A joiner of a public swarm adopts the state the incumbents' records announce (scored first): their deltas count
    for it at once, unjudged. Before, it judged each incumbent's delta against its own fresh one for its probation
    rounds and kept some out: it merged apart from its block, a split a round, healed only by the next re-sync."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0, 0], blocks=1, checks=True, public=True, probation_rounds=3)
        board.pop(peers[3].me.peer_id)  # the joiner is not up yet
        for _ in range(4):  # the incumbents pass their probation among themselves
            await memory_round(peers, board, skip={3})
        joiner, incumbents = peers[3], {g.me.peer_id for g in peers[:3]}
        assert joiner.state.round == 0 and all(joiner.standing.probation.on_probation(i) for i in incumbents)
        await joiner.sync(list(board.values()))  # its first sync adopts the incumbents' state
        board[joiner.me.peer_id] = joiner.record()
        reports = await memory_round(peers, board)
        return joiner, incumbents, reports

    joiner, incumbents, reports = asyncio.run(scenario())
    assert not any(joiner.standing.probation.on_probation(i) for i in incumbents)
    joined = reports[3]
    assert set(joined.accepted_block) == incumbents and not set(joined.passed) & incumbents  # merged unjudged
    judged = [set(r.passed) | set(r.refused) for r in reports[:3]]
    assert all(joiner.me.peer_id in ids for ids in judged)  # the incumbents still judge the newcomer
