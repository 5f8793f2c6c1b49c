"""`blocktrain score`: from-noise CE and perplexity of a text, through the swarm or from a checkpoint.

One sweep (one traversal of the block stack) scores a whole batch of seq_len-byte windows; the
result equals `blocktrain eval` of the same weights and noise seed. `open_sweeper` is shared with
`blocktrain generate`: --swarm builds a swarmd.serve.remote.RemoteSweeper, --checkpoint a LocalSweeper.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from cli import options as o
from cli.common import check_device, cli_errors, print_json

S = "Swarm"
Swarm = Annotated[
    list[str] | None,
    typer.Option(
        "--swarm",
        help="Multiaddr (or host:port) of a running peer; repeat for several.",
        envvar="BLOCKTRAIN_SWARM",
        rich_help_panel=S,
    ),
]
SwarmId = Annotated[
    str,
    typer.Option("--swarm-id", help="Swarm name the peers run under.", envvar="BLOCKTRAIN_SWARM_ID", rich_help_panel=S),
]
Checkpoint = Annotated[
    Path | None, typer.Option("--checkpoint", help="Run locally from this checkpoint directory instead of a swarm.")
]
TimeoutS = Annotated[
    float,
    typer.Option(
        "--timeout-s",
        help="Seconds a peer may take for one step before the client fails over to a replica.",
        rich_help_panel=S,
    ),
]
Steps = Annotated[int | None, typer.Option("--steps", help="Sampler steps (default: one per block).")]


async def open_sweeper(
    swarm: list[str] | None, swarm_id: str, checkpoint: Path | None, device: str, steps: int | None, timeout_s: float
):
    """(sweeper, async closer) for exactly one of --swarm / --checkpoint."""
    if bool(swarm) == (checkpoint is not None):
        raise ValueError("give exactly one of --swarm and --checkpoint")
    if steps is not None and steps < 1:
        raise ValueError("--steps must be >= 1")
    if checkpoint is not None:
        from swarmd.serve.inference import load_local

        sweeper = load_local(checkpoint, device, steps)

        async def nothing() -> None:
            return None

        return sweeper, nothing
    from swarmd.serve.remote import connect_swarm

    return await connect_swarm(list(swarm), swarm_id, steps=steps, timeout_s=timeout_s)


def score(
    file: Annotated[Path, typer.Argument(help="Text file to score (bytes).")],
    swarm: Swarm = None,
    checkpoint: Checkpoint = None,
    swarm_id: SwarmId = "blocktrain",
    max_bytes: Annotated[
        int | None, typer.Option("--max-bytes", help="Score at most this many bytes (whole windows).")
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", help="Noise seed of the sampler (same as `blocktrain eval --seed`).")
    ] = 1234,
    steps: Steps = None,
    timeout_s: TimeoutS = 30.0,
    device: o.DeviceOpt = "cpu",
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Print the from-noise CE (nats per byte) and perplexity of a text."""
    with cli_errors():
        dev = check_device(device)
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("--max-bytes must be >= 1")
        result = asyncio.run(_score(file, swarm, swarm_id, checkpoint, dev, steps, timeout_s, seed, max_bytes))
        if json_out:
            print_json(result)
            return
        typer.echo(
            f"ce {result['ce']:.4f} nats/byte  ppl {result['ppl']:.3f}  tokens {result['tokens']}  sweeps {result['sweeps']}  ({result['source']})"
        )


async def _score(file, swarm, swarm_id, checkpoint, device, steps, timeout_s, seed, max_bytes) -> dict:
    from swarmd.serve.inference import score_file

    sweeper, closer = await open_sweeper(swarm, swarm_id, checkpoint, device, steps, timeout_s)
    try:
        result = await score_file(sweeper, file, seed, max_bytes)
        trace = getattr(sweeper, "trace", None)
        if trace is not None:
            result["hops"] = len(trace)
            blocks = sorted({h.block_index for h in trace})
            result["hop_ms"] = {
                str(b): 1000
                * sum(h.seconds for h in trace if h.block_index == b)
                / sum(h.block_index == b for h in trace)
                for b in blocks
            }
        result["source"] = f"swarm {swarm_id}" if swarm else str(checkpoint)
        return result
    finally:
        await closer()
