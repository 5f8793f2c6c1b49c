"""Where training text comes from when the user names none: WikiText-2, the stdlib corpus, held-out tails.

Owns the data cache, $BLOCKTRAIN_CACHE (default ~/.cache/blocktrain), and three sources:

- ensure_wikitext2(): WikiText-2 downloaded once with a progress bar (`blocktrain data fetch`), into
  wikitext-2/{train,eval}.txt. The raw corpus is the tokenised WikiText-2 that the PyTorch
  word-language-model example ships; its validation split serves as eval.txt. A manifest records each
  file's SHA-256 at download (written atomically), and every later use re-checks it, so a truncated or
  edited cache is reported, not trained on. cached_wikitext2() is the same check without any download.
- stdlib_corpus(): the default that needs no network: the interpreter's own standard-library sources
  (*.py, no test directories, no site-packages, no codec tables), ordered by the SHA-256 of each
  file's relative path (deterministic, and a sample of the whole library rather than its first
  letters), split by file: one file in ten is held out, so eval text never appears in training.
  Capped at STDLIB_TRAIN_BYTES / STDLIB_EVAL_BYTES, cached under stdlib-<key>/ (key: interpreter
  version, stdlib path and the caps).
- heldout_split(): training text without an eval split: its tail (HELDOUT_FRACTION, within
  [min(n/2, HELDOUT_MIN_BYTES), HELDOUT_MAX_BYTES], moved to the next line start) becomes eval.txt and
  the rest train.txt, cached under heldout/<sha256 of the text>/, so training never sees the held-out
  bytes and every peer given the same text carves the same split.

Each returns a Corpus whose `announce()` is the one line the CLI prints on stderr. Files are written
atomically (temp file + rename), manifests last. No network access happens outside ensure_wikitext2.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import sysconfig
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from swarmd.core.files import atomic_write_bytes
from swarmd.core.textcheck import read_text_bytes
from swarmd.errors import DataError

BASE_URL = "https://raw.githubusercontent.com/pytorch/examples/main/word_language_model/data/wikitext-2"
FILES = {"train": "train.txt", "eval": "valid.txt"}

STDLIB_TRAIN_BYTES = 4 << 20  # 4 MiB of training text: minutes of CPU training never cycle through it
STDLIB_EVAL_BYTES = 512 << 10  # 512 KiB held out, far more than any default --eval-tokens
STDLIB_EVAL_EVERY = 10  # one file in ten (by path hash) is held out
STDLIB_SKIP_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings"}
)  # tests are not library text; site-packages differs per install; encodings/ is mostly codec tables
STDLIB_FORMAT = 1  # bump when the selection rule changes: the cache key includes it

HELDOUT_FRACTION = 0.1  # the tail of the training text held out when no eval text is given
HELDOUT_MIN_BYTES = 4 << 10  # at least this much (or half of a tiny text) is held out
HELDOUT_MAX_BYTES = 1 << 20  # at most this much: held-out CE reads only --eval-tokens bytes anyway


@dataclass(frozen=True)
class Corpus:
    """A train/eval pair of files on disk and what they are, for the one-line announcement."""

    name: str
    train: Path
    eval: Path
    train_bytes: int
    eval_bytes: int
    detail: str = ""

    def announce(self) -> str:
        extra = f"; {self.detail}" if self.detail else ""
        return (
            f"data: {self.name}: train {self.train_bytes:,} bytes, held-out {self.eval_bytes:,} bytes "
            f"(in {self.train.parent}){extra}"
        )


def cache_root() -> Path:
    return Path(os.environ.get("BLOCKTRAIN_CACHE") or Path.home() / ".cache" / "blocktrain")


def cache_dir() -> Path:
    return cache_root() / "wikitext-2"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_manifest(path: Path) -> dict:
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


# -- WikiText-2 ------------------------------------------------------------------------------------
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


def cached_wikitext2() -> dict[str, Path] | None:
    """The cached splits {'train', 'eval'} if a complete, verified cache is there; None otherwise (no network)."""
    root = cache_dir()
    manifest = _read_manifest(root / "manifest.json")
    paths = {split: root / f"{split}.txt" for split in FILES}
    if not all(split in manifest and path.is_file() for split, path in paths.items()):
        return None
    for split, path in paths.items():
        if _sha256(path) != manifest[split].get("sha256"):
            raise DataError(f"cached {path} fails its SHA-256 check; run `blocktrain data fetch wikitext-2 --force`")
    return paths


def ensure_wikitext2(
    on_progress: Callable[[str, int, int], None] | None = None, force: bool = False
) -> dict[str, Path]:
    """Paths of the cached splits {'train', 'eval'}, downloading them first if needed."""
    root = cache_dir()
    manifest_path = root / "manifest.json"
    manifest = _read_manifest(manifest_path) if not force else {}
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


# -- cached train/eval pairs -----------------------------------------------------------------------
def _cached_pair(directory: Path, key: dict) -> dict | None:
    """The manifest of a complete pair in directory written for key, verified by SHA-256; else None."""
    manifest = _read_manifest(directory / "manifest.json")
    if manifest.get("key") != key:
        return None
    for split in ("train", "eval"):
        path = directory / f"{split}.txt"
        if not path.is_file() or _sha256(path) != manifest.get(split, {}).get("sha256"):
            return None
    return manifest


def _write_pair(directory: Path, key: dict, train: bytes, eval_: bytes, extra: dict) -> dict:
    """Write train.txt, eval.txt, then manifest.json (each atomically): a reader sees all or nothing."""
    manifest = {"key": key, **extra}
    for split, blob in (("train", train), ("eval", eval_)):
        atomic_write_bytes(directory / f"{split}.txt", blob)
        manifest[split] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
    atomic_write_bytes(directory / "manifest.json", json.dumps(manifest, indent=2).encode())
    return manifest


def _writable(preferred: Path, name: str) -> Path:
    """preferred/name if it can be created, else a per-user folder under the temp dir (a read-only home)."""
    for root in (preferred, Path(tempfile.gettempdir()) / f"blocktrain-{os.getuid() if hasattr(os, 'getuid') else 0}"):
        try:
            (root / name).mkdir(parents=True, exist_ok=True)
            if os.access(root / name, os.W_OK):
                return root / name
        except OSError:
            continue
    raise DataError(f"cannot write the data cache at {preferred / name}; set BLOCKTRAIN_CACHE to a writable folder")


def _key_dir(prefix: str, key: dict) -> str:
    return f"{prefix}-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]}"


# -- the standard-library corpus -------------------------------------------------------------------
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> list[Path]:
    """Every *.py under root outside STDLIB_SKIP_DIRS, ordered by the SHA-256 of its relative path."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in STDLIB_SKIP_DIRS and not d.startswith("."))
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath) / name
                rel = path.relative_to(root).as_posix()
                found.append((hashlib.sha256(rel.encode()).hexdigest(), path))
    return [path for _, path in sorted(found)]


def _is_held_out(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest()[-8:], 16) % STDLIB_EVAL_EVERY == 0


def build_stdlib_text(
    root: Path, train_cap: int = STDLIB_TRAIN_BYTES, eval_cap: int = STDLIB_EVAL_BYTES
) -> tuple[bytes, bytes, dict[str, int]]:
    """(train bytes, eval bytes, file counts): whole UTF-8 source files, each split filled up to its cap."""
    parts: dict[str, list[bytes]] = {"train": [], "eval": []}
    size = {"train": 0, "eval": 0}
    cap = {"train": train_cap, "eval": eval_cap}
    for path in stdlib_files(root):
        split = "eval" if _is_held_out(path.relative_to(root).as_posix()) else "train"
        if size[split] >= cap[split]:
            if all(size[s] >= cap[s] for s in size):
                break
            continue
        try:
            blob = path.read_bytes()
            blob.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # unreadable or not UTF-8: not text we vouch for
        blob = blob.strip(b"\n") + b"\n\n"
        if len(blob) < 3 or b"\0" in blob or size[split] + len(blob) > cap[split]:
            continue
        parts[split].append(blob)
        size[split] += len(blob)
    if not parts["train"] or not parts["eval"]:
        raise DataError(
            f"the Python standard library at {root} holds too little source text for a corpus; "
            "pass --data FILE or set BLOCKTRAIN_DATA"
        )
    return b"".join(parts["train"]), b"".join(parts["eval"]), {s: len(p) for s, p in parts.items()}


def stdlib_corpus(
    root: Path | None = None,
    cache: Path | None = None,
    train_cap: int = STDLIB_TRAIN_BYTES,
    eval_cap: int = STDLIB_EVAL_BYTES,
) -> Corpus:
    """The interpreter's standard-library sources as train.txt / eval.txt (held out by file), built once and cached."""
    root = Path(root) if root is not None else stdlib_root()
    version = ".".join(map(str, sys.version_info[:3]))
    key = {
        "format": STDLIB_FORMAT,
        "python": sys.version,
        "stdlib": str(root),
        "train_cap": train_cap,
        "eval_cap": eval_cap,
    }
    directory = _writable(Path(cache) if cache is not None else cache_root(), _key_dir("stdlib", key))
    manifest = _cached_pair(directory, key)
    if manifest is None:
        train, eval_, files = build_stdlib_text(root, train_cap, eval_cap)
        manifest = _write_pair(directory, key, train, eval_, {"files": files})
    files = manifest.get("files", {})
    return Corpus(
        name=f"Python {version} standard library sources ({root})",
        train=directory / "train.txt",
        eval=directory / "eval.txt",
        train_bytes=manifest["train"]["bytes"],
        eval_bytes=manifest["eval"]["bytes"],
        detail=f"{files.get('train', '?')} files / {files.get('eval', '?')} other files held out",
    )


# -- held-out tail of a training text --------------------------------------------------------------
def heldout_size(n: int) -> int:
    """Bytes held out of an n-byte text: HELDOUT_FRACTION, within [min(n // 2, MIN), MAX]."""
    return max(min(n // 2, HELDOUT_MIN_BYTES), min(int(n * HELDOUT_FRACTION), HELDOUT_MAX_BYTES))


def split_tail(blob: bytes) -> int:
    """Where the held-out tail of blob starts: heldout_size from the end, moved to the next line start."""
    cut = len(blob) - heldout_size(len(blob))
    newline = blob.find(b"\n", cut, min(len(blob), cut + 4096))
    if newline != -1 and len(blob) - (newline + 1) >= heldout_size(len(blob)) // 2:
        cut = newline + 1
    return cut


def heldout_split(path: str | os.PathLike, cache: Path | None = None) -> Corpus:
    """Training text (a file, or a folder of files) without eval text: its tail held out, the rest to train on."""
    source = Path(path)
    blob = read_text_bytes(source)  # refuses missing, empty and binary input first
    if len(blob) < 2:
        raise DataError(f"data at {source} has {len(blob)} byte(s): too little to hold any out; pass --eval-data FILE")
    key = {"source_sha256": hashlib.sha256(blob).hexdigest()}
    directory = _writable(Path(cache) if cache is not None else cache_root(), "heldout")
    directory = directory / key["source_sha256"][:16]
    manifest = _cached_pair(directory, key)
    if manifest is None:
        cut = split_tail(blob)
        manifest = _write_pair(directory, key, blob[:cut], blob[cut:], {"source": str(source.resolve())})
    return Corpus(
        name=f"{source} has no eval.txt beside it and no --eval-data was given, so its last "
        f"{manifest['eval']['bytes']:,} bytes are held out",
        train=directory / "train.txt",
        eval=directory / "eval.txt",
        train_bytes=manifest["train"]["bytes"],
        eval_bytes=manifest["eval"]["bytes"],
        detail="training uses the rest; pass --eval-data FILE to choose the held-out text",
    )
