"""Daemon: one swarm peer. Wires discovery, state, gossip, transport, serving and checkpoints.

Owns the peer's lifecycle and nothing else; each step's work lives beside what it owns:
  start()        resume (swarmd.node.checkpoints), the address plan, discovery, block, BlockState, gRPC server and
                 first record (swarmd.node.startup), identity and TLS (swarmd.node.credentials), Gossip, BlockServing,
                 the first announce, the reachability check in the background (swarmd.node.reachability); a fresh
                 --block auto peer's balance check an announce period later; metrics (swarmd.node.prometheus);
  serve()        one asyncio TaskGroup: the announce loop (swarmd.node.presence) and the round loop
                 (swarmd.node.rounds.round_loop), until stop() or the run's last round (swarmd.node.training
                 .run_plan); then a final checkpoint and a clean shutdown;
  rebalance()    before every round (and once at start): whether this --block auto peer moves (swarmd.node.rebalance);
  run_round()    the round driver's (swarmd.node.rounds.PlainRounds, or with gossip.overlap swarmd.node.overlap),
                 the round's local steps swarmd.node.training's, driving this Daemon as its RoundPeer;
  finish_round() after a merge: serving update, announce (in the background: Presence.try_announce), checkpoint,
                 measurements (swarmd.node.measure), on_round(report); then why nothing merges (swarmd.node
                 .diagnosis): a joiner that never merged stops with that line (serve() raises NothingMerges after
                 its clean shutdown), anyone else warns.
The only module that wires swarm + serve + transport. Starts: the DHT process, one torch worker thread, grpc's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator

import torch

from swarmd.averaging.gossip import Gossip
from swarmd.averaging.round import MergeReport
from swarmd.averaging.state import BlockState
from swarmd.averaging.validation import HeldOutCheck
from swarmd.core.data import ByteData
from swarmd.core.train import seed_for
from swarmd.errors import NothingMerges
from swarmd.membership.dht import HivemindDiscovery
from swarmd.membership.discovery import StaticDiscovery
from swarmd.membership.records import PeerRecord
from swarmd.metrics import Metrics
from swarmd.node.checkpoints import CheckpointWriter, saved_standing
from swarmd.node.config import DaemonConfig
from swarmd.node.credentials import load_identity, load_swarm_key, load_tls, tls_fingerprint
from swarmd.node.diagnosis import Watch
from swarmd.node.measure import measure_round
from swarmd.node.overlap import OverlapRounds
from swarmd.node.peers import load_predecessors
from swarmd.node.presence import Presence
from swarmd.node.prometheus import MetricsServer, start_metrics_server
from swarmd.node.reachability import ReachabilityCheck
from swarmd.node.rebalance import Rebalancer, moved_state
from swarmd.node.rounds import PlainRounds, cancel_on_stop, round_loop
from swarmd.node.service import SwarmService
from swarmd.node.startup import address_plan, first_record, open_discovery, open_server, open_state
from swarmd.node.training import train_round, windowed
from swarmd.protocol import PeerState
from swarmd.serve.serving import BlockServing
from swarmd.transport import PeerClient, SwarmServer

logger = logging.getLogger(__name__)


class Daemon:
    """:param on_round: called with the MergeReport after every merged round (the runner prints a line)"""

    # built by start() (None before it; discovery and server None again after shutdown())
    discovery: StaticDiscovery | HivemindDiscovery
    state: BlockState
    gossip: Gossip
    serving: BlockServing
    server: SwarmServer | None
    presence: Presence
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    me: PeerRecord  # our record's fields Gossip signs the rest into (block_index: the block trained now)
    data: ByteData  # the training text the batch streams draw from
    peer_seed: int  # seeds this peer's data streams and noise

    def __init__(self, config: DaemonConfig, on_round: Callable[[MergeReport], None] | None = None):
        self.config, self.cfg, self.on_round = config, config.model, on_round
        self.metrics = Metrics()
        self.phase: PeerState = PeerState.JOINING
        self.peer_id = ""
        self.stopping = asyncio.Event()
        self._stop_thread = threading.Event()
        self.server = self.discovery = self.gossip = self.state = self.serving = None  # type: ignore[assignment]
        self.presence = None  # type: ignore[assignment]
        self.rebalancer = Rebalancer()  # when this --block auto peer moves (swarmd.node.rebalance)
        self.swarm_key = load_swarm_key(config.net)  # None: a public swarm
        self.tls = load_tls(config.net)  # (cert, key) PEM: serve TLS; None: plaintext
        self.client = PeerClient(
            max_payload_bytes=config.gossip.max_payload_bytes, meter=self.metrics, swarm_key=self.swarm_key
        )
        self.metrics_server: MetricsServer | None = None  # the Prometheus endpoint (net.metrics_port), from start()
        self.announced = ""  # HOST:PORT other peers dial (--announce, or the --listen / detected host), from start()
        self.reachability = ReachabilityCheck(self)  # can others dial us? (asked of known peers after start)
        self.service = SwarmService(self)
        self.client.payload_limit = self.service.payload_limit  # replies admitted up to the size our config implies
        self.checkpoints = CheckpointWriter(config.checkpoint_dir, self.metrics)
        # the round driver; gossip.overlap: rounds train while the previous round's exchange runs (swarmd.node.overlap)
        self.overlap = OverlapRounds(self, config.gossip) if config.gossip.overlap else None
        self.rounds: OverlapRounds | PlainRounds = self.overlap or PlainRounds(self, config.gossip)
        # why nothing merges, after every round (swarmd.node.diagnosis); failure: the line this peer stopped with
        self.watch = Watch.of_peer(config, has_key=self.swarm_key is not None)
        self.failure = ""
        self.pipeline_window = (0, 0)  # TrainConfig.pipeline: (rounds each block trains, 0 = no end; start round)

    @property
    def address(self) -> str:  # the announced HOST:PORT; "" in client mode
        return self.announced if self.server else ""

    def multiaddrs(self) -> list[str]:
        return self.discovery.multiaddrs() if self.discovery else []

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        c, net = self.config, self.config.net
        data = ByteData.from_path(c.data_path, self.cfg.seq_len)  # bad data fails before anything starts
        saved_block = self.checkpoints.resume_block(c.block)  # stale files a crash left behind removed
        plan = address_plan(net)  # a taken --listen or --dht-port fails here, at once
        for warning in plan.warnings:
            logger.warning("%s", warning)
        self.identity = load_identity(c.identity, c.checkpoint_dir)
        self.client.signer = self.identity  # every call proves who we are: peers budget us by our peer id
        status = lambda a: self.client.status(a, c.gossip.rpc_timeout_s)
        self.discovery = await open_discovery(net, plan, status, c.checkpoint_dir)
        self.peer_id = self.identity.peer_id  # the Ed25519 key's id (the DHT node keeps its own libp2p id)
        self.peer_seed = c.peer_seed if c.peer_seed is not None else seed_for("peer", self.peer_id)
        resumed = saved_block is not None
        state = await open_state(c, saved_block, self.discovery, self.peer_seed)
        if not net.client_mode:
            self.server = await open_server(self.service, c, self.swarm_key, self.tls, self.metrics)
            self.announced = plan.grpc_address(self.server.port)
        fingerprint = tls_fingerprint(self.tls, self.server is not None)  # pins our cert
        self.me = await first_record(c, self.identity, self.address, state.block_index, fingerprint)
        self.data = data
        # a resumed peer continues with fresh batches instead of replaying the ones it trained on
        self.use_state(state, resume=(state.round,) if resumed else ())
        await self.presence.announce()  # the first record is out before the start returns
        self.reachability.start()  # in the background: it never holds up nor fails the start
        if self.movable and not resumed:  # joiners that chose a block together: re-check once their records are out
            await self.presence.pause(net.announce_period_s)
            await self.rebalance(max_age_s=0.0)
        self.metrics_server = start_metrics_server(self.metrics, net, self.state.block_index, self.peer_id)
        resumed_msg = ", resumed" if resumed else ""
        logger.info("%s started (round %d%s), address %s", self.gossip.tag, self.state.round, resumed_msg, self.address)

    @property
    def metrics_url(self) -> str:
        """http://HOST:PORT/metrics of the Prometheus endpoint ("" when off)."""
        return self.metrics_server.url if self.metrics_server else ""

    @property
    def movable(self) -> bool:
        """Whether this peer may move to another block: --block auto, server mode, more than one block."""
        return not self.me.pinned and self.server is not None and self.cfg.blocks > 1

    def use_state(self, state: BlockState, resume: tuple[int, ...] = ()) -> None:
        """Train `state` from now on: its Gossip (our record for its block), the announce loop's gossip, a BlockServing
        of its block, and its batch stream (resume: a resumed peer's round, so it does not replay its batches)."""
        c, block = self.config, state.block_index
        self.state, self.me = state, windowed(self.me, block, c.train, self.pipeline_window)
        check = HeldOutCheck.from_data(self.data, self.cfg, block, c.train.seed)  # judges adoptions and merges
        public = self.swarm_key is None  # strangers may join: probation and the range cap (standing)
        args = (state, self.client, c.gossip, self.me, self.metrics)
        standing = self.gossip.standing.saved() if self.gossip else saved_standing(c.checkpoint_dir, resume)
        self.gossip = Gossip(*args, identity=self.identity, lookup=self.records, check=check, public=public)
        self.gossip.standing.restore(standing)  # the identities we knew: a restart or a block move keeps them
        if self.presence is None:
            self.presence = Presence(self.discovery, self.gossip, self.client, self.metrics, c.net, self.stopping)
        self.presence.gossip = self.gossip
        self.serving = BlockServing(
            self.cfg, block, c.device, peer_id=self.peer_id, max_cache_bytes=c.net.serve_cache_bytes
        )
        self.update_serving()
        seed = seed_for("data", c.train.seed, block, self.peer_seed, *resume)
        self.batches = self.data.stream(seed, c.train.batch_size)

    async def rebalance(self, max_age_s: float | None = None) -> bool:
        """Move to the block swarmd.node.rebalance names for this --block auto server-mode peer, if any; whether
        it moved. :param max_age_s: how old the last lookup may be (default: one announce period; 0: look up now)"""
        if not self.movable or self.stopping.is_set():
            return False
        move = await self.rebalancer.check(self.presence, self.gossip, self.state, self.config, max_age_s)
        if move is None:
            return False
        logger.warning("%s %s", self.gossip.tag, move)
        await self.rounds.drain()  # with overlap, the round in flight lands on the block it was trained for
        self.use_state(await asyncio.to_thread(moved_state, self.state, self.config, move.target, self.peer_seed))
        if self.metrics_server is not None:
            self.metrics_server.set_block(move.target)
        await self.presence.try_announce()
        return True

    def update_serving(self) -> None:
        """Serve the merged base: inference and Forward read the weights the last merge (or re-sync) produced."""
        block, emb, block_hash, emb_hash = self.state.named_snapshot()  # Forward replies name these hashes
        self.serving.update_weights(block, emb["table"], block_hash, emb_hash, emb)

    async def train(self, steps: int) -> dict:
        """`steps` local AdamW steps in the worker thread, ending at the next step after stop()
        (swarmd.node.training.train_round: this block's turn, warm start, predecessor refreshes)."""
        return await train_round(self, steps, self._stop_thread)

    async def serve(self) -> None:
        """Run until stop() (or max_rounds), then checkpoint and shut down.

        :raises NothingMerges: after the shutdown, when the peer stopped because nothing merges (self.failure)
        """
        if self.state is None:
            await self.start()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.presence.announce_loop())
                await self.presence.wait_for_peers(self.config.min_peers, self.config.min_peers_timeout_s)
                rounds = tg.create_task(round_loop(self, self.rounds))
                tg.create_task(cancel_on_stop(self, rounds))
        finally:
            await self.shutdown()
        if self.failure:
            raise NothingMerges(self.failure)

    def stop(self) -> None:
        """Ask serve() to finish (safe from a signal handler on the loop)."""
        self.phase = PeerState.STOPPING
        self._stop_thread.set()
        self.stopping.set()
        if isinstance(self.discovery, HivemindDiscovery):  # a DHT process ended by the same signal stays ended
            self.discovery.may_restart = False

    async def shutdown(self) -> None:
        self.phase = PeerState.STOPPING
        began = time.monotonic()
        if self.state is not None and self.config.checkpoint_dir:
            await self.save_checkpoint()
        saved = time.monotonic()
        await self.reachability.stop()
        if self.metrics_server is not None:
            await asyncio.to_thread(self.metrics_server.stop)
            self.metrics_server = None
        if self.server is not None:
            await self.server.stop(1.0)
            self.server = None
        await self.client.close()
        if self.presence is not None:
            await self.presence.close()
        if self.discovery is not None:
            await self.discovery.shutdown()
            self.discovery = None  # type: ignore[assignment]
        logger.info("shut down in %.2fs (final checkpoint %.2fs)", time.monotonic() - began, saved - began)

    async def announce(self) -> None:  # our record as it is now, in the background
        await self.presence.try_announce()

    async def records(self) -> list[PeerRecord]:  # every peer discovery knows of now (swarmd.node.presence)
        return await self.presence.records()

    async def run_round(self) -> MergeReport | None:
        """One round: sync, H local steps, average, publish (swarmd.node.rounds.PlainRounds). Returns the MergeReport
        (None if stopped); with gossip.overlap (OverlapRounds) the report of the previous round, landing meanwhile."""
        return await self.rounds.run_round()

    async def finish_round(self, report: MergeReport, records: list[PeerRecord], started: float | None = None) -> None:
        """After a merge: serving update, announce, round time (since `started`, if given), checkpoint, consensus
        distance, held-out CE every eval_every rounds, on_round(report)."""
        self.update_serving()
        await self.presence.try_announce()
        if started is not None:
            self.metrics.observe_round(time.monotonic() - started)
        if self.config.checkpoint_dir:
            await self.save_checkpoint()
        await measure_round(self.client, self.gossip, self.state, records, self.records, self.config, self.metrics)
        if self.on_round is not None:
            self.on_round(report)
        self.watch_merges(report, records)

    def watch_merges(self, report: MergeReport, records: list[PeerRecord]) -> None:
        """After a round: why nothing merges, if swarmd.node.diagnosis knows; stop with that line (self.failure) or
        warn. The round's failed calls, static discovery's skipped peers included, are what it goes by."""
        if (verdict := self.watch.observe_report(report, records, self.me, self.metrics, self.discovery)) is None:
            return
        if verdict.stop:
            self.failure = verdict.line
            logger.info("%s stopping: %s", self.gossip.tag, verdict.line)
            self.stop()
        else:
            logger.warning("%s %s", self.gossip.tag, verdict.line)

    async def save_checkpoint(self) -> bool:
        """Atomically checkpoint the state with this peer's progress counters; whether it was written (a failed write
        warns and keeps the last one; several in a row turn gRPC health NOT_SERVING: swarmd.node.checkpoints)."""
        ids = {"swarm_id": self.config.net.swarm_id, "peer_id": self.peer_id}
        standing = self.gossip.standing.saved() if self.gossip else {}  # taken back on resume (use_state)
        tag = self.gossip.tag if self.gossip else ""
        return await self.checkpoints.save(self.state, self.server, tag, standing=standing, **ids)

    async def load_predecessors(self) -> int:
        """Trajectory training's frozen predecessor blocks, pulled at round start (swarmd.node.peers); how many."""
        args = (self.cfg, self.config.train.trajectory_prob)
        return await load_predecessors(self.gossip, self.state, self.records, *args)
