"""Quality benchmark: BlockTrain versus the end-to-end reference at equal optimiser steps per block.

Trains a BlockTrain stack (B blocks of L_b layers, one block at a time, no gradient crossing
blocks, byte table averaged every round), the E2E reference (one causal transformer of the same
width and B x L_b layers) and a plain model of one block's depth (the E2E model with L_b layers)
on the same training text, with the same batch size, sequence length, optimiser and as many
optimiser steps as each block gets. After every round each is scored on the held-out text:
BlockTrain by from-noise CE (the Euler sampler from a fixed noise seed, with the CE after every
sampler step as `trace`; trace[0] is block 0 alone), the plain models by next-byte CE. At the end
every model is also scored on a second held-out slice (`other_text`: eval.txt bytes after the
scored ones), so no figure rests on one file region.

Writes <out>.json (curve: one row per model and evaluation, CE against training bytes per block;
final blocktrain_ce, e2e_ce, ratio, block0_alone_ce, e2e_one_block_ce, trace, other_text, config,
seconds, history, command) and <out>.png (the scaling curve; skipped with a one-line note when
matplotlib is missing). The default budget is 8 rounds x 200 steps per block (B=3, L_b=2, d=128,
seq 128, batch 32); about an hour per model on one CPU thread, so screen at --rounds 2. --only
runs one model (blocktrain, e2e, e2e1 = one block's depth); --merge a.json b.json ... assembles
separately run models into one result and plot without training. BlockTrain trains with
trajectory inputs by default here (--trajectory-prob 1); --trajectory-prob 0 gives the documented
noisy-target mechanics. Issue 8 mechanics: --context-input, --z-in-init, --freeze-z-in,
--pred-input (see swarmd/core/config.py and BENCHMARKS.md#quality).

Depth instrument (issue 19; swarmd.core.evaluate.depth_trace, depth_recovery): at the end the stack is
scored once more in one sampler sweep that also gives, per block b, KL(p_b || p_{b-1}) between block b's
and block b-1's predicted next-byte distributions (`kl`, nats/byte, None for block 0), next to `trace`
(the CE of the stack cut after block b), and depth_recovery = (block 0 alone - stack) / (plain L_b-layer
model - E2E) (`depth_recovery`, None with `depth_recovery_reason` when a CE is missing or the denominator
is ~0). --lr-sweep 1e-3,3e-3 trains every model at every learning rate and reports each at its best by
held-out CE (`lr_sweep`: every run, and the best lr per model). --task copy trains on a generated copy task
(each line 6-24 random lowercase letters, `|`, the same letters again; --copy-bytes of training text,
seeded, in a temporary folder) instead of WikiText. --swarm also trains the stack as a LocalSwarm of one
daemon per block (same model, TrainConfig, rounds x steps; the peers' own data streams, --swarm-codec
deltas) and scores the assembled checkpoint with the same trace and KL (`swarm_ce`, `swarm_trace`,
`swarm_kl`, `swarm_depth_recovery`). --reference-layout block gives the E2E and plain references a block's byte tables
(untied context table, row-normalised output table; E2EModel) instead of one tied table.

    python benchmarks/quality.py --data-dir $BLOCKTRAIN_DATA --out benchmarks/results/quality
    python benchmarks/quality.py --task copy --blocks 2 --layers-per-block 1 --lr-sweep 1e-3,3e-3 --swarm
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import options, results
from swarmd.averaging.config import GossipConfig
from swarmd.core.config import BLOCK_INITS, ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import depth_recovery, depth_trace, e2e_ce
from swarmd.core.local_run import RoundReport, train_blocktrain, train_e2e
from swarmd.core.reference import E2E_LAYOUTS
from swarmd.core.train import seed_for

KINDS = ("blocktrain", "e2e", "e2e1", "swarm")  # the models a run can train, in the order it trains them
STACKS = ("blocktrain", "swarm")  # the BlockTrain stacks: scored from noise, with the depth trace


def lr_list(text: str) -> list[float]:
    """'1e-3,3e-3' -> [0.001, 0.003] (argparse type of --lr-sweep)."""
    try:
        lrs = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--lr-sweep wants comma-separated numbers, got {text!r}") from exc
    if not lrs or any(lr <= 0 for lr in lrs):
        raise argparse.ArgumentTypeError(f"--lr-sweep wants positive learning rates, got {text!r}")
    return lrs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = options.parser(__doc__, holds="train.txt and eval.txt")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results/quality"),
        help="output path without extension (.json and .png are written)",
    )
    p.add_argument("--long", action="store_true", help="8 rounds x 250 steps per block instead of the default 8 x 200")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--steps-per-round", type=int, default=None)
    p.add_argument("--eval-tokens", type=int, default=16384)
    p.add_argument(
        "--other-tokens",
        type=int,
        default=16384,
        help="bytes of the second held-out slice (eval.txt after the scored bytes); 0 = skip",
    )
    p.add_argument("--eval-steps", type=int, default=None, help="sampler steps at eval (default one per block)")
    p.add_argument(
        "--only",
        choices=("all", "both", "blocktrain", "e2e", "e2e1", "swarm"),
        default="all",
        help="all: BlockTrain, E2E and the one-block-depth model; both: BlockTrain and E2E; or one of them "
        "(swarm: only the LocalSwarm stack)",
    )
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="assemble these result JSONs (separate --only runs) into --out; no training",
    )
    p.add_argument(
        "--task",
        choices=("wikitext", "copy"),
        default="wikitext",
        help="wikitext: train.txt / eval.txt of --data-dir; copy: the generated copy task (no --data-dir needed)",
    )
    p.add_argument("--copy-bytes", type=int, default=2_000_000, help="training bytes of the generated copy task")
    p.add_argument(
        "--swarm",
        action="store_true",
        help="also train the stack as a LocalSwarm of one daemon per block and score it with the same trace",
    )
    p.add_argument("--swarm-codec", choices=("fp32", "fp16", "bf16", "int8"), default="int8")
    p.add_argument(
        "--reference-layout",
        choices=E2E_LAYOUTS,
        default="tied",
        help="byte tables of the E2E and plain references: tied (one table in and out) or block (a block's "
        "untied context table and row-normalised output table, without the noise path)",
    )
    options.add_torch(p)
    # model
    options.add_shape(p, blocks=3, d_model=128, seq_len=128, layers_per_block=2)
    p.add_argument("--n-heads", type=int, default=4)
    options.add_block_options(p, ModelConfig())
    p.add_argument("--noise-feature-scale", type=float, default=ModelConfig.noise_feature_scale)
    p.add_argument("--logit-scale", type=float, default=ModelConfig.logit_scale)
    # training
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--lr-sweep",
        type=lr_list,
        default=None,
        help="comma-separated learning rates (e.g. 1e-3,3e-3): every model trains at each and is reported at its "
        "best by held-out CE; default: --lr only",
    )
    options.add_trajectory_options(p, TrainConfig())
    p.add_argument("--trajectory-steps", type=int, default=TrainConfig.trajectory_steps)
    p.add_argument("--sigma-jitter", type=float, default=TrainConfig.sigma_jitter)
    p.add_argument("--table-lr-scale", type=float, default=TrainConfig.table_lr_scale)
    p.add_argument("--handoff-weight", type=float, default=TrainConfig.handoff_weight)
    p.add_argument(
        "--later-lr-scale",
        type=float,
        default=TrainConfig.later_lr_scale,
        help="lr multiplier of blocks 1.. (TrainConfig.later_lr_scale; the one-process stack only)",
    )
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="the stack runs the pipelined schedule (TrainConfig.pipeline): the swarm's peers, and the single-process "
        "stack too (each block trains --rounds rounds, in its turn)",
    )
    p.add_argument(
        "--pipeline-stagger",
        type=int,
        default=TrainConfig.pipeline_stagger,
        help="with --pipeline: rounds between two blocks' starts (rounds = sequential training, block by block)",
    )
    p.add_argument(
        "--block-init",
        choices=BLOCK_INITS,
        default=TrainConfig.block_init,
        help="how a later block starts at its first turn (TrainConfig.block_init; predecessor: its trunk copied from "
        "block b - 1, the one-process stack only)",
    )
    p.add_argument(
        "--predecessor-pulls",
        type=int,
        default=TrainConfig.predecessor_pulls,
        help="times per round snapshot predecessors are refreshed (the stack's snapshots and the swarm's pulls)",
    )
    p.add_argument("--swarm-logs", type=Path, default=None, help="copy the swarm's daemon logs into this folder")
    p.add_argument(
        "--swarm-deadline-max",
        type=float,
        default=GossipConfig.deadline_max_s,
        help="the swarm's GossipConfig.deadline_max_s (its 4 daemons share this machine's cores, so a round's length "
        "changes with how many blocks train: a longer cap measures the schedule, not the contention)",
    )
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.rounds = args.rounds or 8
    args.steps_per_round = args.steps_per_round or (250 if args.long else 200)
    args.lrs = args.lr_sweep or [args.lr]
    if args.later_lr_scale != 1.0 and "swarm" in selected(args):
        p.error("--later-lr-scale is for the one-process stack; the swarm's daemons run the schedule's lr")
    if args.merge or args.task == "copy":
        return args
    return options.check_data(p, args, "train.txt and eval.txt")


def selected(args: argparse.Namespace) -> list[str]:
    """The models this run trains (KINDS order): --only's, plus the swarm with --swarm."""
    picked = {"all": ["blocktrain", "e2e", "e2e1"], "both": ["blocktrain", "e2e"], "swarm": []}.get(args.only)
    kinds = set([args.only] if picked is None else picked)
    if args.swarm or args.only == "swarm":
        kinds.add("swarm")
    return [k for k in KINDS if k in kinds]


def configs(args: argparse.Namespace) -> tuple[ModelConfig, TrainConfig]:
    model = ("blocks", "layers_per_block", "d_model", "n_heads", "seq_len", "noise_feature_scale", "logit_scale")
    mcfg = ModelConfig(hidden=4 * args.d_model, **options.picked(args, (*model, *options.BLOCK_OPTIONS)))
    total = args.steps_per_round * args.rounds
    train = (
        "batch_size",
        "lr",
        "seed",
        "trajectory_steps",
        "sigma_jitter",
        "table_lr_scale",
        "predecessor_pulls",
        "handoff_weight",
        "pipeline",
        "pipeline_stagger",
        "block_init",
        "later_lr_scale",
    )
    tcfg = TrainConfig(
        total_steps=total,
        warmup_steps=min(50, total // 10),
        **options.picked(args, (*train, *options.TRAJECTORY_OPTIONS)),
    )
    return mcfg, tcfg


# ---------------------------------------------------------------------------------------------
# The copy task: a generated depth task (copying needs attention over the line, i.e. depth).
# ---------------------------------------------------------------------------------------------
COPY_LETTERS = "abcdefghijklmnopqrstuvwxyz"
COPY_MIN, COPY_MAX = 6, 24  # letters per string


def copy_text(n_bytes: int, seed: int) -> bytes:
    """n_bytes of copy-task lines: COPY_MIN..COPY_MAX random lowercase letters, '|', the same letters, newline."""
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_bytes:
        word = "".join(rng.choices(COPY_LETTERS, k=rng.randint(COPY_MIN, COPY_MAX)))
        lines.append(f"{word}|{word}\n")
        size += len(lines[-1])
    return "".join(lines).encode()[:n_bytes]


def copy_floor_ce() -> float:
    """The copy task's entropy in nats/byte with unbounded context (what a perfect model scores): each first-half
    letter is one of 26, the end of the string is uniform over COPY_MIN..COPY_MAX, the copy and newline are free.
    Scored windows cut some copies off from their source, so the reachable CE at a finite seq_len is a bit higher."""
    lengths = range(COPY_MIN, COPY_MAX + 1)
    nats = 0.0
    for n in lengths:  # a string of n letters, then '|'
        for j in range(n + 1):  # the byte after j letters
            left = COPY_MAX - max(j, COPY_MIN) + 1  # lengths still possible once j >= COPY_MIN
            stop = 1.0 / left if j >= COPY_MIN else 0.0  # P(the string ends here | it got here)
            nats += -math.log(stop) if j == n else -math.log((1.0 - stop) / len(COPY_LETTERS))
    mean_bytes = sum(2 * n + 2 for n in lengths)
    return nats / mean_bytes


def write_copy_task(folder: Path, train_bytes: int, eval_bytes: int, seed: int) -> dict:
    """train.txt and eval.txt of the copy task in folder (separately seeded); what the result records of it."""
    (folder / "train.txt").write_bytes(copy_text(train_bytes, seed_for("copy-train", seed)))
    (folder / "eval.txt").write_bytes(copy_text(eval_bytes, seed_for("copy-eval", seed)))
    return {
        "name": "copy",
        "lines": f"{COPY_MIN}-{COPY_MAX} random lowercase letters, '|', the same letters, newline",
        "train_bytes": train_bytes,
        "eval_bytes": eval_bytes,
        "seed": seed,
        "floor_ce": copy_floor_ce(),
    }


LABELS = {
    "blocktrain": "BlockTrain, from-noise CE",
    "block0": "its block 0 alone (sampler step 0)",
    "e2e": "E2E, B x L_b layers",
    "e2e1": "plain model, L_b layers (one block's depth)",
    "swarm": "BlockTrain swarm (one daemon per block), from-noise CE",
}


def curve_rows(history: dict[str, list]) -> list[dict]:
    """One row per model and evaluation: CE against training bytes per block."""
    rows = []
    for kind in KINDS:
        for r in history.get(kind, []):
            rows.append(
                {
                    "model": kind,
                    "round": r["round"],
                    "steps_per_block": r["steps_per_block"],
                    "tokens_per_block": r["tokens_per_block"],
                    "eval_ce": r["eval_ce"],
                }
            )
            if kind == "blocktrain" and "trace" in r:
                rows.append(
                    {
                        "model": "block0",
                        "round": r["round"],
                        "steps_per_block": r["steps_per_block"],
                        "tokens_per_block": r["tokens_per_block"],
                        "eval_ce": r["trace"][0],
                    }
                )
    return rows


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib not installed (pip install '.[bench]'): skipped the plot {path}", flush=True)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depth = result.get("depth") or {}
    if depth:
        fig, (ax, dax) = plt.subplots(1, 2, figsize=(12.0, 4.4), gridspec_kw={"width_ratios": [1.3, 1.0]})
    else:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = {"blocktrain": "o-", "block0": "s--", "e2e": "^-", "e2e1": "v-", "swarm": "D"}
    for kind in ("blocktrain", "block0", "e2e", "e2e1", "swarm"):
        rows = [r for r in result["curve"] if r["model"] == kind]
        if rows:
            ax.plot(
                [r["tokens_per_block"] / 1e6 for r in rows],
                [r["eval_ce"] for r in rows],
                styles[kind],
                alpha=0.6 if kind == "block0" else 1.0,
                label=LABELS[kind],
            )
    ax.set_xscale("log")
    ax.set_xlabel("training bytes per block (millions)")
    ax.set_ylabel("held-out CE (nats/byte)")
    c = result["config"]["model"]
    ratio = result.get("ratio")
    ax.set_title(
        f"B={c['blocks']} L_b={c['layers_per_block']} d={c['d_model']} seq={c['seq_len']}: "
        f"ratio {ratio if ratio is not None else float('nan'):.3f}"
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if depth:
        plot_depth(dax, result, depth)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_depth(ax, result: dict, depth: dict) -> None:
    """The depth panel: CE of the stack cut after block b (the trace), E2E and plain as lines, KL as bars."""
    kax = ax.twinx()
    ax.set_zorder(kax.get_zorder() + 1)  # the CE lines over the KL bars
    ax.patch.set_visible(False)
    width = 0.12
    for j, (kind, style) in enumerate((("blocktrain", "o-"), ("swarm", "D-"))):
        d = depth.get(kind)
        if not d:
            continue
        blocks = [r["block"] for r in d["blocks"]]
        (line,) = ax.plot(blocks, [r["ce"] for r in d["blocks"]], style, label=f"{kind}: CE cut after block b")
        kl = [(r["block"], r["kl"]) for r in d["blocks"] if r["kl"] is not None]
        if kl:
            kax.bar(
                [b + (j - 0.5) * width for b, _ in kl],
                [v for _, v in kl],
                width,
                color=line.get_color(),
                alpha=0.3,
                label=f"{kind}: KL(p_b || p_b-1)",
            )
    for key, style, label in (("e2e_ce", ":", "E2E, B x L_b layers"), ("e2e_one_block_ce", "--", "plain, L_b layers")):
        if result.get(key) is not None:
            ax.axhline(result[key], linestyle=style, color="gray", label=label)
    ax.set_xlabel("block b (the stack cut after it)")
    ax.set_ylabel("held-out CE (nats/byte)")
    kax.set_ylabel("KL to the previous block (nats/byte)")
    blocks = result["config"]["model"]["blocks"]
    ax.set_xticks(range(blocks))
    ax.set_xlim(-0.5, blocks - 0.5)
    dr = result.get("depth_recovery")
    if dr is not None:
        title = f"depth recovery {dr:.3f}"
    elif result.get("depth_available") is not None:
        title = f"depth recovery n/a (plain - E2E = {result['depth_available']:+.3f})"
    else:
        title = "depth recovery n/a"
    if result.get("swarm_depth_recovery") is not None:
        title += f" (swarm {result['swarm_depth_recovery']:.3f})"
    ax.set_title(title)
    ax.grid(alpha=0.3)
    lines, labels = ax.get_legend_handles_labels()
    bars, bar_labels = kax.get_legend_handles_labels()
    ax.legend(lines + bars, labels + bar_labels, fontsize=7)


def rounded(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)


def depth_summary(name: str, depth: dict | None, block0: float | None, stack: float | None, plain, e2e) -> dict:
    """`<name>_kl` / `<name>_depth_recovery` (plain names for the single-process stack): the depth instrument's keys.

    block0 and stack: the stack's CEs, taken unrounded from its depth trace where there is one."""
    if depth:
        block0, stack = depth["trace"][0]["ce"], depth["ce"]
    rec = depth_recovery(block0, stack, plain, e2e)
    prefix = "" if name == "blocktrain" else f"{name}_"
    return {
        f"{prefix}kl": [rounded(r["kl"], 6) for r in depth["trace"]] if depth else None,
        f"{prefix}depth_recovery": rec["depth_recovery"],
        f"{prefix}depth_recovery_reason": rec["reason"],
        f"{prefix}depth_gained": rec["gained"],
        f"{prefix}depth_available": rec["available"],
    }


def summarise(history: dict[str, list], other: dict, depth: dict | None = None) -> dict:
    depth = depth or {}
    last = {k: v[-1] for k, v in history.items() if v}
    bt = last["blocktrain"]["eval_ce"] if "blocktrain" in last else None
    e2e = last["e2e"]["eval_ce"] if "e2e" in last else None
    plain = last["e2e1"]["eval_ce"] if "e2e1" in last else None
    out = {
        "blocktrain_ce": bt,
        "e2e_ce": e2e,
        "ratio": bt / e2e if bt is not None and e2e is not None else None,
        "block0_alone_ce": last["blocktrain"]["trace"][0] if "blocktrain" in last else None,
        "e2e_one_block_ce": plain,
        "trace": last["blocktrain"]["trace"] if "blocktrain" in last else None,
    }
    out.update(depth_summary("blocktrain", depth.get("blocktrain"), out["block0_alone_ce"], bt, plain, e2e))
    if "swarm" in last:
        sw = last["swarm"]
        out.update(swarm_ce=sw["eval_ce"], swarm_trace=sw["trace"], swarm_ratio=sw["eval_ce"] / e2e if e2e else None)
        out.update(depth_summary("swarm", depth.get("swarm"), sw["trace"][0], sw["eval_ce"], plain, e2e))
    if other:
        o = dict(other)
        if "blocktrain" in o and "e2e" in o:
            o["ratio"] = o["blocktrain"] / o["e2e"]
        for name in STACKS:
            b0, ce = (
                (o.get("block0"), o.get("blocktrain"))
                if name == "blocktrain"
                else (o.get("swarm_block0"), o.get("swarm"))
            )
            if ce is not None:
                rec = depth_recovery(b0, ce, o.get("e2e1"), o.get("e2e"))
                o["depth_recovery" if name == "blocktrain" else "swarm_depth_recovery"] = rec["depth_recovery"]
        out["other_text"] = o
    return out


OTHER_KEYS = ("blocktrain", "e2e", "e2e1", "block0", "trace", "kl", "swarm", "swarm_block0", "swarm_trace", "swarm_kl")


def merge(args: argparse.Namespace) -> dict:
    """Assemble separately run models (--only runs) into one result; later files win per model."""
    history, other, seconds, parts, depth, runs, best = {}, {}, {}, [], {}, {}, {}
    config = task = swarm_run = None
    for path in args.merge:
        r = json.loads(Path(path).read_text())
        for kind, rows in r["history"].items():
            history[kind] = rows
            seconds[kind] = r["seconds"].get(kind)
            depth.pop(kind, None)  # later files win per model, its depth trace (or none) too
            if kind in (r.get("depth") or {}):
                depth[kind] = r["depth"][kind]
            sweep = r.get("lr_sweep") or {}
            runs[kind] = [x for x in sweep.get("runs", []) if x["model"] == kind]
            if kind in sweep.get("best", {}):
                best[kind] = sweep["best"][kind]
        for kind, v in (r.get("other_text") or {}).items():
            if kind in (*OTHER_KEYS, "tokens", "offset"):
                other[kind] = v
        if "blocktrain" in r["history"] or config is None:
            config = r["config"]
        task = r.get("task", task)
        swarm_run = r.get("swarm_run", swarm_run) if "swarm" in r["history"] else swarm_run
        parts.append({"file": str(path), "command": r.get("command")})
    other.pop("ratio", None)
    result = {
        **summarise(history, other, depth),
        "config": config,
        "curve": curve_rows(history),
        "seconds": seconds,
        "history": history,
        "depth": depth,
        "merged_from": parts,
        "command": "python " + " ".join(sys.argv),
    }
    if task is not None:
        result["task"] = task
    if any(runs.values()):
        swept = [x for k in KINDS for x in runs.get(k, [])]
        result["lr_sweep"] = {"lrs": sorted({x["lr"] for x in swept}), "best": best, "runs": swept}
    if swarm_run is not None:
        result["swarm_run"] = swarm_run
    return result


SUMMARY_KEYS = ("blocktrain_ce", "e2e_ce", "ratio", "block0_alone_ce", "e2e_one_block_ce", "trace")
DEPTH_KEYS = ("kl", "depth_recovery", "depth_recovery_reason")


def write_result(args: argparse.Namespace, result: dict, keys: tuple[str, ...]) -> None:
    """<out>.json (and <out>.png unless --no-plot), then the summary keys as one JSON line on stdout."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    if not args.no_plot:
        plot(result, args.out.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in keys if k in result}))


# ---------------------------------------------------------------------------------------------
# Training: one model at one learning rate.
# ---------------------------------------------------------------------------------------------
def depth_row(d: dict) -> dict:
    """What a run's record keeps of a depth_trace: the per-step and per-block rows."""
    return {"ce": d["ce"], "tokens": d["tokens"], "trace": d["trace"], "blocks": d["blocks"]}


def train_swarm(args: argparse.Namespace, mcfg: ModelConfig, tcfg: TrainConfig, train_path: Path) -> tuple:
    """The stack trained by a LocalSwarm of one daemon per block, with tcfg as every peer's TrainConfig (the
    single-process stack's schedule); (blocks, embedding, facts about the run)."""
    from benchmarks.harness import daemons  # the daemon stack (grpc, hivemind) only when a swarm runs

    class DepthSwarm(daemons.Swarm):
        def peer_config(self, p):
            return replace(super().peer_config(p), train=tcfg)

    with tempfile.TemporaryDirectory(prefix="quality-swarm-") as tmp:
        swarm = DepthSwarm(
            mcfg.blocks,
            mcfg,
            train_path,
            Path(tmp),
            rounds=args.rounds,
            steps_per_round=args.steps_per_round,
            codec=args.swarm_codec,
            batch_size=tcfg.batch_size,
            lr=tcfg.lr,
            seed=tcfg.seed,
            trajectory_prob=tcfg.trajectory_prob,
            freeze_z_in=tcfg.freeze_z_in,
            deadline_max_s=args.swarm_deadline_max,
        )
        try:
            swarm.start(timeout_s=300)
            finished = swarm.wait(timeout_s=3600)
        finally:
            swarm.stop()
        if args.swarm_logs is not None:
            args.swarm_logs.mkdir(parents=True, exist_ok=True)
            for p in swarm.peers:
                shutil.copyfile(p.log_path, args.swarm_logs / p.log_path.name)
        daemons.check_exit(swarm, finished, "the quality swarm failed")
        blocks, emb = swarm.assemble()
        sums = swarm.summaries()
    facts = {
        "peers": mcfg.blocks,
        "codec": args.swarm_codec,
        "rounds": min(s.get("round", 0) for s in sums),
        "participation": sum(s.get("participation", 0.0) for s in sums) / len(sums),
        "train_ce": [s.get("train_ce") for s in sums],
    }
    return blocks, emb, facts


def other_depth(kind: str, od: dict) -> dict:
    """The second held-out slice's figures of a depth-traced model (blocktrain, swarm): its CE under the kind's name,
    block 0 alone, the per-step CE trace and KLs (blocktrain's keys unprefixed, the swarm's prefixed `swarm_`)."""
    pre = "" if kind == "blocktrain" else f"{kind}_"
    return {
        kind: od["ce"],
        f"{pre}block0": od["trace"][0]["ce"],
        f"{pre}trace": [round(s["ce"], 4) for s in od["trace"]],
        f"{pre}kl": [rounded(s["kl"], 6) for s in od["trace"]],
    }


def train_one(
    kind: str,
    lr: float,
    args: argparse.Namespace,
    mcfg: ModelConfig,
    tcfg: TrainConfig,
    data: dict,
) -> dict:
    """Train `kind` at learning rate lr; its record: history (one row per evaluation), eval_ce, other_ce,
    seconds, and for a stack its depth traces (depth, other_depth)."""
    torch.manual_seed(args.seed)  # every run starts from the same state, whatever ran before it
    tcfg = replace(tcfg, lr=lr)
    eval_xy, other_xy = data["eval_xy"], data["other_xy"]
    tag = kind if len(args.lrs) == 1 else f"{kind} lr={lr:g}"
    rows: list[dict] = []

    def on_round(r: RoundReport) -> None:
        row = {
            "round": r.round,
            "steps_per_block": r.steps_per_block,
            "tokens_per_block": r.tokens_per_block,
            "train_ce": r.train_ce,
            "eval_ce": r.eval["ce"],
            "seconds": round(r.seconds, 1),
        }
        if "trace" in r.eval:
            row["trace"] = [round(s["ce"], 4) for s in r.eval["trace"]]
        rows.append(row)
        print(
            f"[{tag}] round {r.round}: train ce {r.train_ce:.3f} eval ce {r.eval['ce']:.4f} "
            f"{row.get('trace', '')} ({r.seconds:.0f}s)",
            flush=True,
        )

    run = (mcfg, tcfg, data["corpus"], eval_xy, args.steps_per_round, args.rounds)
    record: dict = {"model": kind, "lr": lr}
    t0 = time.perf_counter()
    if kind in STACKS:
        if kind == "blocktrain":
            stack = train_blocktrain(
                *run, on_round=on_round, eval_steps=args.eval_steps, trajectory_source=args.trajectory_source
            )
            blocks, emb = stack.blocks, stack.emb
        else:
            blocks, emb, record["swarm"] = train_swarm(args, mcfg, tcfg, data["train_path"])
        record["seconds"] = round(time.perf_counter() - t0, 1)
        d = depth_trace(blocks, emb, eval_xy[0], eval_xy[1], mcfg, steps=args.eval_steps)
        if kind == "blocktrain" and d["ce"] != rows[-1]["eval_ce"]:  # one sampler, one noise seed: the same sweep
            raise AssertionError(f"depth_trace ce {d['ce']} != from_noise_ce {rows[-1]['eval_ce']}")
        if kind == "swarm":
            steps = args.rounds * args.steps_per_round
            rows.append(
                {
                    "round": args.rounds,
                    "steps_per_block": steps,
                    "tokens_per_block": steps * tcfg.batch_size * mcfg.seq_len,
                    "train_ce": None,
                    "eval_ce": d["ce"],
                    "seconds": record["seconds"],
                    "trace": [round(s["ce"], 4) for s in d["trace"]],
                }
            )
            print(f"[{tag}] {args.rounds} rounds: eval ce {d['ce']:.4f} {rows[-1]['trace']} ({record['seconds']:.0f}s)")
        record["depth"] = depth_row(d)
        if other_xy is not None:
            record["other_depth"] = depth_row(
                depth_trace(blocks, emb, other_xy[0], other_xy[1], mcfg, steps=args.eval_steps)
            )
            record["other_ce"] = record["other_depth"]["ce"]
    else:
        trainer = train_e2e(
            replace(mcfg, blocks=mcfg.blocks if kind == "e2e" else 1),
            *run[1:],
            on_round=on_round,
            layout=args.reference_layout,
        )
        record["seconds"] = round(time.perf_counter() - t0, 1)
        if other_xy is not None:
            record["other_ce"] = e2e_ce(trainer.model, *other_xy)["ce"]
    record["eval_ce"] = rows[-1]["eval_ce"]
    record["history"] = rows
    return record


def best_run(runs: list[dict]) -> dict:
    """The run with the lowest held-out CE (a diverged run, NaN, never wins)."""
    return min(runs, key=lambda r: r["eval_ce"] if r["eval_ce"] == r["eval_ce"] else float("inf"))


def load_data(args: argparse.Namespace, mcfg: ModelConfig, folder: Path) -> dict:
    """The training text, held-out windows and second held-out slice (the copy task written to folder first)."""
    task = {"name": "wikitext", "data_dir": str(args.data_dir)}
    data_dir = Path(args.data_dir) if args.task == "wikitext" else folder
    if args.task == "copy":
        eval_bytes = args.eval_tokens + args.other_tokens + 4 * mcfg.seq_len
        task = write_copy_task(folder, args.copy_bytes, eval_bytes, args.seed)
    corpus = ByteData.from_path(data_dir / "train.txt", mcfg.seq_len)
    eval_data = ByteData.from_path(data_dir / "eval.txt", mcfg.seq_len)
    eval_xy = eval_data.eval_windows(args.eval_tokens)
    other_xy = None
    if args.other_tokens:  # the second held-out slice: eval.txt bytes after the scored windows
        offset = eval_xy[1].numel() + 1
        rest = ByteData(eval_data.data[offset:].numpy().astype("uint8"), mcfg.seq_len)
        other_xy = rest.eval_windows(args.other_tokens)
    return {
        "task": task,
        "train_path": data_dir / "train.txt",
        "corpus": corpus,
        "eval_xy": eval_xy,
        "other_xy": other_xy,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.merge:
        result = merge(args)
        write_result(args, result, (*SUMMARY_KEYS, *DEPTH_KEYS))
        return result
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    mcfg, tcfg = configs(args)
    with tempfile.TemporaryDirectory(prefix="quality-task-") as tmp:
        data = load_data(args, mcfg, Path(tmp))
        runs = {kind: [train_one(kind, lr, args, mcfg, tcfg, data) for lr in args.lrs] for kind in selected(args)}
    eval_xy, other_xy = data["eval_xy"], data["other_xy"]
    best = {kind: best_run(rs) for kind, rs in runs.items()}
    history = {kind: r["history"] for kind, r in best.items()}
    seconds = {kind: r["seconds"] for kind, r in best.items()}
    depth = {kind: r["depth"] for kind, r in best.items() if "depth" in r}
    other: dict = {}
    if other_xy is not None:
        other = {"offset": eval_xy[1].numel() + 1, "tokens": int(other_xy[1].numel())}
        for kind, r in best.items():
            if kind in ("blocktrain", "swarm"):
                other.update(other_depth(kind, r["other_depth"]))
            else:
                other[kind] = r["other_ce"]
    sweep_runs = [
        {k: v for k, v in r.items() if k not in ("depth", "other_depth")}
        | ({"trace": [round(s["ce"], 4) for s in r["depth"]["trace"]]} if "depth" in r else {})
        for rs in runs.values()
        for r in rs
    ]
    result = {
        **summarise(history, other, depth),
        "curve": curve_rows(history),
        "config": {
            "model": mcfg.to_dict(),
            "train": tcfg.to_dict(),
            "rounds": args.rounds,
            "steps_per_round": args.steps_per_round,
            "eval_steps": args.eval_steps,
            "trajectory_source": args.trajectory_source,
            "reference_layout": args.reference_layout,
            "threads": args.threads,
        },
        "task": data["task"],
        "lr_sweep": {"lrs": args.lrs, "best": {kind: r["lr"] for kind, r in best.items()}, "runs": sweep_runs},
        "depth": depth,
        "steps_per_block": args.rounds * args.steps_per_round,
        "tokens_per_block": args.rounds * args.steps_per_round * tcfg.batch_size * mcfg.seq_len,
        "eval_tokens": int(eval_xy[1].numel()),
        "seconds": {**seconds, "total": round(sum(r["seconds"] for rs in runs.values() for r in rs), 1)},
        "history": history,
        "command": results.command_line("quality.py", argv),
        "torch": torch.__version__,
    }
    if "swarm" in best:
        result["swarm_run"] = best["swarm"]["swarm"]
    write_result(args, result, (*SUMMARY_KEYS, *DEPTH_KEYS, "seconds"))
    return result


if __name__ == "__main__":
    main()
