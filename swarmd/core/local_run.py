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
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import e2e_ce, from_noise_ce
from swarmd.core.model import ByteEmbedding, DenoisingBlock
from swarmd.core.pipeline import pipeline_trains
from swarmd.core.train import BlockTrainer, E2ETrainer, average_embeddings, seed_for, split_steps, warm_start


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
        self.started: set[int] = set()  # blocks that have had a turn (train_cfg.block_init acts at the first)

    @property
    def blocks(self) -> list[DenoisingBlock]:
        return [t.block for t in self.trainers]

    @property
    def emb(self) -> ByteEmbedding:
        return self.trainers[0].emb

    def train_round(
        self,
        steps: int,
        on_step: Callable[[int, dict], None] | None = None,
        round_no: int = 1,
        rounds: int = 0,
    ) -> float:
        """Every block whose turn it is takes `steps` local steps, then the byte table copies are averaged; the mean
        train CE.

        With snapshot predecessors the round runs in train_cfg.predecessor_pulls chunks, as concurrent swarm
        peers do: at each chunk's start every block is copied as it is then (the first copy is the round-start
        state) and each block trains its share of the steps against the others' copies. With
        train_cfg.pipeline only the blocks whose turn round `round_no` (1-based) is train (pipeline_trains: each
        for `rounds` rounds, block b from round b x pipeline_stagger + 1 on; with train_cfg.grow to the end), and the
        table is their mean.
        """
        cfg = self.train_cfg
        turn = [
            not cfg.pipeline or pipeline_trains(round_no, b, 0 if cfg.grow else rounds, stagger=cfg.pipeline_stagger)
            for b in range(len(self.trainers))
        ]
        ces = []
        snapshots = cfg.trajectory_prob > 0 and self.trajectory_source == "snapshot"
        chunks = split_steps(steps, cfg.predecessor_pulls if snapshots else 1)
        for b in (b for b, on in enumerate(turn) if on and b not in self.started):
            if cfg.pipeline and cfg.grow and cfg.total_steps and rounds:  # its cosine spans its rounds to the end
                life = rounds - round_no + 1
                self.trainers[b].train_cfg = replace(cfg, total_steps=max(1, cfg.total_steps * life // rounds))
            if cfg.pipeline and cfg.block_init == "predecessor" and b > 0:
                warm_start(self.trainers[b].block, self.trainers[b - 1].block)
            self.started.add(b)
        table = self.trainers[0].emb.normalized().detach().clone()  # tables are equal after averaging
        for chunk in chunks:
            if snapshots:
                snapshot = {i: copy.deepcopy(t.block).eval().requires_grad_(False) for i, t in enumerate(self.trainers)}
            for b, trainer in ((b, t) for b, t in enumerate(self.trainers) if turn[b]):
                if snapshots:
                    trainer.set_others({i: blk for i, blk in snapshot.items() if i != b}, table=table)
                elif cfg.trajectory_prob > 0:
                    trainer.set_others({i: t.block for i, t in enumerate(self.trainers) if i != b})
                for _ in range(chunk):
                    metrics = trainer.step(*next(self.streams[b]))
                    ces.append(metrics["ce"])
                    if on_step:
                        on_step(b, metrics)
        average_embeddings([t.emb for t, on in zip(self.trainers, turn) if on], into=[t.emb for t in self.trainers])
        return sum(ces) / max(1, len(ces))


@dataclass
class LocalRun:
    """One single-process run, whichever model it trains: the parameters train_blocktrain and train_e2e share.

    :param eval_xy: held-out (x, y) windows, measured after every round
    :param on_round: called with a RoundReport after each round's evaluation
    :param on_step: called with (block index, step metrics) after every optimiser step (0 for E2E)
    """

    model_cfg: ModelConfig
    train_cfg: TrainConfig
    data: ByteData
    eval_xy: tuple[torch.Tensor, torch.Tensor]
    steps_per_round: int
    rounds: int
    device: str = "cpu"
    on_round: Callable[[RoundReport], None] | None = None
    on_step: Callable[[int, dict], None] | None = None

    def _run_rounds(
        self, train_round: Callable[[int], float], evaluate: Callable[[], dict], extra_rounds: int = 0
    ) -> None:
        """The round loop both models share: train round r (its mean CE), evaluate, report; extra_rounds: rounds
        after `rounds` (a pipelined stack's later blocks), reported with the steps of the block that took most."""
        start = time.perf_counter()
        for r in range(1, self.rounds + extra_rounds + 1):
            train_ce = train_round(r)
            ev = evaluate()
            if self.on_round:
                steps = min(r, self.rounds) * self.steps_per_round
                tokens = steps * self.train_cfg.batch_size * self.model_cfg.seq_len
                self.on_round(RoundReport(r, steps, tokens, train_ce, ev, time.perf_counter() - start))

    def blocktrain(self, eval_steps: int | None = None, trajectory_source: str = "snapshot") -> BlockStack:
        """The BlockTrain stack, one block at a time (see BlockStack), evaluated from noise; pipelined
        (train_cfg.pipeline) it runs the swarm's extra rounds, each block training `rounds` of them."""
        stack = BlockStack(self.model_cfg, self.train_cfg, self.data, self.device, trajectory_source)
        self._run_rounds(
            lambda r: stack.train_round(self.steps_per_round, self.on_step, r, self.rounds),
            lambda: from_noise_ce(
                stack.blocks, stack.emb, *self.eval_xy, self.model_cfg, steps=eval_steps, device=self.device
            ),
            self.train_cfg.extra_rounds(self.model_cfg.blocks),
        )
        return stack

    def e2e(self, layout: str = "tied") -> E2ETrainer:
        """The E2E reference: the same number of optimiser steps as each block (layout: E2EModel's)."""
        trainer = E2ETrainer(self.model_cfg, self.train_cfg, self.device, layout)
        stream = self.data.stream(seed_for("data", self.train_cfg.seed, "e2e"), self.train_cfg.batch_size)

        def train_round(_round: int) -> float:
            ces = []
            for _ in range(self.steps_per_round):
                metrics = trainer.step(*next(stream))
                ces.append(metrics["ce"])
                if self.on_step:
                    self.on_step(0, metrics)
            return sum(ces) / len(ces)

        self._run_rounds(train_round, lambda: e2e_ce(trainer.model, *self.eval_xy, device=self.device))
        return trainer


def train_blocktrain(
    *run: Any, eval_steps: int | None = None, trajectory_source: str = "snapshot", **run_kw: Any
) -> BlockStack:
    """LocalRun(*run, **run_kw).blocktrain(eval_steps, trajectory_source)."""
    return LocalRun(*run, **run_kw).blocktrain(eval_steps, trajectory_source)


def train_e2e(*run: Any, layout: str = "tied", **run_kw: Any) -> E2ETrainer:
    """LocalRun(*run, **run_kw).e2e(layout)."""
    return LocalRun(*run, **run_kw).e2e(layout)
