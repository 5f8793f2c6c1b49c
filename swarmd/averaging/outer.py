"""The outer optimizer: what a peer does with a round's merged delta before it moves its base (DiLoCo's outer step).

Owns OuterOptimizer, make_outer and outer_for. The merged (robust-mean) delta of a round is a pseudo-gradient
(its negative): plain averaging applies it as it is (base += merged; outer "none"), DiLoCo applies
SGD with Nesterov momentum to it (Douillard et al. 2023: outer lr 0.7, momentum 0.9):

    buf    = momentum * buf + merged
    update = lr * (merged + momentum * buf)       (torch.optim.SGD(nesterov=True) on g = -merged)
    base  += update

One buffer per part ("block", "emb"), fp32 on the CPU like the base weights. Replicas stay
bit-identical: every replica of a block applies the same step, in the same order of elementwise
operations, to the same merged delta, so equal buffers stay equal. The buffers are part of a peer's
state: they travel with its checkpoint (state_tensors / load_state_tensors, names "outer.<part>.<tensor>")
and with PullState (a joiner or re-syncing peer adopts the reference's buffers with its weights);
a state adopted without buffers (a peer that sent none) resets that part's buffer to zero, the
documented reset rule.

Under group averaging (GossipConfig.group_size or table_group_size > 0; outer_for) the replicas of a
block hold different bases, so the step cannot wait for one shared merged delta: the optimizer is `local`
there. Each peer steps on its own round delta before sending (the payload is offset + update,
swarmd.averaging.exchange.publish) and its group averages the updates, which land as they are (no second
step). Nesterov is linear in its input, so the mean of every replica's update is DiLoCo's step on the mean
delta with the mean buffer: the swarm's mean follows DiLoCo exactly while group averaging mixes the
replicas; each peer's buffer is its own (they differ by the replicas' noise, as their bases do before the
groups mix them). An update can be up to lr / (1 - momentum) x a delta's norm (gain()), which the payload
norm bound allows for.
No grpc, no asyncio here.
"""

from __future__ import annotations

import math

import torch

from swarmd.averaging.config import GossipConfig

Tensors = dict[str, torch.Tensor]

OUTER_KINDS = ("none", "nesterov")
PREFIX = "outer."
PARTS = ("block", "emb")


class OuterOptimizer:
    """SGD with Nesterov momentum on the merged delta; holds one momentum buffer per part."""

    def __init__(self, lr: float = 0.7, momentum: float = 0.9, name: str = "nesterov", local: bool = False):
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"outer lr must be > 0, got {lr}")
        if not 0 <= momentum < 1:
            raise ValueError(f"outer momentum must be in [0, 1), got {momentum}")
        self.lr, self.momentum, self.name = float(lr), float(momentum), name
        self.local = bool(local)  # step on the own delta before sending (group averaging; module doc)
        self.buffers: dict[str, Tensors] = {}

    def gain(self) -> float:
        """The largest ratio of an update's norm to the deltas' (a buffer of equal deltas: lr / (1 - momentum))."""
        return self.lr * (1.0 + self.momentum / (1.0 - self.momentum))

    @torch.no_grad()
    def step(self, part: str, merged: Tensors) -> Tensors:
        """The update to add to `part`'s base for this merged delta; advances that part's buffer."""
        old = self.buffers.get(part)
        buf = {k: (v.float() if old is None else old[k].mul(self.momentum).add_(v.float())) for k, v in merged.items()}
        if old is None:
            buf = {k: v.clone() for k, v in buf.items()}
        self.buffers[part] = buf
        return {k: merged[k].float().add(buf[k], alpha=self.momentum).mul_(self.lr) for k in merged}

    def reset(self, part: str | None = None) -> None:
        """Zero the buffer of one part (None: all): the next step starts from plain lr x merged x (1 + momentum)."""
        if part is None:
            self.buffers.clear()
        else:
            self.buffers.pop(part, None)

    def part_tensors(self, part: str, like: Tensors) -> Tensors:
        """Copies of `part`'s buffer, zeros shaped like `like` when it has none yet."""
        buf = self.buffers.get(part)
        return {
            k: (buf[k].clone() if buf is not None else torch.zeros_like(v, dtype=torch.float32))
            for k, v in like.items()
        }

    def load_part(self, part: str, tensors: Tensors | None) -> None:
        """Adopt `part`'s buffer (copies); None resets it (the reset rule)."""
        if tensors is None:
            self.reset(part)
        else:
            self.buffers[part] = {k: v.detach().to("cpu", torch.float32).clone() for k, v in tensors.items()}

    def state_tensors(self) -> Tensors:
        """Every buffer as flat tensors named outer.<part>.<tensor> (for the checkpoint)."""
        return {f"{PREFIX}{p}.{k}": v.clone() for p, buf in self.buffers.items() for k, v in buf.items()}

    def load_state_tensors(self, tensors: Tensors) -> None:
        """Inverse of state_tensors (other names ignored); a part missing from `tensors` is reset."""
        self.buffers.clear()
        for name, value in tensors.items():
            if name.startswith(PREFIX):
                part, _, key = name[len(PREFIX) :].partition(".")
                if part in PARTS and key:
                    self.buffers.setdefault(part, {})[key] = value.detach().to("cpu", torch.float32).clone()


def with_momentum(tensors: Tensors, momentum: Tensors) -> Tensors:
    """A state payload's tensors plus a part's buffer named outer.<tensor> (PullState with outer_state)."""
    return {**tensors, **{PREFIX + k: v for k, v in momentum.items()}}


def split_momentum(tensors: Tensors) -> tuple[Tensors, Tensors | None]:
    """Inverse of with_momentum: (the weights, the buffer or None when the payload held none)."""
    weights = {k: v for k, v in tensors.items() if not k.startswith(PREFIX)}
    momentum = {k[len(PREFIX) :]: v for k, v in tensors.items() if k.startswith(PREFIX)}
    return weights, (momentum or None)


def with_momentum_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of a state payload that carries the buffer too."""
    return {**shapes, **{PREFIX + k: s for k, s in shapes.items()}}


def make_outer(kind: str, lr: float = 0.7, momentum: float = 0.9, local: bool = False) -> OuterOptimizer | None:
    """The outer optimizer of a GossipConfig's outer / outer_lr / outer_momentum (None for "none"); local: group
    averaging's (GossipConfig.group_size > 0; see the module doc)."""
    if kind == "none":
        return None
    if kind == "nesterov":
        return OuterOptimizer(lr, momentum, kind, local)
    raise ValueError(f"outer must be one of {OUTER_KINDS}, got {kind!r}")


def outer_for(cfg: GossipConfig) -> OuterOptimizer | None:
    """A peer's outer optimizer for its GossipConfig: local when any part averages in groups (group_size or
    table_group_size > 0: parts anchored apart have no shared merged delta to step on)."""
    return make_outer(cfg.outer, cfg.outer_lr, cfg.outer_momentum, local=bool(cfg.group_size or cfg.table_group_size))
