"""Group averaging's quality cost in the simulator: groups of k against all-to-all.

swarmd.sim on benchmarks/swarm.py's model and schedule, K replicas per block for each of --ks: per K and regime,
all-to-all and groups of at most --group-size (a row per --full-every, --table-group-size and --layouts value; the
daemon's groups, swarmd.averaging.groups). A row: the from-noise CE of every replica set (block b from worker j of
block b), their mean and spread, the CE minus all-to-all's, the consensus distance after each round. --outer and
--overlap apply to every row. Writes --out (JSON) and --md's --section; see BENCHMARKS.md#group_sim.

    python benchmarks/group_sim.py --ks 4 8 --group-size 4 --table-group-size 0 4 12
    python benchmarks/group_sim.py --ks 8 --group-size 4 --layouts balanced --outer nesterov --overlap
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import options, results
from swarmd.averaging.config import GROUP_LAYOUTS, GossipConfig
from swarmd.core.evaluate import from_noise_ce
from swarmd.node.config import peer_train_config
from swarmd.protocol import Codec
from swarmd.sim.engine import SimConfig, Simulator
from swarmd.sim.policies import make_policy
from swarmd.sim.regimes import regime_named


def parse_args(argv=None):
    p = options.parser(__doc__)
    options.add_swarm_config(p)
    p.add_argument("--ks", type=int, nargs="+", default=[4, 8], help="replicas per block")
    p.add_argument("--group-size", type=int, nargs="+", default=[4], help="k of the group rows (0 = all-to-all)")
    p.add_argument("--full-every", type=int, nargs="+", default=[0], help="group_full_every of the group rows")
    table = "table_group_size of the group rows (0 = the byte table all-to-all)"
    p.add_argument("--table-group-size", type=int, nargs="+", default=[0], help=table)
    p.add_argument("--layouts", nargs="+", choices=GROUP_LAYOUTS, default=["grid"], help="group_layout of group rows")
    p.add_argument("--regimes", nargs="+", default=["lockstep"])
    p.add_argument("--codec", choices=("fp32", "bf16", "int8"), default="int8")
    p.add_argument("--merge", choices=("robust", "mean"), default="robust", help="GossipConfig.merge")
    p.add_argument("--outer", choices=("none", "nesterov"), default="none", help="GossipConfig.outer (every row)")
    p.add_argument("--outer-lr", type=float, default=GossipConfig.outer_lr)
    p.add_argument("--outer-momentum", type=float, default=GossipConfig.outer_momentum)
    p.add_argument("--overlap", action="store_true", help="merges land a round late (SimConfig.overlap, every row)")
    p.add_argument("--replica-adam", action="store_true", help="ReplicaAdamW (K = the merge's members)")
    p.add_argument("--seed", type=int, default=0)
    options.add_outputs(p, "group_sim.json", results.BENCHMARKS)
    options.add_section(p, "group_sim.py")
    a = p.parse_args(argv)
    a.argv = argv
    return a


def replica_set_ces(sim: Simulator, eval_xy, cfg) -> list[float]:
    """From-noise CE of each replica set: block b of worker j of every block, worker j of block 0's table."""
    K = sim.cfg.workers
    sets = [[sim.workers[b * K + j].state.trainer for b in range(cfg.blocks)] for j in range(K)]
    return [float(from_noise_ce([t.block for t in ts], ts[0].emb, *eval_xy, cfg)["ce"]) for ts in sets]


def run_row(a, k: int, group: int, full_every: int, table: int, layout: str, regime_name: str, data, eval_xy) -> dict:
    cfg = options.model_of(a)
    train = peer_train_config(a.steps, batch_size=a.batch_size, lr=a.lr, seed=a.seed, replica_adam=a.replica_adam)
    sim_kw = {"workers": k, "rounds": a.rounds, "steps_per_round": a.steps, "eval_every": 1, "overlap": a.overlap}
    groups = {"group_size": group, "group_full_every": full_every, "table_group_size": table, "group_layout": layout}
    outer = {"outer": a.outer, "outer_lr": a.outer_lr, "outer_momentum": a.outer_momentum}
    gossip = GossipConfig(steps_per_round=a.steps, merge=a.merge, **groups, **outer)
    regime = regime_named(regime_name)
    policy = make_policy("adaptive" if regime_name != "lockstep" else "lockstep", regime, a.steps)
    start = time.perf_counter()
    sim = Simulator(SimConfig(cfg, train, codec=Codec(a.codec), **sim_kw), regime, policy, data, eval_xy, gossip=gossip)
    result = sim.run()
    ces = replica_set_ces(sim, eval_xy, cfg)
    row = {"K": k, "group_size": group, "full_every": full_every, "table_group_size": table, "layout": layout}
    row |= {"regime": regime_name, "codec": a.codec, "merge": a.merge, "overlap": a.overlap}
    row["outer"] = a.outer if a.outer == "none" else f"{a.outer} lr {a.outer_lr} momentum {a.outer_momentum}"
    row |= {"replica_adam": a.replica_adam, "steps_per_replica": a.rounds * a.steps, "ce_mean": statistics.mean(ces)}
    row |= {"ce_min": min(ces), "ce_max": max(ces), "ce_per_replica_set": ces}
    row |= {"consensus": [r.consensus for r in result.rounds], "participation": result.participation}
    row["upload_bytes_per_worker_round"] = result.wire_bytes / (k * cfg.blocks * a.rounds)
    return row | {"wall_s": time.perf_counter() - start}


def label(r: dict) -> str:
    if not r["group_size"] and not r["table_group_size"]:
        return "all-to-all"
    full = f", all-to-all every {r['full_every']} rounds" if r["full_every"] else ""
    table = f"table in groups of {r['table_group_size']}" if r["table_group_size"] else "table all-to-all"
    layout = f", {r['layout']} groups" if r.get("layout", "grid") != "grid" else ""
    return f"blocks in groups of at most {r['group_size']}, {table}{full}{layout}"


def write_md(a, out: dict) -> None:
    outer = a.outer != "none"
    lines = [
        "### Group averaging in the simulator: groups of k against all-to-all",
        "",
        f"Command: `{out['command']}`",
        "",
        f"swarmd.sim: B={a.blocks}, L_b=1, d={a.d_model}, seq {a.seq_len}, batch {a.batch_size} per replica, lr "
        f"{a.lr:g}, {a.rounds} rounds x H={a.steps}, {a.codec} deltas{' with error feedback' * (a.codec == 'int8')}, "
        f"{a.merge} merge, {'ReplicaAdamW' if a.replica_adam else 'AdamW'}, "
        + (f"outer Nesterov (lr {a.outer_lr:g}, momentum {a.outer_momentum:g}; local in group rows), " * outer)
        + ("overlap (merges land a round late), " if a.overlap else "")
        + f"seed {a.seed}. Groups: the daemon's assignment (grid, or the layout the row names) and anchored offsets "
        "(swarmd.averaging.groups), per block among its K replicas and (table_group_size) for the byte table among "
        "all B x K workers. CE: from-noise CE (nats/byte) of each replica set's model (block b of worker j, worker "
        "j's table), mean (min / max). Consensus: the largest relative distance between two same-block replicas' "
        "bases or two workers' tables after the round (0: bit-identical).",
        "",
    ]
    rows, all_to_all = [], {(x["K"], x["regime"]): x for x in reversed(out["rows"]) if not x["group_size"]}
    for r in out["rows"]:
        ref = all_to_all.get((r["K"], r["regime"]), r)
        diff = f"{r['ce_mean'] - ref['ce_mean']:+.4f}" if r is not ref else "-"
        c = r["consensus"]
        cons = " / ".join(f"{x:.1e}" for x in (c[0], c[min(3, len(c) - 1)], c[-1]))
        ce = f"{r['ce_mean']:.4f} ({r['ce_min']:.4f} / {r['ce_max']:.4f})"
        up = f"{r['participation']:.2f} | {r['upload_bytes_per_worker_round']:,.0f}"
        rows.append(f"{r['K']} | {r['regime']} | {label(r)} | {ce} | {diff} | {cons} | {up}")
    head = "K | regime | averaging | CE mean (min / max) | minus all-to-all | consensus after rounds 1 / 4 / last "
    head += "| participation | bytes up per worker per round"
    lines += [*results.table(head, rows, "rlllrlrr"), *results.machine_footer(out["machine"])]
    results.replace_section(a.md, a.section, lines)


def main(argv=None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(1)
    data, eval_xy = options.swarm_text(a, options.model_of(a))
    out = {"command": results.command_line("group_sim.py", argv), "rows": [], "machine": results.machine()}
    for regime in a.regimes:
        for k in a.ks:
            combos = itertools.product(a.group_size, a.full_every, a.table_group_size, a.layouts)
            for group, full, table, layout in [(0, 0, 0, "grid"), *((g, f, t, y) for g, f, t, y in combos if g or t)]:
                r = run_row(a, k, group, full, table, layout, regime, data, eval_xy)
                out["rows"].append(r)
                results.write_json(a.out, out)
                cons = " ".join(f"{x:.1e}" for x in r["consensus"])
                ce = f"ce {r['ce_mean']:.4f} ({r['ce_min']:.4f}-{r['ce_max']:.4f})"
                print(f"K={k} {regime} {label(r)}: {ce} consensus {cons} ({r['wall_s']:.0f}s)", flush=True)
    write_md(a, out)


if __name__ == "__main__":
    main()
