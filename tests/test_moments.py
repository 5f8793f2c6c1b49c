"""swarmd.sim.moments: a block's replicas average their AdamW moments, by hand and inside a simulator run."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData, load_bytes
from swarmd.sim.engine import SimConfig, Simulator
from swarmd.sim.moments import average_moments
from swarmd.sim.policies import Lockstep
from swarmd.sim.regimes import regime_named


def stepped(seed: int) -> torch.optim.AdamW:
    torch.manual_seed(seed)
    p = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.AdamW([p, torch.nn.Parameter(torch.zeros(2))], lr=1e-2)  # the second never gets a grad
    p.grad = torch.randn(3, 2)
    opt.step()
    return opt


def moment(opt, key: str) -> torch.Tensor:
    """key's state of the optimizer's parameters that have one, flattened into one tensor."""
    params = [p for group in opt.param_groups for p in group["params"]]
    return torch.cat([opt.state[p][key].flatten() for p in params if key in opt.state.get(p, {})])


def test_the_first_moment_becomes_the_mean_and_the_second_stays():
    a, b = stepped(0), stepped(1)
    mean = (moment(a, "exp_avg") + moment(b, "exp_avg")) / 2
    second = moment(a, "exp_avg_sq"), moment(b, "exp_avg_sq")
    assert average_moments([a, b], ("exp_avg",)) == 1  # the grad-less parameter has no state: left alone
    for opt, sq in zip((a, b), second, strict=True):
        assert torch.allclose(moment(opt, "exp_avg"), mean)
        assert torch.equal(moment(opt, "exp_avg_sq"), sq)
    assert average_moments([a], ("exp_avg",)) == 0
    with pytest.raises(ValueError):
        average_moments([a, b], ("momentum_buffer",))


def test_a_simulated_block_syncs_its_replicas_moments_on_schedule(text_data):
    model = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=64, seq_len=16)
    train = ByteData(load_bytes(text_data / "train.txt")[:50_000], model.seq_len)
    held_out = ByteData(load_bytes(text_data / "eval.txt")[:10_000], model.seq_len).eval_windows(256)
    cfg = SimConfig(model, TrainConfig(batch_size=4, warmup_steps=2), workers=2, rounds=2, steps_per_round=2)

    def replicas_moments(c: SimConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
        sim = Simulator(c, regime_named("lockstep"), Lockstep(), train, held_out)
        sim.run()
        opts = [w.state.trainer.opt for w in sim.workers[: c.workers]]  # block 0's replicas
        return [(moment(o, "exp_avg"), moment(o, "exp_avg_sq")) for o in opts]

    (m_a, v_a), (m_b, v_b) = replicas_moments(replace(cfg, sync_first_moment=2))  # synced at round 2, the last
    assert torch.equal(m_a, m_b) and not torch.equal(v_a, v_b)
    (m_a, v_a), (m_b, v_b) = replicas_moments(replace(cfg, sync_first_moment=2, sync_second_moment=1))
    assert torch.equal(m_a, m_b) and torch.equal(v_a, v_b)
    (m_a, _), (m_b, _) = replicas_moments(cfg)
    assert not torch.equal(m_a, m_b)
    with pytest.raises(ValueError):
        replace(cfg, sync_first_moment=-1)


def test_moments_due_follows_each_schedule():
    from swarmd.sim.moments import moments_due

    assert moments_due(3, 3, 6) == ("exp_avg",)
    assert moments_due(6, 3, 6) == ("exp_avg", "exp_avg_sq")
    assert moments_due(4, 3, 6) == () and moments_due(5, 0, 0) == ()
