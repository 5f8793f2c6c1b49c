"""Group averaging (swarmd.averaging.groups): the grid assignment, the anchored merge, and group rounds in memory."""

from __future__ import annotations

import asyncio
import itertools
import math
from dataclasses import replace

import pytest
import torch
from swarm_utils import memory_round, memory_swarm

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.context import BLOCK, EMB
from swarmd.averaging.deadline import DeadlinePolicy
from swarmd.averaging.groups import Anchor, assign, grid_dims, grid_sides, group_of, round_members
from swarmd.averaging.state import relative_distance
from swarmd.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

IDS = [f"peer{i:03d}" for i in range(24)]


# -- assignment -------------------------------------------------------------------------------
@pytest.mark.parametrize("n,k", [(5, 4), (8, 4), (12, 4), (24, 4), (24, 8), (100, 4), (1000, 8)])
def test_every_peer_is_in_exactly_one_group_of_at_most_k(n, k):
    ids = [f"p{i}" for i in range(n)]
    for r in range(6):
        groups = assign(ids, r, k, "s")
        flat = [p for g in groups for p in g]
        assert sorted(flat) == sorted(ids) and len(flat) == len(set(flat))
        assert all(1 <= len(g) <= k for g in groups)
        assert all(g == sorted(g) for g in groups)


def test_assignment_is_deterministic_and_changes_every_round():
    ids = IDS[:12]
    assert assign(ids, 3, 4, "s") == assign(list(reversed(ids)), 3, 4, "s")  # any order of the records
    rounds = [assign(ids, r, 4, "s") for r in range(8)]
    assert all(a != b for a, b in itertools.pairwise(rounds))  # groups change every round
    assert assign(ids, 0, 4, "s") != assign(ids, 0, 4, "t")  # the salt separates block and table assignments
    # every peer computes its own group the same way the others do
    for r in range(4):
        for g in assign(ids, r, 4, "s"):
            for p in g:
                assert group_of(p, ids, r, 4, "s") == g


def test_small_swarms_are_one_group():
    assert assign(IDS[:4], 7, 4) == [sorted(IDS[:4])]
    assert assign(IDS[:9], 7, 0) == [sorted(IDS[:9])]  # k = 0: all-to-all
    cfg = GossipConfig(group_size=4, table_group_size=4)
    assert round_members(IDS[0], IDS[1:4], 5, cfg, "s") is None
    assert round_members(IDS[0], IDS[:4], 5, cfg, "s") is None  # me among the records counts once
    got = round_members(IDS[0], IDS[1:8], 5, cfg, "s")
    assert got is not None and IDS[0] not in got and 1 <= len(got) <= 3
    full = GossipConfig(group_size=4, table_group_size=4, group_full_every=3)
    assert round_members(IDS[0], IDS[1:8], 6, full, "s") is None  # every 3rd round: everybody
    blocks_only = GossipConfig(group_size=4)  # the byte table all-to-all by default (table_group_size 0)
    assert round_members(IDS[0], IDS[1:8], 5, blocks_only, "s", table=True) is None
    assert round_members(IDS[0], IDS[1:8], 5, blocks_only, "s") is not None
    with pytest.raises(ConfigError):
        GossipConfig(table_group_size=1)


def test_grid_shapes():
    assert grid_dims(4, 4) == 1 and grid_dims(5, 4) == 2 and grid_dims(17, 4) == 3
    assert grid_sides(8, 4) == (4, 2) and grid_sides(24, 4) == (4, 3, 2) and grid_sides(12, 4) == (4, 3)
    assert math.prod(grid_sides(10_000, 8)) >= 10_000 and max(grid_sides(10_000, 8)) <= 8


@pytest.mark.parametrize("n,k", [(8, 4), (24, 4), (64, 4)])
def test_grid_rounds_reach_the_exact_mean_when_the_grid_is_full(n, k):
    ids = [f"p{i}" for i in range(n)]
    g = torch.Generator().manual_seed(0)
    x = {p: torch.randn(50, generator=g, dtype=torch.float64) for p in ids}
    mean = torch.stack(list(x.values())).mean(0)
    d = len(grid_sides(n, k))
    for r in range(d):
        for group in assign(ids, r, k, "s"):
            m = torch.stack([x[p] for p in group]).mean(0)
            for p in group:
                x[p] = m.clone()
    assert max(float((v - mean).norm()) for v in x.values()) < 1e-12


@pytest.mark.parametrize("n,k", [(8, 4), (10, 4), (21, 4), (9, 2)])
def test_balanced_layout_cuts_the_fewest_groups_of_equal_size_and_reshuffles(n, k):
    """group_layout "balanced": every round ceil(n / k) groups, sizes within one of each other, a partition;
    the same for every peer that computes it, another one the next round; 8 in groups of 4 never averages pairs."""
    ids = [f"p{i}" for i in range(n)]
    rounds = [assign(ids, r, k, "s", "balanced") for r in range(4)]
    for groups in rounds:
        sizes = [len(g) for g in groups]
        assert len(groups) == -(-n // k) and max(sizes) <= k and max(sizes) - min(sizes) <= 1
        assert sorted(p for g in groups for p in g) == sorted(ids)
    assert rounds[0] == assign(list(reversed(ids)), 0, k, "s", "balanced")
    assert len({tuple(map(tuple, g)) for g in rounds}) > 1
    assert group_of(ids[0], ids[1:], 2, k, "s", "balanced") in rounds[2]
    assert [len(g) for g in assign(ids[:8], 1, 4, "s")] == [2, 2, 2, 2]  # the grid's 4 x 2: pairs every other round
    with pytest.raises(ConfigError):
        GossipConfig(group_layout="ring")


@pytest.mark.parametrize("n,k", [(8, 4), (4, 2), (18, 6), (12, 4), (7, 4), (30, 4)])
def test_orthogonal_layout_groups_like_balanced_and_mixes_exactly_in_two_rounds(n, k):
    """group_layout "orthogonal": ceil(n / k) groups of at most k, a partition, the same for every peer; when
    c = ceil(n / k) divides n / c, the two rounds of an epoch give every member the exact mean (both groups of 4
    at n = 8, where balanced groups mix only by chance and the grid averages pairs); a new order every epoch."""
    ids = [f"p{i}" for i in range(n)]
    rounds = [assign(ids, r, k, "s", "orthogonal") for r in range(4)]
    for groups in rounds:
        assert len(groups) == -(-n // k) and max(len(g) for g in groups) <= k
        assert sorted(p for g in groups for p in g) == sorted(ids)
    assert rounds[1] == assign(list(reversed(ids)), 1, k, "s", "orthogonal")
    assert rounds[2] != rounds[0]
    g = torch.Generator().manual_seed(0)
    x = {p: torch.randn(50, generator=g, dtype=torch.float64) for p in ids}
    mean = torch.stack(list(x.values())).mean(0)
    for groups in rounds[2:4]:
        for group in groups:
            m = torch.stack([x[p] for p in group]).mean(0)
            for p in group:
                x[p] = m.clone()
    error = max(float((v - mean).norm()) for v in x.values())
    c = -(-n // k)
    assert (error < 1e-12) == (n % c == 0 and (n // c) % c == 0)


def test_incomplete_grids_still_converge_in_a_few_rounds():
    ids = [f"p{i}" for i in range(21)]  # 21 = 4 x 3 x 2 - 3: an incomplete grid
    g = torch.Generator().manual_seed(1)
    x = {p: torch.randn(50, generator=g, dtype=torch.float64) for p in ids}
    spread0 = max(float((v - torch.stack(list(x.values())).mean(0)).norm()) for v in x.values())
    for r in range(12):
        for group in assign(ids, r, 4, "s"):
            m = torch.stack([x[p] for p in group]).mean(0)
            for p in group:
                x[p] = m.clone()
    mean = torch.stack(list(x.values())).mean(0)
    assert max(float((v - mean).norm()) for v in x.values()) < 1e-3 * spread0


def test_anchor_offsets_and_age():
    a = Anchor()
    base = {"w": torch.ones(3)}
    assert not a.active and a.offset(base) is None and a.reference(base, "h")[1] == "h" and a.age(9) == 0
    a.set(base, "h0", 4)
    assert (
        a.active and a.age(7) == 3 and torch.equal(a.offset({"w": torch.full((3,), 1.5)})["w"], torch.full((3,), 0.5))
    )
    base["w"] += 1  # the anchor is a copy
    assert torch.equal(a.tensors["w"], torch.ones(3))
    a.clear()
    assert not a.active


def test_config_checks_group_fields():
    with pytest.raises(ConfigError):
        GossipConfig(group_size=1)
    with pytest.raises(ConfigError):
        GossipConfig(group_size=-1)
    with pytest.raises(ConfigError):
        GossipConfig(group_full_every=-2)


# -- rounds in memory -------------------------------------------------------------------------
async def _rounds(peers, board, n: int, steps: int = 2) -> list:
    out = []
    for _ in range(n):
        out.append(await memory_round(peers, board, steps=steps))
    return out


def _patient(peers) -> None:
    """Wait for every group member (the round still ends as soon as all arrived): exact consensus checks."""
    for g in peers:
        g.deadline = DeadlinePolicy(replace(g.cfg, deadline_min_s=10.0, deadline_max_s=20.0), target=0)


def _spread(peers) -> float:
    """Max relative distance of a replica's block base from the replicas' mean."""
    mean = {k: torch.stack([g.state.base_block[k] for g in peers]).mean(0) for k in peers[0].state.base_block}
    return max(relative_distance(mean, g.state.base_block) for g in peers)


def test_one_group_swarm_is_bit_identical_to_all_to_all():
    def run(group_size: int):
        torch.manual_seed(0)  # the trainer draws from the global generator too: the same draws in both runs

        async def scenario():
            peers, _, board = memory_swarm([0, 0, 1], codec="int8", group_size=group_size, table_group_size=group_size)
            reports = await _rounds(peers, board, 2)
            return peers, reports

        return asyncio.run(scenario())

    grouped, reports = run(4)
    plain, _ = run(0)
    assert all(r.participation == 1.0 for rs in reports for r in rs)
    assert not any(g.anchors[BLOCK].active or g.anchors[EMB].active for g in grouped)
    for a, b in zip(grouped, plain):
        for k in a.state.base_block:
            assert torch.equal(a.state.base_block[k], b.state.base_block[k])
        assert torch.equal(a.state.base_emb["table"], b.state.base_emb["table"])
    assert grouped[0].state.block_hash == grouped[1].state.block_hash  # same-block replicas: same bits


def test_group_rounds_stay_in_groups_never_resync_and_reach_consensus():
    async def scenario():
        peers, _, board = memory_swarm(
            [0] * 8, codec="fp32", blocks=2, group_size=4, table_group_size=4, merge="mean", group_layout="grid"
        )
        _patient(peers)
        trained = await _rounds(peers, board, 3)  # training rounds in groups
        spread_trained = _spread(peers)
        pulled = []
        for g in peers:  # what the re-sync rule decides on the records now: nothing to adopt
            pulled.append(await g.sync(list(board.values())))
        settle = await _rounds(peers, board, 2, steps=0)  # no new training: the grid finishes the average
        return peers, board, trained, spread_trained, pulled, settle

    peers, board, trained, spread_trained, pulled, settle = asyncio.run(scenario())
    for reports in trained + settle:
        for r in reports:
            assert len(r.expected_block) <= 3 and len(r.expected_emb) <= 3  # groups of at most 4
            assert r.participation == 1.0 and r.rejected == 0  # no BaseMismatch, nobody outside the group
    assert any(len(r.expected_block) == 3 for r in trained[0])
    assert pulled == [[]] * 8  # the re-sync rule does not fire in group mode
    assert len({rec.base_hash for rec in board.values()}) == 1  # every record announces the one anchor
    assert spread_trained > 1e-4  # groups averaged apart ...
    assert _spread(peers) < 1e-6  # ... and two grid rounds (4 x 2) bring every replica to the one mean


def test_blocks_in_groups_with_the_table_all_to_all_keep_one_table():
    """group_size 4, table_group_size 0 (the default): blocks average in groups, the byte table among every peer,
    so every peer ends each round on the same table bits while the block replicas average apart."""

    async def scenario():
        peers, _, board = memory_swarm([0] * 8, codec="int8", blocks=2, group_size=4)
        _patient(peers)
        return peers, await _rounds(peers, board, 2)

    peers, reports = asyncio.run(scenario())
    for r in (r for rs in reports for r in rs):
        assert len(r.expected_block) <= 3 and len(r.expected_emb) == 7 and r.participation == 1.0
    assert len({g.state.emb_hash for g in peers}) == 1 and _spread(peers) > 1e-4


@pytest.mark.slow
def test_group_rounds_with_int8_reach_consensus_within_a_few_rounds():
    async def scenario():
        peers, _, board = memory_swarm([0] * 8, codec="int8", blocks=2, group_size=4, table_group_size=4)
        _patient(peers)
        await _rounds(peers, board, 2)
        before = _spread(peers)
        await _rounds(peers, board, 6, steps=0)
        return before, _spread(peers)

    before, after = asyncio.run(scenario())
    assert after < 0.05 * before


@pytest.mark.slow
def test_a_full_round_re_anchors_every_replica_bit_identically():
    async def scenario():
        peers, _, board = memory_swarm(
            [0] * 6, codec="int8", blocks=2, group_size=4, table_group_size=4, group_full_every=2
        )
        _patient(peers)
        reports = await _rounds(peers, board, 2)  # round 0: everybody; round 1: groups (anchored)
        anchored = all(g.anchors[BLOCK].active for g in peers)
        reports += await _rounds(peers, board, 1)  # round 2: everybody again, from the anchor
        return peers, reports, anchored

    peers, reports, anchored = asyncio.run(scenario())
    assert anchored and [len(r.expected_block) for r in reports[0]] == [5] * 6
    assert all(len(r.expected_block) < 5 for r in reports[1])
    assert all(r.participation == 1.0 for r in reports[2])
    assert len({g.state.block_hash for g in peers}) == 1 and len({g.state.emb_hash for g in peers}) == 1
    assert not any(g.anchors[BLOCK].active or g.anchors[EMB].active for g in peers)


@pytest.mark.slow
def test_a_late_joiner_in_group_mode_pulls_the_anchor_and_joins_the_groups():
    async def scenario():
        peers, _, board = memory_swarm([0] * 7, codec="fp32", blocks=2, group_size=4, table_group_size=4)
        joiner = peers.pop()
        del board[joiner.me.peer_id]
        await _rounds(peers, board, 2)
        anchor_hash = peers[0].anchors[BLOCK].hash
        board[joiner.me.peer_id] = joiner.record()
        pulled = await joiner.sync(list(board.values()))
        current = await joiner.fetch_block(peers[0].record())  # predecessors / CE: the merged block itself
        return peers, joiner, anchor_hash, pulled, current

    peers, joiner, anchor_hash, pulled, current = asyncio.run(scenario())
    assert "block" in pulled and joiner.state.block_hash == anchor_hash and joiner.state.round == peers[0].state.round
    assert peers[0].state.block_hash != anchor_hash
    assert all(torch.equal(current[k], peers[0].state.base_block[k]) for k in current)


@pytest.mark.slow
def test_a_byzantine_member_is_bounded_in_its_group():
    """One member sends a x1000 payload (within the norm bound's reach): the robust merge clips it for its group."""

    async def scenario():
        peers, _, board = memory_swarm([0] * 8, codec="fp32", blocks=2, group_size=4, table_group_size=4)
        _patient(peers)
        await _rounds(peers, board, 1)
        bad = peers[0]
        honest_before = {id(g): {k: v.clone() for k, v in g.state.base_block.items()} for g in peers}
        original = bad.state.deltas

        def inflated():
            block, emb = original()
            return {k: v * 1000 for k, v in block.items()}, emb

        bad.state.deltas = inflated  # type: ignore[method-assign]
        reports = await _rounds(peers, board, 1)
        return peers, bad, reports, honest_before

    peers, bad, reports, before = asyncio.run(scenario())
    group = set(reports[0][0].expected_block)
    moved = [
        relative_distance(before[id(g)], g.state.base_block) for g in peers if g.me.peer_id in group and g is not bad
    ]
    assert moved and max(moved) < 0.05  # a x1000 delta would move the block by far more


# -- real daemons -----------------------------------------------------------------------------
@pytest.mark.swarm
@pytest.mark.slow
def test_five_daemons_on_the_real_dht_average_in_groups(tmp_path):
    """Five replicas of one block in groups of at most 2: every round each daemon merges with at most one other,
    nobody is refused or re-synced, every record announces the one anchor, and the replicas stay close."""
    from swarm_utils import daemon_config, running

    reports: list[list] = []

    def cfg(seed: int, peers: tuple[str, ...] = ()):
        c = daemon_config(tmp_path, 0, seed=seed, initial_peers=peers, max_rounds=4, min_peers=5, codec="int8")
        return replace(c, gossip=replace(c.gossip, group_size=2))

    async def scenario():
        async with running(cfg(0), reports=reports) as (d0,):
            peers = tuple(d0.discovery.multiaddrs())
            async with running(*(cfg(s, peers) for s in range(1, 5)), reports=reports) as rest:
                daemons = [d0, *rest]
                await asyncio.wait_for(asyncio.gather(*(d.serve() for d in daemons)), 240)
        return daemons

    daemons = asyncio.run(scenario())
    assert [d.state.round for d in daemons] == [4] * 5
    merged = [r for log in reports for r in log]
    assert len(merged) == 20
    assert all(len(r.expected_block) <= 1 and len(r.expected_emb) <= 1 for r in merged)  # groups of at most 2
    assert sum(len(r.accepted_block) for r in merged) >= 10  # the groups did exchange
    # no delta on another base, none from outside the group (a late one, stale_round, can happen on a busy machine)
    assert all(d.metrics.rejected_by_reason.get(why, 0) == 0 for d in daemons for why in ("base_mismatch", "invalid"))
    assert len({d.gossip.record().base_hash for d in daemons}) == 1  # one anchor, so the re-sync rule stays quiet
    assert all(d.gossip.anchors[BLOCK].active for d in daemons)
    premerge = max(r.premerge_distance for r in merged)
    assert max(relative_distance(daemons[0].state.base_block, d.state.base_block) for d in daemons) < premerge


def test_protocol_simulation_agrees_within_a_few_rounds_at_flat_bytes():
    from swarmd.core.config import ModelConfig
    from swarmd.sim.protocol import ProtocolConfig, simulate

    model = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=16)
    small, large = (
        simulate(ProtocolConfig(peers=n, blocks=2, rounds=5, regime="lockstep", merge="mean"), model) for n in (16, 48)
    )
    for out in (small, large):
        assert out["rounds_to_1e-3"] is not None and out["rounds_to_1e-3"] <= 5
        assert out["dht_ops_per_peer_round"] == 4  # whatever the swarm size
    assert large["bytes_per_peer_round"] < 1.5 * small["bytes_per_peer_round"]  # k bounds the fan-out
    assert large["all_to_all_bytes_per_peer_round"] > 3 * small["all_to_all_bytes_per_peer_round"]
