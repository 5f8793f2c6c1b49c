"""The swarm's schedules as pure rules (swarmd.core.schedule): which block trains in which round, when a block
opens, how peers spread over the training blocks, and the open-ended rule; and the simulated swarm that runs them
(swarmd.sim.scheduled): its staffing, warm starts and clock on pinned step costs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.schedule import allocate, first_round, open_after, open_blocks, total_rounds, training_blocks
from swarmd.sim.costs import StepCosts
from swarmd.sim.engine import SimConfig
from swarmd.sim.policies import make_policy
from swarmd.sim.regimes import Dist, Regime
from swarmd.sim.scheduled import ScheduledSimulator, SchedulePlan


def test_concurrent_trains_every_block_every_round():
    assert [training_blocks("concurrent", r, 3, 5) for r in (1, 7, 100)] == [[0, 1, 2]] * 3
    assert first_round("concurrent", 2, 3, 5) == 1


def test_sequential_trains_one_block_per_turn_then_nothing():
    got = [training_blocks("sequential", r, 3, 2) for r in range(1, 9)]
    assert got == [[0], [0], [1], [1], [2], [2], [], []]
    assert total_rounds("sequential", 3, 2, 2) == 6


def test_grow_opens_a_block_every_growth_phase_and_keeps_the_open_ones_training():
    got = [training_blocks("grow", r, 3, 2) for r in range(1, 8)]
    assert got == [[0], [0], [0, 1], [0, 1], [0, 1, 2], [0, 1, 2], [0, 1, 2]]
    assert [first_round("grow", b, 3, 2) for b in range(3)] == [1, 3, 5]
    assert [open_blocks("grow", r, 3, 2) for r in (1, 2, 3, 5, 50)] == [1, 1, 2, 3, 3]
    assert total_rounds("grow", 3, 2, 10) == 14  # the last block opens at round 5 and trains 10 rounds


def test_allocate_puts_every_peer_on_a_training_block_newest_first():
    assert allocate(4, [0], 4) == [4, 0, 0, 0]
    assert allocate(4, [0, 1], 4) == [2, 2, 0, 0]
    assert allocate(4, [0, 1, 2], 4) == [1, 1, 2, 0]  # the uneven share goes to the newest block
    assert allocate(2, [0, 1, 2], 3) == [0, 1, 1]  # too few peers: the earliest block goes without
    assert allocate(8, [0, 1, 2, 3], 4) == [2, 2, 2, 2]
    assert sum(allocate(7, [0, 1, 2], 3)) == 7


def test_pinned_peers_sit_out_when_their_block_does_not_train():
    assert allocate(8, [1], 4, pinned=True) == [0, 2, 0, 0]
    assert allocate(6, [0, 1, 2, 3], 4, pinned=True) == [2, 2, 1, 1]


def test_unknown_schedule_and_bad_turns_are_refused():
    with pytest.raises(ValueError, match="unknown schedule"):
        training_blocks("zigzag", 1, 3, 2)
    with pytest.raises(ValueError, match=">= 1"):
        open_blocks("grow", 1, 3, 0)


def test_open_after_waits_for_patience_rounds_below_the_threshold():
    assert not open_after([], 0.01)
    assert not open_after([0.5, 0.005], 0.01, patience=2)
    assert open_after([0.5, 0.005, 0.002], 0.01, patience=2)
    assert not open_after([0.005, 0.002, 0.02], 0.01, patience=2)  # a late gain resets it
    assert open_after([0.001], 0.01, patience=1)


# -- the simulated swarm on pinned costs -------------------------------------------------------------------------
CFG = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=16)
TRAIN = TrainConfig(batch_size=4, lr=3e-3, warmup_steps=2, predecessor_pulls=4)  # the clock tests price four pulls
COSTS = StepCosts((0.01, 0.02), 0.05, block_bytes=1_000, table_bytes=2_000, activation_bytes=500)
STEADY = Regime("steady", Dist(0.1), Dist(0.0), Dist(1e6))  # no jitter, 1 MB/s, no latency: a hand-checked clock


def _data(seed: int) -> ByteData:
    return ByteData(np.random.default_rng(seed).integers(0, 256, 20_000, dtype=np.uint8), CFG.seq_len)


def _sim(plan: SchedulePlan, rounds: int = 4, steps: int = 3, costs: StepCosts = COSTS) -> ScheduledSimulator:
    cfg = SimConfig(CFG, TRAIN, workers=1, rounds=rounds, steps_per_round=steps, eval_tokens=64)
    return ScheduledSimulator(
        cfg, STEADY, make_policy("lockstep", STEADY, steps), _data(0), _data(1).eval_windows(64), plan, costs
    )


def test_pinned_costs_give_the_pinned_clock_and_busy_share():
    torch.manual_seed(0)
    sim = _sim(SchedulePlan("concurrent", peers=2, turn=1), rounds=2)
    result = sim.run()
    # every round: the slower block's 3 steps x 0.02 s, stretched to nothing by pulls (4 x 1,000 B at 1 MB/s =
    # 4 ms < 60 ms), then its uploads (a few hundred bytes at 1 MB/s)
    for rec, sched in zip(result.rounds, sim.records):
        assert 0.06 <= rec.seconds < 0.07
        assert sched.staffing == [1, 1]
        assert sched.busy_share == pytest.approx((0.03 + 0.06) / (2 * rec.seconds))
        assert sched.pull_bytes == 4 * 1_000  # block 1's four predecessor pulls of block 0


def test_a_daemons_fixed_round_and_pull_costs_lengthen_every_round_but_are_not_busy_time():
    plan = SchedulePlan("concurrent", peers=2, turn=1)
    torch.manual_seed(0)
    free = _sim(plan, rounds=2).run()
    torch.manual_seed(0)
    sim = _sim(plan, rounds=2, costs=replace(COSTS, round_s=0.5, pull_s=0.1))
    priced = sim.run()
    for a, b, sched in zip(free.rounds, priced.rounds, sim.records):
        assert b.seconds == pytest.approx(a.seconds + 0.5 + 4 * 0.1)  # block 1 pulls block 0 four times a round
        assert sched.busy_share == pytest.approx((0.03 + 0.06) / (2 * b.seconds))  # the steps only
    assert priced.ce == free.ce  # the clock moved, the training did not


def test_a_balanced_swarm_s_cheaper_block_takes_the_steps_that_fill_the_slower_block_s_round():
    """Block 0's step costs half block 1's: balanced (cap 2), it takes 6 steps a round to block 1's 3, its round as
    long as block 1's, every peer busy the whole round but for the exchange; a sequential turn is never balanced."""
    torch.manual_seed(0)
    sim = _sim(SchedulePlan("concurrent", peers=2, turn=1, balance_steps=2.0), rounds=2)
    result = sim.run()
    assert sim.block_steps == (6, 3)
    assert [w.state.trainer.step_count for w in sim.heads()] == [12, 6]
    for rec, sched in zip(result.rounds, sim.records):
        assert 0.06 <= rec.seconds < 0.07  # the slower block's 3 x 0.02 s, as unbalanced
        assert sched.busy_share == pytest.approx((0.06 + 0.06) / (2 * rec.seconds))
    assert _sim(SchedulePlan("sequential", peers=2, turn=2, balance_steps=2.0)).block_steps == (3, 3)


def test_grow_staffs_block_0_with_every_peer_then_splits_and_warm_starts_block_1():
    torch.manual_seed(0)
    sim = _sim(SchedulePlan("grow", peers=2, turn=2), rounds=4)
    block1_init = {k: v.clone() for k, v in sim.keepers[1].state.base_block.items()}
    result = sim.run()
    assert [s.staffing for s in sim.records] == [[2, 0], [2, 0], [1, 1], [1, 1]]
    # the peer that comes to block 1 downloads its block and the table (and pulls block 0)
    assert sim.records[2].pull_bytes == 4 * 1_000 + 1_000 + 2_000
    # both peers train block 0: all they wait for is the upload
    assert sim.records[0].busy_share == pytest.approx(2 * 0.03 / (2 * result.rounds[0].seconds))
    moved = sum(float((sim.keepers[1].state.base_block[k] - block1_init[k]).abs().sum()) for k in block1_init)
    assert moved > 0  # block 1 trained, from block 0's warm start
    kept = sim.keepers[0].state.base_block
    assert all(w.block in (0, 1) for w in sim.workers) and len(sim.workers) == 2
    assert torch.equal(sim.workers[0].state.base_block["pos"], kept["pos"])


def test_sequential_with_pinned_peers_leaves_half_of_them_idle():
    torch.manual_seed(0)
    sim = _sim(SchedulePlan("sequential", peers=2, turn=1, pinned=True), rounds=2)
    sim.run()
    assert [s.staffing for s in sim.records] == [[1, 0], [0, 1]]
    assert all(s.busy_share <= 0.5 + 1e-9 for s in sim.records)


def test_a_worker_holds_gradients_and_optimizer_state_for_its_own_block_only():
    torch.manual_seed(0)
    sim = _sim(SchedulePlan("grow", peers=2, turn=1), rounds=3)
    sim.run()
    for w in sim.workers:
        trainer = w.state.trainer
        owned = {id(p) for p in (*trainer.block.parameters(), *trainer.emb.parameters())}
        in_optimizer = {id(p) for g in trainer.opt.param_groups for p in g["params"]}
        assert in_optimizer <= owned
        for other in trainer.others.values():
            assert all(p.grad is None and not p.requires_grad for p in other.parameters())


def test_step_costs_round_trip_and_refuse_nonsense():
    assert StepCosts.from_dict(COSTS.to_dict()) == COSTS
    assert COSTS.later_over_first() == pytest.approx(2.0)
    with pytest.raises(ValueError):
        StepCosts((0.0,), 0.1, 1, 1, 1)
    with pytest.raises(ValueError):
        StepCosts((0.1,), 0.1, 1, 1, 1, round_s=-1.0)
    old = {k: v for k, v in COSTS.to_dict().items() if k != "round_s"}  # costs stored before round_s: free rounds
    assert StepCosts.from_dict(old).round_s == 0.0


# -- TrainConfig.grow in one process and in a daemon's plan ------------------------------------------------------
def test_grow_trains_block_b_from_its_opening_to_the_end_with_no_extra_rounds():
    from swarmd.core.local_run import BlockStack

    train = TrainConfig(batch_size=2, pipeline=True, grow=True, pipeline_stagger=2, trajectory_prob=0.0)
    assert train.extra_rounds(3) == 0 and TrainConfig(pipeline=True, pipeline_stagger=2).extra_rounds(3) == 4
    cfg = ModelConfig(blocks=3, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=16)
    stack = BlockStack(cfg, train, ByteData(np.random.default_rng(0).integers(0, 256, 5_000, dtype=np.uint8), 16))
    steps = []
    for r in range(1, 7):
        stack.train_round(1, round_no=r, rounds=6)
        steps.append([t.step_count for t in stack.trainers])
    assert steps == [[1, 0, 0], [2, 0, 0], [3, 1, 0], [4, 2, 0], [5, 3, 1], [6, 4, 2]]


def test_a_growing_daemon_plans_every_block_to_the_run_s_end():
    from swarmd.node.config import DaemonConfig
    from swarmd.node.training import run_plan

    grow = TrainConfig(pipeline=True, grow=True, pipeline_stagger=3)
    config = DaemonConfig(model=ModelConfig(blocks=3), train=grow, max_rounds=20)
    last, window = run_plan(config, 0)
    assert last == 20 and window == (0, 0)  # no extra rounds; every block trains without end until the run stops
    from swarmd.core.pipeline import pipeline_rounds

    assert [pipeline_rounds(b, *window, grow.pipeline_stagger) for b in range(3)] == [(1, 0), (4, 0), (7, 0)]
    open_ended = DaemonConfig(model=ModelConfig(blocks=3), train=grow)  # `run` / `join` without --max-rounds
    assert run_plan(open_ended, 0) == (0, (0, 0))


# -- the clocks and curves ------------------------------------------------------------------------------------
def test_curves_read_at_a_time_and_find_the_target_between_measurements():
    from swarmd.sim.curves import busy_share, ce_at, time_to

    curve = [(0.0, 5.0), (10.0, 3.0), (20.0, 2.0), (30.0, 1.5)]
    assert ce_at(curve, -1) == 5.0 and ce_at(curve, 15) == 3.0 and ce_at(curve, 30) == 1.5
    assert time_to(curve, 2.5) == pytest.approx(15.0)  # halfway from 3.0 at 10 s to 2.0 at 20 s
    assert time_to(curve, 2.0) == 20.0 and time_to(curve, 1.0) is None and time_to(curve, 6.0) == 0.0
    assert busy_share([1.0, 2.0], [1.0, 1.0], peers=2) == pytest.approx(0.75)


def test_reference_clocks_on_pinned_costs():
    from swarmd.sim.costs import e2e_one_peer_s, pipelined_e2e_s, priced_regime, sync_dp_ideal_s
    from swarmd.sim.regimes import regime_named

    assert e2e_one_peer_s(COSTS, 100) == pytest.approx(5.0) and sync_dp_ideal_s(COSTS, 100) == pytest.approx(5.0)
    # 4 stages: compute 0.0125 s a stage; 2 x 500 B at 1 MB/s = 1 ms: compute-bound, plus the fill (3 x 2 x 10 ms)
    assert pipelined_e2e_s(COSTS, 100, 4, 1e6, 0.01) == pytest.approx(100 * 0.0125 + 0.06)
    # at 10 kB/s the boundary transfer (0.1 s a step) sets the pace
    assert pipelined_e2e_s(COSTS, 100, 4, 1e4, 0.0) == pytest.approx(10.0)
    wan = regime_named("wan-mid")
    priced = priced_regime(wan, 0.01)  # 10x faster steps than the preset's: the network 10x faster too
    assert priced.compute_s.median == 0.01 and priced.latency_s.median == pytest.approx(wan.latency_s.median / 10)
    assert priced.bandwidth_Bps.median == pytest.approx(wan.bandwidth_Bps.median * 10)
    assert priced.deadline_s(25) == pytest.approx(wan.deadline_s(25) / 10)


def test_trajectory_replay_refreshes_the_whole_buffer_every_r_steps_and_keeps_the_batch_size(monkeypatch):
    from swarmd.core import train as train_module
    from swarmd.core.train import BlockTrainer, init_block

    cfg = ModelConfig(blocks=3, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=16)
    train = TrainConfig(batch_size=6, trajectory_reuse=0)
    trainer = BlockTrainer(cfg, train, 2)
    assert trainer.reuse() == 2 and BlockTrainer(cfg, train, 0).reuse() == 1
    trainer.set_others({b: init_block(cfg, b) for b in range(2)})
    calls: list[int] = []  # windows per predecessor-forward call
    real_prefix = train_module.trajectory_prefix
    monkeypatch.setattr(
        train_module, "trajectory_prefix", lambda *a, **kw: calls.append(a[2].shape[0]) or real_prefix(*a, **kw)
    )
    data = _data(3).stream(0, 6)
    batches = [next(data)[0] for _ in range(5)]
    trained: list[torch.Tensor] = []
    for x in batches:
        trainer.step(x, x)
        assert trainer.replay is not None
        trained.append(trainer.replay[0])
    assert calls == [6, 6, 6]  # steps 1, 3 and 5 run the predecessors, each on its whole batch
    # steps 1-2 train on batch 1's windows, 3-4 on batch 3's, 5 on batch 5's: each window serves R = 2 steps
    for step, source in enumerate([0, 0, 2, 2, 4]):
        assert torch.equal(trained[step], batches[source])
