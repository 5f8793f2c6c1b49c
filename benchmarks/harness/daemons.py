"""The daemon swarms of the benchmarks: how they are built and started, and what a script reads off them.

TINY_CFG, add_run_options and tiny_options (what the tiny daemon benchmarks share); Swarm (a LocalSwarm with the fault
matrix's hooks) and its builders tiny, tiny_swarm, temporary_swarm, netns_swarm; start_staggered; the readings:
check_exit, finish, wait_rounds, log_count, outlier_drops, history, replicas_identical, replica_ce. Every wait has a
deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmd.core.config import ModelConfig
from swarmd.node.config import DaemonConfig
from swarmd.tools.launch import LocalSwarm, PeerProc

if TYPE_CHECKING:
    from tests.netns_utils import NetnsLab, NetnsSwarm

# B=3, L_b=1, d=32, seq 32: fault.py's and scale.py's daemons; one block of it in adversary, delayed, netns
TINY_CFG = ModelConfig(blocks=3, layers_per_block=1, d_model=32, n_heads=2, hidden=128, seq_len=32)
DROP_LINE = "as outliers"  # in gossip's log line for a merge whose outlier check dropped deltas
_DROPS = re.compile(r"dropped (\d+) delta\(s\) as outliers")


def add_run_options(p: argparse.ArgumentParser, timeout_s: float) -> None:
    """--deadline-max (the daemons' round deadline, s), --eval-tokens (held-out bytes), --timeout (s a run may take)."""
    p.add_argument("--deadline-max", type=float, default=10.0)
    p.add_argument("--eval-tokens", type=int, default=8192)
    p.add_argument("--timeout", type=float, default=timeout_s, help="seconds a run may take to finish its rounds")


def tiny_options(rounds: int, steps: int, deadline_max_s: float, **kw: Any) -> dict[str, Any]:
    """The LocalSwarm options of the tiny daemon benchmarks: int8 deltas, batch 8, lr 3e-3; kw: more of them."""
    return dict(
        rounds=rounds,
        steps_per_round=steps,
        codec="int8",
        batch_size=8,
        lr=3e-3,
        deadline_max_s=deadline_max_s,
        **kw,
    )


class Swarm(LocalSwarm):
    """A LocalSwarm with three hooks, all off by default.

    :param programs: peer index -> the command that runs that peer instead of `python -m swarmd` (its config
        file's path appended), e.g. a daemon whose Gossip misbehaves
    :param swarm_key: every peer's --swarm-key file
    :param wait_all: every round waits for all expected deltas (up to deadline_max), whatever the machine's load
    """

    def __init__(
        self,
        *args: Any,
        programs: dict[int, list[str]] | None = None,
        swarm_key: str = "",
        wait_all: bool = False,
        **kw: Any,
    ):
        super().__init__(*args, **kw)
        self.programs, self.swarm_key, self.wait_all = programs or {}, swarm_key, wait_all

    def peer_config(self, p: PeerProc) -> DaemonConfig:
        config = super().peer_config(p)
        if self.wait_all:
            config = replace(config, gossip=replace(config.gossip, deadline_min_s=config.gossip.deadline_max_s))
        if self.swarm_key:
            config = replace(config, net=replace(config.net, swarm_key=self.swarm_key))
        return config

    def command(self, p: PeerProc, config_path: Path) -> list[str]:
        if p.index in self.programs:
            return [*self.programs[p.index], str(config_path)]
        return super().command(p, config_path)


def tiny(n: int, data_dir: Path, workdir: Path, *schedule: Any, model: ModelConfig = TINY_CFG, **kw: Any) -> Swarm:
    """A Swarm of n daemons on `model` with tiny_options, training on data_dir/train.txt, in workdir;
    schedule and kw: tiny_options' (rounds, steps, deadline_max_s, more LocalSwarm options) and Swarm's hooks."""
    return Swarm(n, model, Path(data_dir) / "train.txt", workdir, **tiny_options(*schedule, **kw))


@contextlib.contextmanager
def temporary_swarm(prefix: str, peers: int, model: ModelConfig, data: Path, **kw: Any) -> Iterator[Swarm]:
    """Swarm(peers, model, data, <a temporary folder>, **kw); the folder goes on exit (stop the swarm first)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Swarm(peers, model, data, Path(tmp), **kw)


def tiny_swarm(
    prefix: str, n: int, data_dir: Path, *schedule: Any, model: ModelConfig = TINY_CFG, **kw: Any
) -> contextlib.AbstractContextManager[Swarm]:
    """tiny(n, data_dir, <a temporary folder>, *schedule, **kw): the folder goes on exit (temporary_swarm)."""
    return temporary_swarm(prefix, n, model, Path(data_dir) / "train.txt", **tiny_options(*schedule, **kw))


def netns_swarm(
    lab: NetnsLab, data_dir: Path, workdir: Path, *schedule: Any, model: ModelConfig = TINY_CFG, **kw: Any
) -> NetnsSwarm:
    """A NetnsSwarm (tests/netns_utils.py: peer i on lab host i, listening and announcing its address) of
    tiny_options daemons on `model`; schedule and kw as tiny's, plus delay_ms. Needs root (netns_utils.unavailable)."""
    from tests import netns_utils

    return netns_utils.NetnsSwarm(lab, model, Path(data_dir) / "train.txt", workdir, **tiny_options(*schedule, **kw))


def start_staggered(swarm: LocalSwarm, timeout_s: float, batch: int = 4) -> None:
    """LocalSwarm.start, but the joiners start `batch` at a time, each batch bootstrapping through every peer
    already up: 24 daemons dialling peer 0's DHT at once on 2 loaded cores time out its pings."""
    first = swarm.peers[0]
    swarm._spawn(first)
    swarm._wait_ready(first, timeout_s)
    swarm.bootstrap = list(first.info.get("multiaddrs", []))
    rest = swarm.peers[1:]
    for i in range(0, len(rest), batch):
        group = rest[i : i + batch]
        for p in group:
            swarm._spawn(p)
        for p in group:
            swarm._wait_ready(p, timeout_s)
        swarm.bootstrap = [m for p in swarm.peers[: i + batch + 1] for m in p.info.get("multiaddrs", [])[:1]][-8:]


def check_exit(swarm: LocalSwarm, finished: bool, what: str) -> None:
    """SystemExit "<what>: [(peer, exit code, log tail), ...]" unless every peer finished with exit code 0."""
    if not finished or any(p.process.returncode != 0 for p in swarm.peers):
        failed = [(p.index, p.process.returncode, swarm.tail(p)) for p in swarm.peers if p.process.returncode != 0]
        raise SystemExit(f"{what}: {failed}")


def finish(sw: LocalSwarm, honest: list[int], timeout_s: float) -> dict:
    """Wait for the honest peers to end their rounds; their exit codes, rounds, tracebacks."""
    deadline = time.monotonic() + timeout_s
    for i in honest:
        with contextlib.suppress(subprocess.TimeoutExpired):
            sw.peers[i].process.wait(timeout=max(0.1, deadline - time.monotonic()))
    sums = sw.summaries()
    logs = {i: sw.peers[i].log_path.read_text(errors="replace") for i in honest}
    for i, text in logs.items():  # the evidence counts them; the command's stderr shows where they came from
        if (at := text.find("Traceback")) >= 0:
            print(f"peer {i} traceback:\n{text[max(0, at - 400) : at + 2000]}", file=sys.stderr, flush=True)
    return {
        "exit": [sw.peers[i].process.poll() for i in honest],
        "rounds": [sums[i].get("round") for i in honest],
        "tracebacks": sum("Traceback" in text for text in logs.values()),
    }


def wait_rounds(sw: LocalSwarm, peers: list[int], rounds: int, timeout_s: float = 300) -> None:
    """Wait until these peers printed `rounds` round lines, or timeout_s passed."""
    deadline = time.monotonic() + timeout_s
    while any(len(sw.peers[i].rounds_seen) < rounds for i in peers) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling the peers' printed round lines, with a deadline


def log_count(sw: LocalSwarm, peers: list[int], needle: str) -> int:
    """How often needle stands in these peers' logs."""
    return sum(sw.peers[i].log_path.read_text(errors="replace").count(needle) for i in peers)


def outlier_drops(sw: LocalSwarm, peers: list[int]) -> int:
    """Deltas these peers' outlier checks dropped, summed over their merges (from their logs)."""
    return sum(
        int(m[1])
        for i in peers
        for line in sw.peers[i].log_path.read_text(errors="replace").splitlines()
        if DROP_LINE in line and (m := _DROPS.search(line))
    )


def history(p: PeerProc) -> list[dict]:
    """A peer's checkpointed round history, each entry with its wall-clock time."""
    try:
        b = json.loads((p.checkpoint_dir / "config.json").read_text())
    except (OSError, ValueError):
        return []
    return [dict(h, wall=b["started_wall"] + h["at_s"]) for h in b.get("history", [])]


def replicas_identical(sw: LocalSwarm, peers: list[int], block: int = 0) -> bool:
    """Whether these peers' checkpoints hold bit-identical weights of `block`."""
    import torch

    from swarmd.core import checkpoint as ck

    states = [ck.load_block(sw.peers[i].checkpoint_dir, sw.model, block)[0].state_dict() for i in peers]
    return all(all(torch.equal(s[k], states[0][k]) for k in s) for s in states[1:])


def replica_ce(sw: LocalSwarm, index: int, data_dir: Path, tokens: int) -> float | None:
    """From-noise CE on data_dir/eval.txt of the model in peer `index`'s checkpoint, for a one-block swarm (every
    peer holds the whole model); None if the checkpoint cannot be loaded."""
    from swarmd.core import checkpoint as ck
    from swarmd.errors import SwarmdError
    from swarmd.node.measure import assembled_ce

    model, checkpoint_dir = sw.model, sw.peers[index].checkpoint_dir
    try:
        block = ck.load_block(checkpoint_dir, model, 0)[0].state_dict()
        emb = ck.load_embedding(checkpoint_dir, model).state_dict()
    except SwarmdError:
        return None
    return assembled_ce(model, {0: block}, emb, str(Path(data_dir) / "eval.txt"), tokens)
