"""One peer of the swarm: configuration, state, averaging, discovery and the daemon that wires them.

peer_config.py DaemonConfig, GossipConfig, NetConfig
state.py       BlockState: weights + AdamW under one lock, hashes, save/restore
sketch.py      count-sketch of weights and the distance between two sketches (no torch needed)
delta.py       delta codecs (fp32/fp16/bf16/int8 + zstd), error feedback, payload validation
discovery.py   hivemind DHT / static peer discovery, block choice
gossip.py      one averaging round: exchange, validate, deadline, merge, re-sync
metrics.py     throughput EMA, byte counters, participation, round history
survey.py      status of one peer or a whole swarm; config fetch for `join`
peers.py       reads from the other peers: their merged blocks, the assembled model's CE, consensus
service.py     SwarmService: the transport's SwarmHandler (status, config, pull, exchange, forward)
daemon.py      Daemon: wires swarm + serve + transport, owns the asyncio tasks and the training thread
runner.py      one daemon in the foreground: signals, the stdout lines (`blocktrain run`, `python -m swarmd`)
launch.py      LocalSwarm: N daemon processes on loopback (demo, benchmarks, tests)
demo.py        plan_demo / run_demo: a LocalSwarm, its progress as events, the model it keeps (`blocktrain demo`)
addresses.py   announce addresses, host:port parsing, peer-address checks
prometheus.py  the Prometheus endpoint (--metrics-port) over Metrics
dashboard.py   `blocktrain dashboard`: the live web swarm map and its /api/swarm JSON
http_endpoint.py  the thread-served HTTP endpoint both of those share (url, stop)
"""
