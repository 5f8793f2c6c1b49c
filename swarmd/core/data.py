"""Byte data: load text files as uint8, draw deterministic training batches, cut eval windows.

Owns: ByteData (bytes of a file or of a directory of files), training batch streams seeded
per peer, and fixed evaluation windows; load_bytes refuses missing, empty and binary input
(swarmd.core.textcheck.read_text_bytes). Errors are DataError with one-line messages that the
CLI prints as-is. No torch.nn, grpc or networking here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from swarmd.core.textcheck import read_text_bytes
from swarmd.errors import DataError


def default_data_dir() -> Path | None:
    """BLOCKTRAIN_DATA: a training file, or a folder with train.txt / eval.txt (tests and benchmarks use it)."""
    env = os.environ.get("BLOCKTRAIN_DATA")
    return Path(env) if env else None


def load_bytes(path: str | os.PathLike) -> np.ndarray:
    """All bytes of a text file, or of every regular file under a directory (sorted by path), as uint8."""
    return np.frombuffer(read_text_bytes(path), dtype=np.uint8)


class ByteData:
    """A byte corpus that yields (x, y) windows: y is x shifted by one byte."""

    def __init__(self, data: np.ndarray, seq_len: int):
        if data.size < seq_len + 1:
            raise DataError(f"data has {data.size} bytes; need at least seq_len + 1 = {seq_len + 1}")
        self.data = torch.from_numpy(data.astype(np.int64))
        self.seq_len = seq_len

    @classmethod
    def from_path(cls, path: str | os.PathLike, seq_len: int) -> ByteData:
        return cls(load_bytes(path), seq_len)

    def __len__(self) -> int:
        return int(self.data.numel())

    def batch(self, generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows drawn from the generator: deterministic for a given seed and call order."""
        starts = torch.randint(0, len(self) - self.seq_len - 1 + 1, (batch_size,), generator=generator)
        idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]
        rows = self.data[idx]
        return rows[:, :-1], rows[:, 1:]

    def stream(self, seed: int, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless batches for one worker; a different seed gives a different stream."""
        gen = torch.Generator().manual_seed(seed)
        while True:
            yield self.batch(gen, batch_size)

    def eval_windows(self, max_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Non-overlapping consecutive windows from the start, up to max_tokens scored positions."""
        n = (len(self) - 1) // self.seq_len
        if max_tokens is not None:
            n = min(n, max(1, max_tokens // self.seq_len))
        rows = self.data[: n * self.seq_len + 1]
        x = rows[:-1].view(n, self.seq_len)
        y = rows[1:].view(n, self.seq_len)
        return x, y
