"""`blocktrain score`: from-noise CE and perplexity of a text, through the swarm or from a checkpoint.

One sweep (one traversal of the block stack) scores a whole batch of seq_len-byte windows; the
result equals `blocktrain eval` of the same weights and noise seed. cli.common.open_sweeper (shared
with `blocktrain generate`): --swarm builds a swarmd.serve.remote.RemoteSweeper, --checkpoint a LocalSweeper.
Through a swarm the answers are verified (swarmd.serve.verify): the output's last line (`verified` in --json)
says how many hops were checked on a second replica, which peers were dropped, which blocks are unverified, and
how many ties between two replicas were broken by recomputing the hop from their pulled weights (tiebreaks,
state_downloads, tiebreak_s in --json). A CE worse than a uniform guess with an unverified block warns on stderr.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Annotated

import typer

from cli import flags as f
from cli import options as o
from cli.bounds import AT_LEAST_1, SEED
from cli.common import check_device, cli_errors, open_sweeper, print_json
from cli.groups import with_groups
from swarmd.errors import ConfigError

UNIFORM_CE = math.log(256)  # nats per byte of a uniform guess: a model scoring worse is broken or lied to


@with_groups(src=o.SourceOptions)
def score(
    file: Annotated[Path, typer.Argument(help="Text file to score (bytes).")],
    src: o.SourceOptions,
    max_bytes: Annotated[
        int | None, f.flag("--max-bytes", "Score at most this many bytes (whole windows).", bounds=AT_LEAST_1)
    ] = None,
    seed: Annotated[
        int, f.flag("--seed", "Noise seed of the sampler (same as `blocktrain eval --seed`).", bounds=SEED)
    ] = 1234,
    steps: f.Steps = None,
    json_out: f.Json = False,
) -> None:
    """Print the from-noise CE (nats per byte) and perplexity of a text."""
    with cli_errors():
        dev = check_device(src.device)
        if max_bytes is not None and max_bytes < 1:
            raise ConfigError("--max-bytes must be >= 1")
        result = asyncio.run(_score(file, src, dev, steps, seed, max_bytes))
        warning = worse_than_uniform(result)
        if warning:
            typer.echo(warning, err=True)
        if json_out:
            result.pop("verify_line", None)
            print_json(result)
            return
        typer.echo(
            f"ce {result['ce']:.4f} nats/byte  ppl {result['ppl']:.3f}  tokens {result['tokens']}  "
            f"sweeps {result['sweeps']}  ({result['source']})"
        )
        if "verified" in result:
            typer.echo(result["verify_line"])


def worse_than_uniform(result: dict) -> str:
    """The warning for a swarm score worse than a uniform guess while some block's answers went unchecked (what a
    lone liar's in-range garbage looks like), or ""."""
    unverified = result.get("verified", {}).get("unverified_blocks") or []
    if not unverified or not result["ce"] > UNIFORM_CE:
        return ""
    blocks = ", ".join(str(b) for b in unverified)
    return (
        f"warning: ce {result['ce']:.4f} is worse than a uniform guess over bytes (ln 256 = {UNIFORM_CE:.3f}); "
        f"block(s) {blocks} had no second replica to check their answers against"
    )


async def _score(
    file: Path, src: o.SourceOptions, device: str, steps: int | None, seed: int, max_bytes: int | None
) -> dict:
    from swarmd.serve.inference import score_file

    sweeper, closer = await open_sweeper(src, device, steps)
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
        stats = getattr(sweeper, "stats", None)  # a swarm sweeper's verification counts (swarmd.serve.verify)
        if stats is not None:
            result["verified"], result["verify_line"] = stats.summary(), stats.line()
        result["source"] = src.label
        return result
    finally:
        await closer()
