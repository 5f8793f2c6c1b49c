"""Held-out metrics: from-noise CE (the model's real score), per-step trace, denoising CE, E2E CE.

Owns the evaluation protocol of diffusionblocks.md section 8: the sampler runs from a fixed noise
seed over consecutive held-out windows with the true context; CE is the mean over every scored
byte of -ln p(y), in nats. Denoising CE is a diagnostic only. No networking, no filesystem.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from swarmd.core.config import ModelConfig
from swarmd.core.model import (
    ByteEmbedding,
    DenoisingBlock,
    E2EModel,
    denoise,
    noisy_targets,
    sample_from_noise,
    sample_sigma,
    sampler_plan,
    start_noise,
)


def _ce_sum(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float(F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum"))


def eval_noise(cfg: ModelConfig, x: torch.Tensor, seed: int) -> torch.Tensor:
    """The fixed start noise for evaluation windows x (n, t): same seed, same noise, any device."""
    return start_noise(cfg, (*x.shape, cfg.d_model), torch.Generator().manual_seed(seed))


@torch.no_grad()
def from_noise_ce(
    blocks: list[DenoisingBlock],
    emb: ByteEmbedding,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: ModelConfig,
    steps: int | None = None,
    seed: int = 1234,
    batch_size: int = 64,
    draws: int = 1,
    device: str = "cpu",
) -> dict:
    """From-noise CE over windows (x, y); also the CE after every sampler step (`trace`).

    draws > 1 averages the final probabilities over that many noise draws (`ce_mixture`).
    """
    for b in blocks:
        b.eval()
    table_hat = emb.normalized().to(device)
    plan = sampler_plan(cfg, steps)
    noise = [eval_noise(cfg, x, seed + k) for k in range(draws)]
    step_sums = [0.0] * len(plan)
    mix_sum = 0.0
    for lo in range(0, x.shape[0], batch_size):
        xb, yb = x[lo : lo + batch_size].to(device), y[lo : lo + batch_size].to(device)
        probs = torch.zeros(*xb.shape, cfg.vocab, device=device)
        for k in range(draws):
            _, per_step = sample_from_noise(
                blocks, table_hat, xb, cfg, steps, z0=noise[k][lo : lo + batch_size].to(device), trace=True
            )
            if k == 0:
                for i, logits in enumerate(per_step):
                    step_sums[i] += _ce_sum(logits, yb)
            probs += torch.softmax(per_step[-1].float(), dim=-1) / draws
        mix_sum += float(-probs.gather(-1, yb[..., None]).clamp_min(1e-30).log().sum())
    tokens = y.numel()
    trace = [{"step": i, "block": b, "sigma": s, "ce": step_sums[i] / tokens} for i, (b, s, _) in enumerate(plan)]
    ce = trace[-1]["ce"]
    out = {"ce": ce, "ppl": math.exp(ce), "tokens": tokens, "steps": len(plan), "seed": seed, "trace": trace}
    if draws > 1:
        out["ce_mixture"] = mix_sum / tokens
        out["draws"] = draws
    return out


@torch.no_grad()
def denoising_ce(
    block: DenoisingBlock,
    emb: ByteEmbedding,
    block_index: int,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: ModelConfig,
    seed: int = 4321,
    batch_size: int = 64,
    device: str = "cpu",
) -> float:
    """Training-style CE of one block given z = e_hat[y] + sigma eps (diagnostic; optimistic at low sigma)."""
    block.eval()
    table_hat = emb.normalized().to(device)
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for lo in range(0, x.shape[0], batch_size):
        xb, yb = x[lo : lo + batch_size].to(device), y[lo : lo + batch_size].to(device)
        sigma = sample_sigma(cfg, block_index, xb.shape[0], gen).to(device)
        z = noisy_targets(table_hat, yb, sigma, gen)
        total += _ce_sum(denoise(block, table_hat, xb, z, sigma)[0], yb)
    return total / y.numel()


@torch.no_grad()
def e2e_ce(model: E2EModel, x: torch.Tensor, y: torch.Tensor, batch_size: int = 64, device: str = "cpu") -> dict:
    model.eval()
    total = 0.0
    for lo in range(0, x.shape[0], batch_size):
        xb, yb = x[lo : lo + batch_size].to(device), y[lo : lo + batch_size].to(device)
        total += _ce_sum(model(xb), yb)
    ce = total / y.numel()
    return {"ce": ce, "ppl": math.exp(ce), "tokens": y.numel()}
