"""The weights a peer served its Forward answers from, kept by hash so a client can pull exactly those.

Owns, for one BlockServing:
  - `Snapshot`: one installed (block, byte table) pair and the hashes that name it (swarmd.averaging.state's
    weights_hash of the block state and of the embedding state, "" where the installer names none). Every Forward
    reply names the hashes of the snapshot that computed it (ForwardReply.block_hash / emb_hash);
  - `ServedWeights`: the snapshots a PullStateRequest.weights_hash may ask for: the last `keep` installed (strong
    references: `keep` copies of the block at most) plus any older one a cached session still runs on (weak
    references: the session holds it anyway, so that costs no memory). A hash outside those is not held: the
    caller answers NOT_FOUND, never another state;
  - `valid_hash()`: the form a named hash must have (lower-case hex, at most MAX_HASH characters): a client checks
    every name a peer sends before it asks for anything by it.
No grpc, no encoding or signing (the node signs what it sends, swarmd.node.served), no filesystem.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from dataclasses import dataclass, field

import torch

from swarmd.core.model import DenoisingBlock

KEEP = 4  # installed snapshots kept for pulls by hash (a merge lands every round: four rounds of slack)
MAX_HASH = 64  # characters of a named hash (weights_hash gives 16)
_HEX = frozenset("0123456789abcdef")


def valid_hash(h: str) -> bool:
    """Whether `h` has the form of a weights hash ("" names nothing and is not one)."""
    return 0 < len(h) <= MAX_HASH and set(h) <= _HEX


@dataclass(eq=False)
class Snapshot:
    """One installed weights pair: what a request runs on, from start to end (a cached session keeps it)."""

    version: int
    block: DenoisingBlock
    table_hat: torch.Tensor  # (V, d) row-normalised byte table
    block_hash: str = ""  # weights_hash of the block state ("" = not named)
    emb_hash: str = ""  # weights_hash of the embedding state
    emb_state: dict[str, torch.Tensor] = field(default_factory=dict)  # the raw embedding state (cpu), for pulls

    @property
    def named(self) -> bool:
        return bool(self.block_hash and self.emb_hash and self.emb_state)


class ServedWeights:
    """The snapshots pullable by hash (see the module doc). Thread-safe: the worker and the loop both read it.

    :param keep: installed snapshots held for pulls beyond those live sessions hold
    """

    def __init__(self, keep: int = KEEP):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._recent: deque[Snapshot] = deque(maxlen=keep)
        self._by_block: weakref.WeakValueDictionary[str, Snapshot] = weakref.WeakValueDictionary()
        self._by_emb: weakref.WeakValueDictionary[str, Snapshot] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def add(self, snap: Snapshot) -> None:
        """Hold a newly installed snapshot (one that names no hashes is never pullable by hash)."""
        if not snap.named:
            return
        with self._lock:
            self._recent.append(snap)
            self._by_block[snap.block_hash] = snap
            self._by_emb[snap.emb_hash] = snap

    def block_state(self, h: str) -> dict[str, torch.Tensor] | None:
        """fp32 cpu copies of the block state of hash `h`, or None when no held snapshot has it."""
        with self._lock:
            snap = self._by_block.get(h)
        if snap is None:
            return None
        return {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in snap.block.state_dict().items()}

    def emb_state(self, h: str) -> dict[str, torch.Tensor] | None:
        """fp32 cpu copies of the embedding state of hash `h`, or None when no held snapshot has it."""
        with self._lock:
            snap = self._by_emb.get(h)
        if snap is None:
            return None
        return {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in snap.emb_state.items()}

    def held(self) -> list[tuple[str, str]]:
        """(block_hash, emb_hash) of every snapshot pullable now, the most recent last (status, tests)."""
        with self._lock:
            recent = list(self._recent)
            others = [s for s in self._by_block.values() if all(s is not r for r in recent)]
        return [(s.block_hash, s.emb_hash) for s in sorted(others, key=lambda s: s.version) + recent]
