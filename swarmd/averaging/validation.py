"""HeldOutCheck: one peer's small held-out sample and the deterministic score of a candidate state on it.

What a peer uses to judge weights that came from others (verified adoption, loss-checked merges),
whatever number of signed records or deltas backs them:
  - the sample: `sequences` windows of the peer's own text drawn with a seed of (seed, block) only, so replicas
    of one block training on the same text hold the same sample and reach the same verdicts; noise levels at
    evenly spaced quantiles of the block's sigma prior, fixed noise;
  - score(block, emb): the block's unweighted cross entropy (nats) at those sigmas on what the block trains on
    this round: with the round's predecessors given (use_predecessors, the merged states trajectory training
    pulled at round start, run with the round-start byte table), the sampler's trajectory through them (fixed
    noise) and their message, as BlockTrainer's trajectory batches; without them (block 0, trajectory training
    off, a round whose predecessors were unreachable) the documented noisy targets. Scoring a later block on
    the documented targets while it trains on the trajectory judged it on a task it no longer learns: its score
    rose as it trained, so replicas' merge checks fell back at random and split them (12 daemons: same-block
    replicas 0.11 apart after 8 rounds). Computed on scratch modules under no_grad. Same weights, same
    predecessors, same sample -> the same float, every time (CPU fp32).
The sample is drawn from the training text, not set aside from it: a handful of windows among the millions a
peer trains on, so a state cannot have fitted it; a peer with an eval file may pass its windows instead.
"""

from __future__ import annotations

import threading

import torch

from swarmd.core.config import ModelConfig
from swarmd.core.data import ByteData
from swarmd.core.model import DenoisingBlock, block_interval, denoise, noisy_targets
from swarmd.core.train import init_block, init_embedding, seed_for, trajectory_inputs, trajectory_predecessors

# windows in the held-out sample (cost: one forward of this batch per score). 16, not 4: at benchmarks/swarm.py's
# config 4 windows (256 bytes) made 1 of 48 honest merges fall back and refuse 5 honest deltas, 8-32 none; with 16
# the merge check takes ~10 ms a round: 3% of the round's local steps alone, 0.8% of swarm.py's median round
# (benchmarks/merge_check.py, benchmarks/results/merge_check.json)
HELDOUT_SEQUENCES = 16

Tensors = dict[str, torch.Tensor]


def sample_sigmas(cfg: ModelConfig, block_index: int, n: int) -> torch.Tensor:
    """n noise levels spread evenly (in log sigma) over the block's interval, interval ends excluded."""
    lo, hi = block_interval(cfg, block_index)
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    return torch.exp(
        torch.log(torch.tensor(lo, dtype=torch.float64)) * (1 - u) + torch.log(torch.tensor(hi)) * u
    ).float()


class HeldOutCheck:
    """Scores (block, embedding) state dicts of one block on a fixed held-out sample (see the module doc).

    :param x: context bytes (n, t), :param y: next bytes (n, t) of the sample
    """

    def __init__(self, cfg: ModelConfig, block_index: int, x: torch.Tensor, y: torch.Tensor, seed: int = 0):
        if x.shape != y.shape or x.dim() != 2 or x.shape[0] < 1:
            raise ValueError("the held-out sample needs x and y of one shape (n >= 1, t)")
        self.cfg, self.block_index = cfg, block_index
        self.x, self.y = x.long().cpu(), y.long().cpu()
        self.sigma = sample_sigmas(cfg, block_index, x.shape[0])
        self.noise_seed = seed_for("heldout-noise", seed, block_index)
        self._block = init_block(cfg, block_index, seed).eval()
        self._emb = init_embedding(cfg, seed).eval()
        self._lock = threading.Lock()  # one scratch model, scored from worker threads
        self._predecessors: dict[int, DenoisingBlock] = {}  # use_predecessors: frozen, fp32, CPU
        self._predecessor_table: torch.Tensor | None = None
        self.scores = 0  # how many scores were computed (what the checks cost, in forward passes)

    @classmethod
    def from_data(
        cls, data: ByteData, cfg: ModelConfig, block_index: int, seed: int = 0, sequences: int = HELDOUT_SEQUENCES
    ) -> HeldOutCheck:
        """The sample drawn from the peer's text with a seed of (seed, block): the same for every replica
        of the block on the same text."""
        x, y = next(data.stream(seed_for("heldout", seed, block_index), sequences))
        return cls(cfg, block_index, x, y, seed)

    @torch.no_grad()
    def use_predecessors(self, blocks: dict[int, Tensors] | None, table_hat: torch.Tensor | None = None) -> None:
        """Score on the sampler's trajectory through these predecessor states (what trajectory training runs this
        round), with their byte table's normalised rows `table_hat`; None (or a set lacking a block the
        trajectory needs): the documented noisy targets."""
        needed = {b for b, _ in trajectory_predecessors(self.cfg, self.block_index)}
        given = blocks or {}
        usable = bool(needed) and needed <= set(given) and table_hat is not None
        frozen: dict[int, DenoisingBlock] = {}
        for b in sorted(needed) if usable else []:
            frozen[b] = DenoisingBlock(self.cfg).eval().requires_grad_(False)
            frozen[b].load_state_dict({k: v.detach().float().cpu() for k, v in given[b].items()})
        with self._lock:
            self._predecessors = frozen
            self._predecessor_table = (
                table_hat.detach().float().cpu().clone() if frozen and table_hat is not None else None
            )

    @torch.no_grad()
    def score(self, block: Tensors, emb: Tensors) -> float:
        """Unweighted CE (nats) of `block` with byte table `emb` on the sample; inf for weights that do not load or
        give a non-finite loss (a hostile state scores worst)."""
        with self._lock:
            try:
                self._block.load_state_dict({k: v.float() for k, v in block.items()})
                self._emb.load_state_dict({k: v.float() for k, v in emb.items()})
            except (RuntimeError, KeyError):
                return float("inf")
            self.scores += 1
            table_hat = self._emb.normalized()
            gen = torch.Generator().manual_seed(self.noise_seed)
            message = None
            if self._predecessors and self._predecessor_table is not None:  # the round's trajectory (module doc)
                blocks = {**self._predecessors, self.block_index: self._block}
                args = (self._predecessor_table, self.x, self.sigma, self.cfg, self.block_index, gen)
                z, message = trajectory_inputs(blocks, *args)
            else:
                z = noisy_targets(table_hat, self.y, self.sigma, gen)
            logits = denoise(self._block, table_hat, self.x, z, self.sigma, pred=message)[0]
            ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), self.y.flatten())
        value = float(ce)
        return value if value == value and value != float("inf") else float("inf")
