"""WikiText-2 download cache: fetch once with a progress bar, verify by SHA-256 on every use.

Owns ensure_wikitext2() used by commands whose --data is omitted. Files land in
$BLOCKTRAIN_CACHE (default ~/.cache/blocktrain)/wikitext-2/{train,eval}.txt. The raw corpus is the
tokenised WikiText-2 that the PyTorch word-language-model example ships; its validation split
serves as eval.txt. A manifest records each file's SHA-256 at download (written atomically), and
every later use re-checks it, so a truncated or edited cache is reported, not trained on.
No network access happens unless the cache is missing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from swarmd.core.checkpoint import atomic_write_bytes
from swarmd.errors import DataError

BASE_URL = "https://raw.githubusercontent.com/pytorch/examples/main/word_language_model/data/wikitext-2"
FILES = {"train": "train.txt", "eval": "valid.txt"}


def cache_dir() -> Path:
    return Path(os.environ.get("BLOCKTRAIN_CACHE", Path.home() / ".cache" / "blocktrain")) / "wikitext-2"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _download(url: str, on_progress: Callable[[int, int], None] | None, timeout_s: float = 30.0) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            total = int(resp.headers.get("Content-Length") or 0)
            chunks, got = [], 0
            while chunk := resp.read(1 << 16):
                chunks.append(chunk)
                got += len(chunk)
                if on_progress:
                    on_progress(got, total)
            return b"".join(chunks)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DataError(
            f"cannot download WikiText-2 from {url} ({reason}); "
            "with no network, pass --data FILE or set BLOCKTRAIN_DATA"
        ) from None


def ensure_wikitext2(
    on_progress: Callable[[str, int, int], None] | None = None, force: bool = False
) -> dict[str, Path]:
    """Paths of the cached splits {'train', 'eval'}, downloading them first if needed."""
    root = cache_dir()
    manifest_path = root / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() and not force else {}
    paths = {split: root / f"{split}.txt" for split in FILES}
    for split, path in paths.items():
        if split in manifest and path.is_file():
            if _sha256(path) != manifest[split]["sha256"]:
                raise DataError(
                    f"cached {path} fails its SHA-256 check; run `blocktrain data fetch wikitext-2 --force`"
                )
            continue
        blob = _download(f"{BASE_URL}/{FILES[split]}", functools.partial(on_progress, split) if on_progress else None)
        if not blob:
            raise DataError(f"downloaded {FILES[split]} is empty")
        atomic_write_bytes(path, blob)
        manifest[split] = {
            "sha256": hashlib.sha256(blob).hexdigest(),
            "bytes": len(blob),
            "url": f"{BASE_URL}/{FILES[split]}",
        }
        atomic_write_bytes(manifest_path, json.dumps(manifest, indent=2).encode())
    return paths
