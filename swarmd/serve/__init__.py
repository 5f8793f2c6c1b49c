"""Inference over the blocks: locally, as a serving peer, and as a client of the swarm.

inference.py   local one-sweep scoring and cached byte-by-byte generation
serving.py     BlockServing: the Forward RPC's block step with per-session KV caches
remote.py      swarm client: sessions, failover, verified sweeps (redone without a dropped peer)
routing.py     BlockRouter: one replica per block by latency and load; bans and dropped (lying) peers
verify.py      range checks from the sampler math, answer divergence, tolerances, majority, VerifyPolicy/Stats
crosscheck.py  second and third opinions on a hop from other replicas of its block
tiebreak.py    two replicas of one base disagree, no third: recompute the hop from their pulled, verified weights
"""
