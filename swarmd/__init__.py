"""swarmd: the BlockTrain swarm daemon and the model it trains.

Subpackages, top to bottom (a package imports only those below it; import-linter contracts in
pyproject.toml hold the layers and forbid import cycles at every level):
  tools/       programs built on the node: LocalSwarm, the demo, the dashboard, swarm surveys
  node/        one peer: config, credentials, start-up, presence in discovery, checkpoints,
               measurements, the RPC adapter, and the Daemon, the one module that wires it all
  sim/         the virtual-clock network simulator over the real training, codecs and merge
  serve/       inference over the blocks: local sweeps, the Forward block step, the swarm client
  averaging/   one averaging round among a part's peers and the replica state it moves: codecs,
               the round's exchange, deadline, robust merge, outer step, groups, state agreement
  membership/  who is in the swarm and whom to believe: identities, signed records, trust checks,
               DHT and static discovery, addresses, the quorum rules
  transport/   the only grpc importer: thin servicer, PeerClient, payload framing (no torch)
  core/        the model and its training, no networking: config, model, train, data, evaluate,
               checkpoints
Shared leaves: errors.py (the one error hierarchy, each class with its gRPC status), protocol.py
(PROTOCOL, the Codec / PayloadKind / PeerState enums mirroring the proto's, the SwarmConfig
message), backoff.py (the one ban policy for failing peers), metrics.py (a peer's counters and
round history), wire.py (tensor bytes <-> swarmd.v1.Tensor with size guards), v1/ (generated stubs
of proto/swarmd/v1/swarm.proto, never edited by hand). Each subpackage's __init__ maps its modules.
"""

__version__ = "0.1.0"
