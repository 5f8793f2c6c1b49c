"""The `blocktrain` command: registers every sub-command and `--version`; no command logic lives here.

Commands: train, eval, model-info, data fetch (model core); run, join, status, health, demo, dashboard (swarm);
score, generate (inference); simulate (the network simulator). Each lives in its own module under cli/; its
flags are declared in cli/flags.py (ranges in cli/bounds.py), the groups of flags that build configs in cli/options.py.
Importing this module (and so `blocktrain --help` or `blocktrain status`) does not import torch.
The console script (entry) ends its process as soon as the command is done (end_now).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Annotated, NoReturn

import typer

from cli import (
    dashboard,
    data,
    demo,
    evaluate,
    generate,
    health,
    join,
    keygen,
    model_info,
    run,
    score,
    simulate,
    status,
    train,
)
from cli import flags as f
from cli.common import cli_errors
from swarmd import __version__

app = typer.Typer(
    name="blocktrain",
    help="BlockTrain: train a DiffusionBlocks byte-level language model across a peer-to-peer swarm.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"blocktrain {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True)
    ] = False,
    swarm_key: f.SwarmKeyOpt = None,
) -> None:
    """BlockTrain: train a DiffusionBlocks byte-level language model across a peer-to-peer swarm."""
    if swarm_key is not None:  # every client this process opens (status, health, score, ...) proves it
        from swarmd.transport.auth import load_swarm_key, use_swarm_key

        with cli_errors():
            use_swarm_key(load_swarm_key(swarm_key))


app.command("train")(train.train)
app.command("eval")(evaluate.evaluate)
app.command("model-info")(model_info.info)
app.add_typer(data.app, name="data")
app.add_typer(keygen.app, name="keygen")
app.command("run")(run.run)
app.command("join")(join.join)
app.command("status")(status.status)
app.command("health")(health.health)
app.command("demo")(demo.demo)
app.command("dashboard")(dashboard.dashboard)
app.command("score")(score.score)
app.command("generate")(generate.generate)
app.command("simulate")(simulate.simulate)


def entry() -> None:
    """The `blocktrain` console script: the CLI as a process of its own (a daemon it runs ends the process within
    seconds of its shutdown: swarmd.node.runner.end_process_after_shutdown; tests call `app` in-process).

    A command that is done (its output written; its DHT, servers and files closed) ends the process at once
    (end_now): tearing the interpreter down once torch and hivemind are loaded took a second more on a quiet
    machine and 5-7 s on a loaded one, after `status --swarm` had printed everything."""
    from swarmd.node.runner import end_process_after_shutdown

    end_process_after_shutdown()
    try:
        app()
    except SystemExit as done:  # click ends every command so (standalone mode); a bug's traceback goes as usual
        end_now(done.code)


def end_now(code: object) -> NoReturn:
    """os._exit with SystemExit's code (None: 0; a message: printed, 1), after flushing stdout, stderr and logging."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe (`| head`) has nothing left to flush to
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
