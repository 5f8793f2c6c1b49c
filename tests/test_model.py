"""Pins the DiffusionBlocks mechanics to hand-computed values (diffusionblocks.md sections 3-7)."""

import math

import pytest
import torch

from swarmd.core.config import ModelConfig
from swarmd.core.model import (
    ByteEmbedding,
    DenoisingBlock,
    block_for_sigma,
    block_interval,
    block_loss,
    euler_update,
    partition_boundaries,
    precondition,
    sample_from_noise,
    sample_sigma,
    sampler_plan,
    sampler_schedule,
    start_noise,
)

TINY = dict(layers_per_block=1, d_model=32, n_heads=2, hidden=64, seq_len=16)


@pytest.mark.parametrize(
    "blocks, expected",
    [
        (3, [1, 1.3436, 2.0711, 10]),
        (4, [1, 1.2379, 1.6232, 2.4285, 10]),
        (6, [1, 1.1475, 1.3436, 1.6232, 2.0711, 2.9892, 10]),
    ],
)
def test_partition_boundaries_for_1_10(blocks, expected):
    got = partition_boundaries(ModelConfig(blocks=blocks))
    assert got == pytest.approx(expected, abs=1e-4)


def test_partition_for_image_range():
    got = partition_boundaries(ModelConfig(blocks=3, sigma_lo=0.002, sigma_hi=80.0))
    assert got == pytest.approx([0.002, 0.1796, 0.5050, 80], abs=1e-4)


def test_gamma_widening_b3():
    cfg = ModelConfig(blocks=3)
    # block 2 owns the lowest interval, block 0 the highest (clipped to the global range)
    assert block_interval(cfg, 2) == pytest.approx((1.0, 1.364), abs=1e-3)
    assert block_interval(cfg, 1) == pytest.approx((1.315, 2.116), abs=1e-3)
    assert block_interval(cfg, 0) == pytest.approx((1.914, 10.0), abs=1e-3)


def test_no_gamma_gives_exact_partition():
    cfg = ModelConfig(blocks=3, gamma=0.0)
    assert block_interval(cfg, 1) == pytest.approx((1.3436, 2.0711), abs=1e-4)


@pytest.mark.parametrize(
    "sigma, c_skip, c_out, c_in, c_noise, w",
    [
        (1.0, 0.200, 0.447, 0.894, 0.0, 5.00),
        (2.0711, 0.055, 0.486, 0.469, 0.182, 4.23),
        (10.0, 0.0025, 0.499, 0.0999, 0.576, 4.01),
    ],
)
def test_preconditioning_table(sigma, c_skip, c_out, c_in, c_noise, w):
    pc = precondition(torch.tensor([sigma]), 0.5)
    assert float(pc.c_skip) == pytest.approx(c_skip, abs=6e-4)
    assert float(pc.c_out) == pytest.approx(c_out, abs=6e-4)
    assert float(pc.c_in) == pytest.approx(c_in, abs=6e-4)
    assert float(pc.c_noise) == pytest.approx(c_noise, abs=6e-4)
    assert float(pc.weight) == pytest.approx(w, abs=6e-3)
    # the weight is exactly 1/sigma^2 + 1/sigma_data^2
    assert float(pc.weight) == pytest.approx(1 / sigma**2 + 4.0, rel=1e-6)


def test_truncated_lognormal_sampling_statistics():
    cfg = ModelConfig(blocks=3)
    s = sample_sigma(cfg, 0, 200_000, torch.Generator().manual_seed(0))
    lo, hi = block_interval(cfg, 0)
    assert float(s.min()) >= lo and float(s.max()) <= hi
    # the doc: median about 2.8, 13% of draws above 5, 2.3% above 8 (not uniform in log sigma)
    assert float(s.median()) == pytest.approx(2.8, abs=0.1)
    assert float((s > 5).float().mean()) == pytest.approx(0.13, abs=0.015)
    assert float((s > 8).float().mean()) == pytest.approx(0.023, abs=0.005)


def test_block_lookup_and_clamp():
    cfg = ModelConfig(blocks=3)
    assert block_for_sigma(cfg, 10.0) == 0
    assert block_for_sigma(cfg, 50.0) == 0
    assert block_for_sigma(cfg, 2.0711) == 1  # right-closed bucket
    assert block_for_sigma(cfg, 1.6232) == 1
    assert block_for_sigma(cfg, 1.3436) == 2
    assert block_for_sigma(cfg, 1.0) == 2
    assert block_for_sigma(cfg, 0.5) == 2


def test_sampler_schedule_and_block_order():
    assert sampler_schedule(ModelConfig(blocks=3)) == pytest.approx([10, 1.6232, 1], abs=1e-4)
    assert sampler_schedule(ModelConfig(blocks=4)) == pytest.approx([10, 2.0711, 1.3436, 1], abs=1e-4)
    plan = sampler_plan(ModelConfig(blocks=4))
    assert [b for b, _, _ in plan] == [0, 1, 2, 3]
    assert plan[-1][2] is None  # the last step returns logits at sigma_lo, no step to 0
    six = sampler_plan(ModelConfig(blocks=3), steps=6)
    assert [b for b, _, _ in six] == sorted(b for b, _, _ in six)  # blocks run in order 0..B-1


def test_one_euler_step_by_hand():
    table = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    logits = torch.tensor([[[math.log(3.0), 0.0]]])  # p = (0.75, 0.25) -> D = (0.75, 0.25)
    z = torch.tensor([[[2.0, -4.0]]])
    out = euler_update(z, logits, table, sigma=10.0, sigma_next=2.5)
    # (2.5/10) z + (1 - 2.5/10) D = 0.25 (2, -4) + 0.75 (0.75, 0.25)
    assert out.flatten().tolist() == pytest.approx([0.5 + 0.5625, -1.0 + 0.1875])


def test_start_noise_scale():
    cfg = ModelConfig(blocks=3, d_model=64)
    z = start_noise(cfg, (64, 64, 64), torch.Generator().manual_seed(0))
    assert float(z.std()) == pytest.approx(math.sqrt(101), rel=0.01)


def test_embedding_rows_are_unit_norm():
    emb = ByteEmbedding(ModelConfig(**TINY))
    assert torch.allclose(emb.normalized().norm(dim=-1), torch.ones(256), atol=1e-6)


def test_gradient_reaches_only_its_block_and_the_table():
    cfg = ModelConfig(blocks=2, **TINY)
    blocks = [DenoisingBlock(cfg) for _ in range(2)]
    emb = ByteEmbedding(cfg)
    x = torch.randint(0, 256, (4, 16))
    y = torch.randint(0, 256, (4, 16))
    loss, ce = block_loss(blocks[1], emb, x, y, sample_sigma(cfg, 1, 4))
    loss.backward()
    assert all(p.grad is None for p in blocks[0].parameters())
    assert all(p.grad is not None for p in blocks[1].parameters())
    assert emb.table.grad is not None
    assert float(ce) == pytest.approx(float(loss.detach()) / 4.5, rel=0.2)  # w is about 4-5 on [1, 10]


def test_kv_cache_matches_full_forward():
    cfg = ModelConfig(blocks=1, **TINY)
    block = DenoisingBlock(cfg).eval()
    ctx, z = torch.randn(2, 10, 32), torch.randn(2, 10, 32)
    c = torch.zeros(2)
    with torch.no_grad():
        full = block(ctx, z, c)
        cache = block.new_cache()
        parts = [block(ctx[:, :4], z[:, :4], c, cache)] + [
            block(ctx[:, t : t + 1], z[:, t : t + 1], c, cache) for t in range(4, 10)
        ]
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)


def test_untrained_model_from_noise_ce_is_near_uniform():
    cfg = ModelConfig(blocks=3, **TINY)
    blocks = [DenoisingBlock(cfg) for _ in range(3)]
    emb = ByteEmbedding(cfg)
    x = torch.randint(0, 256, (8, 16))
    y = torch.randint(0, 256, (8, 16))
    logits, steps = sample_from_noise(
        blocks, emb.normalized(), x, cfg, trace=True, generator=torch.Generator().manual_seed(0)
    )
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    assert len(steps) == 3
    assert float(ce) == pytest.approx(math.log(256), abs=0.3)


@pytest.mark.parametrize(
    "bad", [dict(blocks=0), dict(d_model=30, n_heads=4), dict(sigma_lo=5.0, sigma_hi=1.0), dict(gamma=1.5)]
)
def test_bad_config_values_are_refused(bad):
    with pytest.raises(ValueError):
        ModelConfig(**bad)
