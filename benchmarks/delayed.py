"""Delayed averaging ("no pause for the network"): the quality cost and the time saved by --overlap.

Quality in the simulator (the daemon's land_merge rule): from-noise CE after every round for each of --seeds,
merging at once vs late by each of --late-steps on the lockstep network (--wan-regime: also on that regime's
simulated clock). Time with real daemons (one block, --daemons replicas on loopback): --repeats runs of each mode,
alternated; a peer's median merge-to-merge time, the first-to-last merge wall time and the trained model's CE.
Writes --out (JSON), --png (CE curves) and --md; see BENCHMARKS.md#delayed.

    python benchmarks/delayed.py --data-dir /work/shared/data/wikitext-2
    python benchmarks/delayed.py --seeds 0 --sim-rounds 2 --steps 2 --late-steps 1 0 --daemon-rounds 3 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from statistics import mean, median, stdev

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.harness import daemons, options, results, sweeps
from swarmd.node.config import peer_train_config
from swarmd.sim.engine import SimConfig, merge_label, simulate
from swarmd.sim.policies import make_policy
from swarmd.sim.regimes import regime_named

DAEMON_CFG = replace(daemons.TINY_CFG, blocks=1)  # one block, --daemons replicas: every round moves both deltas
SIM_SETTINGS = ("blocks", "workers", "d_model", "seq_len", "batch_size", "lr", "steps", "eval_tokens")  # recorded
FROM_HELP = "take the %s part from this saved result JSON"


def parse_args(argv=None) -> argparse.Namespace:
    p = options.parser(__doc__)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="simulator seeds (quality)")
    p.add_argument("--sim-rounds", type=int, default=10)
    p.add_argument("--late-steps", type=int, nargs="+", default=[4, 0], help="steps before a merge lands (0 = H)")
    p.add_argument("--steps", type=int, default=20, help="H of the simulator runs")
    p.add_argument("--workers", type=int, default=2, help="K: simulated replicas per block")
    options.add_shape(p)
    options.add_training(p, eval_tokens=4096, train_bytes=4_000_000)
    p.add_argument("--wan-regime", default="", help="the regime of the simulated-time row ('' = none)")
    p.add_argument("--daemons", type=int, nargs="+", default=[2], help="real daemons (replicas of one block)")
    p.add_argument("--daemon-rounds", type=int, default=12)
    p.add_argument("--daemon-steps", type=int, default=10, help="H of the real daemons")
    p.add_argument("--daemon-late", type=int, nargs="+", default=[0, 2], help="daemons' --overlap-steps (0 = H)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each mode with real daemons (alternated)")
    p.add_argument("--skip-sim", action="store_true")
    p.add_argument("--skip-daemons", action="store_true")
    options.add_outputs(p, "delayed.json", "delayed.md")
    p.add_argument("--png", type=Path, default=results.RESULTS / "delayed.png")
    p.add_argument("--render", type=Path, help="only rewrite --md (and --png) from this saved result JSON")
    p.add_argument("--timing-from", type=Path, help=FROM_HELP % "real-daemon")
    p.add_argument("--quality-from", type=Path, help=FROM_HELP % "simulator")
    p.add_argument("--notes", type=Path, help="markdown lines to end the fragment with (kept in the JSON)")
    return p.parse_args(argv)


# -- 1. quality in the simulator ------------------------------------------------------------------------
def mode(late: int | None, steps: int) -> str:
    if late is None:
        return "merge at once"
    return f"late by {late or steps} steps" + (" (a full round)" if late in (0, steps) else "")


def run_sim(a, data, held_out, late: int | None, seed: int, regime_name: str = "lockstep") -> dict:
    """One simulator run; late = None: merges at once, else the merge lands after `late` of the next round's
    steps (0 = all H). Lockstep waits for every update; a WAN regime uses the daemon's own deadline policy."""
    regime = regime_named(regime_name)
    policy = make_policy("lockstep" if regime_name == "lockstep" else "quantile", regime, a.steps)
    train = peer_train_config(a.steps, batch_size=a.batch_size, lr=a.lr, seed=seed)
    cfg = SimConfig(
        options.model_of(a), train, workers=a.workers, rounds=a.sim_rounds, steps_per_round=a.steps,
        eval_tokens=a.eval_tokens, overlap=late is not None, overlap_steps=late or 0,
    )  # fmt: skip
    started = time.monotonic()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        r = simulate(cfg, regime, policy, data, held_out)
    row = {"late": late, "mode": mode(late, a.steps), "seed": seed, "regime": regime.name, "policy": policy.name}
    row |= {"ce": r.ce, "ce_start": r.ce_start, "sim_wall_s": r.sim_wall_s, "participation": r.participation}
    row["curve"] = [[x.round * a.steps, x.ce] for x in r.rounds if x.ce is not None]
    row["cpu_s"] = time.monotonic() - started
    took = f"ce {r.ce:.4f} sim {r.sim_wall_s:.1f}s ({row['cpu_s']:.0f}s)"
    print(f"sim {regime.name} seed {seed} {row['mode']}: {took}", flush=True)
    return row


def quality(a) -> dict:
    torch.set_num_threads(1)
    data, held_out = sweeps.sim_text(a, a.seq_len)
    rows = []
    for seed in a.seeds:
        for late in [None, *a.late_steps]:
            rows.append(run_sim(a, data, held_out, late, seed))
            results.write_json(a.out.with_suffix(".partial.json"), {"lockstep": rows})  # a stopped run keeps these
    ce = {(r["seed"], r["late"]): r["ce"] for r in rows}
    gaps = {mode(m, a.steps): {str(s): ce[s, m] - ce[s, None] for s in a.seeds} for m in a.late_steps}
    out: dict = {"lockstep": rows, "ce_gap": gaps}  # mode -> seed -> CE late - CE at once
    out["ce_gap_mean"] = {name: mean(g.values()) for name, g in gaps.items()}
    if len(a.seeds) > 1:
        out["ce_gap_stdev"] = {name: stdev(g.values()) for name, g in gaps.items()}
    if a.wan_regime:
        wan = out["wan"] = [run_sim(a, data, held_out, late, a.seeds[0], a.wan_regime) for late in (None, 0)]
        out["wan_time_ratio"] = wan[1]["sim_wall_s"] / wan[0]["sim_wall_s"]
    return out


# -- 2. time with real daemons ------------------------------------------------------------------------
def daemon_mode(late: int | None) -> str:
    return "off" if late is None else "on" if not late else f"on, --overlap-steps {late}"


def run_daemons(a, n: int, late: int | None, eval_xy) -> dict:
    run = dict(deadline_max_s=30.0, model=DAEMON_CFG, swarm_id="delayed", overlap=late is not None)
    with daemons.tiny_swarm(
        f"delayed-{n}-{late}-", n, a.data_dir, a.daemon_rounds, a.daemon_steps, overlap_steps=late or 0, **run
    ) as swarm:
        sweeps.run_to_end(swarm, f"overlap {daemon_mode(late)}", start_s=600, wait_s=1200)
        ce = sweeps.assembled_ce(swarm, eval_xy)
        sums = swarm.summaries()
    hists, between, exchange = sweeps.round_times(sums)
    row = {
        "daemons": n,
        "overlap": late is not None,
        "late": late,
        "mode": daemon_mode(late),
        "rounds_merged": [len(h) for h in hists],
        "round_s_median": median(between),
        "round_s_mean": mean(between),
        "first_to_last_merge_s": median(h[-1]["at_s"] - h[0]["at_s"] for h in hists),
        "exchange_s_median": median(exchange),
        "participation": mean(s["participation"] for s in sums),
        "local_steps": [s.get("local_steps") for s in sums],
        "ce": ce,
    }
    print(
        f"{n} daemons overlap {row['mode']}: round {row['round_s_median']:.3f}s (median), first->last merge "
        f"{row['first_to_last_merge_s']:.2f}s, exchange {row['exchange_s_median']:.3f}s, ce {ce:.4f}, "
        f"participation {row['participation']:.2f}",
        flush=True,
    )
    return row


def timing(a) -> dict:
    eval_xy = sweeps.eval_windows(a, DAEMON_CFG.seq_len)
    out: dict = {"runs": [], "ratios": {}, "ce_off": {}}
    modes: list[int | None] = [None, *a.daemon_late]
    for n in a.daemons:
        runs = [run_daemons(a, n, late, eval_xy) for _ in range(a.repeats) for late in modes]
        out["runs"] += runs
        keys = ("round_s_median", "first_to_last_merge_s", "ce")
        med = {daemon_mode(m): {k: median(r[k] for r in runs if r["late"] == m) for k in keys} for m in modes}
        off = med.pop("off")
        out["ratios"][str(n)] = {m: against_off(x, off) for m, x in med.items()}
        out["ce_off"][str(n)] = off["ce"]
    return out


def against_off(x: dict, off: dict) -> dict:
    """A mode's medians against overlap off's: round and wall time ratios, its CE and the CE gap."""
    return {
        "round_s_ratio": x["round_s_median"] / off["round_s_median"],
        "wall_ratio": x["first_to_last_merge_s"] / off["first_to_last_merge_s"],
        "ce": x["ce"],
        "ce_gap": x["ce"] - off["ce"],
    }


# -- output --------------------------------------------------------------------------------------------
def plot(out: dict, path: Path) -> None:
    if (plt := results.pyplot()) is None:
        return
    rows = out["quality"]["lockstep"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = list(dict.fromkeys(r["mode"] for r in rows))
    for name, colour in zip(names, ("tab:blue", "tab:green", "tab:orange", "tab:red"), strict=False):
        for i, r in enumerate(r for r in rows if r["mode"] == name):
            ax.plot(*zip(*r["curve"], strict=True), color=colour, alpha=0.8, lw=1.2, label=name if i == 0 else None)
    ax.set(xlabel="local steps per worker", ylabel="from-noise CE (nats/byte)")
    ax.set_title(f"Delayed averaging in the simulator ({len(rows) // len(names)} seeds)")
    ax.legend()
    ax.grid(alpha=0.3)
    results.save_figure(fig, path)


def markdown(out: dict) -> list[str]:
    lines = [
        "<!-- delayed -->",
        "## No pause for the network: delayed averaging (`--overlap`)",
        "",
        f"Command: `{out['command']}` (writes `benchmarks/results/delayed.json`, `delayed.png`; "
        "`--render benchmarks/results/delayed.json` rewrites this fragment). Machine: "
        f"{out['machine']}, shared with other jobs.",
        "",
        "With `--overlap` a peer snapshots its round-r delta, then keeps training while the deltas are encoded, "
        "exchanged and merged; the merge lands late with a correction (`live += merged - own delta`, "
        "`swarmd/averaging/delayed.py`), the base (what replicas hash, serve, checkpoint and re-sync on) moves "
        "exactly as without overlap.",
        "",
    ]
    lines += quality_lines(out["quality"]) if out.get("quality") else []
    lines += timing_lines(out) if out.get("timing") else []
    return [*lines, *out.get("notes", []), "<!-- /delayed -->"]


def quality_lines(q: dict) -> list[str]:
    """The simulator part of the fragment."""
    s = q["settings"]
    names = list(dict.fromkeys(r["mode"] for r in q["lockstep"]))
    seeds = list(dict.fromkeys(r["seed"] for r in q["lockstep"]))
    ce = {(r["mode"], r["seed"]): r["ce"] for r in q["lockstep"]}
    lines = [
        "### Quality cost (simulator)",
        "",
        f"B={s['blocks']} blocks x K={s['workers']} replicas, d={s['d_model']}, L_b=1, seq {s['seq_len']}, "
        f"batch {s['batch_size']}, lr {s['lr']}, H={s['steps']}, {s['rounds']} rounds "
        f"({s['rounds'] * s['steps']} steps per worker), int8 deltas, merge {s['merge']}, "
        f"lockstep network; from-noise CE on {s['eval_tokens']} held-out bytes. With overlap each merge lands "
        "after k of the next round's H steps (k = how long the exchange takes, in steps); k = H, a full round, "
        "is the most a daemon ever delays one, so it bounds the cost.",
        "",
    ]
    head = " | ".join(["seed", *(f"CE, {n}" for n in names), *(f"{n} - at once" for n in names[1:])])
    rows = []
    for seed in seeds:
        cells = [f"{ce[(n, seed)]:.4f}" for n in names] + [f"{q['ce_gap'][n][str(seed)]:+.4f}" for n in names[1:]]
        rows.append(" | ".join([str(seed), *cells]))
    lines += [*results.table(head, rows, "r" * (2 * len(names))), ""]
    for n in names[1:]:
        spread = f" (stdev {q['ce_gap_stdev'][n]:.4f} over {len(seeds)} seeds)" if "ce_gap_stdev" in q else ""
        lines.append(f"- {n}: mean gap {q['ce_gap_mean'][n]:+.4f} nats/byte{spread}.")
    steps = [x for x, _ in q["lockstep"][0]["curve"]]
    picks = sorted({steps[0], steps[len(steps) // 4], steps[len(steps) // 2], steps[-1]})
    lines += [
        "",
        "CE over the budget (mean over seeds; every curve is in `delayed.png` and the JSON):",
        "",
    ]
    rows = []
    for n in names:
        curves = [dict(map(tuple, r["curve"])) for r in q["lockstep"] if r["mode"] == n]
        rows.append(" | ".join([n, *(f"{mean(c[x] for c in curves):.4f}" for x in picks)]))
    lines += [*results.table(" | ".join(["steps per worker", *map(str, picks)]), rows), ""]
    if "wan" in q:
        plain, late = q["wan"]
        lines += [
            f"On the `{plain['regime']}` regime (the daemon's {plain['policy']} deadline, seed {plain['seed']}; "
            f"simulated clock): CE {plain['ce']:.4f} at once vs {late['ce']:.4f} {late['mode']}, simulated "
            f"wall time {plain['sim_wall_s']:.1f} s vs {late['sim_wall_s']:.1f} s for the same rounds "
            f"(ratio {q['wan_time_ratio']:.2f}), participation {plain['participation']:.2f} vs "
            f"{late['participation']:.2f}.",
            "",
        ]
    return lines


def timing_lines(out: dict) -> list[str]:
    """The real-daemon part of the fragment (out: the whole result, which names the timing command)."""
    t = out["timing"]
    s = t["settings"]
    lines = [
        "### Time saved (real daemons)",
        "",
        *([f"Command: `{out['timing_command']}`.", ""] if "timing_command" in out else []),
        f"N `python -m swarmd` processes (N = {', '.join(map(str, s['daemons']))}) on loopback (LocalSwarm, "
        f"one block with N replicas, B=1, d=32, seq 32, batch 8, H={s['steps']}, {s['rounds']} rounds, int8), "
        f"the modes alternated, {s['repeats']} runs of each. "
        "Round = a peer's median merge-to-merge time (first round left out); "
        "wall = first to last merge of a peer (median over peers); exchange = own delta ready -> merge.",
        "",
    ]
    rows = [
        f"{i + 1} | {r['daemons']} | {r['mode']} | {r['round_s_median']:.3f} | {r['first_to_last_merge_s']:.2f} "
        f"| {r['exchange_s_median']:.3f} | {r['participation']:.2f} | {r['ce']:.4f}"
        for i, r in enumerate(t["runs"])
    ]
    head = "run | N | overlap | round s (median) | first->last merge s | exchange s (median) | participation"
    lines += [*results.table(f"{head} | from-noise CE", rows, "rrlrrrrr"), ""]
    for n, per_mode in t["ratios"].items():
        for m, r in per_mode.items():
            lines.append(
                f"- N={n}, overlap {m} / off (medians over the runs): round time {r['round_s_ratio']:.2f}, wall "
                f"time for the same rounds {r['wall_ratio']:.2f}; CE {r['ce']:.4f} vs {t['ce_off'][n]:.4f} off "
                f"({r['ce_gap']:+.4f})."
            )
    return [*lines, ""]


def main(argv=None) -> None:
    a = parse_args(argv)
    out = results.rendered_or(a, lambda: run(a, argv))
    if out.get("quality"):
        plot(out, a.png)
    results.write_text(a.md, "\n".join(markdown(out)) + "\n")
    print("\n".join(markdown(out)))


def run(a, argv) -> dict:
    """The result JSON: both parts, each run here or taken from a saved result."""
    out = {"command": results.command_line("delayed.py", argv), "machine": results.machine()}
    if a.quality_from is not None:
        saved = json.loads(a.quality_from.read_text())
        out["quality"], out["command"] = saved["quality"], saved["command"]
    elif not a.skip_sim:
        merge = {"rounds": a.sim_rounds, "merge": merge_label()}
        out["quality"] = quality(a) | {"settings": options.picked(a, SIM_SETTINGS) | merge}
    if a.timing_from is not None:
        saved = json.loads(a.timing_from.read_text())
        out["timing"], out["timing_command"] = saved["timing"], saved["command"]
    elif not a.skip_daemons:
        settings = {"daemons": a.daemons, "rounds": a.daemon_rounds, "steps": a.daemon_steps, "repeats": a.repeats}
        out["timing"] = timing(a) | {"settings": settings}
    if a.notes is not None:
        out["notes"] = a.notes.read_text().splitlines()
    return out


if __name__ == "__main__":
    main()
