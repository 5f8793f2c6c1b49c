"""Every `blocktrain` flag, declared once, as an Annotated alias a command or an option group is typed with.

Each flag's default comes from the config dataclass it fills (MODEL, TRAIN, GOSSIP, NET, DAEMON below
are the dataclass defaults), never a repeated literal. Flags that travel together are fields of one
option group (cli.options: ModelOptions, TrainOptions, PeerOptions, SourceOptions); a flag of one command
only stays in its signature, typed with the alias (the simulator's network flags are in cli.simulate).
Every numeric flag declares the values it accepts (`bounds=`, a cli.bounds.Bounds), refused at parse time.
Options are grouped in `--help` by panel: Model, Training, Swarm, Network, Server limits, Security. Imports no torch.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.bounds import AT_LEAST_0, AT_LEAST_1, PORT, POSITIVE, SEED, UNIT, Bounds, check_bounds
from swarmd.averaging.config import GossipConfig
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.node.config import DaemonConfig, NetConfig
from swarmd.protocol import Codec

MODEL, TRAIN, GOSSIP, NET, DAEMON = ModelConfig(), TrainConfig(), GossipConfig(), NetConfig(), DaemonConfig()
M, T, S, N = "Model", "Training", "Swarm", "Network"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


DEFAULT_DEVICE, DEFAULT_CODEC = Device(DAEMON.device), Codec(GOSSIP.codec)


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
# the block's mechanics: defaults = the measured best; `--context-input scaled_unit --z-in-init default
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
HandoffLoss = Annotated[
    str | None,
    flag(
        "--handoff-loss",
        "prev_byte: each block's final feature also predicts the previous byte (training only); prev_skip: and the "
        "byte after the next; none.",
        M,
    ),
]
PredInInit = Annotated[
    str | None,
    flag(
        "--pred-in-init",
        "Start of a block's message input: identity (its layers start on the predecessor's state) or zero.",
        M,
    ),
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
    str | None,
    flag("--freeze-z-in", "block0: block 0's noise path stays zero (it only sees noise); all: every block's; none.", T),
]
ReplicaAdam = Annotated[
    bool | None,
    flag(
        "--replica-adam/--no-replica-adam",
        "AdamW steps as if it saw the mean gradient of the block's replicas that the last merge averaged "
        "(ReplicaAdamW; a peer alone trains exactly as with AdamW).",
        T,
    ),
]
Pipeline = Annotated[
    bool | None,
    flag(
        "--pipeline/--no-pipeline",
        "Block b starts training b rounds after block 0 (the swarm, or `train`, runs B - 1 rounds more), so each "
        "round of a later block runs against its predecessors' ended round. `train` without --pipeline or "
        "--no-pipeline trains one block after the other (--pipeline-stagger = --rounds).",
        T,
    ),
]
PipelineStagger = Annotated[
    int | None,
    flag(
        "--pipeline-stagger",
        "With --pipeline: rounds between two consecutive blocks' starts (every peer runs (B - 1) x this many "
        "rounds more; --rounds = one block after the other).",
        T,
        bounds=AT_LEAST_1,
    ),
]
Grow = Annotated[
    bool | None,
    flag(
        "--grow/--no-grow",
        "With --pipeline: block b opens at round b x --pipeline-stagger + 1 (its growth phase, warm-started from "
        "block b - 1) and then trains to the run's end, so no peer runs extra rounds; an open-ended `run` / `join` "
        "grows the same way.",
        T,
    ),
]
OpenGain = Annotated[  # run, join
    float,
    flag(
        "--open-gain",
        "With --pipeline --grow and --block auto peers: open the next block once the newest open block's held-out "
        "CE gained less than this many nats a round for 2 rounds in a row, as the peers' signed records report it, "
        "instead of every --pipeline-stagger rounds (0 = the rounds).",
        T,
        bounds=AT_LEAST_0,
    ),
]
BlockInit = Annotated[
    str | None,
    flag(
        "--block-init",
        "How a later block starts its turn: fresh (its seeded init) or predecessor (block b - 1's weights as they "
        "stand then, output layer at 0).",
        T,
    ),
]
HandoffWeight = Annotated[
    float | None,
    flag("--handoff-weight", "Weight of --handoff-loss's term beside the block's CE.", T, bounds=AT_LEAST_0),
]
PredecessorPulls = Annotated[
    int | None,
    flag(
        "--predecessor-pulls",
        "Times per round a swarm peer refreshes the earlier blocks trajectory training runs: at round start, "
        "then their working weights every steps-per-round / N steps (default 1: round start only; it measured "
        "fastest to a given CE).",
        T,
        bounds=AT_LEAST_1,
    ),
]
PrefetchPulls = Annotated[
    bool | None,
    flag(
        "--prefetch-pulls/--no-prefetch-pulls",
        "Pull the predecessors' working weights while the steps go on (each pull starts halfway through the "
        "steps before the ones it is for) instead of stopping the steps until the pull is in.",
        T,
    ),
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
BalanceSteps = Annotated[
    float,
    flag(
        "--balance-steps",
        "A peer whose steps are faster than the slowest peer's takes as many as fit in the slowest one's round, "
        "at most this x --steps-per-round (1 = the same steps every round).",
        S,
        bounds=Bounds(lo=1.0),
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
TableGroupSize = Annotated[
    int,
    flag(
        "--table-group-size",
        "The byte table's groups: at most this many peers (0 = every peer with every peer, whatever "
        "--group-size says; the table is the smallest part, and groups of mixed blocks drift apart).",
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
PullCodec = Annotated[
    str,
    flag(
        "--pull-codec",
        "How this peer pulls the earlier blocks trajectory training runs frozen: fp32 (exact; mid-round ones fp16), "
        "int8 (per-row int8 + zstd, about a fifth of the bytes), int8-delta (mid-round ones as int8 deltas against "
        "the round-start pull: a seventh) or int8-chain (round-start ones, after the first, as int8 steps along a "
        "chain of states both sides hold). Adopted and re-synced state is always fp32.",
        S,
    ),
]
GroupLayout = Annotated[
    str,
    flag(
        "--group-layout",
        "Who averages with whom when --group-size splits the swarm: grid (a new grid of groups every round), "
        "balanced (a new order every round cut into the fewest groups, of equal size) or orthogonal (balanced "
        "groups in pairs of rounds, the second mixing the first's); two-phase (each round's groups also averaged "
        "across in the same round, swarmd.averaging.phase2: replicas end each round on the exact count-weighted "
        "mean when every group's value reached every peer). Every peer of a swarm must use "
        "the same layout.",
        S,
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
# -- server limits: what one caller may hold on this peer's gRPC server (NetConfig; docs/operations.md) -------------
LIM = "Server limits"
MaxStreams = Annotated[
    int,
    flag(
        "--max-streams",
        "Payload streams (exchanges, pulls) served at once, all callers (0 = no cap).",
        LIM,
        bounds=AT_LEAST_0,
    ),
]
MaxStreamsPerHost = Annotated[
    int,
    flag(
        "--max-streams-per-host",
        "Payload streams served at once to one caller host, all its identities (0 = no cap).",
        LIM,
        bounds=AT_LEAST_0,
    ),
]
MaxStreamsPerIdentity = Annotated[
    int,
    flag(
        "--max-streams-per-identity",
        "Payload streams served at once to one caller identity (0 = no cap).",
        LIM,
        bounds=AT_LEAST_0,
    ),
]
RequestRate = Annotated[
    float,
    flag(
        "--request-rate",
        "GetStatus, GetConfig and exchanges per second per caller identity (0 = unlimited).",
        LIM,
        bounds=AT_LEAST_0,
    ),
]
RequestBurst = Annotated[
    float, flag("--request-burst", "The --request-rate bucket: bursts of up to this many.", LIM, bounds=AT_LEAST_1)
]
PullRate = Annotated[
    float,
    flag(
        "--pull-rate",
        "State pulls per second per caller identity (a compact predecessor pull counts a quarter; 0 = unlimited).",
        LIM,
        bounds=AT_LEAST_0,
    ),
]
PullBurst = Annotated[
    float, flag("--pull-burst", "The --pull-rate bucket: bursts of up to this many.", LIM, bounds=AT_LEAST_1)
]
HostShares = Annotated[
    float,
    flag(
        "--host-shares",
        "A caller host's request and pull ceiling, in identities' budgets (several daemons may share a host).",
        LIM,
        bounds=AT_LEAST_1,
    ),
]
ForwardRate = Annotated[
    float,
    flag(
        "--forward-rate",
        "Forward request units (one per started 64 KiB) per second per caller identity (0 = unlimited).",
        LIM,
        bounds=AT_LEAST_0,
    ),
]
ForwardBurst = Annotated[
    float,
    flag("--forward-burst", "The --forward-rate bucket: bursts of up to this many units.", LIM, bounds=AT_LEAST_1),
]
ForwardHostShares = Annotated[
    float,
    flag("--forward-host-shares", "A caller host's Forward ceiling, in identities' budgets.", LIM, bounds=AT_LEAST_1),
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


def timeout_s(timeout_s: float, alias: float | None) -> float:
    """--timeout-s, or the value given with its older spelling --timeout."""
    return timeout_s if alias is None else alias
