"""Swarm survey: status of one peer or of every peer a discovery knows, as plain dicts.

Owns what `blocktrain status` shows: per peer (id, block, state, round, local steps, samples/s,
training CE, last held-out CE, bytes, participation, uptime, address, reachable: the peer's own dial-back check
at start, swarmd.node.reachability, or False for a peer this survey could not dial), per block (peers,
combined samples/s, consensus distance estimated from the peers' count-sketches) and the swarm's max
consensus distance.
Client-mode peers cannot be dialled; they appear from their DHT record only. Calls peers through
PeerClient with a timeout each; never blocks the loop.
"""

from __future__ import annotations

import asyncio
import json
import math

from swarmd.averaging.sketch import sketch_distance
from swarmd.core.config import ModelConfig
from swarmd.errors import PeerUnavailable, SwarmdError
from swarmd.membership.discovery import Discovery, connect_discovery, is_multiaddr
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import pin_tls
from swarmd.protocol import ask_model_config, peer_state_name
from swarmd.transport import PeerClient
from swarmd.v1 import swarm_pb2 as pb


def peer_row(st: pb.PeerStatus) -> dict:
    return {
        "peer_id": st.peer_id,
        "block": st.block_index,
        "state": peer_state_name(st.state),
        "round": st.round,
        "local_steps": st.local_steps,
        "samples_per_s": st.samples_per_s,
        "last_ce": st.last_ce,
        "train_ce": st.train_ce,
        "bytes_sent": st.bytes_sent,
        "bytes_received": st.bytes_received,
        "raw_bytes_sent": st.raw_bytes_sent,
        "participation": st.participation,
        "uptime_s": st.uptime_s,
        "address": st.address,
        "client_mode": st.client_mode,
        "consensus_distance": st.consensus_distance,
        "last_round_s": st.last_round_s,
        "base_hash": st.base_hash,
        "emb_hash": st.emb_hash,
        "config_hash": st.config_hash,
        "swarm_id": st.swarm_id,
        "multiaddrs": list(st.multiaddrs),
        "reachable": REACHABLE.get(st.reachability),
        "reachability": st.reachability_detail,
    }


# a peer's own dial-back check (pb.Reachability) -> the row's "reachable" (None: not checked, or an older peer)
REACHABLE = {pb.REACHABILITY_REACHABLE: True, pb.REACHABILITY_UNREACHABLE: False}


def record_row(r: PeerRecord) -> dict:
    nan = float("nan")
    return {
        "peer_id": r.peer_id,
        "block": r.block_index,
        "state": "unreachable" if r.address else "client",
        "round": r.round,
        "local_steps": 0,
        "samples_per_s": r.samples_per_s,
        "last_ce": nan,
        "train_ce": nan,
        "bytes_sent": 0,
        "bytes_received": 0,
        "raw_bytes_sent": 0,
        "participation": nan,
        "uptime_s": nan,
        "address": r.address,
        "client_mode": r.client_mode,
        "consensus_distance": nan,
        "last_round_s": nan,
        "base_hash": r.base_hash,
        "emb_hash": r.emb_hash,
        "config_hash": r.config_hash,
        "swarm_id": r.swarm_id,
        "multiaddrs": [],
        "reachable": False if r.address else None,
        "reachability": f"this survey could not dial {r.address}" if r.address else "",
    }


def consensus_by_block(statuses: list[pb.PeerStatus]) -> dict[int, float]:
    """Per block: max pairwise sketch distance / param norm among its peers at the block's top round."""
    out: dict[int, float] = {}
    for b in sorted({s.block_index for s in statuses}):
        peers = [s for s in statuses if s.block_index == b and len(s.sketch)]
        if len(peers) < 2:
            out[b] = 0.0 if peers else float("nan")
            continue
        top = max(s.round for s in peers)
        peers = [s for s in peers if s.round == top]
        out[b] = max(
            (
                sketch_distance(list(a.sketch), list(c.sketch), max(a.param_norm, 1e-12))
                for i, a in enumerate(peers)
                for c in peers[i + 1 :]
            ),
            default=0.0,
        )
    return out


def summarize(rows: list[dict], statuses: list[pb.PeerStatus], blocks: int | None = None) -> dict:
    n_blocks = blocks or (max((r["block"] for r in rows), default=-1) + 1)
    consensus = consensus_by_block(statuses)
    per_block = [
        {
            "block": b,
            "peers": sum(r["block"] == b for r in rows),
            "samples_per_s": sum(r["samples_per_s"] for r in rows if r["block"] == b),
            "consensus_distance": consensus.get(b, float("nan")),
        }
        for b in range(n_blocks)
    ]
    finite = [v for v in consensus.values() if not math.isnan(v)]
    return {"peers": rows, "blocks": per_block, "consensus_distance": max(finite) if finite else float("nan")}


async def survey_peer(address: str, timeout_s: float = 5.0) -> dict:
    client = PeerClient()
    try:
        st = await client.status(address, timeout_s)
        cfg = await client.swarm_config(address, timeout_s)
    finally:
        await client.close()
    blocks = json.loads(cfg.model_config_json).get("blocks") if cfg.model_config_json else None
    return summarize([peer_row(st)], [st], blocks)


async def survey_swarm(swarm: list[str], swarm_id: str, timeout_s: float = 5.0, start_timeout_s: float = 30.0) -> dict:
    """Status of every peer found through `swarm` (multiaddrs -> client DHT, host:port -> static list)."""
    client = PeerClient()
    discovery = None
    try:
        discovery = await connect_discovery(swarm, swarm_id, lambda a: client.status(a, timeout_s), start_timeout_s)
        return await survey_discovered(discovery, client, timeout_s)
    finally:
        if discovery is not None:
            await discovery.shutdown()
        await client.close()


async def survey_discovered(discovery: Discovery, client: PeerClient, timeout_s: float = 5.0) -> dict:
    """One survey through an open discovery and client (survey_swarm; the dashboard keeps both open between polls).

    One lookup of the swarm-wide key, then every peer's GetStatus at once, each with its own timeout, and beside
    them the GetConfig (the block count) of the first peer with an address; only if that one fails is the config
    asked again, of the peers that answered, in turn.
    """
    records = await discovery.find_all()
    await pin_tls(client, records)  # peers serving TLS: dial them pinned to the certificate their record names
    dialled = [r for r in records if r.address]
    results: list = await asyncio.gather(
        *(client.status(r.address, timeout_s) for r in dialled),
        *([client.swarm_config(dialled[0].address, timeout_s)] if dialled else []),
        return_exceptions=True,
    )
    config = results.pop() if dialled else None
    by_id = {st.peer_id: st for st in results if isinstance(st, pb.PeerStatus)}
    rows = [peer_row(by_id[r.peer_id]) if r.peer_id in by_id else record_row(r) for r in records]
    blocks = None
    reachable = [r.address for r in dialled if r.peer_id in by_id]
    if reachable:
        if not isinstance(config, pb.SwarmConfig):
            config = await _first_config(client, reachable, timeout_s)
        blocks = json.loads(config.model_config_json).get("blocks") if config.model_config_json else None
    return summarize(rows, list(by_id.values()), blocks)


async def _first_config(client: PeerClient, addresses: list[str], timeout_s: float) -> pb.SwarmConfig:
    """GetConfig of the first of these peers that answers it (the last one's error if none does)."""
    for address in addresses[:-1]:
        try:
            return await client.swarm_config(address, timeout_s)
        except SwarmdError:
            continue
    return await client.swarm_config(addresses[-1], timeout_s)


async def fetch_swarm_config(
    peers: list[str], swarm_id: str, timeout_s: float = 10.0, start_timeout_s: float = 30.0
) -> ModelConfig:
    """The ModelConfig a swarm runs, asked of its first reachable peer (swarmd.protocol.ask_model_config).

    :param peers: DHT multiaddrs (a client DHT finds the peers) or HOST:PORT gRPC addresses
    :raises PeerUnavailable: no peer answered; ConfigMismatch: the peer runs another swarm id or
        sent a config that does not match its hash
    """
    client = PeerClient()
    discovery = None
    try:
        if all(is_multiaddr(p) for p in peers):
            # `blocktrain join` runs a daemon in this process next: no quick start (its settings are process-wide)
            discovery = await connect_discovery(peers, swarm_id, None, start_timeout_s, quick_start=False)
            records = await discovery.find_all()
            await pin_tls(client, records)
            addresses = [r.address for r in records if r.address]
            if not addresses:
                raise PeerUnavailable(
                    f"no peer of swarm {swarm_id!r} is announced in the DHT reached through {peers[0]}; "
                    "check --swarm-id and that the peers are running"
                )
        else:
            addresses = list(peers)
        model, _ = await ask_model_config(client, addresses, swarm_id, timeout_s)
        return model
    finally:
        if discovery is not None:
            await discovery.shutdown()
        await client.close()
