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

from swarmd.config import ModelConfig, TrainConfig
from swarmd.model import (
    ByteEmbedding,
    DenoisingBlock,
    E2EModel,
    block_interval,
    block_loss,
    denoise_logits,
    sample_sigma,
    sampler_plan,
    start_noise,
)


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
    """AdamW with weight decay on matrices (dim >= 2) except embeddings/positions."""
    decay, no_decay = [], []
    for module in modules:
        for name, p in module.named_parameters():
            (decay if p.dim() >= 2 and name not in ("pos", "table", "tok.weight") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def seed_for(*parts: int | str) -> int:
    """Stable 31-bit seed from parts (crc32 of their text)."""
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


def init_block(cfg: ModelConfig, block_index: int, seed: int = 0) -> DenoisingBlock:
    """Deterministic initial weights of a block: every replica of (seed, block) is identical."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_for("block", seed, block_index))
        return DenoisingBlock(cfg)


def init_embedding(cfg: ModelConfig, seed: int = 0) -> ByteEmbedding:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_for("embedding", seed))
        return ByteEmbedding(cfg)


def autocast_dtype_for(device: str | torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA, full fp32 on the CPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else None


def trajectory_predecessors(cfg: ModelConfig, block_index: int) -> list[tuple[int, float]]:
    """(block, sigma) of the sampler steps taken before block_index's interval is reached."""
    top = block_interval(cfg, block_index)[1]
    return [(b, s) for b, s, _ in sampler_plan(cfg) if s > top + 1e-9]


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
) -> torch.Tensor:
    """z that the sampler holds on reaching each sequence's sigma inside block_index's interval.

    Starts from fresh noise, takes the plan's Euler steps that lie above the block's interval with
    the earlier blocks (frozen, no grad), and ends with an Euler step to each sequence's own sigma.
    With no earlier step (block 0) the input is pure noise, z = sqrt(1 + sigma^2) eps, as at the
    sampler's start.
    """
    steps = trajectory_predecessors(cfg, block_index)
    if not steps:
        eps = torch.randn((*x.shape, cfg.d_model), generator=generator).to(x.device)
        return (1 + sigma**2).sqrt()[:, None, None] * eps
    z = start_noise(cfg, (*x.shape, cfg.d_model), generator, x.device)
    targets = [s for _, s in steps[1:]]
    for (b, s), s_next in zip(steps, [*targets, None]):
        s_t = torch.full((x.shape[0],), s, device=x.device)
        logits = denoise_logits(blocks[b], table_hat, x, z, s_t, autocast_dtype=autocast_dtype)
        d = torch.softmax(logits, dim=-1) @ table_hat
        r = (s_next / s) if s_next is not None else (sigma / s)[:, None, None]
        z = r * z + (1 - r) * d
    return z


class BlockTrainer:
    """Trains one block plus a private copy of the byte table; nothing else gets a gradient.

    :param others: the other blocks (index -> module), run frozen and forward only, needed only
        when train_cfg.trajectory_prob > 0. They are never handed to the optimiser.
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
        self.opt = make_adamw([self.block, self.emb], train_cfg)
        self.step_count = 0
        self.gen = torch.Generator().manual_seed(seed_for("noise", train_cfg.seed, block_index, worker_seed))
        self.autocast = autocast_dtype_for(device)
        self.others: dict[int, DenoisingBlock] = {}

    def set_others(self, others: dict[int, DenoisingBlock]) -> None:
        """Frozen copies of other blocks for trajectory inputs (forward only, never optimised)."""
        self.others = {i: b for i, b in others.items() if i != self.block_index}  # used under no_grad only

    def _inputs(self, x: torch.Tensor, y: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor | None:
        p = self.train_cfg.trajectory_prob
        if p <= 0 or float(torch.rand(1, generator=self.gen)) >= p:
            return None
        missing = sorted({b for b, _ in trajectory_predecessors(self.model_cfg, self.block_index)} - set(self.others))
        if missing:
            raise ValueError(f"trajectory training of block {self.block_index} needs blocks {missing}")
        table_hat = self.emb.normalized().detach()
        return trajectory_inputs(self.others, table_hat, x, sigma, self.model_cfg, self.block_index, self.gen, self.autocast)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One AdamW step on a batch; returns the weighted loss, unweighted CE and lr."""
        x, y = x.to(self.device), y.to(self.device)
        sigma = sample_sigma(self.model_cfg, self.block_index, x.shape[0], self.gen).to(self.device)
        z = self._inputs(x, y, sigma)
        lr = lr_at(self.step_count, self.train_cfg)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.block.train()
        loss, ce = block_loss(self.block, self.emb, x, y, sigma, z=z, autocast_dtype=self.autocast)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_([*self.block.parameters(), *self.emb.parameters()], self.train_cfg.grad_clip)
        self.opt.step()
        self.step_count += 1
        return {"loss": float(loss.detach()), "ce": float(ce), "lr": lr}


class E2ETrainer:
    """The end-to-end reference: same width, B x L_b layers, same optimiser, next-byte CE."""

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, device: str = "cpu"):
        self.model_cfg, self.train_cfg, self.device = model_cfg, train_cfg, device
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed_for("e2e", train_cfg.seed))
            self.model = E2EModel(model_cfg).to(device)
        self.opt = make_adamw([self.model], train_cfg)
        self.step_count = 0
        self.autocast = autocast_dtype_for(device)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        x, y = x.to(self.device), y.to(self.device)
        lr = lr_at(self.step_count, self.train_cfg)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.model.train()
        with torch.autocast(torch.device(self.device).type, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            logits = self.model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.train_cfg.grad_clip)
        self.opt.step()
        self.step_count += 1
        return {"loss": float(loss.detach()), "ce": float(loss.detach()), "lr": lr}


@torch.no_grad()
def average_embeddings(embs: list[ByteEmbedding]) -> None:
    """Set every copy of the byte table to the mean of all copies (single-process rounds)."""
    mean = torch.stack([e.table.detach().float() for e in embs]).mean(0)
    for e in embs:
        e.table.copy_(mean.to(e.table.dtype))
