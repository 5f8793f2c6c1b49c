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
from pathlib import Path

import typer

from cli.options import Device, SourceOptions
from swarmd.errors import ConfigError, SwarmdError
from swarmd.swarm.runner import setup_logging

__all__ = [
    "check_device",
    "cli_errors",
    "eval_path_for",
    "fail",
    "open_sweeper",
    "print_json",
    "resolve_data",
    "setup_logging",
]


def fail(message: str, code: int = 2) -> None:
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


def resolve_data(path: Path | None, split: str = "train") -> Path:
    """--data, else $BLOCKTRAIN_DATA/<split>.txt, else the fetched WikiText-2 cache (fetching it)."""
    if path is not None:
        return path
    env = os.environ.get("BLOCKTRAIN_DATA")
    if env:
        candidate = Path(env)
        return candidate / f"{split}.txt" if candidate.is_dir() else candidate
    from swarmd.core.corpus import ensure_wikitext2

    return ensure_wikitext2()[split]


def eval_path_for(train_path: Path, eval_data: Path | None) -> Path:
    """--eval-data, else eval.txt next to a training file, else the training text itself."""
    if eval_data is not None:
        return eval_data
    sibling = train_path.parent / "eval.txt"
    return sibling if sibling.is_file() and train_path.is_file() else train_path


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
    from swarmd.serve.remote import connect_swarm
    from swarmd.swarm.discovery import connect_discovery

    return await connect_swarm(
        list(src.swarm or []), src.swarm_id, connect_discovery, steps=steps, timeout_s=src.timeout_s
    )


def print_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=True, default=float))
