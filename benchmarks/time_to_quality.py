"""Time to quality: the assembled model's held-out CE against wall time on dedicated hardware, per schedule and P.

The clock is a cost model measured on the real trainer (swarmd.sim.costs; --fixed-costs adds clock_check.py's
fixed seconds a round and per pull) with the simulator's network regimes (swarmd.sim.scheduled). For P = K x B
peers and every schedule it runs the swarm beside the references (the one-peer E2E model, whose CE at --steps is the
target; sync DP ideal; pipelined E2E; one block of the whole depth). Writes --out (rows, references, the one-peer
curve, costs) and --plot; see BENCHMARKS.md#time_to_quality.

    python benchmarks/time_to_quality.py --data-dir ../shared/data/wikitext-2
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness.options import add_outputs, add_shape, add_torch, model_of, parse_checked, parser, swarm_text
from benchmarks.harness.results import command_line, machine, pyplot, save_figure, table, write_json
from swarmd.averaging.compact import PULL_CODECS, PULL_INT8_LEVELS
from swarmd.averaging.config import GossipConfig
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import e2e_ce
from swarmd.core.schedule import SCHEDULES
from swarmd.core.train import E2ETrainer, seed_for
from swarmd.sim.costs import StepCosts, breakdown, measure_step_costs, pipelined_e2e_s, priced_regime
from swarmd.sim.curves import ce_at, time_to
from swarmd.sim.engine import SimConfig, SimResult
from swarmd.sim.policies import make_policy, regime_policy
from swarmd.sim.regimes import regime_named
from swarmd.sim.scheduled import ScheduledSimulator, SchedulePlan

Curve = list[tuple[int, float]]


def options(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, holds="train.txt and eval.txt")
    add_shape(p, blocks=4, d_model=64, seq_len=64, layers_per_block=1)
    add_outputs(p, "time_to_quality.json")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=1600, help="steps per peer of every run (the target: E2E at these)")
    p.add_argument("--steps-per-round", type=int, default=25, help="H")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4], help="peers per block: P = K x B")
    schedules = [*SCHEDULES, *(f"{s}-pinned" for s in SCHEDULES)]
    p.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=schedules)
    p.add_argument("--growth", type=float, default=0.25, help="grow: each block's growth phase, share of the rounds")
    p.add_argument("--turn", type=float, default=1.0, help="sequential: each block's turn, share of --steps")
    p.add_argument("--regimes", nargs="+", default=["lockstep", "wan-mid"])
    p.add_argument("--lrs", type=float, nargs="+", default=[3e-3, 5e-3, 8e-3], help="the end-to-end models' lr sweep")
    p.add_argument("--swarm-lrs", type=float, nargs="+", help="the swarms' lr sweep (default: the E2E's best)")
    p.add_argument("--min-lr-ratio", type=float, default=0.0)
    p.add_argument("--pull-codec", choices=PULL_CODECS, default=GossipConfig.pull_codec, help="predecessor pulls")
    p.add_argument("--pull-int8-levels", type=float, default=PULL_INT8_LEVELS, help="int8 pulls' steps per row rms")
    p.add_argument("--trajectory-reuse", type=int, default=0, help="TrainConfig.trajectory_reuse of the blocks")
    p.add_argument("--prefetch", action="store_true", help="mid-round pulls run while the steps go on (TrainConfig)")
    p.add_argument(
        "--balance-steps", type=float, default=GossipConfig.balance_steps, help="a block's steps, at most x H"
    )
    p.add_argument("--predecessor-pulls", type=int, default=TrainConfig.predecessor_pulls, help="pulls a round")
    p.add_argument("--references", nargs="+", default=["sync_dp", "pipelined", "one_block"])
    p.add_argument("--stop-at-target", action="store_true", help="end each swarm once it reaches the target CE")
    p.add_argument("--eval-every", type=int, default=2, help="rounds between CE measurements")
    p.add_argument("--eval-tokens", type=int, default=8192)
    p.add_argument("--train-bytes", type=int, default=0, help="first bytes of train.txt used (0 = all)")
    p.add_argument("--costs", type=Path, help="a saved result (or StepCosts JSON) whose costs pin the clock")
    p.add_argument("--fixed-costs", type=Path, help="a clock_check.py result whose round_s and pull_s price rounds")
    p.add_argument("--e2e-from", type=Path, help="a saved result whose one-peer E2E curve and target to reuse")
    p.add_argument("--costs-only", action="store_true", help="measure the step costs, with and without replay")
    p.add_argument("--costs-blocks", type=int, nargs="+", help="--costs-only: at each of these B (default --blocks)")
    p.add_argument("--merge", type=Path, nargs="+", help="combine these saved runs of one config (nothing runs)")
    p.add_argument("--plot", type=Path, default=Path("benchmarks/results/time_to_quality.png"))
    p.add_argument("--device", default="cpu")
    add_torch(p)
    return parse_checked(p, argv, "train.txt")


def e2e_curve(
    cfg: ModelConfig, train: TrainConfig, data: ByteData, eval_xy: tuple, steps: int, every: int, stop: float | None
) -> Curve:
    """(steps, held-out CE) of the end-to-end model, measured every `every` steps; stops once CE <= stop."""
    trainer = E2ETrainer(cfg, replace(train, total_steps=steps))
    stream = data.stream(seed_for("data", train.seed, "e2e", train.batch_size), train.batch_size)
    curve = [(0, float(e2e_ce(trainer.model, *eval_xy)["ce"]))]
    for s in range(1, steps + 1):
        trainer.step(*next(stream))
        if s % every == 0 or s == steps:
            curve.append((s, float(e2e_ce(trainer.model, *eval_xy)["ce"])))
            if stop is not None and curve[-1][1] <= stop:
                break
    return curve


def best(curves: dict[float, Curve]) -> tuple[float, Curve]:
    """The lr whose curve ends lowest (a curve stopped at the target ends at it: the earliest stop wins)."""
    return min(curves.items(), key=lambda kv: (kv[1][-1][1], kv[1][-1][0]))


def timed(curve: Curve, seconds_per_step: float) -> list[tuple[float, float]]:
    return [(s * seconds_per_step, ce) for s, ce in curve]


def swarm_run(a, cfg, train, data, eval_xy, costs, k, schedule, regime_name, stop=None) -> dict:
    """One simulated swarm of K x B peers under a schedule and regime, on the cost model's clock (regime priced by
    costs.priced_regime); with `stop`, it ends at the first measurement at or below that CE."""
    B, H, peers = cfg.blocks, a.steps_per_round, k * cfg.blocks
    rounds_per_block = max(1, a.steps // H)
    name = schedule.removesuffix("-pinned")
    turn = max(1, round((a.turn if name == "sequential" else a.growth) * rounds_per_block))
    rounds = B * turn if name == "sequential" else rounds_per_block
    regime = priced_regime(regime_named(regime_name), costs.block_s[0])
    pulls = {"pull_codec": a.pull_codec, "pull_int8_levels": a.pull_int8_levels or None}
    sim_cfg = SimConfig(cfg, train, 1, rounds, H, eval_tokens=a.eval_tokens, eval_every=a.eval_every, **pulls)
    policy = make_policy(regime_policy(regime), regime, H)
    plan = SchedulePlan(name, peers, turn, schedule.endswith("-pinned"), a.balance_steps)
    sim = ScheduledSimulator(sim_cfg, regime, policy, data, eval_xy, plan, costs)
    result = SimResult(regime.name, policy.name, train.seed, sim.measure())
    for r in range(1, rounds + 1):  # the engine's run loop, ended once the target is reached
        record = sim.step()
        if r % a.eval_every == 0 or r == rounds:
            record.ce = sim.measure()
        result.rounds.append(record)
        if record.ce is not None and stop is not None and record.ce <= stop:
            break
    rounds = len(result.rounds)
    held = peers * sum(r.seconds for r in result.rounds)
    return {
        "schedule": schedule,
        "block_steps": list(sim.block_steps),
        "turn_rounds": turn,
        "rounds": rounds,
        "curve": result.curve(),
        "wall_s": result.sim_wall_s,
        "ce": result.ce,
        "busy_share": sum(r.trained_s for r in sim.records) / held if held else 0.0,
        "participation": result.participation,
        "wire_bytes_per_peer_round": (result.wire_bytes + sum(r.pull_bytes for r in sim.records)) / (peers * rounds),
        "raw_fp32_bytes_per_peer_round": raw_bytes_per_round(sim, peers, rounds, costs),
        "staffing": [r.staffing for r in sim.records],
    }


def raw_bytes_per_round(sim: ScheduledSimulator, peers: int, rounds: int, costs: StepCosts) -> float:
    """What the same rounds would move in fp32, uncompressed: every accepted delta's raw bytes to its group and
    every pull and download at fp32."""
    raw = 0.0
    for rec in sim.records:
        for n in rec.staffing:
            raw += n * ((n - 1) * costs.block_bytes + (sum(rec.staffing) - 1) * costs.table_bytes)
        raw += rec.pull_raw_bytes
    return raw / (peers * rounds)


def clock(a: argparse.Namespace, cfg: ModelConfig, base: TrainConfig) -> StepCosts:
    """The step costs: --costs' (a saved result's "costs" or a StepCosts JSON) or measured here; with --fixed-costs,
    a daemon's fixed seconds a round and per pull as clock_check.py measured them."""
    saved = json.loads(a.costs.read_text()) if a.costs else None
    costs = StepCosts.from_dict(saved.get("costs", saved)) if saved else measure_step_costs(cfg, base, a.device)
    if a.fixed_costs:
        fixed = json.loads(a.fixed_costs.read_text())["costs"]
        costs = replace(costs, round_s=fixed["round_s"], pull_s=fixed["pull_s"])
    return costs


def references(a, cfg, base, data, eval_xy, costs, k: int, one_peer: tuple, stop) -> dict:
    """The references at P = K x B of --references: sync DP ideal (a P-fold batch, best of --lrs), the E2E model
    pipelined over the peers per regime (stages of K replicas: the K-fold batch) and one block of the whole depth;
    one_peer: the one-peer E2E's (lr, steps curve, target CE)."""
    (e2e_lr, e2e_steps, target), P, B = one_peer, k * cfg.blocks, cfg.blocks
    every, refs = a.steps_per_round * a.eval_every, {}

    def curve(lr: float, batch: int, until: float | None) -> Curve:
        return e2e_curve(cfg, replace(base, lr=lr, batch_size=batch), data, eval_xy, a.steps, every, until)

    if "sync_dp" in a.references:
        lr, dp = best({lr: curve(lr, P * a.batch_size, target) for lr in a.lrs})
        refs["sync_dp_ideal"] = {"lr": lr, "curve": timed(dp, costs.e2e_s)}
    if "pipelined" in a.references:
        stage = e2e_steps if k == 1 else curve(e2e_lr, k * a.batch_size, target)
        for regime_name in a.regimes:
            r = priced_regime(regime_named(regime_name), costs.block_s[0])
            per_step = pipelined_e2e_s(costs, 1, B, r.bandwidth_Bps.median, r.latency_s.median)
            refs[f"pipelined_e2e/{regime_name}"] = {"curve": timed(stage, per_step)}
    if "one_block" in a.references:  # its step is the E2E step (no predecessors), the P peers its replicas
        one_cfg = replace(cfg, blocks=1, layers_per_block=B * cfg.layers_per_block)
        train = replace(base, lr=e2e_lr, total_steps=a.steps)
        one_costs = replace(costs, block_s=(costs.e2e_s,))
        one = swarm_run(a, one_cfg, train, data, eval_xy, one_costs, P, "concurrent", "lockstep", stop)
        refs["one_block/lockstep"] = {"curve": one["curve"], "busy_share": one["busy_share"]}
    return refs


def run(a: argparse.Namespace) -> dict:
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg = model_of(a)
    data, eval_xy = swarm_text(a, cfg)
    if a.train_bytes:
        data = ByteData(data.data[: a.train_bytes].numpy(), cfg.seq_len)
    how = {"min_lr_ratio": a.min_lr_ratio, "trajectory_reuse": a.trajectory_reuse}
    pulls = {"predecessor_pulls": a.predecessor_pulls, "prefetch_pulls": a.prefetch}
    base = TrainConfig(batch_size=a.batch_size, seed=a.seed, **how, **pulls)
    costs = clock(a, cfg, base)
    if a.e2e_from:  # the same one-peer reference as an earlier run (same config, same costs)
        earlier = json.loads(a.e2e_from.read_text())
        e2e_lr, e2e_t, target = earlier["e2e_one_peer"]["lr"], earlier["e2e_one_peer"]["curve"], earlier["target_ce"]
        e2e = [(round(t / costs.e2e_s), ce) for t, ce in e2e_t]
    else:
        every = a.steps_per_round * a.eval_every
        one = {lr: e2e_curve(cfg, replace(base, lr=lr), data, eval_xy, a.steps, every, None) for lr in a.lrs}
        e2e_lr, e2e = best(one)
        target, e2e_t = e2e[-1][1], timed(e2e, costs.e2e_s)
    stop = target if a.stop_at_target else None
    out: dict = {
        "command": command_line("time_to_quality.py", a.argv),
        "machine": machine(),
        "model": cfg.to_dict(),
        "costs": costs.to_dict(),
        "cost_breakdown_last_block": breakdown(cfg, base, cfg.blocks - 1, a.device) if not a.costs else None,
        "target_ce": target,
        "e2e_one_peer": {"lr": e2e_lr, "curve": e2e_t, "time_to_target_s": time_to(e2e_t, target)},
        "references": {},
        "rows": [],
    }
    for k in a.ks:
        P = k * cfg.blocks
        refs = references(a, cfg, base, data, eval_xy, costs, k, (e2e_lr, e2e, target), stop)
        for ref in refs.values():
            ref["time_to_target_s"] = time_to(ref["curve"], target)
        out["references"][str(P)] = refs
        for regime_name, schedule, lr in itertools.product(a.regimes, a.schedules, a.swarm_lrs or [e2e_lr]):
            train = replace(base, lr=lr, total_steps=a.steps)  # each block's cosine spans its own rounds
            row = swarm_run(a, cfg, train, data, eval_xy, costs, k, schedule, regime_name, stop)
            row = {"P": P, "B": cfg.blocks, "K": k, "regime": regime_name, "lr": lr, **row}
            out["rows"].append(against_target(out, row))
            print(json.dumps({x: v for x, v in out["rows"][-1].items() if x not in ("curve", "staffing")}))
            write_json(a.out, out)
    write_json(a.out, out)
    return out


def step_costs(a: argparse.Namespace) -> dict:
    """Where a step goes and what a later block pays, with trajectory replay off (1) and as configured, at each of
    --costs-blocks (default: --blocks): written as the `step_costs` of the result already at --out, if any."""
    torch.set_num_threads(a.threads)
    out: dict = {"command": command_line("time_to_quality.py", a.argv), "machine": machine(), "by_blocks": {}}
    for blocks in a.costs_blocks or [a.blocks]:
        cfg = replace(model_of(a), blocks=blocks)
        at: dict = {"model": cfg.to_dict()}
        for reuse in sorted({1, a.trajectory_reuse}):
            train = TrainConfig(batch_size=a.batch_size, trajectory_reuse=reuse)
            costs = measure_step_costs(cfg, train, a.device)
            at[f"reuse_{reuse}"] = {
                "costs": costs.to_dict(),
                "later_over_first": costs.later_over_first(),
                "breakdown_last_block": breakdown(cfg, train, cfg.blocks - 1, a.device),
            }
            block_ms = [round(x * 1e3, 1) for x in costs.block_s]
            took = f"block ms {block_ms}, e2e {costs.e2e_s * 1e3:.1f} ms, last / first {costs.later_over_first():.2f}"
            print(f"B={blocks} reuse {reuse}: {took}", flush=True)
        out["by_blocks"][str(blocks)] = at
    # beside an earlier result at --out (its step_costs key), else on its own
    write_json(a.out, {**json.loads(a.out.read_text()), "step_costs": out} if a.out.is_file() else out)
    return out


def merged(paths: list[Path]) -> dict:
    """Several runs of one config as one result: the first run's one-peer E2E curve and target, every run's
    references and rows, the derived figures recomputed against that target."""
    runs = [json.loads(p.read_text()) for p in paths]
    out = {**runs[0], "merged_from": [r["command"] for r in runs], "rows": [], "references": {}}
    target = out["target_ce"]
    for r in runs:
        for P, refs in r["references"].items():
            for name, ref in refs.items():
                out["references"].setdefault(P, {})[name] = {**ref, "time_to_target_s": time_to(ref["curve"], target)}
    out["rows"] = [against_target(out, row) for r in runs for row in r["rows"]]
    return out


def against_target(out: dict, row: dict) -> dict:
    """A swarm row with its figures against out's target and references: its time to the target CE, the one-peer
    E2E's CE at its wall time (and the sync DP ideal's, where out holds one at its P) and the E2E's time to target."""
    wall, dp = row["wall_s"], out["references"].get(str(row["P"]), {}).get("sync_dp_ideal", {}).get("curve")
    return row | {
        "e2e_one_peer_ce_at_wall": ce_at(out["e2e_one_peer"]["curve"], wall),
        "sync_dp_ideal_ce_at_wall": ce_at(dp, wall) if dp else None,
        "time_to_target_s": time_to(row["curve"], out["target_ce"]),
        "e2e_one_peer_time_to_target_s": out["e2e_one_peer"]["time_to_target_s"],
    }


def summary(out: dict) -> list[str]:
    """A markdown table: each run's time to the target over the one-peer E2E's, its CE and busy share."""
    e2e = out["e2e_one_peer"]["time_to_target_s"]
    ratio = lambda t: f"{t / e2e:.2f}" if t is not None else "not reached"
    rows = [  # the references (no regime, no busy share), then the swarms
        f"{P} | {name} | | {ref.get('lr', '')} | {ref['curve'][-1][0]:.1f} | {ref['curve'][-1][1]:.4f} "
        f"| {ratio(ref['time_to_target_s'])} |"
        for P, refs in out["references"].items()
        for name, ref in refs.items()
    ]
    for r in out["rows"]:
        label = r["schedule"] + (f" (turn {r['turn_rounds']})" if "turn_rounds" in r else "")
        rows.append(
            f"{r['P']} | {label} | {r['regime']} | {r['lr']:g} | {r['wall_s']:.1f} | {r['ce']:.4f} "
            f"| {ratio(r['time_to_target_s'])} | {r['busy_share']:.2f}"
        )
    head = "P | run | regime | lr | wall s | CE at end | time to target / E2E one peer | busy share"
    target = f"target: the one-peer E2E CE at its last step, {out['target_ce']:.4f}, reached at {e2e:.1f} s"
    return [target, "", *table(head, rows, "lllrrrrr")]


def plot(out: dict, path: Path) -> None:
    """CE against wall time: the one-peer E2E, the references and every swarm row, one panel per P."""
    if (plt := pyplot()) is None:
        return
    peers = sorted({int(P) for P in out["references"]} | {r["P"] for r in out["rows"]})
    fig, axes = plt.subplots(1, len(peers), figsize=(6 * len(peers), 4.5), squeeze=False)
    for ax, P in zip(axes[0], peers):
        curves = [("e2e one peer", out["e2e_one_peer"]["curve"], "k")]
        curves += [(n, ref["curve"], None) for n, ref in out["references"].get(str(P), {}).items()]
        for r in (r for r in out["rows"] if r["P"] == P):
            curves.append((f"{r['schedule']} t{r.get('turn_rounds')} {r['regime']} lr {r['lr']:g}", r["curve"], None))
        for name, curve, color in curves:
            t, ce = zip(*curve[1:])
            ax.plot(t, ce, label=name, color=color, lw=1.2)
        ax.axhline(out["target_ce"], color="grey", ls=":", lw=1)
        ax.set_ylim(out["target_ce"] - 0.15, out["target_ce"] + 0.45)
        ax.set(xlabel="wall time on dedicated hardware (s, cost model)", ylabel="held-out CE (nats/byte)")
        ax.set_title(f"P = {P} peers")
        ax.legend(fontsize=6)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    a = options(argv)
    a.argv = argv
    if a.costs_only:
        step_costs(a)
        return
    out = merged(a.merge) if a.merge else run(a)
    if a.merge:
        out["command"] = command_line("time_to_quality.py", argv)
        write_json(a.out, out)
    plot(out, a.plot)
    print("\n".join(summary(out)))


if __name__ == "__main__":
    main()
