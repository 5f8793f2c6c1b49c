"""Swarm daemon configuration: GossipConfig, NetConfig and DaemonConfig (frozen, validated).

Owns every knob of a swarm peer that is not the model or the optimiser (those stay in
swarmd.core.config, owned by the model core). Built once at the edge (CLI or test fixture) and handed
down: gossip gets GossipConfig, discovery gets NetConfig, the daemon gets the whole DaemonConfig.
DaemonConfig.to_dict / from_dict round-trip through JSON (`python -m swarmd --config PEER.json`).
Invalid values raise swarmd.errors.ConfigError. No torch, grpc or hivemind imports here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.errors import ConfigError
from swarmd.protocol import Codec
from swarmd.swarm.addresses import check_peer_addresses, is_unspecified, split_host_port


@dataclass(frozen=True)
class GossipConfig:
    steps_per_round: int = 20  # H: local optimiser steps between two averaging rounds
    codec: Codec = Codec.INT8  # delta codec on the wire (always followed by zstd); its name is accepted too
    deadline_min_s: float = 2.0  # the collection deadline never drops below this (after own delta is ready)
    deadline_max_s: float = 30.0  # ... and never exceeds this, however slow the peers were
    deadline_factor: float = 3.0  # deadline = factor x EMA of the last rounds' arrival lag, clipped to [min, max]
    max_payload_bytes: int = 512 << 20  # refuse any incoming payload larger than this (decoded fp32 bytes)
    rpc_timeout_s: float = 10.0  # timeout of status / config / state pulls
    max_round_jump: int = 1000  # a re-sync moves this peer's round counter forward by at most this many rounds
    # merge rule (swarmd.swarm.robust): "robust" = norm clip + coordinate-wise trimmed mean + outlier check;
    # "mean" = plain mean
    merge: str = "robust"
    clip_factor: float = 2.0  # each delta's norm is cut to this x the lower median of the round's norms (0 = off)
    trim_fraction: float = 0.1  # per coordinate, ceil(this x peers) values trimmed from each end (at most (n-1)//2)
    min_cosine: float = 0.0  # from 3 peers, drop deltas whose cosine with the robust centre is below this (-1 = off)
    distance_factor: float = 0.0  # ... and those farther from it than this x the median distance (0 = off: it
    # dropped honest byte-table deltas, +0.005-0.007 nats in the simulator; swarmd.swarm.robust)
    # reject (not merge) a decoded delta whose norm exceeds this x steps_per_round x lr x sqrt(values) (0 = no bound)
    max_delta_factor: float = 10.0
    # outer optimizer on the merged delta (swarmd.swarm.outer): "nesterov" = DiLoCo's SGD with Nesterov momentum,
    # "none" = plain averaging (base += merged)
    outer: str = "none"
    outer_lr: float = 0.7  # its learning rate (1.0 with momentum 0 is plain averaging)
    outer_momentum: float = 0.9  # its Nesterov momentum, in [0, 1)
    # delayed averaging (swarmd.swarm.delayed): keep training while a round's deltas are exchanged and merged,
    # landing the merge one round late with a correction for the steps taken meanwhile
    overlap: bool = False
    overlap_steps: int = 0  # ... taking at most this many of the next round's steps before the merge lands (0 = all H)
    # group averaging (swarmd.swarm.groups): each round peers average in groups of at most this many (0 = all-to-all)
    group_size: int = 0  # opt-in: a 12-daemon run measured 0.07 nats worse than all-to-all (README)
    group_full_every: int = 0  # every this many rounds, one round of every peer together (re-anchors; 0 = never)

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
        if self.group_size < 0 or self.group_size == 1 or self.group_full_every < 0:
            raise ConfigError("group_size must be 0 (all-to-all) or >= 2, and group_full_every >= 0")
        if self.group_size and (self.overlap or self.outer != "none"):  # both assume one shared base per part
            raise ConfigError("--overlap and --outer need all-to-all averaging: drop --group-size (or set it to 0)")


@dataclass(frozen=True)
class NetConfig:
    swarm_id: str = "blocktrain"  # peers only talk to peers of the same swarm id (DHT keys are scoped by it)
    listen: str = "127.0.0.1:0"  # host:port of the gRPC server (port 0 = pick a free one)
    initial_peers: tuple[str, ...] = ()  # DHT multiaddrs to join through ("host:port" entries mean static discovery)
    dht_host: str = "127.0.0.1"  # interface the DHT's libp2p node listens on
    dht_port: int = 0  # tcp port of the DHT's libp2p node (0 = any free one; fix it so the multiaddr survives restarts)
    # HOST[:PORT] other peers are told to dial for gRPC, and the host the DHT announces ("" = the --listen host, or
    # when listening on 0.0.0.0 an address of this host's outgoing interface); see swarmd.swarm.addresses
    announce: str = ""
    discovery: str = "hivemind"  # "hivemind" (real DHT) or "static" (initial_peers are host:port gRPC addresses)
    client_mode: bool = False  # no inbound connections: dial out for exchanges only (peers behind NAT)
    # a private swarm's key FILE (swarmd.transport.auth): every RPC must prove it ("" = BLOCKTRAIN_SWARM_KEY, or public)
    swarm_key: str = ""
    tls_cert: str = ""  # PEM certificate of the gRPC server: serve TLS, its fingerprint goes in the signed record
    tls_key: str = ""  # ... and its private key (both or neither)
    announce_period_s: float = 2.0  # re-announce this often (plus jitter)
    record_ttl_s: float = 15.0  # a DHT record expires this long after its last announce
    dht_start_timeout_s: float = 30.0  # give up starting / joining the DHT after this long
    # serve Prometheus metrics on this port of the --listen host (None = off, 0 = pick a free one)
    metrics_port: int | None = None
    # what one caller can hold on our gRPC server (swarmd.transport.limits); excess is RESOURCE_EXHAUSTED at once
    max_streams: int = 64  # ExchangeDeltas + PullState streams served at once, all callers (0 = no cap)
    max_streams_per_peer: int = 32  # ... from one caller host (0 = no cap)
    forward_rate: float = 2000.0  # Forward request units (64 KiB) per second per caller host (0 = no limit)
    forward_burst: float = 4000.0  # ... with bursts up to this many
    serve_cache_bytes: int = 512 << 20  # KV caches of all Forward sessions and sampler steps together (LRU)

    def __post_init__(self) -> None:
        if not self.swarm_id or any(c in self.swarm_id for c in " /"):
            raise ConfigError(f"swarm_id must be a non-empty name without spaces or slashes, got {self.swarm_id!r}")
        if self.discovery not in ("hivemind", "static"):
            raise ConfigError(f"discovery must be 'hivemind' or 'static', got {self.discovery!r}")
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"listen must be HOST:PORT, got {self.listen!r}")
        if self.announce_period_s <= 0 or self.record_ttl_s <= self.announce_period_s:
            raise ConfigError("need 0 < announce_period_s < record_ttl_s")
        if not 0 <= self.dht_port <= 65535:
            raise ConfigError(f"dht_port must be in [0, 65535], got {self.dht_port}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        if self.announce:
            try:
                announce_host, _ = split_host_port(self.announce)
            except ValueError as exc:
                raise ConfigError(f"announce must be HOST or HOST:PORT: {exc}") from None
            if is_unspecified(announce_host):
                raise ConfigError(f"announce must be an address other hosts can dial, not {announce_host}")
        check_peer_addresses(self.initial_peers)
        if min(self.max_streams, self.max_streams_per_peer, self.forward_rate, self.forward_burst) < 0:
            raise ConfigError("max_streams, max_streams_per_peer, forward_rate and forward_burst must be >= 0")
        if self.serve_cache_bytes < 0:
            raise ConfigError(f"serve_cache_bytes must be >= 0, got {self.serve_cache_bytes}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be in [0, 65535], got {self.metrics_port}")


def peer_train_config(steps_per_round: int, **train: Any) -> TrainConfig:
    """TrainConfig of a swarm peer: the given fields, and a warmup no longer than one round."""
    return TrainConfig(warmup_steps=min(TrainConfig.warmup_steps, steps_per_round), **train)


@dataclass(frozen=True)
class DaemonConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    gossip: GossipConfig = field(default_factory=GossipConfig)
    net: NetConfig = field(default_factory=NetConfig)
    data_path: str = ""  # training text (file or directory)
    eval_path: str = ""  # held-out text for the from-noise CE this peer reports ("" = none)
    eval_tokens: int = 2048  # held-out bytes scored when a peer measures its CE
    block: int = -1  # block to train; -1 = auto (least combined throughput in the swarm)
    device: str = "cpu"
    checkpoint_dir: str = ""  # checkpoint every round here and resume from it on restart ("" = none)
    # the peer's Ed25519 key file (created when missing); "" = identity.key in checkpoint_dir, or a new key per run
    identity: str = ""
    peer_seed: int | None = None  # seeds this peer's data stream and noise (None = derived from the peer id)
    # stop after this many rounds counted from the round this run starts at: a resumed checkpoint's round, else 0
    # (a fresh joiner thus stops with the swarm's round counter; 0 = run until stopped)
    max_rounds: int = 0
    # ... or once the peer's round counter (rounds completed by the swarm) reaches this (0 = no such limit):
    # LocalSwarm's peers, a restarted one included, stop together
    stop_at_round: int = 0
    # every this many rounds, pull the other blocks from peers and measure the from-noise CE (0 = never; needs
    # eval_path)
    eval_every: int = 0
    min_peers: int = 0  # before the first round, wait until discovery sees this many peers (self included)
    min_peers_timeout_s: float = 300.0  # ... but start anyway after this long

    def __post_init__(self) -> None:
        if self.block < -1 or self.block >= self.model.blocks:
            raise ConfigError(f"block must be -1 (auto) or in [0, {self.model.blocks}), got {self.block}")
        if self.max_rounds < 0 or self.eval_tokens < 1:
            raise ConfigError("max_rounds must be >= 0 and eval_tokens >= 1")
        if self.stop_at_round < 0:
            raise ConfigError(f"stop_at_round must be >= 0, got {self.stop_at_round}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be cpu or cuda, got {self.device!r}")

    def with_block(self, block_index: int) -> DaemonConfig:
        return replace(self, block=block_index)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (nested configs as dicts, tuples as lists)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DaemonConfig:
        """Inverse of to_dict; missing keys take their defaults, unknown keys raise ConfigError."""
        body = _known(cls, data, "daemon")
        try:
            for key, sub in (("model", ModelConfig), ("train", TrainConfig), ("gossip", GossipConfig)):
                if key in body:
                    body[key] = sub(**_known(sub, body[key], key))
            if "net" in body:
                net = _known(NetConfig, body["net"], "net")
                body["net"] = NetConfig(**{**net, "initial_peers": tuple(net.get("initial_peers", ()))})
            return cls(**body)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad daemon config: {exc}") from None


def _known(cls: type, data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"the {what} config must be a JSON object, got {type(data).__name__}")
    unknown = set(data) - {f.name for f in fields(cls)}
    if unknown:
        raise ConfigError(f"unknown {what} config keys: {sorted(unknown)}")
    return dict(data)
