"""Depth instrument tables (issue 19): render benchmarks/quality.py results into one markdown fragment.

Reads quality.py result JSONs (each a run with the depth instrument: `trace`, `kl`, `depth_recovery`,
`lr_sweep`, optionally the `--swarm` stack) and writes, between <!-- depth.py --> markers in --md, a table
with one row per run (task, shape, steps per block, block 0 alone, the trace and KL per block, stack, E2E
and plain CE, depth recovery, the swarm's, wall time) and the learning-rate sweep of each run. Nothing is
trained here: the figures are the JSONs'.

    python benchmarks/depth.py benchmarks/results/depth_*.json --md benchmarks/results/ISSUE19_depth.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

MODELS = ("blocktrain", "swarm", "e2e", "e2e1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path, nargs="+", help="quality.py result JSONs")
    p.add_argument("--md", type=Path, default=common.RESULTS / "ISSUE19_depth.md")
    p.add_argument("--section", default="depth.py")
    return p.parse_args(argv)


def fmt(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def per_block(values: list | None, digits: int = 3) -> str:
    return "-" if not values else " / ".join("-" if v is None else f"{v:.{digits}f}" for v in values)


def name(path: Path, r: dict) -> str:
    c = r["config"]["model"]
    task = (r.get("task") or {}).get("name", "wikitext")
    return f"{task} B={c['blocks']} L_b={c['layers_per_block']} d={c['d_model']} ({path.stem})"


def lines_for(results: list[tuple[Path, dict]]) -> list[str]:
    out = [
        "| run | steps per block | block 0 alone | trace (CE cut after block 0..B-1) | KL(p_b ‖ p_b-1), b=1..B-1 "
        "| stack | E2E | plain L_b | gained: block 0 - stack | available: plain - E2E | depth recovery | swarm trace "
        "| swarm depth recovery | training s, all runs |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for path, r in results:
        kl = (r.get("kl") or [None])[1:]
        out.append(
            f"| {name(path, r)} | {r.get('steps_per_block', '-')} | {fmt(r.get('block0_alone_ce'))} "
            f"| {per_block(r.get('trace'))} | {per_block(kl, 4)} | {fmt(r.get('blocktrain_ce'))} "
            f"| {fmt(r.get('e2e_ce'))} | {fmt(r.get('e2e_one_block_ce'))} | {fmt(r.get('depth_gained'))} "
            f"| {fmt(r.get('depth_available'))} | {fmt(r.get('depth_recovery'), 3)} "
            f"| {per_block(r.get('swarm_trace'))} | {fmt(r.get('swarm_depth_recovery'), 3)} "
            f"| {r['seconds'].get('total', '-')} |"
        )
    out += [
        "",
        "depth recovery = (block 0 alone - stack) / (plain L_b-layer model - E2E), each model at its best learning "
        "rate; `-` where a model was not run or the denominator is not above 0.001 (the JSON's "
        "`depth_recovery_reason`). KL in nats/byte, averaged over the held-out positions.",
        "",
        "Learning-rate sweeps (held-out CE at the end of each run; the best per model, marked *, is the one reported):",
        "",
        "| run | model | " + " | ".join(f"lr {lr:g}" for lr in all_lrs(results)) + " | wall s per run |",
        "|---|---|" + "---:|" * len(all_lrs(results)) + "---|",
    ]
    for path, r in results:
        sweep = r.get("lr_sweep") or {}
        best = sweep.get("best", {})
        for model in MODELS:
            runs = {x["lr"]: x for x in sweep.get("runs", []) if x["model"] == model}
            if not runs:
                continue
            cells = [
                "-" if lr not in runs else f"{runs[lr]['eval_ce']:.4f}{'*' if best.get(model) == lr else ''}"
                for lr in all_lrs(results)
            ]
            walls = " / ".join(f"{runs[lr]['seconds']:.0f}" for lr in sorted(runs))
            out.append(f"| {name(path, r)} | {model} | " + " | ".join(cells) + f" | {walls} |")
    return out


def all_lrs(results: list[tuple[Path, dict]]) -> list[float]:
    return sorted({x["lr"] for _, r in results for x in (r.get("lr_sweep") or {}).get("runs", [])})


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    results = [(path, json.loads(path.read_text())) for path in a.results]
    lines = lines_for(results)
    common.replace_section(a.md, a.section, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
