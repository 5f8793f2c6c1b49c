"""Held-out metrics: from-noise CE (the model's real score), per-step trace, denoising CE, E2E CE, depth.

Owns the evaluation protocol of diffusionblocks.md section 8: the sampler runs from a fixed noise
seed over consecutive held-out windows with the true context; CE is the mean over every scored
byte of -ln p(y), in nats. Denoising CE is a diagnostic only. The depth instrument:
depth_trace (the CE of the stack cut after every block and the KL between consecutive blocks'
predictions, in one sampler sweep) and depth_recovery. No networking, no filesystem.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F

from swarmd.core.config import ModelConfig
from swarmd.core.model import (
    ByteEmbedding,
    DenoisingBlock,
    denoise,
    noisy_targets,
    sample_from_noise,
    sample_sigma,
    sampler_plan,
    start_noise,
)
from swarmd.core.reference import E2EModel


def _ce_sum(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float(F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum"))


def eval_noise(cfg: ModelConfig, x: torch.Tensor, seed: int) -> torch.Tensor:
    """The fixed start noise for evaluation windows x (n, t): same seed, same noise, any device."""
    return start_noise(cfg, (*x.shape, cfg.d_model), torch.Generator().manual_seed(seed))


def _sweep(
    blocks: list[DenoisingBlock],
    emb: ByteEmbedding,
    xy: tuple[torch.Tensor, torch.Tensor],
    cfg: ModelConfig,
    steps: int | None,
    seeds: range,
    batch_size: int,
    device: str,
) -> Iterator[tuple[torch.Tensor, Iterator[list[torch.Tensor]]]]:
    """The from-noise sampler sweep the CE functions score: the blocks in eval mode, then per batch of windows (x, y)
    its targets and, for each seed in turn, the logits after every sampler step from that seed's fixed start noise
    (eval_noise). Consume each batch's draws before the next batch (they are sampled on demand, in seed order)."""
    for b in blocks:
        b.eval()
    table_hat = emb.normalized().to(device)
    x, y = xy
    noise = [eval_noise(cfg, x, seed) for seed in seeds]
    for lo in range(0, x.shape[0], batch_size):
        xb, yb = x[lo : lo + batch_size].to(device), y[lo : lo + batch_size].to(device)
        z0 = [n[lo : lo + batch_size].to(device) for n in noise]
        yield yb, (sample_from_noise(blocks, table_hat, xb, cfg, steps, z0=z, trace=True)[1] for z in z0)


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
    plan = sampler_plan(cfg, steps)
    step_sums = [0.0] * len(plan)
    mix_sum = 0.0
    for yb, per_draw in _sweep(blocks, emb, (x, y), cfg, steps, range(seed, seed + draws), batch_size, device):
        probs = torch.zeros(*yb.shape, cfg.vocab, device=device)
        for k, per_step in enumerate(per_draw):
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


def _kl_sum(logits: torch.Tensor, prev: torch.Tensor) -> float:
    """Sum over positions of KL(softmax(logits) || softmax(prev)) in nats, computed in float64 (>= 0 up to rounding)."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    logq = torch.log_softmax(prev.double(), dim=-1)
    return float((logp.exp() * (logp - logq)).sum(-1).clamp_min(0.0).sum())


@torch.no_grad()
def depth_trace(
    blocks: list[DenoisingBlock],
    emb: ByteEmbedding,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: ModelConfig,
    steps: int | None = None,
    seed: int = 1234,
    batch_size: int = 64,
    device: str = "cpu",
) -> dict:
    """The depth instrument: in one sampler sweep, the CE after every step and the KL between consecutive steps.

    The sweep is from_noise_ce's (same schedule, same fixed noise, same batches, one draw), so `ce` and every
    trace CE equal from_noise_ce's exactly. trace[i]: step i's block, sigma, CE of its logits (the stack cut
    after that step, nats/byte) and `kl` = KL(p_i || p_{i-1}) of the predicted next-byte distributions, averaged
    over scored positions (nats/byte; None at step 0). `blocks`: one row per block that runs, at its last step
    (with one step per block, the default, the same rows as trace): `ce` is the stack cut after block b and
    `kl` = KL(p_b || p_{b-1}) between block b's and block b-1's predictions. trace[0] is block 0 alone.
    """
    plan = sampler_plan(cfg, steps)
    last = {b: i for i, (b, _, _) in enumerate(plan)}  # block -> its last step
    order = sorted(last, key=last.__getitem__)
    # the step pairs whose KL is wanted: consecutive steps, and consecutive blocks' last steps (the same pairs
    # with one step per block)
    pairs = {(i, i - 1) for i in range(1, len(plan))} | {(last[b], last[a]) for a, b in pairwise(order)}
    ce_sums = [0.0] * len(plan)
    kl_sums = dict.fromkeys(pairs, 0.0)
    for yb, per_draw in _sweep(blocks, emb, (x, y), cfg, steps, range(seed, seed + 1), batch_size, device):
        per_step = next(per_draw)
        for i, logits in enumerate(per_step):
            ce_sums[i] += _ce_sum(logits, yb)
        for i, k in pairs:
            kl_sums[(i, k)] += _kl_sum(per_step[i], per_step[k])
    tokens = y.numel()
    trace: list[dict[str, Any]] = [
        {
            "step": i,
            "block": b,
            "sigma": s,
            "ce": ce_sums[i] / tokens,
            "kl": kl_sums[(i, i - 1)] / tokens if i else None,
        }
        for i, (b, s, _) in enumerate(plan)
    ]
    rows = [
        {
            "block": b,
            "step": last[b],
            "ce": ce_sums[last[b]] / tokens,
            "kl": kl_sums[(last[b], last[order[j - 1]])] / tokens if j else None,
        }
        for j, b in enumerate(order)
    ]
    ce = ce_sums[-1] / tokens
    return {
        "ce": ce,
        "ppl": math.exp(ce),
        "tokens": tokens,
        "steps": len(plan),
        "seed": seed,
        "trace": trace,
        "blocks": rows,
    }


def depth_recovery(
    block0_alone: float | None, stack: float | None, plain: float | None, e2e: float | None, eps: float = 1e-3
) -> dict:
    """(block 0 alone - stack) / (plain L_b-layer model - E2E): the share of what depth is worth end to end that the
    later blocks recover (1 = all of it, 0 = none, < 0 = they hurt). CEs in nats/byte.

    Returns {"depth_recovery": the ratio or None, "gained": block0_alone - stack, "available": plain - e2e (each
    None only when one of its own CEs is missing), "reason": None, or why there is no ratio: a CE is missing, or
    the denominator is not above eps (depth is worth nothing, or less than nothing, to the end-to-end model at
    this budget)}.
    """
    named = {"block0_alone": block0_alone, "stack": stack, "plain": plain, "e2e": e2e}
    if block0_alone is None or stack is None or plain is None or e2e is None:
        missing = ", ".join(n for n, v in named.items() if v is None)
        return {
            "depth_recovery": None,
            "gained": None if block0_alone is None or stack is None else block0_alone - stack,
            "available": None if plain is None or e2e is None else plain - e2e,
            "reason": f"missing CE: {missing}",
        }
    gained, available = block0_alone - stack, plain - e2e
    out: dict[str, Any] = {"depth_recovery": None, "gained": gained, "available": available, "reason": None}
    if available <= eps:
        out["reason"] = (
            f"plain - e2e = {available:.4g} nats/byte is not above {eps:g}: depth buys the end-to-end model "
            "nothing at this budget, so there is nothing to recover"
        )
    else:
        out["depth_recovery"] = gained / available
    return out
