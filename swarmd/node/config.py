"""Swarm daemon configuration: NetConfig and DaemonConfig (frozen, validated; GossipConfig is swarmd.averaging.config).

Owns every knob of a swarm peer that is not the model or the optimiser (those stay in
swarmd.core.config, owned by the model core). Built once at the edge (CLI or test fixture) and handed
down: gossip gets GossipConfig, discovery gets NetConfig, the daemon gets the whole DaemonConfig.
DaemonConfig.to_dict / from_dict round-trip through JSON (`python -m swarmd --config PEER.json`).
Invalid values raise swarmd.errors.ConfigError. No torch, grpc or hivemind imports here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from swarmd.averaging.config import GossipConfig
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.errors import ConfigError
from swarmd.membership.addresses import check_peer_addresses, is_unspecified, split_host_port


@dataclass(frozen=True)
class NetConfig:
    swarm_id: str = "blocktrain"  # peers only talk to peers of the same swarm id (DHT keys are scoped by it)
    listen: str = "127.0.0.1:0"  # host:port of the gRPC server (port 0 = pick a free one)
    initial_peers: tuple[str, ...] = ()  # DHT multiaddrs to join through ("host:port" entries mean static discovery)
    # interface the DHT's libp2p node listens on ("" = the --listen host's kind: 0.0.0.0 for 0.0.0.0 / ::, 127.0.0.1
    # for loopback, else that address; swarmd.membership.addresses.dht_listen_host)
    dht_host: str = ""
    dht_port: int = 0  # tcp port of the DHT's libp2p node (0 = any free one; fix it so the multiaddr survives restarts)
    # HOST[:PORT] other peers are told to dial for gRPC, and the host the DHT announces ("" = the --listen host, or
    # when listening on 0.0.0.0 an address of this host's outgoing interface); see swarmd.membership.addresses
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
    # what one caller can hold on our gRPC server (swarmd.transport.limits: the defaults are its DEFAULT_* values),
    # per caller identity (a verified peer id; a host's unproven callers together count as one) under a ceiling per
    # caller host; excess is RESOURCE_EXHAUSTED at once
    max_streams: int = 64  # ExchangeDeltas + PullState streams served at once, all callers (0 = no cap)
    max_streams_per_peer: int = 32  # ... from one caller host, all its identities (0 = no cap)
    max_streams_per_identity: int = 8  # ... for one caller identity (an honest daemon holds 2-4) (0 = no cap)
    request_rate: float = 100.0  # GetStatus / GetConfig / ExchangeDeltas per s per caller identity (0 = unlimited)
    request_burst: float = 200.0  # ... with bursts up to this many
    # PullState requests per second per caller identity (0 = unlimited; each sends a state; a compact one, int8
    # predecessor weights, counts a quarter: 4 predecessor pulls a round fit rounds down to half a second)
    pull_rate: float = 2.0
    pull_burst: float = 16.0  # ... with bursts up to this many (a join pulls block, table and outer state)
    host_shares: float = 8.0  # a caller host's request and pull ceiling, in identities' budgets (>= 1)
    forward_rate: float = 2000.0  # Forward request units (64 KiB) per second per caller identity (0 = unlimited)
    forward_burst: float = 4000.0  # ... with bursts up to this many
    forward_host_shares: float = 2.0  # a caller host's Forward ceiling, in identities' budgets (>= 1)
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
        check_limits(self)
        if self.serve_cache_bytes < 0:
            raise ConfigError(f"serve_cache_bytes must be >= 0, got {self.serve_cache_bytes}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be in [0, 65535], got {self.metrics_port}")


STREAM_CAPS = ("max_streams", "max_streams_per_peer", "max_streams_per_identity")  # >= 0 (0 = no cap)
RATES = ("request_rate", "pull_rate", "forward_rate")  # >= 0 (0 = unlimited)
BURSTS = ("request_burst", "pull_burst", "forward_burst")  # >= 1 request unit
HOST_SHARES = ("host_shares", "forward_host_shares")  # >= 1 identity's budget


def check_limits(net: NetConfig) -> None:
    """ConfigError (one line naming the field) for a server limit out of its range."""
    for names, lo, what in (
        (STREAM_CAPS, 0, "a whole number >= 0 (0 = no cap)"),
        (RATES, 0, "a number >= 0 (0 = unlimited)"),
        (BURSTS, 1, "a number >= 1"),
        (HOST_SHARES, 1, "a number >= 1 (a host gets at least one identity's budget)"),
    ):
        for name in names:
            value = getattr(net, name)
            kind = int if names is STREAM_CAPS else (int, float)
            if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value < lo:
                raise ConfigError(f"net.{name} must be {what}, got {value!r}")


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
    # when every exchange of a few rounds fails for a known cause (another swarm key, config, swarm id:
    # swarmd.node.diagnosis), warn and go on instead of stopping with exit code 3
    keep_trying: bool = False

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
