"""Phase 2 of the two-phase layout in the daemon's round (swarmd.averaging.phase2): in-process Gossip peers (the
daemon's averaging, swarm_utils.memory_swarm) end each round bit-identical; a stopped peer; a row value's intake
(swarmd.averaging.intake.accept_row) and its signature (the phase field is signed, a delta's bytes unchanged)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch
from swarm_utils import memory_round, memory_swarm

from swarmd.averaging import phase2, phases
from swarmd.averaging.context import BLOCK, EMB
from swarmd.averaging.deadline import DeadlinePolicy
from swarmd.averaging.exchange import plan_groups
from swarmd.averaging.intake import PHASE_ROW, accept_row
from swarmd.averaging.robust import delta_norm
from swarmd.errors import ValidationError
from swarmd.membership.trust import payload_bytes, sign_payload, verify_payload

pytestmark = pytest.mark.usefixtures("one_thread")


def _patient(peers, max_s: float = 20.0) -> None:
    """Every round waits for every member (it still ends as soon as all arrived)."""
    for g in peers:
        g.deadline = DeadlinePolicy(replace(g.cfg, deadline_min_s=max_s / 2, deadline_max_s=max_s), target=0)


def _hashes(peers) -> set[str]:
    return {g.state.block_hash for g in peers}


@pytest.mark.parametrize(("n", "k", "codec"), [(4, 2, "int8"), (6, 4, "int8"), (8, 4, "fp32")])
def test_two_phase_rounds_end_with_bit_identical_replicas(n, k, codec):
    async def scenario():
        peers, _, board = memory_swarm([0] * n, codec=codec, blocks=1, group_size=k, group_layout="two-phase")
        _patient(peers)
        out = []
        for _ in range(2):
            reports = await memory_round(peers, board)
            out.append((reports, _hashes(peers), [g.anchors[BLOCK].active for g in peers]))
        return peers, out

    peers, out = asyncio.run(scenario())
    for reports, hashes, anchored in out:
        assert all(len(r.expected_block) <= k - 1 and r.participation == 1.0 for r in reports)  # phase 1 in rows
        assert len(hashes) == 1  # phase 2: every replica on the same bits
        assert not any(anchored)  # ... which is the new anchor (the next round takes it again)
    assert len({g.state.emb_hash for g in peers}) == 1


def test_a_two_phase_round_lands_the_mean_of_every_replica():
    """fp32, the plain mean merge, 6 replicas in rows of 2: one round lands the base + the mean of all six deltas
    (phase 1: each row's mean; phase 2: the rows' count-weighted mean), within float rounding, on every replica."""

    async def scenario():
        peers, _, board = memory_swarm(
            [0] * 6, codec="fp32", blocks=1, group_size=2, merge="mean", group_layout="two-phase"
        )
        _patient(peers)
        base = {n: t.clone() for n, t in peers[0].state.base_block.items()}
        await memory_round(peers, board)
        return peers, base, [g.current.exact[BLOCK] for g in peers]

    peers, base, deltas = asyncio.run(scenario())
    assert len(_hashes(peers)) == 1
    for n, t in base.items():
        expected = t + torch.stack([d[n] for d in deltas]).mean(0)
        assert torch.allclose(peers[0].state.base_block[n], expected, rtol=0, atol=1e-6)
    assert any(not torch.equal(d[n], deltas[0][n]) for d in deltas for n in d)  # the replicas trained apart


def test_a_stopped_peer_leaves_the_others_completing_rounds():
    """One of 6 peers (k = 2) stops: its row counts one payload, its readers ask its row-mate (fallbacks), every
    live replica still ends the round on the same bits, and the anchor stays (a row merged fewer than its
    members: phase2.exact)."""

    async def scenario():
        peers, transport, board = memory_swarm([0] * 6, codec="int8", blocks=1, group_size=2, group_layout="two-phase")
        _patient(peers, max_s=4.0)
        await memory_round(peers, board)
        transport.dead.add(peers[2].me.address)
        reports = await memory_round(peers, board, skip={2})
        live = [g for i, g in enumerate(peers) if i != 2]
        return live, reports

    live, reports = asyncio.run(scenario())
    assert len(reports) == 5
    assert len(_hashes(live)) == 1 and all(g.anchors[BLOCK].active for g in live)


def test_a_row_value_is_judged_and_its_phase_is_signed():
    async def scenario():
        peers, _, board = memory_swarm([0] * 4, codec="int8", blocks=1, group_size=2, group_layout="two-phase")
        _patient(peers)
        records = list(board.values())
        for g in peers:
            await g.sync(records)
            await g.open_round()
        a, b = peers[0], peers[1]
        for g in (a, b):  # what average() does before its merge: the signed records, the groups and rows
            plan_groups(g, g.current, g.remember(records))
        rows = a.current.rows[BLOCK]
        assert rows is not None and sum(len(r) for r in rows) == 4
        value = {n: torch.full_like(t, 1e-4) for n, t in a.state.base_block.items()}
        parts = {BLOCK: value, EMB: None}
        await phase2.publish(a, a.current, parts, {BLOCK: 2, EMB: 0})
        enc = a.current.phase2.outgoing[BLOCK]
        assert enc.header.phase == PHASE_ROW
        verify_payload(enc)
        # the phase is signed: a payload relabelled as a delta (or a delta as a row value) fails its signature
        enc.header.phase = 0
        with pytest.raises(ValidationError):
            verify_payload(enc)
        enc.header.phase = PHASE_ROW
        row = accept_row(b, b.current, enc, BLOCK)
        assert row == phases.position(rows, a.me.peer_id)[0]
        weight, got = b.current.phase2.got[BLOCK][row]
        assert weight == 2.0 and delta_norm(got) == pytest.approx(delta_norm(value), rel=0.05)
        enc.header.weight = 3.0  # more than the row's size (and no longer what was signed)
        sign_payload(enc, a.identity)
        with pytest.raises(ValidationError):
            accept_row(b, b.current, enc, BLOCK)
        return True

    assert asyncio.run(scenario())


def test_a_delta_signs_the_same_bytes_as_before_the_phase_field():
    from swarmd.v1 import swarm_pb2 as pb

    h = pb.PayloadHeader(swarm_id="s", config_hash="c", round=3, peer_id="p", weight=2.0)
    before = payload_bytes(h, "ab")
    assert before.endswith(b'"ab"]')  # phase 0: no field added
    h.phase = PHASE_ROW
    assert payload_bytes(h, "ab") != before


def test_only_full_rows_all_present_move_the_anchor():
    rows = [["a", "b"], ["c", "d"], ["e"]]
    v = {"w": torch.ones(2)}
    assert phase2.exact(rows, {0: (2.0, v), 1: (2.0, v), 2: (1.0, v)})
    assert not phase2.exact(rows, {0: (2.0, v), 1: (1.0, v), 2: (1.0, v)})  # row 1 merged one of its two
    assert not phase2.exact(rows, {0: (2.0, v), 2: (1.0, v)})  # row 1 missing


def test_combine_clips_one_bad_row_and_leaves_honest_rows_as_they_are():
    honest = [(2.0, {"w": torch.ones(4)}), (2.0, {"w": torch.ones(4) * 1.1})]
    bad = (1.0, {"w": torch.ones(4) * 100.0})
    assert torch.equal(phases.combine_clipped(honest)["w"], phases.combine(honest)["w"])
    out = phases.combine_clipped([*honest, bad])
    assert float(out["w"].max()) < 2.0


@pytest.mark.slow
def test_four_daemons_on_the_real_dht_end_two_phase_rounds_bit_identical(tmp_path):
    """Four replicas of one block in rows of 2 over gRPC and the DHT: every round ends with one block hash."""
    from swarm_utils import daemon_config, running

    reports: list[list] = []

    def cfg(seed: int, peers: tuple[str, ...] = ()):
        c = daemon_config(tmp_path, 0, seed=seed, initial_peers=peers, max_rounds=2, min_peers=4, codec="int8")
        return replace(c, gossip=replace(c.gossip, group_size=2, group_layout="two-phase"))

    async def scenario():
        async with running(cfg(0), reports=reports) as (d0,):
            peers = tuple(d0.discovery.multiaddrs())
            async with running(*(cfg(s, peers) for s in range(1, 4)), reports=reports) as rest:
                daemons = [d0, *rest]
                await asyncio.wait_for(asyncio.gather(*(d.serve() for d in daemons)), 240)
        return daemons

    daemons = asyncio.run(scenario())
    assert [d.state.round for d in daemons] == [2] * 4
    assert all(len(r.expected_block) <= 1 for log in reports for r in log)  # phase 1 in rows of 2
    assert len({d.state.block_hash for d in daemons}) == 1  # phase 2: the replicas end on the same bits
    assert not any(d.gossip.anchors[BLOCK].active for d in daemons)


@pytest.mark.slow
def test_a_daemon_that_stops_mid_run_leaves_the_others_completing_two_phase_rounds(tmp_path):
    """Five replicas in rows of 2; one stops after its first round: the others still complete their rounds (its
    readers ask its row-mate, or leave its row out; a replica that missed a row keeps its anchor, and the re-sync
    rule brings back one that landed apart)."""
    from swarm_utils import daemon_config, running

    reports: list[list] = []

    def cfg(seed: int, peers: tuple[str, ...] = (), rounds: int = 3):
        c = daemon_config(tmp_path, 0, seed=seed, initial_peers=peers, max_rounds=rounds, min_peers=5, codec="int8")
        return replace(c, gossip=replace(c.gossip, group_size=2, group_layout="two-phase"))

    async def scenario():
        async with running(cfg(0), reports=reports) as (d0,):
            peers = tuple(d0.discovery.multiaddrs())
            async with running(*(cfg(s, peers) for s in range(1, 4)), reports=reports) as rest:
                daemons = [d0, *rest]
                async with running(cfg(4, peers, rounds=1), reports=reports) as (stopper,):
                    serving = [asyncio.create_task(d.serve()) for d in daemons]
                    await asyncio.wait_for(stopper.serve(), 120)
                # the stopper is shut down (its server gone) while the others go on
                await asyncio.wait_for(asyncio.gather(*serving), 240)
        return daemons, stopper

    daemons, stopper = asyncio.run(scenario())
    assert stopper.state.round == 1
    assert [d.state.round for d in daemons] == [3] * 4
    assert all(len(log) == 3 for log in reports[:4])  # every round of the others merged and reported
