"""Memory and throughput benchmark: one BlockTrain block worker versus the E2E model of equal depth.

Peak memory (ru_maxrss after --mem-steps steps minus before building the model, each case in a fresh subprocess),
tokens/s (block and E2E steps timed interleaved), the litepaper config's `blocktrain model-info` and what trajectory
training costs a peer. Writes --out (JSON).

    python benchmarks/memory_throughput.py --data-dir $BLOCKTRAIN_DATA
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import options, results
from benchmarks.harness.procs import maxrss_bytes
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.memory import GIB, model_info
from swarmd.core.train import BlockTrainer, E2ETrainer, init_block

CPU_CFG = dict(blocks=3, layers_per_block=2, d_model=128, n_heads=4, hidden=512, seq_len=128)
PAPER_CFG = dict(blocks=3, layers_per_block=4, d_model=512, n_heads=8, hidden=2048)
CASES = ("block", "block_trajectory", "e2e")
INFO_KEYS = ("block_params", "embedding_params", "active_trainable_params", "active_adamw_bytes", "active_adamw_gib")
INFO_KEYS += ("full_stack_adamw_bytes", "full_stack_adamw_gib", "e2e_params", "stack_params")
PAPER_ADAMW_GIB = 0.198


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = options.parser(__doc__, holds="train.txt")
    options.add_outputs(p, "memory_throughput.json")
    p.add_argument("--mem-steps", type=int, default=5, help="optimiser steps per memory case")
    p.add_argument("--tput-steps", type=int, default=12, help="timed steps per model (after 2 warm-up steps)")
    options.add_torch(p)
    p.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # subprocess mode
    return options.parse_checked(p, argv, holds="train.txt")


def make_trainer(case: str, mcfg: ModelConfig, seed: int):
    if case == "e2e":
        return E2ETrainer(mcfg, TrainConfig(seed=seed))
    if case == "block":
        return BlockTrainer(mcfg, TrainConfig(seed=seed), 0)
    last = mcfg.blocks - 1
    trainer = BlockTrainer(mcfg, TrainConfig(seed=seed, trajectory_prob=1.0), last)
    trainer.set_others({b: init_block(mcfg, b, seed).requires_grad_(False) for b in range(last)})
    return trainer


def batches(args: argparse.Namespace, mcfg: ModelConfig):
    torch.set_num_threads(args.threads)
    return ByteData.from_path(Path(args.data_dir) / "train.txt", mcfg.seq_len).stream(args.seed, TrainConfig.batch_size)


def run_case(args: argparse.Namespace) -> None:
    """Subprocess body: print one JSON line with the peak-RSS increase of training one case."""
    torch.manual_seed(args.seed)
    mcfg = ModelConfig(**CPU_CFG)
    stream = batches(args, mcfg)
    steps = [next(stream) for _ in range(args.mem_steps)]
    before = maxrss_bytes()
    trainer = make_trainer(args.case, mcfg, args.seed)
    for x, y in steps:
        trainer.step(x, y)
    after = maxrss_bytes()
    rss = {"maxrss_before_bytes": before, "maxrss_after_bytes": after, "peak_added_bytes": after - before}
    print(json.dumps({"case": args.case, **rss}))


def throughput(args: argparse.Namespace) -> dict:
    mcfg = ModelConfig(**CPU_CFG)
    stream = batches(args, mcfg)
    trainers = {case: make_trainer(case, mcfg, args.seed) for case in CASES}
    times: dict[str, list[float]] = {case: [] for case in trainers}
    for i in range(args.tput_steps + 2):
        for case, trainer in trainers.items():  # interleaved, so load changes hit every case alike
            x, y = next(stream)
            t0 = time.perf_counter()
            trainer.step(x, y)
            if i >= 2:
                times[case].append(time.perf_counter() - t0)
    tokens = TrainConfig.batch_size * mcfg.seq_len
    medians = {case: statistics.median(t) for case, t in times.items()}
    out: dict = {case: {"median_step_s": m, "tokens_per_s": tokens / m} for case, m in medians.items()}
    for case in CASES[:2]:
        out[f"{case}_over_e2e_tokens_per_s"] = out[case]["tokens_per_s"] / out["e2e"]["tokens_per_s"]
    out["timed_steps"] = args.tput_steps
    return out


def trajectory_cost(cfg: ModelConfig) -> dict:
    """What a block-b peer holds/downloads to run blocks 0..b-1 frozen (worst case b = B-1)."""
    info = model_info(cfg)
    fp32 = (cfg.blocks - 1) * info["block_params"] * 4
    return {
        "frozen_blocks": cfg.blocks - 1,
        "download_bytes_per_round_fp32": fp32,
        "download_bytes_per_round_bf16": fp32 // 2,
        "frozen_weights_bytes_fp32": fp32,
        "frozen_weights_gib_fp32": fp32 / GIB,
        "vs_active_adamw_bytes": fp32 / info["active_adamw_bytes"],
        "note": "a block-b peer needs blocks 0..b-1 (block 0 needs none); worst case b = B-1 shown; "
        "weights only, no grads or optimizer state",
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.case:
        run_case(args)
        return {}
    memory = {}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    for case in CASES:
        flags = ["--data-dir", str(args.data_dir), "--case", case, "--mem-steps", str(args.mem_steps)]
        flags += ["--threads", str(args.threads), "--seed", str(args.seed)]
        run = subprocess.run([sys.executable, __file__, *flags], check=True, capture_output=True, text=True, env=env)
        line = run.stdout.strip().splitlines()[-1]
        memory[case] = json.loads(line)
        print(line, flush=True)
    for case in CASES[:2]:
        memory[f"{case}_over_e2e_peak_added"] = memory[case]["peak_added_bytes"] / memory["e2e"]["peak_added_bytes"]
    memory["method"] = (
        "resource.getrusage(RUSAGE_SELF).ru_maxrss after training minus before building the model, "
        "one fresh subprocess per case"
    )
    tput = throughput(args)
    print(json.dumps(tput), flush=True)
    info_cmd = ["blocktrain", "model-info"]
    info_cmd += [arg for k, v in PAPER_CFG.items() for arg in (f"--{k.replace('_', '-')}", str(v))] + ["--json"]
    cli = subprocess.run(info_cmd, capture_output=True, text=True)
    paper_info = json.loads(cli.stdout) if cli.returncode == 0 else model_info(ModelConfig(**PAPER_CFG))
    config = CPU_CFG | {"batch_size": TrainConfig.batch_size, "threads": args.threads, "mem_steps": args.mem_steps}
    result = {
        "config": config,
        "peak_memory": memory,
        "throughput": tput,
        "model_info_paper_config": {k: paper_info[k] for k in INFO_KEYS},
        "model_info_command": " ".join(info_cmd),
        "paper_active_adamw_gib": PAPER_ADAMW_GIB,
        "active_adamw_vs_paper": paper_info["active_adamw_gib"] / PAPER_ADAMW_GIB,
        "trajectory_cost_paper_config": trajectory_cost(ModelConfig(**PAPER_CFG)),
        "trajectory_cost_cpu_config": trajectory_cost(ModelConfig(**CPU_CFG)),
        "command": results.command_line("memory_throughput.py", argv),
        "torch": torch.__version__,
    }
    results.write_json(args.out, result, sort_keys=False)
    return result


if __name__ == "__main__":
    main()
