"""Clock check: the time-to-quality cost model's round time against real daemons, each pinned to one core.

Measures the step costs of the daemons' training config pinned to one core, runs the schedule in the simulator
(concurrent, one peer per block, lockstep) and as real daemons (peer i under `taskset -c <core i>`, one thread),
and reads their merge-to-merge round times from their checkpoints. The first run (H = --steps-per-round) measures
the fixed costs a round (round_s: block 0's, which pulls nothing) and per predecessor pull (pull_s); a second at
--check-steps is predicted with them. Writes --out: per run and peer, the measured and modelled round times.

    python benchmarks/clock_check.py --data-dir ../shared/data/wikitext-2
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import sweeps
from benchmarks.harness.daemons import Swarm, history
from benchmarks.harness.options import add_outputs, add_shape, model_of, parse_checked, parser
from benchmarks.harness.results import command_line, machine, write_json
from swarmd.averaging.config import GossipConfig
from swarmd.core.data import ByteData
from swarmd.sim.costs import StepCosts, measure_step_costs, priced_regime
from swarmd.sim.engine import SimConfig
from swarmd.sim.policies import make_policy, regime_policy
from swarmd.sim.regimes import regime_named
from swarmd.sim.scheduled import ScheduledSimulator, SchedulePlan


def options(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, holds="train.txt and eval.txt")
    add_shape(p, blocks=2, d_model=64, seq_len=64, layers_per_block=1)
    add_outputs(p, "clock_check.json")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps-per-round", type=int, default=25, help="H of the run that measures round_s")
    p.add_argument("--check-steps", type=int, default=50, help="H of the run predicted with it (0: none)")
    p.add_argument("--rounds", type=int, default=12, help="rounds each daemon runs (the first is not timed)")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--cores", type=int, nargs="+", help="the core of each peer (default: 0 .. peers - 1)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds the daemons may take")
    p.add_argument("--prefetch", action="store_true", help="mid-round pulls run while the steps go on (TrainConfig)")
    p.add_argument(
        "--balance-steps", type=float, default=GossipConfig.balance_steps, help="a faster peer's steps, at most x H"
    )
    a = parse_checked(p, argv, "train.txt")
    a.cores = a.cores or list(range(a.blocks))
    if len(a.cores) != a.blocks or max(a.cores) >= (os.cpu_count() or 1):
        p.error(f"--cores needs one core per peer ({a.blocks}) below {os.cpu_count()}, got {a.cores}")
    return a


def daemons(a: argparse.Namespace, steps: int, workdir: Path) -> Swarm:
    """The swarm under test at H=steps: one peer per block, peer i pinned to core i (taskset), one torch thread."""
    python = [sys.executable, "-m", "swarmd", "--verbose", "--config"]  # the config file's path follows
    programs = {i: ["taskset", "-c", str(core), *python] for i, core in enumerate(a.cores)}
    schedule = {"rounds": a.rounds, "steps_per_round": steps, "batch_size": a.batch_size, "lr": a.lr}
    schedule.update(prefetch_pulls=a.prefetch, balance_steps=a.balance_steps)
    return Swarm(a.blocks, model_of(a), a.data_dir / "train.txt", workdir, **schedule, programs=programs)


def step_costs(core: int, swarm: Swarm) -> StepCosts:
    """The step costs of the daemons' config, measured pinned to `core` with one thread."""
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    costs = measure_step_costs(swarm.config.model, swarm.config.train)
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return costs


def modelled_round_s(a: argparse.Namespace, swarm: Swarm, costs: StepCosts) -> float:
    """The cost model's median round time (the first left out) for the swarm's schedule (concurrent, one peer per
    block, lockstep)."""
    cfg, train, steps = swarm.config.model, swarm.config.train, swarm.config.gossip.steps_per_round
    regime = priced_regime(regime_named("lockstep"), costs.block_s[0])
    data = ByteData.from_path(a.data_dir / "train.txt", cfg.seq_len)
    eval_xy = ByteData.from_path(a.data_dir / "eval.txt", cfg.seq_len).eval_windows(1024)
    sim_cfg = SimConfig(cfg, train, 1, a.rounds, steps, eval_tokens=1024, eval_every=a.rounds)
    policy = make_policy(regime_policy(regime), regime, steps)
    plan = SchedulePlan("concurrent", cfg.blocks, 1, True, swarm.config.gossip.balance_steps)
    sim = ScheduledSimulator(sim_cfg, regime, policy, data, eval_xy, plan, costs)
    return statistics.median([sim.step().seconds for _ in range(a.rounds)][1:])


def measured_rounds(swarm: Swarm, timeout_s: float) -> list[dict]:
    """Each daemon's merge-to-merge round times (from its checkpointed round history), train and exchange seconds
    and the rest (fixed seconds = round - train - exchange)."""
    sweeps.run_to_end(swarm, "the daemons did not finish their rounds", start_s=120, wait_s=timeout_s)
    out = []
    for p in swarm.peers:
        h = history(p)
        rounds = [b["at_s"] - a["at_s"] for a, b in itertools.pairwise(h)]
        exchange, train = [r["seconds"] for r in h[1:]], [r.get("train_s", 0.0) for r in h[1:]]
        fixed = [r - t - x for r, t, x in zip(rounds, train, exchange)]
        times = {"each_round_s": rounds, "each_exchange_s": exchange, "each_train_s": train, "each_fixed_s": fixed}
        out.append({**times, "each_steps": [r.get("steps", 0) for r in h[1:]]})
    return out


def one_run(
    a: argparse.Namespace, steps: int, fixed: tuple[float, float] | None
) -> tuple[list[dict], StepCosts, Swarm]:
    """A swarm at H=steps: its rows, the model without and with `fixed` (StepCosts.round_s, pull_s; None: measured
    in this run, from the daemons' fixed seconds a round: block 0's, and a later block's less that, per pull)."""
    with tempfile.TemporaryDirectory(prefix="clock-check-") as tmp:
        swarm = daemons(a, steps, Path(tmp))
        costs = step_costs(a.cores[0], swarm)
        measured = measured_rounds(swarm, a.timeout)
    train = swarm.config.train
    pulls = [train.predecessor_pulls * p.block if train.trajectory_prob else 0 for p in swarm.peers]
    if fixed is None:  # block 0 pulls nothing: its fixed seconds are round_s; a later block's rest is its pulls'
        round_s = statistics.median(f for m, n in zip(measured, pulls) if not n for f in m["each_fixed_s"])
        per_pull = [(f - round_s) / n for m, n in zip(measured, pulls) if n for f in m["each_fixed_s"]]
        fixed = round_s, max(0.0, statistics.median(per_pull)) if per_pull else 0.0
    costs = replace(costs, round_s=fixed[0], pull_s=fixed[1])
    free_s = modelled_round_s(a, swarm, replace(costs, round_s=0.0, pull_s=0.0))
    model_s = modelled_round_s(a, swarm, costs)
    rows = []
    for i, m in enumerate(measured):
        real_s = statistics.median(m["each_round_s"])
        medians = {f"{k}_s": statistics.median(m[f"each_{k}_s"]) for k in ("train", "exchange", "fixed")}
        row = {
            "steps_per_round": steps,
            "peer": i,
            "block": swarm.peers[i].block,
            "core": a.cores[i],
            "measured_round_s": real_s,
            "modelled_round_s": model_s,
            "measured_over_modelled": real_s / model_s,
            "modelled_without_round_s": free_s,
            "measured_over_modelled_without": real_s / free_s,
            **medians,
            "rounds_timed": len(m["each_round_s"]),
            **m,
        }
        rows.append(row)
        print(
            f"H={steps} peer {i} (block {row['block']}, core {a.cores[i]}): round {real_s:.3f} s measured, "
            f"{model_s:.3f} s modelled with round_s {costs.round_s:.3f} and pull_s {costs.pull_s:.3f} (ratio "
            f"{real_s / model_s:.2f}), {free_s:.3f} without (ratio {real_s / free_s:.2f}); train "
            f"{medians['train_s']:.3f}, exchange {medians['exchange_s']:.3f}, fixed {medians['fixed_s']:.3f} s",
            flush=True,
        )
    return rows, costs, swarm


def main(argv: list[str] | None = None) -> None:
    a = options(argv)
    rows, costs, swarm = one_run(a, a.steps_per_round, None)
    if a.check_steps:
        rows += one_run(a, a.check_steps, (costs.round_s, costs.pull_s))[0]
    out = {
        "command": command_line("clock_check.py", argv),
        "machine": machine(),
        "model": swarm.config.model.to_dict(),
        "steps_per_round": a.steps_per_round,
        "check_steps": a.check_steps,
        "costs": costs.to_dict(),
        "rows": rows,
    }
    write_json(a.out, out)


if __name__ == "__main__":
    main()
