"""Block-local training: one block plus its copy of the shared byte table, and the E2E reference.

Owns: BlockTrainer (AdamW over exactly one DenoisingBlock and one ByteEmbedding; gradients never
reach another block), E2ETrainer (the plain causal transformer baseline with the same optimiser),
the learning-rate schedule, seeded initialisation (every replica of a block starts identical),
and the trajectory inputs that let a block train on the sampler's own states (other blocks run
frozen, forward only). No networking, no filesystem.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.model import (
    ByteEmbedding,
    DenoisingBlock,
    block_interval,
    block_loss,
    denoise,
    euler_update,
    handoff_ce,
    init_message_input,
    last_linear,
    sample_sigma,
    sampler_plan,
    start_noise,
)
from swarmd.core.optim import ReplicaAdamW
from swarmd.core.reference import E2EModel


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine to lr * min_lr_ratio at total_steps (constant when total_steps=0)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.total_steps <= cfg.warmup_steps:
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup_steps) / (cfg.total_steps - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def make_adamw(modules: list[nn.Module], cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (dim >= 2) except embeddings/positions.

    The shared byte table (ByteEmbedding.table) gets its own group at lr * table_lr_scale. With
    cfg.replica_adam it is a ReplicaAdamW (swarmd.core.optim), which is AdamW until set_replicas says more.
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    table: list[nn.Parameter] = []
    for module in modules:
        for name, p in module.named_parameters():
            if isinstance(module, ByteEmbedding) and name == "table":
                table.append(p)
            else:
                (
                    decay if p.dim() >= 2 and name not in ("pos", "table", "tok.weight", "ctx_table") else no_decay
                ).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if table:
        groups.append({"params": table, "weight_decay": 0.0, "lr_scale": cfg.table_lr_scale})
    optimizer = ReplicaAdamW if cfg.replica_adam else torch.optim.AdamW
    return optimizer(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def split_steps(steps: int, parts: int) -> list[int]:
    """`steps` in `parts` chunks as equal as can be, the larger first, none empty (one chunk of 0 for 0 steps):
    split_steps(10, 4) = [3, 3, 2, 2]; a round's steps between predecessor pulls (TrainConfig.predecessor_pulls)."""
    parts = max(1, min(parts, steps))
    return [steps // parts + (i < steps % parts) for i in range(parts)]


def seed_for(*parts: int | str) -> int:
    """Stable 31-bit seed from parts (crc32 of their text)."""
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


def init_block(cfg: ModelConfig, block_index: int, seed: int = 0) -> DenoisingBlock:
    """Deterministic initial weights of a block: every replica of (seed, block) is identical."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_for("block", seed, block_index))
        block = DenoisingBlock(cfg)
    if cfg.pred_output == "add" and block_index > 0:  # F starts at 0: z_hat starts at the predecessor's estimate
        with torch.no_grad():
            last_linear(block.out).weight.zero_()
            last_linear(block.out).bias.zero_()
    return block


def warm_start(block: DenoisingBlock, predecessor: DenoisingBlock) -> None:
    """TrainConfig.block_init "predecessor": copy `predecessor`'s weights into `block` in place, all but the output
    head (its last linear starts at 0, as init_block's) and the message input (pred_in, at its init: ModelConfig.
    pred_in_init): the block starts with its predecessor's features and, its F being 0, as the identity on the
    predecessor's estimate (pred_output=add)."""
    own = block.state_dict()
    with torch.no_grad():
        for name, value in predecessor.state_dict().items():
            if name.split(".")[0] not in ("out", "pred_in") and name in own:
                own[name].copy_(value)
        for p in last_linear(block.out).parameters():
            p.zero_()
        if hasattr(block, "pred_in"):
            init_message_input(block.pred_in, block.cfg)


def init_embedding(cfg: ModelConfig, seed: int = 0) -> ByteEmbedding:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_for("embedding", seed))
        return ByteEmbedding(cfg)


def autocast_dtype_for(device: str | torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA, full fp32 on the CPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else None


def trajectory_predecessors(cfg: ModelConfig, block_index: int, steps: int | None = None) -> list[tuple[int, float]]:
    """(block, sigma) of the sampler steps taken before block_index's interval is reached."""
    top = block_interval(cfg, block_index)[1]
    return [(b, s) for b, s, _ in sampler_plan(cfg, steps) if s > top + 1e-9]


@torch.no_grad()
def trajectory_prefix(
    blocks: dict[int, DenoisingBlock],
    table_hat: torch.Tensor,
    x: torch.Tensor,
    cfg: ModelConfig,
    generator: torch.Generator,
    steps: list[tuple[int, float]],
    autocast_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, float, torch.Tensor | None]:
    """The sampler's given steps from fresh noise (blocks frozen, no grad), all but the last Euler update:
    (z the last step read, its denoised mean D = softmax(logits) @ table_hat, that step's sigma, its message).
    euler_to(...) of them at a sequence's own sigma is trajectory_inputs' z."""
    z = start_noise(cfg, (*x.shape, cfg.d_model), generator, x.device)
    targets = [s for _, s in steps[1:]]
    message = None
    for (b, s), s_next in zip(steps, [*targets, None]):
        s_t = torch.full((x.shape[0],), s, device=x.device)
        logits, message, _ = denoise(blocks[b], table_hat, x, z, s_t, autocast_dtype=autocast_dtype, pred=message)
        if s_next is None:
            return z, torch.softmax(logits, dim=-1) @ table_hat, s, message
        z = euler_update(z, logits, table_hat, s, s_next)
    raise ValueError("a trajectory prefix needs at least one step")


def euler_to(z: torch.Tensor, mean: torch.Tensor, sigma_from: float, sigma: torch.Tensor) -> torch.Tensor:
    """The Euler step from sigma_from to each sequence's sigma (n,) given the denoised mean (euler_update's rule)."""
    r = (sigma / sigma_from)[:, None, None]
    return r * z + (1.0 - r) * mean


@torch.no_grad()
def trajectory_inputs(
    blocks: dict[int, DenoisingBlock],
    table_hat: torch.Tensor,
    x: torch.Tensor,
    sigma: torch.Tensor,
    cfg: ModelConfig,
    block_index: int,
    generator: torch.Generator,
    autocast_dtype: torch.dtype | None = None,
    steps: list[tuple[int, float]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """z that the sampler holds on reaching each sequence's sigma inside block_index's interval.

    Starts from fresh noise, takes the given sampler steps (default: the plan's steps above the
    block's interval) with those blocks frozen (no grad), and ends with an Euler step from the last
    of them to each sequence's own sigma. With no earlier step (block 0) the input is pure noise,
    z = sqrt(1 + sigma^2) eps, as at the sampler's start. Returns (z, message): the last earlier
    step's message for the block (model.denoise; None when there is no earlier step or no message).
    """
    steps = trajectory_predecessors(cfg, block_index) if steps is None else steps
    if not steps:
        eps = torch.randn((*x.shape, cfg.d_model), generator=generator).to(x.device)
        z = (1 + sigma**2).sqrt()[:, None, None] * eps
        return z, None
    z, mean, s_last, message = trajectory_prefix(blocks, table_hat, x, cfg, generator, steps, autocast_dtype)
    return euler_to(z, mean, s_last, sigma), message


class BlockTrainer:
    """Trains one block plus a private copy of the byte table; nothing else gets a gradient.

    Trajectory training (train_cfg.trajectory_prob > 0, the default) runs the earlier blocks, given
    by set_others() (frozen, forward only, never handed to the optimiser). Until set_others() has
    given any, a later block trains on the documented noisy targets (as a swarm round without its
    predecessors does); a set that lacks a block the trajectory needs is an error.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        train_cfg: TrainConfig,
        block_index: int,
        device: str = "cpu",
        worker_seed: int = 0,
        block: DenoisingBlock | None = None,
        emb: ByteEmbedding | None = None,
    ):
        if not 0 <= block_index < model_cfg.blocks:
            raise ValueError(f"block {block_index} outside [0, {model_cfg.blocks})")
        self.model_cfg, self.train_cfg, self.block_index, self.device = model_cfg, train_cfg, block_index, device
        self.block = (block or init_block(model_cfg, block_index, train_cfg.seed)).to(device)
        self.emb = (emb or init_embedding(model_cfg, train_cfg.seed)).to(device)
        if train_cfg.freeze_z_in == "all" or (train_cfg.freeze_z_in == "block0" and block_index == 0):
            # block 0's z is pure noise under trajectory training: its noise path can only learn noise
            with torch.no_grad():
                self.block.z_in.weight.zero_()
                self.block.z_in.bias.zero_()
            self.block.z_in.requires_grad_(False)
        self.opt = make_adamw([self.block, self.emb], train_cfg)
        self.step_count = 0
        self.gen = torch.Generator().manual_seed(seed_for("noise", train_cfg.seed, block_index, worker_seed))
        self.autocast = autocast_dtype_for(device)
        self.others: dict[int, DenoisingBlock] = {}
        self.others_table: torch.Tensor | None = None
        steps = train_cfg.trajectory_steps or None
        self.plan = sampler_plan(model_cfg, steps)
        self.own_steps = [k for k, (b, _, _) in enumerate(self.plan) if b == block_index]
        self.replay: list[torch.Tensor] | None = None  # trajectory replay's buffer (TrainConfig.trajectory_reuse)
        self.replay_served = 0  # steps the buffer has served since its refresh

    def set_replicas(self, replicas: int) -> None:
        """How many replicas' deltas the last merge averaged (own included): the K of a ReplicaAdamW
        (cfg.replica_adam); a plain AdamW ignores it."""
        if isinstance(self.opt, ReplicaAdamW):
            self.opt.set_replicas(max(1, replicas))

    def set_others(self, others: dict[int, DenoisingBlock], table: ByteEmbedding | torch.Tensor | None = None) -> None:
        """Frozen copies of other blocks for trajectory inputs (forward only, never optimised).

        :param table: the byte table those blocks were trained with (a ByteEmbedding or its
            normalised rows); their forward passes and the Euler mean D use it. Default: this
            trainer's own (drifting) table copy.
        """
        self.others = {i: b for i, b in others.items() if i != self.block_index}  # used under no_grad only
        if isinstance(table, ByteEmbedding):
            table = table.normalized()
        self.others_table = None if table is None else table.detach().clone().to(self.device)

    def _sigma(self, n: int) -> tuple[torch.Tensor, int | None]:
        """Per-sequence training sigmas and, for sigma_sampling=sampler, the plan step they sit at."""
        mode = self.train_cfg.sigma_sampling
        if mode == "lognormal":
            return sample_sigma(self.model_cfg, self.block_index, n, self.gen), None
        if mode == "loguniform":
            lo, hi = block_interval(self.model_cfg, self.block_index)
            u = torch.rand(n, generator=self.gen, dtype=torch.float64)
            return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))).float(), None
        k = (
            self.own_steps[int(torch.randint(len(self.own_steps), (1,), generator=self.gen))]
            if self.own_steps
            else None
        )
        if k is None:  # this block gets no sampler step at this N: fall back to its interval
            return sample_sigma(self.model_cfg, self.block_index, n, self.gen), None
        jitter = torch.exp(self.train_cfg.sigma_jitter * torch.randn(n, generator=self.gen))
        sigma = (self.plan[k][1] * jitter).clamp(self.model_cfg.sigma_lo, self.model_cfg.sigma_hi)
        return sigma.float(), k

    def _trajectory_steps(self, k: int | None) -> list[tuple[int, float]]:
        if k is not None:  # every plan step before k (own earlier steps included)
            return [(b, s) for b, s, _ in self.plan[:k]]
        top = block_interval(self.model_cfg, self.block_index)[1]
        return [(b, s) for b, s, _ in self.plan if s > top + 1e-9]

    def _inputs(
        self, x: torch.Tensor, y: torch.Tensor, sigma: torch.Tensor, k: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(x, y, z, predecessor feature): trajectory inputs, or z and feature None for the documented noisy
        targets. With trajectory replay (reuse() > 1) x and y are the replay buffer's windows."""
        p = self.train_cfg.trajectory_prob
        if p <= 0 or float(torch.rand(1, generator=self.gen)) >= p:
            return x, y, None, None
        steps = self._trajectory_steps(k)
        if not self.others and any(b != self.block_index for b, _ in steps):
            return x, y, None, None  # no predecessors given (yet): the documented noisy targets
        missing = sorted({b for b, _ in steps} - set(self.others) - {self.block_index})
        if missing:
            raise ValueError(f"trajectory training of block {self.block_index} needs blocks {missing}")
        table_hat = self.others_table if self.others_table is not None else self.emb.normalized().detach()
        blocks = {**self.others, self.block_index: self.block}
        was_training = self.block.training
        self.block.eval()
        try:
            if self.reuse() > 1 and steps and k is None:
                return self._replayed(blocks, table_hat, x, y, sigma, steps)
            z, pred = trajectory_inputs(
                blocks, table_hat, x, sigma, self.model_cfg, self.block_index, self.gen, self.autocast, steps=steps
            )
            return x, y, z, pred
        finally:
            self.block.train(was_training)

    def reuse(self) -> int:
        """TrainConfig.trajectory_reuse resolved for this block (0: the block's index; block 0 runs no forwards)."""
        r = self.train_cfg.trajectory_reuse
        return max(1, self.block_index if r == 0 else r)

    def _replayed(
        self,
        blocks: dict[int, DenoisingBlock],
        table_hat: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        sigma: torch.Tensor,
        steps: list[tuple[int, float]],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Trajectory replay: every R steps the predecessors run on this step's whole batch, which replaces the
        buffer; each step trains on the buffer's n windows, each taking the final Euler step to its own fresh sigma.
        A window serves R steps, against predecessors at most R steps old. One call on n windows every R steps, not
        n / R windows every step: the same forwards per window (and the same held-out CE), without R-fold the
        per-call cost of small forwards."""
        n = x.shape[0]
        if self.replay is None or self.replay_served >= self.reuse() or self.replay[0].shape[0] != n:
            z, mean, s_last, message = trajectory_prefix(
                blocks, table_hat, x, self.model_cfg, self.gen, steps, self.autocast
            )
            sigma_from = torch.full((n,), s_last, device=z.device)
            self.replay = [x, y, z, mean, sigma_from, *([message] if message is not None else [])]
            self.replay_served = 0
        self.replay_served += 1
        bx, by, bz, bmean, bfrom = self.replay[:5]
        r = (sigma / bfrom)[:, None, None]
        return bx, by, r * bz + (1.0 - r) * bmean, self.replay[5] if len(self.replay) > 5 else None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One AdamW step on a batch; returns the weighted loss, unweighted CE and lr."""
        x, y = x.to(self.device), y.to(self.device)
        sigma, k = self._sigma(x.shape[0])
        sigma = sigma.to(self.device)
        x, y, z, pred = self._inputs(x, y, sigma, k)
        lr = lr_at(self.step_count, self.train_cfg) * (self.train_cfg.later_lr_scale if self.block_index else 1.0)
        for group in self.opt.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        self.block.train()
        loss, ce = block_loss(
            self.block,
            self.emb,
            x,
            y,
            sigma,
            z=z,
            autocast_dtype=self.autocast,
            pred=pred,
            handoff_weight=self.train_cfg.handoff_weight,
            generator=self.gen,  # the noisy targets' eps: this trainer's noise, not torch's global generator
        )
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(
            [p for p in (*self.block.parameters(), *self.emb.parameters()) if p.requires_grad], self.train_cfg.grad_clip
        )
        self.opt.step()
        self.step_count += 1
        return {"loss": float(loss.detach()), "ce": float(ce), "lr": lr}


class E2ETrainer:
    """The end-to-end reference: same width, B x L_b layers, same optimiser, next-byte CE (layout: E2EModel's)."""

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, device: str = "cpu", layout: str = "tied"):
        self.model_cfg, self.train_cfg, self.device = model_cfg, train_cfg, device
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed_for("e2e", train_cfg.seed))
            self.model = E2EModel(model_cfg, layout).to(device)
        self.opt = make_adamw([self.model], train_cfg)
        self.step_count = 0
        self.autocast = autocast_dtype_for(device)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        x, y = x.to(self.device), y.to(self.device)
        lr = lr_at(self.step_count, self.train_cfg)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.model.train()
        with torch.autocast(
            torch.device(self.device).type, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None
        ):
            logits, feature = self.model.logits_and_feature(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        ce = loss.detach()
        if self.model_cfg.handoff_loss != "none" and x.shape[1] > 1:  # the blocks' term, for a fair reference
            loss = loss + self.train_cfg.handoff_weight * handoff_ce(self.model, feature, x, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.train_cfg.grad_clip)
        self.opt.step()
        self.step_count += 1
        return {"loss": float(loss.detach()), "ce": float(ce), "lr": lr}


@torch.no_grad()
def average_embeddings(embs: list[ByteEmbedding], into: list[ByteEmbedding] | None = None) -> None:
    """Set every copy of the byte table (or every one of `into`) to the mean of the copies in `embs`
    (single-process rounds; a pipelined stack averages the tables of the blocks that trained)."""
    if not embs:
        return
    mean = torch.stack([e.table.detach().float() for e in embs]).mean(0)
    for e in embs if into is None else into:
        e.table.copy_(mean.to(e.table.dtype))
