"""Replica efficiency in the simulator (issue 12): outer optimizer and learning-rate scaling sweeps.

Runs swarmd.sim (real BlockTrainer steps, int8 codec + error feedback, the daemon's merge and the daemon's
outer optimizer through BlockState.apply_merge; lockstep network, so every delta is accepted) for
benchmarks/swarm.py's model and schedule. The reference is the same simulator with one replica per block
and plain averaging (a merge of one delta is that delta) at 1x, 2x and 4x the rounds, each a separate run;
every variant ("--variants": K replicas, outer none|nesterov, outer lr, momentum, inner-lr scale) runs
--rounds rounds and its replica efficiency is

    (single-replica steps to reach its final CE, interpolated in log-steps) / (K x its steps per replica)

(extrapolated past 4x on the last segment's slope; flagged). The from-noise CE is measured every
--eval-every rounds so the curves over the budget can be compared, not just the end point. Writes --out
(JSON, every curve) and its section of --md.

    python benchmarks/replica_sim.py --variants K=2,outer=none K=2,outer=nesterov K=4,outer=nesterov,lr=2
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

from benchmarks import common
from swarmd.averaging.config import GossipConfig
from swarmd.core.data import ByteData
from swarmd.node.config import peer_train_config
from swarmd.sim.engine import SimConfig, Simulator
from swarmd.sim.policies import make_policy
from swarmd.sim.regimes import regime_named

VARIANT_KEYS = {"K": int, "outer": str, "olr": float, "mom": float, "lr": float}


def parse_variant(text: str) -> dict:
    """'K=2,outer=nesterov,olr=0.7,mom=0.9,lr=1.5' -> dict (lr: inner-lr multiplier); defaults filled in."""
    v: dict = {"K": 2, "outer": "none", "olr": 0.7, "mom": 0.9, "lr": 1.0}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in VARIANT_KEYS:
            raise SystemExit(f"unknown variant key {key!r} in {text!r} (known: {', '.join(VARIANT_KEYS)})")
        v[key] = VARIANT_KEYS[key](value)
    return v


def label(v: dict) -> str:
    outer = f"nesterov(lr {v['olr']:g}, m {v['mom']:g})" if v["outer"] == "nesterov" else "none"
    return f"K={v['K']} outer={outer} inner-lr x{v['lr']:g}"


def parse_args(argv=None):
    p = common.parser(__doc__)
    common.add_swarm_config(p)
    p.add_argument("--variants", nargs="+", default=["K=2", "K=2,outer=nesterov", "K=4", "K=4,outer=nesterov"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--no-single", action="store_true", help="skip the single-replica reference runs")
    p.add_argument("--report", action="store_true", help="run nothing: rewrite --md from the rows in --out")
    common.add_outputs(p, "replica_sim.json", "ISSUE12_replicas.md")
    a = p.parse_args(argv)
    a.argv = argv
    return a


def run_one(a, v: dict, rounds: int, seed: int, data: ByteData, eval_xy) -> dict:
    train = peer_train_config(a.steps, batch_size=a.batch_size, lr=a.lr * v["lr"], seed=seed)
    sim_cfg = SimConfig(
        common.model_of(a), train, workers=v["K"], rounds=rounds, steps_per_round=a.steps, eval_every=a.eval_every
    )
    gossip = GossipConfig(
        steps_per_round=a.steps, outer=v["outer"], outer_lr=v["olr"], outer_momentum=v["mom"], group_size=0
    )
    regime = regime_named("lockstep")
    start = time.perf_counter()
    sim = Simulator(sim_cfg, regime, make_policy("lockstep", regime, a.steps), data, eval_xy, gossip=gossip)
    result = sim.run()
    curve = [(0, result.ce_start)] + [(r.round * a.steps, r.ce) for r in result.rounds if r.ce is not None]
    return {
        **v,
        "command": common.command_line("replica_sim.py", a.argv),
        "label": label(v),
        "seed": seed,
        "rounds": rounds,
        "steps_per_replica": rounds * a.steps,
        "ce": result.ce,
        "curve": curve,
        "wall_s": time.perf_counter() - start,
    }


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
    return {
        "single_steps_equiv": steps,
        "extrapolated": extrapolated,
        "efficiency": steps / (row["K"] * row["steps_per_replica"]),
    }


def main(argv=None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(1)
    cfg = common.model_of(a)
    data = ByteData.from_path(a.data_dir / "train.txt", cfg.seq_len)
    eval_xy = ByteData.from_path(a.data_dir / "eval.txt", cfg.seq_len).eval_windows(a.eval_tokens)
    variants = [] if a.report else [parse_variant(t) for t in a.variants]
    out: dict = {"command": common.command_line("replica_sim.py", argv), "single": {}, "rows": []}
    if a.out.exists():  # keep earlier rows of other commands (the sweep is run in pieces)
        out["single"] = json.loads(a.out.read_text()).get("single", {})
        out["rows"] = json.loads(a.out.read_text()).get("rows", [])
    for seed in [] if a.report else a.seeds:
        key = f"seed{seed}_r{a.rounds}_H{a.steps}"
        if not a.no_single and key not in out["single"]:
            runs = []
            for mult in (1, 2, 4):
                r = run_one(a, parse_variant("K=1"), a.rounds * mult, seed, data, eval_xy)
                print(f"single x{mult} seed {seed}: ce {r['ce']:.4f} ({r['wall_s']:.0f}s)", flush=True)
                runs.append(r)
            out["single"][key] = runs
            common.write_json(a.out, out)
        single = [(r["steps_per_replica"], r["ce"]) for r in out["single"].get(key, [])]
        for v in variants:
            r = run_one(a, v, a.rounds, seed, data, eval_xy)
            if single:
                r.update(efficiency(r, single))
            out["rows"].append(r)
            common.write_json(a.out, out)
            eff = f"efficiency {r['efficiency']:.3f}{' (extrap.)' if r['extrapolated'] else ''}" if single else ""
            curve = " ".join(f"{c:.3f}" for _, c in r["curve"][1:])
            print(f"{r['label']} seed {seed}: ce {r['ce']:.4f} {eff} ({r['wall_s']:.0f}s) curve {curve}", flush=True)
    out["machine"] = f"{common.machine()}, torch {torch.__version__}"
    common.write_json(a.out, out)
    write_md(a, out)


def write_md(a, out: dict) -> None:
    lines = [
        "### Replica efficiency in the simulator (issue 12): outer optimizer and lr scaling sweeps",
        "",
        "Rows accumulate over the commands listed below the table (each row names its seed). "
        f"Model and schedule of benchmarks/swarm.py (B={a.blocks}, d={a.d_model}, seq {a.seq_len}, batch "
        f"{a.batch_size}, lr {a.lr}; H as in the table), lockstep network, int8 + error feedback, robust merge.",
        "",
        "Single-replica reference (final from-noise CE at 1x / 2x / 4x the rounds, separate runs): "
        + "; ".join(f"{k}: " + " / ".join(f"{r['ce']:.4f}" for r in runs) for k, runs in out["single"].items()),
        "",
        "| variant | seed | H | steps/replica | CE | CE curve (measured rounds) | single-replica steps to that CE "
        "| efficiency |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in out["rows"]:
        head = f"| {r['label']} | {r['seed']} | {r['steps_per_replica'] // r['rounds']} | {r['steps_per_replica']}"
        if "efficiency" in r:
            curve = " ".join(f"{c:.3f}" for _, c in r["curve"][1:])
            lines.append(
                f"{head} | {r['ce']:.4f} | {curve} "
                f"| {r['single_steps_equiv']:.0f}{' (extrap.)' if r['extrapolated'] else ''} | {r['efficiency']:.3f} |"
            )
        else:
            curve = " ".join(f"{c:.3f}" for _, c in r["curve"][1:])
            lines.append(f"{head} | {r['ce']:.4f} | {curve} | - | - |")
    commands = sorted({r.get("command", out["command"]) for r in out["rows"]})
    lines += ["", "Commands of the rows: " + "; ".join(f"`{c}`" for c in commands)]
    common.replace_section(a.md, "replica_sim.py", [*lines, ""])


if __name__ == "__main__":
    main()
