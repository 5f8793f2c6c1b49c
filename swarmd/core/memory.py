"""Parameter counts and AdamW memory accounting for a block worker versus the whole stack.

Owns the arithmetic behind `blocktrain model-info`: a worker trains one block plus the shared
byte table, keeping fp32 params, grads and two AdamW moments (16 bytes per parameter). Counts
come from instantiating the real modules on the meta device, so they never drift from model.py.
"""

from __future__ import annotations

import torch

from swarmd.core.config import ModelConfig
from swarmd.core.model import ByteEmbedding, DenoisingBlock, count_params
from swarmd.core.reference import E2EModel

ADAMW_BYTES_PER_PARAM = 16  # fp32 param + fp32 grad + fp32 exp_avg + fp32 exp_avg_sq
GIB = 1024**3


def model_info(cfg: ModelConfig) -> dict:
    with torch.device("meta"):
        block_params = count_params(DenoisingBlock(cfg))
        emb_params = count_params(ByteEmbedding(cfg))
        e2e_params = count_params(E2EModel(cfg))
    layer_params = (
        4 * cfg.d_model**2 + 4 * cfg.d_model + 2 * cfg.d_model * cfg.hidden + cfg.hidden + cfg.d_model + 4 * cfg.d_model
    )
    active = block_params + emb_params
    full = cfg.blocks * block_params + emb_params
    return {
        "config": cfg.to_dict(),
        "config_hash": cfg.config_hash(),
        "layer_params": layer_params,
        "block_params": block_params,
        "embedding_params": emb_params,
        "active_trainable_params": active,
        "stack_params": full,
        "e2e_params": e2e_params,
        "active_adamw_bytes": active * ADAMW_BYTES_PER_PARAM,
        "full_stack_adamw_bytes": full * ADAMW_BYTES_PER_PARAM,
        "e2e_adamw_bytes": e2e_params * ADAMW_BYTES_PER_PARAM,
        "active_adamw_gib": active * ADAMW_BYTES_PER_PARAM / GIB,
        "full_stack_adamw_gib": full * ADAMW_BYTES_PER_PARAM / GIB,
        "active_fraction": active / full,
    }
