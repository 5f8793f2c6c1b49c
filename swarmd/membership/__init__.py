"""Who is in the swarm and whom to believe: identities, signed records, discovery and the quorum rules.

identity.py   Ed25519 peer identities: peer ids, signing, verifying, the identity file
records.py    PeerRecord (what a peer announces), DHT block keys, block choice from the records
trust.py      signing and checking records and payloads (signature, expiry, DHT key)
addresses.py  announce addresses, host:port parsing, peer-address checks
discovery.py  the Discovery protocol: in-memory, static and hivemind-DHT discovery, the DHT process
quorum.py     pure rules over signed records: quorum, agreeing, reference, diverged majority, round backing
Depends on core-free leaves only (errors, transport.framing for payload headers); never on averaging or the node.
"""
