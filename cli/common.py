"""Shared CLI plumbing: option types, the error boundary, data path resolution, JSON output.

Owns `cli_errors()`, the one context manager that turns SwarmdError, ValueError from config
validation and grpc.RpcError into a one-line message on stderr and a non-zero exit (2 for bad
input, 1 otherwise), never a traceback. Commands stay thin: parse, build configs, call swarmd.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from enum import Enum
from pathlib import Path

import typer

from swarmd.core.config import ModelConfig
from swarmd.errors import SwarmdError


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


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
    except SwarmdError as exc:
        fail(str(exc), exc.exit_code)
    except ValueError as exc:
        fail(f"bad value: {exc}", 2)
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


def model_config(
    blocks: int,
    layers_per_block: int,
    d_model: int,
    n_heads: int,
    hidden: int | None,
    seq_len: int,
    sigma_lo: float,
    sigma_hi: float,
) -> ModelConfig:
    return ModelConfig(
        blocks=blocks,
        layers_per_block=layers_per_block,
        d_model=d_model,
        n_heads=n_heads,
        hidden=hidden if hidden is not None else 4 * d_model,
        seq_len=seq_len,
        sigma_lo=sigma_lo,
        sigma_hi=sigma_hi,
    )


def print_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=True, default=float))


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        from hivemind.utils.logging import use_hivemind_log_handler

        use_hivemind_log_handler("in_root_logger")
    except ImportError:  # pragma: no cover - hivemind is a hard dependency
        pass
