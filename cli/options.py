"""Every `blocktrain` option, declared once, and the option groups that turn parsed options into configs.

Each flag is an Annotated alias; its default comes from the config dataclass it fills (MODEL,
TRAIN, GOSSIP, NET, DAEMON below are the dataclass defaults), never a repeated literal. Flags that
travel together are fields of one group (ModelOptions, TrainOptions, PeerOptions, SourceOptions;
see cli.groups): a command takes the group as one parameter, and the group builds the frozen
config (`ModelOptions.config`, `PeerOptions.config`, ...) in one place, turning config validation
errors into swarmd.errors.ConfigError. A flag of one command only stays in its signature, typed
with the alias. Every numeric flag declares the values it accepts (`bounds=`, a Bounds): a value
outside them is refused while the command line is parsed, before the command runs (nothing loads,
nothing starts), with one `error: bad value: --flag must be ..., got ...` line and exit code 2;
tests/test_cli_numbers.py checks that every numeric flag of every command has bounds. Checks that
relate two flags (--sigma-lo < --sigma-hi, --d-model divisible by --n-heads, ...) stay in the
configs. Imports no torch (`--help` stays fast).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, ClassVar

import typer

from cli.groups import OptionGroup
from swarmd.averaging.config import GossipConfig
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.errors import ConfigError
from swarmd.node.config import DaemonConfig, NetConfig, peer_train_config
from swarmd.protocol import Codec

MODEL, TRAIN, GOSSIP, NET, DAEMON = ModelConfig(), TrainConfig(), GossipConfig(), NetConfig(), DaemonConfig()
M, T, S, N = "Model", "Training", "Swarm", "Network"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


DEFAULT_DEVICE, DEFAULT_CODEC = Device(DAEMON.device), Codec(GOSSIP.codec)


@dataclass(frozen=True)
class Bounds:
    """The values a numeric flag accepts: finite, >= lo (> lo if lo_open), <= hi (< hi if hi_open); or_zero: 0 too."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    or_zero: bool = False  # 0 is accepted besides the range (e.g. --group-size: 0 = all-to-all, else >= 2)

    def __contains__(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.or_zero and value == 0:
            return True
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

    def __str__(self) -> str:
        lo, hi = _num(self.lo), _num(self.hi)
        if self.lo is not None and self.hi is not None:
            text = f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        elif self.lo is not None:
            text = f"{'>' if self.lo_open else '>='} {lo}"
        elif self.hi is not None:
            text = f"{'<' if self.hi_open else '<='} {hi}"
        else:
            text = "a finite number"
        return f"0 or {text}" if self.or_zero else text


def _num(x: float | None) -> str:
    return "2^63 - 1" if x == SEED_MAX else f"{x:g}" if isinstance(x, float) else str(x)


SEED_MAX = 2**63 - 1
AT_LEAST_1, AT_LEAST_0, POSITIVE = Bounds(1), Bounds(0), Bounds(0, lo_open=True)
UNIT, PORT, SEED = Bounds(0, 1), Bounds(0, 65535), Bounds(0, SEED_MAX)


def check_bounds(name: str, bounds: Bounds) -> Callable[..., Any]:
    """A typer callback refusing a value of flag `name` outside `bounds` (one `error:` line, exit 2) at parse time.

    The callback carries `.bounds` (tests read it). None (a flag not given) and shell completion pass."""

    def check(ctx: typer.Context, value: Any) -> Any:
        if value is None or ctx.resilient_parsing or value in bounds:
            return value
        typer.echo(f"error: bad value: {name} must be {bounds}, got {value}", err=True)
        raise typer.Exit(2)

    check.bounds = bounds  # type: ignore[attr-defined]
    return check


def flag(
    name: str,
    help: str,
    panel: str | None = None,
    envvar: str | None = None,
    *,
    bounds: Bounds | None = None,
    **more: Any,
) -> Any:
    """One option: `typer.Option(name, help=help, rich_help_panel=panel, envvar=envvar, **more)`.

    :param bounds: a numeric flag's accepted values, checked while parsing (check_bounds)
    """
    if panel is not None:
        more["rich_help_panel"] = panel
    if bounds is not None:
        more["callback"] = check_bounds(name, bounds)
    return typer.Option(name, help=help, envvar=envvar, **more)


# -- model ---------------------------------------------------------------------------------------
Blocks = Annotated[int | None, flag("--blocks", "B: number of denoising blocks.", M, bounds=AT_LEAST_1)]
LayersPerBlock = Annotated[
    int | None, flag("--layers-per-block", "L_b: transformer layers per block.", M, bounds=AT_LEAST_1)
]
DModel = Annotated[int | None, flag("--d-model", "Model width d.", M, bounds=AT_LEAST_1)]
NHeads = Annotated[int | None, flag("--n-heads", "Attention heads per layer.", M, bounds=AT_LEAST_1)]
Hidden = Annotated[int | None, flag("--hidden", "FFN width (default 4 x d-model).", M, bounds=AT_LEAST_1)]
SeqLen = Annotated[int | None, flag("--seq-len", "Bytes per training window.", M, bounds=AT_LEAST_1)]
SigmaLo = Annotated[float | None, flag("--sigma-lo", "Bottom of the noise range.", M, bounds=POSITIVE)]
SigmaHi = Annotated[float | None, flag("--sigma-hi", "Top of the noise range.", M, bounds=POSITIVE)]
# the block's mechanics (issue 8): defaults = the measured best; `--context-input scaled_unit --z-in-init default
# --noise-embedding default --pred-input none --pred-output none --freeze-z-in none --trajectory-prob 0` = documented
ContextInput = Annotated[
    str | None, flag("--context-input", "Context bytes enter as own_table (the block's own table) or scaled_unit.", M)
]
ZInInit = Annotated[str | None, flag("--z-in-init", "Noise-path init W_z: zero or default.", M)]
NoiseEmbedding = Annotated[str | None, flag("--noise-embedding", "Noise-level embedding: off, default, zero_init.", M)]
PredInput = Annotated[
    str | None, flag("--pred-input", "feature: a block reads the previous step's hidden state; none.", M)
]
PredOutput = Annotated[
    str | None, flag("--pred-output", "add: a block corrects the previous step's estimate; none.", M)
]

# -- optimiser (TrainOptions) ------------------------------------------------------------------------
BatchSize = Annotated[int | None, flag("--batch-size", "Sequences per optimiser step.", T, bounds=AT_LEAST_1)]
LR = Annotated[float | None, flag("--lr", "AdamW peak learning rate.", T, bounds=POSITIVE)]
Seed = Annotated[int | None, flag("--seed", "Seed for init, data order and noise.", T, bounds=SEED)]
TrajectoryProb = Annotated[
    float | None,
    flag(
        "--trajectory-prob",
        "Chance a batch trains on the sampler's own trajectory (0 = documented noisy targets).",
        T,
        bounds=UNIT,
    ),
]
FreezeZIn = Annotated[
    str | None, flag("--freeze-z-in", "block0: block 0's noise path stays zero (it only sees noise); none.", T)
]
# model and training options are typed `X | None`: join and demo default them to None (= the swarm's, the demo's)

# -- data and training -----------------------------------------------------------------------------
Data = Annotated[
    Path | None,
    flag(
        "--data",
        "Training text: a file, a directory of files, or a directory with train.txt and eval.txt "
        "(default: the fetched WikiText-2 cache, else the Python standard library's sources; "
        "BLOCKTRAIN_TRAIN_DATA is a deprecated alias).",
        T,
        "BLOCKTRAIN_DATA",
    ),
]
EvalData = Annotated[
    Path | None,
    flag(
        "--eval-data",
        "Held-out text for from-noise CE (default: eval.txt beside the training data, else the training text's "
        "tail, held out of training).",
        T,
    ),
]
StepsPerRound = Annotated[
    int, flag("--steps-per-round", "H: local optimiser steps per block per round.", T, bounds=AT_LEAST_1)
]
Rounds = Annotated[int, flag("--rounds", "Rounds to run.", T, bounds=AT_LEAST_1)]  # train, demo, simulate
PeerRounds = Annotated[  # run, join
    int,
    flag(
        "--rounds",
        "Rounds to run, counted from where this run starts (a resumed --checkpoint-dir's round, else 0, the "
        "swarm's round counter; 0 = until stopped).",
        T,
        bounds=AT_LEAST_0,
    ),
]
EvalTokens = Annotated[int, flag("--eval-tokens", "Held-out bytes scored for from-noise CE.", T, bounds=AT_LEAST_1)]
DeviceOpt = Annotated[Device, flag("--device", "Torch device.", T, case_sensitive=False)]
Json = Annotated[bool, flag("--json", "Print one JSON object.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log every round and exchange to stderr.")]

# -- swarm -----------------------------------------------------------------------------------------
SwarmId = Annotated[
    str, flag("--swarm-id", "Swarm name; peers only talk to peers of the same swarm.", S, "BLOCKTRAIN_SWARM_ID")
]
SwarmPeers = Annotated[
    list[str] | None,
    flag(
        "--swarm",
        "DHT multiaddr (or HOST:PORT) of a running peer; repeat for several.",
        S,
        "BLOCKTRAIN_SWARM",
        show_default=False,
    ),
]
BlockOpt = Annotated[
    str,
    flag(
        "--block",
        "Block to train: a number, or 'auto' for the block with the least combined throughput.",
        S,
        "BLOCKTRAIN_BLOCK",
    ),
]
CheckpointDir = Annotated[
    Path | None,
    flag(
        "--checkpoint-dir",
        "Checkpoint here after every round and resume from it on restart.",
        S,
        "BLOCKTRAIN_CHECKPOINT_DIR",
    ),
]
CodecOpt = Annotated[
    Codec,
    flag(
        "--codec",
        "Delta codec on the wire (always followed by zstd; int8 uses error feedback).",
        S,
        case_sensitive=False,
    ),
]
PeerSeed = Annotated[
    int | None,
    flag(
        "--peer-seed",
        "Seed of this peer's data stream and noise (default: derived from the peer id, so peers differ).",
        S,
        "BLOCKTRAIN_PEER_SEED",
        bounds=SEED,
        show_default=False,
    ),
]
DeadlineMax = Annotated[
    float,
    flag(
        "--deadline-max",
        "Longest a round waits for peers' deltas, in seconds (the adaptive deadline stays below).",
        S,
        bounds=POSITIVE,
    ),
]
Overlap = Annotated[
    bool,
    flag(
        "--overlap/--no-overlap",
        "Keep training while a round's deltas are exchanged and merged (the merge lands one round late, corrected).",
        S,
    ),
]
OverlapSteps = Annotated[
    int,
    flag(
        "--overlap-steps",
        "With --overlap: at most this many steps before a merge lands (0 = the whole round).",
        S,
        bounds=AT_LEAST_0,
    ),
]
GroupSize = Annotated[
    int,
    flag(
        "--group-size",
        "Average in groups of at most this many peers each round, a new grid of groups every round "
        "(0 = every peer with every peer).",
        S,
        bounds=Bounds(2, or_zero=True),
    ),
]
GroupFullEvery = Annotated[
    int,
    flag(
        "--group-full-every",
        "Every this many rounds, one round of all peers together (re-anchors; 0 = never).",
        S,
        bounds=AT_LEAST_0,
    ),
]
EvalEvery = Annotated[
    int,
    flag(
        "--eval-every",
        "Every this many rounds, pull the other blocks from peers and measure the from-noise CE shown by "
        "`status` (0 = never).",
        S,
        bounds=AT_LEAST_0,
    ),
]
MinPeers = Annotated[
    int,
    flag(
        "--min-peers",
        "Wait before the first round until the swarm has this many peers (self included).",
        S,
        bounds=AT_LEAST_0,
    ),
]
AdoptTolerance = Annotated[
    float,
    flag(
        "--adopt-tolerance",
        "Refuse to adopt a peer's state that scores worse on this peer's held-out sample than what it holds by "
        "more than this many nats, whatever number of records backs it (1e9 = no check).",
        S,
        bounds=AT_LEAST_0,
    ),
]
MergeCheckTolerance = Annotated[
    float,
    flag(
        "--merge-check-tolerance",
        "A round's merge that scores worse on the held-out sample than this peer's own delta alone by more than "
        "this many nats (plus half of its own progress) falls back to the deltas that pass one by one (1e9 = no "
        "check).",
        S,
        bounds=AT_LEAST_0,
    ),
]
ProbationRounds = Annotated[
    int,
    flag(
        "--probation-rounds",
        "Public swarm: a new identity's deltas merge only when they pass the held-out check alone, and its "
        "records do not count towards a re-sync, until it passed this many rounds (0 = no probation).",
        S,
        bounds=AT_LEAST_0,
    ),
]
IdentitiesPerRange = Annotated[
    int,
    flag(
        "--identities-per-range",
        "Public swarm: identities whose records name one IPv4 /24 (IPv6 /48) that count; the youngest beyond "
        "are treated as on probation (0 = no cap).",
        S,
        bounds=AT_LEAST_0,
    ),
]
PowBits = Annotated[
    int,
    flag(
        "--pow-bits",
        "Proof of work every peer's key must carry, in leading zero bits of a hash (a swarm setting: every peer "
        "must use the same; 20 bits take about a second once at start; 0 = none).",
        S,
        bounds=Bounds(0, 40),
    ),
]
KeepTrying = Annotated[
    bool,
    flag(
        "--keep-trying",
        "When every exchange of a few rounds fails for a known cause (another swarm key, model config or swarm "
        "id), warn and go on instead of stopping with exit code 3.",
        S,
    ),
]
OuterOpt = Annotated[
    str,
    flag(
        "--outer",
        "Outer optimizer on each round's merged delta: nesterov (DiLoCo's Nesterov momentum) or none (plain "
        "averaging). Every peer of a swarm must use the same outer settings.",
        S,
    ),
]
OuterLr = Annotated[
    float,
    flag("--outer-lr", "Learning rate of the outer optimizer (1 with momentum 0 = none).", S, bounds=POSITIVE),
]
OuterMomentum = Annotated[
    float,
    flag(
        "--outer-momentum", "Nesterov momentum of the outer optimizer, in [0, 1).", S, bounds=Bounds(0, 1, hi_open=True)
    ),
]

# -- network ---------------------------------------------------------------------------------------
Listen = Annotated[
    str, flag("--listen", "HOST:PORT of this peer's gRPC server (port 0 = any free port).", N, "BLOCKTRAIN_LISTEN")
]
ClientMode = Annotated[
    bool, flag("--client-mode", "Accept no inbound connections (behind NAT): dial out for exchanges only.", N)
]
Static = Annotated[
    bool, flag("--static", "PEERS are HOST:PORT gRPC addresses of a fixed peer list instead of DHT multiaddrs.", N)
]
DhtHost = Annotated[
    str,
    flag(
        "--dht-host",
        "Interface the DHT listens on (default: the --listen host's: 0.0.0.0 with 0.0.0.0, 127.0.0.1 with loopback, "
        "else that address).",
        N,
        "BLOCKTRAIN_DHT_HOST",
        show_default=False,
    ),
]
DhtPort = Annotated[
    int,
    flag(
        "--dht-port",
        "TCP port of the DHT (0 = any free port; fix it, with --checkpoint-dir, so the multiaddr survives restarts).",
        N,
        "BLOCKTRAIN_DHT_PORT",
        bounds=PORT,
    ),
]
Announce = Annotated[
    str | None,
    flag(
        "--announce",
        "HOST[:PORT] other peers dial for gRPC, also the host the DHT announces (default: the --listen host; "
        "with 0.0.0.0, this host's outgoing interface address).",
        N,
        "BLOCKTRAIN_ANNOUNCE",
        show_default=False,
    ),
]
MetricsPort = Annotated[
    int | None,
    flag(
        "--metrics-port",
        "Serve Prometheus metrics at http://LISTEN-HOST:PORT/metrics (0 = any free port, printed at start; "
        "default: off).",
        N,
        "BLOCKTRAIN_METRICS_PORT",
        bounds=PORT,
        show_default=False,
    ),
]
SEC = "Security"
SwarmKeyOpt = Annotated[
    Path | None,
    flag(
        "--swarm-key",
        "Private swarm: the key FILE every RPC must prove (make one with `blocktrain keygen swarm-key FILE`; "
        "default: the file BLOCKTRAIN_SWARM_KEY names, else a public swarm).",
        SEC,
        show_default=False,
    ),
]
IdentityOpt = Annotated[
    Path | None,
    flag(
        "--identity",
        "This peer's Ed25519 key FILE, created when missing (default: identity.key in --checkpoint-dir, else a new "
        "identity per run).",
        SEC,
        show_default=False,
    ),
]
TlsCert = Annotated[
    Path | None, flag("--tls-cert", "Serve gRPC over TLS with this PEM certificate (pinned in the signed record).", SEC)
]
TlsKey = Annotated[Path | None, flag("--tls-key", "... and this PEM private key.", SEC)]
TimeoutS = Annotated[
    float,
    flag(
        "--timeout-s",
        "Seconds to wait: for each peer (status, dashboard), for one block step before failing over to a replica "
        "(score, generate), for the whole swarm to finish (demo).",
        N,
        bounds=POSITIVE,
    ),
]
TimeoutAlias = Annotated[  # the older spelling of --timeout-s
    float | None, typer.Option("--timeout", hidden=True, callback=check_bounds("--timeout", POSITIVE))
]
DashboardHost = Annotated[
    str, flag("--host", "Interface the dashboard's web page listens on.", N, "BLOCKTRAIN_DASHBOARD_HOST")
]
DashboardPort = Annotated[
    int,
    flag(
        "--port",
        "TCP port of the dashboard's web page (0 = any free port).",
        N,
        "BLOCKTRAIN_DASHBOARD_PORT",
        bounds=PORT,
    ),
]


# -- inference -------------------------------------------------------------------------------------
Checkpoint = Annotated[
    Path | None, flag("--checkpoint", "Run locally from this checkpoint directory instead of a swarm.")
]
Steps = Annotated[int | None, flag("--steps", "Sampler steps (default: one per block).", bounds=AT_LEAST_1)]
VerifyShare = Annotated[
    float,
    flag(
        "--verify-share",
        "Swarm: chance a hop is recomputed on a second replica of its block and compared (each replica's first "
        "answer always is; 0 = range checks only).",
        bounds=UNIT,
    ),
]


# -- simulator (blocktrain simulate) ---------------------------------------------------------------
SIM = "Simulated network"
RegimeOpt = Annotated[
    str,
    flag(
        "--regime",
        "Network regime: lockstep, async-mild, wan-tight, wan-mid, wan-loose, edge-mid, bad-edge, bad-edge-loose, "
        "or custom (the network flags below, starting from lockstep's).",
        SIM,
    ),
]
Workers = Annotated[int, flag("--workers", "K: virtual workers (replicas) per block.", SIM, bounds=AT_LEAST_1)]
PolicyOpt = Annotated[
    str | None,
    flag(
        "--policy",
        "Deadline policy: lockstep, fixed (the regime's deadline), adaptive (the daemon's), quantile "
        "(a participation target). Default: the regime's own (fixed, or lockstep when it has no deadline).",
        SIM,
        show_default=False,
    ),
]
TargetParticipation = Annotated[
    float,
    flag(
        "--target-participation",
        "The quantile policy's target: fraction of arrivals to wait for.",
        SIM,
        bounds=Bounds(0, 1, lo_open=True),
    ),
]
ComputeS = Annotated[
    float | None, flag("--compute-s", "custom: median seconds per local step.", SIM, bounds=AT_LEAST_0)
]
ComputeSigma = Annotated[
    float | None, flag("--compute-sigma", "custom: log-std of the step time.", SIM, bounds=AT_LEAST_0)
]
LatencyS = Annotated[
    float | None, flag("--latency-s", "custom: median one-way latency, seconds.", SIM, bounds=AT_LEAST_0)
]
LatencySigma = Annotated[
    float | None, flag("--latency-sigma", "custom: log-std of the latency.", SIM, bounds=AT_LEAST_0)
]
BandwidthKBps = Annotated[
    float | None, flag("--bandwidth-kbps", "custom: median upload bandwidth, kB/s.", SIM, bounds=POSITIVE)
]
BandwidthSigma = Annotated[
    float | None, flag("--bandwidth-sigma", "custom: log-std of the bandwidth.", SIM, bounds=AT_LEAST_0)
]
Dropout = Annotated[float | None, flag("--dropout", "custom: chance a worker drops out of a round.", SIM, bounds=UNIT)]
DeadlineX = Annotated[
    float | None,
    flag(
        "--deadline",
        "custom: fixed deadline as a multiple of a round's median compute time (H x --compute-s).",
        SIM,
        bounds=POSITIVE,
    ),
]


# -- groups --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelOptions(OptionGroup):
    """The model flags (run, train, model-info; optional() in join and demo: None = the base config's)."""

    DEFAULTS: ClassVar[Mapping[str, Any]] = {**MODEL.to_dict(), "hidden": None}  # no --hidden: 4 x --d-model
    blocks: Blocks
    layers_per_block: LayersPerBlock
    d_model: DModel
    n_heads: NHeads
    hidden: Hidden
    seq_len: SeqLen
    sigma_lo: SigmaLo
    sigma_hi: SigmaHi
    context_input: ContextInput
    z_in_init: ZInInit
    noise_embedding: NoiseEmbedding
    pred_input: PredInput
    pred_output: PredOutput

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
    batch_size: BatchSize
    lr: LR
    seed: Seed
    trajectory_prob: TrajectoryProb
    freeze_z_in: FreezeZIn

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
        "group_size": GOSSIP.group_size,
        "group_full_every": GOSSIP.group_full_every,
        "keep_trying": DAEMON.keep_trying,
        "adopt_tolerance": GOSSIP.adopt_tolerance,
        "merge_check_tolerance": GOSSIP.merge_check_tolerance,
        "probation_rounds": GOSSIP.probation_rounds,
        "identities_per_range": GOSSIP.identities_per_range,
        "pow_bits": GOSSIP.pow_bits,
    }
    data: Data
    device: DeviceOpt
    steps_per_round: StepsPerRound
    rounds: PeerRounds
    eval_data: EvalData
    block: BlockOpt
    checkpoint_dir: CheckpointDir
    swarm_id: SwarmId
    codec: CodecOpt
    deadline_max: DeadlineMax
    peer_seed: PeerSeed
    min_peers: MinPeers
    eval_every: EvalEvery
    listen: Listen
    client_mode: ClientMode
    static: Static
    dht_host: DhtHost
    dht_port: DhtPort
    announce: Announce
    metrics_port: MetricsPort
    swarm_key: SwarmKeyOpt
    identity: IdentityOpt
    tls_cert: TlsCert
    tls_key: TlsKey
    outer: OuterOpt
    outer_lr: OuterLr
    outer_momentum: OuterMomentum
    overlap: Overlap
    overlap_steps: OverlapSteps
    group_size: GroupSize
    group_full_every: GroupFullEvery
    keep_trying: KeepTrying
    adopt_tolerance: AdoptTolerance
    merge_check_tolerance: MergeCheckTolerance
    probation_rounds: ProbationRounds
    identities_per_range: IdentitiesPerRange
    pow_bits: PowBits

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
            codec=self.codec.value,
            deadline_max_s=self.deadline_max,
            outer=self.outer,
            outer_lr=self.outer_lr,
            outer_momentum=self.outer_momentum,
            overlap=self.overlap,
            overlap_steps=self.overlap_steps,
            group_size=self.group_size,
            group_full_every=self.group_full_every,
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
        )
        return train.config(base), gossip, net

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
    swarm: SwarmPeers
    checkpoint: Checkpoint
    swarm_id: SwarmId
    timeout_s: TimeoutS
    device: DeviceOpt
    verify_share: VerifyShare

    @property
    def label(self) -> str:
        return f"swarm {self.swarm_id}" if self.swarm else str(self.checkpoint)


@dataclass(frozen=True)
class NetworkSimOptions(OptionGroup):
    """`blocktrain simulate --regime custom`: the network distributions (None = lockstep preset's value)."""

    compute_s: ComputeS
    compute_sigma: ComputeSigma
    latency_s: LatencyS
    latency_sigma: LatencySigma
    bandwidth_kbps: BandwidthKBps
    bandwidth_sigma: BandwidthSigma
    dropout: Dropout
    deadline: DeadlineX

    def regime(self, name: str):
        """The named preset, or with name custom the lockstep preset changed by the flags given (ConfigError)."""
        from swarmd.sim.regimes import PRESETS, custom_regime, regime_named

        given = self.given()
        if name.strip().lower() != "custom":
            preset = regime_named(name)
            if given:
                flags = ", ".join("--" + k.replace("_", "-") for k in given)
                raise ConfigError(f"{flags} need --regime custom (regime {preset.name} is a preset)")
            return preset
        base = PRESETS["lockstep"]
        values: dict[str, Any] = {
            "compute_s": base.compute_s.median,
            "compute_sigma": base.compute_s.sigma,
            "latency_s": base.latency_s.median,
            "latency_sigma": base.latency_s.sigma,
            "bandwidth_kBps": base.bandwidth_Bps.median / 1e3,
            "bandwidth_sigma": base.bandwidth_Bps.sigma,
            "dropout": base.dropout,
            "deadline": base.deadline,
        }
        values.update({("bandwidth_kBps" if k == "bandwidth_kbps" else k): v for k, v in given.items()})
        return custom_regime(**values)


def timeout_s(timeout_s: float, alias: float | None) -> float:
    """--timeout-s, or the value given with its older spelling --timeout."""
    return timeout_s if alias is None else alias
