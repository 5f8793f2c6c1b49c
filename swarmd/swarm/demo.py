"""The demo: a whole swarm on this machine (LocalSwarm), and the assembled model's CE before and after.

Owns what `blocktrain demo` does, minus the rendering: score the freshly initialised stack on
held-out text, start --peers daemons on loopback (block i mod B, joined through peer 0's DHT
multiaddr), poll them until they have run their rounds (reporting each poll to an observer), stop
them, assemble the trained model from their checkpoints and score it again. Every wait has a
deadline; every daemon is stopped whatever happens. DEMO_MODEL / DEMO_TRAIN are its defaults.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import from_noise_ce
from swarmd.core.train import init_block, init_embedding
from swarmd.errors import ConfigError, SwarmdError
from swarmd.protocol import Codec
from swarmd.swarm.launch import LocalSwarm, PeerProc

DEMO_MODEL = ModelConfig(layers_per_block=1, d_model=64, hidden=256, seq_len=64)  # small enough for a laptop
DEMO_TRAIN = TrainConfig(batch_size=16, lr=3e-3)

OnStart = Callable[[Path, float], None]  # (workdir, initial from-noise CE), before the peers start
OnPoll = Callable[[list[PeerProc], list], None]  # (peers, their GetStatus or None), every poll


def run_demo(
    peers: int,
    model: ModelConfig,
    train_path: Path,
    eval_path: Path,
    *,
    rounds: int,
    steps_per_round: int,
    codec: Codec | str,
    train: TrainConfig = DEMO_TRAIN,
    eval_tokens: int,
    workdir: Path | None = None,
    timeout_s: float,
    on_start: OnStart | None = None,
    on_poll: OnPoll | None = None,
    poll_s: float = 0.5,
) -> dict:
    """Train a swarm of `peers` daemons for `rounds` rounds; returns the summary (ce_start, ce_end, ...).

    :param train: batch_size, lr, seed and trajectory_prob of every peer
    :param workdir: where peers keep checkpoints, configs and logs (default: a temp dir, removed after)
    :param timeout_s: give up (SwarmdError) and stop every peer after this many seconds
    """
    if peers < 1 or rounds < 1 or steps_per_round < 1:
        raise ConfigError("--peers, --rounds and --steps-per-round must be >= 1")
    eval_xy = ByteData.from_path(eval_path, model.seq_len).eval_windows(eval_tokens)
    init = [init_block(model, b, train.seed) for b in range(model.blocks)]
    ce_start = from_noise_ce(init, init_embedding(model, train.seed), *eval_xy, model)["ce"]
    with tempfile.TemporaryDirectory(prefix="blocktrain-demo-") as tmp:
        root = Path(workdir or tmp)
        swarm = LocalSwarm(
            peers,
            model,
            train_path,
            root,
            rounds=rounds,
            steps_per_round=steps_per_round,
            codec=codec,
            batch_size=train.batch_size,
            lr=train.lr,
            seed=train.seed,
            trajectory_prob=train.trajectory_prob,
        )
        if on_start is not None:
            on_start(root, ce_start)
        start = time.monotonic()
        try:
            swarm.start(timeout_s=min(timeout_s, 300))
            while any(p.alive() for p in swarm.peers):
                if time.monotonic() - start > timeout_s:
                    msg = f"the swarm did not finish {rounds} rounds within {timeout_s:.0f}s (logs in {root})"
                    raise SwarmdError(msg)
                if on_poll is not None:
                    on_poll(swarm.peers, asyncio.run(swarm.statuses()))
                swarm.wait(poll_s)
        finally:
            swarm.stop()
        failed = [p.index for p in swarm.peers if p.process.returncode != 0]
        if failed:
            raise SwarmdError(f"peers {failed} failed; see their logs in {root}: {swarm.tail(swarm.peers[failed[0]])}")
        blocks, emb = swarm.assemble()
        sums = swarm.summaries()
    return {
        "peers": peers,
        "blocks": model.blocks,
        "rounds": min(int(s.get("round", 0)) for s in sums),
        "steps_per_round": steps_per_round,
        "codec": Codec(codec).value,
        "ce_start": ce_start,
        "ce_end": from_noise_ce(blocks, emb, *eval_xy, model)["ce"],
        "participation": sum(float(s.get("participation", 0)) for s in sums) / len(sums),
        "bytes_sent": sum(int(s.get("bytes_sent", 0)) for s in sums),
        "raw_bytes_sent": sum(int(s.get("raw_bytes_sent", 0)) for s in sums),
        "wall_s": time.monotonic() - start,
        "config": model.to_dict(),
    }
