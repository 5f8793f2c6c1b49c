"""Count-sketch of a block's weights: a fixed-size fingerprint whose distance estimates the weights' distance.

Owns count_sketch (computed by BlockState after every merge; torch imported only inside it) and
sketch_distance (pure Python: `blocktrain status` compares two peers' sketches without torch).
Every peer hashes parameters to the same buckets (SKETCH_SEED), so sketches from different peers
are comparable.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SKETCH_SIZE = 256  # buckets of the count-sketch in PeerStatus.sketch
SKETCH_SEED = 20240601  # every peer must hash parameters to the same buckets
_SKETCH_CACHE: dict = {}


def flatten(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """All tensors as one fp32 CPU vector, in name order (the order every peer uses)."""
    import torch

    return (
        torch.cat([tensors[k].detach().reshape(-1).float().cpu() for k in sorted(tensors)])
        if tensors
        else torch.zeros(0)
    )


def count_sketch(tensors: dict[str, torch.Tensor], size: int = SKETCH_SIZE) -> list[float]:
    """Fixed count-sketch (bucket and sign per element, same on every peer) of the flattened weights.

    ||sketch(a) - sketch(b)|| estimates ||a - b|| (relative error about sqrt(2 / size)), so two
    peers' statuses alone give their parameter distance.
    """
    import torch

    flat = flatten(tensors)
    n = flat.numel()
    if n not in _SKETCH_CACHE:
        gen = torch.Generator().manual_seed(SKETCH_SEED)
        _SKETCH_CACHE[n] = (
            torch.randint(0, size, (n,), generator=gen),
            torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1,
        )
    bucket, sign = _SKETCH_CACHE[n]
    return torch.zeros(size).index_add_(0, bucket, flat * sign).tolist()


def sketch_distance(a: list[float], b: list[float], norm: float) -> float:
    """Relative distance estimated from two sketches: ||a - b|| / norm (0 when norm is 0)."""
    if len(a) != len(b) or not a:
        return float("nan")
    d = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    return d / norm if norm > 0 else 0.0
