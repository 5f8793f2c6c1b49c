"""Scale: bytes, round time and discovery with 3, 6, 12 and 24 daemons on one machine; group averaging's quality.

Each size in --sizes runs a LocalSwarm of N daemon processes (tiny model, started a few at a time) averaging in groups
of at most --group-size (0 = all-to-all); the checkpoints give discovery and merge times and participation. Quality
(--quality-daemons): the same swarm trained with groups, then all-to-all; the from-noise CE of the model each replica
set assembles. Writes --out and its section of --md (BENCHMARKS.md).

    python benchmarks/scale.py --data-dir /work/shared/data/wikitext-2
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import daemons, options, results, sweeps
from swarmd.averaging.config import GROUP_LAYOUTS, GossipConfig
from swarmd.errors import SwarmdError

CFG = daemons.TINY_CFG
TRAJECTORY_HELP = "every daemon's TrainConfig.trajectory_prob (default: the model's; 0 = no predecessor pulls)"
WAIT_HELP = "quality runs: every round waits for all expected deltas (up to the 30 s deadline)"
COLUMNS_NOTE = (
    "Peer 0 starts first, then the others 4 at a time, each batch joining through the DHT multiaddrs of peers "
    "already up (24 daemons dialling one DHT at once on 2 loaded cores timed out its pings: three failed starts). "
    "discovery after the last peer started: from the last daemon's start until every daemon's DHT lookup showed "
    "all N peers. discovery s: a daemon's start until its lookup shows all N (both include starting a DHT node). "
    "first round: from then until its first merge (H local steps + exchange). exchange s: own delta ready until "
    "merge. N daemons (and N DHT processes) on 2 shared CPUs slow the steps, the DHT and the exchange ~N/2 times: "
    "round and discovery times grow with N here because the machine does, not only the protocol (the per-peer "
    "bytes are the machine-independent figure)."
)
SIZE_HEAD = (
    "daemons | bytes sent per peer per round | vs the first row | later rounds s (median) "
    "| discovery s after the last peer started | participation | all ready s | discovery s (max / median) "
    "| first round s (max) | exchange s (median)"
)
QUALITY_HEAD = (
    "averaging | CE mean | CE min / max over replica sets | max distance: blocks / tables "
    "| participation | bytes sent per peer per round"
)


def parse_args(argv=None):
    p = options.parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="*", default=[3, 6, 12, 24], help="none: the quality runs only")
    p.add_argument("--group-size", type=int, default=4, help="GossipConfig.group_size of every daemon (0 = all-to-all)")
    p.add_argument("--group-layout", choices=GROUP_LAYOUTS, default=GossipConfig.group_layout)
    options.add_schedule(p, rounds=3, steps=5)
    p.add_argument("--trajectory-prob", type=float, default=None, help=TRAJECTORY_HELP)
    p.add_argument("--quality-daemons", type=int, default=12, help="0 = no quality comparison")
    p.add_argument("--quality-rounds", type=int, default=8)
    p.add_argument("--quality-steps", type=int, default=10)
    p.add_argument("--eval-tokens", type=int, default=4096)
    p.add_argument("--wait-all", action="store_true", help=WAIT_HELP)
    options.add_outputs(p, "scale.json", results.BENCHMARKS)
    options.add_section(p, "scale.py")
    return p.parse_args(argv)


def swarm_of(a, prefix: str, n: int, rounds: int, steps: int, group_size: int, wait_all: bool = False):
    """daemons.tiny_swarm's LocalSwarm, averaging in groups of at most group_size."""
    kw = {} if a.trajectory_prob is None else {"trajectory_prob": a.trajectory_prob}
    kw |= {"group_size": group_size, "group_layout": a.group_layout, "wait_all": wait_all}
    return daemons.tiny_swarm(prefix, n, a.data_dir, rounds, steps, 30.0, **kw)


def retried(what: str, run, tries: int = 3) -> dict:
    """run() again when the swarm fails to start or finish (a DHT bootstrap that times out on a loaded machine);
    the result records how many attempts it took."""
    for attempt in range(1, tries + 1):
        try:
            return {**run(), "attempts": attempt}
        except (SwarmdError, SystemExit) as exc:
            print(f"{what}: attempt {attempt} failed: {str(exc)[:300]}", flush=True)
            if attempt == tries:
                raise
    raise AssertionError("unreachable")


def mean_of(sums: list[dict], key: str) -> float:
    return sum(s[key] for s in sums) / len(sums)


def run_size(a, n: int) -> dict:
    """One size's row: the issue-12 keys (daemons ... participation) and, beside them, the older names of some."""
    with swarm_of(a, f"scale-{n}-", n, a.rounds, a.steps, a.group_size) as swarm:
        ready_s = sweeps.run_to_end(swarm, f"N={n}", start_s=600, wait_s=900, staggered=True)[0]
        sums = swarm.summaries()
    hists, later, exchange = sweeps.round_times(sums)
    last_start = max(s["started_wall"] for s in sums) if all("started_wall" in s for s in sums) else None
    lag = max(s["started_wall"] + s["discovery_s"] for s in sums) - last_start if last_start else None
    round_s, per_round = statistics.median(later) if later else None, mean_of(sums, "bytes_sent") / a.rounds
    return {
        "daemons": n,
        "group_size": a.group_size,
        "bytes_per_peer_round": per_round,
        "round_s": round_s,
        "discovery_s": lag,
        "peers": n,
        "discovery_after_last_start_s": lag,
        "all_ready_s": ready_s,
        "discovery_s_max": max(s["discovery_s"] for s in sums),
        "discovery_s_median": statistics.median(s["discovery_s"] for s in sums),
        "first_round_s_max": max(h[0]["at_s"] - s["discovery_s"] for h, s in zip(hists, sums)),
        "round_s_median": round_s,
        "exchange_s_median": statistics.median(exchange),
        "participation": mean_of(sums, "participation"),
        "rounds": min(s["round"] for s in sums),
        "bytes_sent_per_peer_round": per_round,
    }


def run_quality(a, n: int, group_size: int, eval_xy) -> dict:
    """Train n daemons with this group size; from-noise CE of each replica set's assembled model."""
    from swarmd.averaging.state import relative_distance
    from swarmd.core import checkpoint as ck
    from swarmd.core.evaluate import from_noise_ce

    rounds, steps, B = a.quality_rounds, a.quality_steps, CFG.blocks
    with swarm_of(a, f"scale-q{group_size}-", n, rounds, steps, group_size, a.wait_all) as swarm:
        wall = sweeps.run_to_end(swarm, f"quality run k={group_size}", start_s=600, staggered=True)[1]
        ces = []
        for j in range(n // B):
            peers = [swarm.peers[j * B + b] for b in range(B)]
            blocks = [ck.load_block(p.checkpoint_dir, CFG, p.block)[0] for p in peers]
            ces.append(from_noise_ce(blocks, ck.load_embedding(peers[0].checkpoint_dir, CFG), *eval_xy, CFG)["ce"])
        spread = 0.0
        for b in range(B):
            states = [ck.load_block(p.checkpoint_dir, CFG, b)[0].state_dict() for p in swarm.peers if p.block == b]
            spread = max([spread, *(relative_distance(states[0], s) for s in states[1:])])
        tables = [ck.load_embedding(p.checkpoint_dir, CFG).state_dict() for p in swarm.peers]
        sums = swarm.summaries()
    return {
        "daemons": n,
        "group_size": group_size,
        "group_layout": a.group_layout if group_size else None,
        "rounds": rounds,
        "steps_per_round": steps,
        "ce_mean": statistics.mean(ces),
        "ce_min": min(ces),
        "ce_max": max(ces),
        "ce_per_replica_set": ces,
        "replica_distance_max": spread,
        "table_distance_max": max(relative_distance(tables[0], t) for t in tables[1:]),
        "wait_all": a.wait_all,
        "participation": mean_of(sums, "participation"),
        "bytes_per_peer_round": mean_of(sums, "bytes_sent") / rounds,
        "wall_s": wall,
    }


def main(argv=None) -> None:
    a = parse_args(argv)
    rows, quality = [], []
    for n in a.sizes:
        try:
            row = retried(f"N={n}", lambda n=n: run_size(a, n))
        except (SwarmdError, SystemExit) as exc:  # reported as a failed row; the other sizes still run
            row = {"daemons": n, "group_size": a.group_size, "failed": str(exc)[:500]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.quality_daemons:
        eval_xy = sweeps.eval_windows(a, CFG.seq_len)
        for k in (a.group_size, 0):
            quality.append(retried(f"quality k={k}", lambda k=k: run_quality(a, a.quality_daemons, k, eval_xy)))
            print(json.dumps(quality[-1]), flush=True)
    out = {"command": results.command_line("scale.py", argv), "config": CFG.to_dict(), "rounds": a.rounds}
    out |= {"steps_per_round": a.steps, "group_size": a.group_size, "rows": rows, "quality": quality}
    out["machine"] = results.machine()
    if len(quality) == 2:
        out["quality_ce_groups_minus_all_to_all"] = quality[0]["ce_mean"] - quality[1]["ce_mean"]
    done = [r for r in rows if "failed" not in r]
    base = done[0]["bytes_per_peer_round"] if done else 0
    for r in done:
        r["bytes_vs_first"] = r["bytes_per_peer_round"] / base if base else None
    results.write_json(a.out, out)
    results.replace_section(a.md, a.section, markdown(a, out))


def size_row(r: dict) -> str:
    if "failed" in r:
        return f"{r['daemons']} | failed: {r['failed'][:200]} ||||||||"
    lag = r["discovery_after_last_start_s"]
    return (
        f"{r['daemons']} | {r['bytes_per_peer_round']:,.0f} | {r['bytes_vs_first']:.2f}x "
        f"| {r['round_s_median'] or 0:.2f} | {lag if lag is not None else float('nan'):.2f} "
        f"| {r['participation']:.3f} | {r['all_ready_s']:.1f} "
        f"| {r['discovery_s_max']:.1f} / {r['discovery_s_median']:.1f} | {r['first_round_s_max']:.2f} "
        f"| {r['exchange_s_median']:.2f}"
    )


def quality_row(q: dict) -> str:
    layout = f", {q['group_layout']} layout" if q.get("group_layout") else ""
    name = f"groups of at most {q['group_size']}{layout}" if q["group_size"] else "all-to-all"
    return (
        f"{name} | {q['ce_mean']:.4f} | {q['ce_min']:.4f} / {q['ce_max']:.4f} "
        f"| {q['replica_distance_max']:.1e} / {q.get('table_distance_max', float('nan')):.1e} "
        f"| {q['participation']:.3f} | {q['bytes_per_peer_round']:,.0f}"
    )


def markdown(a, out: dict) -> list[str]:
    rows, quality = out["rows"], out["quality"]
    title = f"### Scale: quality with groups of at most {a.group_size}"
    if rows:
        title = f"### Scale: bytes, round time and discovery with {', '.join(map(str, a.sizes))} daemons (one "
        title += f"machine), groups of at most {a.group_size}"
    parts = [title, f"Command: `{out['command']}`"]
    if rows:
        pulls = f"; trajectory_prob {a.trajectory_prob} (0: no predecessor pulls, the bytes are the averaging's)."
        config = (
            f"Tiny model (B=3, L_b=1, d=32, seq=32, batch 8), {a.rounds} rounds x H={a.steps} steps, int8 codec, "
            f"group averaging with --group-size {a.group_size} (0 = all-to-all), every daemon a separate process "
            f"on loopback, all on {out['machine']} (shared with other jobs)"
        )
        parts += [
            config + ("." if a.trajectory_prob is None else pulls),
            results.table(SIZE_HEAD, map(size_row, rows), "r" * 10),
        ]
        parts.append(COLUMNS_NOTE)
    if quality:
        q0 = quality[0]
        wait = "every round waits for all expected deltas (up to 30 s)"
        parts.append(
            f"Quality, {q0['daemons']} daemons, {q0['rounds']} rounds x H={q0['steps_per_round']}: from-noise CE "
            f"(nats/byte, {a.eval_tokens} bytes of eval.txt) of the model each replica set assembles "
            "(replica j: block b from peer j x B + b); distances: the largest relative distance between two "
            "same-block replicas' blocks, and between two peers' byte tables, at the end; "
            + (wait if a.wait_all else "rounds close at the daemons' adaptive deadlines")
            + "."
        )
        parts.append(results.table(QUALITY_HEAD, map(quality_row, quality)))
    if "quality_ce_groups_minus_all_to_all" in out:
        parts.append(f"CE with groups minus all-to-all: {out['quality_ce_groups_minus_all_to_all']:+.4f} nats.")
    return results.paragraphs(*parts)


if __name__ == "__main__":
    main()
