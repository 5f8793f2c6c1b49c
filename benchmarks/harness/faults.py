"""What the fault matrix (benchmarks/adversary.py), its insider rows (benchmarks/insiders.py) and the flood rows
(benchmarks/flood.py) share: CFG and swarm (the one-block tiny swarm of daemons), program and run_daemon (a
misbehaving peer: the real daemon with a class of its own), signed_delta (its delta, signed as an honest one), Row
(one row of the matrix) and fmt (a figure or "-").
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.harness import daemons

# one block: every peer is a replica of every other; no sampler-step messages (a Forward step is one request)
CFG = replace(daemons.TINY_CFG, blocks=1, pred_input="none", pred_output="none")


def swarm(a: Any, workdir: Path, peers: int = 4, seed: int = 0, **kw: Any) -> daemons.Swarm:
    """Tiny daemons on CFG (kw may name another model), --rounds x --steps, no trajectory training, every round
    waiting for every delta; kw: more of daemons.tiny's options (programs, swarm_key, ...)."""
    kw = dict(model=CFG, trajectory_prob=0.0, seed=seed, wait_all=True) | kw
    return daemons.tiny(peers, a.data_dir, workdir, a.rounds, a.steps, a.deadline_max, **kw)


def program(script: str, *args: str) -> list[str]:
    """The command that runs the benchmark file `script` with args (a Swarm's peer program: its config follows)."""
    return [sys.executable, str(Path(script).resolve()), *args]


def run_daemon(config: str, **classes: type) -> int:
    """Run the real daemon on config with these names of swarmd.node.daemon (Gossip, BlockServing) replaced by the
    given classes, in this process only (a child process of a benchmark: one misbehaving peer)."""
    from swarmd import __main__ as entry
    from swarmd.node import daemon as daemon_mod

    for name, cls in classes.items():
        setattr(daemon_mod, name, cls)
    return entry.main(["--config", config, "--verbose"])


def signed_delta(gossip: Any, kind: Any, bad: dict, ahead: int = 0, weight: float | None = None) -> Any:
    """`bad` encoded and signed as `gossip`'s delta of `kind` for the round open now (+ ahead), as its honest delta
    would be (weight: its steps per round unless given)."""
    from swarmd.averaging.delta import encode
    from swarmd.membership.trust import sign_payload

    rs = gossip.current
    assert rs is not None
    weight = float(gossip.cfg.steps_per_round) if weight is None else weight
    enc = encode(bad, gossip.cfg.codec, base_hash=rs.hashes[kind], weight=weight, **gossip.hdr(kind, rs.round + ahead))
    return sign_payload(enc, gossip.identity)


def ce_delta(ce: float | None, ce_clean: float | None) -> float | None:
    """ce - ce_clean, None where either is missing."""
    return None if ce is None or ce_clean is None else ce - ce_clean


@dataclass
class Row:
    name: str
    survived: bool
    evidence: str
    ce: float | None = None
    ce_clean: float | None = None
    data_lost: str = "none"
    command: str = ""  # the command line that produced this row (set by main)

    @property
    def ce_delta(self) -> float | None:
        return ce_delta(self.ce, self.ce_clean)


def fmt(x: float | None, spec: str = "{:.4f}") -> str:
    """x formatted by spec, "-" for None."""
    return "-" if x is None else spec.format(x)
