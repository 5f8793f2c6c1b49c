"""Configuration dataclasses for BlockTrain.

Owns: ModelConfig (architecture + noise schedule), TrainConfig (optimiser and batching).
Both are frozen, validated in __post_init__ with ValueError, and serialise to plain dicts
(`asdict`) so checkpoints and peers can compare them. `ModelConfig.config_hash()` is the
identity peers exchange: two models whose hashes match have interchangeable blocks.
No torch, grpc or filesystem imports here.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

HANDOFF_LOSSES = ("none", "prev_byte", "prev_skip")  # ModelConfig.handoff_loss (swarmd.core.model.handoff_ce)
BLOCK_INITS = ("fresh", "predecessor")  # TrainConfig.block_init (swarmd.core.train.warm_start)
OUT_HEADS = ("linear", "mlp")  # ModelConfig.out_head (swarmd.core.model.output_head)
PRED_IN_INITS = ("zero", "identity")  # ModelConfig.pred_in_init (swarmd.core.model.init_message_input)


@dataclass(frozen=True)
class ModelConfig:
    blocks: int = 3  # B: denoising blocks in the stack; block 0 owns the highest-noise interval
    layers_per_block: int = 2  # L_b: transformer layers inside one block
    d_model: int = 128  # width of every block and of the shared byte table
    n_heads: int = 4  # attention heads per layer
    hidden: int = 512  # FFN width (4 * d_model is the usual choice)
    seq_len: int = 128  # bytes per training window (positions the block can embed)
    sigma_lo: float = 1.0  # bottom of the global noise range (litepaper: 1 for text)
    sigma_hi: float = 10.0  # top of the global noise range (litepaper: 10)
    p_mean: float = -1.2  # lognormal prior mean of ln(sigma) (EDM)
    p_std: float = 1.2  # lognormal prior std of ln(sigma) (EDM)
    gamma: float = 0.05  # interval overlap, fraction of each interval's log-width per side
    sigma_data: float = 0.5  # EDM sigma_data used by the preconditioning
    noise_feature_scale: float = 1000.0  # c_noise is multiplied by this before sinusoidal features
    logit_scale: float = 1.0  # fixed multiplier on the logits <z_hat, e_hat_k> (1 = documented, no temperature)
    vocab: int = 256  # bytes
    # block mechanics. The defaults are the block that measured best (BENCHMARKS.md#quality);
    # DOCUMENTED below names the documented DiffusionBlocks block, still selectable field by field.
    # scaled_unit: sqrt(d) e_hat[x] (documented) | own_table: the block's own learned byte table, init N(0, 0.02^2)
    context_input: str = "own_table"
    # default (nn.Linear init, documented) | zero: W_z and its bias start at 0 (still trained unless frozen)
    z_in_init: str = "zero"
    # default (documented DiT-style MLP) | zero_init: its last linear starts at 0 | off: no tau(c_noise) term
    noise_embedding: str = "off"
    # none (documented) | feature: block reads the previous sampler step's final hidden state through a
    # d x d projection (its start: pred_in_init)
    pred_input: str = "feature"
    # none (documented) | add: z_hat = previous step's z_hat + c_out F (the skip is the predecessor's estimate,
    # not c_skip z; init_block starts F's last linear at 0 in blocks > 0)
    pred_output: str = "add"
    # none (documented) | prev_byte: each block's final feature g_t also predicts the previous context
    # byte x_{t-1} through a block-owned linear head (trained with TrainConfig.handoff_weight, never run at
    # inference): an InfoPro-style term that makes the state a block hands on keep what later blocks read.
    # prev_skip: that term plus a second head predicting the byte after the next (y_{t+1}) from g_t
    handoff_loss: str = "prev_byte"
    # linear (documented): F = W_o LN_f(h) | mlp: F = W_2 GELU(W_1 LN_f(h)), W_1 d x hidden, a deeper head that
    # spares the trunk's features from being shaped for a linear readout alone (Belilovsky et al. 2019: greedy
    # stages with deeper auxiliary heads reach end-to-end accuracy); E2E references get the same head
    out_head: str = "linear"
    # zero: the message input W_p (pred_input=feature) starts at 0, so a later block first ignores its predecessor's
    # state | identity (the default: B=3 x 2 stack 0.012 better on two seeds and two
    # slices): W_p starts at the identity, so a later block's layers start on the predecessor's (normalised)
    # residual stream, as layers L_b+1.. of one deep residual network would
    pred_in_init: str = "identity"

    # the documented block's values of the fields added after the first release. A field at this value
    # is left out of config_hash (so a documented config keeps the hash it always had), and a config
    # written before the field existed (old checkpoint, old peer's GetConfig) reads as this value.
    DOCUMENTED: ClassVar[dict[str, str]] = {
        "context_input": "scaled_unit",
        "z_in_init": "default",
        "noise_embedding": "default",
        "pred_input": "none",
        "pred_output": "none",
        "handoff_loss": "none",
        "out_head": "linear",
        "pred_in_init": "zero",
    }

    def __post_init__(self) -> None:
        for name in ("blocks", "layers_per_block", "d_model", "n_heads", "hidden", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not 0 < self.sigma_lo < self.sigma_hi:
            raise ValueError(f"need 0 < sigma_lo < sigma_hi, got [{self.sigma_lo}, {self.sigma_hi}]")
        if not 0 <= self.gamma < 1:
            raise ValueError(f"gamma must be in [0, 1), got {self.gamma}")
        if self.p_std <= 0 or self.sigma_data <= 0:
            raise ValueError("p_std and sigma_data must be > 0")
        if self.logit_scale <= 0:
            raise ValueError(f"logit_scale must be > 0, got {self.logit_scale}")
        if self.vocab != 256:
            raise ValueError("vocab is fixed at 256 (bytes)")
        if self.context_input not in ("scaled_unit", "own_table"):
            raise ValueError(f"context_input must be scaled_unit or own_table, got {self.context_input!r}")
        if self.z_in_init not in ("default", "zero"):
            raise ValueError(f"z_in_init must be default or zero, got {self.z_in_init!r}")
        if self.noise_embedding not in ("default", "zero_init", "off"):
            raise ValueError(f"noise_embedding must be default, zero_init or off, got {self.noise_embedding!r}")
        if self.pred_output not in ("none", "add"):
            raise ValueError(f"pred_output must be none or add, got {self.pred_output!r}")
        if self.handoff_loss not in HANDOFF_LOSSES:
            raise ValueError(f"handoff_loss must be one of {', '.join(HANDOFF_LOSSES)}, got {self.handoff_loss!r}")
        if self.out_head not in OUT_HEADS:
            raise ValueError(f"out_head must be one of {', '.join(OUT_HEADS)}, got {self.out_head!r}")
        if self.pred_in_init not in PRED_IN_INITS:
            raise ValueError(f"pred_in_init must be one of {', '.join(PRED_IN_INITS)}, got {self.pred_in_init!r}")
        if self.pred_input not in ("none", "feature"):
            raise ValueError(f"pred_input must be none or feature, got {self.pred_input!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def message_dim(self) -> int:
        """Width of what a sampler step hands to the next besides z (0 = z only, as documented)."""
        return self.d_model * ((self.pred_input == "feature") + (self.pred_output == "add"))

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        return cls(**(cls.DOCUMENTED | data))

    @classmethod
    def documented(cls, **overrides: Any) -> ModelConfig:
        """The documented DiffusionBlocks block (the original defaults), with `overrides`."""
        return cls(**(cls.DOCUMENTED | overrides))

    def config_hash(self) -> str:
        """Short stable hash of the architecture; peers with equal hashes can swap blocks."""
        body = {k: v for k, v in self.to_dict().items() if not (k in self.DOCUMENTED and v == self.DOCUMENTED[k])}
        blob = json.dumps(body, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 32  # sequences per optimiser step
    lr: float = 3e-3  # AdamW peak learning rate (the best of the quality and time-to-quality lr sweeps)
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at total_steps
    warmup_steps: int = 50  # linear warmup
    total_steps: int = 0  # steps per block over the whole run, for the cosine (0 = constant lr)
    weight_decay: float = 0.01  # AdamW, matrices only (no decay on norms, biases, embeddings)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # global grad-norm clip
    seed: int = 0  # data and noise seed
    trajectory_prob: float = 1.0  # chance a training batch uses the sampler's own trajectory (see README; 0 documented)
    trajectory_steps: int = 0  # sampler steps the trajectory inputs follow (0 = one per block, as at eval)
    # lognormal (documented) | loguniform (in the widened interval) | sampler (the block's sampler sigmas)
    sigma_sampling: str = "lognormal"
    sigma_jitter: float = 0.0  # with sigma_sampling=sampler: log-std of multiplicative jitter around the sampler sigma
    table_lr_scale: float = 1.0  # learning-rate multiplier for the shared byte table (it is averaged every round)
    # none | block0: block 0's noise path W_z is zeroed and never trained (under trajectory training its z is
    # pure noise) | all: every block's (z then carries nothing: a block reads its context and the message)
    freeze_z_in: str = "block0"
    # AdamW's denominator as if it saw the mean gradient of the replicas a swarm merge averages (swarmd.core.optim;
    # K = 1, a peer alone or a single process, is plain AdamW bit for bit). Off: at H=25 it gained 0.027 nats at 4
    # and 8 replicas after 200 steps but lost 0.023 at 4 after 1,600 (BENCHMARKS.md#replica_sim); it pays when
    # replicas average every step or few
    replica_adam: bool = False
    # trajectory training's frozen predecessors are refreshed this many times per round: at round start (the
    # merged states) and then every steps_per_round / predecessor_pulls steps (the predecessors' working weights
    # as they train now). 1 = at round start only: on the clock (BENCHMARKS.md#time_to_quality, B=4, 1,600 steps)
    # it beat 4 in every run measured, ending lower in less wall time (concurrent 1.5709 in 48.5 s against
    # 1.5765 in 59.0 s; grow 1.5507 against 1.5530; on the WAN 1.6257 against 1.6301, twice the participation);
    # at B=3 x 2, d=128 it is even (4 ends 0.0016 lower but 6% later: 0.0007 ahead at equal wall) with a quarter of
    # the pull bytes; at equal steps 4 had let later blocks keep what block 1 gained (BENCHMARKS.md#quality)
    predecessor_pulls: int = 1
    # the mid-round pulls run while the steps do: each is started halfway through the chunk before the one it is for
    # and run from that chunk's end, so the steps never wait on a predecessor's answer (its weights half a chunk
    # older). Off: on peers of one core each the rounds measured the same either way (the pull's work is the core's
    # own) and a concurrent swarm ended 0.009 nats worse with it (BENCHMARKS.md#time_to_quality); it can pay where
    # the steps run on a GPU and the pull beside them (not measured yet)
    prefetch_pulls: bool = False
    handoff_weight: float = 1.0  # weight of ModelConfig.handoff_loss's term relative to the CE beside it
    # pipelined schedule (swarm peers): block b trains from round b + 1 on, for as many rounds as block 0, and every
    # peer runs B - 1 rounds more to let the last block finish; with predecessor_pulls 1 each round of block b then
    # runs against its predecessors as they ended the same round of theirs, the live predecessors of one process
    pipeline: bool = False
    # ... rounds between two consecutive blocks' starts (1: block b starts b rounds late; steps_per_block / H:
    # sequential, each block trains only once the one before it ended); every peer runs (B - 1) x this more rounds
    pipeline_stagger: int = 1
    # with pipeline: progressive growth, then joint training: block b opens at round b x pipeline_stagger + 1 (its
    # growth phase) and trains from then on to the run's end, so no peer runs extra rounds (swarmd.core.schedule's
    # "grow"); without: each block trains as many rounds as block 0, the last ending (B - 1) x stagger rounds late
    grow: bool = False
    # with grow, the open-ended rule instead of the rounds (swarm peers, --block auto; swarmd.membership.opening):
    # the next block opens once the frontier's held-out CE gained less than this many nats a round for
    # open_patience rounds in a row (swarmd.core.schedule.open_after), as the signed records report it; 0 = off
    open_gain: float = 0.0
    open_patience: int = 2
    # how a later block starts when its turn comes under the pipelined schedule (pipeline; without it every block
    # trains from round 1, when there is nothing to copy): fresh (its seeded init) | predecessor (the default since
    # progressive stacking): every weight but the output layer (0) and the message input (ModelConfig.pred_in_init)
    # copied from block b - 1 as that block stands then (a daemon: its round-start merged state). With the identity
    # message input the block starts as block b - 1's layers run once more on block b - 1's own stream
    # (progressive stacking) and, its output being 0, as the identity on block b - 1's estimate
    block_init: str = "predecessor"
    # learning-rate multiplier of every block but block 0 (its schedule and its table copy's too; a later
    # block refines a converged predecessor's estimate, and the table it trains is the one block 0 reads)
    later_lr_scale: float = 1.0
    # trajectory replay: a later block's predecessor forwards serve this many steps. 1: every step runs them on its
    # whole batch (block b pays b forwards a step); R > 1: every R steps they run on that step's whole batch, and
    # the R steps train on those trajectory states, each given a fresh sigma (the final Euler step is recomputed);
    # 0: R = the block's index, so every later block pays about one forward a step
    trajectory_reuse: int = 1

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0 or self.total_steps < 0:
            raise ValueError("warmup_steps and total_steps must be >= 0")
        if not 0 <= self.trajectory_prob <= 1:
            raise ValueError(f"trajectory_prob must be in [0, 1], got {self.trajectory_prob}")
        if self.trajectory_steps < 0:
            raise ValueError(f"trajectory_steps must be >= 0, got {self.trajectory_steps}")
        if self.sigma_sampling not in ("lognormal", "loguniform", "sampler"):
            raise ValueError(f"sigma_sampling must be lognormal, loguniform or sampler, got {self.sigma_sampling!r}")
        if self.freeze_z_in not in ("none", "block0", "all"):
            raise ValueError(f"freeze_z_in must be none, block0 or all, got {self.freeze_z_in!r}")
        if self.handoff_weight < 0:
            raise ValueError(f"handoff_weight must be >= 0, got {self.handoff_weight}")
        if self.trajectory_reuse < 0:
            raise ValueError(f"trajectory_reuse must be >= 0, got {self.trajectory_reuse}")
        if self.predecessor_pulls < 1 or self.pipeline_stagger < 1:
            raise ValueError("predecessor_pulls and pipeline_stagger must be >= 1")
        if self.block_init not in BLOCK_INITS:
            raise ValueError(f"block_init must be one of {', '.join(BLOCK_INITS)}, got {self.block_init!r}")
        if not (math.isfinite(self.open_gain) and self.open_gain >= 0) or self.open_patience < 1:
            raise ValueError(f"open_gain must be >= 0, open_patience >= 1; got {self.open_gain}, {self.open_patience}")
        if self.open_gain and not (self.pipeline and self.grow):
            raise ValueError("open_gain (--open-gain) needs the grow schedule (--pipeline --grow)")
        if self.sigma_jitter < 0 or self.table_lr_scale <= 0 or self.later_lr_scale <= 0:
            raise ValueError("sigma_jitter must be >= 0, table_lr_scale and later_lr_scale > 0")

    def extra_rounds(self, blocks: int) -> int:
        """Rounds a swarm of `blocks` runs beyond the rounds each block trains: (B - 1) x pipeline_stagger when
        pipelined (the last block starts that late), else none (and none when it grows: every block ends with the
        run)."""
        return (blocks - 1) * self.pipeline_stagger if self.pipeline and not self.grow else 0

    def to_dict(self) -> dict:
        return asdict(self)
