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
--pred-input (see swarmd/core/config.py and benchmarks/results/ISSUE8.md).

    python benchmarks/quality.py --data-dir $BLOCKTRAIN_DATA --out benchmarks/results/quality
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import e2e_ce, from_noise_ce
from swarmd.core.local_run import RoundReport, train_blocktrain, train_e2e


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__, holds="train.txt and eval.txt")
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
        choices=("all", "both", "blocktrain", "e2e", "e2e1"),
        default="all",
        help="all: BlockTrain, E2E and the one-block-depth model; both: BlockTrain and E2E; or one of them",
    )
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="assemble these result JSONs (separate --only runs) into --out; no training",
    )
    common.add_torch(p)
    # model
    common.add_shape(p, blocks=3, d_model=128, seq_len=128, layers_per_block=2)
    p.add_argument("--n-heads", type=int, default=4)
    common.add_block_options(p, ModelConfig())
    p.add_argument("--noise-feature-scale", type=float, default=ModelConfig.noise_feature_scale)
    p.add_argument("--logit-scale", type=float, default=ModelConfig.logit_scale)
    # training
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    common.add_trajectory_options(p, TrainConfig())
    p.add_argument("--trajectory-steps", type=int, default=TrainConfig.trajectory_steps)
    p.add_argument("--sigma-jitter", type=float, default=TrainConfig.sigma_jitter)
    p.add_argument("--table-lr-scale", type=float, default=TrainConfig.table_lr_scale)
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.rounds = args.rounds or 8
    args.steps_per_round = args.steps_per_round or (250 if args.long else 200)
    return args if args.merge else common.check_data(p, args, "train.txt and eval.txt")


def configs(args: argparse.Namespace) -> tuple[ModelConfig, TrainConfig]:
    model = ("blocks", "layers_per_block", "d_model", "n_heads", "seq_len", "noise_feature_scale", "logit_scale")
    mcfg = ModelConfig(hidden=4 * args.d_model, **common.picked(args, (*model, *common.BLOCK_OPTIONS)))
    total = args.steps_per_round * args.rounds
    train = ("batch_size", "lr", "seed", "trajectory_steps", "sigma_jitter", "table_lr_scale")
    tcfg = TrainConfig(
        total_steps=total,
        warmup_steps=min(50, total // 10),
        **common.picked(args, (*train, *common.TRAJECTORY_OPTIONS)),
    )
    return mcfg, tcfg


LABELS = {
    "blocktrain": "BlockTrain, from-noise CE",
    "block0": "its block 0 alone (sampler step 0)",
    "e2e": "E2E, B x L_b layers",
    "e2e1": "plain model, L_b layers (one block's depth)",
}


def curve_rows(history: dict[str, list]) -> list[dict]:
    """One row per model and evaluation: CE against training bytes per block."""
    rows = []
    for kind in ("blocktrain", "e2e", "e2e1"):
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

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = {"blocktrain": "o-", "block0": "s--", "e2e": "^-", "e2e1": "v-"}
    for kind in ("blocktrain", "block0", "e2e", "e2e1"):
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
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summarise(history: dict[str, list], other: dict) -> dict:
    last = {k: v[-1] for k, v in history.items() if v}
    bt = last["blocktrain"]["eval_ce"] if "blocktrain" in last else None
    e2e = last["e2e"]["eval_ce"] if "e2e" in last else None
    out = {
        "blocktrain_ce": bt,
        "e2e_ce": e2e,
        "ratio": bt / e2e if bt is not None and e2e is not None else None,
        "block0_alone_ce": last["blocktrain"]["trace"][0] if "blocktrain" in last else None,
        "e2e_one_block_ce": last["e2e1"]["eval_ce"] if "e2e1" in last else None,
        "trace": last["blocktrain"]["trace"] if "blocktrain" in last else None,
    }
    if other:
        o = dict(other)
        if "blocktrain" in o and "e2e" in o:
            o["ratio"] = o["blocktrain"] / o["e2e"]
        out["other_text"] = o
    return out


def merge(args: argparse.Namespace) -> dict:
    """Assemble separately run models (--only runs) into one result; later files win per model."""
    history, other, seconds, parts = {}, {}, {}, []
    config = None
    for path in args.merge:
        r = json.loads(Path(path).read_text())
        for kind, rows in r["history"].items():
            history[kind] = rows
            seconds[kind] = r["seconds"].get(kind)
        for kind, v in (r.get("other_text") or {}).items():
            if kind in ("blocktrain", "e2e", "e2e1", "block0", "trace", "tokens", "offset"):
                other[kind] = v
        if "blocktrain" in r["history"] or config is None:
            config = r["config"]
        parts.append({"file": str(path), "command": r.get("command")})
    other.pop("ratio", None)
    result = {
        **summarise(history, other),
        "config": config,
        "curve": curve_rows(history),
        "seconds": seconds,
        "history": history,
        "merged_from": parts,
        "command": "python " + " ".join(sys.argv),
    }
    return result


SUMMARY_KEYS = ("blocktrain_ce", "e2e_ce", "ratio", "block0_alone_ce", "e2e_one_block_ce", "trace")


def write_result(args: argparse.Namespace, result: dict, keys: tuple[str, ...]) -> None:
    """<out>.json (and <out>.png unless --no-plot), then the summary keys as one JSON line on stdout."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    if not args.no_plot:
        plot(result, args.out.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in keys}))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.merge:
        result = merge(args)
        write_result(args, result, SUMMARY_KEYS)
        return result
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    mcfg, tcfg = configs(args)
    corpus = ByteData.from_path(Path(args.data_dir) / "train.txt", mcfg.seq_len)
    eval_data = ByteData.from_path(Path(args.data_dir) / "eval.txt", mcfg.seq_len)
    eval_xy = eval_data.eval_windows(args.eval_tokens)
    other_xy = None
    if args.other_tokens:  # the second held-out slice: eval.txt bytes after the scored windows
        offset = eval_xy[1].numel() + 1
        rest = ByteData(eval_data.data[offset:].numpy().astype("uint8"), mcfg.seq_len)
        other_xy = rest.eval_windows(args.other_tokens)
    history: dict[str, list] = {}
    seconds: dict[str, float] = {}
    other: dict = {}
    if other_xy is not None:
        other = {"offset": eval_xy[1].numel() + 1, "tokens": int(other_xy[1].numel())}

    def recorder(kind: str):
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
            history.setdefault(kind, []).append(row)
            print(
                f"[{kind}] round {r.round}: train ce {r.train_ce:.3f} eval ce {r.eval['ce']:.4f} "
                f"{row.get('trace', '')} ({r.seconds:.0f}s)",
                flush=True,
            )

        return on_round

    if args.only in ("all", "both", "blocktrain"):
        t0 = time.perf_counter()
        stack = train_blocktrain(
            mcfg,
            tcfg,
            corpus,
            eval_xy,
            args.steps_per_round,
            args.rounds,
            on_round=recorder("blocktrain"),
            eval_steps=args.eval_steps,
            trajectory_source=args.trajectory_source,
        )
        seconds["blocktrain"] = round(time.perf_counter() - t0, 1)
        if other_xy is not None:
            res = from_noise_ce(stack.blocks, stack.emb, *other_xy, mcfg, steps=args.eval_steps)
            other.update(
                blocktrain=res["ce"], block0=res["trace"][0]["ce"], trace=[round(s["ce"], 4) for s in res["trace"]]
            )
    for kind, blocks in (("e2e", mcfg.blocks), ("e2e1", 1)):
        if args.only not in ("all", kind) and not (kind == "e2e" and args.only == "both"):
            continue
        cfg = replace(mcfg, blocks=blocks)
        t0 = time.perf_counter()
        trainer = train_e2e(cfg, tcfg, corpus, eval_xy, args.steps_per_round, args.rounds, on_round=recorder(kind))
        seconds[kind] = round(time.perf_counter() - t0, 1)
        if other_xy is not None:
            other[kind] = e2e_ce(trainer.model, *other_xy)["ce"]
    result = {
        **summarise(history, other),
        "curve": curve_rows(history),
        "config": {
            "model": mcfg.to_dict(),
            "train": tcfg.to_dict(),
            "rounds": args.rounds,
            "steps_per_round": args.steps_per_round,
            "eval_steps": args.eval_steps,
            "trajectory_source": args.trajectory_source,
            "threads": args.threads,
        },
        "steps_per_block": args.rounds * args.steps_per_round,
        "tokens_per_block": args.rounds * args.steps_per_round * tcfg.batch_size * mcfg.seq_len,
        "eval_tokens": int(eval_xy[1].numel()),
        "seconds": {**seconds, "total": round(sum(seconds.values()), 1)},
        "history": history,
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "torch": torch.__version__,
    }
    write_result(args, result, (*SUMMARY_KEYS, "seconds"))
    return result


if __name__ == "__main__":
    main()
