"""Pins the DiffusionBlocks mechanics to hand-computed values (diffusionblocks.md sections 3-7).

Every config here starts from the documented block (ModelConfig.documented) and names the issue-8
options it tests, so a test means the same whatever the defaults are.
"""

import math
from dataclasses import replace

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
    got = partition_boundaries(ModelConfig.documented(blocks=blocks))
    assert got == pytest.approx(expected, abs=1e-4)


def test_partition_for_image_range():
    got = partition_boundaries(ModelConfig.documented(blocks=3, sigma_lo=0.002, sigma_hi=80.0))
    assert got == pytest.approx([0.002, 0.1796, 0.5050, 80], abs=1e-4)


def test_gamma_widening_b3():
    cfg = ModelConfig.documented(blocks=3)
    # block 2 owns the lowest interval, block 0 the highest (clipped to the global range)
    assert block_interval(cfg, 2) == pytest.approx((1.0, 1.364), abs=1e-3)
    assert block_interval(cfg, 1) == pytest.approx((1.315, 2.116), abs=1e-3)
    assert block_interval(cfg, 0) == pytest.approx((1.914, 10.0), abs=1e-3)


def test_no_gamma_gives_exact_partition():
    cfg = ModelConfig.documented(blocks=3, gamma=0.0)
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
    cfg = ModelConfig.documented(blocks=3)
    s = sample_sigma(cfg, 0, 200_000, torch.Generator().manual_seed(0))
    lo, hi = block_interval(cfg, 0)
    assert float(s.min()) >= lo and float(s.max()) <= hi
    # the doc: median about 2.8, 13% of draws above 5, 2.3% above 8 (not uniform in log sigma)
    assert float(s.median()) == pytest.approx(2.8, abs=0.1)
    assert float((s > 5).float().mean()) == pytest.approx(0.13, abs=0.015)
    assert float((s > 8).float().mean()) == pytest.approx(0.023, abs=0.005)


def test_block_lookup_and_clamp():
    cfg = ModelConfig.documented(blocks=3)
    assert block_for_sigma(cfg, 10.0) == 0
    assert block_for_sigma(cfg, 50.0) == 0
    assert block_for_sigma(cfg, 2.0711) == 1  # right-closed bucket
    assert block_for_sigma(cfg, 1.6232) == 1
    assert block_for_sigma(cfg, 1.3436) == 2
    assert block_for_sigma(cfg, 1.0) == 2
    assert block_for_sigma(cfg, 0.5) == 2


def test_sampler_schedule_and_block_order():
    assert sampler_schedule(ModelConfig.documented(blocks=3)) == pytest.approx([10, 1.6232, 1], abs=1e-4)
    assert sampler_schedule(ModelConfig.documented(blocks=4)) == pytest.approx([10, 2.0711, 1.3436, 1], abs=1e-4)
    plan = sampler_plan(ModelConfig.documented(blocks=4))
    assert [b for b, _, _ in plan] == [0, 1, 2, 3]
    assert plan[-1][2] is None  # the last step returns logits at sigma_lo, no step to 0
    six = sampler_plan(ModelConfig.documented(blocks=3), steps=6)
    assert [b for b, _, _ in six] == sorted(b for b, _, _ in six)  # blocks run in order 0..B-1


def test_one_euler_step_by_hand():
    table = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    logits = torch.tensor([[[math.log(3.0), 0.0]]])  # p = (0.75, 0.25) -> D = (0.75, 0.25)
    z = torch.tensor([[[2.0, -4.0]]])
    out = euler_update(z, logits, table, sigma=10.0, sigma_next=2.5)
    # (2.5/10) z + (1 - 2.5/10) D = 0.25 (2, -4) + 0.75 (0.75, 0.25)
    assert out.flatten().tolist() == pytest.approx([0.5 + 0.5625, -1.0 + 0.1875])


def test_start_noise_scale():
    cfg = ModelConfig.documented(blocks=3, d_model=64)
    z = start_noise(cfg, (64, 64, 64), torch.Generator().manual_seed(0))
    assert float(z.std()) == pytest.approx(math.sqrt(101), rel=0.01)


def test_embedding_rows_are_unit_norm():
    emb = ByteEmbedding(ModelConfig.documented(**TINY))
    assert torch.allclose(emb.normalized().norm(dim=-1), torch.ones(256), atol=1e-6)


def test_gradient_reaches_only_its_block_and_the_table():
    cfg = ModelConfig.documented(blocks=2, **TINY)
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
    cfg = ModelConfig.documented(blocks=1, **TINY)
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
    cfg = ModelConfig.documented(blocks=3, **TINY)
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
        ModelConfig.documented(**bad)


# ---------------------------------------------------------------------------------------------
# Issue 8 mechanics: context_input, z_in_init, freeze_z_in, pred_input (defaults = documented).
# ---------------------------------------------------------------------------------------------
def test_new_fields_keep_default_hash_and_init():
    # hashes computed by the code before the issue 8 fields existed: peers on either side agree
    assert ModelConfig.documented().config_hash() == "05523195af4f092b"
    # the default is the issue-8 block (measured best), a different identity from the documented one
    assert ModelConfig() == ModelConfig.documented(
        context_input="own_table",
        z_in_init="zero",
        noise_embedding="off",
        pred_input="feature",
        pred_output="add",
        handoff_loss="prev_byte",
        pred_in_init="identity",
    )
    # the issue-8 block keeps its identity; the default since issue 19 adds the hand-off term and the identity start
    assert replace(ModelConfig(), handoff_loss="none", pred_in_init="zero").config_hash() == "b8752cc70e007cc1"
    assert ModelConfig().config_hash() != "b8752cc70e007cc1"
    assert ModelConfig.documented(blocks=3, **dict(TINY, n_heads=2)).config_hash() == "03a9d1aa4757074b"
    assert ModelConfig.documented(pred_input="feature").config_hash() != ModelConfig.documented().config_hash()
    torch.manual_seed(0)
    keys = set(DenoisingBlock(ModelConfig.documented(**TINY)).state_dict())
    assert "ctx_table" not in keys and not any(k.startswith("pred_in") for k in keys)


@pytest.mark.parametrize("bad", [dict(context_input="raw"), dict(z_in_init="one"), dict(pred_input="logits")])
def test_bad_issue8_values_are_refused(bad):
    with pytest.raises(ValueError):
        ModelConfig.documented(**bad)


def test_own_table_context_and_zero_noise_path():
    cfg = ModelConfig.documented(blocks=1, context_input="own_table", z_in_init="zero", **TINY)
    torch.manual_seed(0)
    block = DenoisingBlock(cfg).eval()
    table_hat = ByteEmbedding(cfg).normalized()
    x = torch.tensor([[3, 7, 3]])
    ctx = block.context(x, table_hat)
    assert torch.equal(ctx, block.ctx_table[x])  # the block's own rows, not sqrt(d) e_hat
    assert float(block.ctx_table.detach().std()) == pytest.approx(0.02, rel=0.05)
    assert float(block.z_in.weight.detach().abs().sum()) == 0.0 and float(block.z_in.bias.detach().abs().sum()) == 0.0
    # with W_z = 0 the output does not depend on z at all
    z1, z2 = torch.randn(1, 3, 32), 10 * torch.randn(1, 3, 32)
    with torch.no_grad():
        assert torch.equal(block(ctx, z1, torch.zeros(1)), block(ctx, z2, torch.zeros(1)))
    default = DenoisingBlock(ModelConfig.documented(blocks=1, **TINY))
    assert torch.allclose(default.context(x, table_hat), math.sqrt(32) * table_hat[x])


def test_pred_feature_path_starts_at_zero_and_is_carried_by_the_sampler():
    cfg = ModelConfig.documented(blocks=3, pred_input="feature", **TINY)
    torch.manual_seed(0)
    blocks = [DenoisingBlock(cfg).eval() for _ in range(3)]
    emb = ByteEmbedding(cfg)
    x = torch.randint(0, 256, (2, 16))
    z0 = start_noise(cfg, (2, 16, 32), torch.Generator().manual_seed(1))
    base, _ = sample_from_noise(blocks, emb.normalized(), x, cfg, z0=z0)
    none_cfg = ModelConfig.documented(blocks=3, **TINY)
    plain, _ = sample_from_noise(blocks, emb.normalized(), x, none_cfg, z0=z0)
    assert torch.allclose(base, plain, atol=1e-6)  # zero-initialised W_p: identical until trained
    with torch.no_grad():
        for b in blocks:
            b.pred_in.weight.normal_(0, 0.5)
    changed, _ = sample_from_noise(blocks, emb.normalized(), x, cfg, z0=z0)
    assert not torch.allclose(changed, plain, atol=1e-3)
    # by hand: step i hands LN_f(h) of its block to step i + 1
    from swarmd.core.model import euler_step

    z, feature = z0, None
    for b, s, s_next in sampler_plan(cfg):
        logits, z, feature = euler_step(blocks[b], emb.normalized(), x, z, s, s_next, pred=feature)
    assert torch.allclose(logits, changed, atol=1e-5)


def _incremental_sweep_equals_full(cfg, n: int, prefix: int, randomise_out: bool) -> None:
    """LocalSweeper over random-message blocks: a cached sweep of a prefix then one position at a time equals
    one full sweep (the message enters per position, like z, so the KV cache needs nothing new)."""
    import asyncio

    from swarmd.serve.inference import LocalSweeper

    torch.manual_seed(0)
    blocks = [DenoisingBlock(cfg) for _ in range(cfg.blocks)]
    with torch.no_grad():
        for b in blocks:
            b.pred_in.weight.normal_(0, 0.3)
            if randomise_out:
                b.out.weight.normal_(0, 0.3)
    sweeper = LocalSweeper(cfg, blocks, ByteEmbedding(cfg))
    x = torch.randint(0, 256, (1, n))
    z = start_noise(cfg, (1, n, 32), torch.Generator().manual_seed(2))

    async def run():
        full = await sweeper.sweep("full", x, z, 0, False)
        parts = [await sweeper.sweep("inc", x[:, :prefix], z[:, :prefix], 0, True)]
        for t in range(prefix, n):
            parts.append(await sweeper.sweep("inc", x[:, t : t + 1], z[:, t : t + 1], t, True))
        return full, torch.cat(parts, dim=1)

    full, inc = asyncio.run(run())
    assert torch.allclose(full, inc, atol=1e-4)


def test_pred_feature_kv_cache_matches_full_sweep():
    cfg = ModelConfig.documented(blocks=3, pred_input="feature", context_input="own_table", **TINY)
    _incremental_sweep_equals_full(cfg, n=10, prefix=4, randomise_out=False)


def test_pred_feature_training_no_gradient_across_blocks():
    from swarmd.core.config import TrainConfig
    from swarmd.core.train import BlockTrainer, init_block, init_embedding, trajectory_inputs

    cfg = ModelConfig.documented(blocks=3, pred_input="feature", context_input="own_table", z_in_init="zero", **TINY)
    tcfg = TrainConfig(batch_size=4, trajectory_prob=1.0, freeze_z_in="block0")
    others = {b: init_block(cfg, b) for b in range(2)}
    with torch.no_grad():
        for b in others.values():
            b.pred_in.weight.normal_(0, 0.3)
    before = {b: [p.detach().clone() for p in blk.parameters()] for b, blk in others.items()}
    trainer = BlockTrainer(cfg, tcfg, 2)
    trainer.set_others(others, table=init_embedding(cfg))
    x, y = torch.randint(0, 256, (4, 16)), torch.randint(0, 256, (4, 16))
    _, feature = trajectory_inputs(
        {**others, 2: trainer.block},
        init_embedding(cfg).normalized(),
        x,
        torch.ones(4),
        cfg,
        2,
        torch.Generator().manual_seed(0),
    )
    assert feature is not None and feature.shape == (4, 16, 32) and not feature.requires_grad
    for _ in range(2):
        trainer.step(x, y)
    for b, blk in others.items():
        assert all(torch.equal(p, q) for p, q in zip(blk.parameters(), before[b]))
        assert all(p.grad is None for p in blk.parameters())
    assert float(trainer.block.pred_in.weight.detach().abs().sum()) > 0  # block 2 learns to read the message
    assert float(trainer.block.z_in.weight.detach().abs().sum()) > 0  # later blocks keep a trained noise path
    first = BlockTrainer(cfg, tcfg, 0)
    first.step(x, y)
    assert not first.block.z_in.weight.requires_grad and float(first.block.z_in.weight.detach().abs().sum()) == 0.0


def test_checkpoint_round_trip_of_issue8_fields(tmp_path):
    import json

    from swarmd.core.checkpoint import load_model, save_model

    cfg = ModelConfig.documented(blocks=2, pred_input="feature", context_input="own_table", z_in_init="zero", **TINY)
    torch.manual_seed(0)
    blocks = {b: DenoisingBlock(cfg) for b in range(2)}
    emb = ByteEmbedding(cfg)
    save_model(tmp_path / "ck", cfg, blocks, emb)
    got_cfg, got_blocks, _, _ = load_model(tmp_path / "ck")
    assert got_cfg == cfg
    assert torch.equal(got_blocks[1].ctx_table, blocks[1].ctx_table) and torch.equal(
        got_blocks[1].pred_in.weight, blocks[1].pred_in.weight
    )
    # a checkpoint written before these fields existed (no keys) still loads with the documented defaults
    plain = ModelConfig.documented(blocks=2, **TINY)
    save_model(tmp_path / "old", plain, {b: DenoisingBlock(plain) for b in range(2)}, ByteEmbedding(plain))
    body = json.loads((tmp_path / "old" / "config.json").read_text())
    for k in ("context_input", "z_in_init", "pred_input"):
        body["model"].pop(k)
    (tmp_path / "old" / "config.json").write_text(json.dumps(body))
    old_cfg, _, _, _ = load_model(tmp_path / "old")
    assert old_cfg == plain


def test_pred_output_add_starts_at_the_predecessor_estimate():
    cfg = ModelConfig.documented(blocks=3, pred_input="feature", pred_output="add", **TINY)
    assert cfg.message_dim == 64 and ModelConfig.documented().message_dim == 0
    torch.manual_seed(0)
    blocks = [DenoisingBlock(cfg).eval() for _ in range(3)]
    emb = ByteEmbedding(cfg)
    x = torch.randint(0, 256, (2, 16))
    z0 = start_noise(cfg, (2, 16, 32), torch.Generator().manual_seed(1))
    from swarmd.core.train import init_block

    blocks = [init_block(cfg, b).eval() for b in range(3)]  # blocks 1 and 2 start with F = 0, block 0 does not
    assert (
        float(blocks[0].out.weight.detach().abs().sum()) > 0 and float(blocks[2].out.weight.detach().abs().sum()) == 0
    )
    _, steps = sample_from_noise(blocks, emb.normalized(), x, cfg, z0=z0, trace=True)
    # z_hat_b = z_hat_{b-1} + c_out F_b with F_b = 0: every later step repeats block 0's logits
    assert torch.allclose(steps[1], steps[0], atol=1e-5) and torch.allclose(steps[2], steps[0], atol=1e-5)
    # block 0 has no predecessor: the documented c_skip z + c_out F
    from swarmd.core.model import denoise, precondition

    s = torch.full((2,), 10.0)
    pc = precondition(s)
    with torch.no_grad():
        f = blocks[0](blocks[0].context(x, emb.normalized()), pc.c_in[:, None, None] * z0, pc.c_noise)
    want = (pc.c_skip[:, None, None] * z0 + pc.c_out[:, None, None] * f) @ emb.normalized().T
    assert torch.allclose(denoise(blocks[0], emb.normalized(), x, z0, s)[0], want, atol=1e-5)


def test_pred_output_add_kv_cache_matches_full_sweep():
    cfg = ModelConfig.documented(blocks=3, pred_input="feature", pred_output="add", context_input="own_table", **TINY)
    _incremental_sweep_equals_full(cfg, n=9, prefix=3, randomise_out=True)


def test_freeze_z_in_all_zeroes_and_freezes_every_blocks_noise_path():
    from swarmd.core.config import TrainConfig
    from swarmd.core.train import BlockTrainer

    cfg = ModelConfig(blocks=3, **TINY)
    for b in range(3):
        trainer = BlockTrainer(cfg, TrainConfig(batch_size=2, freeze_z_in="all"), b)
        assert not trainer.block.z_in.weight.requires_grad and float(trainer.block.z_in.weight.abs().sum()) == 0.0
    with pytest.raises(ValueError, match="freeze_z_in"):
        TrainConfig(freeze_z_in="later")
