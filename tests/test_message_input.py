"""The message input's start (ModelConfig.pred_in_init, issue 19): zero (a later block first ignores its predecessor's
state) or identity (its layers start on the predecessor's normalised residual stream); both train, both keep it
through warm_start, the option is part of the hash and of a checkpoint."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from swarm_utils import random_windows

from swarmd.core.checkpoint import load_model, save_model
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.model import ByteEmbedding, DenoisingBlock, denoise, init_message_input
from swarmd.core.train import BlockTrainer, init_block, init_embedding, warm_start

CFG = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=12, pred_in_init="zero")
IDENTITY = replace(CFG, pred_in_init="identity")


def test_the_option_sets_the_start_and_the_hash():
    assert not DenoisingBlock(CFG).pred_in.weight.any()
    block = DenoisingBlock(IDENTITY)
    assert torch.equal(block.pred_in.weight, torch.eye(16)) and not block.pred_in.bias.any()
    assert ModelConfig.documented().config_hash() == "05523195af4f092b"  # a documented config keeps its hash
    assert IDENTITY.config_hash() != CFG.config_hash()
    assert ModelConfig.from_dict({k: v for k, v in CFG.to_dict().items() if k != "pred_in_init"}) == CFG
    with pytest.raises(ValueError, match="pred_in_init"):
        replace(CFG, pred_in_init="random")


def test_identity_hands_the_predecessor_s_feature_to_the_first_layer():
    """At the identity the block's first layer reads h0 + g (g: the message's feature part); at zero it reads h0."""
    torch.manual_seed(0)
    block = DenoisingBlock(IDENTITY)
    seen: list[torch.Tensor] = []
    block.layers[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().clone()))
    table = ByteEmbedding(IDENTITY).normalized()
    x, _ = random_windows(CFG.seq_len, 2)
    z = torch.randn(2, CFG.seq_len, 16)
    sigma = torch.full((2,), 2.0)
    g = torch.randn(2, CFG.seq_len, 16)
    pred = torch.cat([g, torch.randn(2, CFG.seq_len, 16)], dim=-1)  # [feature, z_hat]
    denoise(block, table, x, z, sigma, pred=pred)
    denoise(block, table, x, z, sigma, pred=None)
    torch.testing.assert_close(seen[0] - seen[1], g)
    init_message_input(block.pred_in, CFG)
    denoise(block, table, x, z, sigma, pred=pred)
    torch.testing.assert_close(seen[2], seen[1])


def test_it_trains_and_warm_start_keeps_the_configured_start(tmp_path):
    trainer = BlockTrainer(IDENTITY, TrainConfig(batch_size=4, lr=3e-3, warmup_steps=0, trajectory_prob=1.0), 1)
    trainer.set_others({0: init_block(IDENTITY, 0)}, table=init_embedding(IDENTITY))  # its predecessor sends g
    for _ in range(3):
        trainer.step(*random_windows(CFG.seq_len, 4))
    assert not torch.equal(trainer.block.pred_in.weight, torch.eye(16))  # it learns, from the identity
    fresh = init_block(IDENTITY, 1)
    warm_start(fresh, trainer.block)
    assert torch.equal(fresh.pred_in.weight, torch.eye(16))
    torch.testing.assert_close(fresh.layers[0].ffn.up.weight, trainer.block.layers[0].ffn.up.weight)
    save_model(tmp_path / "ck", IDENTITY, {0: trainer.block, 1: fresh}, ByteEmbedding(IDENTITY))
    cfg, blocks, _, _ = load_model(tmp_path / "ck")
    assert cfg.pred_in_init == "identity" and torch.equal(blocks[0].pred_in.weight, trainer.block.pred_in.weight)
