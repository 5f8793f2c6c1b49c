"""Every `blocktrain` option, declared once, and the option groups that turn parsed options into configs.

Each flag is an Annotated alias; its default comes from the config dataclass it fills (MODEL,
TRAIN, GOSSIP, NET, DAEMON below are the dataclass defaults), never a repeated literal. Flags that
travel together are fields of one group (ModelOptions, TrainOptions, PeerOptions, SourceOptions;
see cli.groups): a command takes the group as one parameter, and the group builds the frozen
config (`ModelOptions.config`, `PeerOptions.config`, ...) in one place, turning config validation
errors into swarmd.errors.ConfigError. A flag of one command only stays in its signature, typed
with the alias. Imports no torch (`--help` stays fast).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.groups import OptionGroup
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.errors import ConfigError
from swarmd.protocol import Codec
from swarmd.swarm.peer_config import DaemonConfig, GossipConfig, NetConfig, peer_train_config

MODEL, TRAIN, GOSSIP, NET, DAEMON = ModelConfig(), TrainConfig(), GossipConfig(), NetConfig(), DaemonConfig()
M, T, S, N = "Model", "Training", "Swarm", "Network"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


DEFAULT_DEVICE, DEFAULT_CODEC = Device(DAEMON.device), Codec(GOSSIP.codec)

# -- model ---------------------------------------------------------------------------------------
Blocks = Annotated[int | None, typer.Option("--blocks", help="B: number of denoising blocks.", rich_help_panel=M)]
LayersPerBlock = Annotated[
    int | None, typer.Option("--layers-per-block", help="L_b: transformer layers per block.", rich_help_panel=M)
]
DModel = Annotated[int | None, typer.Option("--d-model", help="Model width d.", rich_help_panel=M)]
NHeads = Annotated[int | None, typer.Option("--n-heads", help="Attention heads per layer.", rich_help_panel=M)]
Hidden = Annotated[int | None, typer.Option("--hidden", help="FFN width (default 4 x d-model).", rich_help_panel=M)]
SeqLen = Annotated[int | None, typer.Option("--seq-len", help="Bytes per training window.", rich_help_panel=M)]
SigmaLo = Annotated[float | None, typer.Option("--sigma-lo", help="Bottom of the noise range.", rich_help_panel=M)]
SigmaHi = Annotated[float | None, typer.Option("--sigma-hi", help="Top of the noise range.", rich_help_panel=M)]
# model and training options are typed `X | None`: join and demo default them to None (= the swarm's, the demo's)

# -- data and training -----------------------------------------------------------------------------
Data = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help="Training text: a file or a directory of files (default: $BLOCKTRAIN_DATA or the WikiText-2 cache).",
        envvar="BLOCKTRAIN_TRAIN_DATA",
        rich_help_panel=T,
    ),
]
EvalData = Annotated[
    Path | None,
    typer.Option(
        "--eval-data",
        help="Held-out text for from-noise CE (default: eval split next to the training data).",
        rich_help_panel=T,
    ),
]
StepsPerRound = Annotated[
    int, typer.Option("--steps-per-round", help="H: local optimiser steps per block per round.", rich_help_panel=T)
]
Rounds = Annotated[
    int, typer.Option("--rounds", help="Rounds to run (run / join: 0 = until stopped).", rich_help_panel=T)
]
BatchSize = Annotated[int | None, typer.Option("--batch-size", help="Sequences per optimiser step.", rich_help_panel=T)]
LR = Annotated[float | None, typer.Option("--lr", help="AdamW peak learning rate.", rich_help_panel=T)]
Seed = Annotated[int | None, typer.Option("--seed", help="Seed for init, data order and noise.", rich_help_panel=T)]
TrajectoryProb = Annotated[
    float | None,
    typer.Option(
        "--trajectory-prob",
        help="Chance a batch trains on the sampler's own trajectory (0 = documented noisy targets).",
        rich_help_panel=T,
    ),
]
EvalTokens = Annotated[
    int, typer.Option("--eval-tokens", help="Held-out bytes scored for from-noise CE.", rich_help_panel=T)
]
DeviceOpt = Annotated[Device, typer.Option("--device", help="Torch device.", case_sensitive=False, rich_help_panel=T)]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log every round and exchange to stderr.")]

# -- swarm -----------------------------------------------------------------------------------------
SwarmId = Annotated[
    str,
    typer.Option(
        "--swarm-id",
        help="Swarm name; peers only talk to peers of the same swarm.",
        envvar="BLOCKTRAIN_SWARM_ID",
        rich_help_panel=S,
    ),
]
SwarmPeers = Annotated[
    list[str] | None,
    typer.Option(
        "--swarm",
        help="DHT multiaddr (or HOST:PORT) of a running peer; repeat for several.",
        envvar="BLOCKTRAIN_SWARM",
        show_default=False,
        rich_help_panel=S,
    ),
]
BlockOpt = Annotated[
    str,
    typer.Option(
        "--block",
        help="Block to train: a number, or 'auto' for the block with the least combined throughput.",
        envvar="BLOCKTRAIN_BLOCK",
        rich_help_panel=S,
    ),
]
CheckpointDir = Annotated[
    Path | None,
    typer.Option(
        "--checkpoint-dir",
        help="Checkpoint here after every round and resume from it on restart.",
        envvar="BLOCKTRAIN_CHECKPOINT_DIR",
        rich_help_panel=S,
    ),
]
CodecOpt = Annotated[
    Codec,
    typer.Option(
        "--codec",
        help="Delta codec on the wire (always followed by zstd; int8 uses error feedback).",
        case_sensitive=False,
        rich_help_panel=S,
    ),
]
PeerSeed = Annotated[
    int | None,
    typer.Option(
        "--peer-seed",
        help="Seed of this peer's data stream and noise (default: derived from the peer id, so peers differ).",
        envvar="BLOCKTRAIN_PEER_SEED",
        show_default=False,
        rich_help_panel=S,
    ),
]
DeadlineMax = Annotated[
    float,
    typer.Option(
        "--deadline-max",
        help="Longest a round waits for peers' deltas, in seconds (the adaptive deadline stays below).",
        rich_help_panel=S,
    ),
]
EvalEvery = Annotated[
    int,
    typer.Option(
        "--eval-every",
        help="Every this many rounds, pull the other blocks from peers and measure the from-noise CE shown by "
        "`status` (0 = never).",
        rich_help_panel=S,
    ),
]
MinPeers = Annotated[
    int,
    typer.Option(
        "--min-peers",
        help="Wait before the first round until the swarm has this many peers (self included).",
        rich_help_panel=S,
    ),
]

# -- network ---------------------------------------------------------------------------------------
Listen = Annotated[
    str,
    typer.Option(
        "--listen",
        help="HOST:PORT of this peer's gRPC server (port 0 = any free port).",
        envvar="BLOCKTRAIN_LISTEN",
        rich_help_panel=N,
    ),
]
ClientMode = Annotated[
    bool,
    typer.Option(
        "--client-mode",
        help="Accept no inbound connections (behind NAT): dial out for exchanges only.",
        rich_help_panel=N,
    ),
]
Static = Annotated[
    bool,
    typer.Option(
        "--static",
        help="PEERS are HOST:PORT gRPC addresses of a fixed peer list instead of DHT multiaddrs.",
        rich_help_panel=N,
    ),
]
DhtHost = Annotated[
    str,
    typer.Option("--dht-host", help="Interface the DHT listens on.", envvar="BLOCKTRAIN_DHT_HOST", rich_help_panel=N),
]
TimeoutS = Annotated[
    float,
    typer.Option(
        "--timeout-s",
        help="Seconds to wait: for each peer (status), for one block step before failing over to a replica "
        "(score, generate), for the whole swarm to finish (demo).",
        rich_help_panel=N,
    ),
]
TimeoutAlias = Annotated[float | None, typer.Option("--timeout", hidden=True)]  # the older spelling of --timeout-s


# -- inference -------------------------------------------------------------------------------------
Checkpoint = Annotated[
    Path | None, typer.Option("--checkpoint", help="Run locally from this checkpoint directory instead of a swarm.")
]
Steps = Annotated[int | None, typer.Option("--steps", help="Sampler steps (default: one per block).")]


# -- groups --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelOptions(OptionGroup):
    """The model flags (run, train, model-info; optional() in join and demo: None = the base config's)."""

    blocks: Blocks = MODEL.blocks
    layers_per_block: LayersPerBlock = MODEL.layers_per_block
    d_model: DModel = MODEL.d_model
    n_heads: NHeads = MODEL.n_heads
    hidden: Hidden = None
    seq_len: SeqLen = MODEL.seq_len
    sigma_lo: SigmaLo = MODEL.sigma_lo
    sigma_hi: SigmaHi = MODEL.sigma_hi

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

    batch_size: BatchSize = TRAIN.batch_size
    lr: LR = TRAIN.lr
    seed: Seed = TRAIN.seed
    trajectory_prob: TrajectoryProb = TRAIN.trajectory_prob

    def config(self, base: TrainConfig = TRAIN, **fields: Any) -> TrainConfig:
        """`base` with the options given (None = keep) and `fields` (e.g. total_steps)."""
        try:
            return replace(base, **self.given(), **fields)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class PeerOptions(OptionGroup):
    """What a swarm peer (run, join) takes besides the model and training flags: data, swarm, network."""

    data: Data = None
    device: DeviceOpt = DEFAULT_DEVICE
    steps_per_round: StepsPerRound = GOSSIP.steps_per_round
    rounds: Rounds = DAEMON.max_rounds
    eval_data: EvalData = None
    block: BlockOpt = "auto"
    checkpoint_dir: CheckpointDir = None
    swarm_id: SwarmId = NET.swarm_id
    codec: CodecOpt = DEFAULT_CODEC
    deadline_max: DeadlineMax = GOSSIP.deadline_max_s
    peer_seed: PeerSeed = None
    min_peers: MinPeers = DAEMON.min_peers
    eval_every: EvalEvery = DAEMON.eval_every
    listen: Listen = NET.listen
    client_mode: ClientMode = NET.client_mode
    static: Static = False
    dht_host: DhtHost = NET.dht_host

    def config(
        self, model: ModelConfig, train: TrainOptions, initial_peers: list[str], data_path: Path, eval_path: Path | None
    ) -> DaemonConfig:
        """The DaemonConfig of this peer; PEERS are gRPC addresses with --static or when none is a /multiaddr."""
        if self.block != "auto" and not self.block.isdigit():
            raise ConfigError(f"--block must be a number or 'auto', got {self.block!r}")
        static = self.static or (bool(initial_peers) and not any(p.startswith("/") for p in initial_peers))
        steps = self.steps_per_round
        return DaemonConfig(
            model=model,
            train=train.config(peer_train_config(steps)),
            gossip=GossipConfig(steps_per_round=steps, codec=self.codec.value, deadline_max_s=self.deadline_max),
            net=NetConfig(
                swarm_id=self.swarm_id,
                listen=self.listen,
                initial_peers=tuple(initial_peers),
                discovery="static" if static else "hivemind",
                client_mode=self.client_mode,
                dht_host=self.dht_host,
            ),
            data_path=str(data_path),
            eval_path=str(eval_path) if eval_path else "",
            eval_every=self.eval_every,
            block=DAEMON.block if self.block == "auto" else int(self.block),
            device=self.device.value,
            checkpoint_dir=str(self.checkpoint_dir) if self.checkpoint_dir else "",
            peer_seed=self.peer_seed,
            max_rounds=self.rounds,
            min_peers=self.min_peers,
        )


@dataclass(frozen=True)
class SourceOptions(OptionGroup):
    """Where score and generate get the model: a swarm (--swarm) or a checkpoint, and how they sample it."""

    swarm: SwarmPeers = None
    checkpoint: Checkpoint = None
    swarm_id: SwarmId = NET.swarm_id
    steps: Steps = None
    timeout_s: TimeoutS = 30.0
    device: DeviceOpt = Device.cpu

    @property
    def label(self) -> str:
        return f"swarm {self.swarm_id}" if self.swarm else str(self.checkpoint)


def timeout_s(timeout_s: float, alias: float | None) -> float:
    """--timeout-s, or the value given with its older spelling --timeout."""
    return timeout_s if alias is None else alias
