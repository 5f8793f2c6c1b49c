"""`blocktrain demo`: a whole swarm on this machine: N daemons as processes, live progress, a kept model.

Parses the options, has swarmd.tools.demo.plan_demo validate them (bad input fails at once, before
torch is imported or any process starts), then runs swarmd.tools.demo.run_demo and renders its
events: on a terminal a live view (rich) of the peers joining, their rounds, train CE,
participation and bytes, per peer and per block; otherwise (piped, or --json) one flushed line per
event, e.g. one per peer ready and one per peer per round. It ends with the summary (or JSON) and
the commands that use the model the demo kept in --out.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from cli import flags as f
from cli import options as o
from cli.bounds import AT_LEAST_1
from cli.common import check_device, cli_errors, print_json, resolve_train_eval
from cli.flags import GOSSIP
from cli.groups import with_groups


class PlainView:
    """One line per event, flushed at once: `[  12.3s] peer 0 round 2/5: block 0 train ce ...`."""

    def __init__(self, stream: IO[str]):
        self.stream, self.t0 = stream, time.monotonic()

    def line(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", file=self.stream, flush=True)

    def event(self, ev: Any) -> None:
        self.line(ev.text)

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class LiveView(PlainView):
    """A rich live table of the peers (state, round, train CE, participation, bytes) and of the blocks.

    Events other than rounds are printed above the table as they come.
    """

    def __init__(self, rounds: int):
        from rich.console import Console
        from rich.live import Live

        super().__init__(sys.stdout)
        self.rounds = rounds
        self.peers: dict[int, dict[str, Any]] = {}
        self.console = Console()
        self.live = Live(console=self.console, get_renderable=self.render, refresh_per_second=4)

    def line(self, text: str) -> None:
        self.console.print(f"[dim]{time.monotonic() - self.t0:6.1f}s[/dim] {text}", highlight=False)

    def event(self, ev: Any) -> None:
        if ev.peer >= 0:
            row = self.peers.setdefault(ev.peer, {"block": ev.block, "state": "starting", "round": 0})
            if ev.kind == "ready":
                row["state"] = "waiting for peers"
            elif ev.kind == "round":
                row.update(state="training", round=ev.round or row["round"])
                for key in ("train_ce", "participation", "bytes_sent"):
                    if getattr(ev, key) is not None:
                        row[key] = getattr(ev, key)
            elif ev.kind == "exit":
                row["state"] = "done" if "finished" in ev.text else "failed"
        if ev.kind != "round":
            self.line(ev.text)

    def render(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        peers = Table(title=f"peers ({time.monotonic() - self.t0:.0f}s)", title_justify="left")
        for name in ("peer", "block", "state", "round", "train CE", "participation", "sent"):
            peers.add_column(name, justify="left" if name == "state" else "right")
        rows = dict(sorted(self.peers.items()))
        for index, r in rows.items():
            peers.add_row(
                str(index),
                str(r["block"]),
                r["state"],
                f"{r['round']}/{self.rounds}",
                f"{r['train_ce']:.4f}" if "train_ce" in r else "-",
                f"{r['participation']:.2f}" if "participation" in r else "-",
                f"{r['bytes_sent'] / 1e6:.2f} MB" if "bytes_sent" in r else "-",
            )
        blocks = Table(title="blocks", title_justify="left")
        for name in ("block", "peers", "round", "train CE (mean)", "sent"):
            blocks.add_column(name, justify="right")
        for b in sorted({r["block"] for r in rows.values()}):
            mine = [r for r in rows.values() if r["block"] == b]
            ces = [r["train_ce"] for r in mine if "train_ce" in r]
            blocks.add_row(
                str(b),
                str(len(mine)),
                f"{min(r['round'] for r in mine)}/{self.rounds}",
                f"{sum(ces) / len(ces):.4f}" if ces else "-",
                f"{sum(r.get('bytes_sent', 0) for r in mine) / 1e6:.2f} MB",
            )
        return Group(peers, blocks)

    def __enter__(self) -> LiveView:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()


@with_groups(model=o.ModelOptions.optional(), train=o.TrainOptions.optional())
def demo(
    *,
    peers: Annotated[int, f.flag("--peers", "Daemons to start (processes on loopback).", bounds=AT_LEAST_1)] = 6,
    data: f.Data = None,
    eval_data: f.EvalData = None,
    rounds: f.Rounds = 5,
    steps_per_round: f.StepsPerRound = GOSSIP.steps_per_round,
    codec: f.CodecOpt = f.DEFAULT_CODEC,
    balance_steps: f.BalanceSteps = f.GOSSIP.balance_steps,
    pull_codec: f.PullCodec = f.GOSSIP.pull_codec,
    device: f.DeviceOpt = f.DEFAULT_DEVICE,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write the trained model here as a normal checkpoint, for generate / score / eval "
            "(default: runs/demo-YYYYMMDD-HHMMSS).",
            show_default=False,
        ),
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir", help="Where peers keep checkpoints and logs (default: a temp dir, kept if a peer fails)."
        ),
    ] = None,
    model: o.ModelOptions,  # model and training: None = the demo's defaults
    train: o.TrainOptions,
    eval_tokens: f.EvalTokens = 4096,
    timeout_s: f.TimeoutS = 900.0,
    timeout: f.TimeoutAlias = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON summary (ce_start, ce_end, participation, bytes_sent, rounds, out, ...); "
            "progress lines go to stderr.",
        ),
    ] = False,
) -> None:
    """Run a whole swarm on this machine, keep the model it trains, report its from-noise CE."""
    with cli_errors():
        from swarmd.tools.demo import DEMO_MODEL, DEMO_TRAIN, plan_demo, run_demo  # no torch until run_demo

        cfg, tcfg = model.config(DEMO_MODEL), train.config(DEMO_TRAIN)
        train_path, eval_path = resolve_train_eval(data, eval_data)
        plan = plan_demo(
            peers,
            cfg,
            train_path,
            eval_path,
            rounds=rounds,
            steps_per_round=steps_per_round,
            codec=codec.value,
            balance_steps=balance_steps,
            pull_codec=pull_codec,
            device=device.value,
            train=tcfg,
            eval_tokens=eval_tokens,
            out=out,
            workdir=workdir,
            timeout_s=f.timeout_s(timeout_s, timeout),
        )
        if device != f.Device.cpu:  # imports torch: only for a GPU (the default, cpu, needs no check)
            check_device(device)
        view = PlainView(sys.stderr if json_out else sys.stdout)
        if not json_out and sys.stdout.isatty():
            view = LiveView(plan.swarm_rounds)
        view.line(
            f"demo: {peers} peers on loopback, B={cfg.blocks} x L_b={cfg.layers_per_block}, d={cfg.d_model}, "
            f"seq={cfg.seq_len}; {rounds} rounds x {steps_per_round} steps"
            + (f" per block, pipelined ({plan.swarm_rounds} rounds in all)" if plan.swarm_rounds > rounds else "")
            + f", {codec.value} deltas, on {device.value}; "
            f"data {train_path}; model to {plan.out}" + (" (replacing the model there)" if plan.replaces_model else "")
        )
        with view:
            result = run_demo(plan, view.event)
    if json_out:
        print_json(result)
        return
    typer.echo(
        f"from-noise CE {result['ce_start']:.4f} -> {result['ce_end']:.4f} nats/byte after "
        f"{min(result['rounds'], rounds)} rounds x {steps_per_round} steps per block"
        + (f" ({result['rounds']} swarm rounds, pipelined)" if result["rounds"] > rounds else "")
        + f"; participation {result['participation']:.2f}; "
        f"{result['bytes_sent'] / 1e6:.2f} MB sent ({result['raw_bytes_sent'] / 1e6:.2f} MB raw fp32) "
        f"in {result['wall_s']:.0f}s"
    )
    typer.echo(f"model kept in {plan.out} (a checkpoint like `blocktrain train --out` writes); try it with:")
    typer.echo(f'  blocktrain generate --checkpoint {plan.out} "The "')
    typer.echo(f"  blocktrain score --checkpoint {plan.out} FILE    (CE and perplexity of any text file)")
    typer.echo(f"  blocktrain eval --checkpoint {plan.out} --data {eval_path} --eval-tokens {eval_tokens}")
