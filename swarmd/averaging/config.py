"""GossipConfig: every knob of one peer's averaging rounds (frozen, validated).

Codec, deadline bounds, payload and round-jump limits, the merge rule and its robust parameters, the
outer optimizer, delayed averaging and group averaging. Built at the edge (CLI, test fixture) inside a
swarmd.node.config.DaemonConfig and handed to the round; invalid values raise swarmd.errors.ConfigError.
No torch, grpc or hivemind imports here.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarmd.errors import ConfigError
from swarmd.protocol import Codec

# GossipConfig.group_layout (swarmd.averaging.groups.assign; "two-phase": swarmd.averaging.phases)
GROUP_LAYOUTS = ("grid", "balanced", "orthogonal", "two-phase")
PULL_CODECS = ("fp32", "int8", "int8-delta", "int8-chain")  # GossipConfig.pull_codec (swarmd.averaging.compact)


@dataclass(frozen=True)
class GossipConfig:
    steps_per_round: int = 20  # H: local optimiser steps between two averaging rounds
    # balanced rounds (swarmd.core.balanced_rounds): a peer whose steps are faster than the slowest training peer's
    # takes as many as fit in the slowest one's H, at most this x H (1 = H every round). On by default: the
    # time-to-quality benchmark's busy schedules end 0.03-0.06 nats lower at about the same wall time (research.md)
    balance_steps: float = 2.0
    codec: Codec = Codec.INT8  # delta codec on the wire (always followed by zstd); its name is accepted too
    deadline_min_s: float = 2.0  # the collection deadline never drops below this (after own delta is ready)
    deadline_max_s: float = 30.0  # ... and never exceeds this (or 1.5 x the round's own training time, if longer)
    deadline_factor: float = 3.0  # deadline = factor x EMA of the last rounds' arrival lag, clipped to [min, max]
    max_payload_bytes: int = 512 << 20  # refuse any incoming payload larger than this (decoded fp32 bytes)
    rpc_timeout_s: float = 10.0  # timeout of status / config / state pulls
    max_round_jump: int = 1000  # a re-sync moves this peer's round counter forward by at most this many rounds
    # merge rule (swarmd.averaging.robust): "robust" = norm clip + coordinate-wise trimmed mean + outlier check;
    # "mean" = plain mean
    merge: str = "robust"
    clip_factor: float = 2.0  # each delta's norm is cut to this x the lower median of the round's norms (0 = off)
    trim_fraction: float = 0.1  # per coordinate, ceil(this x peers) values trimmed from each end (at most (n-1)//2)
    min_cosine: float = 0.0  # from 3 peers, drop deltas whose cosine with the robust centre is below this (-1 = off)
    distance_factor: float = 0.0  # ... and those farther from it than this x the median distance (0 = off: it
    # dropped honest byte-table deltas, +0.005-0.007 nats in the simulator; swarmd.averaging.robust)
    # reject (not merge) a decoded delta whose norm exceeds this x steps_per_round x lr x sqrt(values) (0 = no bound)
    max_delta_factor: float = 10.0
    # outer optimizer on the merged delta (swarmd.averaging.outer): "nesterov" = DiLoCo's SGD with Nesterov momentum,
    # "none" = plain averaging (base += merged); with group averaging each peer steps on its own delta (outer_for)
    outer: str = "none"
    outer_lr: float = 0.7  # its learning rate (1.0 with momentum 0 is plain averaging)
    outer_momentum: float = 0.9  # its Nesterov momentum, in [0, 1)
    # delayed averaging (swarmd.averaging.delayed): keep training while a round's deltas are exchanged and merged,
    # landing the merge one round late with a correction for the steps taken meanwhile
    overlap: bool = False
    overlap_steps: int = 0  # ... taking at most this many of the next round's steps before the merge lands (0 = all H)
    # group averaging (swarmd.averaging.groups): peers average in groups of at most this many (0 = all-to-all)
    group_size: int = 0  # opt-in: a 12-daemon run measured 0.07 nats worse than all-to-all (README)
    group_full_every: int = 0  # every this many rounds, one round of every peer together (re-anchors; 0 = never)
    # who groups with whom (swarmd.averaging.groups.assign): "balanced" (a new order cut into the fewest groups of
    # equal size every round) or "grid". Balanced measured better at 8 replicas (groups of 4: +0.013 nats over
    # all-to-all against +0.028 for the grid's 4 x 2, which averages pairs every other round; benchmarks/group_sim.py).
    # "two-phase": balanced groups whose merged values are also averaged across the groups in the same round, so
    # every replica ends on the mean of all groups (swarmd.averaging.phases; the daemon's phase 2:
    # swarmd.averaging.phase2)
    group_layout: str = "balanced"
    # ... the byte table's groups (every peer holds the table): 0 = all-to-all whatever group_size says. The
    # peers of different blocks tune the table differently, so table groups of mixed blocks drift apart
    # (README "Group averaging"); the table is the smallest part, so sending it to every peer costs least
    table_group_size: int = 0
    # checks on the peer's held-out sample (swarmd.averaging.validation), in nats; inf turns one off
    adopt_tolerance: float = 0.05  # refuse to adopt a state that scores worse than what we hold by more than this
    merge_check_tolerance: float = 0.02  # a merge that scores worse than our own delta alone by more than this falls
    # back to the deltas that pass the same check one by one (Zeno)
    # standing of the others (swarmd.averaging.standing). Probation and the range cap: public swarms only
    probation_rounds: int = (
        3  # a new identity's deltas merge only when they pass alone until it passed this many rounds
    )
    identities_per_range: int = 4  # identities of one /24 (/48) that count; the youngest beyond it are on probation
    drift_check: bool = True  # leave out a peer whose deviations from the merge keep pointing one way (drift.py)
    pow_bits: int = 0  # proof of work on the key every record must carry (swarmd.membership.pow; 0 = none)
    # trajectory training's predecessor pulls (swarmd.averaging.compact): "fp32" (exact; mid-round ones fp16),
    # "int8" (per-row int8 + zstd, run frozen only; adoption and re-sync pulls stay fp32 and hash-checked) or
    # "int8-delta" (mid-round ones as int8 deltas against the round-start pull) or "int8-chain" (round-start ones,
    # after the first, as int8 steps along a chain both sides hold, swarmd.averaging.pull_chain). In
    # benchmarks/time_to_quality.py
    # (B=4 x 1 layer, d=64, lockstep) int8 cut wire/raw bytes from 0.72 / 0.94 to 0.18 / 0.20 (grow / concurrent)
    # at +0.0001 / +0.0011 nats; int8-delta to 0.14 / 0.14 at +0.0001 / +0.0083. With balanced rounds and one pull
    # a round, int8-chain took them from 0.15 / 0.19 to 0.11 / 0.10 at +0.0035 and +0.0001 (grow, seeds 0 / 1) and
    # -0.0006 (concurrent); the demo's four daemons sent 0.11 of raw where int8 sent 0.19
    pull_codec: str = "int8-chain"

    def __post_init__(self) -> None:
        if self.steps_per_round < 1:
            raise ConfigError(f"steps_per_round must be >= 1, got {self.steps_per_round}")
        try:
            object.__setattr__(self, "codec", Codec(self.codec))
        except ValueError:
            raise ConfigError(f"codec must be one of {tuple(c.value for c in Codec)}, got {self.codec!r}") from None
        if not 0 < self.deadline_min_s <= self.deadline_max_s:
            raise ConfigError("need 0 < deadline_min_s <= deadline_max_s")
        if self.deadline_factor <= 0 or self.rpc_timeout_s <= 0 or self.max_payload_bytes <= 0:
            raise ConfigError("deadline_factor, rpc_timeout_s and max_payload_bytes must be > 0")
        if self.max_round_jump < 1:
            raise ConfigError(f"max_round_jump must be >= 1, got {self.max_round_jump}")
        if self.merge not in ("robust", "mean"):
            raise ConfigError(f"merge must be 'robust' or 'mean', got {self.merge!r}")
        if not 1 <= self.balance_steps < float("inf"):
            raise ConfigError(f"balance_steps must be >= 1 (1 = H steps every round), got {self.balance_steps}")
        if not 0 <= self.overlap_steps <= self.steps_per_round:
            raise ConfigError(f"overlap_steps must be in [0, steps_per_round], got {self.overlap_steps}")
        if self.clip_factor < 0 or not 0 <= self.trim_fraction < 0.5 or self.max_delta_factor < 0:
            raise ConfigError("need clip_factor >= 0, 0 <= trim_fraction < 0.5 and max_delta_factor >= 0")
        if not -1 <= self.min_cosine < 1:
            raise ConfigError(f"min_cosine must be in [-1, 1) (-1 turns the direction test off), got {self.min_cosine}")
        if not (self.distance_factor == 0 or 1 <= self.distance_factor < float("inf")):
            raise ConfigError(f"distance_factor must be 0 (off) or >= 1, got {self.distance_factor}")
        if self.outer not in ("none", "nesterov"):
            raise ConfigError(f"outer must be 'none' or 'nesterov', got {self.outer!r}")
        if not (0 < self.outer_lr < float("inf")) or not 0 <= self.outer_momentum < 1:
            raise ConfigError("need outer_lr > 0 and 0 <= outer_momentum < 1")
        if not (self.adopt_tolerance >= 0 and self.merge_check_tolerance >= 0):
            raise ConfigError("adopt_tolerance and merge_check_tolerance must be >= 0 (inf: off)")
        if self.probation_rounds < 0 or self.identities_per_range < 0 or not 0 <= self.pow_bits <= 40:
            raise ConfigError("need probation_rounds >= 0, identities_per_range >= 0 and pow_bits in [0, 40]")
        if self.group_size < 0 or self.group_size == 1 or self.group_full_every < 0:
            raise ConfigError("group_size must be 0 (all-to-all) or >= 2, and group_full_every >= 0")
        if self.group_layout not in GROUP_LAYOUTS:
            raise ConfigError(f"group_layout must be one of {', '.join(GROUP_LAYOUTS)}, got {self.group_layout!r}")
        if self.pull_codec not in PULL_CODECS:
            raise ConfigError(f"pull_codec must be one of {', '.join(PULL_CODECS)}, got {self.pull_codec!r}")
        if self.table_group_size < 0 or self.table_group_size == 1:
            raise ConfigError("table_group_size must be 0 (all-to-all) or >= 2")
