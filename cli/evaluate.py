"""`blocktrain eval`: from-noise CE and perplexity of a checkpoint on held-out text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli import flags as f
from cli.bounds import AT_LEAST_1, SEED
from cli.common import check_device, cli_errors, print_json, resolve_data
from swarmd.errors import ConfigError


def evaluate(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="Checkpoint directory.")],
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Held-out text (default: $BLOCKTRAIN_DATA's eval.txt, else the held-out tail of a $BLOCKTRAIN_DATA "
            "file, else the WikiText-2 cache's, else the stdlib corpus's held-out split).",
        ),
    ] = None,
    eval_tokens: f.EvalTokens = 65536,
    steps: f.Steps = None,
    draws: Annotated[
        int,
        f.flag("--draws", "Noise draws; >1 also reports the CE of their averaged probabilities.", bounds=AT_LEAST_1),
    ] = 1,
    seed: Annotated[int, f.flag("--seed", "Noise seed of the sampler.", bounds=SEED)] = 1234,
    trace: Annotated[bool, typer.Option("--trace", help="Report the CE after every sampler step.")] = False,
    device: f.DeviceOpt = f.Device.cpu,
    json_out: f.Json = False,
) -> None:
    """Print from-noise CE (nats per byte) and perplexity."""
    with cli_errors():
        dev = check_device(device)
        if eval_tokens < 1 or draws < 1 or (steps is not None and steps < 1):
            raise ConfigError("--eval-tokens, --draws and --steps must be >= 1")
        from swarmd.core.checkpoint import load_e2e, load_model, read_config
        from swarmd.core.data import ByteData
        from swarmd.core.evaluate import e2e_ce, from_noise_ce

        body = read_config(checkpoint)
        cfg = body["model_config"]
        x, y = ByteData.from_path(resolve_data(data, "eval"), cfg.seq_len).eval_windows(eval_tokens)
        if body["kind"] == "e2e":
            result = e2e_ce(load_e2e(checkpoint, dev), x, y, device=dev)
        else:
            _, blocks, emb, _ = load_model(checkpoint, dev)
            result = from_noise_ce(blocks, emb, x, y, cfg, steps=steps, seed=seed, draws=draws, device=dev)
            if not trace:
                result.pop("trace")
        result["kind"] = body["kind"]
        if json_out:
            print_json(result)
            return
        typer.echo(f"ce {result['ce']:.4f} nats/byte  ppl {result['ppl']:.3f}  tokens {result['tokens']}")
        for row in result.get("trace", []):
            typer.echo(f"  step {row['step']}  block {row['block']}  sigma {row['sigma']:.4f}  ce {row['ce']:.4f}")
        if "ce_mixture" in result:
            typer.echo(f"  mixture of {result['draws']} draws: ce {result['ce_mixture']:.4f}")
