"""swarmd: the BlockTrain swarm daemon and the model it trains.

Subpackages (dependencies point down this list only; import-linter contracts in pyproject.toml
hold them):
  swarm/      one peer of the swarm: config, BlockState, delta codecs, gossip rounds, discovery,
              metrics, survey, and the Daemon, the one module that wires swarm + serve + transport
  serve/      inference over the blocks: local sweeps, the Forward block step, the swarm client
  transport/  the only grpc importer: thin servicer, PeerClient, payload framing (no torch)
  core/       the model and its training, no networking: config, model, train, data, evaluate,
              checkpoints
Shared leaves: errors.py (the one error hierarchy, each class with its gRPC status), protocol.py
(PROTOCOL, the Codec / PayloadKind / PeerState enums mirroring the proto's, the SwarmConfig
message), backoff.py (the one ban policy for failing peers), wire.py (tensor bytes <->
swarmd.v1.Tensor with size guards), v1/ (generated stubs of proto/swarmd/v1/swarm.proto, never
edited by hand). Each subpackage's __init__ lists its modules.
"""

__version__ = "0.1.0"
