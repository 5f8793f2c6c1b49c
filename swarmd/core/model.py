"""The BlockTrain model: DiffusionBlocks for byte-level text, read top to bottom.

Owns the exact mechanics of ../shared/docs/diffusionblocks.md:
  1. the lognormal equal-mass sigma partition with gamma widening and truncated-lognormal sampling;
  2. EDM preconditioning (c_skip, c_out, c_in, c_noise) and the loss weight w(sigma);
  3. the shared, row-normalised byte table (ByteEmbedding);
  4. the causal transformer denoising block (DenoisingBlock) with an optional KV cache;
  5. the per-block weighted cross-entropy objective (block_loss);
  6. the Euler sampler (euler_step, sample_from_noise) that composes blocks at inference;
The end-to-end reference transformer (E2EModel) is swarmd.core.reference. A worker needs only one
DenoisingBlock plus the ByteEmbedding; blocks trained in different
processes compose because they share nothing but the byte table and the noise schedule.
No grpc, hivemind or filesystem imports here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from swarmd.core.config import ModelConfig

# ---------------------------------------------------------------------------------------------
# 1. Noise schedule: lognormal prior on sigma, equal-mass partition, gamma widening, sampling.
# ---------------------------------------------------------------------------------------------
_NORMAL = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))


def prior_cdf(cfg: ModelConfig, sigma: float) -> float:
    """u(sigma) = Phi((ln sigma - P_mean) / P_std)."""
    return float(_NORMAL.cdf(torch.tensor((math.log(sigma) - cfg.p_mean) / cfg.p_std, dtype=torch.float64)))


def prior_icdf(cfg: ModelConfig, u: torch.Tensor | float) -> torch.Tensor:
    """sigma = exp(P_mean + P_std * Phi^-1(u)), in float64."""
    u = torch.as_tensor(u, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    return torch.exp(cfg.p_mean + cfg.p_std * _NORMAL.icdf(u))


def partition_boundaries(cfg: ModelConfig) -> list[float]:
    """Equal prior-mass cut points s_0 = sigma_lo < ... < s_B = sigma_hi (ascending)."""
    u_lo, u_hi = prior_cdf(cfg, cfg.sigma_lo), prior_cdf(cfg, cfg.sigma_hi)
    inner = [float(prior_icdf(cfg, u_lo + i / cfg.blocks * (u_hi - u_lo))) for i in range(1, cfg.blocks)]
    return [cfg.sigma_lo, *inner, cfg.sigma_hi]


def block_interval(cfg: ModelConfig, block_index: int) -> tuple[float, float]:
    """Gamma-widened sigma interval of a block (block 0 = highest noise), clipped to the range."""
    if not 0 <= block_index < cfg.blocks:
        raise ValueError(f"block_index {block_index} outside [0, {cfg.blocks})")
    s = partition_boundaries(cfg)
    j = cfg.blocks - 1 - block_index
    lo, hi = math.log(s[j]), math.log(s[j + 1])
    width = hi - lo
    return max(math.exp(lo - cfg.gamma * width), cfg.sigma_lo), min(math.exp(hi + cfg.gamma * width), cfg.sigma_hi)


def sample_sigma(cfg: ModelConfig, block_index: int, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """n draws from the truncated lognormal prior on the block's widened interval (float32)."""
    lo, hi = block_interval(cfg, block_index)
    u_lo, u_hi = prior_cdf(cfg, lo), prior_cdf(cfg, hi)
    a = u_lo + (u_hi - u_lo) * torch.rand(n, generator=generator, dtype=torch.float64)
    return prior_icdf(cfg, a).clamp(lo, hi).float()


def block_for_sigma(cfg: ModelConfig, sigma: float) -> int:
    """Which block denoises at this sigma: right-closed bucket j over ascending s, b = B-1-j, clamped."""
    s = partition_boundaries(cfg)
    j = 0
    while j < cfg.blocks - 1 and sigma > s[j + 1]:
        j += 1
    return cfg.blocks - 1 - j


def sampler_schedule(cfg: ModelConfig, steps: int | None = None) -> list[float]:
    """Descending sigmas equally spaced in prior CDF over [sigma_lo, sigma_hi]; default one per block."""
    n = steps or cfg.blocks
    if n < 1:
        raise ValueError("the sampler needs at least one step")
    if n == 1:
        return [cfg.sigma_hi]
    u_lo, u_hi = prior_cdf(cfg, cfg.sigma_lo), prior_cdf(cfg, cfg.sigma_hi)
    sig = [float(prior_icdf(cfg, u_hi - i / (n - 1) * (u_hi - u_lo))) for i in range(n)]
    sig[0], sig[-1] = cfg.sigma_hi, cfg.sigma_lo  # exact end points
    return sig


# ---------------------------------------------------------------------------------------------
# 2. EDM preconditioning and loss weight.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Precond:
    c_skip: torch.Tensor
    c_out: torch.Tensor
    c_in: torch.Tensor
    c_noise: torch.Tensor
    weight: torch.Tensor


def precondition(sigma: torch.Tensor, sigma_data: float = 0.5) -> Precond:
    """EDM coefficients for a tensor of sigmas (any shape, float32)."""
    sigma = sigma.float()
    sd2 = sigma_data**2
    denom = sigma**2 + sd2
    return Precond(
        c_skip=sd2 / denom,
        c_out=sigma * sigma_data / denom.sqrt(),
        c_in=1.0 / denom.sqrt(),
        c_noise=0.25 * sigma.log(),
        weight=denom / (sigma * sigma_data) ** 2,
    )


# ---------------------------------------------------------------------------------------------
# 3. Shared byte table.
# ---------------------------------------------------------------------------------------------
class ByteEmbedding(nn.Module):
    """Learned byte table E (V x d); blocks read its row-normalised form E_hat."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.table = nn.Parameter(torch.randn(cfg.vocab, cfg.d_model) * 0.02)

    def normalized(self) -> torch.Tensor:
        return F.normalize(self.table.float(), dim=-1)


# ---------------------------------------------------------------------------------------------
# 4. Transformer pieces and the denoising block.
# ---------------------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, h: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        n, t, d = h.shape
        q, k, v = self.qkv(h).split(d, dim=-1)
        q, k, v = (x.view(n, t, self.n_heads, d // self.n_heads).transpose(1, 2) for x in (q, k, v))  # (n, nh, t, hs)
        past = 0
        if cache is not None:
            if "k" in cache:
                past = cache["k"].shape[2]
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        if past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # new queries sit at positions past..past+t-1 and may see every key up to their own
            mask = torch.ones(t, past + t, dtype=torch.bool, device=h.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(n, t, d))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(d_model, hidden)
        self.down = nn.Linear(hidden, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(h)))


class Layer(nn.Module):
    """Pre-LN causal transformer layer: 4d^2 attention + 2*d*hidden FFN (the litepaper's count)."""

    def __init__(self, d_model: int, n_heads: int, hidden: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d_model), CausalSelfAttention(d_model, n_heads)
        self.ln2, self.ffn = nn.LayerNorm(d_model), FeedForward(d_model, hidden)

    def forward(self, h: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        h = h + self.attn(self.ln1(h), cache)
        return h + self.ffn(self.ln2(h))


class NoiseEmbedding(nn.Module):
    """DiT-style: 256 sinusoidal features of (scale * c_noise), then linear-SiLU-linear to d."""

    def __init__(self, d_model: int, scale: float, n_freq: int = 256):
        super().__init__()
        half = n_freq // 2
        self.freqs: torch.Tensor
        self.register_buffer("freqs", torch.exp(-math.log(10_000.0) * torch.arange(half) / half), persistent=False)
        self.scale = scale
        self.mlp = nn.Sequential(nn.Linear(n_freq, d_model), nn.SiLU(), nn.Linear(d_model, d_model))

    def forward(self, c_noise: torch.Tensor) -> torch.Tensor:  # (n,) -> (n, d)
        arg = (self.scale * c_noise.float())[:, None] * self.freqs[None, :]
        return self.mlp(torch.cat([arg.cos(), arg.sin()], dim=-1))


def output_head(cfg: ModelConfig) -> nn.Module:
    """ModelConfig.out_head: d -> d, nn.Linear (linear) or Linear(d, hidden), GELU, Linear(hidden, d) (mlp)."""
    d = cfg.d_model
    if cfg.out_head == "mlp":
        return nn.Sequential(nn.Linear(d, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, d))
    return nn.Linear(d, d)


def last_linear(head: nn.Module) -> nn.Linear:
    """The final nn.Linear of an output_head (the one a later block starts at 0)."""
    return cast(nn.Linear, head[-1] if isinstance(head, nn.Sequential) else head)


def init_message_input(pred_in: nn.Linear, cfg: ModelConfig) -> None:
    """ModelConfig.pred_in_init: the message input W_p (bias 0) at 0 (zero) or at the identity (identity), in place."""
    with torch.no_grad():
        pred_in.bias.zero_()
        if cfg.pred_in_init == "identity":
            pred_in.weight.copy_(torch.eye(cfg.d_model))
        else:
            pred_in.weight.zero_()


class DenoisingBlock(nn.Module):
    """F_theta_b: h0_t = sqrt(d) e_hat[x_t] + W_z (c_in z_t) + p_t + tau(c_noise); L_b layers; LN; linear.

    The block's options (ModelConfig; pred_output=add is applied in denoise): context_input=own_table
    replaces sqrt(d) e_hat[x_t] by the block's own table row C[x_t]; z_in_init=zero starts W_z at 0;
    noise_embedding=zero_init starts tau's last linear at 0, =off drops tau (its weights stay, unused);
    pred_input=feature adds W_p g_t, where g_t is the previous sampler step's LN_f(h_t) (W_p at 0 or at the
    identity: pred_in_init; g = 0 at the first step).

    Everything in here is owned (trained, averaged) by one block; only the byte table is shared.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.cfg = cfg
        self.z_in = nn.Linear(d, d)
        self.noise_emb = NoiseEmbedding(d, cfg.noise_feature_scale)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, d) * 0.02)
        self.layers = nn.ModuleList(Layer(d, cfg.n_heads, cfg.hidden) for _ in range(cfg.layers_per_block))
        self.ln_f = nn.LayerNorm(d)
        self.out = output_head(cfg)  # unbounded, so c_out * F can reach the norm sharp logits need
        # the block's options (created after the documented modules, so a default config draws the same init)
        if cfg.z_in_init == "zero":
            nn.init.zeros_(self.z_in.weight)
            nn.init.zeros_(self.z_in.bias)
        if cfg.noise_embedding == "zero_init":
            last = cast(nn.Linear, self.noise_emb.mlp[2])
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)
        if cfg.context_input == "own_table":  # the block's own context table, at the plain model's scale
            self.ctx_table = nn.Parameter(torch.randn(cfg.vocab, d) * 0.02)
        if cfg.pred_input == "feature":  # the previous sampler step's final hidden state (ModelConfig.pred_in_init)
            self.pred_in = nn.Linear(d, d)
            init_message_input(self.pred_in, cfg)
        if cfg.handoff_loss != "none":  # training only: g_t -> logits of x_{t-1} (handoff_ce)
            self.handoff_head = nn.Linear(d, cfg.vocab)
        if cfg.handoff_loss == "prev_skip":  # ... and g_t -> logits of y_{t+1}, the byte after the next
            self.skip_head = nn.Linear(d, cfg.vocab)

    def context(self, x: torch.Tensor, table_hat: torch.Tensor) -> torch.Tensor:
        """Context input of bytes x (n, t): sqrt(d) e_hat[x] (documented) or the block's own table rows."""
        if self.cfg.context_input == "own_table":
            return self.ctx_table[x]
        return math.sqrt(self.cfg.d_model) * table_hat[x]

    def forward(
        self, ctx: torch.Tensor, z_in: torch.Tensor, c_noise: torch.Tensor, cache: list | None = None
    ) -> torch.Tensor:
        """F (n, t, d) of the documented block (no message from a predecessor); see features()."""
        return self.features(ctx, z_in, c_noise, cache)[0]

    def features(
        self,
        ctx: torch.Tensor,
        z_in: torch.Tensor,
        c_noise: torch.Tensor,
        cache: list | None = None,
        pred: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(F, feature LN_f(h)), each (n, t, d).

        ctx: context input (n, t, d), see context(); z_in: c_in * z (n, t, d); c_noise: (n,).
        pred (pred_input=feature only): the previous sampler step's feature (n, t, d), None = zeros
        (the first step).
        """
        start = cache[0]["k"].shape[2] if cache and "k" in cache[0] else 0
        t = ctx.shape[1]
        if start + t > self.cfg.seq_len:
            raise ValueError(f"sequence of {start + t} positions exceeds seq_len {self.cfg.seq_len}")
        h = ctx + self.z_in(z_in) + self.pos[start : start + t]
        if self.cfg.noise_embedding != "off":
            h = h + self.noise_emb(c_noise)[:, None, :]
        if pred is not None and self.cfg.pred_input == "feature":
            h = h + self.pred_in(pred.to(h.dtype))
        for i, layer in enumerate(self.layers):
            h = layer(h, cache[i] if cache is not None else None)
        feature = self.ln_f(h)
        return self.out(feature), feature

    def new_cache(self) -> list[dict]:
        """Empty per-layer KV cache for incremental (byte-by-byte) evaluation."""
        return [{} for _ in self.layers]


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------------------------------------
# 5. Denoiser output, logits and the block-local objective.
# ---------------------------------------------------------------------------------------------
def denoise(
    block: DenoisingBlock,
    table_hat: torch.Tensor,
    x: torch.Tensor,
    z: torch.Tensor,
    sigma: torch.Tensor,
    cache: list | None = None,
    autocast_dtype: torch.dtype | None = None,
    pred: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(logits (n, t, V) of D = c_skip z + c_out F(x, c_in z, c_noise) against the normalised table, message,
    the step's final feature LN_f(h) (n, t, d); the feature is what handoff_ce reads).

    x: context bytes (n, t) long; z: noisy target embeddings (n, t, d) fp32; sigma: (n,) per sequence.
    Block math may run under bf16 autocast; preconditioning, logits and everything after stay fp32.
    pred and the returned message: what one sampler step hands the next besides z (cfg.message_dim
    wide, fp32; None when message_dim is 0, and pred None at the first step): [LN_f(h) if
    pred_input=feature, z_hat if pred_output=add].
    """
    cfg = block.cfg
    d = cfg.d_model
    pc = precondition(sigma, cfg.sigma_data)
    ctx = block.context(x, table_hat)
    feat_prev = pred[..., :d] if pred is not None and cfg.pred_input == "feature" else None
    with torch.autocast(z.device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        f, feature = block.features(ctx, pc.c_in[:, None, None] * z, pc.c_noise, cache, pred=feat_prev)
    if pred is not None and cfg.pred_output == "add":
        z_hat = pred[..., -d:] + pc.c_out[:, None, None] * f.float()
    else:
        z_hat = pc.c_skip[:, None, None] * z + pc.c_out[:, None, None] * f.float()
    logits = z_hat @ table_hat.T
    logits = logits if cfg.logit_scale == 1.0 else cfg.logit_scale * logits
    parts = ([feature.float()] if cfg.pred_input == "feature" else []) + ([z_hat] if cfg.pred_output == "add" else [])
    return logits, (torch.cat(parts, dim=-1) if parts else None), feature


def handoff_ce(owner: nn.Module, feature: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """ModelConfig.handoff_loss of a block or reference model `owner` (its handoff_head, and skip_head for
    prev_skip): mean CE of predicting x_{t-1} from the feature at t (positions 1..t-1 of each window; the first has
    no previous byte in the window); prev_skip adds the mean CE of predicting y_{t+1}, the byte after the next, from
    the feature at t (positions 0..t-2)."""
    logits = cast(nn.Module, owner.handoff_head)(feature[:, 1:].float())
    ce = F.cross_entropy(logits.flatten(0, 1), x[:, :-1].flatten())
    if hasattr(owner, "skip_head"):
        skip = cast(nn.Module, owner.skip_head)(feature[:, :-1].float())
        ce = ce + F.cross_entropy(skip.flatten(0, 1), y[:, 1:].flatten())
    return ce


def noisy_targets(
    table_hat: torch.Tensor, y: torch.Tensor, sigma: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """z = e_hat[y] + sigma * eps, one sigma per sequence."""
    target = table_hat[y]
    eps = torch.randn(target.shape, generator=generator, device=generator.device if generator else target.device)
    eps = eps.to(target.device)
    return target + sigma[:, None, None] * eps


def block_loss(
    block: DenoisingBlock,
    emb: ByteEmbedding,
    x: torch.Tensor,
    y: torch.Tensor,
    sigma: torch.Tensor,
    z: torch.Tensor | None = None,
    autocast_dtype: torch.dtype | None = None,
    pred: torch.Tensor | None = None,
    handoff_weight: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted loss to minimise, unweighted CE for logging) of one block at per-sequence sigmas.

    z defaults to the documented noisy target e_hat[y] + sigma * eps (eps from `generator`, else torch's global
    generator); a caller may pass another
    input at the same sigmas (for example a point on the sampler's own trajectory). pred: the
    predecessor's feature for pred_input=feature (computed without gradient by the caller). With
    handoff_loss=prev_byte (or prev_skip) the loss adds handoff_weight x mean w(sigma) x handoff_ce of the block's
    final feature (the term weighted as the CE is, so handoff_weight means what it means for the E2E reference's
    unweighted CE).
    """
    table_hat = emb.normalized()
    if z is None:
        z = noisy_targets(table_hat, y, sigma, generator)
    logits, _, feature = denoise(block, table_hat, x, z, sigma, autocast_dtype=autocast_dtype, pred=pred)
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    w = precondition(sigma, block.cfg.sigma_data).weight
    loss = (w[:, None] * ce).mean()
    if block.cfg.handoff_loss != "none" and x.shape[1] > 1:  # weighted as the CE is (w(sigma) ~ 4-5 here)
        loss = loss + handoff_weight * w.mean() * handoff_ce(block, feature, x, y)
    return loss, ce.mean().detach()


# ---------------------------------------------------------------------------------------------
# 6. Euler sampler: one step per block by default; final logits at sigma_lo.
# ---------------------------------------------------------------------------------------------
def start_noise(
    cfg: ModelConfig,
    shape: tuple[int, ...],
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """z_0 = sqrt(1 + sigma_hi^2) * eps, drawn on the CPU from the generator (device-independent)."""
    return (math.sqrt(1.0 + cfg.sigma_hi**2) * torch.randn(shape, generator=generator)).to(device)


def euler_update(
    z: torch.Tensor, logits: torch.Tensor, table_hat: torch.Tensor, sigma: float, sigma_next: float | torch.Tensor
) -> torch.Tensor:
    """z <- (s'/s) z + (1 - s'/s) D with D = softmax(logits) @ E_hat; s' a float or one per sequence (n,)."""
    d = torch.softmax(logits, dim=-1) @ table_hat
    r = sigma_next / sigma if isinstance(sigma_next, float) else (sigma_next / sigma)[:, None, None]
    return r * z + (1.0 - r) * d


def euler_step(
    block: DenoisingBlock,
    table_hat: torch.Tensor,
    x: torch.Tensor,
    z: torch.Tensor,
    sigma: float,
    sigma_next: float | None,
    cache: list | None = None,
    autocast_dtype: torch.dtype | None = None,
    pred: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One sampler step of one block: (logits, next z, message). With sigma_next None, next z is z.

    The message is what this step hands the next one besides z (see denoise; None when the config
    passes none); pred is the one this step received (None at the first step).
    """
    s = torch.full((x.shape[0],), sigma, device=z.device)
    logits, message, _ = denoise(block, table_hat, x, z, s, cache, autocast_dtype, pred=pred)
    z_next = z if sigma_next is None else euler_update(z, logits, table_hat, sigma, sigma_next)
    return logits, z_next, message


@torch.no_grad()
def sample_from_noise(
    blocks: list[DenoisingBlock],
    table_hat: torch.Tensor,
    x: torch.Tensor,
    cfg: ModelConfig,
    steps: int | None = None,
    generator: torch.Generator | None = None,
    z0: torch.Tensor | None = None,
    trace: bool = False,
    autocast_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Run the sampler over context x (n, t); returns (final logits, per-step logits if trace)."""
    sigmas = sampler_schedule(cfg, steps)
    z = z0 if z0 is not None else start_noise(cfg, (*x.shape, cfg.d_model), generator, x.device)
    per_step: list[torch.Tensor] = []
    logits, message = torch.empty(0), None  # the schedule has at least one step
    for i, sigma in enumerate(sigmas):
        nxt = sigmas[i + 1] if i + 1 < len(sigmas) else None
        block = blocks[block_for_sigma(cfg, sigma)]
        logits, z, message = euler_step(block, table_hat, x, z, sigma, nxt, autocast_dtype=autocast_dtype, pred=message)
        if trace:
            per_step.append(logits)
    return logits, per_step


def sampler_plan(cfg: ModelConfig, steps: int | None = None) -> list[tuple[int, float, float | None]]:
    """(block_index, sigma, sigma_next or None) for every sampler step, in order."""
    sigmas = sampler_schedule(cfg, steps)
    return [(block_for_sigma(cfg, s), s, sigmas[i + 1] if i + 1 < len(sigmas) else None) for i, s in enumerate(sigmas)]
