"""`blocktrain demo`: a whole swarm on this machine: N daemons as processes, live view, final CE.

Parses the options, runs swarmd.swarm.demo.run_demo (which starts --peers daemons on loopback,
block i mod B, and scores the assembled model before and after) and renders its progress: one
bar per peer with its round, state, participation and bytes sent, then a summary line or JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli import options as o
from cli.common import cli_errors, print_json, resolve_train_eval
from cli.groups import with_groups
from cli.options import GOSSIP
from swarmd.protocol import peer_state_name


@with_groups(model=o.ModelOptions.optional(), train=o.TrainOptions.optional())
def demo(
    *,
    peers: Annotated[int, typer.Option("--peers", help="Daemons to start (processes on loopback).")] = 6,
    data: o.Data = None,
    eval_data: o.EvalData = None,
    rounds: o.Rounds = 5,
    steps_per_round: o.StepsPerRound = GOSSIP.steps_per_round,
    codec: o.CodecOpt = o.DEFAULT_CODEC,
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Where peers keep checkpoints and logs (default: a temp dir).")
    ] = None,
    model: o.ModelOptions,  # model and training: None = the demo's defaults
    train: o.TrainOptions,
    eval_tokens: o.EvalTokens = 4096,
    timeout_s: o.TimeoutS = 900.0,
    timeout: o.TimeoutAlias = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON summary (ce_start, ce_end, participation, bytes_sent, rounds, ...)."
        ),
    ] = False,
) -> None:
    """Run a whole swarm on this machine and report the assembled model's from-noise CE."""
    with cli_errors():
        from swarmd.swarm.demo import DEMO_MODEL, DEMO_TRAIN, run_demo

        cfg, tcfg = model.config(DEMO_MODEL), train.config(DEMO_TRAIN)
        train_path, eval_path = resolve_train_eval(data, eval_data)
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), disable=json_out
        ) as view:
            tasks: list = []

            def on_start(root: Path, ce_start: float) -> None:
                if not json_out:
                    view.console.print(
                        f"starting {peers} peers (B={cfg.blocks}, L_b={cfg.layers_per_block}, d={cfg.d_model}, "
                        f"seq={cfg.seq_len}) in {root}; initial from-noise CE {ce_start:.4f}"
                    )

            def on_poll(procs: list, statuses: list) -> None:
                if not tasks:
                    tasks.extend(view.add_task(f"peer {p.index} block {p.block}", total=rounds) for p in procs)
                for p, st, task in zip(procs, statuses, tasks, strict=True):
                    if st is not None:
                        state = peer_state_name(st.state)
                        extra = f" {state} part {st.participation:.2f} sent {st.bytes_sent / 1e6:.2f} MB"
                    else:
                        extra = " done" if not p.alive() else ""
                    view.update(
                        task, completed=len(p.rounds_seen), description=f"peer {p.index} block {p.block}{extra}"
                    )

            result = run_demo(
                peers,
                cfg,
                train_path,
                eval_path,
                rounds=rounds,
                steps_per_round=steps_per_round,
                codec=codec.value,
                train=tcfg,
                eval_tokens=eval_tokens,
                workdir=workdir,
                timeout_s=o.timeout_s(timeout_s, timeout),
                on_start=on_start,
                on_poll=on_poll,
            )
        if json_out:
            print_json(result)
        else:
            typer.echo(
                f"from-noise CE {result['ce_start']:.4f} -> {result['ce_end']:.4f} nats/byte after "
                f"{result['rounds']} rounds x {steps_per_round} steps; participation {result['participation']:.2f}; "
                f"{result['bytes_sent'] / 1e6:.2f} MB sent ({result['raw_bytes_sent'] / 1e6:.2f} MB raw fp32) "
                f"in {result['wall_s']:.0f}s"
            )
