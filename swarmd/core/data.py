"""Byte data: load text files as uint8, draw deterministic training batches, cut eval windows.

Owns: ByteData (bytes of a file or of a directory of files), training batch streams seeded
per peer, and fixed evaluation windows; load_bytes refuses missing, empty and binary input
(check_text: a NUL byte near the start, or more than MAX_CONTROL_SHARE of bytes that no text
encoding uses). Errors are DataError with one-line messages that the CLI prints as-is. No
torch.nn, grpc or networking here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from swarmd.errors import DataError

NUL_WINDOW = 8192  # a NUL byte among the first bytes marks a binary file (git and grep use the same test)
MAX_CONTROL_SHARE = 0.01  # text has almost no C0 controls besides \t \n \v \f \r ESC; random bytes have ~10%
_CONTROL = np.zeros(256, dtype=bool)
_CONTROL[[*range(0, 9), *range(14, 27), *range(28, 32), 127]] = True


def default_data_dir() -> Path | None:
    """BLOCKTRAIN_DATA: a training file, or a folder with train.txt / eval.txt (tests and benchmarks use it)."""
    env = os.environ.get("BLOCKTRAIN_DATA")
    return Path(env) if env else None


def check_text(data: np.ndarray, source: Path) -> None:
    """Refuse bytes that are not text: a NUL among the first NUL_WINDOW, or too many control bytes."""
    head = data[:NUL_WINDOW]
    nul = np.flatnonzero(head == 0)
    if nul.size:
        raise DataError(
            f"{source} looks binary, not text (NUL byte at offset {int(nul[0])}); "
            "training text must be a text file (UTF-8 or another 8-bit encoding)"
        )
    if data.size:
        share = float(np.count_nonzero(_CONTROL[data])) / data.size
        if share > MAX_CONTROL_SHARE:
            raise DataError(
                f"{source} looks binary, not text ({share:.1%} of its bytes are control codes); "
                "training text must be a text file (UTF-8 or another 8-bit encoding)"
            )


def load_bytes(path: str | os.PathLike) -> np.ndarray:
    """All bytes of a text file, or of every regular file under a directory (sorted by path)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data path does not exist: {p}")
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    try:
        chunks = [np.frombuffer(f.read_bytes(), dtype=np.uint8) for f in files]
    except OSError as exc:
        raise DataError(f"cannot read data at {p}: {exc.strerror or exc}") from None
    for f, chunk in zip(files, chunks, strict=True):
        check_text(chunk, f)
    data = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint8)
    if data.size == 0:
        raise DataError(f"data path holds no bytes: {p}")
    return data


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
