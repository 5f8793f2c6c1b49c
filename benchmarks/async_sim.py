"""Asynchronous network simulator sweep: the litepaper's Tables 4/5 at CPU scale, and deadline policies.

swarmd.sim (real training, int8 codec + error feedback, the daemon's deadline policy and merge; only the network and
the clock simulated) on every regime preset with its own policy, then the deadline policies on the WAN network, each
until lockstep's simulated wall time. Writes --out (`regimes`, `policies`, `target`, the per-round histories),
async_regimes.png, async_policies.png and its section of --md (BENCHMARKS.md#async_sim).

    python benchmarks/async_sim.py                       # the full sweep (~15-25 min on the 2-core machine)
    python benchmarks/async_sim.py --rounds 2 --steps 2  # a smoke run
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.harness import options, results, sweeps
from swarmd.averaging.config import GossipConfig
from swarmd.core.config import ModelConfig
from swarmd.node.config import peer_train_config
from swarmd.protocol import Codec
from swarmd.sim.engine import RoundRecord, SimConfig, SimResult, merge_fn, merge_label, simulate
from swarmd.sim.policies import DEFAULT_TARGET, make_policy, regime_policy
from swarmd.sim.regimes import PRESETS, WAN_REGIMES

CE_TOLERANCE = 0.02  # the target: lockstep's final CE within this ...
TIME_FRACTION = 0.5  # ... in at most this fraction of lockstep's simulated wall time
TRIM_HELP = "the robust merge's trim fraction (default: the daemon's GossipConfig; --add-targets: the stored run's)"
ADD_HELP = "only run the quantile policy at these extra targets, added to --out's JSON (its other runs reused)"
WAN = WAN_REGIMES[1]  # the network the policies share


def parse(argv: list[str] | None):
    p = options.parser(__doc__)
    options.add_schedule(p, 12, 20, steps_help="H: local steps per round", rounds_help="rounds of every regime row")
    p.add_argument("--workers", type=int, default=3, help="K: virtual workers per block")
    options.add_shape(p, blocks=ModelConfig.blocks, layers_per_block=1)
    options.add_training(p, lr=None, eval_tokens=4096, train_bytes=4_000_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--targets", default=f"{DEFAULT_TARGET}", help="quantile policy targets, comma-separated")
    p.add_argument("--trim-fraction", type=float, help=TRIM_HELP)
    p.add_argument("--report-only", action="store_true", help="rewrite the plots and markdown of --out, run nothing")
    p.add_argument("--add-targets", default="", help=ADD_HELP)
    p.add_argument("--max-policy-rounds", type=int, default=0, help="cap on a policy run's rounds (0 = 1.5 x --rounds)")
    options.add_outputs(p, "async_sim.json", results.BENCHMARKS)
    return p.parse_args(argv)


def run_one(cfg: SimConfig, gossip: GossipConfig, regime_name: str, policy_name: str, text: tuple, until_s=None):
    """One run with gossip's merge on text (training, held-out); policy_name "quantile-T" is the quantile policy
    with participation target T."""
    regime = PRESETS[regime_name]
    kind, _, target = policy_name.partition("-")
    policy = make_policy(kind, regime, cfg.steps_per_round, float(target or DEFAULT_TARGET))
    start = time.perf_counter()
    r = simulate(cfg, regime, policy, *text, until_s=until_s, merge=merge_fn(gossip))
    took = time.perf_counter() - start
    print(
        f"{regime_name:15s} {policy_name:9s} ce {r.ce_start:.4f} -> {r.ce:.4f}  participation {r.participation:.3f}"
        f"  sim {r.sim_wall_s:8.1f}s  {r.wire_bytes / 1e6:7.2f} MB  rounds {len(r.rounds):2d}  ({took:.0f}s real)",
        flush=True,
    )
    return r, took


def from_history(key: str, seed: int, ce_start: float, history: list[dict]) -> SimResult:
    """A stored run (the JSON's history["regime/policy"]) as a SimResult."""
    regime, policy = key.split("/")
    names = {f.name for f in fields(RoundRecord)}
    return SimResult(
        regime, policy, seed, ce_start, [RoundRecord(**{k: r[k] for k in r if k in names}) for r in history]
    )


def time_to(result: SimResult, ce: float) -> float | None:
    """First simulated time at which the measured CE is at most ce (None: never)."""
    return next((t for t, c in result.curve() if c <= ce), None)


def regime_table() -> list[str]:
    rows = []
    for r in PRESETS.values():
        deadline = "none (lockstep)" if r.deadline is None else f"{r.deadline:g}"
        rows.append(
            f"{r.name} | {r.compute_s.median:g}, {r.compute_s.sigma:g} | {r.latency_s.median:g}, {r.latency_s.sigma:g}"
            f" | {r.bandwidth_Bps.median / 1e3:g}, {r.bandwidth_Bps.sigma:g} | {r.dropout:g} | {deadline} | {r.about}"
        )
    head = "regime | compute s/step (median, σ) | one-way latency s (median, σ) | upload kB/s (median, σ) | dropout | "
    return results.table(head + "deadline (x H·compute median) | what it stands for", rows, "l" * 7)


def plots(out: dict, regimes_png: Path, policies_png: Path) -> list[str]:
    if (plt := results.pyplot()) is None:
        return []
    rows = out["regimes"]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    panels = {
        "ce": "final from-noise CE (nats/byte)",
        "participation": "participation",
        "sim_wall_s": "simulated wall time (s)",
        "wire_bytes": "bytes moved (MB)",
    }
    for ax, (key, label) in zip(axes, panels.items()):
        values = [r[key] / 1e6 if key == "wire_bytes" else r[key] for r in rows]
        ax.bar(range(len(rows)), values, color="tab:blue")
        ax.set_xticks(range(len(rows)), [r["name"] for r in rows], rotation=45, ha="right")
        ax.set_title(label)
        if key == "ce":  # zoomed on the learners; a bar that did not learn is cut and labelled
            learned = [v for v in values if v < out["ce_start"] - 0.5] or values
            top = max(learned) + 0.05
            ax.set_ylim(min(learned) - 0.05, top)
            for i, v in enumerate(values):
                cut = v > top
                text = f"{v:.2f}\n(initial\n{out['ce_start']:.2f})" if cut else f"{v:.3f}"
                y, va = (top - 0.01, "top") if cut else (v + 0.002, "bottom")
                ax.text(i, y, text, ha="center", va=va, fontsize=7)
    fig.suptitle(f"regimes, {out['rounds']} rounds x H={out['steps']}, B={out['blocks']} x K={out['workers']} workers")
    results.save_figure(fig, regimes_png)

    fig, ax = plt.subplots(figsize=(8, 5))
    lock = out["target"]
    for run in out["policy_curves"]:
        wide = run["policy"] == "lockstep"  # drawn wide and dashed: the adaptive curve may lie on it
        label = f"{run['policy']} ({run['label']})"
        ax.plot(*zip(*run["curve"]), marker=".", lw=4 if wide else 1.5, ls="--" if wide else "-", label=label)
    ax.axhline(lock["lockstep_ce"] + CE_TOLERANCE, color="grey", ls=":", label=f"lockstep final CE + {CE_TOLERANCE}")
    ax.axvline(TIME_FRACTION * lock["lockstep_wall_s"], color="grey", ls="--", label=f"{TIME_FRACTION} x lockstep time")
    ax.set(xlabel="simulated wall time (s)", ylabel="from-noise CE (nats/byte)")
    ax.set_ylim(lock["lockstep_ce"] - 0.1, lock["lockstep_ce"] + 0.8)
    ax.set_title("deadline policies on the WAN network")
    ax.legend(fontsize=8)
    results.save_figure(fig, policies_png)
    return [str(regimes_png), str(policies_png)]


def markdown(out: dict) -> list[str]:
    took = "; ".join(f"`{c}`: {t / 60:.1f} min" for c, t in out["real_s_parts"])
    t = out["target"]
    lines = [
        f"Commands and real time ({out['machine']}, one torch thread): {took}.",
        "",
        f"Model: B={out['blocks']}, L_b={out['layers_per_block']}, d={out['d_model']}, seq {out['seq_len']}, batch "
        f"{out['batch_size']} (every other ModelConfig/TrainConfig option at the project default), K={out['workers']} "
        f"workers per block, H={out['steps']} local steps, codec {out['codec']}, merge `{out['merge']}`, seed "
        f"{out['seed']}; initial from-noise CE {out['ce_start']:.4f}.",
        "",
    ]
    base = next(r["ce"] for r in out["regimes"] if r["name"] == "lockstep")
    rows = [
        f"{r['name']} | {r['policy']} | {r['ce']:.4f} | {r['ce'] - base:+.4f} | {r['participation']:.2f} | "
        f"{r['sim_wall_s']:.1f} | {r['wire_bytes'] / 1e6:.2f}"
        for r in out["regimes"]
    ]
    head = "regime | policy | final CE | Δ vs lockstep | participation | simulated wall s | MB moved"
    lines += [*results.table(head, rows, "l" * 7), ""]
    lines.append(
        f"Deadline policies on the WAN network (wan-* rows share it; lockstep's final CE {t['lockstep_ce']:.4f} at "
        f"{t['lockstep_wall_s']:.1f} s; target: CE <= {t['lockstep_ce'] + CE_TOLERANCE:.4f} by "
        f"{TIME_FRACTION * t['lockstep_wall_s']:.1f} s):"
    )
    rows = []
    for r in out["policies"]:
        s = r["time_to_target_s"]
        reach = "never" if s is None else f"{s:.1f} ({s / t['lockstep_wall_s']:.2f}x)"
        ce = f"{r['ce']:.4f} | {r['participation']:.2f} | {r['sim_wall_s']:.1f}"
        rows.append(f"{r['policy']} | {r['regime']} | {r['rounds']} | {ce} | {reach}")
    head = "policy | regime | rounds | final CE | participation | simulated wall s"
    lines += ["", *results.table(f"{head} | first time CE <= target, s (x lockstep)", rows, "l" * 7), ""]
    lines.append(f"Policies meeting the target: {', '.join(t['winners']) or 'none'}.")
    if (fastest := t["fastest"]) is not None:
        s = fastest["time_to_target_s"]
        lines.append(
            f"Fastest to lockstep's CE + {CE_TOLERANCE} (lockstep itself aside): {fastest['policy']}, "
            f"{s:.1f} s ({s / t['lockstep_wall_s']:.2f}x lockstep)."
        )
    return lines


def earlier_runs(args, sims: dict, real: dict) -> dict:
    """With --add-targets or --report-only: --out's stored result, its runs put in sims and their real seconds in
    real ({} otherwise); --trim-fraction defaults to its merge's."""
    if not (args.add_targets or args.report_only):
        return {}
    prev = json.loads(args.out.read_text())
    if args.trim_fraction is None:
        args.trim_fraction = prev.get("trim_fraction")
    for key, history in prev["history"].items():
        sims[tuple(key.split("/"))] = from_history(key, prev["seed"], prev["ce_start"], history)
    real |= {tuple(k.split("/")): v for k, v in prev.get("real_s_per_run", {}).items()}
    real |= {(r["name"], r["policy"]): r["real_s"] for r in prev["regimes"]}
    return prev


def policy_rows(sims: dict, quantiles: list[str], lock: SimResult) -> tuple[list[dict], list[dict]]:
    """The deadline policies per WAN regime (the fixed policy's run is the regime's own, the rest share the WAN
    run) against the target, and the curves drawn."""
    policies, curves = [], []
    for regime in WAN_REGIMES:
        for policy in ("lockstep", "fixed", "adaptive", *quantiles):
            r = sims[regime, policy] if policy == "fixed" else sims[WAN, policy]
            reach = time_to(r, lock.ce + CE_TOLERANCE)
            row = {"policy": policy, "regime": regime, "ce": r.ce, "participation": r.participation}
            row |= {"sim_wall_s": r.sim_wall_s, "rounds": len(r.rounds), "time_to_target_s": reach}
            row["meets_target"] = reach is not None and reach <= TIME_FRACTION * lock.sim_wall_s
            policies.append(row | {"shared_run": policy != "fixed"})
            if policy == "fixed" or regime == WAN:
                curves.append({"policy": policy, "label": regime if policy == "fixed" else "WAN", "curve": r.curve()})
    return policies, curves


def label(p: dict) -> str:
    return p["policy"] + (f" ({p['regime']})" if p["policy"] == "fixed" else "")


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    torch.set_num_threads(1)
    model = options.model_of(args)
    train = peer_train_config(args.steps, batch_size=args.batch_size, seed=args.seed)
    cfg = SimConfig(
        model, train, workers=args.workers, rounds=args.rounds, steps_per_round=args.steps,
        codec=GossipConfig().codec, eval_tokens=args.eval_tokens,
    )  # fmt: skip
    text = sweeps.sim_text(args, model.seq_len)
    start = time.perf_counter()
    sims: dict[tuple[str, str], SimResult] = {}
    real: dict[tuple[str, str], float] = {}
    policy_cfg = replace(cfg, rounds=args.max_policy_rounds or (3 * args.rounds + 1) // 2)
    quantiles = [f"quantile-{float(t):g}" for t in args.targets.split(",")]
    this = results.command_line("async_sim.py", argv)
    command, prev = this, earlier_runs(args, sims, real)
    gossip = GossipConfig() if args.trim_fraction is None else GossipConfig(trim_fraction=args.trim_fraction)
    if prev:  # reuse the stored runs (add quantile targets)
        quantiles = [p for p in dict.fromkeys(r["policy"] for r in prev["policies"]) if p.startswith("quantile-")]
        added = [f"quantile-{float(t):g}" for t in filter(None, args.add_targets.split(","))]
        quantiles += added
        lock = sims[WAN, "lockstep"]
        command = prev["command"] if args.report_only else f"{prev['command']} && {this}"
    else:
        for name, regime in PRESETS.items():
            policy = regime_policy(regime)
            sims[name, policy], real[name, policy] = run_one(cfg, gossip, name, policy, text)
        # the policies on the WAN network, each until lockstep's simulated wall time (or the round cap)
        lock, real[WAN, "lockstep"] = run_one(cfg, gossip, WAN, "lockstep", text)
        sims[WAN, "lockstep"] = lock
        added = ["adaptive", *quantiles]
    for policy in added:
        sims[WAN, policy], real[WAN, policy] = run_one(policy_cfg, gossip, WAN, policy, text, lock.sim_wall_s)
    regimes = [
        {"name": name, "policy": policy, "ce": r.ce, "participation": r.participation, "sim_wall_s": r.sim_wall_s}
        | {"wire_bytes": r.wire_bytes, "real_s": real.get((name, policy))}
        for (name, policy), r in sorted(sims.items(), key=lambda kv: list(PRESETS).index(kv[0][0]))
        if policy == regime_policy(PRESETS[name]) and not (name == WAN and policy == "lockstep")
    ]
    policies, curves = policy_rows(sims, quantiles, lock)
    winners = sorted({label(p) for p in policies if p["meets_target"]})
    reached = [p for p in policies if p["time_to_target_s"] is not None and p["policy"] != "lockstep"]
    fastest = min(reached, key=lambda p: p["time_to_target_s"], default=None)
    took = 0.0 if args.report_only else time.perf_counter() - start
    parts = prev.get("real_s_parts", [[prev["command"], prev["real_s"]]]) if prev else []
    out = {
        "command": command,
        "machine": results.machine(),
        "real_s": prev.get("real_s", 0.0) + took,
        "real_s_parts": parts if args.report_only else [*parts, [this, took]],
        "real_s_per_run": {f"{name}/{policy}": s for (name, policy), s in real.items()},
        "seed": args.seed,
        "rounds": args.rounds,
        "steps": args.steps,
        "workers": args.workers,
        **{k: getattr(model, k) for k in ("blocks", "d_model", "layers_per_block", "seq_len")},
        "batch_size": args.batch_size,
        "codec": Codec(cfg.codec).value,
        "merge": merge_label(gossip),
        "trim_fraction": gossip.trim_fraction,
        "quantile_targets": [float(q.split("-")[1]) for q in quantiles],
        "model_config": model.to_dict(),
        "train_config": cfg.train.to_dict(),
        "ce_start": lock.ce_start,
        "regime_specs": {name: r.to_dict() for name, r in PRESETS.items()},
        "regimes": regimes,
        "policies": policies,
        "policy_curves": curves,
        "target": {
            "lockstep_ce": lock.ce,
            "lockstep_wall_s": lock.sim_wall_s,
            "ce_tolerance": CE_TOLERANCE,
            "time_fraction": TIME_FRACTION,
            "winners": winners,
            "fastest": fastest and {"policy": label(fastest), "time_to_target_s": fastest["time_to_target_s"]},
        },
        "history": {f"{name}/{policy}": r.to_dict()["history"] for (name, policy), r in sims.items()},
    }
    results.write_json(args.out, out)  # before the plots: a plotting failure keeps the measurements
    out["plots"] = plots(out, args.out.with_name("async_regimes.png"), args.out.with_name("async_policies.png"))
    results.write_json(args.out, out)
    results.replace_section(args.md, "async_sim", [*regime_table(), "", *markdown(out)])
    met = ", ".join(winners) or "none"
    print(f"wrote {args.out} and {args.md} in {out['real_s'] / 60:.1f} min; target met by: {met}")
    return out


if __name__ == "__main__":
    main()
