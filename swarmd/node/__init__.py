"""One peer of the swarm: its configuration, the RPC adapter, measurements, and the Daemon that wires them.

config.py         NetConfig, DaemonConfig (GossipConfig is swarmd.averaging.config), peer_train_config
service.py        SwarmService: the transport's SwarmHandler (status, config, pull, exchange, forward, dial-back)
dialback.py       DialBacks: answering another peer's dial-back request (its own host only, a checked GetStatus)
reachability.py   the check at start: known peers asked to dial this peer back, the one line it logs
credentials.py    where a peer's credentials come from: identity, libp2p key file, swarm key, TLS and its pin
startup.py        a starting peer's decisions: address plan, which discovery it opens, which block (BlockState),
                  its gRPC server and first record; the fresh BlockState of a block a peer moves to (new_state)
presence.py       Presence: the running peer in discovery (announce, lookups, the announce loop, min_peers wait)
peers.py          pulls from the other peers: their merged blocks, trajectory training's predecessors
measure.py        the round's measurements: consensus distance to replicas, the assembled model's CE
checkpoints.py    CheckpointWriter: the block a checkpoint dir resumes, writes with the progress counters, failures
                  -> gRPC health
training.py       a round's local steps (the block's turn, warm start, predecessor refreshes), the pipeline window
rounds.py         RoundPeer (what a round driver drives of the daemon), PlainRounds, and the round loop of a run
overlap.py        delayed averaging's round loop (training goes on while a round is collected), over a RoundPeer
http_endpoint.py  the thread-served HTTP endpoint the metrics server and the dashboard share
prometheus.py     the Prometheus endpoint (--metrics-port) over swarmd.metrics.Metrics
diagnosis.py      why nothing merges (another swarm key, model config, swarm id): one line, stop or warn
rebalance.py      when a --block auto peer moves block (confirmed twice once trained) and the state it takes
daemon.py         Daemon: wires membership + averaging + serve + transport, owns the tasks and the training thread
runner.py         one daemon in the foreground: signals, the stdout lines (`blocktrain run`, `python -m swarmd`)
The only layer that imports serving (daemon.py); the tools build on it.
"""
