"""Inference over the blocks: locally, as a serving peer, and as a client of the swarm.

inference.py   local one-sweep scoring and cached byte-by-byte generation
serving.py     BlockServing: the Forward RPC's block step with per-session KV caches
remote.py      swarm client: block routing by latency, sessions, failover
"""
