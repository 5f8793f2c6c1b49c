"""The benchmark scripts' command lines: the parser every script starts from and the option groups they repeat.

parser (--data-dir first), check_data / parse_checked (it holds train.txt), the option groups (add_*), positive_floats
(a comma-separated list flag's type), model_of and picked (options as config fields) and swarm_text.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness.results import RESULTS
from swarmd.core.config import HANDOFF_LOSSES, OUT_HEADS, PRED_IN_INITS, ModelConfig, TrainConfig

SHARED_DATA = "/work/shared/data/wikitext-2"


def parser(doc: str, holds: str | None = None) -> argparse.ArgumentParser:
    """An ArgumentParser described by doc's first line, with --data-dir ($BLOCKTRAIN_DATA) as its first option;
    holds: what the folder must hold (parse_checked checks it), None: it falls back to the shared wikitext-2."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    if holds is None:
        add_data_dir(p, fallback=SHARED_DATA)
    else:
        add_data_dir(p, help=f"folder with {holds} (default $BLOCKTRAIN_DATA)")
    return p


def add_data_dir(p: argparse.ArgumentParser, help: str | None = None, fallback: str | None = None) -> None:
    """--data-dir: a Path, by default $BLOCKTRAIN_DATA (else fallback)."""
    p.add_argument("--data-dir", type=Path, default=os.environ.get("BLOCKTRAIN_DATA", fallback), help=help)


def check_data(p: argparse.ArgumentParser, args: argparse.Namespace, holds: str) -> argparse.Namespace:
    """args, after a usage error unless --data-dir holds train.txt (for scripts that need it only to run)."""
    if args.data_dir is None or not (Path(args.data_dir) / "train.txt").is_file():
        p.error(f"--data-dir must hold {holds} (got {args.data_dir}); set BLOCKTRAIN_DATA")
    return args


def parse_checked(p: argparse.ArgumentParser, argv: list[str] | None, holds: str) -> argparse.Namespace:
    """p.parse_args(argv), exiting with a usage error unless --data-dir holds train.txt."""
    return check_data(p, p.parse_args(argv), holds)


def add_outputs(p: argparse.ArgumentParser, out: str, md: str | Path | None = None, results: Path = RESULTS) -> None:
    """--out (results/<out>: the result JSON) and, given md, --md (results/<md>, or md itself given a Path such as
    BENCHMARKS: its markdown fragment)."""
    p.add_argument("--out", type=Path, default=results / out)
    if md is not None:
        p.add_argument("--md", type=Path, default=md if isinstance(md, Path) else results / md)


def add_schedule(
    p: argparse.ArgumentParser, rounds: int, steps: int, steps_help: str | None = None, rounds_help: str | None = None
) -> None:
    """--rounds (averaging rounds each daemon runs) and --steps (local steps per round) with these defaults."""
    p.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    p.add_argument("--steps", type=int, default=steps, help=steps_help)


def add_shape(
    p: argparse.ArgumentParser,
    blocks: int = 3,
    d_model: int = 64,
    seq_len: int = 64,
    layers_per_block: int | None = None,
) -> None:
    """--blocks, --d-model, --layers-per-block (given a default) and --seq-len: the model model_of builds."""
    p.add_argument("--blocks", type=int, default=blocks)
    p.add_argument("--d-model", type=int, default=d_model)
    if layers_per_block is not None:
        p.add_argument("--layers-per-block", type=int, default=layers_per_block)
    p.add_argument("--seq-len", type=int, default=seq_len)


def add_training(
    p: argparse.ArgumentParser,
    batch_size: int = 16,
    lr: float | None = 3e-3,
    eval_tokens: int = 8192,
    train_bytes: int | None = None,
) -> None:
    """--batch-size, --lr (unless None), --eval-tokens and --train-bytes (given a default: the simulator's text)."""
    p.add_argument("--batch-size", type=int, default=batch_size)
    if lr is not None:
        p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--eval-tokens", type=int, default=eval_tokens)
    if train_bytes is not None:
        p.add_argument("--train-bytes", type=int, default=train_bytes, help="first bytes of train.txt used")


def add_swarm_config(p: argparse.ArgumentParser, layers_per_block: int | None = None) -> None:
    """The small swarm config of benchmarks/swarm.py (B, d, seq, 8 rounds x H=25, batch, lr, eval bytes)."""
    add_shape(p, layers_per_block=layers_per_block)
    add_schedule(p, rounds=8, steps=25, steps_help="local steps per round (H)")
    add_training(p)


def model_of(a: argparse.Namespace, documented: bool = False) -> ModelConfig:
    """The ModelConfig of add_shape's options (L_b 1 unless given, 4 heads, FFN 4 d); documented: the documented one."""
    make = ModelConfig.documented if documented else ModelConfig
    shape = dict(blocks=a.blocks, layers_per_block=getattr(a, "layers_per_block", 1), seq_len=a.seq_len)
    return make(**shape, d_model=a.d_model, n_heads=4, hidden=4 * a.d_model)


BLOCK_OPTIONS = (  # the ModelConfig fields of add_block_options
    "sigma_lo",
    "sigma_hi",
    "context_input",
    "z_in_init",
    "pred_input",
    "noise_embedding",
    "pred_output",
    "handoff_loss",
    "out_head",
    "pred_in_init",
)
TRAJECTORY_OPTIONS = ("freeze_z_in", "trajectory_prob", "sigma_sampling")  # add_trajectory_options' TrainConfig fields


def add_block_options(p: argparse.ArgumentParser, model: ModelConfig) -> None:
    """The noise range and the issue-8/19 block options (--context-input ... --handoff-loss: the ModelConfig fields
    BLOCK_OPTIONS), defaults from model."""
    p.add_argument("--sigma-lo", type=float, default=model.sigma_lo)
    p.add_argument("--sigma-hi", type=float, default=model.sigma_hi)
    p.add_argument("--context-input", choices=("scaled_unit", "own_table"), default=model.context_input)
    p.add_argument("--z-in-init", choices=("default", "zero"), default=model.z_in_init)
    p.add_argument("--pred-input", choices=("none", "feature"), default=model.pred_input)
    p.add_argument("--noise-embedding", choices=("default", "zero_init", "off"), default=model.noise_embedding)
    p.add_argument("--pred-output", choices=("none", "add"), default=model.pred_output)
    p.add_argument("--handoff-loss", choices=HANDOFF_LOSSES, default=model.handoff_loss)
    p.add_argument("--out-head", choices=OUT_HEADS, default=model.out_head)
    p.add_argument("--pred-in-init", choices=PRED_IN_INITS, default=model.pred_in_init)


def add_trajectory_options(p: argparse.ArgumentParser, train: TrainConfig) -> None:
    """--freeze-z-in, --trajectory-prob, --sigma-sampling (defaults from train) and --trajectory-source."""
    p.add_argument("--freeze-z-in", choices=("none", "block0", "all"), default=train.freeze_z_in)
    trajectory_help = "1: train every block on the sampler's own trajectory; 0: the documented noisy targets"
    p.add_argument("--trajectory-prob", type=float, default=train.trajectory_prob, help=trajectory_help)
    p.add_argument("--sigma-sampling", choices=("lognormal", "loguniform", "sampler"), default=train.sigma_sampling)
    source_help = "live: predecessors as they are now (diagnostic for staleness)"
    p.add_argument("--trajectory-source", choices=("snapshot", "live"), default="snapshot", help=source_help)


def swarm_text(a: argparse.Namespace, cfg: ModelConfig) -> tuple:
    """(--data-dir's train.txt as ByteData, --eval-tokens bytes of its eval.txt as (x, y)): a simulator's text."""
    from swarmd.core.data import ByteData

    data = ByteData.from_path(a.data_dir / "train.txt", cfg.seq_len)
    return data, ByteData.from_path(a.data_dir / "eval.txt", cfg.seq_len).eval_windows(a.eval_tokens)


def positive_floats(flag: str) -> Callable[[str], list[float]]:
    """The argparse type of a list flag: '1e-3,3e-3' -> [0.001, 0.003]; SystemExit unless all are positive numbers."""

    def parse(text: str) -> list[float]:
        try:
            values = [float(v) for v in text.split(",") if v.strip()]
        except ValueError:
            values = []
        if not values or any(v <= 0 for v in values):
            raise SystemExit(f"{flag} wants comma-separated positive numbers, got {text!r}")
        return values

    return parse


def picked(a: argparse.Namespace, names: tuple[str, ...]) -> dict:
    """{name: a.name} for these option names: config fields to pass on, e.g. ModelConfig(**picked(a, BLOCK_OPTIONS))."""
    return {k: getattr(a, k) for k in names}


def add_torch(p: argparse.ArgumentParser) -> None:
    """--threads (torch CPU threads, default 1) and --seed (default 0)."""
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)


def add_section(p: argparse.ArgumentParser, default: str) -> None:
    """--section: the name of this script's fragment in a markdown file that several scripts share."""
    p.add_argument("--section", default=default, help="name of the fragment's section (a second variant's own)")
