"""The deeper output head (ModelConfig.out_head=mlp, issue 19): F = W_2 GELU(W_1 LN_f(h)) in every block and in the E2E
references; a later block still starts as the identity on its predecessor's estimate, and everything trains."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn as nn
from swarm_utils import random_windows

from swarmd.core.checkpoint import load_model, save_model
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.evaluate import from_noise_ce
from swarmd.core.model import ByteEmbedding, DenoisingBlock, last_linear
from swarmd.core.reference import E2EModel
from swarmd.core.train import BlockTrainer, E2ETrainer, init_block, warm_start

CFG = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=12)
MLP = replace(CFG, out_head="mlp")


def test_the_option_swaps_the_head_and_keeps_the_linear_hash():
    assert isinstance(DenoisingBlock(CFG).out, nn.Linear)
    head = DenoisingBlock(MLP).out
    assert isinstance(head, nn.Sequential) and [type(m) for m in head] == [nn.Linear, nn.GELU, nn.Linear]
    assert (head[0].in_features, head[0].out_features, head[2].out_features) == (16, 32, 16)
    assert ModelConfig.documented().out_head == "linear" and ModelConfig().out_head == "linear"
    assert ModelConfig.documented().config_hash() == "05523195af4f092b"  # the first release's identity
    assert MLP.config_hash() != CFG.config_hash()
    with pytest.raises(ValueError, match="out_head"):
        replace(CFG, out_head="deep")


def test_a_later_block_starts_at_f_zero_and_its_head_trains():
    """init_block zeroes only the head's last linear in a later block (its first keeps its draw, so gradient
    reaches both), warm_start likewise; block 0 keeps its whole draw."""
    later = init_block(MLP, 1)
    assert not last_linear(later.out).weight.any() and later.out[0].weight.any()
    assert last_linear(init_block(MLP, 0).out).weight.any()
    trainer = BlockTrainer(MLP, TrainConfig(batch_size=4, lr=3e-3, warmup_steps=0, trajectory_prob=0.0), 1)
    first = trainer.block.out[0].weight.detach().clone()
    for _ in range(2):
        trainer.step(*random_windows(CFG.seq_len, 4))
    assert last_linear(trainer.block.out).weight.any() and not torch.equal(trainer.block.out[0].weight, first)
    fresh = init_block(MLP, 1)
    warm_start(fresh, trainer.block)
    assert not last_linear(fresh.out).weight.any() and torch.equal(fresh.layers[0].ffn.up.weight,
                                                                   trainer.block.layers[0].ffn.up.weight)  # fmt: skip


def test_e2e_references_carry_the_head_and_the_stack_runs_end_to_end(tmp_path):
    for layout in ("tied", "block"):
        model = E2EModel(MLP, layout)
        assert isinstance(model.out, nn.Sequential)
        assert model(random_windows(CFG.seq_len, 4)[0]).shape == (4, 12, 256)
    assert not hasattr(E2EModel(CFG, "tied"), "out")
    trainer = E2ETrainer(MLP, TrainConfig(batch_size=4, lr=3e-3, warmup_steps=0))
    before = trainer.model.out[0].weight.detach().clone()
    trainer.step(*random_windows(CFG.seq_len, 4))
    assert not torch.equal(trainer.model.out[0].weight, before)
    blocks = {b: init_block(MLP, b) for b in range(2)}
    emb = ByteEmbedding(MLP)
    ce = from_noise_ce(list(blocks.values()), emb, *random_windows(CFG.seq_len, 4), MLP)["ce"]
    assert 0 < ce < 20
    save_model(tmp_path / "ck", MLP, blocks, emb)
    cfg, loaded, _, _ = load_model(tmp_path / "ck")
    assert cfg == MLP and torch.equal(loaded[0].out[0].weight, blocks[0].out[0].weight)
