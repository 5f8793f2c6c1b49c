"""Inference over a chain of blocks: one-sweep scoring and byte-by-byte generation, local or remote.

Owns the one definition of what scoring and generation compute, written against a small `Sweeper`
protocol (run the sampler's steps, block after block, over some positions of a session), so the
local path (`LocalSweeper`, blocks in this process) and the swarm path (swarmd.serve.remote.RemoteSweeper,
one peer per block) run the very same loop and give the same numbers for the same seed.

- Scoring (`score_windows`, `score_bytes`): consecutive windows of seq_len bytes with the true
  context, from the fixed eval noise of swarmd.core.evaluate; ONE sweep (one traversal of the block
  stack) per batch of windows predicts every byte of the window. Equals `blocktrain eval`.
- Generation (`generate`): free-running generation needs each new byte as context, so it costs one
  sweep per byte. Every block keeps a KV cache per (session, sampler step), so a sweep after the
  prefill processes only the one new position. The start noise of every position and the byte
  drawn there come from generators seeded by (seed, absolute position), so local and swarm runs
  produce identical text. Past seq_len the window rule is: keep the last seq_len // 2 bytes, rebuild
  every cache with one prefill sweep over them (positions restart at 0), and go on.
No grpc here (remote.py owns the wire); the torch math is swarmd.core.model's euler_step.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from swarmd.core.config import ModelConfig
from swarmd.core.data import ByteData, load_bytes
from swarmd.core.evaluate import eval_noise
from swarmd.core.model import ByteEmbedding, DenoisingBlock, euler_step, sampler_plan, start_noise
from swarmd.core.train import seed_for
from swarmd.errors import DataError

P = ParamSpec("P")


class Sweeper(Protocol):
    """Runs every sampler step (block 0 first) over some positions of a session."""

    cfg: ModelConfig

    async def sweep(
        self, session_id: str, x: torch.Tensor, z: torch.Tensor, start_position: int, use_cache: bool
    ) -> torch.Tensor:
        """x: context bytes (n, t) int64; z: start noise (n, t, d) fp32 for positions start..start+t-1.

        Returns the final logits (n, t, 256). With use_cache, start_position 0 resets the session's
        caches and start_position > 0 continues them (it must equal the positions cached so far).
        """
        ...

    async def end_session(self, session_id: str) -> None: ...


class LocalSweeper:
    """All blocks in this process; per-(session, step) KV caches kept in a dict."""

    def __init__(
        self,
        cfg: ModelConfig,
        blocks: list[DenoisingBlock],
        emb: ByteEmbedding | torch.Tensor,
        steps: int | None = None,
        device: str = "cpu",
    ):
        if len(blocks) != cfg.blocks:
            raise ValueError(f"need {cfg.blocks} blocks, got {len(blocks)}")
        self.cfg = cfg
        self.blocks = [b.to(device).eval() for b in blocks]
        table = emb.table if isinstance(emb, ByteEmbedding) else emb
        self.table_hat = F.normalize(table.detach().float(), dim=-1).to(device)
        self.plan = sampler_plan(cfg, steps)
        self.device = device
        self._caches: dict[str, tuple[int, list[list[dict]]]] = {}  # session -> (positions, cache per step)
        self.sweeps = 0  # sweeps run
        self.positions = 0  # positions processed by all sweeps (per step)

    async def sweep(
        self, session_id: str, x: torch.Tensor, z: torch.Tensor, start_position: int, use_cache: bool
    ) -> torch.Tensor:
        with torch.no_grad():
            return self._sweep(session_id, x, z, start_position, use_cache)

    def _sweep(
        self, session_id: str, x: torch.Tensor, z: torch.Tensor, start_position: int, use_cache: bool
    ) -> torch.Tensor:
        caches: list[list[dict]] | None = None
        if use_cache:
            if start_position == 0:
                self._caches[session_id] = (0, [self.blocks[b].new_cache() for b, _, _ in self.plan])
            held, caches = self._caches.get(session_id, (-1, None))
            if held != start_position or caches is None:
                raise ValueError(f"session {session_id} holds {held} positions; asked to continue at {start_position}")
        x, z = x.to(self.device), z.to(self.device)
        logits, feature = torch.empty(0), None  # the plan has at least one step; feature: the step's message
        for i, (b, sigma, sigma_next) in enumerate(self.plan):
            cache = caches[i] if caches else None
            logits, z, feature = euler_step(
                self.blocks[b], self.table_hat, x, z, sigma, sigma_next, cache, pred=feature
            )
        if caches is not None:
            self._caches[session_id] = (start_position + x.shape[1], caches)
        self.sweeps += 1
        self.positions += x.numel()
        if logits is None:
            raise RuntimeError("the sampler plan has no steps")
        return logits.cpu()

    async def end_session(self, session_id: str) -> None:
        self._caches.pop(session_id, None)


def load_local(checkpoint: str | Path, device: str = "cpu", steps: int | None = None) -> LocalSweeper:
    """A LocalSweeper over a full BlockTrain checkpoint (raises CheckpointError)."""
    from swarmd.core.checkpoint import load_model  # filesystem layer only when asked

    cfg, blocks, emb, _ = load_model(Path(checkpoint), device)
    return LocalSweeper(cfg, blocks, emb, steps, device)


# ---------------------------------------------------------------------------------------------
# Scoring: one sweep per batch of windows.
# ---------------------------------------------------------------------------------------------
async def score_windows(
    sweeper: Sweeper, x: torch.Tensor, y: torch.Tensor, seed: int = 1234, batch_size: int = 64
) -> dict:
    """From-noise CE (nats/byte) and perplexity of windows (x, y), one sweep per batch.

    Uses swarmd.core.evaluate's noise and batching, so it equals from_noise_ce for the same seed. With a sweeper
    that drops lying peers (RemoteSweeper.tainted_sweeps), every batch a dropped peer took part in is scored again.
    """
    noise = eval_noise(sweeper.cfg, x, seed)
    t0 = time.perf_counter()
    session = f"score-{uuid.uuid4().hex[:12]}"
    ce_sum: dict[int, float] = {}  # first window of a batch -> summed CE of its bytes
    batch_of: list[int] = []  # the session's sweeps in call order -> the batch each scored

    async def score_batch(lo: int) -> None:
        xb, yb = x[lo : lo + batch_size], y[lo : lo + batch_size]
        logits = await sweeper.sweep(session, xb, noise[lo : lo + batch_size], 0, False)
        ce_sum[lo] = float(F.cross_entropy(logits.float().flatten(0, 1), yb.flatten(), reduction="sum"))
        batch_of.append(lo)

    try:
        for lo in range(0, x.shape[0], batch_size):
            await score_batch(lo)
        tainted = getattr(sweeper, "tainted_sweeps", None)  # a swarm sweeper: sweeps that used a peer dropped later
        superseded: set[int] = set()  # sweep indices whose batch was scored again
        while tainted is not None:
            bad = [k for k in tainted(session) if k not in superseded]
            if not bad:
                break
            superseded.update(bad)
            for lo in sorted({batch_of[k] for k in bad}):  # the dropped peer is routed around now
                await score_batch(lo)
    finally:
        await sweeper.end_session(session)
    sweeps = len(batch_of)
    tokens = y.numel()
    ce = sum(ce_sum.values()) / tokens
    seconds = time.perf_counter() - t0
    return {
        "ce": ce,
        "ppl": math.exp(ce),
        "tokens": tokens,
        "windows": int(x.shape[0]),
        "sweeps": sweeps,
        "seed": seed,
        "seconds": seconds,
    }


def score_windows_of(data: np.ndarray, seq_len: int, max_bytes: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The eval windows of `blocktrain eval`; a text shorter than one window is scored as one short window."""
    if data.size < 2:
        raise DataError("text to score needs at least 2 bytes (one context byte and one target)")
    if data.size < seq_len + 1:
        rows = torch.from_numpy(data.astype(np.int64))
        return rows[None, :-1], rows[None, 1:]
    return ByteData(data, seq_len).eval_windows(max_bytes)


async def score_file(sweeper: Sweeper, path: str | Path, seed: int = 1234, max_bytes: int | None = None) -> dict:
    x, y = score_windows_of(load_bytes(path), sweeper.cfg.seq_len, max_bytes)
    return await score_windows(sweeper, x, y, seed)


# ---------------------------------------------------------------------------------------------
# Generation: one sweep per byte, each processing only the new position.
# ---------------------------------------------------------------------------------------------
def position_noise(cfg: ModelConfig, seed: int, position: int) -> torch.Tensor:
    """Start noise (d,) of absolute text position `position`: fixed by (seed, position) alone."""
    return start_noise(cfg, (cfg.d_model,), torch.Generator().manual_seed(seed_for("noise", seed, position)))


def pick_byte(logits: torch.Tensor, temperature: float, seed: int, position: int) -> int:
    """Byte for text position `position` from logits (256,): argmax at temperature 0, else a seeded draw."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed_for("draw", seed, position))))


@dataclass
class GenerationStats:
    sweeps: int = 0  # traversals of the block stack
    prefill_sweeps: int = 0  # of which rebuilt a window (prompt or re-window)
    positions: int = 0  # positions processed by all sweeps
    seconds: float = 0.0
    per_byte_s: list[float] = field(default_factory=list)  # wall time of each produced byte


async def generate(
    sweeper: Sweeper,
    prompt: bytes,
    max_bytes: int = 64,
    temperature: float = 1.0,
    seed: int = 0,
    stats: GenerationStats | None = None,
    session_id: str | None = None,
) -> AsyncIterator[int]:
    """Yield up to max_bytes generated bytes, one sweep each (see the module docstring for the rule).

    :param prompt: at least one byte; only its last seq_len // 2 bytes are used if it exceeds seq_len.
    :param temperature: 0 = greedy; otherwise softmax(logits / temperature) draws, seeded per position.
    """
    if not prompt:
        raise ValueError("the prompt is empty; give at least one byte")
    if max_bytes < 0 or temperature < 0:
        raise ValueError("--max-bytes and --temperature must be >= 0")
    cfg = sweeper.cfg
    keep = max(1, cfg.seq_len // 2)
    stats = stats if stats is not None else GenerationStats()
    session = session_id or f"gen-{uuid.uuid4().hex[:12]}"
    text = list(prompt)
    start = 0 if len(text) <= cfg.seq_len else len(text) - keep  # absolute position of the window's first byte
    cached = 0  # positions of the window the caches hold
    t0 = time.perf_counter()
    try:
        for _ in range(max_bytes):
            tb = time.perf_counter()
            if len(text) - start > cfg.seq_len:  # window full: re-window and rebuild the caches
                start, cached = len(text) - keep, 0
            new = range(start + cached, len(text))  # absolute positions this sweep processes
            x = torch.tensor([text[p] for p in new], dtype=torch.int64)[None]
            z = torch.stack([position_noise(cfg, seed, p) for p in new])[None]
            logits = await sweeper.sweep(session, x, z, cached, True)
            stats.sweeps += 1
            stats.prefill_sweeps += int(cached == 0)
            stats.positions += len(new)
            cached = len(text) - start
            b = pick_byte(logits[0, -1], temperature, seed, len(text))
            text.append(b)
            stats.per_byte_s.append(time.perf_counter() - tb)
            yield b
    finally:
        stats.seconds = time.perf_counter() - t0
        await sweeper.end_session(session)


def _collected(gen: Callable[P, AsyncIterator[int]]) -> Callable[P, Coroutine[Any, Any, bytes]]:
    """An async function with gen's parameters that returns all the bytes gen yields."""

    async def collected(*args: P.args, **kwargs: P.kwargs) -> bytes:
        return bytes([b async for b in gen(*args, **kwargs)])

    return collected


generate_bytes = _collected(generate)  # all of generate() at once: await generate_bytes(sweeper, prompt, ...)
