"""Clock check: the time-to-quality cost model's round time against real daemons, each pinned to one core.

time_to_quality's wall times are composed: per-step costs measured on the real trainer with one thread (one peer's
device), times H, plus the simulator's network and merge. This script checks the composition. It measures the
step costs of the daemons' own training config in this process, pinned to one core (the rest of the machine
idle), runs the same schedule in the simulator (swarmd.sim.scheduled: concurrent, one peer per block, the lockstep
regime, loopback-fast), then starts the same swarm as real daemons (`python -m swarmd`), peer i under `taskset -c
<core i>` with one torch thread, and reads their merge-to-merge round times from their checkpoints. Rows: per
peer, the measured median round time, the model's, their ratio, and the daemon's own median seconds of exchange.

    python benchmarks/clock_check.py --data-dir ../shared/data/wikitext-2
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness.daemons import Swarm, check_exit, history
from benchmarks.harness.options import add_outputs, add_shape, model_of, parse_checked, parser
from benchmarks.harness.results import command_line, machine, write_json
from swarmd.core.data import ByteData
from swarmd.sim.costs import measure_step_costs, priced_regime
from swarmd.sim.engine import SimConfig
from swarmd.sim.policies import make_policy, regime_policy
from swarmd.sim.regimes import regime_named
from swarmd.sim.scheduled import ScheduledSimulator, SchedulePlan


def options(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, holds="train.txt and eval.txt")
    add_shape(p, blocks=2, d_model=64, seq_len=64, layers_per_block=1)
    add_outputs(p, "clock_check.json")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps-per-round", type=int, default=25, help="H")
    p.add_argument("--rounds", type=int, default=12, help="rounds each daemon runs (the first is not timed)")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--cores", type=int, nargs="+", help="the core of each peer (default: 0 .. peers - 1)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds the daemons may take")
    a = parse_checked(p, argv, "train.txt")
    a.cores = a.cores or list(range(a.blocks))
    if len(a.cores) != a.blocks or max(a.cores) >= (os.cpu_count() or 1):
        p.error(f"--cores needs one core per peer ({a.blocks}) below {os.cpu_count()}, got {a.cores}")
    return a


def daemons(a: argparse.Namespace, workdir: Path) -> Swarm:
    """The swarm under test: one peer per block, peer i pinned to core i (taskset), one torch thread each."""
    python = [sys.executable, "-m", "swarmd", "--verbose", "--config"]  # the config file's path follows
    programs = {i: ["taskset", "-c", str(core), *python] for i, core in enumerate(a.cores)}
    return Swarm(
        a.blocks,
        model_of(a),
        a.data_dir / "train.txt",
        workdir,
        rounds=a.rounds,
        steps_per_round=a.steps_per_round,
        batch_size=a.batch_size,
        lr=a.lr,
        programs=programs,
    )


def modelled_rounds(a: argparse.Namespace, swarm: Swarm) -> tuple[dict, list[float]]:
    """The cost model's step costs of the daemons' config (measured pinned to the first core) and its round
    times for the same schedule (concurrent, one peer per block, lockstep)."""
    os.sched_setaffinity(0, {a.cores[0]})
    torch.set_num_threads(1)
    cfg, train = swarm.config.model, swarm.config.train
    costs = measure_step_costs(cfg, train)
    regime = priced_regime(regime_named("lockstep"), costs.block_s[0])
    data = ByteData.from_path(a.data_dir / "train.txt", cfg.seq_len)
    eval_xy = ByteData.from_path(a.data_dir / "eval.txt", cfg.seq_len).eval_windows(1024)
    sim_cfg = SimConfig(cfg, train, 1, a.rounds, a.steps_per_round, eval_tokens=1024, eval_every=a.rounds)
    policy = make_policy(regime_policy(regime), regime, a.steps_per_round)
    plan = SchedulePlan("concurrent", cfg.blocks, 1, True)
    sim = ScheduledSimulator(sim_cfg, regime, policy, data, eval_xy, plan, costs)
    seconds = [sim.step().seconds for _ in range(a.rounds)]
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return costs.to_dict(), seconds


def measured_rounds(swarm: Swarm, timeout_s: float) -> list[dict]:
    """Each daemon's merge-to-merge round times (from its checkpointed round history) and exchange seconds."""
    swarm.start()
    try:
        check_exit(swarm, swarm.wait(timeout_s), "the daemons did not finish their rounds")
    finally:
        swarm.stop()
    out = []
    for p in swarm.peers:
        h = history(p)
        at = [r["at_s"] for r in h]
        out.append(
            {
                "each_round_s": [b - a for a, b in itertools.pairwise(at)],
                "each_exchange_s": [r["seconds"] for r in h[1:]],
            }
        )
    return out


def run(a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="clock-check-") as tmp:
        swarm = daemons(a, Path(tmp))
        costs, modelled = modelled_rounds(a, swarm)
        measured = measured_rounds(swarm, a.timeout)
    model_s = statistics.median(modelled[1:])
    rows = []
    for i, m in enumerate(measured):
        real_s = statistics.median(m["each_round_s"])
        rows.append(
            {
                "peer": i,
                "block": swarm.peers[i].block,
                "core": a.cores[i],
                "measured_round_s": real_s,
                "modelled_round_s": model_s,
                "measured_over_modelled": real_s / model_s,
                "exchange_s": statistics.median(m["each_exchange_s"]),
                "rounds_timed": len(m["each_round_s"]),
                **m,
            }
        )
        print(
            f"peer {i} (block {rows[-1]['block']}, core {a.cores[i]}): round {real_s:.3f} s measured, "
            f"{model_s:.3f} s modelled, ratio {real_s / model_s:.2f}, exchange {rows[-1]['exchange_s']:.3f} s",
            flush=True,
        )
    return {
        "command": command_line("clock_check.py", a.argv),
        "machine": machine(),
        "model": swarm.config.model.to_dict(),
        "steps_per_round": a.steps_per_round,
        "costs": costs,
        "modelled_round_s": modelled,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    a = options(argv)
    a.argv = argv
    write_json(a.out, run(a))


if __name__ == "__main__":
    main()
