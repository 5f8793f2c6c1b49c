"""Who is in the swarm and whom to believe: identities, signed records, discovery and the quorum rules.

identity.py   Ed25519 peer identities: peer ids, signing, verifying, the identity file
records.py    PeerRecord (what a peer announces), DHT block keys, block choice from the records
balance.py    pure rule over the records: which --block auto peer moves where, so no block goes unserved
trust.py      signing and checking records and payloads (signature, expiry, DHT key)
addresses.py  announce addresses, host:port parsing, peer-address checks
discovery.py  the Discovery protocol: in-memory and static discovery, connect_discovery (the CLI clients')
dht.py        HivemindDiscovery: discovery over a hivemind DHT, its record validator (imports hivemind)
dht_process.py  the DHT's forked process: ends with its parent, p2pd and its sockets, its in-process calls
quorum.py     pure rules over signed records: quorum, agreeing, reference, diverged majority, round backing
sybil.py      pure rules that make identities cost: probation (passed checks before counting), a cap per /24 or /48
pow.py        proof of work on a peer's public key (difficulty a swarm setting, 0 = off): solve and check
Depends on core-free leaves only (errors, transport.framing for payload headers); never on averaging or the node.
"""
