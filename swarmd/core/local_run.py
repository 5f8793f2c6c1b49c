"""Single-process training runs: the BlockTrain stack one block at a time, and the E2E reference.

Owns the round loop behind `blocktrain train` and benchmarks/quality.py: each round, every block
takes steps_per_round local steps on its own data stream with its own optimiser (no gradient
crosses blocks), then the per-block copies of the byte table are averaged (exactly what the swarm
does with one replica per block), then held-out from-noise CE is measured. The E2E reference
takes the same number of optimiser steps as each block. Callers get a RoundReport per round.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import e2e_ce, from_noise_ce
from swarmd.core.model import ByteEmbedding, DenoisingBlock
from swarmd.core.train import BlockTrainer, E2ETrainer, average_embeddings, seed_for


@dataclass
class RoundReport:
    round: int  # 1-based
    steps_per_block: int  # cumulative optimiser steps each block (or the E2E model) has taken
    tokens_per_block: int  # cumulative training bytes each block has seen
    train_ce: float  # mean unweighted training CE over the round
    eval: dict  # from_noise_ce / e2e_ce output
    seconds: float  # wall time since the run started
    extra: dict = field(default_factory=dict)


class BlockStack:
    """B BlockTrainers sharing one data source; each owns its block and its table copy.

    With trajectory training, trajectory_source picks what a block's frozen predecessors are:
    "snapshot" (default, what a swarm peer has): copies of every block and of the averaged table
    taken at the start of the round; "live": the other trainers' current blocks run with this
    trainer's own table copy (the first implementation; in round 1 the table copies disagree).
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        train_cfg: TrainConfig,
        data: ByteData,
        device: str = "cpu",
        trajectory_source: str = "snapshot",
    ):
        if trajectory_source not in ("snapshot", "live"):
            raise ValueError(f"trajectory_source must be snapshot or live, got {trajectory_source!r}")
        self.model_cfg, self.train_cfg, self.device = model_cfg, train_cfg, device
        self.trajectory_source = trajectory_source
        self.trainers = [BlockTrainer(model_cfg, train_cfg, b, device) for b in range(model_cfg.blocks)]
        self.streams = [
            data.stream(seed_for("data", train_cfg.seed, b), train_cfg.batch_size) for b in range(model_cfg.blocks)
        ]

    @property
    def blocks(self) -> list[DenoisingBlock]:
        return [t.block for t in self.trainers]

    @property
    def emb(self) -> ByteEmbedding:
        return self.trainers[0].emb

    def train_round(self, steps: int, on_step: Callable[[int, dict], None] | None = None) -> float:
        ces = []
        snapshot = None
        if self.train_cfg.trajectory_prob > 0 and self.trajectory_source == "snapshot":
            snapshot = {i: copy.deepcopy(t.block).eval().requires_grad_(False) for i, t in enumerate(self.trainers)}
            table = self.trainers[0].emb.normalized().detach().clone()  # tables are equal after averaging
        for b, trainer in enumerate(self.trainers):
            if snapshot is not None:
                trainer.set_others({i: blk for i, blk in snapshot.items() if i != b}, table=table)
            elif self.train_cfg.trajectory_prob > 0:
                trainer.set_others({i: t.block for i, t in enumerate(self.trainers) if i != b})
            for _ in range(steps):
                metrics = trainer.step(*next(self.streams[b]))
                ces.append(metrics["ce"])
                if on_step:
                    on_step(b, metrics)
        average_embeddings([t.emb for t in self.trainers])
        return sum(ces) / max(1, len(ces))


def train_blocktrain(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    data: ByteData,
    eval_xy: tuple[torch.Tensor, torch.Tensor],
    steps_per_round: int,
    rounds: int,
    device: str = "cpu",
    on_round: Callable[[RoundReport], None] | None = None,
    on_step: Callable[[int, dict], None] | None = None,
    eval_steps: int | None = None,
    trajectory_source: str = "snapshot",
) -> BlockStack:
    stack = BlockStack(model_cfg, train_cfg, data, device, trajectory_source)
    start = time.perf_counter()
    for r in range(1, rounds + 1):
        train_ce = stack.train_round(steps_per_round, on_step)
        ev = from_noise_ce(stack.blocks, stack.emb, *eval_xy, model_cfg, steps=eval_steps, device=device)
        if on_round:
            steps = r * steps_per_round
            on_round(
                RoundReport(
                    r,
                    steps,
                    steps * train_cfg.batch_size * model_cfg.seq_len,
                    train_ce,
                    ev,
                    time.perf_counter() - start,
                )
            )
    return stack


def train_e2e(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    data: ByteData,
    eval_xy: tuple[torch.Tensor, torch.Tensor],
    steps_per_round: int,
    rounds: int,
    device: str = "cpu",
    on_round: Callable[[RoundReport], None] | None = None,
    on_step: Callable[[int, dict], None] | None = None,
) -> E2ETrainer:
    trainer = E2ETrainer(model_cfg, train_cfg, device)
    stream = data.stream(seed_for("data", train_cfg.seed, "e2e"), train_cfg.batch_size)
    start = time.perf_counter()
    for r in range(1, rounds + 1):
        ces = []
        for _ in range(steps_per_round):
            metrics = trainer.step(*next(stream))
            ces.append(metrics["ce"])
            if on_step:
                on_step(0, metrics)
        ev = e2e_ce(trainer.model, *eval_xy, device=device)
        if on_round:
            steps = r * steps_per_round
            on_round(
                RoundReport(
                    r,
                    steps,
                    steps * train_cfg.batch_size * model_cfg.seq_len,
                    sum(ces) / len(ces),
                    ev,
                    time.perf_counter() - start,
                )
            )
    return trainer
