"""`blocktrain model-info`: parameter counts and AdamW memory of a block worker vs the whole stack."""

from __future__ import annotations

from typing import Annotated

import typer

from cli import options as o
from cli.common import cli_errors, model_config, print_json
from swarmd.core.memory import GIB, model_info


def info(
    blocks: o.Blocks = 3,
    layers_per_block: o.LayersPerBlock = 2,
    d_model: o.DModel = 128,
    n_heads: o.NHeads = 4,
    hidden: o.Hidden = None,
    seq_len: o.SeqLen = 128,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Print parameter counts and AdamW bytes (params + grads + 2 moments, fp32)."""
    with cli_errors():
        cfg = model_config(blocks, layers_per_block, d_model, n_heads, hidden, seq_len, 1.0, 10.0)
        result = model_info(cfg)
        if json_out:
            print_json(result)
            return
        typer.echo(
            f"config  B={cfg.blocks} L_b={cfg.layers_per_block} d={cfg.d_model} hidden={cfg.hidden} seq={cfg.seq_len}  hash {result['config_hash']}"
        )
        typer.echo(f"block params            {result['block_params']:>14,}")
        typer.echo(f"byte table params       {result['embedding_params']:>14,}")
        typer.echo(
            f"active worker AdamW     {result['active_adamw_bytes'] / GIB:>14.4f} GiB  ({result['active_trainable_params']:,} trainable params)"
        )
        typer.echo(
            f"whole stack AdamW       {result['full_stack_adamw_bytes'] / GIB:>14.4f} GiB  ({result['stack_params']:,} params)"
        )
        typer.echo(f"active / stack          {result['active_fraction']:>14.3f}")
