"""What the fault matrix (benchmarks/adversary.py) and its insider rows (benchmarks/insiders.py) share.

Owns: CFG (the one-block tiny model of the matrix's swarms), Row (one row of the matrix), signed_delta (a
misbehaving daemon's delta, encoded and signed as its honest one would be) and fmt (a figure or "-").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from benchmarks.harness.daemons import TINY_CFG

# one block: every peer is a replica of every other; no sampler-step messages (a Forward step is one request)
CFG = replace(TINY_CFG, blocks=1, pred_input="none", pred_output="none")


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
        return None if self.ce is None or self.ce_clean is None else self.ce - self.ce_clean


def signed_delta(gossip: Any, kind: Any, bad: dict) -> Any:
    """`bad` encoded and signed as `gossip`'s delta of `kind` for the round open now, as its honest delta would be
    (a misbehaving daemon's Gossip sends it instead: adversary.py's and insiders.py's)."""
    from swarmd.averaging.delta import encode
    from swarmd.membership.trust import sign_payload

    rs = gossip.current
    assert rs is not None
    hdr = gossip.hdr(kind, rs.round)
    enc = encode(bad, gossip.cfg.codec, base_hash=rs.hashes[kind], weight=float(gossip.cfg.steps_per_round), **hdr)
    return sign_payload(enc, gossip.identity)


def fmt(x: float | None, spec: str = "{:.4f}") -> str:
    """x formatted by spec, "-" for None."""
    return "-" if x is None else spec.format(x)
