"""Delayed averaging (issue 12, "no pause for the network"): quality cost and time saved by --overlap.

Two parts, each side by side in one run (overlap off and on, the same steps):

1. quality, in the simulator (swarmd.sim: real BlockState training, int8 codec + error feedback, the daemon's
   merge; the same land_merge rule the daemon applies, with every merge landing one FULL round late, the most
   a daemon ever delays one): from-noise CE after every round for --seeds seeds, delayed vs not, on the
   lockstep (one data centre) network, so only the delay differs; plus one run on the WAN regime with its
   adaptive deadline, where the simulated clock shows the time the hidden exchange saves;
2. time, with real daemons (`python -m swarmd` processes, LocalSwarm on loopback, tiny model, one block
   with --daemons replicas): --repeats runs of each mode, alternated (off, on, off, on ...) so load drifts hit
   both; per run the median merge-to-merge time of a peer (first round left out) and the wall time from the
   first merge to the last of each peer (median over peers), and the from-noise CE of the trained model.
   Ratios overlap / plain are quoted; absolute seconds depend on the machine's load.

Writes benchmarks/results/delayed.json, delayed.png (CE curves) and benchmarks/results/delayed.md.

    python benchmarks/delayed.py --data-dir /work/shared/data/wikitext-2
    python benchmarks/delayed.py --seeds 0 --sim-rounds 2 --steps 2 --daemon-rounds 3 --repeats 1   # smoke
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.harness import daemons, options, results
from swarmd.core.data import ByteData, load_bytes
from swarmd.core.evaluate import from_noise_ce
from swarmd.node.config import peer_train_config
from swarmd.sim.engine import SimConfig, SimResult, merge_label, simulate
from swarmd.sim.policies import make_policy
from swarmd.sim.regimes import regime_named

DAEMON_CFG = replace(daemons.TINY_CFG, blocks=1)  # one block, --daemons replicas: every round moves both deltas
LATE_HELP = "overlap runs: the next round's steps taken before a merge lands (0 = all H, a full round late)"
DAEMON_LATE_HELP = "overlap runs of the daemons: their --overlap-steps (0 = the whole round)"
SIM_SETTINGS = ("blocks", "workers", "d_model", "seq_len", "batch_size", "lr", "steps", "eval_tokens")  # recorded


def parse_args(argv=None) -> argparse.Namespace:
    p = options.parser(__doc__)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="simulator seeds (quality)")
    p.add_argument("--sim-rounds", type=int, default=10)
    p.add_argument("--late-steps", type=int, nargs="+", default=[4, 0], help=LATE_HELP)
    p.add_argument("--steps", type=int, default=20, help="H of the simulator runs")
    p.add_argument("--workers", type=int, default=2, help="K: simulated replicas per block")
    options.add_shape(p)
    options.add_training(p, eval_tokens=4096, train_bytes=4_000_000)
    p.add_argument("--wan-regime", default="", help="the regime of the simulated-time row ('' = none)")
    p.add_argument("--daemons", type=int, nargs="+", default=[2], help="real daemons (replicas of one block)")
    p.add_argument("--daemon-rounds", type=int, default=12)
    p.add_argument("--daemon-steps", type=int, default=10, help="H of the real daemons")
    p.add_argument("--daemon-late", type=int, nargs="+", default=[0, 2], help=DAEMON_LATE_HELP)
    p.add_argument("--repeats", type=int, default=2, help="runs of each mode with real daemons (alternated)")
    p.add_argument("--skip-sim", action="store_true")
    p.add_argument("--skip-daemons", action="store_true")
    options.add_outputs(p, "delayed.json", "delayed.md")
    p.add_argument("--png", type=Path, default=results.RESULTS / "delayed.png")
    p.add_argument("--render", type=Path, help="only rewrite --md (and --png) from this saved result JSON")
    p.add_argument("--timing-from", type=Path, help="take the real-daemon part from this saved result JSON")
    p.add_argument("--quality-from", type=Path, help="take the simulator part from this saved result JSON")
    p.add_argument("--notes", type=Path, help="markdown lines to end the fragment with (kept in the JSON)")
    return p.parse_args(argv)


# -- 1. quality in the simulator ------------------------------------------------------------------------
def sim_config(a, late: int | None, seed: int) -> SimConfig:
    """The simulator's config; late = None: merges at once, else overlap with the merge landing after `late`
    of the next round's steps (0 = all H: a full round late)."""
    model, train = options.model_of(a), peer_train_config(a.steps, batch_size=a.batch_size, lr=a.lr, seed=seed)
    return SimConfig(
        model, train, workers=a.workers, rounds=a.sim_rounds, steps_per_round=a.steps, eval_tokens=a.eval_tokens,
        overlap=late is not None, overlap_steps=late or 0,
    )  # fmt: skip


def mode(late: int | None, steps: int) -> str:
    if late is None:
        return "merge at once"
    return f"late by {late or steps} steps" + (" (a full round)" if late in (0, steps) else "")


def run_sim(a, data, held_out, late: int | None, seed: int, regime_name: str = "lockstep") -> dict:
    regime = regime_named(regime_name)
    # lockstep: every update waited for; a WAN regime: the daemon's own deadline policy (participation target)
    policy = make_policy("lockstep" if regime_name == "lockstep" else "quantile", regime, a.steps)
    started = time.monotonic()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        result: SimResult = simulate(sim_config(a, late, seed), regime, policy, data, held_out)
    row = {
        "late": late,
        "mode": mode(late, a.steps),
        "seed": seed,
        "regime": regime.name,
        "policy": policy.name,
        "ce": result.ce,
        "ce_start": result.ce_start,
        "sim_wall_s": result.sim_wall_s,
        "participation": result.participation,
        "curve": [[r.round * a.steps, r.ce] for r in result.rounds if r.ce is not None],
        "cpu_s": time.monotonic() - started,
    }
    print(
        f"sim {regime.name} seed {seed} {row['mode']}: ce {row['ce']:.4f} sim {row['sim_wall_s']:.1f}s "
        f"({row['cpu_s']:.0f}s)",
        flush=True,
    )
    return row


def quality(a) -> dict:
    torch.set_num_threads(1)
    data = ByteData(load_bytes(a.data_dir / "train.txt")[: a.train_bytes], a.seq_len)
    held_out = ByteData(load_bytes(a.data_dir / "eval.txt"), a.seq_len)
    modes: list[int | None] = [None, *a.late_steps]
    rows = []
    for seed in a.seeds:
        for late in modes:
            rows.append(run_sim(a, data, held_out, late, seed))
            results.write_json(a.out.with_suffix(".partial.json"), {"lockstep": rows})  # a stopped run keeps these
    gaps: dict[str, dict[str, float]] = {}  # mode -> seed -> CE late - CE at once
    for late in a.late_steps:
        name = mode(late, a.steps)
        gaps[name] = {}
        for seed in a.seeds:
            plain, delayed = (next(r for r in rows if r["seed"] == seed and r["late"] == m) for m in (None, late))
            gaps[name][str(seed)] = delayed["ce"] - plain["ce"]
    out: dict = {"lockstep": rows, "ce_gap": gaps}
    out["ce_gap_mean"] = {name: statistics.mean(g.values()) for name, g in gaps.items()}
    if len(a.seeds) > 1:
        out["ce_gap_stdev"] = {name: statistics.stdev(g.values()) for name, g in gaps.items()}
    if a.wan_regime:
        wan = [run_sim(a, data, held_out, late, a.seeds[0], a.wan_regime) for late in (None, 0)]
        out["wan"] = wan
        out["wan_time_ratio"] = wan[1]["sim_wall_s"] / wan[0]["sim_wall_s"]
    return out


# -- 2. time with real daemons ------------------------------------------------------------------------
def daemon_mode(late: int | None) -> str:
    return "off" if late is None else "on" if not late else f"on, --overlap-steps {late}"


def run_daemons(a, n: int, late: int | None, eval_xy) -> dict:
    overlap = late is not None
    with daemons.tiny_swarm(
        f"delayed-{n}-{late}-",
        n,
        a.data_dir,
        a.daemon_rounds,
        a.daemon_steps,
        deadline_max_s=30.0,
        model=DAEMON_CFG,
        swarm_id="delayed",
        overlap=overlap,
        overlap_steps=late or 0,
    ) as swarm:
        try:
            swarm.start(timeout_s=600)
            finished = swarm.wait(timeout_s=1200)
        finally:
            swarm.stop()
        daemons.check_exit(swarm, finished, f"overlap {daemon_mode(late)}")
        blocks, emb = swarm.assemble()
        ce = float(from_noise_ce(blocks, emb, *eval_xy, DAEMON_CFG)["ce"])
        sums = swarm.summaries()
    hists = [sorted(s["history"], key=lambda h: h["round"]) for s in sums]
    between = [y["at_s"] - x["at_s"] for h in hists for x, y in itertools.pairwise(h)]
    row = {
        "daemons": n,
        "overlap": overlap,
        "late": late,
        "mode": daemon_mode(late),
        "rounds_merged": [len(h) for h in hists],
        "round_s_median": statistics.median(between),
        "round_s_mean": statistics.mean(between),
        "first_to_last_merge_s": statistics.median(h[-1]["at_s"] - h[0]["at_s"] for h in hists),
        "exchange_s_median": statistics.median(x["seconds"] for h in hists for x in h),
        "participation": statistics.mean(s["participation"] for s in sums),
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
    eval_xy = ByteData.from_path(a.data_dir / "eval.txt", DAEMON_CFG.seq_len).eval_windows(a.eval_tokens)
    out: dict = {"runs": [], "ratios": {}}
    modes: list[int | None] = [None, *a.daemon_late]
    for n in a.daemons:
        runs = [run_daemons(a, n, late, eval_xy) for _ in range(a.repeats) for late in modes]
        by = {daemon_mode(m): [r for r in runs if r["late"] == m] for m in modes}

        def med(key: str, m: str) -> float:
            return statistics.median(r[key] for r in by[m])  # noqa: B023 (used at once)

        out["runs"] += runs
        out["ratios"][str(n)] = {
            m: {
                "round_s_ratio": med("round_s_median", m) / med("round_s_median", "off"),
                "wall_ratio": med("first_to_last_merge_s", m) / med("first_to_last_merge_s", "off"),
                "ce": med("ce", m),
                "ce_gap": med("ce", m) - med("ce", "off"),
            }
            for m in by
            if m != "off"
        }
        out["ce_off"] = {**out.get("ce_off", {}), str(n): med("ce", "off")}
    return out


# -- output --------------------------------------------------------------------------------------------
def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = out["quality"]["lockstep"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = list(dict.fromkeys(r["mode"] for r in rows))
    for name, colour in zip(names, ("tab:blue", "tab:green", "tab:orange", "tab:red"), strict=False):
        for i, r in enumerate(r for r in rows if r["mode"] == name):
            xs, ys = zip(*r["curve"], strict=True)
            ax.plot(xs, ys, color=colour, alpha=0.8, lw=1.2, label=name if i == 0 else None)
    ax.set_xlabel("local steps per worker")
    ax.set_ylabel("from-noise CE (nats/byte)")
    ax.set_title(f"Delayed averaging in the simulator ({len(rows) // len(names)} seeds)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def markdown(out: dict) -> list[str]:
    lines = ["<!-- delayed -->", "## No pause for the network: delayed averaging (`--overlap`)", ""]
    lines += [
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
    if out.get("quality"):
        lines += quality_lines(out["quality"])
    if out.get("timing"):
        lines += timing_lines(out)
    lines += out.get("notes", [])
    lines.append("<!-- /delayed -->")
    return lines


def quality_lines(q: dict) -> list[str]:
    """The simulator part of the fragment."""
    s = q["settings"]
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
    names = list(dict.fromkeys(r["mode"] for r in q["lockstep"]))
    seeds = list(dict.fromkeys(r["seed"] for r in q["lockstep"]))
    ce = {(r["mode"], r["seed"]): r["ce"] for r in q["lockstep"]}
    lines += [
        "| seed | " + " | ".join(f"CE, {n}" for n in names) + " | "
        + " | ".join(f"{n} - at once" for n in names[1:]) + " |",
        "|---:|" + "---:|" * (2 * len(names) - 1),
    ]  # fmt: skip
    for seed in seeds:
        cells = [f"{ce[(n, seed)]:.4f}" for n in names]
        cells += [f"{q['ce_gap'][n][str(seed)]:+.4f}" for n in names[1:]]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    lines.append("")
    for n in names[1:]:
        spread = f" (stdev {q['ce_gap_stdev'][n]:.4f} over {len(seeds)} seeds)" if "ce_gap_stdev" in q else ""
        lines.append(f"- {n}: mean gap {q['ce_gap_mean'][n]:+.4f} nats/byte{spread}.")
    steps = [x for x, _ in q["lockstep"][0]["curve"]]
    picks = sorted({steps[0], steps[len(steps) // 4], steps[len(steps) // 2], steps[-1]})
    lines += [
        "",
        "CE over the budget (mean over seeds; every curve is in `delayed.png` and the JSON):",
        "",
        "| steps per worker | " + " | ".join(str(x) for x in picks) + " |",
        "|---|" + "---:|" * len(picks),
    ]
    for n in names:
        rows = [r for r in q["lockstep"] if r["mode"] == n]
        means = [statistics.mean(dict(map(tuple, r["curve"]))[x] for r in rows) for x in picks]
        lines.append(f"| {n} | " + " | ".join(f"{m:.4f}" for m in means) + " |")
    lines.append("")
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
        "| run | N | overlap | round s (median) | first->last merge s | exchange s (median) | participation "
        "| from-noise CE |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(t["runs"]):
        lines.append(
            f"| {i + 1} | {r['daemons']} | {r['mode']} | {r['round_s_median']:.3f} "
            f"| {r['first_to_last_merge_s']:.2f} | {r['exchange_s_median']:.3f} | {r['participation']:.2f} "
            f"| {r['ce']:.4f} |"
        )
    lines.append("")
    for n, per_mode in t["ratios"].items():
        for m, r in per_mode.items():
            lines.append(
                f"- N={n}, overlap {m} / off (medians over the runs): round time {r['round_s_ratio']:.2f}, wall "
                f"time for the same rounds {r['wall_ratio']:.2f}; CE {r['ce']:.4f} vs {t['ce_off'][n]:.4f} off "
                f"({r['ce_gap']:+.4f})."
            )
    lines.append("")
    return lines


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
        q = quality(a)
        q["settings"] = options.picked(a, SIM_SETTINGS) | {"rounds": a.sim_rounds, "merge": merge_label()}
        out["quality"] = q
    if a.timing_from is not None:
        saved = json.loads(a.timing_from.read_text())
        out["timing"], out["timing_command"] = saved["timing"], saved["command"]
    elif not a.skip_daemons:
        t = timing(a)
        t["settings"] = {
            "daemons": a.daemons, "rounds": a.daemon_rounds, "steps": a.daemon_steps, "repeats": a.repeats
        }  # fmt: skip
        out["timing"] = t
    if a.notes is not None:
        out["notes"] = a.notes.read_text().splitlines()
    return out


if __name__ == "__main__":
    main()
