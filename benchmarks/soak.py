"""Soak: real daemons (B=2 x K=4 by default) training for an hour while a fault strikes every 1-3 minutes.

The faults (benchmarks.harness.churn, seeded) keep a peer on every block and the swarm between --min-peers and
--max-peers. Read while it runs: /proc of every daemon, the round histories in the checkpoints (splits, stuck rounds)
and, at every sixth of the run, the held-out CE of the model the checkpoints assemble. Writes --out (soak.json) and a
plot beside it (soak.png; skipped without matplotlib).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness.churn import FAULTS, Churn, draw_schedule
from benchmarks.harness.daemons import TINY_CFG, Swarm, add_run_options, start_staggered, tiny
from benchmarks.harness.options import add_outputs, parser
from benchmarks.harness.procs import FIELDS, Sampler, growth
from benchmarks.harness.results import command_line, machine, pyplot, save_figure, write_json
from benchmarks.harness.rounds import RoundLog, splits, stuck_rounds
from swarmd.tools.launch import wait_group_gone

STUCK_FACTOR = 3.0  # a round longer than this many round deadlines is stuck
HEAL_ROUNDS = 3  # a split that lasts more rounds than this is unhealed
WINDOWS = 6  # CE marks and growth windows: sixths of the run (10 minutes of an hour)


def options(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--fault-every", type=float, nargs=2, default=(1.0, 3.0), metavar=("MIN", "MAX"), help="minutes")
    p.add_argument("--peers", type=int, default=8)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--steps", type=int, default=10, help="local steps per round (H)")
    p.add_argument("--min-peers", type=int, default=6)
    p.add_argument("--max-peers", type=int, default=9)
    p.add_argument("--pause-s", type=float, default=30.0)
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between two samples of /proc")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=None, help="keep the daemons' dirs and logs here")
    add_run_options(p, timeout_s=240.0)  # --deadline-max, --eval-tokens, --timeout (a daemon's start)
    add_outputs(p, "soak.json")
    return p.parse_args(argv)


def assembled_ce(sw: Swarm, data_dir: Path, tokens: int) -> dict:
    """Held-out CE of the model assembled from the checkpoints: each block from its peer with the newest round, the
    byte table from block 0's; {"ce": None, "why"} when a block has no loadable checkpoint."""
    from swarmd.core import checkpoint as ck
    from swarmd.errors import SwarmdError
    from swarmd.node.measure import assembled_ce as ce_of

    blocks, rounds, emb = {}, {}, None
    for b in range(sw.model.blocks):
        holders = sorted((Churn.checkpoint_round(p) or -1, p.index) for p in sw.peers if p.block == b)
        for r, i in reversed(holders):
            try:
                blocks[b] = ck.load_block(sw.peers[i].checkpoint_dir, sw.model, b)[0].state_dict()
                emb = emb or ck.load_embedding(sw.peers[i].checkpoint_dir, sw.model).state_dict()
            except SwarmdError:
                continue
            rounds[b] = r
            break
        else:
            return {"ce": None, "why": f"no loadable checkpoint of block {b}"}
    assert emb is not None
    return {"ce": round(ce_of(sw.model, blocks, emb, str(data_dir / "eval.txt"), tokens), 4), "rounds": rounds}


def run(a: argparse.Namespace, workdir: Path) -> dict:
    duration_s, window_s = a.minutes * 60.0, a.minutes * 60.0 / WINDOWS
    warmup_s = window_s / 2  # 5 minutes of an hour
    schedule = draw_schedule(a.seed, duration_s, (a.fault_every[0] * 60, a.fault_every[1] * 60))
    model = replace(TINY_CFG, blocks=a.blocks)
    sw = tiny(a.peers, a.data_dir, workdir, 0, a.steps, a.deadline_max, model=model, seed=a.seed)
    churn = Churn(sw, a.min_peers, a.max_peers, a.pause_s, seed=a.seed)
    sampler, log, marks, ce = Sampler(), RoundLog(), [window_s * k for k in range(1, WINDOWS + 1)], []
    stopped: dict = {}
    pgids: list[int] = []
    try:
        start_staggered(sw, a.timeout)
        sw.config = replace(sw.config, min_peers=1)  # a restart or joiner does not wait for the whole first swarm
        pgids += [p.process.pid for p in sw.peers]
        t0, t0_wall, next_read = time.monotonic(), time.time(), 0.0
        print(f"soak: {len(sw.peers)} daemons up; {len(schedule)} faults in {a.minutes:g} min", flush=True)
        while (t := time.monotonic() - t0) < duration_s or marks:
            sampler.sample({f"peer{p.index}": p.process.pid for p in sw.peers if p.alive()}, t)
            while schedule and schedule[0]["t"] <= t and t < duration_s:
                fault = churn.inject(schedule.pop(0)["kind"], t)
                print(f"soak {t / 60:.1f} min: {fault}", flush=True)
            churn.tick(t)
            if t >= next_read:
                log.read(sw.peers, t0_wall)
                next_read = t + 15.0
            if marks and t >= marks[0]:
                ce.append({"t_min": round(marks.pop(0) / 60, 2), **assembled_ce(sw, a.data_dir, a.eval_tokens)})
                print(f"soak {t / 60:.1f} min: CE {ce[-1]}", flush=True)
            time.sleep(a.sample_s)  # between two samples
        duration = time.monotonic() - t0
        churn.settle(t0, a.timeout)  # the restarts in flight land (and say whether they resumed)
        log.read(sw.peers, t0_wall)
    finally:
        churn.release()
        sw.stop(grace_s=30.0)
        left = {pg: wait_group_gone(pg, 20.0) for pg in [*pgids, *churn.pgids]}
        stopped = {"all_stopped": not any(left.values()), "left": {str(k): v for k, v in left.items() if v}}
    return report(a, sw, churn, sampler, log, ce, duration, warmup_s, window_s, stopped)


def report(a, sw, churn, sampler, log, ce, duration, warmup_s, window_s, stopped) -> dict:
    """The result JSON of a run (see the module doc); `targets` says which of the issue's targets it met."""
    by_block, entries = log.by_block_round(), log.entries.values()
    found = [dict(s, block=b) for b, rounds in by_block.items() for s in splits(rounds, HEAL_ROUNDS)]
    limit_s = STUCK_FACTOR * a.deadline_max
    stuck, excused = stuck_rounds(log.processes(), limit_s, churn.paused)
    series = [s for s in sampler.series.values() if s.samples]
    grown = {w: {s.name: growth(s.values(w), warmup_s, window_s) for s in series} for w in FIELDS}
    pct = lambda g: {k: None if v is None else round(v["pct"], 2) for k, v in g.items()}
    change = lambda g: {k: None if v is None else v["change"] for k, v in g.items()}
    rss, fds, threads = pct(grown["rss_kb"]), change(grown["fds"]), change(grown["threads"])
    out = {
        "command": command_line("soak.py", a.argv),
        "machine": machine(),
        "config": {
            "model": asdict(sw.model),
            "steps_per_round": a.steps,
            "deadline_max_s": a.deadline_max,
            "codec": "int8",
            "batch_size": 8,
            "lr": 3e-3,
            "seed": a.seed,
            "fault_every_min": list(a.fault_every),
            "pause_s": a.pause_s,
            "sample_s": a.sample_s,
            "eval_tokens": a.eval_tokens,
            "fault_kinds": list(FAULTS),
        },
        "windows": {
            "warmup_s": warmup_s,
            "window_s": window_s,
            "note": f"a sixth of the run ({window_s / 60:g} min) per window: growth is the mean of a process's last "
            f"window over its first after a warm-up of {warmup_s / 60:g} min from its start (null: a process too "
            "short for both); CE at the end of every window",
        },
        "duration_s": round(duration, 1),
        "peers": {
            "initial": a.peers,
            "blocks": a.blocks,
            "bounds": [a.min_peers, a.max_peers],
            "started": len(sw.peers),
            "up_at_end": sum(1 for s in series if s.samples[-1][0] >= duration - 2 * a.sample_s),
            "processes": len(series),
            "ids": {str(p.index): p.info.get("peer", "") for p in sw.peers},  # the ids the split groups name
        },
        "faults": churn.faults,
        "rounds": {
            "max_round": max((r for _, r in log.entries), default=0),
            "merged": len(log.entries),
            "per_peer": {str(i): sum(1 for j, _ in log.entries if j == i) for i in range(len(sw.peers))},
        },
        "stuck_limit_s": limit_s,
        "stuck_rounds": stuck,
        "paused_rounds": excused,
        "splits": found,
        "unhealed_splits": [s for s in found if s["unhealed"]],
        "rss_growth_pct": rss,
        "group_rss_growth_pct": pct(grown["group_rss_kb"]),
        "rss_mb": {
            k: v and [round(v["first"] / 1024, 1), round(v["last"] / 1024, 1)] for k, v in grown["rss_kb"].items()
        },
        "fd_growth": fds,
        # the same for the fds that are not sockets: a peer's connections follow the swarm's size, the rest should not
        "other_fd_growth": change(grown["other_fds"]),
        "thread_growth": threads,
        "lost_checkpoints": churn.lost_checkpoints,
        "ce_by_10_min": ce,
        "stopped": stopped,
        # for the plot: at most ~120 samples (t, rss_kb, fds, threads) per process; round ends by peer and process
        "series": {s.name: [[round(x[0]), *x[1:4]] for x in s.samples[:: 1 + len(s.samples) // 120]] for s in series},
        "round_ends": sorted(
            [round(e["t"], 1), e["peer"], e["process"], e["round"], e.get("participation")] for e in entries
        ),
    }
    out["targets"] = targets(out, [c["ce"] for c in ce])
    return out


def targets(out: dict, ces: list) -> dict:
    """Which of the issue's targets a run met."""
    measured = lambda key: [v for v in out[key].values() if v is not None]
    rss, fds, threads = measured("rss_growth_pct"), measured("fd_growth"), measured("thread_growth")
    return {
        "stuck_rounds_0": not out["stuck_rounds"],
        "splits_healed_within_3": not out["unhealed_splits"],
        "rss_growth_le_10_pct": bool(rss) and all(v <= 10 for v in rss),
        "no_fd_growth": bool(fds) and all(v <= 0 for v in fds),
        "no_thread_growth": bool(threads) and all(v <= 0 for v in threads),
        "lost_checkpoints_0": not out["lost_checkpoints"],
        "ce_lower_every_window": None not in ces and all(y < x for x, y in itertools.pairwise(ces)),
    }


def plot(out: dict, path: Path) -> str:
    """CE, round time, RSS and participation over the run, the faults as lines; a note instead without matplotlib."""
    plt = pyplot()
    if plt is None:
        return "matplotlib missing: no plot"
    fig, ax = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    ce = [c for c in out["ce_by_10_min"] if c["ce"] is not None]
    ax[0].plot([c["t_min"] for c in ce], [c["ce"] for c in ce], "o-")
    ends: dict[tuple, list] = {}
    for t, peer, process, _, part in out["round_ends"]:
        ends.setdefault((peer, process), []).append((t, part))
    for rows in ends.values():
        ax[1].plot([t / 60 for t, _ in rows[1:]], [b[0] - a[0] for a, b in itertools.pairwise(rows)], ".", ms=3)
        ax[3].plot([t / 60 for t, _ in rows], [p for _, p in rows], ".", ms=3)
    ax[1].axhline(out["stuck_limit_s"], color="r", lw=0.8)
    for name, rows in out["series"].items():
        ax[2].plot([r[0] / 60 for r in rows], [r[1] / 1024 for r in rows], lw=0.8, label=name)
    labels = ("held-out CE (nats/byte)", "round time (s)", "daemon RSS (MB)", "participation")
    for axis, label in zip(ax, labels):
        axis.set_ylabel(label)
        for f in out["faults"]:
            axis.axvline(f["t"] / 60, color="grey", lw=0.5, ls=":")
    ax[3].set_xlabel("minutes")
    fig.suptitle("soak: " + out["command"], fontsize=8)
    save_figure(fig, path, dpi=90)
    return f"plot: {path}"


def main(argv: list[str] | None = None) -> dict:
    a = options(argv)
    a.argv = argv
    if a.workdir is not None:
        out = run(a, a.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="soak") as tmp:
            out = run(a, Path(tmp))
    write_json(a.out, out)
    print(plot(out, a.out.with_suffix(".png")), flush=True)
    print(f"soak: {a.out}; targets {out['targets']}", flush=True)
    return out


if __name__ == "__main__":
    main()
