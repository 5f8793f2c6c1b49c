"""ReplicaAdamW (swarmd.core.optim): AdamW at K = 1 bit for bit, the K-replica denominator by hand, state
interchange with AdamW, and the plumbing (TrainConfig.replica_adam, BlockState.set_replicas, the simulator);
replica_gain, the same ratio applied to a round's delta (the simulator's rg variant)."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from swarm_utils import batches, tiny_model, tiny_train

from swarmd.averaging.state import BlockState
from swarmd.core.data import ByteData, load_bytes
from swarmd.core.optim import ReplicaAdamW, replica_gain
from swarmd.core.train import BlockTrainer
from swarmd.sim.engine import SimConfig, Simulator
from swarmd.sim.policies import Lockstep
from swarmd.sim.regimes import regime_named

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(opt_cls, grads: list[torch.Tensor], replicas: float | None = None, **kw) -> torch.Tensor:
    p = torch.nn.Parameter(torch.tensor([0.5, -0.25, 1.0]))
    opt = opt_cls([p], lr=0.1, betas=(0.9, 0.95), weight_decay=0.01, **kw)
    if replicas is not None:
        opt.set_replicas(replicas)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach().clone()


GRADS = [torch.tensor([1.0, -2.0, 0.5]), torch.tensor([-1.0, -1.5, 0.4]), torch.tensor([0.8, -2.5, -0.6])]


def test_one_replica_is_adamw_bit_for_bit():
    assert torch.equal(_run(ReplicaAdamW, GRADS), _run(torch.optim.AdamW, GRADS))
    assert torch.equal(_run(ReplicaAdamW, GRADS, replicas=1), _run(torch.optim.AdamW, GRADS))


def test_k_replica_denominator_by_hand():
    lr, b1, b2, wd, eps, k = 0.1, 0.9, 0.95, 0.01, 1e-8, 4.0
    p = torch.tensor([0.5, -0.25, 1.0], dtype=torch.float64)
    m = torch.zeros(3, dtype=torch.float64)
    v = torch.zeros(3, dtype=torch.float64)
    for t, g in enumerate(GRADS, start=1):
        g = g.double()
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mh, vh = m / (1 - b1**t), v / (1 - b2**t)
        vk = mh**2 + (vh - mh**2).clamp_min(0) / k
        p = p - lr * mh / (vk.sqrt() + eps)
    assert torch.allclose(_run(ReplicaAdamW, GRADS, replicas=k).double(), p, atol=1e-6)


def test_noise_dominated_coordinate_steps_further_than_adamw():
    """A coordinate whose gradient flips sign (noise) moves more with K = 4; a steady one moves the same."""
    gen = torch.Generator().manual_seed(0)
    grads = [torch.tensor([1.0, 0.1 + float(torch.randn(1, generator=gen))]) for _ in range(40)]

    def moved(cls, replicas=None):
        p = torch.nn.Parameter(torch.zeros(2))
        opt = cls([p], lr=0.01, betas=(0.9, 0.95))
        if replicas:
            opt.set_replicas(replicas)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        return p.detach().abs()

    plain, four = moved(torch.optim.AdamW), moved(ReplicaAdamW, 4)
    assert math.isclose(float(four[0]), float(plain[0]), rel_tol=1e-4)  # steady gradient: |step| = lr either way
    assert float(four[1]) > 1.3 * float(plain[1])


def test_state_moves_between_adamw_and_replica_adamw():
    p1 = torch.nn.Parameter(torch.tensor([0.5, -0.25, 1.0]))
    a = torch.optim.AdamW([p1], lr=0.1)
    p1.grad = GRADS[0].clone()
    a.step()
    p2 = torch.nn.Parameter(p1.detach().clone())
    r = ReplicaAdamW([p2], lr=0.1, replicas=2)
    r.load_state_dict(copy.deepcopy(a.state_dict()))  # (torch shares the step tensor otherwise)
    for opt, p in ((a, p1), (r, p2)):
        p.grad = GRADS[1].clone()
        opt.step()
    assert set(r.state[p2]) == set(a.state[p1]) == {"step", "exp_avg", "exp_avg_sq"}
    assert float(r.state[p2]["step"]) == float(a.state[p1]["step"]) == 2.0
    assert torch.equal(r.state[p2]["exp_avg_sq"], a.state[p1]["exp_avg_sq"])
    back = torch.optim.AdamW([torch.nn.Parameter(p2.detach().clone())], lr=0.1)
    back.load_state_dict(copy.deepcopy(r.state_dict()))  # and back


@pytest.mark.parametrize("bad", [0, 0.5, float("nan"), -1])
def test_replicas_below_one_are_refused(bad):
    with pytest.raises(ValueError, match="replicas"):
        ReplicaAdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.1, replicas=bad)


def test_train_config_picks_the_optimizer_and_block_state_sets_k():
    model = tiny_model()
    plain = BlockTrainer(model, tiny_train(), 0, "cpu")
    assert type(plain.opt) is torch.optim.AdamW
    plain.set_replicas(4)  # a plain AdamW ignores it
    replica = BlockState(BlockTrainer(model, dataclasses.replace(tiny_train(), replica_adam=True), 0, "cpu"))
    assert isinstance(replica.trainer.opt, ReplicaAdamW) and replica.trainer.opt.replicas == 1.0
    replica.set_replicas(3)
    assert replica.trainer.opt.replicas == 3.0
    replica.set_replicas(0)  # a merge that counted nobody (cannot happen: own is counted) stays AdamW
    assert replica.trainer.opt.replicas == 1.0
    stats = replica.train_steps(2, batches(0))
    assert math.isfinite(stats["ce"])


def test_simulator_sets_k_to_the_block_deltas_merged(tmp_path):
    from swarm_utils import write_corpus

    path = write_corpus(tmp_path)
    model = tiny_model()
    train = dataclasses.replace(tiny_train(), replica_adam=True)
    data = ByteData(load_bytes(path), model.seq_len)
    eval_xy = ByteData(load_bytes(path), model.seq_len).eval_windows(64)
    cfg = SimConfig(model, train, workers=3, rounds=1, steps_per_round=2, eval_tokens=64)
    regime = regime_named("lockstep")
    sim = Simulator(cfg, regime, Lockstep(), data, eval_xy)
    sim.run()
    assert {w.state.trainer.opt.replicas for w in sim.workers} == {3.0}


def test_the_flag_reaches_run_join_and_the_demo_peers(tmp_path):
    from cli.options import TrainOptions
    from swarmd.tools.launch import LocalSwarm

    fields = dict.fromkeys(("batch_size", "lr", "seed", "trajectory_prob", "freeze_z_in", "predecessor_pulls"))
    fields["prefetch_pulls"] = None
    fields["handoff_weight"] = fields["pipeline"] = fields["pipeline_stagger"] = fields["block_init"] = None
    fields["grow"] = None
    assert TrainOptions(**fields, replica_adam=True).config().replica_adam is True
    assert TrainOptions(**fields, replica_adam=False).config().replica_adam is False
    assert TrainOptions(**fields, replica_adam=None).config().replica_adam is TrainOptions.DEFAULTS["replica_adam"]
    (tmp_path / "t.txt").write_bytes(b"text " * 100)
    for value in (True, False):
        swarm = LocalSwarm(
            2, tiny_model(), tmp_path / "t.txt", tmp_path / "w", rounds=1, steps_per_round=2, replica_adam=value
        )
        assert swarm.config.train.replica_adam is value


def test_a_daemon_round_sets_k_to_the_block_deltas_it_merged():
    import asyncio

    from swarm_utils import memory_round, memory_swarm

    async def scenario():
        train = dataclasses.replace(tiny_train(), replica_adam=True)
        peers, _, board = memory_swarm([0, 0, 0, 1], codec="fp32", train=train)
        await memory_round(peers, board)
        return peers

    peers = asyncio.run(scenario())
    assert [g.state.trainer.opt.replicas for g in peers] == [3.0, 3.0, 3.0, 1.0]  # block 1's peer is alone: AdamW


def test_replica_gain_scales_noise_by_sqrt_k_and_leaves_signal_and_k1_alone():
    """A coordinate whose AdamW moments say pure noise (m = 0) gets sqrt(K); one whose gradient never varied
    (v = m^2) keeps its delta; K = 1 and names without state are left as they were."""
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.95))
    opt.state[p] = {
        "step": torch.tensor(1000.0),
        "exp_avg": torch.tensor([0.0, 2.0]),
        "exp_avg_sq": torch.tensor([4.0, 4.0]),
    }
    delta = {"w": torch.tensor([1.0, -3.0]), "buffer": torch.tensor([5.0])}
    out = replica_gain(opt, {"w": p}, delta, 4)
    assert torch.allclose(out["w"], torch.tensor([2.0, -3.0]), rtol=1e-3)
    assert torch.equal(out["buffer"], delta["buffer"])
    assert replica_gain(opt, {"w": p}, delta, 1) is delta


def test_the_simulator_scales_each_delta_only_when_asked(tmp_path):
    """SimConfig.replica_gain changes the run (the deltas sent are scaled); off, the run is the plain swarm's."""
    from swarm_utils import write_corpus

    path = write_corpus(tmp_path)
    model = tiny_model()
    data = ByteData(load_bytes(path), model.seq_len)
    eval_xy = ByteData(load_bytes(path), model.seq_len).eval_windows(64)

    def run(gain: bool) -> float:
        cfg = SimConfig(model, tiny_train(), workers=2, rounds=2, steps_per_round=3, eval_tokens=64, replica_gain=gain)
        return Simulator(cfg, regime_named("lockstep"), Lockstep(), data, eval_xy).run().ce

    plain = run(False)
    assert plain == run(False)
    assert run(True) != plain
