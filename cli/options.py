"""The option groups: the flags that travel together, taken by a command as one parameter, and the configs they build.

A group (ModelOptions, TrainOptions, PeerOptions, SourceOptions; the machinery is cli.groups) is a frozen
dataclass whose fields are typed with the flags of cli.flags; it builds its frozen config
(`ModelOptions.config`, `PeerOptions.config`, ...) in one place, turning config validation errors into
swarmd.errors.ConfigError. Checks that relate two flags (--sigma-lo < --sigma-hi, --d-model divisible by
--n-heads, ...) stay in the configs; a single flag's range is checked while parsing (cli.bounds). Imports no
torch (`--help` stays fast).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from cli import flags as f
from cli.bounds import AT_LEAST_0, AT_LEAST_1, PORT, POSITIVE, SEED, SEED_MAX, UNIT, Bounds  # noqa: F401 (re-exported)
from cli.flags import DAEMON, DEFAULT_CODEC, DEFAULT_DEVICE, GOSSIP, MODEL, NET, TRAIN, Device
from cli.groups import OptionGroup
from swarmd.averaging.config import GossipConfig
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.errors import ConfigError
from swarmd.node.config import DaemonConfig, NetConfig, peer_train_config


@dataclass(frozen=True)
class ModelOptions(OptionGroup):
    """The model flags (run, train, model-info; optional() in join and demo: None = the base config's)."""

    DEFAULTS: ClassVar[Mapping[str, Any]] = {**MODEL.to_dict(), "hidden": None}  # no --hidden: 4 x --d-model
    blocks: f.Blocks
    layers_per_block: f.LayersPerBlock
    d_model: f.DModel
    n_heads: f.NHeads
    hidden: f.Hidden
    seq_len: f.SeqLen
    sigma_lo: f.SigmaLo
    sigma_hi: f.SigmaHi
    context_input: f.ContextInput
    z_in_init: f.ZInInit
    noise_embedding: f.NoiseEmbedding
    pred_input: f.PredInput
    pred_output: f.PredOutput
    handoff_loss: f.HandoffLoss
    pred_in_init: f.PredInInit

    def config(self, base: ModelConfig = MODEL) -> ModelConfig:
        """`base` with the options given (None = keep); --hidden defaults to 4 x --d-model."""
        values = self.given()
        if "hidden" not in values and "d_model" in values:
            values["hidden"] = 4 * values["d_model"]
        try:
            return ModelConfig(**{**base.to_dict(), **values})
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class TrainOptions(OptionGroup):
    """The optimiser flags (run, join, train; optional() in demo)."""

    DEFAULTS: ClassVar[Mapping[str, Any]] = asdict(TRAIN)
    batch_size: f.BatchSize
    lr: f.LR
    seed: f.Seed
    trajectory_prob: f.TrajectoryProb
    freeze_z_in: f.FreezeZIn
    replica_adam: f.ReplicaAdam
    predecessor_pulls: f.PredecessorPulls
    prefetch_pulls: f.PrefetchPulls
    handoff_weight: f.HandoffWeight
    pipeline: f.Pipeline
    pipeline_stagger: f.PipelineStagger
    grow: f.Grow
    block_init: f.BlockInit

    def config(self, base: TrainConfig = TRAIN, **fields: Any) -> TrainConfig:
        """`base` with the options given (None = keep) and `fields` (e.g. total_steps)."""
        try:
            return replace(base, **self.given(), **fields)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class PeerOptions(OptionGroup):
    """What a swarm peer (run, join) takes besides the model and training flags: data, swarm, network."""

    DEFAULTS: ClassVar[Mapping[str, Any]] = {
        "device": DEFAULT_DEVICE,
        "steps_per_round": GOSSIP.steps_per_round,
        "rounds": DAEMON.max_rounds,
        "open_gain": TRAIN.open_gain,
        "block": "auto",
        "swarm_id": NET.swarm_id,
        "codec": DEFAULT_CODEC,
        "deadline_max": GOSSIP.deadline_max_s,
        "min_peers": DAEMON.min_peers,
        "eval_every": DAEMON.eval_every,
        "listen": NET.listen,
        "client_mode": NET.client_mode,
        "static": False,
        "dht_host": NET.dht_host,
        "dht_port": NET.dht_port,
        "metrics_port": NET.metrics_port,
        "outer": GOSSIP.outer,
        "outer_lr": GOSSIP.outer_lr,
        "outer_momentum": GOSSIP.outer_momentum,
        "overlap": GOSSIP.overlap,
        "overlap_steps": GOSSIP.overlap_steps,
        "balance_steps": GOSSIP.balance_steps,
        "group_size": GOSSIP.group_size,
        "group_full_every": GOSSIP.group_full_every,
        "group_layout": GOSSIP.group_layout,
        "pull_codec": GOSSIP.pull_codec,
        "table_group_size": GOSSIP.table_group_size,
        "keep_trying": DAEMON.keep_trying,
        "adopt_tolerance": GOSSIP.adopt_tolerance,
        "merge_check_tolerance": GOSSIP.merge_check_tolerance,
        "probation_rounds": GOSSIP.probation_rounds,
        "identities_per_range": GOSSIP.identities_per_range,
        "pow_bits": GOSSIP.pow_bits,
        "max_streams": NET.max_streams,
        "max_streams_per_host": NET.max_streams_per_peer,
        "max_streams_per_identity": NET.max_streams_per_identity,
        "request_rate": NET.request_rate,
        "request_burst": NET.request_burst,
        "pull_rate": NET.pull_rate,
        "pull_burst": NET.pull_burst,
        "host_shares": NET.host_shares,
        "forward_rate": NET.forward_rate,
        "forward_burst": NET.forward_burst,
        "forward_host_shares": NET.forward_host_shares,
    }
    data: f.Data
    device: f.DeviceOpt
    steps_per_round: f.StepsPerRound
    rounds: f.PeerRounds
    open_gain: f.OpenGain
    eval_data: f.EvalData
    block: f.BlockOpt
    checkpoint_dir: f.CheckpointDir
    swarm_id: f.SwarmId
    codec: f.CodecOpt
    deadline_max: f.DeadlineMax
    peer_seed: f.PeerSeed
    min_peers: f.MinPeers
    eval_every: f.EvalEvery
    listen: f.Listen
    client_mode: f.ClientMode
    static: f.Static
    dht_host: f.DhtHost
    dht_port: f.DhtPort
    announce: f.Announce
    metrics_port: f.MetricsPort
    swarm_key: f.SwarmKeyOpt
    identity: f.IdentityOpt
    tls_cert: f.TlsCert
    tls_key: f.TlsKey
    outer: f.OuterOpt
    outer_lr: f.OuterLr
    outer_momentum: f.OuterMomentum
    overlap: f.Overlap
    overlap_steps: f.OverlapSteps
    balance_steps: f.BalanceSteps
    group_size: f.GroupSize
    group_full_every: f.GroupFullEvery
    group_layout: f.GroupLayout
    pull_codec: f.PullCodec
    table_group_size: f.TableGroupSize
    keep_trying: f.KeepTrying
    adopt_tolerance: f.AdoptTolerance
    merge_check_tolerance: f.MergeCheckTolerance
    probation_rounds: f.ProbationRounds
    identities_per_range: f.IdentitiesPerRange
    pow_bits: f.PowBits
    max_streams: f.MaxStreams
    max_streams_per_host: f.MaxStreamsPerHost
    max_streams_per_identity: f.MaxStreamsPerIdentity
    request_rate: f.RequestRate
    request_burst: f.RequestBurst
    pull_rate: f.PullRate
    pull_burst: f.PullBurst
    host_shares: f.HostShares
    forward_rate: f.ForwardRate
    forward_burst: f.ForwardBurst
    forward_host_shares: f.ForwardHostShares

    def check(self, train: TrainOptions, initial_peers: list[str]) -> None:
        """Build what config() builds but the model-dependent part (ConfigError): for join, before the swarm's
        model is known, so a bad combination of flags fails before anything loads or connects."""
        self._parts(train, initial_peers)

    def _parts(self, train: TrainOptions, initial_peers: list[str]) -> tuple[TrainConfig, GossipConfig, NetConfig]:
        if self.block != "auto" and not self.block.isdigit():
            raise ConfigError(f"--block must be a number or 'auto', got {self.block!r}")
        static = self.static or (bool(initial_peers) and not any(p.startswith("/") for p in initial_peers))
        steps = self.steps_per_round
        try:
            base = peer_train_config(steps)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        gossip = GossipConfig(
            steps_per_round=steps,
            codec=self.codec,
            deadline_max_s=self.deadline_max,
            outer=self.outer,
            outer_lr=self.outer_lr,
            outer_momentum=self.outer_momentum,
            overlap=self.overlap,
            overlap_steps=self.overlap_steps,
            balance_steps=self.balance_steps,
            group_size=self.group_size,
            group_full_every=self.group_full_every,
            group_layout=self.group_layout,
            pull_codec=self.pull_codec,
            table_group_size=self.table_group_size,
            adopt_tolerance=self.adopt_tolerance,
            merge_check_tolerance=self.merge_check_tolerance,
            probation_rounds=self.probation_rounds,
            identities_per_range=self.identities_per_range,
            pow_bits=self.pow_bits,
        )
        net = NetConfig(
            swarm_id=self.swarm_id,
            listen=self.listen,
            initial_peers=tuple(initial_peers),
            discovery="static" if static else "hivemind",
            client_mode=self.client_mode,
            dht_host=self.dht_host,
            dht_port=self.dht_port,
            announce=self.announce or "",
            metrics_port=self.metrics_port,
            swarm_key=str(self.swarm_key or ""),
            tls_cert=str(self.tls_cert or ""),
            tls_key=str(self.tls_key or ""),
            max_streams=self.max_streams,
            max_streams_per_peer=self.max_streams_per_host,
            max_streams_per_identity=self.max_streams_per_identity,
            request_rate=self.request_rate,
            request_burst=self.request_burst,
            pull_rate=self.pull_rate,
            pull_burst=self.pull_burst,
            host_shares=self.host_shares,
            forward_rate=self.forward_rate,
            forward_burst=self.forward_burst,
            forward_host_shares=self.forward_host_shares,
        )
        return train.config(base, open_gain=self.open_gain), gossip, net

    def config(
        self, model: ModelConfig, train: TrainOptions, initial_peers: list[str], data_path: Path, eval_path: Path | None
    ) -> DaemonConfig:
        """The DaemonConfig of this peer; PEERS are gRPC addresses with --static or when none is a /multiaddr."""
        train_config, gossip, net = self._parts(train, initial_peers)
        return DaemonConfig(
            model=model,
            train=train_config,
            gossip=gossip,
            net=net,
            data_path=str(data_path),
            eval_path=str(eval_path) if eval_path else "",
            eval_every=self.eval_every,
            block=DAEMON.block if self.block == "auto" else int(self.block),
            device=self.device.value,
            checkpoint_dir=str(self.checkpoint_dir) if self.checkpoint_dir else "",
            identity=str(self.identity or ""),
            peer_seed=self.peer_seed,
            max_rounds=self.rounds,
            min_peers=self.min_peers,
            keep_trying=self.keep_trying,
        )


@dataclass(frozen=True)
class SourceOptions(OptionGroup):
    """Where score and generate get the model: a swarm (--swarm) or a checkpoint, on --device."""

    DEFAULTS: ClassVar[Mapping[str, Any]] = {
        "swarm_id": NET.swarm_id,
        "timeout_s": 30.0,
        "device": Device.cpu,
        "verify_share": 0.5,  # swarmd.serve.verify.DEFAULT_SHARE (a literal: that module imports torch)
    }
    swarm: f.SwarmPeers
    checkpoint: f.Checkpoint
    swarm_id: f.SwarmId
    timeout_s: f.TimeoutS
    device: f.DeviceOpt
    verify_share: f.VerifyShare

    @property
    def label(self) -> str:
        return f"swarm {self.swarm_id}" if self.swarm else str(self.checkpoint)
