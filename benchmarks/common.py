"""What the benchmark scripts share: their --data-dir option, the tiny LocalSwarm, and the records they write.

Owns: the parser every script starts from (description from its docstring, --data-dir first:
$BLOCKTRAIN_DATA, for the LocalSwarm scripts falling back to the shared wikitext-2) and the check
that the folder holds the text; the tiny model and int8 LocalSwarm of fault.py and scale.py; the
--out/--md options, command line, machine line and JSON file of a result; replace_section, which
rewrites one script's fragment of a markdown file.
Scripts import it as benchmarks.common (each puts the repository root on sys.path first).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmd.core.config import ModelConfig

if TYPE_CHECKING:
    from swarmd.tools.launch import LocalSwarm

SHARED_DATA = "/work/shared/data/wikitext-2"

# fault.py and scale.py: B=3, L_b=1, d=32, seq 32
TINY_CFG = ModelConfig(blocks=3, layers_per_block=1, d_model=32, n_heads=2, hidden=128, seq_len=32)


def parser(doc: str, holds: str | None = None) -> argparse.ArgumentParser:
    """An ArgumentParser described by doc's first line, with --data-dir as its first option.

    :param holds: None for the LocalSwarm scripts (default $BLOCKTRAIN_DATA, else the shared
        wikitext-2); else what the folder must hold, e.g. "train.txt" (default $BLOCKTRAIN_DATA,
        checked by parse_checked)
    """
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    if holds is None:
        add_data_dir(p, fallback=SHARED_DATA)
    else:
        add_data_dir(p, help=f"folder with {holds} (default $BLOCKTRAIN_DATA)")
    return p


def add_data_dir(p: argparse.ArgumentParser, help: str | None = None, fallback: str | None = None) -> None:
    """--data-dir: a Path, by default $BLOCKTRAIN_DATA (else fallback)."""
    p.add_argument("--data-dir", type=Path, default=os.environ.get("BLOCKTRAIN_DATA", fallback), help=help)


def parse_checked(p: argparse.ArgumentParser, argv: list[str] | None, holds: str) -> argparse.Namespace:
    """p.parse_args(argv), exiting with a usage error unless --data-dir holds train.txt."""
    args = p.parse_args(argv)
    if args.data_dir is None or not (Path(args.data_dir) / "train.txt").is_file():
        p.error(f"--data-dir must hold {holds} (got {args.data_dir}); set BLOCKTRAIN_DATA")
    return args


def add_schedule(p: argparse.ArgumentParser, rounds: int, steps: int, steps_help: str | None = None) -> None:
    """--rounds (averaging rounds each daemon runs) and --steps (local steps per round) with these defaults."""
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--steps", type=int, default=steps, help=steps_help)


def add_swarm_config(p: argparse.ArgumentParser) -> None:
    """The small swarm config of benchmarks/swarm.py (B, d, seq, 8 rounds x H=25, batch, lr, eval bytes)."""
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=64)
    add_schedule(p, rounds=8, steps=25, steps_help="local steps per round (H)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-tokens", type=int, default=8192)


def add_outputs(p: argparse.ArgumentParser, name: str) -> None:
    """--out (benchmarks/results/<name>.json) and --md (the ISSUE3_swarm.md fragment): a LocalSwarm script's records."""
    p.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{name}.json"))
    p.add_argument("--md", type=Path, default=Path("benchmarks/results/ISSUE3_swarm.md"))


def command_line(script: str, argv: list[str] | None) -> str:
    """'python benchmarks/<script> <args>': the command a result records."""
    return (f"python benchmarks/{script} " + " ".join(argv if argv is not None else sys.argv[1:])).strip()


def write_json(path: Path, out: dict) -> None:
    """out as indented JSON with sorted keys at path (its folder made if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, sort_keys=True))


@contextlib.contextmanager
def temporary_swarm(prefix: str, peers: int, model: ModelConfig, data: Path, **kw: Any) -> Iterator[LocalSwarm]:
    """LocalSwarm(peers, model, data, <a temporary folder>, **kw); the folder goes on exit (stop the swarm first)."""
    from swarmd.tools.launch import LocalSwarm

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield LocalSwarm(peers, model, data, Path(tmp), **kw)


def tiny_swarm(
    prefix: str,
    n: int,
    data_dir: Path,
    rounds: int,
    steps: int,
    deadline_max_s: float,
    model: ModelConfig = TINY_CFG,
    **kw: Any,
) -> contextlib.AbstractContextManager[LocalSwarm]:
    """temporary_swarm of n daemons on `model` (TINY_CFG): int8 codec, batch 8, lr 3e-3, training on
    data_dir/train.txt; kw: more LocalSwarm options (swarm_id, overlap, ...)."""
    return temporary_swarm(
        prefix,
        n,
        model,
        data_dir / "train.txt",
        rounds=rounds,
        steps_per_round=steps,
        codec="int8",
        batch_size=8,
        lr=3e-3,
        deadline_max_s=deadline_max_s,
        **kw,
    )


def machine() -> str:
    """'x86_64, 16 CPUs, Python 3.11.7': the machine line of a result."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def replace_section(path: Path, name: str, lines: list[str]) -> None:
    """Write lines between <!-- name --> and <!-- /name --> in path (appended the first time)."""
    existing = path.read_text() if path.exists() else ""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = start + "\n" + "\n".join(lines) + "\n" + end
    if start in existing:
        pre, rest = existing.split(start, 1)
        existing = pre + block + rest.split(end, 1)[1]
    else:
        existing = (existing + "\n" if existing else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(existing)
