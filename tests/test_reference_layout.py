"""The E2E reference's byte-table layouts (issue 19's fair references): tied (the original) and block."""

from __future__ import annotations

import pytest
import torch

from swarmd.core.checkpoint import load_e2e, save_e2e
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.reference import E2EModel
from swarmd.core.train import E2ETrainer

CFG = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=12, handoff_loss="none")


def test_tied_layout_keeps_its_parameters_and_init():
    torch.manual_seed(0)
    tied = E2EModel(CFG)
    torch.manual_seed(0)
    block = E2EModel(CFG, layout="block")
    assert set(tied.state_dict()) == set(block.state_dict()) - {"out.weight", "out.bias", "table"}
    for name, value in tied.state_dict().items():  # the block layout draws its extra tables last
        assert torch.equal(value, block.state_dict()[name]), name


def test_block_layout_scores_against_its_own_normalised_output_table():
    torch.manual_seed(0)
    model = E2EModel(CFG, layout="block")
    x = torch.randint(0, 256, (3, CFG.seq_len))
    logits = model(x)
    assert logits.shape == (3, CFG.seq_len, 256)
    with torch.no_grad():
        model.table.mul_(5.0)  # a row-normalised table: its scale does not reach the logits
    assert torch.allclose(model(x), logits, atol=1e-5)
    with torch.no_grad():
        model.tok.weight.zero_()  # the context table is not the output table
    assert not torch.allclose(model(x), logits)


def test_block_layout_trains_and_round_trips_a_checkpoint(tmp_path):
    trainer = E2ETrainer(CFG, TrainConfig(lr=3e-3, seed=0), layout="block")
    x = torch.randint(0, 256, (4, CFG.seq_len))
    first = trainer.step(x, x)["ce"]
    for _ in range(20):
        last = trainer.step(x, x)["ce"]
    assert last < first
    save_e2e(tmp_path, CFG, trainer.model)
    loaded = load_e2e(tmp_path)
    assert loaded.layout == "block"
    assert torch.equal(loaded(x), trainer.model.eval()(x))


def test_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="layout"):
        E2EModel(CFG, layout="shared")
