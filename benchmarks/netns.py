"""Round time of a 3-host swarm (network namespaces) with and without 50 ms of user-space delay per hop.

Three daemons, each in its own network namespace on a bridge (tests/netns_utils.py: 10.213.0.10-12), train one
block as three replicas (tiny model, int8) and find each other through the real DHT. Each host's gRPC server sits
behind tests/delay_relay.py, which delays every forwarded chunk by the run's delay (one way; the daemons announce
the relay; DHT lookups go direct). One run per --delays value (0: the same relays, no delay), each on fresh
namespaces: the mean round time (between two merges of a peer, the first round left out) and exchange time (own
delta ready -> merge). Needs root and iproute2; the swarm is benchmarks/harness/daemons.py's netns_swarm.

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
    lines = [
        "## Three daemons in three network namespaces: round time with and without delay",
        "",
        f"Command: `{out['command']}` (as root; writes `benchmarks/results/netns.json`; "
        "`--render benchmarks/results/netns.json` rewrites this fragment from it).",
        "",
        "Three daemons, each in its own network namespace on one bridge (10.213.0.10-12 over veth pairs: addresses "
        "only those namespaces have), train one block as three replicas (B=1, L_b=1, d=32, seq 32, batch 8, "
        f"H={out['steps_per_round']}, int8 deltas, {out['rounds']} rounds), find each other through the hivemind "
        "DHT and announce their namespace addresses. Every gRPC server sits behind a user-space TCP relay "
        "(`tests/delay_relay.py`; this kernel has no `tc netem`) that holds each forwarded chunk for the one-way "
        "delay: every exchange, state pull and status call crosses one delayed hop, a request with its answer pays "
        "it twice; DHT lookups go direct. Round = wall time between two merges of a peer; exchange = own delta "
        "ready -> merge (the wait for the other two included); the first round (waiting for every peer to start) "
        f"is left out. Machine: {out['machine']}, shared with other jobs.",
        "",
        "| one-way delay per hop | round s (mean) | round s (median) | exchange s (mean) | exchange s (median) "
        "| participation | round mean vs no delay |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['delay_ms']:g} ms | {r['round_s_mean']:.3f} | {r['round_s_median']:.3f} "
        f"| {r['exchange_s_mean']:.3f} | {r['exchange_s_median']:.3f} | {r['participation_mean']:.2f} "
        f"| {r['round_s_mean'] - base['round_s_mean']:+.3f} s |"
        for r in runs
    ]
    return [
        *lines,
        "",
        "A round trip through a relay of d ms costs at least 2d; the rounds stayed complete (participation 1.0) "
        "and a round gains about one such round trip (a peer's two exchanges run concurrently). The function test, "
        "`python -m pytest -m slow tests/test_netns.py` (run by `.ci/run`): the same namespaces, daemons listening "
        "on 0.0.0.0 and announcing their namespace address (`--announce`), rounds with participation 1.0 across "
        "hosts, `blocktrain status --swarm MULTIADDR` in another namespace listing all three at their addresses; "
        "then the same through 50 ms relays.",
        "",
    ]


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
