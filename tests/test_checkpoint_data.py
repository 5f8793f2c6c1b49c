"""Checkpoint round trips (bit-exact, atomic, swappable blocks) and data loading errors."""

import json

import pytest
import torch

from swarmd.core.checkpoint import (
    block_file,
    load_block,
    load_model,
    load_optimizer,
    read_config,
    save_model,
    save_optimizer,
)
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData, load_bytes
from swarmd.core.train import BlockTrainer, init_block, init_embedding
from swarmd.errors import CheckpointError, DataError

CFG = ModelConfig(blocks=2, layers_per_block=1, d_model=32, n_heads=2, hidden=64, seq_len=16)


def _trained(tmp_path, seed=0):
    trainers = [BlockTrainer(CFG, TrainConfig(batch_size=4, seed=seed), b) for b in range(2)]
    data = ByteData(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy(), 16)
    gen = torch.Generator().manual_seed(seed)
    for t in trainers:
        t.step(*data.batch(gen, 4))
    return trainers


def test_round_trip_is_bit_exact(tmp_path):
    trainers = _trained(tmp_path)
    save_model(tmp_path / "ck", CFG, {b: t.block for b, t in enumerate(trainers)}, trainers[0].emb, steps={0: 1, 1: 1})
    cfg, blocks, emb, body = load_model(tmp_path / "ck")
    assert cfg == CFG and body["config_hash"] == CFG.config_hash()
    for t, b in zip(trainers, blocks):
        for (k, v), (k2, v2) in zip(t.block.state_dict().items(), b.state_dict().items()):
            assert k == k2 and torch.equal(v, v2)
    assert torch.equal(emb.table, trainers[0].emb.table)
    assert not list((tmp_path / "ck").glob("*.tmp")) and not list((tmp_path / "ck").glob(".*"))


def test_block_file_drops_into_another_run(tmp_path):
    a, b = _trained(tmp_path, seed=1), _trained(tmp_path, seed=2)
    save_model(tmp_path / "a", CFG, {i: t.block for i, t in enumerate(a)}, a[0].emb)
    save_model(tmp_path / "b", CFG, {i: t.block for i, t in enumerate(b)}, b[0].emb)
    block_file(tmp_path / "b", 1).write_bytes(block_file(tmp_path / "a", 1).read_bytes())
    _, blocks, _, _ = load_model(tmp_path / "b")
    assert torch.equal(blocks[1].out.weight, a[1].block.out.weight)
    assert torch.equal(blocks[0].out.weight, b[0].block.out.weight)


def test_block_of_other_config_or_index_is_refused(tmp_path):
    save_model(tmp_path / "ck", CFG, {0: init_block(CFG, 0), 1: init_block(CFG, 1)}, init_embedding(CFG))
    other = ModelConfig(blocks=2, layers_per_block=1, d_model=32, n_heads=2, hidden=64, seq_len=32)
    with pytest.raises(CheckpointError, match="another model config"):
        load_block(tmp_path / "ck", other, 0)
    block_file(tmp_path / "ck", 0).write_bytes(block_file(tmp_path / "ck", 1).read_bytes())
    with pytest.raises(CheckpointError, match="holds block 1"):
        load_block(tmp_path / "ck", CFG, 0)


def test_corrupt_and_missing_checkpoints_give_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        read_config(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        read_config(tmp_path / "empty")
    save_model(tmp_path / "ck", CFG, {0: init_block(CFG, 0)}, init_embedding(CFG))
    with pytest.raises(CheckpointError, match="lacks blocks"):
        load_model(tmp_path / "ck")
    block_file(tmp_path / "ck", 0).write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_block(tmp_path / "ck", CFG, 0)
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(CheckpointError, match="format"):
        read_config(tmp_path / "ck")


def test_optimizer_state_round_trip(tmp_path):
    t = _trained(tmp_path)[0]
    save_optimizer(tmp_path, 0, t.opt, t.step_count)
    fresh = BlockTrainer(CFG, TrainConfig(batch_size=4), 0, block=t.block)
    assert load_optimizer(tmp_path, 0, fresh.opt)
    before, after = t.opt.state_dict()["state"], fresh.opt.state_dict()["state"]
    assert set(before) == set(after)
    for pid, st in before.items():
        assert all(torch.equal(torch.as_tensor(st[k]), torch.as_tensor(after[pid][k])) for k in st)


def test_data_errors_and_directories(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_bytes(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(DataError, match="no bytes"):
        load_bytes(tmp_path / "empty.txt")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_bytes(b"hello ")
    (tmp_path / "d" / "b.txt").write_bytes(b"world")
    assert bytes(load_bytes(tmp_path / "d")) == b"hello world"
    with pytest.raises(DataError, match="need at least"):
        ByteData.from_path(tmp_path / "d", 64)


def test_batches_are_deterministic_per_seed():
    data = ByteData(torch.arange(1000, dtype=torch.uint8).numpy(), 8)
    a = next(data.stream(3, 4))
    b = next(data.stream(3, 4))
    c = next(data.stream(4, 4))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])  # y is x shifted by one byte
