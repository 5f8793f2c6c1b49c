"""The cost model behind the time-to-quality clock: what one optimiser step costs, measured on the real trainer.

Owns StepCosts (seconds per step of each block with its own predecessor work, of the end-to-end model of the same
depth, and the bytes a peer moves: a block's and the table's fp32 state, one micro-batch's activations),
measure_step_costs (times real BlockTrainer and E2ETrainer steps on a device, one thread on a CPU), breakdown
(where a block's step goes: predecessor forwards, the hand-off head, the rest; a round's fixed costs, round_s
and pull_s, come from real daemons) and the clocks of the references
that need no simulation: one peer training end to end, P-way synchronous data parallel with free communication
(the ideal), and the end-to-end model pipelined over P peers as SWARM parallelism trains it (8-bit activations
and their gradients across every stage boundary for every micro-batch); priced_regime puts a network regime on
that clock.

Costs are plain numbers: a run of the simulator or of the references is a function of them, so pinned costs give
a pinned clock. Measuring them is the only thing here that depends on the machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from swarmd.core.balanced_rounds import round_steps
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.model import count_params
from swarmd.core.train import BlockTrainer, E2ETrainer, init_block, init_embedding
from swarmd.sim.regimes import Dist, Regime


@dataclass(frozen=True)
class StepCosts:
    """Seconds per optimiser step at one batch size, and the state and activation sizes a peer sends.

    :param block_s: per block b, one local step including its b predecessors' forwards (trajectory training)
    :param e2e_s: one step of the end-to-end model of the same depth (B x L_b layers)
    :param block_bytes: one block's fp32 state (what a pull or a joiner's download moves)
    :param table_bytes: the byte table's fp32 state
    :param activation_bytes: one micro-batch's activations at a stage boundary, 8-bit (batch x seq x d)
    :param round_s: a daemon's fixed seconds per round besides its steps, its pulls and its exchange's transfers
        (record lookups, exchange calls, checkpoint, announce), measured on real daemons (benchmarks/clock_check.py);
        0 prices rounds as free
    :param pull_s: a daemon's seconds of local work per predecessor state pulled (the call, decoding, the hash
        check), besides the transfer; measured with round_s
    """

    block_s: tuple[float, ...]
    e2e_s: float
    block_bytes: int
    table_bytes: int
    activation_bytes: int
    device: str = "cpu"
    round_s: float = 0.0
    pull_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.block_s or min(self.block_s) <= 0 or self.e2e_s <= 0:
            raise ValueError("step costs must be > 0")
        if self.round_s < 0 or self.pull_s < 0:
            raise ValueError("a round's fixed costs must be >= 0")
        object.__setattr__(self, "block_s", tuple(float(s) for s in self.block_s))

    @property
    def blocks(self) -> int:
        return len(self.block_s)

    def later_over_first(self) -> float:
        """Block B-1's step cost over block 0's (the predecessor work a later block pays)."""
        return self.block_s[-1] / self.block_s[0]

    def balanced_steps(self, steps: int, cap: float) -> tuple[int, ...]:
        """Each block's steps a round when it trains as long as the slowest block takes for `steps` steps, at most
        cap x `steps` (swarmd.core.balanced_rounds.round_steps, from the step rates alone, as a daemon sees them)."""
        return tuple(round_steps(steps, 1 / s, 1 / max(self.block_s), cap) for s in self.block_s)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> StepCosts:
        return cls(**{**data, "block_s": tuple(data["block_s"])})


def _seconds_per_call(fn: Callable[[], object], repeats: int, warmup: int = 3, groups: int = 3) -> float:
    """The fastest of `groups` timings of `repeats` calls, per call: the cost on a quiet core (another process's
    load only ever adds time)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(groups):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def _batch(model_cfg: ModelConfig, train_cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shape = (train_cfg.batch_size, model_cfg.seq_len)
    return torch.randint(0, 256, shape, generator=g), torch.randint(0, 256, shape, generator=g)


def block_step_s(
    model_cfg: ModelConfig, train_cfg: TrainConfig, block: int, device: str = "cpu", repeats: int = 20
) -> float:
    """Seconds of one real BlockTrainer step of `block`, its predecessors (freshly initialised) set as a swarm
    peer holds them, on `device`."""
    trainer = BlockTrainer(model_cfg, train_cfg, block, device)
    trainer.set_others({b: init_block(model_cfg, b, train_cfg.seed).to(device) for b in range(block)})
    x, y = _batch(model_cfg, train_cfg)
    return _seconds_per_call(lambda: trainer.step(x, y), repeats)


def measure_step_costs(
    model_cfg: ModelConfig, train_cfg: TrainConfig, device: str = "cpu", repeats: int = 20
) -> StepCosts:
    """StepCosts of this model and batch, timed on the real trainers (the caller sets torch's threads)."""
    e2e = E2ETrainer(model_cfg, train_cfg, device)
    x, y = _batch(model_cfg, train_cfg)
    e2e_s = _seconds_per_call(lambda: e2e.step(x, y), repeats)
    blocks = tuple(block_step_s(model_cfg, train_cfg, b, device, repeats) for b in range(model_cfg.blocks))
    return StepCosts(
        blocks,
        e2e_s,
        4 * count_params(init_block(model_cfg, 0)),
        4 * count_params(init_embedding(model_cfg)),
        train_cfg.batch_size * model_cfg.seq_len * model_cfg.d_model,
        device,
    )


def breakdown(
    model_cfg: ModelConfig, train_cfg: TrainConfig, block: int, device: str = "cpu", repeats: int = 20
) -> dict[str, float]:
    """Where a step of `block` goes, in seconds: the step as configured, its predecessor forwards (the step less
    the same step on the documented noisy targets) and the hand-off head (less the same step without it)."""
    full = block_step_s(model_cfg, train_cfg, block, device, repeats)
    no_trajectory = block_step_s(model_cfg, replace(train_cfg, trajectory_prob=0.0), block, device, repeats)
    no_handoff = block_step_s(replace(model_cfg, handoff_loss="none"), train_cfg, block, device, repeats)
    return {
        "step_s": full,
        "predecessor_forwards_s": max(0.0, full - no_trajectory),
        "handoff_head_s": max(0.0, full - no_handoff),
        "own_step_s": min(no_trajectory, full),
    }


def e2e_one_peer_s(costs: StepCosts, steps: int) -> float:
    """Wall time of `steps` end-to-end steps on one peer."""
    return steps * costs.e2e_s


def sync_dp_ideal_s(costs: StepCosts, steps: int) -> float:
    """Wall time of `steps` synchronous data-parallel steps over P peers, each peer computing one share of the
    P-fold batch (e2e_s at the per-peer batch) and the all-reduce taking no time: the ideal no swarm can beat."""
    return steps * costs.e2e_s


def pipelined_e2e_s(costs: StepCosts, steps: int, stages: int, bandwidth_Bps: float, latency_s: float) -> float:
    """Wall time of `steps` end-to-end steps pipelined over `stages` peers in a row (SWARM parallelism): each
    stage computes its share of the layers (e2e_s / stages) while the activations of the previous micro-batch and
    the gradients of the next cross its boundaries at 8 bits, so a step takes the slower of the two; the pipeline
    fills once (stages x latency). Replicas of a stage (P > stages) multiply the batch, not this clock."""
    if stages < 1 or bandwidth_Bps <= 0:
        raise ValueError("stages must be >= 1 and bandwidth > 0")
    compute = costs.e2e_s / stages
    transfer = 0.0 if stages == 1 else 2 * costs.activation_bytes / bandwidth_Bps
    return steps * max(compute, transfer) + (stages - 1) * 2 * latency_s


def priced_regime(regime: Regime, seconds_per_step: float) -> Regime:
    """The regime on the cost model's clock: its per-step compute median becomes `seconds_per_step` (block 0's
    measured step) and its latency and transfer times scale with it, so compute and network compare as the regime
    sets them (its presets are sized for a d=64 block) while the clock reads in measured seconds."""
    f = seconds_per_step / regime.compute_s.median
    return replace(
        regime,
        compute_s=Dist(seconds_per_step, regime.compute_s.sigma),
        latency_s=Dist(regime.latency_s.median * f, regime.latency_s.sigma),
        bandwidth_Bps=Dist(regime.bandwidth_Bps.median / f, regime.bandwidth_Bps.sigma),
    )
