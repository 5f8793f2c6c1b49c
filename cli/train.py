"""`blocktrain train`: train a BlockTrain stack (or the E2E reference) in one process."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli import flags as f
from cli import options as o
from cli.common import check_data, check_device, cli_errors, print_json, resolve_train_eval
from cli.flags import TRAIN
from cli.groups import with_groups
from swarmd.errors import ConfigError


@with_groups(model=o.ModelOptions, train=o.TrainOptions.with_defaults(pipeline=None, pipeline_stagger=None))
def train(
    *,
    out: Annotated[Path, typer.Option("--out", help="Checkpoint directory to write.")],
    data: f.Data = None,
    eval_data: f.EvalData = None,
    e2e: Annotated[bool, typer.Option("--e2e", help="Train the end-to-end reference transformer instead.")] = False,
    model: o.ModelOptions,
    steps_per_round: f.StepsPerRound = 100,
    rounds: f.Rounds = 4,
    train: o.TrainOptions,
    eval_tokens: f.EvalTokens = 16384,
    device: f.DeviceOpt = f.Device.cpu,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON summary at the end.")] = False,
) -> None:
    """Train one process, one block at a time (no gradient crosses blocks); eval after every round."""
    with cli_errors():
        check_data(data)  # a missing, empty or binary file fails before torch loads
        dev = check_device(device)
        cfg = model.config()
        if steps_per_round < 1 or rounds < 1:
            raise ConfigError("--steps-per-round and --rounds must be >= 1")
        total = steps_per_round * rounds
        # one process trains one block after the other unless told otherwise (--no-pipeline): the same compute as
        # training them side by side, and the best stack measured (1.6630 against 1.7071 at B=4 x 1)
        schedule: dict = {}
        if train.pipeline is None:
            schedule["pipeline"] = True
            if train.pipeline_stagger is None:
                schedule["pipeline_stagger"] = rounds
        tcfg = train.config(total_steps=total, warmup_steps=min(TRAIN.warmup_steps, total // 10), **schedule)
        from swarmd.core.checkpoint import save_e2e, save_model
        from swarmd.core.data import ByteData
        from swarmd.core.local_run import RoundReport, train_blocktrain, train_e2e

        train_path, eval_path = resolve_train_eval(data, eval_data)
        corpus = ByteData.from_path(train_path, cfg.seq_len)
        eval_xy = ByteData.from_path(eval_path, cfg.seq_len).eval_windows(eval_tokens)
        history: list[dict] = []
        total = steps_per_round * rounds * (1 if e2e else cfg.blocks)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=json_out,
            disable=json_out,
        ) as bar:
            task = bar.add_task("training", total=total)

            def on_step(block_index: int, metrics: dict) -> None:
                bar.update(
                    task, advance=1, description=f"{'e2e' if e2e else f'block {block_index}'} ce {metrics['ce']:.3f}"
                )

            def on_round(r: RoundReport) -> None:
                row = {
                    "round": r.round,
                    "steps_per_block": r.steps_per_block,
                    "train_ce": r.train_ce,
                    "eval_ce": r.eval["ce"],
                    "seconds": r.seconds,
                }
                if "trace" in r.eval:
                    row["trace"] = [s["ce"] for s in r.eval["trace"]]
                history.append(row)
                if not json_out:
                    trace = f" per-step {', '.join(f'{c:.3f}' for c in row.get('trace', []))}" if "trace" in row else ""
                    bar.console.print(
                        f"round {r.round}: train ce {r.train_ce:.3f}  "
                        f"eval {'' if e2e else 'from-noise '}ce {r.eval['ce']:.4f}{trace}"
                    )

            if e2e:
                trainer = train_e2e(cfg, tcfg, corpus, eval_xy, steps_per_round, rounds, dev, on_round, on_step)
                save_e2e(out, cfg, trainer.model, tcfg, rounds=rounds, steps=trainer.step_count)
            else:
                # one process has every block as it is now: a later block trains against its live predecessors
                # (final ones, one block after the other)
                stack = train_blocktrain(
                    cfg,
                    tcfg,
                    corpus,
                    eval_xy,
                    steps_per_round,
                    rounds,
                    dev,
                    on_round,
                    on_step,
                    trajectory_source="live",
                )
                save_model(
                    out,
                    cfg,
                    dict(enumerate(stack.blocks)),
                    stack.emb,
                    tcfg,
                    {b: t.step_count for b, t in enumerate(stack.trainers)},
                    rounds=rounds,
                )
        if json_out:
            print_json(
                {
                    "checkpoint": str(out),
                    "kind": "e2e" if e2e else "blocktrain",
                    "config": cfg.to_dict(),
                    "history": history,
                    "ce": history[-1]["eval_ce"],
                }
            )
        else:
            typer.echo(f"checkpoint written to {out}")
