"""A starting peer's decisions: where it is reached, how it finds the others, which block it trains, who it says it is.

Owns what Daemon.start() decides before it wires anything: address_plan checks that --listen and
--dht-port are free (a taken one fails at once) and plans the addresses others dial
(swarmd.membership.addresses: --announce, or a detected host; its warnings are the daemon's to log);
open_discovery starts the discovery NetConfig names: a StaticDiscovery over initial_peers, asked for
their status, or a hivemind DHT node (swarmd.membership.dht) listening and announcing where the plan
says, its libp2p key in the checkpoint dir; open_state builds the BlockState of the checkpoint's
block (resumed from it), else of --block, else of the block --block auto picks from the records
(among the open blocks under the grow schedule: auto_blocks);
new_state is the fresh BlockState of one block (initial weights, round 0), the one a peer that moves
to another block (swarmd.membership.balance) trains from then on; open_server starts the gRPC server over
the peer's SwarmService on --listen; first_record is the peer's record before its first announce.
"""

from __future__ import annotations

import asyncio

from swarmd.averaging.outer import outer_for
from swarmd.averaging.state import BlockState
from swarmd.core.schedule import open_blocks
from swarmd.core.train import BlockTrainer
from swarmd.membership.addresses import AddressPlan, check_listen_ports, plan_addresses
from swarmd.membership.balance import coming_round
from swarmd.membership.dht import HivemindDiscovery
from swarmd.membership.discovery import StaticDiscovery, StatusFn
from swarmd.membership.identity import Identity
from swarmd.membership.opening import trained_open
from swarmd.membership.pow import solve_pow
from swarmd.membership.records import PeerRecord, choose_block
from swarmd.metrics import Metrics, failure_reason
from swarmd.node.config import DaemonConfig, NetConfig
from swarmd.node.credentials import libp2p_key_path
from swarmd.node.service import SwarmService
from swarmd.transport import SwarmServer, start_server


def address_plan(net: NetConfig) -> AddressPlan:
    """Where others reach this peer (plan.warnings for the caller to log); a taken --listen or --dht-port fails
    here, at once."""
    dht = net.discovery == "hivemind" and not net.client_mode
    check_listen_ports(net.listen, net.dht_host, net.dht_port, server=not net.client_mode, dht=dht)
    return plan_addresses(net.listen, net.announce, net.dht_host, dht)


async def open_discovery(
    net: NetConfig, plan: AddressPlan, status: StatusFn, checkpoint_dir: str
) -> StaticDiscovery | HivemindDiscovery:
    """The peer's discovery: static over net.initial_peers (`status`: address -> pb.PeerStatus), else a hivemind
    DHT node (started without blocking the event loop; SwarmdError with a hint when it does not start)."""
    if net.discovery == "static":
        return StaticDiscovery(list(net.initial_peers), status, net.swarm_id)
    return await HivemindDiscovery.create(
        swarm_id=net.swarm_id,
        initial_peers=net.initial_peers,
        host=plan.dht_host,
        start_timeout_s=net.dht_start_timeout_s,
        client_mode=net.client_mode,
        port=net.dht_port,
        announce_host=plan.dht_announce_host,
        identity_path=libp2p_key_path(checkpoint_dir),
    )


async def open_state(
    config: DaemonConfig, saved_block: int | None, discovery: StaticDiscovery | HivemindDiscovery, peer_seed: int
) -> BlockState:
    """The BlockState this peer trains: the checkpoint's block (saved_block, restored from the checkpoint dir),
    else config.block, else (None or < 0: auto) the block with the least combined throughput among the peers
    of our model config (under the grow schedule, among the open blocks: auto_blocks)."""
    cfg, block = config.model, saved_block if saved_block is not None else config.block
    if block is None or block < 0:
        records = [r for r in await discovery.find_all() if r.config_hash == cfg.config_hash()]
        block = choose_block(records, auto_blocks(config, records))
    state = new_state(config, block, peer_seed)
    if saved_block is not None:
        await asyncio.to_thread(state.restore, config.checkpoint_dir)
    return state


def auto_blocks(config: DaemonConfig, records: list[PeerRecord]) -> int:
    """The blocks a --block auto peer chooses among: under the grow schedule the open ones (the open-ended rule's
    trained blocks, swarmd.membership.opening, or those open at the swarm's coming round), else all of them."""
    cfg, train = config.model, config.train
    if not (train.pipeline and train.grow):
        return cfg.blocks
    if train.open_gain:
        return trained_open(records, cfg.blocks)
    return open_blocks("grow", coming_round(records), cfg.blocks, train.pipeline_stagger)


def new_state(config: DaemonConfig, block: int, peer_seed: int) -> BlockState:
    """A fresh BlockState of `block`: its initial weights at round 0 (a joiner's; the first re-sync adopts the state
    the block's and the byte table's peers hold, if any)."""
    trainer = BlockTrainer(config.model, config.train, block, config.device, worker_seed=peer_seed)
    return BlockState(trainer, outer_for(config.gossip))


async def open_server(
    service: SwarmService,
    config: DaemonConfig,
    swarm_key: bytes | None,
    tls: tuple[bytes, bytes] | None,
    metrics: Metrics,
) -> SwarmServer:
    """The gRPC server over `service` on --listen, bounded by the service's limits (server_limits), proving the swarm
    key and serving TLS when given; a call refused for its key proof counts in `metrics`."""
    host, _, port = config.net.listen.rpartition(":")
    limits = {"max_payload_bytes": config.gossip.max_payload_bytes, **service.server_limits()}
    refused = lambda exc: metrics.refuse_call(failure_reason(exc))  # a call without a valid key proof
    return await start_server(service, host, int(port), swarm_key=swarm_key, tls=tls, on_refusal=refused, **limits)


async def first_record(
    config: DaemonConfig, identity: Identity, address: str, block: int, fingerprint: str
) -> PeerRecord:
    """This peer's record before its first announce (round 0, no weights yet; `fingerprint` pins our TLS cert): pinned
    for an explicit --block (swarmd.membership.balance never moves it; --block auto may), with the proof of work on
    its key (GossipConfig.pow_bits, solved in the worker thread)."""
    net = config.net
    fields = (identity.peer_id, address, block, 0, 0.0, config.model.config_hash(), "", net.client_mode, net.swarm_id)
    work = await asyncio.to_thread(solve_pow, identity.public_key, config.gossip.pow_bits)  # 0 bits: at once
    return PeerRecord(*fields, tls_fingerprint=fingerprint, pinned=config.block >= 0, pow_nonce=work or 0)
