"""Replica efficiency in the simulator: outer optimizer and learning-rate scaling sweeps, and sync DP beside the swarm.

swarmd.sim runs benchmarks/swarm.py's model and schedule (lockstep network: every delta accepted). Each variant of
--variants (parse_variant) gets its replica efficiency against one replica at 1x, 2x and 4x the rounds. --sync-dp:
per K of --ks, each swarm of --swarm-variants beside one replica per block at K x --batch-size (best of --sync-lrs),
a "sync_dp" row each (K, steps_per_replica, ce, sync_dp_ce, excess_pct); every run is kept in "sync_dp_runs" and read,
not rerun, later (--sweeps-from). --report rewrites --md from --out (with --merge: other runs' sync-DP rows). Writes
--out (JSON) and --md's section; see BENCHMARKS.md#replica_sim.

    python benchmarks/replica_sim.py --variants K=2,outer=none K=2,outer=nesterov K=4,outer=nesterov,lr=2
    python benchmarks/replica_sim.py --sync-dp --ks 2 4 8 --sync-lrs 1,1.41,2 --rounds 64   # 1,600 steps per replica
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import options, results
from swarmd.averaging.config import GossipConfig
from swarmd.core.data import ByteData
from swarmd.node.config import peer_train_config
from swarmd.protocol import Codec
from swarmd.sim.engine import SimConfig, Simulator
from swarmd.sim.policies import make_policy
from swarmd.sim.regimes import regime_named

VARIANT_KEYS = {"K": int, "outer": str, "olr": float, "mom": float, "lr": float, "H": int, "ra": int}
VARIANT_KEYS |= {"codec": str, "merge": str, "m1": int, "m2": int, "tp": float, "pp": int, "rg": int}
CODECS, MERGES = tuple(c.value for c in Codec), ("robust", "mean")  # merge: GossipConfig.merge's rules
SAVED_RUN = ("ce", "curve", "wall_s")  # what "sync_dp_runs" keeps of a run


def parse_variant(text: str) -> dict:
    """'K=2,outer=nesterov,olr=0.7,mom=0.9,lr=1.5,H=5,ra=1' -> dict, defaults filled in. lr: inner-lr multiplier;
    H: local steps per round (0 = --steps; as many steps per replica); ra=1: ReplicaAdamW; codec, merge (default
    int8, robust); m1=3,m2=6: AdamW's moments averaged across a block's replicas every 3 and 6 rounds; tp, pp:
    TrainConfig.trajectory_prob, predecessor_pulls; rg=1: swarmd.core.optim.replica_gain."""
    v: dict = {"K": 2, "outer": "none", "olr": 0.7, "mom": 0.9, "lr": 1.0, "H": 0, "ra": 0}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in VARIANT_KEYS:
            raise SystemExit(f"unknown variant key {key!r} in {text!r} (known: {', '.join(VARIANT_KEYS)})")
        v[key] = VARIANT_KEYS[key](value)
    if v.get("codec", "int8") not in CODECS or v.get("merge", "robust") not in MERGES:
        raise SystemExit(f"codec must be one of {', '.join(CODECS)} and merge one of {', '.join(MERGES)} in {text!r}")
    return v


def label(v: dict) -> str:
    outer = f"nesterov(lr {v['olr']:g}, m {v['mom']:g})" if v["outer"] == "nesterov" else "none"
    extra = (f" H={v['H']}" if v.get("H") else "") + (" ReplicaAdamW" if v.get("ra") else "")
    extra += " replica gain" if v.get("rg") else ""
    extra += "".join(f" {k} {v[k]}" for k in ("codec", "merge", "tp", "pp") if k in v)
    extra += "".join(f" {k} every {v[k]}" for k in ("m1", "m2") if v.get(k))
    return f"K={v['K']} outer={outer} inner-lr x{v['lr']:g}{extra}"


def swarm_label(v: dict, steps: int) -> str:
    """A sync-DP row's swarm variant in words: H, and ReplicaAdamW or AdamW."""
    extra = "".join(f", {v[k]}" for k in ("codec", "merge") if k in v)
    extra += "".join(f", {name} {v[k]:g}" for k, name in (("tp", "trajectory prob"), ("pp", "pulls")) if k in v)
    if v.get("outer", "none") != "none":
        extra += f", {v['outer']} lr {v['olr']:g} m {v['mom']:g}"
    if v.get("lr", 1.0) != 1.0:
        extra += f", inner lr x{v['lr']:g}"
    extra += "".join(f", {k} synced every {v[k]}" for k in ("m1", "m2") if v.get(k))
    extra += ", replica gain" if v.get("rg") else ""
    return f"H={v.get('H') or steps}, {'ReplicaAdamW' if v.get('ra') else 'AdamW'}{extra}"


parse_lrs = options.positive_floats("--sync-lrs")  # '1,1.41,2' -> the sync-DP sweep's inner-lr multipliers


def parse_args(argv=None):
    p = options.parser(__doc__)
    options.add_swarm_config(p)
    p.add_argument("--variants", nargs="+", default=["K=2", "K=2,outer=nesterov", "K=4", "K=4,outer=nesterov"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    cosine = "every run's inner lr decays on a cosine to this fraction of its peak (DiLoCo: 0.05); 0 = constant"
    p.add_argument("--cosine", type=float, default=0.0, help=cosine)
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--no-single", action="store_true", help="skip the single-replica reference runs")
    p.add_argument("--report", action="store_true", help="run nothing: rewrite --md from the rows in --out")
    merge = "with --sync-dp --report: add the sync-DP rows of these JSONs (runs with another --out) to --out"
    p.add_argument("--merge", type=Path, nargs="+", default=[], help=merge)
    sync = "per K of --ks: the swarm and one replica at K x the batch (best of --sync-lrs), side by side"
    p.add_argument("--sync-dp", action="store_true", help=sync)
    p.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8], help="replica counts of --sync-dp")
    swarms = "--sync-dp's swarms per K: variant keys without K (e.g. 'H=1,ra=1'; '' = plain averaging at --steps)"
    p.add_argument("--swarm-variants", nargs="+", default=[""], help=swarms)
    sweeps = 'with --sync-dp: reuse the runs stored in these JSONs (their "sync_dp_runs")'
    p.add_argument("--sweeps-from", type=Path, nargs="+", default=[], help=sweeps)
    lrs = "inner-lr multipliers of the sync-DP reference's sweep (comma-separated); best CE wins"
    p.add_argument("--sync-lrs", type=parse_lrs, default=[1.0, 1.41, 2.0], help=lrs)
    options.add_outputs(p, "replica_sim.json", results.BENCHMARKS)  # --md: its replica_sim.py[ sync-dp] section
    a = p.parse_args(argv)
    a.default_eval_tokens = p.get_default("eval_tokens")  # a sync-DP row without "eval_tokens" was read on these
    if a.merge and not (a.report and a.sync_dp):
        raise SystemExit("--merge goes with --sync-dp --report")
    if not 0 <= a.cosine < 1:
        raise SystemExit(f"--cosine wants a fraction in [0, 1), got {a.cosine}")
    if any(k < 1 for k in a.ks):
        raise SystemExit(f"--ks wants replica counts >= 1, got {a.ks}")
    a.argv = argv
    return a


def run_one(a, v: dict, rounds: int, seed: int, data: ByteData, eval_xy, batch_size: int | None = None) -> dict:
    """One simulator run of variant v for `rounds` rounds of --steps (a variant's own H: as many steps per replica,
    the same warmup); batch_size: per replica (default --batch-size)."""
    batch = a.batch_size if batch_size is None else batch_size
    h = v.get("H") or a.steps
    rounds, eval_every = rounds * a.steps // h, max(1, a.eval_every * a.steps // h)
    train = {"batch_size": batch, "lr": a.lr * v["lr"], "seed": seed, "replica_adam": bool(v.get("ra"))}
    train |= {"total_steps": rounds * h, "min_lr_ratio": a.cosine} if a.cosine else {}
    train |= {k: v[key] for key, k in (("tp", "trajectory_prob"), ("pp", "predecessor_pulls")) if key in v}
    sim_kw = {"workers": v["K"], "rounds": rounds, "steps_per_round": h, "eval_every": eval_every}
    sim_kw |= {"sync_first_moment": v.get("m1", 0), "sync_second_moment": v.get("m2", 0)}
    sim_kw |= {"replica_gain": bool(v.get("rg"))}
    train_cfg = peer_train_config(a.steps, **train)
    sim_cfg = SimConfig(options.model_of(a), train_cfg, codec=v.get("codec", "int8"), **sim_kw)
    outer = {"outer": v["outer"], "outer_lr": v["olr"], "outer_momentum": v["mom"]}
    gossip = GossipConfig(steps_per_round=h, **outer, group_size=0, merge=v.get("merge", "robust"))
    regime = regime_named("lockstep")
    start = time.perf_counter()
    result = Simulator(sim_cfg, regime, make_policy("lockstep", regime, a.steps), data, eval_xy, gossip=gossip).run()
    curve = [(0, result.ce_start)] + [(r.round * h, r.ce) for r in result.rounds if r.ce is not None]
    row = {**v, "command": results.command_line("replica_sim.py", a.argv), "label": label(v), "seed": seed}
    row |= {"rounds": rounds, "steps_per_replica": rounds * h, "ce": result.ce, "curve": curve}
    return row | ({} if batch_size is None else {"batch_size": batch}) | {"wall_s": time.perf_counter() - start}


def steps_to_reach(ce: float, single: list[tuple[int, float]]) -> tuple[float, bool]:
    """Single-replica steps at which CE `ce` is reached: log-steps interpolation between the (steps, final CE)
    points, sorted by steps (extrapolated on the first or last segment: flag True)."""
    pts = sorted(single)
    for (s0, c0), (s1, c1) in itertools.pairwise(pts):
        if c1 <= ce <= c0 and c0 != c1:
            t = (c0 - ce) / (c0 - c1)
            return math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0))), False
    (s0, c0), (s1, c1) = (pts[-2], pts[-1]) if ce < pts[-1][1] else (pts[0], pts[1])
    slope = (math.log(s1) - math.log(s0)) / (c1 - c0) if c1 != c0 else float("inf")
    return math.exp(math.log(s0) + (ce - c0) * slope), True


def efficiency(row: dict, single: list[tuple[int, float]]) -> dict:
    steps, extrapolated = steps_to_reach(row["ce"], single)
    efficiency = steps / (row["K"] * row["steps_per_replica"])
    return {"single_steps_equiv": steps, "extrapolated": extrapolated, "efficiency": efficiency}


def main(argv=None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(1)
    data, eval_xy = options.swarm_text(a, options.model_of(a))
    variants = [] if a.report or a.sync_dp else [parse_variant(t) for t in a.variants]
    out: dict = {"command": results.command_line("replica_sim.py", argv), "single": {}, "rows": []}
    if a.out.exists():  # keep earlier rows of other commands (the sweep is run in pieces)
        earlier = json.loads(a.out.read_text())
        out |= {k: earlier[k] for k in ("single", "rows", "sync_dp", "sync_dp_single", "sync_dp_runs") if k in earlier}
    merged = [*out.get("sync_dp", []), *(r for f in a.merge for r in json.loads(f.read_text()).get("sync_dp", []))]
    if merged:  # rows of runs that wrote other files (each keeps its own command); the last of a measurement wins
        out["sync_dp"] = list({sync_id(r): r for r in merged}.values())
    if a.sync_dp:  # its own reference runs, measured by this code (the earlier ones predate merge changes)
        out.setdefault("sync_dp_single", {})
        a.sweeps = {k: v for f in a.sweeps_from for k, v in json.loads(f.read_text()).get("sync_dp_runs", {}).items()}
        out["sync_dp_runs"] = a.sweeps = a.sweeps | out.get("sync_dp_runs", {})
        a.store_sweeps = lambda: results.write_json(a.out, out)
    store = out["sync_dp_single"] if a.sync_dp else out["single"]
    for seed in [] if a.report else a.seeds:
        key = sync_single_key(a, seed) if a.sync_dp else single_key(a, seed)
        if not a.no_single and key not in store:
            runs = []
            for mult in (1, 2, 4):
                runs.append(run_one(a, parse_variant("K=1"), a.rounds * mult, seed, data, eval_xy))
                print(f"single x{mult} seed {seed}: ce {runs[-1]['ce']:.4f} ({runs[-1]['wall_s']:.0f}s)", flush=True)
            store[key] = runs
            results.write_json(a.out, out)
        single = [(r["steps_per_replica"], r["ce"]) for r in store.get(key, [])]
        for k in a.ks if a.sync_dp else []:
            for row in sync_dp_rows(a, k, seed, data, eval_xy, single, key):
                out["sync_dp"] = [r for r in out.get("sync_dp", []) if sync_id(r) != sync_id(row)] + [row]
            results.write_json(a.out, out)
        for v in variants:
            r = run_one(a, v, a.rounds, seed, data, eval_xy)
            if single:
                r.update(efficiency(r, single))
            out["rows"].append(r)
            results.write_json(a.out, out)
            eff = f"efficiency {r['efficiency']:.3f}{' (extrap.)' if r['extrapolated'] else ''}" if single else ""
            print(f"{r['label']} seed {seed}: ce {r['ce']:.4f} {eff} ({r['wall_s']:.0f}s) {fmt_curve(r)}", flush=True)
    out["machine"] = f"{results.machine()}, torch {torch.__version__}"
    results.write_json(a.out, out)
    (write_sync_md if a.sync_dp else write_md)(a, out)


def single_key(a, seed: int) -> str:
    """The key of the single-replica reference runs in the JSON's "single": seed, rounds and H only (a run at
    another --batch-size or --lr reads the stored reference of the same schedule: pass another --out for its own)."""
    return f"seed{seed}_r{a.rounds}_H{a.steps}"


def sync_single_key(a, seed: int) -> str:
    """The key of --sync-dp's single-replica reference (the JSON's "sync_dp_single"): schedule, batch, lr, shape."""
    return f"{single_key(a, seed)}_b{a.batch_size}_lr{a.lr:g}_B{a.blocks}_d{a.d_model}_seq{a.seq_len}"


def swarm_variant(row: dict) -> str:
    return row.get("swarm_variant") or f"H={row.get('H')}, AdamW"  # rows from before --swarm-variants


def sync_id(row: dict) -> tuple:
    """What makes two sync-DP rows the same measurement (a rerun replaces the older row)."""
    keys = ("K", "seed", "rounds", "H", "batch_size", "lr", "model", "cosine", "eval_tokens")
    return (*(row.get(k) for k in keys), swarm_variant(row))


def sync_dp_summary(k: int, swarm: dict, sweep: list[dict], single: list[tuple[int, float]]) -> dict:
    """The row's figures from the swarm run, the sync-DP sweep runs (one per lr multiplier) and the single-replica
    (steps, CE) points (empty: no efficiencies)."""
    best = min(sweep, key=lambda r: r["ce"])
    mults = [r["lr_mult"] for r in sweep]
    row = {"K": k, "steps_per_replica": swarm["steps_per_replica"], "ce": swarm["ce"], "sync_dp_ce": best["ce"]}
    row["excess_pct"] = 100.0 * (swarm["ce"] - best["ce"]) / best["ce"]  # negative: the swarm is lower
    row |= {"sync_dp_lr_mult": best["lr_mult"], "sync_dp_lr": best["lr_abs"], "sync_dp_sweep": sweep}
    row["sync_dp_lr_at_edge"] = len(mults) > 1 and best["lr_mult"] in (min(mults), max(mults))
    row |= {"efficiency": None, "sync_dp_efficiency": None}
    if len(single) >= 2:
        at = {"K": k, "steps_per_replica": swarm["steps_per_replica"]}
        row.update(efficiency({**at, "ce": swarm["ce"]}, single))
        ref = efficiency({**at, "ce": best["ce"]}, single)
        row.update({f"sync_dp_{x}": ref[x] for x in ("efficiency", "single_steps_equiv", "extrapolated")})
    return row


def sync_dp_rows(a, k: int, seed: int, data: ByteData, eval_xy, single: list[tuple[int, float]], key: str) -> list:
    """A row per swarm of --swarm-variants (K replicas per block) beside one replica at K x the batch for each lr
    multiplier at the swarm's H (one sweep per H: the reference refreshes its trajectory predecessors and averages
    the byte table across blocks once a round, as often as the swarm)."""
    sweeps: dict[int, list[dict]] = {}
    rows = []
    for text in a.swarm_variants:
        v = parse_variant(",".join(filter(None, (f"K={k}", text))))
        h = v["H"] or a.steps
        if h not in sweeps:
            sweeps[h] = sync_dp_sweep(a, k, seed, data, eval_xy, h)
        sweep, run_key = sweeps[h], f"swarm {sweep_key(a, k, seed, h, v['lr'])} {label(v)}"
        if run_key not in a.sweeps:
            r = run_one(a, v, a.rounds, seed, data, eval_xy)
            a.sweeps[run_key] = {x: r[x] for x in ("steps_per_replica", *SAVED_RUN)}
            a.store_sweeps()
        swarm = a.sweeps[run_key]
        done = f"ce {swarm['ce']:.4f} ({swarm['wall_s']:.0f}s) {fmt_curve(swarm)}"
        print(f"swarm {label(v)} seed {seed}: {done}", flush=True)
        row = sync_dp_summary(k, swarm, sweep, single)
        row |= {"seed": seed, "rounds": a.rounds, "H": a.steps, "batch_size": a.batch_size, "lr": a.lr}
        row |= {"sync_dp_batch_size": k * a.batch_size, "model": f"B={a.blocks} L_b=1 d={a.d_model} seq {a.seq_len}"}
        row |= {"cosine": a.cosine} if a.cosine else {}
        row |= {"eval_tokens": a.eval_tokens} if a.eval_tokens != a.default_eval_tokens else {}
        row |= {"swarm_variant": swarm_label(v, a.steps), "sync_dp_h": h, "swarm_curve": swarm["curve"]}
        row |= {"swarm_wall_s": swarm["wall_s"], "single_key": key if single else None, "single": single}
        row["wall_s"] = swarm["wall_s"] + sum(r["wall_s"] for r in sweep)
        row["command"] = results.command_line("replica_sim.py", a.argv)
        eff = f"efficiency {row['efficiency']:.3f}" if row["efficiency"] is not None else "no single reference"
        print(
            f"K={k} {row['swarm_variant']} seed {seed}: swarm {row['ce']:.4f} sync DP {row['sync_dp_ce']:.4f} "
            f"(lr x{row['sync_dp_lr_mult']:g}) excess {row['excess_pct']:+.2f}% {eff} ({row['wall_s']:.0f}s)",
            flush=True,
        )
        rows.append(row)
    return rows


def sweep_key(a, k: int, seed: int, h: int, mult: float) -> str:
    """What one sync-DP reference run measures: K, seed, budget, H, batch, lr (multiplier), schedule and shape."""
    return (
        f"K{k}_seed{seed}_r{a.rounds}_steps{a.steps}_H{h}_b{a.batch_size}_lr{a.lr:g}x{mult:g}_cos{a.cosine:g}"
        f"_B{a.blocks}_d{a.d_model}_seq{a.seq_len}_eval{a.eval_tokens}"
    )


def sync_dp_sweep(a, k: int, seed: int, data: ByteData, eval_xy, h: int) -> list[dict]:
    """One replica per block at K x the batch, H local steps per round, each lr multiplier of --sync-lrs; a run
    already in a.sweeps (--out's "sync_dp_runs" and those of --sweeps-from, which also hold the swarm runs of
    sync_dp_rows: a row is rebuilt, not rerun, when its sweep grows) is read, not rerun."""
    sweep = []
    for mult in a.sync_lrs:
        key, run = sweep_key(a, k, seed, h, mult), f"sync DP K={k}"
        if key in a.sweeps:
            print(f"{run} lr x{mult:g} H={h} seed {seed}: ce {a.sweeps[key]['ce']:.4f} (stored)", flush=True)
        else:
            v = parse_variant(f"K=1,lr={mult:g}" + (f",H={h}" if h != a.steps else ""))
            r = run_one(a, v, a.rounds, seed, data, eval_xy, batch_size=k * a.batch_size)
            run += f" (batch {k * a.batch_size}, lr x{mult:g}, H={h}) seed {seed}"
            print(f"{run}: ce {r['ce']:.4f} ({r['wall_s']:.0f}s) {fmt_curve(r)}", flush=True)
            a.sweeps[key] = {"lr_mult": mult, "lr_abs": a.lr * mult, **{x: r[x] for x in SAVED_RUN}}
            a.store_sweeps()
        sweep.append(a.sweeps[key])
    return sweep


def fmt_curve(r: dict, head: str = "curve ") -> str:
    return head + " ".join(f"{c:.3f}" for _, c in r["curve"][1:])


def config_of(row: dict) -> str:
    """A sync-DP row's model and batch per replica (and its seed when not 0, its held-out bytes when not the
    default), as its table shows them."""
    seed = f", seed {row['seed']}" if row.get("seed") else ""
    held_out = f", {row['eval_tokens']:,} held-out bytes" if row.get("eval_tokens") else ""
    return f"{row.get('model', '-')}, {row.get('batch_size', '-')}{seed}{held_out}"


def write_sync_md(a, out: dict) -> None:
    """The sync-DP section of --md: one line per (budget, K, H, swarm) row, the commands (the full sweeps and curves
    are in the JSON)."""
    rows = sorted(
        out.get("sync_dp", []),
        key=lambda r: (config_of(r), r["steps_per_replica"], r["K"], r.get("sync_dp_h", r["H"]), swarm_variant(r)),
    )
    lines = [
        "### Swarm vs synchronous data parallelism: one replica at K x the batch",
        "",
        "Per K: the swarm (K replicas per block, plain averaging unless an outer step is named, H local steps per "
        "round, lockstep network, int8 + error feedback, robust merge unless named) and one replica per block at K x "
        "the batch for the same steps and the same H (sync DP), at each inner-lr multiplier of its sweep; sync DP CE "
        "= the best, *edge* when that is the sweep's highest or lowest lr. excess % = 100 (swarm CE - sync DP CE) / "
        "sync DP CE. Seed 0 unless the row names another; a row's sweep and both curves are in the JSON.",
        "",
        "| model, batch per replica | steps/replica | K | swarm | swarm CE | sync DP CE (lr x) | sweep (lr x) "
        "| excess % |",
        "|---|---:|---:|---|---:|---:|---|---:|",
    ]
    for r in rows:
        mults = ", ".join(f"{s['lr_mult']:g}" for s in r["sync_dp_sweep"])
        edge = ", edge" if r.get("sync_dp_lr_at_edge") else ""
        lr = f", cosine to {r['cosine']:g}" if r.get("cosine") else ", constant lr"
        lines.append(
            f"| {config_of(r)} | {r['steps_per_replica']} | {r['K']} | {swarm_variant(r)}{lr} | {r['ce']:.4f} "
            f"| {r['sync_dp_ce']:.4f} (x{r['sync_dp_lr_mult']:g}{edge}) | {mults} | {r['excess_pct']:+.2f} |"
        )
    commands = sorted({without_caches(r["command"]) for r in rows})
    lines += ["", "Commands of the rows: " + "; ".join(f"`{c}`" for c in commands)]
    results.replace_section(a.md, "replica_sim.py sync-dp", lines + results.machine_footer(out.get("machine", "")))


def without_caches(command: str) -> str:
    """A row's command without --sweeps-from and its files: they only name stored runs to read instead of rerunning
    (the same runs are stored in --out's "sync_dp_runs")."""
    return re.sub(r" --sweeps-from( (?!--)\S+)*", "", command)


def write_md(a, out: dict) -> None:
    singles = "; ".join(f"{k}: " + " / ".join(f"{r['ce']:.4f}" for r in runs) for k, runs in out["single"].items())
    lines = [
        "### Replica efficiency in the simulator: outer optimizer and lr scaling sweeps",
        "",
        "Rows accumulate over the commands listed below the table (each row names its seed). "
        f"Model and schedule of benchmarks/swarm.py (B={a.blocks}, d={a.d_model}, seq {a.seq_len}, batch "
        f"{a.batch_size}, lr {a.lr}; H as in the table), lockstep network, int8 + error feedback, robust merge.",
        "",
        "Single-replica reference (final from-noise CE at 1x / 2x / 4x the rounds, separate runs): " + singles,
        "",
        "| variant | seed | H | steps/replica | CE | CE curve (measured rounds) | single-replica steps to that CE "
        "| efficiency |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in out["rows"]:
        eff = "- | -"
        if "efficiency" in r:
            eff = f"{r['single_steps_equiv']:.0f}{' (extrap.)' if r['extrapolated'] else ''} | {r['efficiency']:.3f}"
        lines.append(
            f"| {r['label']} | {r['seed']} | {r['steps_per_replica'] // r['rounds']} | {r['steps_per_replica']} "
            f"| {r['ce']:.4f} | {fmt_curve(r, '')} | {eff} |"
        )
    commands = sorted({r.get("command", out["command"]) for r in out["rows"]})
    lines += ["", "Commands of the rows: " + "; ".join(f"`{c}`" for c in commands), ""]
    results.replace_section(a.md, "replica_sim.py", lines)


if __name__ == "__main__":
    main()
