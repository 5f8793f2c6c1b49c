"""Is it text? Refuse binary input before any training, in milliseconds, without torch or numpy.

check_text(blob, source) refuses a NUL byte among the first NUL_WINDOW bytes (the test git and grep
use) or more than MAX_CONTROL_SHARE of C0 control bytes that no text uses (all but \\t \\n \\v \\f \\r
and ESC, which ANSI-coloured logs carry): random or compressed bytes have about 10% of them, text
almost none. Bytes >= 0x80 are fine (UTF-8, Latin-1). check_data_path(path) runs the instant checks
the CLI does before it loads torch: the path exists, holds bytes, and each file's head looks like
text; read_text_bytes (under swarmd.core.data.load_bytes) checks every whole file as it reads it.
"""

from __future__ import annotations

import os
from pathlib import Path

from swarmd.errors import DataError

NUL_WINDOW = 8192  # a NUL byte among the first bytes marks a binary file
MAX_CONTROL_SHARE = 0.01  # text has almost no C0 controls besides \t \n \v \f \r ESC; random bytes have ~10%
HEAD_BYTES = 1 << 16  # check_data_path reads this much of each file
CONTROL_BYTES = bytes([*range(0, 9), *range(14, 27), *range(28, 32), 127])
_KEEP_CONTROLS = bytes(sorted(set(range(256)) - set(CONTROL_BYTES)))  # translate() deletes these, keeping controls

BINARY_HINT = "training text must be a text file (UTF-8 or another 8-bit encoding)"


def check_text(blob: bytes, source: str | os.PathLike) -> None:
    """DataError unless blob looks like text (see the module docstring)."""
    nul = blob.find(b"\0", 0, NUL_WINDOW)
    if nul != -1:
        raise DataError(f"{source} looks binary, not text (NUL byte at offset {nul}); {BINARY_HINT}")
    if blob:
        share = len(blob.translate(None, _KEEP_CONTROLS)) / len(blob)
        if share > MAX_CONTROL_SHARE:
            raise DataError(
                f"{source} looks binary, not text ({share:.1%} of its bytes are control codes); {BINARY_HINT}"
            )


def data_files(path: Path) -> list[Path]:
    """The file itself, or every regular file under a directory, sorted by path."""
    return sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]


def read_text_bytes(path: str | os.PathLike) -> bytes:
    """All bytes of a text file, or of every regular file under a directory (sorted by path), each checked."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data path does not exist: {p}")
    chunks = []
    for f in data_files(p):
        try:
            blob = f.read_bytes()
        except OSError as exc:
            raise DataError(f"cannot read data at {f}: {exc.strerror or exc}") from None
        check_text(blob, f)
        chunks.append(blob)
    data = b"".join(chunks)
    if not data:
        raise DataError(f"data path holds no bytes: {p}")
    return data


def check_data_path(path: str | os.PathLike) -> None:
    """Instant checks of a data path: it exists, holds bytes, and every file starts like text."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data path does not exist: {p}")
    total = 0
    for f in data_files(p):
        try:
            with open(f, "rb") as fh:
                head = fh.read(HEAD_BYTES)
        except OSError as exc:
            raise DataError(f"cannot read data at {f}: {exc.strerror or exc}") from None
        check_text(head, f)
        total += len(head)
    if total == 0:
        raise DataError(f"data path holds no bytes: {p}")
