"""The asynchronous network simulator: real training, codec, deadline and merge under a virtual clock.

regimes.py   Dist, Regime, the named presets (lockstep ... bad edge loose), `custom`, RoundDraw (sampling)
policies.py  deadline policies: lockstep, fixed, adaptive (the daemon's DeadlinePolicy), quantile
engine.py    SimConfig, Simulator (the run loop); simulate()
workers.py   Worker, PredecessorHandoff (predecessor pulls as the daemon's codecs send them), train_in_chunks
results.py   RoundRecord, SimResult: what a run records and the figures read off it
protocol.py  ProtocolConfig, simulate(): group averaging's grouping, codec and merge among 1,000s of virtual
             peers, no training (benchmarks/protocol_scale.py)
Imports swarmd.core and the pure parts of swarmd.averaging (state, delta, the deadline policy and the merge);
never grpc, hivemind, the transport's servers or the daemon. `blocktrain simulate` is its CLI.
"""
