"""The learning-rate schedule (swarmd.core.train.lr_at) pinned to values computed by hand.

lr_at: linear warmup to lr over warmup_steps (step s gives lr * (s + 1) / warmup_steps), then a
cosine from lr down to lr * min_lr_ratio at total_steps, held there afterwards; total_steps = 0
(or <= warmup_steps) keeps lr constant after the warmup.
"""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
import torch

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.train import BlockTrainer, lr_at

# lr 1e-3, 4 warmup steps, cosine over steps 4..14 (10 steps) down to 1e-3 * 0.1 = 1e-4.
CFG = TrainConfig(lr=1e-3, warmup_steps=4, total_steps=14, min_lr_ratio=0.1)


@pytest.mark.parametrize("step, expected", [(0, 2.5e-4), (1, 5.0e-4), (2, 7.5e-4), (3, 1.0e-3)])
def test_warmup_is_linear_and_reaches_lr_on_its_last_step(step, expected):
    assert lr_at(step, CFG) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "step, expected",
    [
        (4, 1.0e-3),  # progress 0: cos 0 = 1, the peak
        # progress 0.2: cos 36 deg = (1 + sqrt 5) / 4 = 0.809017; 1e-4 + 4.5e-4 * 1.809017 = 9.140576e-4
        (6, 1e-4 + 4.5e-4 * (1 + (1 + math.sqrt(5)) / 4)),
        (9, 5.5e-4),  # progress 0.5: cos 90 deg = 0, half way between 1e-3 and 1e-4
        # progress 0.8: cos 144 deg = -(1 + sqrt 5) / 4; 1e-4 + 4.5e-4 * 0.190983 = 1.859424e-4
        (12, 1e-4 + 4.5e-4 * (1 - (1 + math.sqrt(5)) / 4)),
        (14, 1.0e-4),  # progress 1: cos 180 deg = -1, lr * min_lr_ratio
    ],
)
def test_cosine_after_warmup(step, expected):
    assert lr_at(step, CFG) == pytest.approx(expected, rel=1e-12)


def test_cosine_ends_at_lr_times_min_lr_ratio_and_stays_there():
    floor = CFG.lr * CFG.min_lr_ratio
    assert lr_at(CFG.total_steps, CFG) == pytest.approx(floor, rel=1e-12)
    assert [lr_at(s, CFG) for s in (15, 20, 1000)] == pytest.approx([floor] * 3, rel=1e-12)
    zero_floor = TrainConfig(lr=2e-3, warmup_steps=0, total_steps=8, min_lr_ratio=0.0)
    assert lr_at(0, zero_floor) == pytest.approx(2e-3, rel=1e-12)
    assert lr_at(4, zero_floor) == pytest.approx(1e-3, rel=1e-12)
    assert lr_at(8, zero_floor) == pytest.approx(0.0, abs=1e-18)


def test_constant_lr_when_total_steps_is_zero():
    no_schedule = TrainConfig(lr=3e-4, warmup_steps=0, total_steps=0)
    assert {lr_at(s, no_schedule) for s in (0, 1, 10, 10_000)} == {3e-4}
    warmup_only = TrainConfig(lr=3e-4, warmup_steps=3, total_steps=0)
    assert [lr_at(s, warmup_only) for s in range(3)] == pytest.approx([1e-4, 2e-4, 3e-4], rel=1e-12)
    assert {lr_at(s, warmup_only) for s in (3, 4, 100, 10_000)} == {3e-4}
    # a cosine no longer than the warmup has nothing to decay over: constant lr as well
    short = TrainConfig(lr=3e-4, warmup_steps=5, total_steps=5)
    assert {lr_at(s, short) for s in (5, 6, 500)} == {3e-4}


def test_monotone_rise_in_warmup_and_monotone_decay_after():
    cfg = TrainConfig(lr=1e-3, warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    values = [lr_at(s, cfg) for s in range(130)]
    warmup, decay, after = values[:10], values[10:111], values[110:]  # decay: steps 10 (peak) .. 110 (total_steps)
    assert all(a < b for a, b in pairwise(warmup))
    assert all(a > b for a, b in pairwise(decay))  # strictly down from the peak to total_steps
    assert all(a == b for a, b in pairwise(after))  # then held at the floor
    assert max(values) == pytest.approx(cfg.lr, rel=1e-12) and min(values) >= cfg.lr * cfg.min_lr_ratio * (1 - 1e-12)


def test_later_blocks_run_their_schedule_at_later_lr_scale():
    """TrainConfig.later_lr_scale: every block but block 0 steps at that multiple of the schedule's lr, its table
    copy too (the table's own lr_scale on top); block 0 keeps the schedule; 0 or less is refused."""
    cfg = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=8)
    tcfg = TrainConfig(batch_size=2, lr=1e-3, warmup_steps=4, total_steps=20, later_lr_scale=0.5, table_lr_scale=2.0)
    x = torch.randint(0, 256, (2, 8))
    first, later = BlockTrainer(cfg, tcfg, 0), BlockTrainer(cfg, tcfg, 1)
    for _ in range(6):
        lr0, lr1 = first.step(x, x)["lr"], later.step(x, x)["lr"]
    assert lr0 == pytest.approx(lr_at(5, tcfg)) and lr1 == pytest.approx(0.5 * lr0)
    groups = {g.get("lr_scale", 1.0): g["lr"] for g in later.opt.param_groups}
    assert groups[2.0] == pytest.approx(2 * lr1) and groups[1.0] == pytest.approx(lr1)
    with pytest.raises(ValueError, match="later_lr_scale"):
        TrainConfig(later_lr_scale=0)
