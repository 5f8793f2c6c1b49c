"""The hand-off reconstruction term (ModelConfig.handoff_loss=prev_byte, issue 19): a training-only head on each
block's final feature predicting the previous context byte (prev_skip: and a second one predicting the byte after the
next); inference, gradients and checkpoints stay as they were."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from swarm_utils import random_windows

from swarmd.core.checkpoint import load_model, save_model
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.model import (
    ByteEmbedding,
    DenoisingBlock,
    block_loss,
    denoise,
    handoff_ce,
    sample_from_noise,
)
from swarmd.core.reference import E2EModel
from swarmd.core.train import BlockTrainer, E2ETrainer, init_block

CFG = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=12, handoff_loss="none")
HANDOFF = replace(CFG, handoff_loss="prev_byte")


def test_only_the_option_adds_the_head_and_the_documented_hash_is_unchanged():
    assert not hasattr(DenoisingBlock(CFG), "handoff_head")
    head = DenoisingBlock(HANDOFF).handoff_head
    assert (head.in_features, head.out_features) == (16, 256)
    assert ModelConfig.documented().handoff_loss == "none" and ModelConfig().handoff_loss == "prev_byte"
    assert ModelConfig.documented().config_hash() == "05523195af4f092b"  # the first release's identity
    assert HANDOFF.config_hash() != CFG.config_hash()
    with pytest.raises(ValueError, match="handoff_loss"):
        replace(CFG, handoff_loss="next_byte")
    with pytest.raises(ValueError, match="handoff_weight"):
        TrainConfig(handoff_weight=-1.0)


def test_handoff_ce_predicts_the_previous_byte_from_the_feature_at_t():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 256)
    feature = torch.randn(2, 5, 16)
    x = torch.randint(0, 256, (2, 5))
    by_hand = sum(F.cross_entropy(head(feature[i, t])[None], x[i, t - 1][None]) for i in range(2) for t in range(1, 5))
    owner = torch.nn.Module()
    owner.handoff_head = head
    assert torch.allclose(handoff_ce(owner, feature, x, x), by_hand / 8)


def test_prev_skip_adds_a_head_predicting_the_byte_after_the_next():
    """handoff_loss=prev_skip: the prev-byte term plus the CE of y_{t+1} (the byte after the next) from the feature at
    t, positions 0..t-2; blocks and the E2E reference get the second head, its config hash is its own."""
    torch.manual_seed(0)
    skip_cfg = replace(CFG, handoff_loss="prev_skip")
    block = DenoisingBlock(skip_cfg)
    assert (block.skip_head.in_features, block.skip_head.out_features) == (16, 256)
    assert hasattr(E2EModel(skip_cfg), "skip_head") and not hasattr(E2EModel(HANDOFF), "skip_head")
    assert len({c.config_hash() for c in (CFG, HANDOFF, skip_cfg)}) == 3
    feature = torch.randn(2, 5, 16)
    x, y = torch.randint(0, 256, (2, 5)), torch.randint(0, 256, (2, 5))
    prev = sum(
        F.cross_entropy(block.handoff_head(feature[i, t])[None], x[i, t - 1][None])
        for i in range(2)
        for t in range(1, 5)
    )
    skip = sum(
        F.cross_entropy(block.skip_head(feature[i, t])[None], y[i, t + 1][None]) for i in range(2) for t in range(4)
    )
    assert torch.allclose(handoff_ce(block, feature, x, y), prev / 8 + skip / 8)


def test_block_loss_adds_the_weighted_term_and_nothing_else():
    torch.manual_seed(0)
    block, emb = init_block(HANDOFF, 1), ByteEmbedding(HANDOFF)
    x, y = random_windows(CFG.seq_len, 3)
    sigma = torch.full((3,), 2.0)
    z = torch.randn(3, CFG.seq_len, 16)
    plain, ce = block_loss(block, emb, x, y, sigma, z=z, handoff_weight=0.0)
    with_term, ce2 = block_loss(block, emb, x, y, sigma, z=z, handoff_weight=2.5)
    _, _, feature = denoise(block, emb.normalized(), x, z, sigma)
    assert torch.equal(ce, ce2)
    w = (2.0**2 + 0.25) / (2.0 * 0.5) ** 2  # EDM's w(sigma) at sigma 2: the term is weighted as the CE is
    assert torch.allclose(with_term, plain + 2.5 * w * handoff_ce(block, feature, x, y))


def test_the_head_never_runs_at_inference():
    torch.manual_seed(0)
    blocks = [init_block(HANDOFF, b) for b in range(2)]
    emb = ByteEmbedding(HANDOFF)
    plain = [init_block(CFG, b) for b in range(2)]
    for a, b in zip(plain, blocks):
        a.load_state_dict({k: v for k, v in b.state_dict().items() if not k.startswith("handoff_head")})
    x, _ = random_windows(CFG.seq_len, 3)
    z0 = torch.randn(3, CFG.seq_len, 16)
    got, _ = sample_from_noise(blocks, emb.normalized(), x, HANDOFF, z0=z0)
    want, _ = sample_from_noise(plain, emb.normalized(), x, CFG, z0=z0)
    assert torch.equal(got, want)


def test_a_trainer_steps_only_its_own_block_and_head():
    tcfg = TrainConfig(batch_size=3, warmup_steps=0, trajectory_prob=1.0, handoff_weight=1.0)
    trainer = BlockTrainer(HANDOFF, tcfg, 1)
    other = init_block(HANDOFF, 0)
    trainer.set_others({0: other})
    before = {k: v.clone() for k, v in other.state_dict().items()}
    head = trainer.block.handoff_head.weight.detach().clone()
    trainer.step(*random_windows(CFG.seq_len, 3))
    assert not torch.equal(trainer.block.handoff_head.weight, head)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())
    assert all(p.grad is None for p in other.parameters())


def test_checkpoint_round_trip_and_old_configs_read_as_none(tmp_path):
    torch.manual_seed(0)
    blocks = {b: init_block(HANDOFF, b) for b in range(2)}
    save_model(tmp_path / "ck", HANDOFF, blocks, ByteEmbedding(HANDOFF))
    cfg, loaded, _, _ = load_model(tmp_path / "ck")
    assert cfg == HANDOFF and torch.equal(loaded[1].handoff_head.weight, blocks[1].handoff_head.weight)
    save_model(tmp_path / "old", CFG, {b: init_block(CFG, b) for b in range(2)}, ByteEmbedding(CFG))
    body = json.loads((tmp_path / "old" / "config.json").read_text())
    body["model"].pop("handoff_loss", None)  # a checkpoint from before the field
    (tmp_path / "old" / "config.json").write_text(json.dumps(body))
    assert load_model(tmp_path / "old")[0].handoff_loss == "none"


def test_the_e2e_reference_trains_with_the_same_term_and_logs_its_plain_ce():
    trainer = E2ETrainer(HANDOFF, TrainConfig(batch_size=3, warmup_steps=0, handoff_weight=1.0))
    x, y = random_windows(CFG.seq_len, 3)
    metrics = trainer.step(x, y)
    assert metrics["loss"] > metrics["ce"] > 0  # the term is in the loss, not in the logged CE
    assert hasattr(E2EModel(HANDOFF), "handoff_head") and not hasattr(E2EModel(CFG), "handoff_head")


def test_a_trainer_on_noisy_targets_draws_its_noise_from_its_own_generator():
    """The documented path (trajectory_prob 0) drew eps from torch's global generator: a simulator run's CE moved
    with whatever else drew from it. Two trainers of one seed now take the same steps whatever the global state."""
    tcfg = TrainConfig(batch_size=3, warmup_steps=0, trajectory_prob=0.0)
    batch = random_windows(CFG.seq_len, 3)
    losses = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        trainer = BlockTrainer(CFG, tcfg, 1)
        losses.append([trainer.step(*batch)["loss"] for _ in range(2)])
    assert losses[0] == losses[1]
