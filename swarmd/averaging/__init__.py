"""One averaging round among the peers of a part (a block or the byte table), and the replica it moves.

config.py     GossipConfig: codec, deadlines, merge rule, outer optimizer, overlap, groups
state.py      BlockState: base + live weights and AdamW under one lock, deltas, merges, adoption, hashes
predecessors.py  TrajectoryPredecessors: the frozen predecessor blocks BlockState trains behind
sketch.py     count-sketch of weights and the distance between two sketches (no torch needed to compare)
delta.py      delta codecs (fp32/fp16/bf16/int8 + zstd), error feedback, payload decoding and size bounds
robust.py     the robust merge: norm clip, coordinate-wise trimmed mean, outlier check, norm bound
drift.py      DriftTracker: peers whose deviations from the merge keep pointing one way across rounds
outer.py      the outer optimizer (DiLoCo's Nesterov) on the merged delta
delayed.py    delayed averaging: land a merge one round late, keeping the steps taken meanwhile
groups.py     group averaging: the round's groups (balanced or grid), anchors and offsets
allreduce.py  butterfly all-reduce over signed chunks (the large-swarm alternative to all-to-all)
rejoin.py     the pure rules of a peer that is isolated: fresh majority, reconciliation, stability
adoption.py   verified adoption: which pulled candidate states pass the held-out check, refusals remembered
context.py    PeerContext: one peer's identity, replica, known records, bans, transport; payload rules
deadline.py   DeadlinePolicy: when a round stops waiting (participation target, adaptive EMA rule)
merge.py      the round's merge rule over the accepted deltas, and landing it (anchors, overlap)
round.py      Round (one open round's payloads, inbox and collection wait) and MergeReport
exchange.py   Exchange: the round protocol (publish, dial/answer, collect, merge); the round's groups
intake.py     a delta's way in: judge it (round, sender, group, base, decode, norm), stash or reject it
pulls.py      StatePulls: signed states pulled from peers (validated, not adopted) and the states served
agreement.py  Agreement: state agreement (re-sync to a quorum's reference, rejoin, verified adoption)
gossip.py     Gossip: one peer's averaging, the exchange and the agreement over one PeerContext
Depends on core and membership; never on the node, the tools or serving.
"""
