"""`blocktrain generate`: continue a prompt byte by byte, through the swarm or from a checkpoint.

Free-running generation needs each new byte as context, so every byte costs one sweep of the block
stack; each block keeps per-session caches, so a sweep after the prompt processes only the new
position. Bytes are streamed to the terminal as they are produced (UTF-8, invalid bytes replaced).
Through a swarm the answers are verified (swarmd.serve.verify); stderr gets one line saying how many hops were
checked, which peers were dropped (by a majority or a tie-break by recomputation) and which blocks are unverified
(always with --stats, else when a peer is dropped or a block unverified).
"""

from __future__ import annotations

import asyncio
import codecs
import sys
from typing import Annotated

import typer

from cli import flags as f
from cli import options as o
from cli.bounds import AT_LEAST_0, AT_LEAST_1, SEED
from cli.common import check_device, cli_errors, open_sweeper
from cli.groups import with_groups
from swarmd.errors import ConfigError


@with_groups(src=o.SourceOptions)
def generate(
    prompt: Annotated[str, typer.Argument(help="Text to continue (UTF-8).")],
    src: o.SourceOptions,
    max_bytes: Annotated[int, f.flag("--max-bytes", "Bytes to generate.", bounds=AT_LEAST_1)] = 128,
    temperature: Annotated[float, f.flag("--temperature", "Softmax temperature; 0 = greedy.", bounds=AT_LEAST_0)] = 1.0,
    seed: Annotated[
        int, f.flag("--seed", "Seed of the per-position noise and byte draws (same seed, same text).", bounds=SEED)
    ] = 0,
    steps: f.Steps = None,
    stats: Annotated[
        bool, typer.Option("--stats", help="Print sweeps, bytes/s and hop latencies to stderr at the end.")
    ] = False,
) -> None:
    """Continue a prompt, streaming the bytes as they are produced."""
    with cli_errors():
        dev = check_device(src.device)
        if not prompt:
            raise ConfigError("the prompt is empty; give at least one byte")
        if max_bytes < 1 or temperature < 0:
            raise ConfigError("--max-bytes must be >= 1 and --temperature >= 0")
        asyncio.run(_generate(prompt.encode(), src, dev, steps, max_bytes, temperature, seed, stats))


async def _generate(
    prompt: bytes,
    src: o.SourceOptions,
    device: str,
    steps: int | None,
    max_bytes: int,
    temperature: float,
    seed: int,
    show_stats: bool,
) -> None:
    from swarmd.serve.inference import GenerationStats
    from swarmd.serve.inference import generate as run

    sweeper, closer = await open_sweeper(src, device, steps)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    st = GenerationStats()
    try:
        out = sys.stdout
        out.write(prompt.decode("utf-8", errors="replace"))
        out.flush()
        async for byte in run(sweeper, prompt, max_bytes, temperature, seed, st):
            out.write(decoder.decode(bytes([byte])))
            out.flush()
        out.write(decoder.decode(b"", final=True) + "\n")
        out.flush()
    finally:
        await closer()
    stats = getattr(sweeper, "stats", None)  # a swarm sweeper's verification counts (swarmd.serve.verify)
    if stats is not None and (show_stats or stats.dropped or stats.unverified_blocks or stats.apart_blocks):
        typer.echo(("" if show_stats else "warning: ") + stats.line(), err=True)
    if show_stats:
        rate = len(st.per_byte_s) / st.seconds if st.seconds else 0.0
        typer.echo(
            f"{len(st.per_byte_s)} bytes in {st.seconds:.2f} s ({rate:.1f} bytes/s), {st.sweeps} sweeps, "
            f"{st.positions} positions processed",
            err=True,
        )
        trace = getattr(sweeper, "trace", None)
        if trace:
            for b in sorted({h.block_index for h in trace}):
                hops = [h for h in trace if h.block_index == b]
                typer.echo(
                    f"  block {b}: {len(hops)} hops, mean {1000 * sum(h.seconds for h in hops) / len(hops):.1f} ms "
                    f"via {sorted({h.address for h in hops})}",
                    err=True,
                )
            if getattr(sweeper, "failovers", 0):
                typer.echo(f"  failovers: {sweeper.failovers}", err=True)
