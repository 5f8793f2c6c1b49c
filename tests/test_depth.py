"""The depth instrument (issue 19): depth_trace and depth_recovery on a tiny 2-block model (fast, CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from swarmd.core.config import ModelConfig
from swarmd.core.evaluate import depth_recovery, depth_trace, from_noise_ce
from swarmd.core.model import ByteEmbedding
from swarmd.core.train import init_block

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks.quality: the copy task

CFG = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=12)


def tiny(cfg: ModelConfig = CFG, identity_last: bool = False):
    """(blocks, emb, x, y): seeded blocks (block 1's F perturbed off its zero init unless identity_last) and bytes."""
    torch.manual_seed(0)
    emb = ByteEmbedding(cfg)
    blocks = [init_block(cfg, b) for b in range(cfg.blocks)]
    if not identity_last:
        with torch.no_grad():
            for b in blocks[1:]:
                b.out.weight.normal_(0.0, 0.5)
                b.out.bias.normal_(0.0, 0.5)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (5, cfg.seq_len), generator=g)
    y = torch.randint(0, 256, (5, cfg.seq_len), generator=g)
    return blocks, emb, x, y


def test_trace_has_one_row_per_block_and_matches_from_noise_ce_exactly():
    blocks, emb, x, y = tiny()
    out = depth_trace(blocks, emb, x, y, CFG, batch_size=2)  # several batches, as from_noise_ce sums them
    ref = from_noise_ce(blocks, emb, x, y, CFG, batch_size=2)
    assert len(out["trace"]) == len(out["blocks"]) == CFG.blocks
    assert [r["block"] for r in out["blocks"]] == list(range(CFG.blocks))
    assert out["trace"][-1]["ce"] == ref["ce"] == out["ce"]
    assert [r["ce"] for r in out["trace"]] == [r["ce"] for r in ref["trace"]]
    assert out["tokens"] == y.numel()


def test_kl_is_positive_between_different_blocks_and_none_for_block_0():
    blocks, emb, x, y = tiny()
    out = depth_trace(blocks, emb, x, y, CFG)
    assert out["trace"][0]["kl"] is None and out["blocks"][0]["kl"] is None
    assert out["trace"][1]["kl"] > 1e-4
    assert out["blocks"][1]["kl"] == out["trace"][1]["kl"]


def test_kl_is_zero_when_a_block_is_the_identity():
    # default block (pred_output=add): z_hat = predecessor's z_hat + c_out F, and init_block starts F's last linear
    # at 0 in blocks > 0, so block 1 repeats block 0's prediction exactly
    blocks, emb, x, y = tiny(identity_last=True)
    out = depth_trace(blocks, emb, x, y, CFG)
    assert out["trace"][1]["kl"] == 0.0
    assert out["trace"][1]["ce"] == out["trace"][0]["ce"]


def test_documented_block_and_more_steps_than_blocks():
    cfg = ModelConfig.documented(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=12)
    blocks, emb, x, y = tiny(cfg)
    out = depth_trace(blocks, emb, x, y, cfg, steps=4)
    ref = from_noise_ce(blocks, emb, x, y, cfg, steps=4)
    assert len(out["trace"]) == 4 and len(out["blocks"]) == 2
    assert out["ce"] == ref["ce"]
    assert all(r["kl"] >= 0 for r in out["trace"][1:])
    last0 = max(r["step"] for r in out["trace"] if r["block"] == 0)
    assert out["blocks"][0]["step"] == last0 and out["blocks"][1]["step"] == 3
    assert out["blocks"][1]["ce"] == out["trace"][3]["ce"]


def test_depth_recovery_arithmetic():
    r = depth_recovery(3.0, 2.5, 2.8, 1.8)
    assert r["depth_recovery"] == pytest.approx(0.5) and r["reason"] is None
    assert r["gained"] == pytest.approx(0.5) and r["available"] == pytest.approx(1.0)
    assert depth_recovery(3.0, 3.2, 2.8, 1.8)["depth_recovery"] == pytest.approx(-0.2)  # later blocks hurt
    flat = depth_recovery(3.0, 2.5, 2.0, 2.0)  # depth is worth nothing end to end
    assert flat["depth_recovery"] is None and "not above" in flat["reason"]
    assert depth_recovery(3.0, 2.5, 2.0, 2.1)["depth_recovery"] is None  # ... or less than nothing
    missing = depth_recovery(3.0, 2.5, None, 2.0)
    assert missing["depth_recovery"] is None and "plain" in missing["reason"]
    assert missing["gained"] == pytest.approx(0.5) and missing["available"] is None


def test_copy_task_lines_and_floor():
    from benchmarks.quality import COPY_MAX, COPY_MIN, copy_floor_ce, copy_text

    text = copy_text(5000, seed=3)
    assert len(text) == 5000 and text == copy_text(5000, seed=3) and text != copy_text(5000, seed=4)
    for line in text.decode().split("\n")[:-1]:  # the last line may be cut
        word, copy = line.split("|")
        assert word == copy and COPY_MIN <= len(word) <= COPY_MAX and word.isalpha() and word.islower()
    assert 1.5 < copy_floor_ce() < 1.7  # ~15 random letters (ln 26 each) and the string's end per 32 bytes


def test_quality_writes_the_depth_keys_with_a_sweep(tmp_path):
    from benchmarks import quality

    out = tmp_path / "q"
    argv = "--task copy --copy-bytes 20000 --blocks 2 --layers-per-block 1 --d-model 16 --n-heads 2 --seq-len 32"
    argv += " --rounds 1 --steps-per-round 2 --batch-size 4 --eval-tokens 128 --other-tokens 64 --lr-sweep 1e-3,3e-3"
    r = quality.main([*argv.split(), "--no-plot", "--out", str(out)])
    assert r == __import__("json").loads(out.with_suffix(".json").read_text())
    assert len(r["trace"]) == len(r["kl"]) == 2 and r["kl"][0] is None and r["kl"][1] >= 0
    assert "depth_recovery" in r and (r["depth_recovery"] is None) == (r["depth_recovery_reason"] is not None)
    assert r["depth"]["blocktrain"]["ce"] == r["blocktrain_ce"]
    assert [(x["model"], x["lr"]) for x in r["lr_sweep"]["runs"]] == [
        (m, lr) for m in ("blocktrain", "e2e", "e2e1") for lr in (1e-3, 3e-3)
    ]
    for m, lr in r["lr_sweep"]["best"].items():
        best = min(x["eval_ce"] for x in r["lr_sweep"]["runs"] if x["model"] == m)
        assert next(x for x in r["lr_sweep"]["runs"] if x["model"] == m and x["lr"] == lr)["eval_ce"] == best
    assert r["task"]["name"] == "copy" and "other_text" in r and "depth_recovery" in r["other_text"]
