"""A LocalSwarm run to its end and its readings (run_to_end, eval_windows, assembled_ce, round_times), and
sim_text, a simulator run's text: what the daemon and simulator benchmarks repeat.
"""

from __future__ import annotations

import argparse
import itertools
import time

from benchmarks.harness import daemons
from swarmd.core.data import ByteData, load_bytes
from swarmd.tools.launch import LocalSwarm


def run_to_end(
    swarm: LocalSwarm, what: str, start_s: float = 300, wait_s: float = 1800, staggered: bool = False
) -> tuple[float, float]:
    """Start (staggered: daemons.start_staggered), wait for and stop the swarm; (seconds until every daemon was
    ready, seconds until all stopped). SystemExit "<what>: ..." unless every peer finished."""
    start = time.monotonic()
    try:
        if staggered:
            daemons.start_staggered(swarm, timeout_s=start_s)
        else:
            swarm.start(timeout_s=start_s)
        ready_s = time.monotonic() - start
        finished = swarm.wait(timeout_s=wait_s)
    finally:
        swarm.stop()
    daemons.check_exit(swarm, finished, what)
    return ready_s, time.monotonic() - start


def eval_windows(a: argparse.Namespace, seq_len: int) -> tuple:
    """a.eval_tokens bytes of a.data_dir/eval.txt as (x, y) windows of seq_len."""
    return ByteData.from_path(a.data_dir / "eval.txt", seq_len).eval_windows(a.eval_tokens)


def assembled_ce(swarm: LocalSwarm, eval_xy: tuple) -> float:
    """From-noise CE on eval_xy of the model assembled from the swarm's checkpoints."""
    from swarmd.core.evaluate import from_noise_ce

    blocks, emb = swarm.assemble()
    return float(from_noise_ce(blocks, emb, *eval_xy, swarm.model)["ce"])


def round_times(sums: list[dict]) -> tuple[list[list[dict]], list[float], list[float]]:
    """(each peer's history in round order, merge-to-merge seconds of every peer, exchange seconds of every round)."""
    hists = [sorted(s["history"], key=lambda h: h["round"]) for s in sums]
    between = [y["at_s"] - x["at_s"] for h in hists for x, y in itertools.pairwise(h)]
    return hists, between, [x["seconds"] for h in hists for x in h]


def sim_text(a: argparse.Namespace, seq_len: int) -> tuple[ByteData, ByteData]:
    """(the first a.train_bytes of a.data_dir/train.txt, all of its eval.txt) for the simulator."""
    train = ByteData(load_bytes(a.data_dir / "train.txt")[: a.train_bytes], seq_len)
    return train, ByteData(load_bytes(a.data_dir / "eval.txt"), seq_len)
