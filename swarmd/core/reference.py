"""The end-to-end reference: a plain causal byte transformer of the same width and total depth as a stack.

Owns E2EModel, the quality baseline of benchmarks/quality.py and `blocktrain train --e2e`: the layers of
swarmd.core.model (Layer), next-byte logits, and the two byte-table layouts a reference can have (E2E_LAYOUTS),
plus the training-only hand-off head when the config has ModelConfig.handoff_loss. No grpc, hivemind or
filesystem imports here.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from swarmd.core.config import ModelConfig
from swarmd.core.model import Layer, output_head

E2E_LAYOUTS = ("tied", "block")  # the reference's byte tables: one tied table, or a block's untied pair


class E2EModel(nn.Module):
    """A plain causal byte transformer of cfg.blocks x cfg.layers_per_block layers, next-byte logits.

    layout "tied" (the reference since the first release): one table embeds the input bytes and, transposed,
    scores the output. layout "block": a denoising block's table layout without its noise path, so a
    reference and a block differ only in how they are trained: an untied context table C (N(0, 0.02^2), as
    context_input=own_table), and logits out(LN_f(h)) @ E_hat^T against a row-normalised output table E
    (as the block's <z_hat, e_hat_k>, times cfg.logit_scale).
    """

    def __init__(self, cfg: ModelConfig, layout: str = "tied"):
        super().__init__()
        if layout not in E2E_LAYOUTS:
            raise ValueError(f"E2E layout must be one of {E2E_LAYOUTS}, got {layout!r}")
        d = cfg.d_model
        self.cfg, self.layout = cfg, layout
        self.tok = nn.Embedding(cfg.vocab, d)
        nn.init.normal_(self.tok.weight, std=0.02)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, d) * 0.02)
        self.layers = nn.ModuleList(Layer(d, cfg.n_heads, cfg.hidden) for _ in range(cfg.blocks * cfg.layers_per_block))
        self.ln_f = nn.LayerNorm(d)
        if layout == "block":  # created after the tied modules, so the tied layout draws the same init
            self.out = output_head(cfg)
            self.table = nn.Parameter(torch.randn(cfg.vocab, d) * 0.02)
        elif cfg.out_head != "linear":  # the tied layout's readout is the table itself; a deeper head goes before it
            self.out = output_head(cfg)
        if cfg.handoff_loss != "none":  # the blocks' training-only heads, for a reference trained alike
            self.handoff_head = nn.Linear(d, cfg.vocab)
        if cfg.handoff_loss == "prev_skip":
            self.skip_head = nn.Linear(d, cfg.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits_and_feature(x)[0]

    def logits_and_feature(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(next-byte logits, final feature LN_f(h)); the feature is what handoff_ce reads."""
        h = self.tok(x) + self.pos[: x.shape[1]]
        for layer in self.layers:
            h = layer(h)
        feature = self.ln_f(h)
        if self.layout == "tied":
            read = self.out(feature) if self.cfg.out_head != "linear" else feature
            return read.float() @ self.tok.weight.float().T, feature
        logits = self.out(feature).float() @ F.normalize(self.table.float(), dim=-1).T
        return (logits if self.cfg.logit_scale == 1.0 else self.cfg.logit_scale * logits), feature
