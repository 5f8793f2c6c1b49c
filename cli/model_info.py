"""`blocktrain model-info`: parameter counts and AdamW memory of a block worker vs the whole stack."""

from __future__ import annotations

import typer

from cli import options as o
from cli.common import cli_errors, print_json
from cli.options import MODEL


def info(
    ctx: typer.Context,
    blocks: o.Blocks = MODEL.blocks,
    layers_per_block: o.LayersPerBlock = MODEL.layers_per_block,
    d_model: o.DModel = MODEL.d_model,
    n_heads: o.NHeads = MODEL.n_heads,
    hidden: o.Hidden = None,
    seq_len: o.SeqLen = MODEL.seq_len,
    json_out: o.Json = False,
) -> None:
    """Print parameter counts and AdamW bytes (params + grads + 2 moments, fp32)."""
    with cli_errors():
        from swarmd.core.memory import GIB, model_info

        cfg = o.model_config(ctx.params)
        result = model_info(cfg)
        if json_out:
            print_json(result)
            return
        typer.echo(
            f"config  B={cfg.blocks} L_b={cfg.layers_per_block} d={cfg.d_model} hidden={cfg.hidden} seq={cfg.seq_len}  "
            f"hash {result['config_hash']}"
        )
        typer.echo(f"block params            {result['block_params']:>14,}")
        typer.echo(f"byte table params       {result['embedding_params']:>14,}")
        typer.echo(
            f"active worker AdamW     {result['active_adamw_bytes'] / GIB:>14.4f} GiB  "
            f"({result['active_trainable_params']:,} trainable params)"
        )
        typer.echo(
            f"whole stack AdamW       {result['full_stack_adamw_bytes'] / GIB:>14.4f} GiB  "
            f"({result['stack_params']:,} params)"
        )
        typer.echo(f"active / stack          {result['active_fraction']:>14.3f}")
