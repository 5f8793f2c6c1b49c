"""Delayed averaging (GossipConfig.overlap, swarmd.averaging.delayed / overlap): the correction rule by hand, replicas'
bases bit-identical with overlap on, the simulator's late merges, real daemons with overlap, and a stop mid-overlap."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from swarm_utils import batches, daemon_config, memory_swarm, running, tiny_model, tiny_train, wait_until

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.context import BLOCK
from swarmd.averaging.deadline import DeadlinePolicy
from swarmd.averaging.delayed import corrected, land_merge
from swarmd.averaging.state import BlockState, relative_distance, weights_hash
from swarmd.core.train import BlockTrainer
from swarmd.node.rounds import STOP_GRACE_S
from swarmd.sim.engine import SimConfig, Simulator
from swarmd.sim.policies import Lockstep
from swarmd.sim.regimes import custom_regime

pytestmark = pytest.mark.usefixtures("one_thread")


def _state(seed: int = 0) -> BlockState:
    return BlockState(BlockTrainer(tiny_model(), tiny_train(), 0, worker_seed=seed))


def _live(state: BlockState) -> tuple[dict, dict]:
    return state.current()


def test_the_correction_by_hand():
    def t(*v):
        return {"w": torch.tensor(v, dtype=torch.float32)}

    # base_r = 1, own delta 3 (live was 4 at the snapshot), one more step meanwhile (live 5), merged delta 2
    out = corrected(live=t(5.0, -1.0), old_base=t(1.0, 0.0), new_base=t(3.0, 0.5), own=t(3.0, -1.0))
    assert torch.equal(out["w"], t(4.0, 0.5)["w"])  # new base + the step taken meanwhile (1, 0)


def test_land_merge_moves_the_base_by_the_merge_and_keeps_the_steps_taken_meanwhile():
    state, stream = _state(), batches(0)
    base_block, base_emb = {k: v.clone() for k, v in state.base_block.items()}, dict(state.base_emb)
    state.train_steps(3, stream)
    own_block, own_emb = state.deltas()  # the snapshot publish() takes
    state.train_steps(2, stream)  # the next round's steps, taken while the exchange runs
    live_block, live_emb = _live(state)
    merged_block = {k: 0.5 * v for k, v in own_block.items()}  # what the swarm agreed on (any delta)
    merged_emb = {k: 0.25 * v for k, v in own_emb.items()}
    land_merge(state, merged_block, merged_emb, own_block, own_emb)
    assert state.round == 1
    for k in base_block:  # base_{r+1} = base_r + merged_r, exactly as apply_merge computes it
        assert torch.equal(state.base_block[k], base_block[k] + merged_block[k])
    now_block, now_emb = _live(state)
    for now, live, old, new, own in (
        (now_block, live_block, base_block, state.base_block, own_block),
        (now_emb, live_emb, base_emb, state.base_emb, own_emb),
    ):
        assert max(float((live[k] - old[k] - own[k]).abs().max()) for k in now) > 0  # the two steps moved them
        for k in now:
            meanwhile = live[k] - old[k] - own[k]
            assert torch.allclose(now[k], new[k] + meanwhile, atol=1e-6)  # kept on top of the new base
            assert torch.allclose(now[k], live[k] + (new[k] - old[k]) - own[k], atol=1e-6)  # live += merged - own
    next_block, _ = state.deltas()  # the next delta holds exactly the steps taken meanwhile
    assert all(
        torch.allclose(next_block[k], live_block[k] - base_block[k] - own_block[k], atol=1e-6) for k in next_block
    )


def test_land_merge_without_steps_meanwhile_is_the_plain_merge_bit_for_bit():
    a, b, stream_a, stream_b = _state(), _state(), batches(1), batches(1)
    a.train_steps(3, stream_a)
    b.train_steps(3, stream_b)
    own_block, own_emb = a.deltas()
    merged = ({k: 0.5 * v for k, v in own_block.items()}, {k: 0.5 * v for k, v in own_emb.items()})
    a.apply_merge(*merged)
    land_merge(b, *merged, own_block, own_emb)
    assert (a.round, a.block_hash, a.emb_hash) == (b.round, b.block_hash, b.emb_hash)
    for x, y in zip(_live(a), _live(b), strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)  # live = the new base, as without overlap
    moments = [next(iter(s.trainer.opt.state.values()))["exp_avg"] for s in (a, b)]
    assert torch.equal(*moments)  # AdamW state untouched by either merge


def test_replicas_bases_stay_bit_identical_with_overlap_on():
    """Two replicas and a third peer on another block: each round's exchange runs while both replicas keep
    training (different data, different steps meanwhile); after every landing their bases are bit-identical."""
    peers, _, board = memory_swarm([0, 0, 1], overlap=True, group_size=0)
    streams = [batches(10 + i) for i in range(len(peers))]

    async def scenario():
        for round in range(3):
            records = list(board.values())
            for g in peers:
                await g.sync(records)
                await g.open_round()
            for i, g in enumerate(peers):
                await asyncio.to_thread(g.state.train_steps, 2, streams[i])
            averages = [asyncio.create_task(g.average(records)) for g in peers]
            await asyncio.gather(*(g.current.ready.wait() for g in peers))  # every snapshot taken
            # the next round's steps, during the exchange; peer i takes i + 1 of them
            meanwhile = [asyncio.to_thread(g.state.train_steps, i + 1, streams[i]) for i, g in enumerate(peers)]
            reports = await asyncio.gather(*averages, *meanwhile)
            for g in peers:
                board[g.me.peer_id] = g.record()
            a, b, c = peers
            assert [r.participation for r in reports[:3]] == [1.0, 1.0, 1.0]
            assert a.state.round == b.state.round == c.state.round == round + 1
            assert (
                a.state.block_hash == b.state.block_hash
                and relative_distance(a.state.base_block, b.state.base_block) == 0
            )
            assert a.state.emb_hash == b.state.emb_hash == c.state.emb_hash
            live_a, live_b = a.state.current()[0], b.state.current()[0]
            assert relative_distance(live_a, a.state.base_block) > 0  # live kept the steps taken meanwhile
            assert relative_distance(live_a, live_b) > 0

    asyncio.run(scenario())


def test_rebase_sets_the_base_bits_and_keeps_the_steps_taken_meanwhile():
    """BlockState.rebase (a one-group round's exact landing): base := the given bits, live keeps live - base."""
    state, stream = _state(), batches(2)
    target = {k: v + 0.01 for k, v in state.base_block.items()}
    state.rebase(target, None)  # no steps taken: live is the target, bit for bit
    assert all(torch.equal(state.base_block[k], target[k]) for k in target)
    assert all(torch.equal(_live(state)[0][k], target[k]) for k in target)
    state.train_steps(2, stream)
    pending = state.deltas()[0]
    target = {k: v - 0.02 for k, v in state.base_block.items()}
    emb_base, emb_live = dict(state.base_emb), _live(state)[1]
    state.rebase(target, None)
    assert all(torch.equal(state.base_block[k], target[k]) for k in target)
    assert state.block_hash == weights_hash(target)
    assert all(torch.equal(state.base_emb[k], emb_base[k]) for k in emb_base)  # a part not given: untouched
    assert all(torch.equal(_live(state)[1][k], emb_live[k]) for k in emb_live)
    assert all(torch.allclose(state.deltas()[0][k], pending[k], atol=1e-6) for k in target)
    assert max(float(v.abs().max()) for v in pending.values()) > 0


def test_group_replicas_with_overlap_on_land_their_group_merge_and_keep_their_steps():
    """Overlap with group averaging (4 replicas in pairs, an all-peer round every second round): every round the
    members of a group hold one base bit for bit, an all-peer round lands on every replica exactly (rebase, not
    adopt: the steps taken during the exchange survive it), and live keeps the steps taken meanwhile."""
    peers, _, board = memory_swarm(
        [0] * 4, overlap=True, group_size=2, group_full_every=2, merge="mean", deadline_max_s=20.0
    )
    for g in peers:
        g.deadline = DeadlinePolicy(replace(g.cfg, deadline_min_s=10.0, deadline_max_s=20.0), target=0)
    streams = [batches(20 + i) for i in range(len(peers))]

    async def scenario():
        for round in range(3):
            records = list(board.values())
            for g in peers:
                await g.sync(records)
                await g.open_round()
            for i, g in enumerate(peers):
                await asyncio.to_thread(g.state.train_steps, 2, streams[i])
            averages = [asyncio.create_task(g.average(records)) for g in peers]
            await asyncio.gather(*(g.current.ready.wait() for g in peers))
            meanwhile = [asyncio.to_thread(g.state.train_steps, i + 1, streams[i]) for i, g in enumerate(peers)]
            reports = (await asyncio.gather(*averages, *meanwhile))[: len(peers)]
            for g in peers:
                board[g.me.peer_id] = g.record()
            by_id = {g.me.peer_id: g for g in peers}
            assert all(r.participation == 1.0 and r.rejected == 0 for r in reports)
            for g, r in zip(peers, reports):
                assert len(r.expected_block) == (3 if round % 2 == 0 else 1)
                assert all(by_id[m].state.block_hash == g.state.block_hash for m in r.expected_block)
                assert relative_distance(g.state.current()[0], g.state.base_block) > 0  # steps meanwhile kept
            if round % 2 == 1:
                assert len({g.state.block_hash for g in peers}) == 2 and all(g.anchors[BLOCK].active for g in peers)
            else:
                assert len({g.state.block_hash for g in peers}) == 1 and not any(g.anchors[BLOCK].active for g in peers)

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def corpus(text_data):
    from swarmd.core.data import ByteData, load_bytes

    model = tiny_model()
    return (
        ByteData(load_bytes(text_data / "train.txt")[:100_000], model.seq_len),
        ByteData(load_bytes(text_data / "eval.txt")[:20_000], model.seq_len),
    )


def _sim(corpus, overlap: bool, rounds: int = 3) -> Simulator:
    cfg = SimConfig(tiny_model(), tiny_train(), workers=2, rounds=rounds, steps_per_round=2, eval_tokens=256)
    net = custom_regime(0.1, 0.0, 0.05, 0.0, 100.0, 0.0, dropout=0.0, deadline=None)  # 0.2 s compute, fixed upload
    return Simulator(replace(cfg, overlap=overlap), net, Lockstep(), corpus[0], corpus[1].eval_windows(256))


def test_the_simulator_lands_merges_one_round_late_with_the_same_steps(corpus):
    with torch.random.fork_rng(devices=[]):
        plain = _sim(corpus, False).run()
    with torch.random.fork_rng(devices=[]):
        sim = _sim(corpus, True)
        late = sim.run()
    with torch.random.fork_rng(devices=[]):
        again = _sim(corpus, True).run()
    assert late.to_dict() == again.to_dict()  # deterministic
    assert late.ce != plain.ce  # the stale steps change the trajectory ...
    assert abs(late.ce - plain.ce) < 0.5  # ... not the outcome
    steps = [w.state.local_steps for w in sim.workers]
    assert steps == [3 * 2] * len(sim.workers)  # the same steps as without overlap
    for b in range(2):  # replicas of a block end bit-identical, base and (after the final landing) live
        w0, w1 = sim.workers[2 * b], sim.workers[2 * b + 1]
        assert w0.state.block_hash == w1.state.block_hash and w0.state.round == 3
        assert relative_distance(w0.state.current()[0], w1.state.current()[0]) == 0
    # the exchange hides behind the next round's steps: shorter simulated time for the same rounds
    assert late.sim_wall_s < plain.sim_wall_s
    assert late.rounds[-1].t_s == pytest.approx(sum(r.seconds for r in late.rounds))


def test_a_lone_replica_loses_nothing_to_a_late_merge_and_partial_overlap_runs(corpus):
    """One worker per block, lossless codec: its merge is its own delta, so landing it late (after 1 or all
    of the next round's steps) is exact bookkeeping and the CE matches merging at once."""
    cfg = SimConfig(
        tiny_model(blocks=1), tiny_train(), workers=1, rounds=3, steps_per_round=2, codec="fp32", eval_tokens=256
    )
    net = custom_regime(0.1, 0.0, 0.05, 0.0, 100.0, 0.0, dropout=0.0, deadline=None)
    ces = []
    for overlap, steps in ((False, 0), (True, 0), (True, 1)):
        with torch.random.fork_rng(devices=[]):
            sim = Simulator(
                replace(cfg, overlap=overlap, overlap_steps=steps),
                net,
                Lockstep(),
                corpus[0],
                corpus[1].eval_windows(256),
            )
            ces.append([r.ce for r in sim.run().rounds])
    assert ces[1] == pytest.approx(ces[0], abs=1e-4) and ces[2] == pytest.approx(ces[0], abs=1e-4)
    with pytest.raises(ValueError, match="overlap_steps"):
        replace(cfg, overlap_steps=3)


def test_the_simulator_lands_group_merges_late_per_worker(corpus):
    """Overlap with group averaging in the simulator (4 replicas in pairs, an all-peer round every second
    round): each worker lands its own group's merge late, a pair ends on one base, an all-peer round on one
    base for all, and the lossless pairs' late merges keep the CE near merging at once."""
    cfg = SimConfig(
        tiny_model(blocks=1), tiny_train(), workers=4, rounds=4, steps_per_round=2, codec="fp32", eval_tokens=256
    )
    net = custom_regime(0.1, 0.0, 0.05, 0.0, 100.0, 0.0, dropout=0.0, deadline=None)
    gossip = GossipConfig(group_size=2, group_full_every=2, merge="mean")
    ces, spreads = [], []
    for overlap in (False, True):
        with torch.random.fork_rng(devices=[]):
            sim = Simulator(
                replace(cfg, overlap=overlap), net, Lockstep(), corpus[0], corpus[1].eval_windows(256), gossip=gossip
            )
            rounds = []
            for _ in range(3):
                rounds.append(sim.step())
                spreads.append(sim.consensus())
            sim.drain()
            spreads.append(sim.consensus())
            ces.append(sim.measure())
        assert all(r.accepted == 4 for r in rounds)
    at_once, late = spreads[:4], spreads[4:]  # after rounds 0 (all), 1 (pairs), 2 (all), and the drain
    assert at_once[0] == 0 and at_once[1] > 1e-4 and at_once[2] == 0 and at_once[3] == 0
    assert late[0] == 0 and late[1] == 0  # nothing landed / round 0's all-peer merge landed exactly ...
    assert late[2] > 1e-4 and late[3] == 0  # ... the pairs apart; the drain lands round 2's all-peer merge
    assert ces[1] == pytest.approx(ces[0], abs=0.05)


@pytest.mark.swarm
@pytest.mark.parametrize("overlap_steps", [0, 1])
def test_two_real_daemons_with_overlap_merge_every_round_and_stay_identical(tmp_path, overlap_steps):
    configs = [daemon_config(tmp_path, 0, seed=i, discovery="static", max_rounds=3, checkpoint=True) for i in range(2)]
    configs = [
        replace(c, gossip=replace(c.gossip, overlap=True, overlap_steps=overlap_steps, group_size=0)) for c in configs
    ]
    reports: list[list] = []

    async def scenario():
        async with running(*configs, reports=reports) as daemons:
            addresses = [d.server.address for d in daemons]
            for d in daemons:
                d.discovery.addresses = addresses
            await asyncio.wait_for(asyncio.gather(*(d.serve() for d in daemons)), 90)
            return daemons

    a, b = asyncio.run(scenario())
    assert [[r.round for r in log] for log in reports] == [[0, 1, 2], [0, 1, 2]]  # every round merged once
    assert all(r.participation == 1.0 for log in reports for r in log)
    assert a.state.round == b.state.round == 3
    assert a.state.block_hash == b.state.block_hash and a.state.emb_hash == b.state.emb_hash
    assert a.state.local_steps == b.state.local_steps == 3 * 2
    for i in range(2):  # the checkpoint holds the merged base of the last round
        body = json.loads((tmp_path / f"ckpt{i}" / "config.json").read_text())
        assert body["round"] == 3 and len(body["history"]) == 3


@pytest.mark.swarm
def test_a_stop_during_an_overlapped_exchange_exits_cleanly_and_resumes(tmp_path):
    """Peer b answers no exchange and runs no round, so every exchange of a waits for its deadline (3 s) while a
    trains the next round; a stop then lands or abandons the exchange within the stop grace, and a resumes."""
    configs = [
        daemon_config(tmp_path, 0, seed=i, discovery="static", checkpoint=True, steps=4, deadline_max_s=3.0)
        for i in range(2)
    ]
    configs = [replace(c, gossip=replace(c.gossip, overlap=True, group_size=0)) for c in configs]

    async def hang(incoming):
        await asyncio.Event().wait()

    async def first_run():
        async with running(*configs) as (a, b):
            for d in (a, b):
                d.discovery.addresses = [a.server.address, b.server.address]
            b.gossip.handle_exchange = hang
            task = asyncio.create_task(a.serve())
            try:
                await wait_until(
                    lambda: a.state.round >= 1 and a.overlap.pending is not None, 60, what="round 2 in flight"
                )
                stopped = time.monotonic()
                a.stop()  # SIGTERM's path
                await asyncio.wait_for(task, 30)
                return a, time.monotonic() - stopped
            finally:
                if not task.done():
                    task.cancel()

    a, seconds = asyncio.run(first_run())
    assert seconds < STOP_GRACE_S + 5.0  # the exchange in flight did not hold the stop to its deadline
    assert a.overlap.pending is None and a.server is None and a.discovery is None  # shut down
    body = json.loads((tmp_path / "ckpt0" / "config.json").read_text())
    assert body["round"] == a.state.round >= 1  # one generation: the last merged base and its round

    async def second_run():
        async with running(configs[0]) as (r,):
            resumed = (r.state.round, r.state.block_hash)
            r.discovery.addresses = [r.server.address]
            assert await r.run_round() is None  # the first overlapped round publishes; nothing has landed yet
            report = await r.overlap.drain()
            return resumed, report, r.state.round

    (round, block_hash), report, after = asyncio.run(second_run())
    assert (round, block_hash) == (a.state.round, a.state.block_hash)
    assert report is not None and report.round == round and after == round + 1


def test_the_overlap_flag_reaches_the_daemon_config_and_its_json():
    from dataclasses import fields

    from typer.testing import CliRunner

    from cli import options as o
    from cli.main import app
    from swarmd.core.config import ModelConfig
    from swarmd.node.config import DaemonConfig

    assert "--overlap" in CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output
    given = {f.name: o.PeerOptions.DEFAULTS.get(f.name) for f in fields(o.PeerOptions)}
    train = o.TrainOptions(**{f.name: None for f in fields(o.TrainOptions)})
    for overlap, steps in ((False, 0), (True, 5)):
        peer = o.PeerOptions(**{**given, "overlap": overlap, "overlap_steps": steps, "group_size": 0})
        config = peer.config(ModelConfig(), train, [], Path(__file__), None)
        assert (config.gossip.overlap, config.gossip.overlap_steps) == (overlap, steps)
        again = DaemonConfig.from_dict(json.loads(json.dumps(config.to_dict())))
        assert (again.gossip.overlap, again.gossip.overlap_steps) == (overlap, steps)
