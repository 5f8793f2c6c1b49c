"""Optimizer-moment averaging across a block's replicas, in the simulator (DES-LOC's moment syncing).

Owns moments_due (which moments a round averages) and average_moments: every replica of a block ends with the
mean of their AdamW state for the chosen keys (exp_avg, the first moment; exp_avg_sq, the second), parameter by
parameter, matched by position in the optimizers' param groups (replicas of a block are built alike, so
positions match). The daemons do not send moments: this measures whether syncing them closes the gap to
synchronous data parallel before a wire format is spent on it. A moment is as large as the delta, so syncing one
every n rounds costs 1/n of a delta's bytes per round on top.
"""

from __future__ import annotations

import torch

MOMENT_KEYS = ("exp_avg", "exp_avg_sq")


def average_moments(optimizers: list[torch.optim.Optimizer], keys: tuple[str, ...]) -> int:
    """Replace each key's state in every optimizer with the mean over them; returns the tensors averaged.

    A parameter with no state yet (no step taken) or a key missing in one replica is left alone."""
    unknown = set(keys) - set(MOMENT_KEYS)
    if unknown:
        raise ValueError(f"unknown moment keys {sorted(unknown)} (known: {', '.join(MOMENT_KEYS)})")
    if len(optimizers) < 2:
        return 0
    params = [[p for group in opt.param_groups for p in group["params"]] for opt in optimizers]
    if len({len(ps) for ps in params}) != 1:
        raise ValueError("replicas' optimizers hold different parameter lists")
    averaged = 0
    for same in zip(*params, strict=True):
        states = [opt.state.get(p, {}) for opt, p in zip(optimizers, same, strict=True)]
        for key in keys:
            if not all(key in s for s in states):
                continue
            mean = torch.stack([s[key] for s in states]).mean(0)
            for s in states:
                s[key].copy_(mean)
            averaged += 1
    return averaged


def moments_due(round_number: int, first_every: int, second_every: int) -> tuple[str, ...]:
    """The moment keys averaged after round `round_number` (1-based): the first moment every `first_every`
    rounds and the second every `second_every` (0 = never)."""
    return tuple(
        key
        for key, every in zip(MOMENT_KEYS, (first_every, second_every), strict=True)
        if every and round_number % every == 0
    )
