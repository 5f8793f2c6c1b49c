"""Round time of a 3-host swarm (network namespaces) with and without 50 ms of user-space delay per hop.

Three daemons, each in its own network namespace (tests/netns_utils.py), train one block as three replicas and find
each other through the real DHT; every gRPC server sits behind tests/delay_relay.py, which delays each forwarded chunk.
One run per --delays value: mean round and exchange times. Needs root. Writes --out and --md; --render FILE rewrites
--md from a saved result.

    python benchmarks/netns.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import daemons, options, results, sweeps
from tests.netns_utils import NetnsLab, unavailable

CFG = replace(daemons.TINY_CFG, blocks=1)  # one block, three replicas: every round moves block and table deltas


def parse_args(argv=None):
    p = options.parser(__doc__)
    options.add_schedule(p, rounds=12, steps=5)
    p.add_argument("--delays", default="0,50", help="comma-separated one-way delays per hop, milliseconds")
    options.add_outputs(p, "netns.json", "netns.md")
    p.add_argument("--render", type=Path, help="only rewrite --md from this saved result JSON")
    a = p.parse_args(argv)
    try:
        a.delays = [float(d) for d in a.delays.split(",")]
    except ValueError:
        p.error(f"--delays must be comma-separated numbers, got {a.delays!r}")
    return a if a.render is not None else options.check_data(p, a, "train.txt")


def run_once(a, delay_ms: float) -> dict:
    """One swarm of 3 namespaced daemons behind relays of delay_ms; its round and exchange times."""
    with NetnsLab(3) as lab, tempfile.TemporaryDirectory(prefix="netns-") as workdir:
        swarm_kw = dict(model=CFG, swarm_id="netns", delay_ms=delay_ms)
        swarm = daemons.netns_swarm(lab, a.data_dir, Path(workdir), a.rounds, a.steps, 20.0, **swarm_kw)
        started = time.monotonic()
        with swarm:
            swarm.start(timeout_s=300)
            ready_s = time.monotonic() - started
            finished = swarm.wait(timeout_s=600)
        daemons.check_exit(swarm, finished, "peers failed")
        histories, round_s, _ = sweeps.round_times(swarm.summaries())
    exchange_s = [x["seconds"] for h in histories for x in h[1:]]
    row = {"delay_ms": delay_ms, "rounds_merged": [len(h) for h in histories]}
    row |= {"round_s_mean": statistics.mean(round_s), "round_s_median": statistics.median(round_s)}
    row |= {"exchange_s_mean": statistics.mean(exchange_s), "exchange_s_median": statistics.median(exchange_s)}
    row["participation_mean"] = statistics.mean(x["participation"] for h in histories for x in h)
    return row | {"start_s": ready_s}


def markdown(out: dict) -> list[str]:
    """The BENCHMARKS.md fragment of a result (what --render prints from a saved JSON)."""
    runs, base = out["runs"], out["runs"][0]
    head = (
        "one-way delay per hop | round s (mean) | round s (median) | exchange s (mean) | exchange s (median) "
        "| participation | round mean vs no delay"
    )
    rows = [
        f"{r['delay_ms']:g} ms | {r['round_s_mean']:.3f} | {r['round_s_median']:.3f} | {r['exchange_s_mean']:.3f} "
        f"| {r['exchange_s_median']:.3f} | {r['participation_mean']:.2f} "
        f"| {r['round_s_mean'] - base['round_s_mean']:+.3f} s"
        for r in runs
    ]
    return results.paragraphs(
        "## Three daemons in three network namespaces: round time with and without delay",
        f"Command: `{out['command']}` (as root; writes `benchmarks/results/netns.json`; "
        "`--render benchmarks/results/netns.json` rewrites this fragment from it).",
        "Three daemons, each in its own network namespace on one bridge (10.213.0.10-12), train one block as three "
        f"replicas (B=1, L_b=1, d=32, seq 32, batch 8, H={out['steps_per_round']}, int8 deltas, {out['rounds']} "
        "rounds) and find each other through the DHT. Every gRPC server sits behind a user-space TCP relay "
        "(`tests/delay_relay.py`) that holds each forwarded chunk for the one-way delay; DHT lookups go direct. "
        "Round = wall time between two merges of a peer; exchange = own delta ready -> merge; the first round is "
        f"left out. Machine: {out['machine']}, shared with other jobs.",
        results.table(head, rows, "r" * 7),
        "A round trip through a relay of d ms costs at least 2d. The function test: "
        "`python -m pytest -m slow tests/test_netns.py` (run by `.ci/run`).",
    )


def main(argv=None) -> None:
    a = parse_args(argv)
    if a.render is None and (reason := unavailable()):
        raise SystemExit(f"error: {reason}")
    out = results.rendered_or(a, lambda: run(a, argv))
    results.write_text(a.md, "\n".join(markdown(out)))


def run(a, argv) -> dict:
    """One run_once per delay: the result JSON."""
    runs = []
    for delay in a.delays:
        print(f"delay {delay:g} ms ...", flush=True)
        runs.append(run_once(a, delay))
        print(runs[-1], flush=True)
    out = {"command": results.command_line("netns.py", argv), "config": CFG.to_dict(), "hosts": 3, "rounds": a.rounds}
    return out | {"steps_per_round": a.steps, "runs": runs, "machine": results.machine()}


if __name__ == "__main__":
    main()
