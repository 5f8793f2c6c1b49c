"""Protocol at scale: the membership, grouping, exchange and merge of thousands of virtual peers, no training.

Owns ProtocolConfig, simulate_part() and simulate(): what group averaging (swarmd.averaging.groups) costs and how
fast it agrees at 1,000 or 10,000 peers, where real daemons cannot go on one machine. Per part (one block's
replicas; the byte table over every peer), every virtual peer starts from the shared anchor plus its own
random delta of the real shapes (the daemon's block and byte table of `model`), scaled so the replicas
start `start_distance` apart (relative to the weights, the daemon's consensus-distance measure). Then each
round, with nothing trained in between (the rounds until agreement are the protocol's, not the optimiser's):
  1. every peer computes the round's groups from the membership (groups.assign, the daemon's own call);
  2. every non-dropped peer encodes its offset (x - anchor) with its own ErrorFeedback and the daemon's
     codec and step rule (groups.offset_int8_levels): the real payload bytes, sent to each member of its group;
  3. each group merges its members' decoded payloads with the daemon's merge rule (robust by default) in
     peer-id order, and every member's state becomes anchor + merged; a dropped peer keeps its state;
  4. the virtual clock (a swarmd.sim.regimes draw per peer: latency, upload bandwidth, dropout) gives the
     round's exchange time: a group is done when its slowest member's uploads arrived
     (latency + bytes sent / bandwidth); the round's time is the slowest group's.
Reported per round: bytes sent per peer, consensus distance (max over peers of ||x - mean|| / ||mean||),
exchange seconds; and the DHT operations a daemon makes per round (three lookups of the signed records and
one announce: counted from what the daemon does, not simulated; a lookup returns every record of the swarm,
so its bytes grow with the peers: records_per_lookup). All-to-all is computed for comparison (one round to
agree, N - 1 payloads per peer). Plain torch and numpy: no grpc, no asyncio, no files.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.delta import INT8_RMS_LEVELS, ErrorFeedback
from swarmd.averaging.groups import Anchor, assign, grid_sides, offset_int8_levels
from swarmd.averaging.merge import merge_deltas
from swarmd.core.config import ModelConfig
from swarmd.core.model import ByteEmbedding, DenoisingBlock
from swarmd.protocol import Codec, PayloadKind
from swarmd.sim.regimes import RoundDraw, regime_named

# the daemon's run_round: three lookups of the signed records (re-sync, predecessors, averaging) and one announce;
# besides, the announce loop re-announces every announce_period_s (2 s) whatever the swarm size
DHT_OPS_PER_ROUND = 4


@dataclass(frozen=True)
class ProtocolConfig:
    """:param peers: virtual peers of the swarm (blocks x replicas per block)
    :param blocks: B; one block's peers // B replicas are simulated (every block is alike), the table over all
    :param group_size: k (GossipConfig.group_size)
    :param rounds: averaging rounds simulated
    :param start_distance: replicas' consensus distance before the first round (one round of local training)
    :param codec: the payload codec (int8 = the daemon's default)
    :param merge: "robust" or "mean" (GossipConfig.merge)
    :param regime: swarmd.sim.regimes preset for the virtual clock and dropout
    :param layout: GossipConfig.group_layout
    """

    peers: int = 1000
    blocks: int = 3
    group_size: int = 4
    rounds: int = 12
    start_distance: float = 0.01
    codec: str = "int8"
    merge: str = "robust"
    regime: str = "wan-mid"  # its latency, bandwidth and dropout (its deadline is not used: groups wait for all)
    layout: str = "grid"  # GossipConfig.group_layout (the issue-12 figures were measured on the grid)
    seed: int = 0


def part_tensors(model: ModelConfig) -> dict[str, dict[str, torch.Tensor]]:
    """The initial weights of the daemon's two parts: one block and the byte table (fp32, real shapes)."""
    torch.manual_seed(0)
    block = {k: v.detach().float().clone() for k, v in DenoisingBlock(model).state_dict().items()}
    table = {k: v.detach().float().clone() for k, v in ByteEmbedding(model).state_dict().items()}
    return {"block": block, "table": table}


def _flat(x: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in x.values()])


def consensus_distance(anchor: torch.Tensor, offsets: torch.Tensor) -> float:
    """max_i ||x_i - mean|| / ||mean|| for the states x_i = anchor + offsets[i] (float64 mean)."""
    mean = offsets.double().mean(0)
    worst = max(float((row.double() - mean).norm()) for row in offsets)
    return worst / float((anchor.double() + mean).norm().clamp_min(1e-12))


def simulate_part(anchor: dict[str, torch.Tensor], n: int, cfg: ProtocolConfig, kind: PayloadKind, salt: str) -> dict:
    """Group averaging of one part among n virtual peers (see the module doc); returns its per-round record.

    A payload is the part's values as one tensor of d_model-wide rows (the daemon's int8 rows are a tensor's
    first dimension, d_model or 4 x d_model wide for a block): the same values and nearly the same bytes, at
    one codec call per peer instead of one per tensor (10,000 peers on a laptop CPU).
    """
    if cfg.layout == "two-phase":  # phase 2 is swarmd.sim.grouping's (the engine's), not modelled here
        raise ValueError("the protocol simulation runs one phase a round: layout 'two-phase' is the engine's only")
    gcfg = GossipConfig(group_size=cfg.group_size, codec=Codec(cfg.codec), merge=cfg.merge)
    gen = torch.Generator().manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    regime = regime_named(cfg.regime)
    ids = [f"peer{i:06d}" for i in range(n)]
    flat_anchor = _flat(anchor)
    numel = flat_anchor.numel()
    row = next(iter(anchor.values())).shape[-1]  # d_model
    shape = (numel // row, row) if numel % row == 0 else (1, numel)
    # start: anchor + a random delta per peer, scaled so the replicas start start_distance apart
    noise = torch.randn((n, numel), generator=gen)
    noise *= cfg.start_distance * float(flat_anchor.norm()) / float(noise.norm(dim=1).mean())
    offsets = noise  # x_i - anchor, one row per peer (float32)
    held = Anchor()
    held.set(anchor, "anchor", 0)
    grouped = 0 < cfg.group_size < n  # one group of everybody: the plain delta's step, as the daemon sends it
    levels = offset_int8_levels(held) if grouped else INT8_RMS_LEVELS
    efs = [ErrorFeedback() for _ in range(n)]
    codec = Codec(cfg.codec)
    index = {p: i for i, p in enumerate(ids)}

    def unflat(values: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"values": values.reshape(shape)}  # one tensor of d_model-wide int8 rows (see simulate_part's doc)

    rounds = [
        {
            "round": 0,
            "consensus_distance": consensus_distance(flat_anchor, offsets),
            "bytes_per_peer": 0.0,
            "exchange_s": 0.0,
        }
    ]
    started = time.perf_counter()
    for r in range(cfg.rounds):
        draw = RoundDraw.sample(regime, rng, n, 1)
        groups = assign(ids, r, cfg.group_size, salt, cfg.layout)
        sent = np.zeros(n)
        decoded: dict[int, dict[str, torch.Tensor]] = {}
        payload_bytes = np.zeros(n)
        for i in range(n):
            if draw.dropped[i]:
                continue
            enc, dec = efs[i].compress(
                unflat(offsets[i]),
                codec,
                int8_rms_levels=levels,
                swarm_id="sim",
                config_hash="sim",
                kind=kind,
                block_index=0 if kind == PayloadKind.BLOCK_DELTA else -1,
                round=r,
                base_hash="anchor",
            )
            decoded[i], payload_bytes[i] = dec, enc.wire_bytes
        slowest = 0.0
        for g in groups:
            live = [index[p] for p in g if index[p] in decoded]
            for i in live:
                sent[i] = payload_bytes[i] * (len(live) - 1)
            if len(live) >= 2:
                merged = (
                    merge_deltas({ids[i]: decoded[i] for i in live}, gcfg)
                    if cfg.merge == "robust"
                    else {k: torch.stack([decoded[i][k] for i in live]).mean(0) for k in decoded[live[0]]}
                )
                merged_row = _flat(merged)
                for i in live:
                    offsets[i] = merged_row
                slowest = max(slowest, max(float(draw.latency_s[i] + sent[i] / draw.bandwidth_Bps[i]) for i in live))
        rounds.append(
            {
                "round": r + 1,
                "consensus_distance": consensus_distance(flat_anchor, offsets),
                "bytes_per_peer": float(sent.sum() / max(1, int((~draw.dropped).sum()))),
                "exchange_s": slowest,
                "groups": len(groups),
                "largest_group": max(len(g) for g in groups),
                "dropped": int(draw.dropped.sum()),
            }
        )
    payload = float(np.mean([r_["bytes_per_peer"] for r_ in rounds[1:]]) if cfg.rounds else 0.0)
    return {
        "peers": n,
        "values": numel,
        "grid": list(grid_sides(n, cfg.group_size)) if cfg.group_size > 0 else [n],
        "rounds": rounds,
        "bytes_per_peer_round": payload,
        "rounds_to_1e-3": _first_below(rounds, 1e-3),
        "rounds_to_1e-4": _first_below(rounds, 1e-4),
        "payload_bytes_median": float(np.median(payload_bytes[payload_bytes > 0])) if payload_bytes.any() else 0.0,
        "cpu_s": time.perf_counter() - started,
    }


def _first_below(rounds: list[dict], level: float) -> int | None:
    for r in rounds:
        if r["consensus_distance"] < level:
            return int(r["round"])
    return None


def simulate(cfg: ProtocolConfig, model: ModelConfig) -> dict:
    """Both parts of a swarm of cfg.peers (one block's replicas, the byte table of every peer), plus the
    all-to-all reference and the DHT operations per peer per round."""
    parts = part_tensors(model)
    replicas = max(1, cfg.peers // cfg.blocks)
    block = simulate_part(parts["block"], replicas, cfg, PayloadKind.BLOCK_DELTA, "sim/block0")
    table = simulate_part(parts["table"], cfg.peers, cfg, PayloadKind.EMBEDDING_DELTA, "sim/table")
    grouped = block["bytes_per_peer_round"] + table["bytes_per_peer_round"]
    all_to_all = (replicas - 1) * block["payload_bytes_median"] + (cfg.peers - 1) * table["payload_bytes_median"]
    return {
        "config": asdict(cfg),
        "replicas_per_block": replicas,
        "block": block,
        "table": table,
        "bytes_per_peer_round": grouped,
        "all_to_all_bytes_per_peer_round": all_to_all,
        "rounds_to_1e-3": _max_none(block["rounds_to_1e-3"], table["rounds_to_1e-3"]),
        "dht_ops_per_peer_round": DHT_OPS_PER_ROUND,
        "records_per_lookup": cfg.peers,
    }


def _max_none(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else max(a, b)
