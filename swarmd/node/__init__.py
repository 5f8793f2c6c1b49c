"""One peer of the swarm: its configuration, the RPC adapter, measurements, and the Daemon that wires them.

config.py         NetConfig, DaemonConfig (GossipConfig is swarmd.averaging.config), peer_train_config
service.py        SwarmService: the transport's SwarmHandler (status, config, pull, exchange, forward)
peers.py          reads from the other peers: their merged blocks, the assembled model's CE, consensus
overlap.py        delayed averaging's round loop (training goes on while a round is collected)
http_endpoint.py  the thread-served HTTP endpoint the metrics server and the dashboard share
prometheus.py     the Prometheus endpoint (--metrics-port) over swarmd.metrics.Metrics
daemon.py         Daemon: wires membership + averaging + serve + transport, owns the tasks and the training thread
runner.py         one daemon in the foreground: signals, the stdout lines (`blocktrain run`, `python -m swarmd`)
The only layer that imports serving (daemon.py); the tools build on it.
"""
