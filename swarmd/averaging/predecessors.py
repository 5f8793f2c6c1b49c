"""TrajectoryPredecessors: the frozen predecessor blocks a BlockState trains its block behind.

Trajectory training runs block b's input through the merged states of blocks 0..b-1 (forward only, with the round's
merged byte table): use_predecessors switches it on for a round with those states (or off), refresh_predecessors
swaps in fresher working weights of some of them mid-round, and warm_start gives a later block its predecessor's
weights at its first round (TrainConfig.block_init "predecessor"). A mixin of swarmd.averaging.state.BlockState: it
reads the state's trainer, lock, base byte table and adopt(). No grpc, no asyncio here.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.model import DenoisingBlock
from swarmd.core.train import BlockTrainer, warm_start


class TrajectoryPredecessors:
    """The predecessor half of a BlockState (see the module docstring)."""

    # set by BlockState.__init__
    cfg: ModelConfig
    train_cfg: TrainConfig
    block_index: int
    trainer: BlockTrainer
    lock: threading.RLock
    base_emb: dict[str, torch.Tensor]
    # trajectory training's predecessors as merged at round start (use_predecessors); None = none this round
    predecessors: dict[int, dict[str, torch.Tensor]] | None

    adopt: Callable[..., None]  # BlockState.adopt: replace base and live weights

    @torch.no_grad()
    def use_predecessors(self, blocks: dict[int, dict[str, torch.Tensor]] | None) -> None:
        """Trajectory training for the next steps: on with these frozen predecessor blocks (merged states,
        run forward only with the round's merged byte table), or off (None: the documented noisy targets).
        "On" means the configured trajectory_prob; the trainer's other settings are left as configured.
        These merged states are what refresh_predecessors measures fresher ones against until the next call.
        """
        self.predecessors = dict(blocks) if blocks is not None else None
        others = self._frozen(blocks or {})
        with self.lock:
            self.trainer.set_others(others, table=self.base_table_hat())
            on = blocks is not None
            self.trainer.train_cfg = self.train_cfg if on else replace(self.train_cfg, trajectory_prob=0.0)

    @torch.no_grad()
    def refresh_predecessors(self, fresh: dict[int, dict[str, torch.Tensor]]) -> None:
        """Mid-round: run these fresher states of some predecessors (their working weights) from the next step on,
        the round-start merged states of the others; nothing changes while trajectory training is off."""
        if self.predecessors is None:
            return
        others = self._frozen({**self.predecessors, **{b: fresh[b] for b in fresh if b in self.predecessors}})
        with self.lock:
            self.trainer.set_others(others, table=self.base_table_hat())

    @torch.no_grad()
    def warm_start(self) -> bool:
        """TrainConfig.block_init "predecessor" at a later block's first training round: base and live block become
        its predecessor's merged round-start state (self.predecessors, use_predecessors) as swarmd.core.train.
        warm_start copies it (output layer at 0, message input at its init). Replicas that pulled the same
        predecessor state start from the same base. False (nothing changed) for block 0 or without that state."""
        state = (self.predecessors or {}).get(self.block_index - 1)
        if self.block_index == 0 or state is None:
            return False
        predecessor = DenoisingBlock(self.cfg)
        predecessor.load_state_dict(state)
        with self.lock:
            block = copy.deepcopy(self.trainer.block).cpu()
        warm_start(block, predecessor)
        self.adopt(block.state_dict(), None)
        return True

    def base_table_hat(self) -> torch.Tensor:
        """The normalised rows of the round's merged byte table: what frozen predecessors run with."""
        return F.normalize(self.base_emb["table"].float(), dim=-1)

    def _frozen(self, blocks: dict[int, dict[str, torch.Tensor]]) -> dict[int, DenoisingBlock]:
        """Eval-mode DenoisingBlocks of these states on the trainer's device (forward only, never optimised)."""
        others = {}
        for b, state in blocks.items():
            others[b] = DenoisingBlock(self.cfg)
            others[b].load_state_dict(state)
            others[b].to(self.trainer.device).eval().requires_grad_(False)
        return others
