"""Local inference: one-sweep scoring equals `blocktrain eval`; cached generation equals a full recompute."""
import asyncio

import numpy as np
import pytest
import torch

from swarmd.config import ModelConfig
from swarmd.evaluate import from_noise_ce
from swarmd.inference import GenerationStats, LocalSweeper, generate_bytes, pick_byte, position_noise, score_windows, score_windows_of
from swarmd.model import sample_from_noise
from swarmd.train import init_block, init_embedding

CFG = ModelConfig(blocks=3, layers_per_block=1, d_model=32, n_heads=2, hidden=64, seq_len=16)


def tiny_model(cfg=CFG, seed=0):
    return [init_block(cfg, b, seed) for b in range(cfg.blocks)], init_embedding(cfg, seed)


def text_windows(cfg=CFG, n_bytes=200):
    data = np.frombuffer((b"the quick brown fox jumps over the lazy dog. " * 8)[:n_bytes], dtype=np.uint8)
    return score_windows_of(data, cfg.seq_len)


def test_local_score_equals_from_noise_ce():
    blocks, emb = tiny_model()
    x, y = text_windows()
    ref = from_noise_ce(blocks, emb, x, y, CFG, seed=7)
    got = asyncio.run(score_windows(LocalSweeper(CFG, blocks, emb), x, y, seed=7))
    assert got["ce"] == pytest.approx(ref["ce"], abs=1e-6)
    assert got["tokens"] == ref["tokens"] == y.numel()
    assert got["sweeps"] == 1  # every window of the batch in one traversal


def test_short_text_is_one_short_window():
    x, y = score_windows_of(np.frombuffer(b"hello", dtype=np.uint8), CFG.seq_len)
    assert x.shape == (1, 4) and y[0, -1] == ord("o")
    with pytest.raises(Exception, match="at least 2 bytes"):
        score_windows_of(np.frombuffer(b"h", dtype=np.uint8), CFG.seq_len)


def test_cached_generation_matches_full_window_sampler():
    blocks, emb = tiny_model()
    sweeper = LocalSweeper(CFG, blocks, emb)
    prompt, n_new = b"the ", 8
    stats = GenerationStats()
    out = asyncio.run(generate_bytes(sweeper, prompt, n_new, temperature=0.8, seed=3, stats=stats))
    assert len(out) == n_new
    assert stats.sweeps == n_new and stats.prefill_sweeps == 1
    assert stats.positions == len(prompt) + n_new - 1  # after the prefill, each sweep processes one position
    text = list(prompt + out)
    # Full recompute: the sampler over the whole text, with the same per-position noise.
    x = torch.tensor(text[:-1])[None]
    z0 = torch.stack([position_noise(CFG, 3, p) for p in range(x.shape[1])])[None]
    logits, _ = sample_from_noise(blocks, emb.normalized(), x, CFG, z0=z0)
    for p in range(len(prompt), len(text)):
        assert pick_byte(logits[0, p - 1], 0.8, 3, p) == text[p]


def test_generation_is_deterministic_and_rewindows_past_seq_len():
    blocks, emb = tiny_model()
    n_new = 2 * CFG.seq_len + 3
    stats = GenerationStats()
    a = asyncio.run(generate_bytes(LocalSweeper(CFG, blocks, emb), b"ab", n_new, 1.0, seed=5, stats=stats))
    b = asyncio.run(generate_bytes(LocalSweeper(CFG, blocks, emb), b"ab", n_new, 1.0, seed=5))
    c = asyncio.run(generate_bytes(LocalSweeper(CFG, blocks, emb), b"ab", n_new, 1.0, seed=6))
    assert a == b and a != c and len(a) == n_new
    assert stats.sweeps == n_new and stats.prefill_sweeps >= 3  # prompt + at least two re-windows


def test_long_prompt_keeps_its_tail():
    blocks, emb = tiny_model()
    prompt = bytes(range(65, 65 + 40))
    stats = GenerationStats()
    asyncio.run(generate_bytes(LocalSweeper(CFG, blocks, emb), prompt, 2, 0.0, stats=stats))
    assert stats.positions == CFG.seq_len // 2 + 1


def test_empty_prompt_is_refused():
    blocks, emb = tiny_model()
    with pytest.raises(ValueError, match="prompt is empty"):
        asyncio.run(generate_bytes(LocalSweeper(CFG, blocks, emb), b"", 4))
