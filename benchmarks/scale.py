"""Scale: time to discover peers and complete a round with 3, 6 and 12 daemons on one machine.

Each size runs a LocalSwarm of N daemon processes (`python -m swarmd`) (tiny model, block i mod B, joined
through peer 0's DHT multiaddr, --min-peers N so nobody starts before it sees the whole swarm),
--rounds rounds of --steps local steps. From each peer's checkpoint (config.json) it reads:
discovery_s (daemon start -> DHT lookup shows all N peers; includes starting its DHT node),
the uptime at each merge, and participation. Reported per N: all ready (launcher wall time until
every process printed its address), max discovery time, first round (discovered -> first merge,
max over peers, H local steps included), later rounds (median merge-to-merge time), exchange
time (own delta ready -> merge, median), participation.

    python benchmarks/scale.py --data-dir /work/shared/data/wikitext-2
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common


def parse_args(argv=None):
    p = common.parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[3, 6, 12])
    common.add_schedule(p, rounds=3, steps=5)
    common.add_outputs(p, "scale")
    return p.parse_args(argv)


CFG = common.TINY_CFG


def run_size(a, n: int) -> dict:
    with common.tiny_swarm(f"scale-{n}-", n, a.data_dir, a.rounds, a.steps, deadline_max_s=30.0) as swarm:
        start = time.monotonic()
        try:
            swarm.start(timeout_s=600)
            ready_s = time.monotonic() - start
            finished = swarm.wait(timeout_s=900)
        finally:
            swarm.stop()
        sums = swarm.summaries()
        failed = [p.index for p in swarm.peers if p.proc.returncode != 0]
    if not finished or failed:
        raise SystemExit(f"N={n}: peers {failed} failed or timed out")
    first, later, exchange = [], [], []
    for s in sums:
        hist = sorted(s["history"], key=lambda h: h["round"])
        first.append(hist[0]["at_s"] - s["discovery_s"])
        later += [b["at_s"] - a_["at_s"] for a_, b in itertools.pairwise(hist)]
        exchange += [h["seconds"] for h in hist]
    last_start = max(s["started_wall"] for s in sums) if all("started_wall" in s for s in sums) else None
    lag = max(s["started_wall"] + s["discovery_s"] for s in sums) - last_start if last_start else None
    return {
        "peers": n,
        "discovery_after_last_start_s": lag,
        "all_ready_s": ready_s,
        "discovery_s_max": max(s["discovery_s"] for s in sums),
        "discovery_s_median": statistics.median(s["discovery_s"] for s in sums),
        "first_round_s_max": max(first),
        "round_s_median": statistics.median(later) if later else None,
        "exchange_s_median": statistics.median(exchange),
        "participation": sum(s["participation"] for s in sums) / len(sums),
        "rounds": min(s["round"] for s in sums),
        "bytes_sent_per_peer_round": sum(s["bytes_sent"] for s in sums) / len(sums) / a.rounds,
    }


COLUMNS_NOTE = (
    "discovery after the last peer started: from the last daemon's start until every daemon's DHT lookup "
    "showed all N peers (includes that daemon's own DHT start). discovery s: daemon start until its DHT lookup "
    "shows all N peers (includes starting its own DHT node). first round: from then until its first merge "
    "(H local steps + exchange). "
    "exchange s: own delta ready until merge. With N processes on 2 CPUs the local steps themselves slow down "
    "~N/2 times; the exchange (every peer swaps its embedding delta with every other, block deltas with "
    "same-block peers) grows with N as well."
)


def main(argv=None) -> None:
    a = parse_args(argv)
    rows = []
    for n in a.sizes:
        row = run_size(a, n)
        rows.append(row)
        print(json.dumps(row), flush=True)
    command = common.command_line("scale.py", argv)
    out = {
        "command": command,
        "config": CFG.to_dict(),
        "rounds": a.rounds,
        "steps_per_round": a.steps,
        "rows": rows,
        "machine": common.machine(),
    }
    common.write_json(a.out, out)
    lines = [
        "### Scale: discovery and round time with 3, 6, 12 daemons (one machine)",
        "",
        f"Command: `{command}`",
        "",
        f"Tiny model (B=3, L_b=1, d=32, seq=32, batch 8), {a.rounds} rounds x H={a.steps} steps, int8 codec, "
        f"every daemon a separate process on loopback, all on {out['machine']} (shared with other jobs).",
        "",
        "| daemons | all ready s | discovery s after the last peer started | discovery s (max / median) "
        "| first round s (max) | later rounds s (median) | exchange s (median) | participation "
        "| bytes sent per peer per round |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lag = r["discovery_after_last_start_s"]
        lines.append(
            f"| {r['peers']} | {r['all_ready_s']:.1f} "
            f"| {lag if lag is not None else float('nan'):.2f} "
            f"| {r['discovery_s_max']:.1f} / {r['discovery_s_median']:.1f} | {r['first_round_s_max']:.2f} "
            f"| {r['round_s_median'] or 0:.2f} | {r['exchange_s_median']:.2f} | {r['participation']:.3f} "
            f"| {r['bytes_sent_per_peer_round']:,.0f} |"
        )
    lines += ["", COLUMNS_NOTE, ""]
    common.replace_section(a.md, "scale.py", lines)


if __name__ == "__main__":
    main()
