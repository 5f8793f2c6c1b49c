"""Atomic file writes: a temp file in the same directory, fsync, then rename over the target.

Owns the one write path checkpoints and the corpus cache use, so a crash never leaves a half
written file under the real name. Standard library only (no torch: the CLI uses it before torch loads).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write data to path via temp file + fsync + rename in the same directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
