"""Quality benchmark: BlockTrain versus the end-to-end reference at equal optimiser steps per block.

Trains the stack (block by block), the E2E model of its whole depth (`e2e`) and a plain model of one block's depth
(`e2e1`) on the same text and steps, scores each on held-out text after every round and at the end on a second
slice (`other_text`), with the stack's depth trace (`kl`, `depth_recovery`); --swarm also trains the stack as one
daemon per block (`swarm_*`), --lr-sweep reports each model at its best lr, --task copy uses a generated copy task.
Writes <out>.json and <out>.png (see BENCHMARKS.md#quality):

    python benchmarks/quality.py --data-dir $BLOCKTRAIN_DATA --out benchmarks/results/quality
"""

from __future__ import annotations

import argparse
import json
import math
import random
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
MODEL_NUMBERS = ("n_heads", "noise_feature_scale", "logit_scale")  # ModelConfig fields with a flag of their own
TRAIN_NUMBERS = (
    "trajectory_steps",
    "sigma_jitter",
    "table_lr_scale",
    "handoff_weight",
    "later_lr_scale",
    "pipeline_stagger",
    "predecessor_pulls",
)  # TrainConfig fields with a flag of their own (later_lr_scale: the one-process stack only)
TRAIN_FIELDS = ("batch_size", "lr", "seed", *TRAIN_NUMBERS, "pipeline", "block_init", *options.TRAJECTORY_OPTIONS)
SUMMARY_KEYS = ("blocktrain_ce", "e2e_ce", "ratio", "block0_alone_ce", "e2e_one_block_ce", "trace")
DEPTH_KEYS = ("kl", "depth_recovery", "depth_recovery_reason")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = options.parser(__doc__, holds="train.txt and eval.txt")
    p.add_argument("--out", type=Path, default=results.RESULTS / "quality", help="path without extension")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps-per-round", type=int, default=200)
    p.add_argument("--eval-tokens", type=int, default=16384)
    p.add_argument("--other-tokens", type=int, default=16384, help="bytes of the second held-out slice; 0: none")
    p.add_argument("--eval-steps", type=int, default=None, help="sampler steps at eval (default one per block)")
    p.add_argument("--only", choices=("all", "both", *KINDS), default="all", help="all: the first three; both: two")
    p.add_argument("--task", choices=("wikitext", "copy"), default="wikitext", help="copy: generated, no --data-dir")
    p.add_argument("--copy-bytes", type=int, default=2_000_000, help="training bytes of the generated copy task")
    p.add_argument("--swarm", action="store_true", help="also train the stack as a swarm of one daemon per block")
    p.add_argument("--swarm-codec", choices=("fp32", "fp16", "bf16", "int8"), default="int8")
    p.add_argument("--swarm-deadline-max", type=float, default=GossipConfig.deadline_max_s)
    p.add_argument("--reference-layout", choices=E2E_LAYOUTS, default="tied", help="the references' byte tables")
    options.add_torch(p)
    options.add_shape(p, blocks=3, d_model=128, seq_len=128, layers_per_block=2)
    options.add_block_options(p, ModelConfig())
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    sweep = "e.g. 1e-3,3e-3: each model reported at its best"
    p.add_argument("--lr-sweep", type=options.positive_floats("--lr-sweep"), default=None, help=sweep)
    options.add_trajectory_options(p, TrainConfig())
    for cls, names in ((ModelConfig, MODEL_NUMBERS), (TrainConfig, TRAIN_NUMBERS)):
        for name in names:
            default = getattr(cls, name)
            p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    p.add_argument("--pipeline", action="store_true", help="the pipelined schedule (TrainConfig.pipeline)")
    p.add_argument("--block-init", choices=BLOCK_INITS, default=TrainConfig.block_init)
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.lrs = args.lr_sweep or [args.lr]
    if args.later_lr_scale != 1.0 and "swarm" in selected(args):
        p.error("--later-lr-scale is for the one-process stack; the swarm's daemons run the schedule's lr")
    return args if args.task == "copy" else options.check_data(p, args, "train.txt and eval.txt")


def selected(args: argparse.Namespace) -> list[str]:
    """The models this run trains (KINDS order): --only's, plus the swarm with --swarm."""
    kinds = {"all": {"blocktrain", "e2e", "e2e1"}, "both": {"blocktrain", "e2e"}}.get(args.only, {args.only})
    return [k for k in KINDS if k in kinds or (k == "swarm" and args.swarm)]


def configs(args: argparse.Namespace) -> tuple[ModelConfig, TrainConfig]:
    shape = ("blocks", "layers_per_block", "d_model", "seq_len", *MODEL_NUMBERS, *options.BLOCK_OPTIONS)
    mcfg = ModelConfig(hidden=4 * args.d_model, **options.picked(args, shape))
    total = args.steps_per_round * args.rounds
    tcfg = TrainConfig(total_steps=total, warmup_steps=min(50, total // 10), **options.picked(args, TRAIN_FIELDS))
    return mcfg, tcfg


# The copy task: a generated depth task (copying needs attention over the line, i.e. depth).
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
    """The copy task's entropy in nats/byte with unbounded context: each first-half letter is one of 26, the end
    of the string uniform over COPY_MIN..COPY_MAX, the copy and newline free (a finite seq_len scores a bit higher)."""
    lengths = range(COPY_MIN, COPY_MAX + 1)
    nats = 0.0
    for n in lengths:  # a string of n letters, then '|'
        for j in range(n + 1):  # the byte after j letters
            left = COPY_MAX - max(j, COPY_MIN) + 1  # lengths still possible once j >= COPY_MIN
            stop = 1.0 / left if j >= COPY_MIN else 0.0  # P(the string ends here | it got here)
            nats += -math.log(stop) if j == n else -math.log((1.0 - stop) / len(COPY_LETTERS))
    return nats / sum(2 * n + 2 for n in lengths)


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


LABELS = {  # curve model: (plot style, label)
    "blocktrain": ("o-", "BlockTrain, from-noise CE"),
    "block0": ("s--", "its block 0 alone (sampler step 0)"),
    "e2e": ("^-", "E2E, B x L_b layers"),
    "e2e1": ("v-", "plain model, L_b layers (one block's depth)"),
    "swarm": ("D", "BlockTrain swarm (one daemon per block), from-noise CE"),
}


def curve_rows(history: dict[str, list]) -> list[dict]:
    """One row per model and evaluation: CE against training bytes per block (block 0 alone after the stack's)."""
    rows = []
    for kind in KINDS:
        for r in history.get(kind, []):
            rows.append({"model": kind, **{k: r[k] for k in ("round", "steps_per_block", "tokens_per_block")}})
            rows[-1]["eval_ce"] = r["eval_ce"]
            if kind == "blocktrain" and "trace" in r:
                rows.append({**rows[-1], "model": "block0", "eval_ce": r["trace"][0]})
    return rows


def plot(result: dict, path: Path) -> None:
    """The scaling curve: held-out CE of every model against training bytes per block."""
    if (plt := results.pyplot()) is None:
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for kind, (style, label) in LABELS.items():
        rows = [r for r in result["curve"] if r["model"] == kind]
        if rows:
            ax.plot([r["tokens_per_block"] / 1e6 for r in rows], [r["eval_ce"] for r in rows], style, label=label)
    c, ratio = result["config"]["model"], result.get("ratio")
    shape = f"B={c['blocks']} L_b={c['layers_per_block']} d={c['d_model']} seq={c['seq_len']}"
    ax.set_title(f"{shape}: ratio {ratio if ratio is not None else float('nan'):.3f}")
    ax.set(xscale="log", xlabel="training bytes per block (millions)", ylabel="held-out CE (nats/byte)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    results.save_figure(fig, path, dpi=120)


def rounded(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)


def prefix(kind: str) -> str:
    """The prefix of a stack's keys: none for the single-process stack, `swarm_` for the swarm."""
    return "" if kind == "blocktrain" else f"{kind}_"


def depth_summary(kind: str, depth: dict | None, block0: float | None, stack: float | None, plain, e2e) -> dict:
    """The depth instrument's keys (`kl`, `depth_recovery` ..., prefixed by kind); block0 and stack are taken
    unrounded from the stack's depth trace where there is one."""
    if depth:
        block0, stack = depth["trace"][0]["ce"], depth["ce"]
    rec = depth_recovery(block0, stack, plain, e2e)
    keys = {
        "kl": [rounded(r["kl"], 6) for r in depth["trace"]] if depth else None,
        "depth_recovery": rec["depth_recovery"],
        "depth_recovery_reason": rec["reason"],
        "depth_gained": rec["gained"],
        "depth_available": rec["available"],
    }
    return {prefix(kind) + k: v for k, v in keys.items()}


def summarise(history: dict[str, list], depth: dict) -> dict:
    last = {k: v[-1] for k, v in history.items() if v}
    bt, e2e, plain = (last[k]["eval_ce"] if k in last else None for k in ("blocktrain", "e2e", "e2e1"))
    trace = last["blocktrain"]["trace"] if "blocktrain" in last else None
    out = {
        "blocktrain_ce": bt,
        "e2e_ce": e2e,
        "ratio": bt / e2e if bt is not None and e2e is not None else None,
        "block0_alone_ce": trace[0] if trace is not None else None,
        "e2e_one_block_ce": plain,
        "trace": trace,
    }
    out.update(depth_summary("blocktrain", depth.get("blocktrain"), out["block0_alone_ce"], bt, plain, e2e))
    if "swarm" in last:
        sw = last["swarm"]
        out.update(swarm_ce=sw["eval_ce"], swarm_trace=sw["trace"], swarm_ratio=sw["eval_ce"] / e2e if e2e else None)
        out.update(depth_summary("swarm", depth.get("swarm"), sw["trace"][0], sw["eval_ce"], plain, e2e))
    return out


def other_text(eval_xy: tuple, other_xy: tuple, best: dict[str, dict]) -> dict:
    """The second held-out slice's figures: each model's CE under its name; for a stack also block 0 alone, the
    per-step CE trace and KLs and its depth recovery (prefixed as depth_summary's); the stack over the E2E."""
    o = {"offset": eval_xy[1].numel() + 1, "tokens": int(other_xy[1].numel())}
    for kind, r in best.items():
        o[kind] = r["other_ce"]
        if "other_depth" in r:
            trace = r["other_depth"]["trace"]
            o |= {
                f"{prefix(kind)}block0": trace[0]["ce"],
                f"{prefix(kind)}trace": [round(s["ce"], 4) for s in trace],
                f"{prefix(kind)}kl": [rounded(s["kl"], 6) for s in trace],
            }
    if "blocktrain" in o and "e2e" in o:
        o["ratio"] = o["blocktrain"] / o["e2e"]
    for kind in ("blocktrain", "swarm"):
        if o.get(kind) is not None:
            rec = depth_recovery(o.get(f"{prefix(kind)}block0"), o[kind], o.get("e2e1"), o.get("e2e"))
            o[f"{prefix(kind)}depth_recovery"] = rec["depth_recovery"]
    return o


# Training: one model at one learning rate.
def depth_row(d: dict) -> dict:
    """What a run's record keeps of a depth_trace: the per-step and per-block rows."""
    return {k: d[k] for k in ("ce", "tokens", "trace", "blocks")}


def train_swarm(args: argparse.Namespace, mcfg: ModelConfig, tcfg: TrainConfig, train_path: Path) -> tuple:
    """The stack trained by a LocalSwarm of one daemon per block, with tcfg as every peer's TrainConfig (the
    single-process stack's schedule); (blocks, embedding, facts about the run)."""
    from benchmarks.harness import daemons, sweeps  # the daemon stack (grpc, hivemind) only when a swarm runs

    class DepthSwarm(daemons.Swarm):
        def peer_config(self, p):
            return replace(super().peer_config(p), train=tcfg)

    same = options.picked(tcfg, ("batch_size", "lr", "seed", "trajectory_prob", "freeze_z_in"))
    schedule = {"rounds": args.rounds, "steps_per_round": args.steps_per_round, "codec": args.swarm_codec}
    with tempfile.TemporaryDirectory(prefix="quality-swarm-") as tmp:
        swarm = DepthSwarm(
            mcfg.blocks, mcfg, train_path, Path(tmp), **schedule, **same, deadline_max_s=args.swarm_deadline_max
        )
        sweeps.run_to_end(swarm, "the quality swarm failed", wait_s=3600)
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


def train_one(kind: str, lr: float, args: argparse.Namespace, mcfg: ModelConfig, tcfg: TrainConfig, data: dict) -> dict:
    """Train `kind` at learning rate lr; its record: history (one row per evaluation), eval_ce, other_ce,
    seconds, and for a stack its depth traces (depth, other_depth)."""
    torch.manual_seed(args.seed)  # every run starts from the same state, whatever ran before it
    tcfg = replace(tcfg, lr=lr)
    eval_xy, other_xy = data["eval_xy"], data["other_xy"]
    tag = kind if len(args.lrs) == 1 else f"{kind} lr={lr:g}"
    rows: list[dict] = []

    def on_round(r: RoundReport) -> None:
        row = {"round": r.round, "steps_per_block": r.steps_per_block, "tokens_per_block": r.tokens_per_block}
        row.update(train_ce=r.train_ce, eval_ce=r.eval["ce"], seconds=round(r.seconds, 1))
        if "trace" in r.eval:
            row["trace"] = [round(s["ce"], 4) for s in r.eval["trace"]]
        rows.append(row)
        train = "-" if r.train_ce is None else f"{r.train_ce:.3f}"
        done = f"train ce {train} eval ce {r.eval['ce']:.4f} {row.get('trace', '')} ({r.seconds:.0f}s)"
        print(f"[{tag}] round {r.round}: {done}", flush=True)

    run = (mcfg, tcfg, data["corpus"], eval_xy, args.steps_per_round, args.rounds)
    record: dict = {"model": kind, "lr": lr}
    t0 = time.perf_counter()
    if kind == "blocktrain":
        how = {"eval_steps": args.eval_steps, "trajectory_source": args.trajectory_source}
        stack = train_blocktrain(*run, on_round=on_round, **how)
        blocks, emb = stack.blocks, stack.emb
    elif kind == "swarm":
        blocks, emb, record["swarm"] = train_swarm(args, mcfg, tcfg, data["train_path"])
    else:
        one = replace(mcfg, blocks=mcfg.blocks if kind == "e2e" else 1)
        trainer = train_e2e(one, *run[1:], on_round=on_round, layout=args.reference_layout)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    if kind in ("e2e", "e2e1"):
        if other_xy is not None:
            record["other_ce"] = e2e_ce(trainer.model, *other_xy)["ce"]
        return record | {"eval_ce": rows[-1]["eval_ce"], "history": rows}
    d = depth_trace(blocks, emb, eval_xy[0], eval_xy[1], mcfg, steps=args.eval_steps)
    if kind == "blocktrain" and d["ce"] != rows[-1]["eval_ce"]:  # one sampler, one noise seed: the same sweep
        raise AssertionError(f"depth_trace ce {d['ce']} != from_noise_ce {rows[-1]['eval_ce']}")
    if kind == "swarm":  # one row: the assembled checkpoint at the end
        steps = args.rounds * args.steps_per_round
        tokens = steps * tcfg.batch_size * mcfg.seq_len
        on_round(RoundReport(args.rounds, steps, tokens, None, d, record["seconds"]))
    record["depth"] = depth_row(d)
    if other_xy is not None:
        record["other_depth"] = depth_row(depth_trace(blocks, emb, *other_xy, mcfg, steps=args.eval_steps))
        record["other_ce"] = record["other_depth"]["ce"]
    return record | {"eval_ce": rows[-1]["eval_ce"], "history": rows}


def sweep_row(r: dict) -> dict:
    """A run's row of the lr sweep: its record without the depth traces, with the stack's per-step CE trace."""
    row = {k: v for k, v in r.items() if k not in ("depth", "other_depth")}
    return row | ({"trace": [round(s["ce"], 4) for s in r["depth"]["trace"]]} if "depth" in r else {})


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
    eval_data = ByteData.from_path(data_dir / "eval.txt", mcfg.seq_len)
    eval_xy = eval_data.eval_windows(args.eval_tokens)
    other_xy = None
    if args.other_tokens:  # the second held-out slice: eval.txt bytes after the scored windows
        rest = eval_data.data[eval_xy[1].numel() + 1 :].numpy().astype("uint8")
        other_xy = ByteData(rest, mcfg.seq_len).eval_windows(args.other_tokens)
    corpus = ByteData.from_path(data_dir / "train.txt", mcfg.seq_len)
    return {
        "task": task,
        "train_path": data_dir / "train.txt",
        "corpus": corpus,
        "eval_xy": eval_xy,
        "other_xy": other_xy,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    mcfg, tcfg = configs(args)
    with tempfile.TemporaryDirectory(prefix="quality-task-") as tmp:
        data = load_data(args, mcfg, Path(tmp))
        runs = {kind: [train_one(kind, lr, args, mcfg, tcfg, data) for lr in args.lrs] for kind in selected(args)}
    best = {kind: best_run(rs) for kind, rs in runs.items()}
    history = {kind: r["history"] for kind, r in best.items()}
    depth = {kind: r["depth"] for kind, r in best.items() if "depth" in r}
    sweep_runs = [sweep_row(r) for rs in runs.values() for r in rs]
    config_keys = ("rounds", "steps_per_round", "eval_steps", "trajectory_source", "reference_layout", "threads")
    steps = args.rounds * args.steps_per_round
    result = summarise(history, depth)
    if data["other_xy"] is not None:
        result["other_text"] = other_text(data["eval_xy"], data["other_xy"], best)
    result |= {
        "curve": curve_rows(history),
        "config": {"model": mcfg.to_dict(), "train": tcfg.to_dict(), **options.picked(args, config_keys)},
        "task": data["task"],
        "lr_sweep": {"lrs": args.lrs, "best": {kind: r["lr"] for kind, r in best.items()}, "runs": sweep_runs},
        "depth": depth,
        "steps_per_block": steps,
        "tokens_per_block": steps * tcfg.batch_size * mcfg.seq_len,
        "eval_tokens": int(data["eval_xy"][1].numel()),
        "seconds": {
            **{kind: r["seconds"] for kind, r in best.items()},
            "total": round(sum(r["seconds"] for rs in runs.values() for r in rs), 1),
        },
        "history": history,
        "command": results.command_line("quality.py", argv),
        "torch": torch.__version__,
    }
    if "swarm" in best:
        result["swarm_run"] = best["swarm"]["swarm"]
    results.write_json(args.out.with_suffix(".json"), result, sort_keys=False)
    if not args.no_plot:
        plot(result, args.out.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in (*SUMMARY_KEYS, *DEPTH_KEYS, "seconds") if k in result}))
    return result


if __name__ == "__main__":
    main()
