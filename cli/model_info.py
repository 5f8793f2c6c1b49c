"""`blocktrain model-info`: parameter counts and AdamW memory of a block worker vs the whole stack."""

from __future__ import annotations

import typer

from cli import flags as f
from cli import options as o
from cli.common import cli_errors, print_json
from cli.groups import with_groups


@with_groups(model=o.ModelOptions.without("sigma_lo", "sigma_hi"))
def info(model: o.ModelOptions, json_out: f.Json = False) -> None:
    """Print parameter counts and AdamW bytes (params + grads + 2 moments, fp32)."""
    with cli_errors():
        from swarmd.core.memory import GIB, model_info

        cfg = model.config()
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
