"""`blocktrain status`: one peer (ADDRESS) or the whole swarm (--swarm MULTIADDR) as a table or JSON.

The table's `reachable` column: yes / no, the peer's own dial-back check at start (can other peers dial it?);
`no (from here)` for a peer this command could not dial; `client` for a client-mode peer; `-` when not known
(not checked yet, or a peer too old to check).
"""

from __future__ import annotations

import asyncio
import math
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli import flags as f
from cli.common import cli_errors, fail, print_json, setup_logging
from cli.flags import NET


def _num(v: float, fmt: str = "{:.2f}") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def no_nan(obj):
    """NaN (unknown) becomes null so the JSON is strict."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: no_nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [no_nan(v) for v in obj]
    return obj


def reachable(row: dict) -> str:
    """The `reachable` cell of a peer row (see the module doc)."""
    if row.get("client_mode"):
        return "client"
    if row.get("state") == "unreachable":
        return "no (from here)"
    value = row.get("reachable")
    return "-" if value is None else "yes" if value else "no"


def render(summary: dict) -> None:
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # pipes and tests: do not squeeze the table to 80 columns
    peers = Table(title="peers")
    for col in (
        "peer",
        "block",
        "state",
        "round",
        "steps",
        "samples/s",
        "train CE",
        "last CE",
        "sent",
        "received",
        "particip.",
        "uptime",
        "address",
        "reachable",
    ):
        peers.add_column(col)
    for r in summary["peers"]:
        peers.add_row(
            r["peer_id"][-8:],
            str(r["block"]),
            r["state"],
            str(r["round"]),
            str(r["local_steps"]),
            _num(r["samples_per_s"], "{:.1f}"),
            _num(r["train_ce"], "{:.4f}"),
            _num(r["last_ce"], "{:.4f}"),
            _bytes(r["bytes_sent"]),
            _bytes(r["bytes_received"]),
            _num(r["participation"]),
            _num(r["uptime_s"], "{:.0f}s"),
            r["address"] or "(client)",
            reachable(r),
        )
    blocks = Table(title="blocks")
    for col in ("block", "peers", "samples/s", "consensus distance"):
        blocks.add_column(col)
    for b in summary["blocks"]:
        blocks.add_row(
            str(b["block"]),
            str(b["peers"]),
            _num(b["samples_per_s"], "{:.1f}"),
            _num(b["consensus_distance"], "{:.2e}"),
        )
    console.print(peers)
    console.print(blocks)
    console.print(f"swarm consensus distance (max over blocks): {_num(summary['consensus_distance'], '{:.2e}')}")


def status(
    address: Annotated[
        str | None, typer.Argument(help="HOST:PORT of one peer's gRPC server.", show_default=False)
    ] = None,
    swarm: f.SwarmPeers = None,
    swarm_id: f.SwarmId = NET.swarm_id,
    timeout_s: f.TimeoutS = 5.0,
    timeout: f.TimeoutAlias = None,
    json_out: f.Json = False,
) -> None:
    """Show a peer's or the whole swarm's status: rounds, throughput, bytes, participation, consensus."""
    setup_logging(False, hivemind=bool(swarm))  # one peer's status needs no DHT (nor torch)
    with cli_errors():
        if bool(address) == bool(swarm):
            fail("pass either ADDRESS or --swarm MULTIADDR", 2)
        from swarmd.tools.survey import survey_peer, survey_swarm

        wait_s = f.timeout_s(timeout_s, timeout)
        survey = survey_peer(address, wait_s) if address else survey_swarm(list(swarm or ()), swarm_id, wait_s)
        summary = asyncio.run(survey)
        if swarm and not summary["peers"]:  # not an error (scripts get an empty list), but say why it is empty
            typer.echo(f"note: no peer of swarm {swarm_id!r} found through {swarm[0]} (check --swarm-id)", err=True)
        if json_out:
            print_json(no_nan(summary))
        else:
            render(summary)
