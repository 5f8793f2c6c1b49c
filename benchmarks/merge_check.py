"""What the merge loss check (swarmd.averaging.merge.check_merge) costs an honest swarm.

At benchmarks/swarm.py's config (B=3 x 2 replicas) the replicas train in one process from shared bases; every round
runs each peer's check_merge on a HeldOutCheck of each size in --sequences, then lands the unchecked merge. Per size:
the check's seconds per peer and round against the local steps and swarm.py's median round, the honest rounds that
fell back (also without merge.PROGRESS_SLACK) or refused a delta, and the most own progress a merge gave up.

    python benchmarks/merge_check.py --data-dir /work/shared/data/wikitext-2
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import options, results
from swarmd.averaging.config import GossipConfig
from swarmd.averaging.context import BLOCK, EMB
from swarmd.averaging.merge import Landing, check_merge, merge_deltas
from swarmd.averaging.validation import HeldOutCheck
from swarmd.core.data import ByteData
from swarmd.core.train import BlockTrainer, seed_for
from swarmd.node.config import peer_train_config

SWARM_MEDIAN_ROUND_S = 1.31  # BENCHMARKS.md#swarm: fp32 median round of the 6-daemon run
CONFIG = ("blocks", "replicas", "d_model", "seq_len", "batch_size", "lr", "rounds", "steps")  # the result's "config"


def parse_args(argv=None):
    p = options.parser(__doc__, holds="train.txt")
    options.add_swarm_config(p, layers_per_block=1)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--sequences", type=int, nargs="+", default=[4, 8, 16, 32])
    options.add_outputs(p, "merge_check.json")
    return options.parse_checked(p, argv, "train.txt")


def main(argv=None) -> dict:
    a = parse_args(argv)
    torch.manual_seed(0)
    cfg = options.model_of(a)
    data = ByteData.from_path(Path(a.data_dir) / "train.txt", cfg.seq_len)
    train = peer_train_config(a.steps, batch_size=a.batch_size, lr=a.lr, seed=0)
    gcfg = GossipConfig(steps_per_round=a.steps, codec="fp32")
    peers = [(b, r) for b in range(a.blocks) for r in range(a.replicas)]
    ids = {p: f"peer-{p[0]}-{p[1]}" for p in peers}
    trainers = {p: BlockTrainer(cfg, train, p[0], worker_seed=i) for i, p in enumerate(peers)}
    streams = {p: data.stream(seed_for("bench", i), a.batch_size) for i, p in enumerate(peers)}
    checks = {n: [HeldOutCheck.from_data(data, cfg, b, 0, sequences=n) for b in range(a.blocks)] for n in a.sequences}
    copy = lambda module: {k: v.detach().clone() for k, v in module.state_dict().items()}
    base_emb, base_block = copy(trainers[peers[0]].emb), [copy(trainers[(b, 0)].block) for b in range(a.blocks)]
    delta = lambda module, base: {k: v.detach().float() - base[k] for k, v in module.state_dict().items()}
    counts = dict.fromkeys(("fallbacks", "strict", "refused", "checks", "scores"), 0)
    rows = {n: {"check_s": [], "give_up": [], **counts} for n in a.sequences}
    steps_s, merge_s = [], []
    for _ in range(a.rounds):
        deltas = {}
        for p in peers:  # every replica from the shared bases
            t = trainers[p]
            t.block.load_state_dict(base_block[p[0]])
            t.emb.load_state_dict(base_emb)
            started = time.perf_counter()
            for _ in range(a.steps):
                t.step(*next(streams[p]))
            steps_s.append(time.perf_counter() - started)
            deltas[p] = {BLOCK: delta(t.block, base_block[p[0]]), EMB: delta(t.emb, base_emb)}
        for p in peers:
            me = ids[p]
            inbox = {
                BLOCK: {ids[q]: deltas[q][BLOCK] for q in peers if q != p and q[0] == p[0]},
                EMB: {ids[q]: deltas[q][EMB] for q in peers if q != p},
            }
            landing = Landing({BLOCK: base_block[p[0]], EMB: base_emb}, {BLOCK: None, EMB: None})
            started = time.perf_counter()
            check_merge(me, deltas[p], inbox, gcfg, None, landing)
            merge_s.append(time.perf_counter() - started)
            for n in a.sequences:
                out = check_merge(me, deltas[p], inbox, gcfg, checks[n][p[0]], landing)
                row = rows[n]
                row["check_s"].append(max(0.0, out.check_s - merge_s[-1]))
                row["fallbacks"] += int(out.fell_back)
                row["strict"] += int(out.candidate_ce > out.own_ce + gcfg.merge_check_tolerance)
                beyond = out.candidate_ce - out.own_ce - gcfg.merge_check_tolerance  # our own delta's progress given up
                row["give_up"].append(beyond / max(out.base_ce - out.own_ce, 1e-9))
                row["refused"] += len(out.failed)
                row["checks"] += 1
                row["scores"] += out.scores
        # the honest swarm lands the unchecked merge: replicas of a block share their base again
        for b in range(a.blocks):
            group = {ids[q]: deltas[q][BLOCK] for q in peers if q[0] == b}
            merged = merge_deltas(group, gcfg)
            base_block[b] = {k: base_block[b][k] + merged[k] for k in base_block[b]}
        merged = merge_deltas({ids[q]: deltas[q][EMB] for q in peers}, gcfg)
        base_emb = {k: base_emb[k] + merged[k] for k in base_emb}
    round_s = statistics.median(steps_s)
    result = {
        "command": results.command_line("merge_check.py", argv),
        "config": options.picked(a, CONFIG),
        "median_local_steps_s": round_s,
        "median_merge_s": statistics.median(merge_s),
        "swarm_median_round_s": SWARM_MEDIAN_ROUND_S,
        "sizes": {},
    }
    for n, row in rows.items():
        check_s = statistics.median(row["check_s"])
        size = {"median_check_s": check_s, "share_of_local_steps": check_s / round_s}
        size |= {"share_of_swarm_round": check_s / SWARM_MEDIAN_ROUND_S, "honest_fallbacks": row["fallbacks"]}
        size["honest_fallbacks_without_slack"] = row["strict"]
        size["max_progress_given_up_beyond_tolerance"] = max(row["give_up"])
        size |= {"honest_refused": row["refused"], "checks": row["checks"]}
        result["sizes"][n] = size | {"scores_per_check": row["scores"] / row["checks"]}
        print(
            f"sequences {n:3d}: check {check_s * 1e3:6.2f} ms = {100 * check_s / round_s:.2f}% of the local steps "
            f"({round_s:.2f} s), {100 * check_s / SWARM_MEDIAN_ROUND_S:.2f}% of swarm.py's median round; "
            f"honest fallbacks {row['fallbacks']}/{row['checks']} (slack 0: {row['strict']}), honest deltas refused "
            f"{row['refused']}, most progress given up beyond the tolerance {max(row['give_up']):.2f}"
        )
    results.write_json(a.out, result, sort_keys=False)
    return result


if __name__ == "__main__":
    main()
