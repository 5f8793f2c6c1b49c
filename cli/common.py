"""Shared CLI plumbing: the error boundary, device check, data paths, the sweeper, JSON output, logging.

Owns `cli_errors()`, the one context manager that turns SwarmdError (ConfigError for invalid
options included) and grpc.RpcError into a one-line message on stderr and a non-zero exit (2 for
bad input, 1 otherwise), never a traceback; any other exception is a bug and keeps its traceback.
Commands stay thin: parse, build configs (cli.options), call swarmd, render. Heavy modules (torch,
grpc) are imported inside the functions that need them, so `--help` and `status` stay light.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import typer

from cli.options import Device, SourceOptions
from swarmd.errors import ConfigError, DataError, SwarmdError
from swarmd.node.runner import setup_logging

__all__ = [
    "check_data",
    "check_device",
    "cli_errors",
    "eval_path_for",
    "fail",
    "open_sweeper",
    "print_json",
    "resolve_data",
    "resolve_train_eval",
    "setup_logging",
]


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def cli_errors():
    """Map expected failures to `error: ...` and an exit code; let typer.Exit pass through."""
    try:
        yield
    except typer.Exit:
        raise
    except ConfigError as exc:
        fail(f"bad value: {exc}", exc.exit_code)
    except SwarmdError as exc:
        fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except Exception as exc:  # grpc.RpcError and friends, without importing grpc here
        details = getattr(exc, "details", None)
        code = getattr(exc, "code", None)
        if callable(details) and callable(code):
            fail(f"peer call failed ({code().name}): {details()}", 1)
        raise


def check_device(device: Device) -> str:
    import torch

    if device == Device.cuda and not torch.cuda.is_available():
        fail("--device cuda asked for, but torch sees no CUDA device", 2)
    return device.value


def _announce(line: str) -> None:
    typer.echo(line, err=True)


def _data_dir_split(path: Path, split: str) -> Path:
    """A folder holding train.txt (a split folder, like $BLOCKTRAIN_DATA) gives <split>.txt; anything else itself."""
    return path / f"{split}.txt" if path.is_dir() and (path / "train.txt").is_file() else path


def _default_corpus():
    """The WikiText-2 cache if complete, else the standard-library corpus (never the network); announced."""
    from swarmd.core.corpus import Corpus, cached_wikitext2, stdlib_corpus

    cached = cached_wikitext2()
    if cached is not None:
        corpus = Corpus(
            "WikiText-2 (cached)",
            cached["train"],
            cached["eval"],
            cached["train"].stat().st_size,
            cached["eval"].stat().st_size,
        )
    else:
        corpus = stdlib_corpus()
        corpus = replace(corpus, detail=f"{corpus.detail}; no --data, $BLOCKTRAIN_DATA or WikiText-2 cache")
    _announce(corpus.announce())
    return corpus


def _env_data(warn: bool = False) -> str | None:
    """$BLOCKTRAIN_DATA, else the deprecated $BLOCKTRAIN_TRAIN_DATA (with a warning on stderr)."""
    env = os.environ.get("BLOCKTRAIN_DATA")
    if not env and os.environ.get("BLOCKTRAIN_TRAIN_DATA"):
        env = os.environ["BLOCKTRAIN_TRAIN_DATA"]
        if warn:
            _announce("warning: BLOCKTRAIN_TRAIN_DATA is deprecated; set BLOCKTRAIN_DATA instead")
    return env or None


def check_data(path: Path | None) -> None:
    """Instant checks of the training data the user named (--data, else $BLOCKTRAIN_DATA), before torch
    loads: it exists, holds bytes and looks like text. No data named: nothing to check (the defaults are)."""
    from swarmd.core.textcheck import check_data_path

    named = path if path is not None else _env_data()
    if named is not None:
        check_data_path(_data_dir_split(Path(named), "train"))


def resolve_data(path: Path | None, split: str = "train") -> Path:
    """--data (a file, a folder of files, or a folder with train.txt / eval.txt), else $BLOCKTRAIN_DATA
    (the same), else the WikiText-2 cache if fetched, else the Python standard library's sources.

    Never downloads: `blocktrain data fetch wikitext-2` does. The deprecated $BLOCKTRAIN_TRAIN_DATA is
    read (with a warning) when $BLOCKTRAIN_DATA is unset. An eval split of a lone training file is its
    held-out tail (resolve_train_eval), so `eval` scores what training held out.
    """
    if path is None:
        env = _env_data(warn=True)
        if not env:
            corpus = _default_corpus()
            return corpus.train if split == "train" else corpus.eval
        if split == "eval" and Path(env).is_file():  # a lone training file: score what training holds out
            return held_out_of(Path(env))
        path = Path(env)
    return _data_dir_split(path, split)


def resolve_train_eval(data: Path | None, eval_data: Path | None) -> tuple[Path, Path]:
    """(training text, held-out text): --eval-data, else eval.txt beside the training file, else the
    training text's tail, carved out and excluded from training (announced in one line)."""
    train_path = resolve_data(data, "train")
    if eval_data is not None:
        return train_path, eval_data
    sibling = _eval_beside(train_path)
    if sibling is not None:
        return train_path, sibling
    corpus = _carve(train_path)
    return corpus.train, corpus.eval


def _eval_beside(train_path: Path) -> Path | None:
    sibling = train_path.parent / "eval.txt"
    return sibling if train_path.is_file() and sibling.is_file() and sibling != train_path else None


def _carve(train_path: Path):
    from swarmd.core.corpus import heldout_split

    corpus = heldout_split(train_path)
    _announce(corpus.announce())
    return corpus


def held_out_of(train_path: Path) -> Path:
    """The held-out text that resolve_train_eval pairs with train_path (eval.txt beside it, else its tail)."""
    return _eval_beside(train_path) or _carve(train_path).eval


def eval_path_for(train_path: Path, eval_data: Path | None) -> Path:
    """--eval-data, else eval.txt next to a training file; never the training text itself (see resolve_train_eval)."""
    if eval_data is not None:
        return eval_data
    sibling = _eval_beside(train_path)
    if sibling is not None:
        return sibling
    raise DataError(
        f"no held-out text for {train_path}: put an eval.txt beside it or pass --eval-data FILE "
        "(training text is never scored as held-out text)"
    )


async def open_sweeper(src: SourceOptions, device: str, steps: int | None):
    """(sweeper, async closer) for exactly one of --swarm / --checkpoint (score and generate) on a checked device."""
    if bool(src.swarm) == (src.checkpoint is not None):
        raise ConfigError("give exactly one of --swarm and --checkpoint")
    if steps is not None and steps < 1:
        raise ConfigError("--steps must be >= 1")
    if src.checkpoint is not None:
        from swarmd.serve.inference import load_local

        sweeper = load_local(src.checkpoint, device, steps)

        async def nothing() -> None:
            return None

        return sweeper, nothing
    from swarmd.averaging.delta import decode
    from swarmd.averaging.state import weights_hash
    from swarmd.membership.discovery import connect_discovery
    from swarmd.membership.trust import verify_payload
    from swarmd.serve.remote import connect_swarm
    from swarmd.serve.tiebreak import StateChecks

    setup_logging(False)  # hivemind's own log lines (its DHT process's tracebacks) stay off the terminal

    return await connect_swarm(
        list(src.swarm or []),
        src.swarm_id,
        connect_discovery,
        steps=steps,
        timeout_s=src.timeout_s,
        verify_share=src.verify_share,
        state_checks=StateChecks(verify_payload, decode, weights_hash),  # tie-breaks by recomputation
    )


def print_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=True, default=float))
