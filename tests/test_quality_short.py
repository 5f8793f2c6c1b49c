"""A short BlockTrain run on real text must lower held-out from-noise CE well below ln 256.

Real text comes from the `text_data` fixture (tests/conftest.py): WikiText-2 when the user has it
($BLOCKTRAIN_DATA, ../shared/data/wikitext-2 or the fetched cache), else the Python standard
library's sources, held out by file; never skipped. Small config (B=3, L_b=1, d=64, seq 64,
batch 16, 2 rounds x 40 steps per block) so it runs in well under a minute on one CPU thread. The
default block with live predecessors (as `blocktrain train` runs it) reaches 3.93 on the stdlib corpus;
with round-start snapshots (what a swarm peer has) this short a run ends at 4.46: early on, the later
blocks' corrections chase predecessors that move every round (see BENCHMARKS.md, issue 8).
"""

from __future__ import annotations

import math

import pytest
import torch

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import from_noise_ce
from swarmd.core.local_run import train_blocktrain

UNIFORM_CE = math.log(256)  # 5.545 nats: an untrained model


def test_short_training_lowers_from_noise_ce_well_below_uniform(text_data):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mcfg = ModelConfig(blocks=3, layers_per_block=1, d_model=64, n_heads=4, hidden=256, seq_len=64)
        tcfg = TrainConfig(batch_size=16, lr=2e-3, warmup_steps=10, total_steps=80, seed=0)
        corpus = ByteData.from_path(text_data / "train.txt", mcfg.seq_len)
        x, y = ByteData.from_path(text_data / "eval.txt", mcfg.seq_len).eval_windows(2048)
        untrained = train_blocktrain(mcfg, tcfg, corpus, (x[:1], y[:1]), steps_per_round=1, rounds=0)
        before = from_noise_ce(untrained.blocks, untrained.emb, x, y, mcfg)["ce"]
        # as `blocktrain train` runs it: later blocks train against their predecessors as they are now
        stack = train_blocktrain(
            mcfg, tcfg, corpus, (x[:1], y[:1]), steps_per_round=40, rounds=2, trajectory_source="live"
        )
        after = from_noise_ce(stack.blocks, stack.emb, x, y, mcfg)
    finally:
        torch.set_num_threads(threads)
    assert abs(before - UNIFORM_CE) < 0.3, f"untrained from-noise CE {before:.3f} should be near ln 256"
    assert after["ce"] < UNIFORM_CE - 1.5, (
        f"from-noise CE {after['ce']:.3f} after 80 steps per block is not well below {UNIFORM_CE:.3f}"
    )
    assert all(math.isfinite(s["ce"]) for s in after["trace"])


def test_trajectory_training_uses_frozen_predecessors_only():
    """Trajectory inputs need the earlier blocks; their weights never change during the step.

    Before any predecessor is given a block trains on the documented noisy targets (a swarm round
    without its predecessors); a set missing one the trajectory passes through is an error.
    """
    from swarmd.core.train import BlockTrainer, init_block, init_embedding

    mcfg = ModelConfig(blocks=3, layers_per_block=1, d_model=32, n_heads=4, hidden=64, seq_len=16)
    tcfg = TrainConfig(batch_size=4, trajectory_prob=1.0, sigma_sampling="sampler")
    x = torch.randint(0, 256, (4, 16))
    y = torch.randint(0, 256, (4, 16))
    trainer = BlockTrainer(mcfg, tcfg, 2)
    assert math.isfinite(trainer.step(x, y)["ce"])  # no predecessors yet: noisy targets
    trainer.set_others({0: init_block(mcfg, 0)}, table=init_embedding(mcfg))
    with pytest.raises(ValueError, match=r"needs blocks \[1\]"):
        trainer.step(x, y)
    others = {b: init_block(mcfg, b) for b in range(2)}
    before = {b: [p.detach().clone() for p in blk.parameters()] for b, blk in others.items()}
    trainer.set_others(others, table=init_embedding(mcfg))
    out = trainer.step(x, y)
    assert math.isfinite(out["ce"])
    for b, blk in others.items():
        assert all(torch.equal(p, q) for p, q in zip(blk.parameters(), before[b]))
        assert all(p.grad is None for p in blk.parameters())
