"""Reusable typer option declarations for the model and training flags.

Every command that builds or trains a model takes the same flags with the same help text, so
they are declared once here (Annotated aliases) and listed in each command's signature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import Device

M, T = "Model", "Training"

Blocks = Annotated[int, typer.Option("--blocks", help="B: number of denoising blocks.", rich_help_panel=M)]
LayersPerBlock = Annotated[
    int, typer.Option("--layers-per-block", help="L_b: transformer layers per block.", rich_help_panel=M)
]
DModel = Annotated[int, typer.Option("--d-model", help="Model width d.", rich_help_panel=M)]
NHeads = Annotated[int, typer.Option("--n-heads", help="Attention heads per layer.", rich_help_panel=M)]
Hidden = Annotated[int | None, typer.Option("--hidden", help="FFN width (default 4 x d-model).", rich_help_panel=M)]
SeqLen = Annotated[int, typer.Option("--seq-len", help="Bytes per training window.", rich_help_panel=M)]
SigmaLo = Annotated[float, typer.Option("--sigma-lo", help="Bottom of the noise range.", rich_help_panel=M)]
SigmaHi = Annotated[float, typer.Option("--sigma-hi", help="Top of the noise range.", rich_help_panel=M)]

Data = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help="Training text: a file or a directory of files (default: $BLOCKTRAIN_DATA or the WikiText-2 cache).",
        envvar="BLOCKTRAIN_TRAIN_DATA",
        rich_help_panel=T,
    ),
]
EvalData = Annotated[
    Path | None,
    typer.Option(
        "--eval-data",
        help="Held-out text for from-noise CE (default: eval split next to the training data).",
        rich_help_panel=T,
    ),
]
StepsPerRound = Annotated[
    int, typer.Option("--steps-per-round", help="Local optimiser steps per block per round.", rich_help_panel=T)
]
Rounds = Annotated[int, typer.Option("--rounds", help="Training rounds.", rich_help_panel=T)]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Sequences per optimiser step.", rich_help_panel=T)]
LR = Annotated[float, typer.Option("--lr", help="AdamW peak learning rate.", rich_help_panel=T)]
Seed = Annotated[int, typer.Option("--seed", help="Seed for init, data order and noise.", rich_help_panel=T)]
TrajectoryProb = Annotated[
    float,
    typer.Option(
        "--trajectory-prob",
        help="Chance a batch trains on the sampler's own trajectory (0 = documented noisy targets).",
        rich_help_panel=T,
    ),
]
EvalTokens = Annotated[
    int, typer.Option("--eval-tokens", help="Held-out bytes scored for from-noise CE.", rich_help_panel=T)
]
DeviceOpt = Annotated[Device, typer.Option("--device", help="Torch device.", case_sensitive=False, rich_help_panel=T)]
