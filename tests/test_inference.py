"""Local inference: one-sweep scoring equals `blocktrain eval`; cached generation equals a full recompute."""

import asyncio

import numpy as np
import pytest
import torch

from swarmd.core.config import ModelConfig
from swarmd.core.evaluate import from_noise_ce
from swarmd.core.model import sample_from_noise
from swarmd.core.train import init_block, init_embedding
from swarmd.serve.inference import (
    GenerationStats,
    LocalSweeper,
    generate_bytes,
    pick_byte,
    position_noise,
    score_windows,
    score_windows_of,
)

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
    n_new = CFG.seq_len + 9  # prompt of 2: re-windows before bytes 15 and 24
    stats = GenerationStats()
    a = asyncio.run(generate_bytes(LocalSweeper(CFG, blocks, emb), b"ab", n_new, 1.0, seed=5, stats=stats))
    b = asyncio.run(generate_bytes(LocalSweeper(CFG, blocks, emb), b"ab", 8, 1.0, seed=5))
    c = asyncio.run(generate_bytes(LocalSweeper(CFG, blocks, emb), b"ab", 8, 1.0, seed=6))
    assert a[:8] == b and b != c and len(a) == n_new
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


# ---------------------------------------------------------------------------------------------
# CLI: blocktrain score / generate from a checkpoint, and one-line errors for bad input.
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_checkpoint(tmp_path):
    from swarmd.core.checkpoint import save_model

    blocks, emb = tiny_model()
    save_model(tmp_path / "ckpt", CFG, dict(enumerate(blocks)), emb)
    text = tmp_path / "text.txt"
    text.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 3)
    return tmp_path / "ckpt", text


def run_cli(*args):
    from typer.testing import CliRunner

    from cli.main import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_score_equals_eval(tiny_checkpoint):
    import json

    ckpt, text = tiny_checkpoint
    score = run_cli("score", "--checkpoint", ckpt, text, "--json", "--seed", 3)
    assert score.exit_code == 0, score.output
    ev = run_cli("eval", "--checkpoint", ckpt, "--data", text, "--json", "--seed", 3)
    assert ev.exit_code == 0, ev.output
    assert json.loads(score.stdout)["ce"] == pytest.approx(json.loads(ev.stdout)["ce"], abs=1e-6)


def test_cli_generate_streams_the_same_text_as_the_library(tiny_checkpoint):
    ckpt, _ = tiny_checkpoint
    res = run_cli("generate", "--checkpoint", ckpt, "hello", "--max-bytes", 6, "--seed", 4, "--temperature", 0)
    assert res.exit_code == 0, res.output
    blocks, emb = tiny_model()
    expected = asyncio.run(generate_bytes(LocalSweeper(CFG, blocks, emb), b"hello", 6, 0.0, seed=4))
    assert res.stdout == ("hello" + expected.decode("utf-8", errors="replace") + "\n")


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "--checkpoint", "{ckpt}", ""], "prompt is empty"),
        (["generate", "--checkpoint", "{missing}", "hi"], "does not exist"),
        (["score", "--checkpoint", "{missing}", "{text}"], "does not exist"),
        (["score", "{text}"], "exactly one of --swarm and --checkpoint"),
        (["generate", "--swarm", "127.0.0.1:9", "--timeout-s", "1", "hi"], "no serving peers found in swarm"),
    ],
)
def test_cli_bad_input_is_one_line_and_nonzero(tiny_checkpoint, args, message):
    ckpt, text = tiny_checkpoint
    res = run_cli(*(a.format(ckpt=ckpt, text=text, missing=ckpt.parent / "nope") for a in args))
    assert res.exit_code != 0
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], res.output
