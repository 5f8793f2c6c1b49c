"""Daemon: one swarm peer. Wires discovery, state, gossip, transport, serving and checkpoints.

Owns the peer's lifecycle and nothing else (the math lives in state/gossip, the bytes in delta,
the sockets in transport, the RPC handlers in service, the files in state's save/restore, the
announces and lookups in presence, the checkpoint failures in checkpoints):
  start()      the address plan, discovery, block choice and BlockState (swarmd.node.startup: a taken
               --listen / --dht-port fails first; --block auto picks the least combined throughput; a
               checkpoint dir resumes), the identity and TLS (swarmd.node.credentials), the gRPC server
               over a SwarmService (startup.open_server; none in client mode), our first record, Gossip,
               BlockServing, first announce, then (a fresh --block auto peer) one announce period later
               the block balance check, the Prometheus endpoint (swarmd.node.prometheus);
  serve()      one asyncio TaskGroup: the announce loop (swarmd.node.presence) and the round loop,
               until stop() or max_rounds; then a final checkpoint and a clean shutdown;
  rebalance()  before every round (and once at start): swarmd.node.rebalance says whether this --block
               auto peer moves (joiners arriving together, a block that lost its last peer) and the state
               it trains there (a fresh one of the new block with our round and byte table);
  run_round()  the round driver's (swarmd.node.rounds.PlainRounds, driving this Daemon as its RoundPeer):
               re-sync if our base differs (joiners too), predecessors for trajectory training
               (swarmd.node.peers), H local steps in the worker thread, gossip average; with gossip.overlap
               the next round's steps run while a round's exchange does (swarmd.node.overlap.OverlapRounds);
  finish_round() after a merge: serving update, announce, checkpoint, consensus distance and held-out CE
               (swarmd.node.measure), on_round(report); then swarmd.node.diagnosis says why nothing merges,
               if it knows: a joiner that never merged stops with that line (serve() raises NothingMerges
               after its clean shutdown) unless keep_trying, anyone else warns.
The only module that wires swarm + serve + transport. Starts: the DHT process (hivemind), one
worker thread at a time for torch, grpc's own threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch

from swarmd.averaging.gossip import Gossip
from swarmd.averaging.round import MergeReport
from swarmd.averaging.state import BlockState, merge_train_stats
from swarmd.averaging.validation import HeldOutCheck
from swarmd.core import checkpoint as ck
from swarmd.core.data import ByteData
from swarmd.core.pipeline import pipeline_rounds
from swarmd.core.train import seed_for, split_steps
from swarmd.errors import NothingMerges, SwarmdError
from swarmd.membership.dht import HivemindDiscovery
from swarmd.membership.discovery import StaticDiscovery
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import verified
from swarmd.metrics import Metrics, failure_reason
from swarmd.node.checkpoints import CheckpointWriter
from swarmd.node.config import DaemonConfig
from swarmd.node.credentials import load_identity, load_swarm_key, load_tls, tls_fingerprint
from swarmd.node.diagnosis import PeerFacts, Watch
from swarmd.node.measure import measure_assembled_ce, measure_consensus
from swarmd.node.overlap import OverlapRounds
from swarmd.node.peers import load_predecessors, refresh_predecessors
from swarmd.node.presence import Presence
from swarmd.node.prometheus import MetricsServer, start_metrics_server
from swarmd.node.rebalance import Rebalancer, moved_state
from swarmd.node.rounds import PlainRounds
from swarmd.node.service import SwarmService
from swarmd.node.startup import address_plan, first_record, open_discovery, open_server, open_state
from swarmd.protocol import PeerState
from swarmd.serve.serving import BlockServing
from swarmd.transport import PeerClient, SwarmServer

logger = logging.getLogger(__name__)

STOP_GRACE_S = 2.0  # a stopping daemon lets the round in progress finish this long, then abandons it


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
        self.service = SwarmService(self)
        self.client.payload_limit = self.service.payload_limit  # replies admitted up to the size our config implies
        self.checkpoints = CheckpointWriter(config.checkpoint_dir, self.metrics)
        # the round driver; gossip.overlap: rounds train while the previous round's exchange runs (swarmd.node.overlap)
        self.overlap = OverlapRounds(self, config.gossip) if config.gossip.overlap else None
        self.rounds: OverlapRounds | PlainRounds = self.overlap or PlainRounds(self, config.gossip)
        # why nothing merges, after every round (swarmd.node.diagnosis); failure: the line this peer stopped with
        net = config.net
        facts = PeerFacts(net.swarm_id, self.cfg.config_hash(), self.swarm_key is not None, bool(net.initial_peers))
        self.watch = Watch(facts, keep_trying=config.keep_trying, alone_s=2 * net.record_ttl_s)
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
        if c.checkpoint_dir:
            for path in ck.clean_stale(c.checkpoint_dir):  # temp files and generations a crash left behind
                logger.info("removed stale %s", path)
        saved_block = ck.peer_block(c.checkpoint_dir, c.block) if c.checkpoint_dir else None
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
        await self.announce()
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
        self.state, self.me = state, self.windowed(block)
        check = HeldOutCheck.from_data(self.data, self.cfg, block, c.train.seed)  # judges adoptions and merges
        self.gossip = Gossip(
            state,
            self.client,
            c.gossip,
            self.me,
            self.metrics,
            identity=self.identity,
            lookup=self.records,
            check=check,
            public=self.swarm_key is None,  # strangers may join: probation and the range cap (standing)
        )
        if self.presence is None:
            self.presence = Presence(self.discovery, self.gossip, self.client, self.metrics, c.net, self.stopping)
        self.presence.gossip = self.gossip
        self.serving = BlockServing(
            self.cfg, block, c.device, peer_id=self.peer_id, max_cache_bytes=c.net.serve_cache_bytes
        )
        self.update_serving()
        seed = seed_for("data", c.train.seed, block, self.peer_seed, *resume)
        self.batches = self.data.stream(seed, c.train.batch_size)

    def windowed(self, block: int) -> PeerRecord:
        """Our record's template for block `block`, with the swarm rounds it takes local steps in (train_first,
        train_last; 0, 0 = every round): TrainConfig.pipeline's window of this run (swarmd.core.pipeline)."""
        train = self.config.train
        first, last = (0, 0)
        if train.pipeline:
            first, last = pipeline_rounds(block, *self.pipeline_window, train.pipeline_stagger)
        return replace(self.me, block_index=block, train_first=first, train_last=last)

    async def rebalance(self, max_age_s: float | None = None) -> bool:
        """Move to the block swarmd.node.rebalance names for this --block auto server-mode peer, if any; whether
        it moved. :param max_age_s: how old the last lookup may be (default: one announce period; 0: look up now)"""
        if not self.movable or self.stopping.is_set():
            return False
        net = self.config.net
        found = await self.presence.recent(net.announce_period_s if max_age_s is None else max_age_s)
        records = [r for r in verified(found) if r.config_hash == self.me.config_hash and r.swarm_id == net.swarm_id]
        looked_up = self.presence.last[0] if self.presence.last is not None else 0.0
        me, trained = self.gossip.record(net.record_ttl_s), self.state.local_steps > 0
        move = self.rebalancer.decide(records, me, self.cfg.blocks, trained=trained, looked_up=looked_up)
        if move is None:
            return False
        logger.warning("%s %s", self.gossip.tag, move)
        await self.rounds.drain()  # with overlap, the round in flight lands on the block it was trained for
        self.use_state(await asyncio.to_thread(moved_state, self.state, self.config, move.target, self.peer_seed))
        if self.metrics_server is not None:
            self.metrics_server.set_block(move.target)
        try:
            await self.announce()
        except SwarmdError as exc:  # the DHT is unreachable (timeout): the announce loop tries again
            logger.warning("%s announce failed: %s", self.gossip.tag, exc)
        return True

    def update_serving(self) -> None:
        """Serve the merged base: inference and Forward read the weights the last merge (or re-sync) produced."""
        _, block, emb = self.state.snapshot()
        self.serving.update_weights(block, emb["table"])

    async def train(self, steps: int) -> dict:
        """`steps` local AdamW steps in the worker thread (the round's batches; ends at the next step after stop()),
        in TrainConfig.predecessor_pulls chunks with trajectory training's predecessors refreshed between them."""
        train = self.config.train
        if not self.me.trains(self.state.round + 1):
            return {"ce": float("nan"), "samples": 0, "seconds": 0.0, "samples_per_s": 0.0}  # not this block's turn
        first = train.pipeline and train.block_init == "predecessor" and self.state.round + 1 == self.me.train_first
        if first and await asyncio.to_thread(self.state.warm_start):  # our turn's first round: start as block b - 1
            b = self.state.block_index
            logger.info("%s warm start: block %d from block %d", self.gossip.tag, b, b - 1)
        parts = []
        for i, chunk in enumerate(split_steps(steps, train.predecessor_pulls)):
            if i and self.state.predecessors:  # the peers of the last lookup within an announce period
                records = await self.presence.recent(self.config.net.announce_period_s)
                await refresh_predecessors(self.gossip, self.state, records)
            parts.append(await asyncio.to_thread(self.state.train_steps, chunk, self.batches, self._stop_thread))
            if self.stopping.is_set():
                break
        return merge_train_stats(parts)

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
                rounds = tg.create_task(self._round_loop())
                tg.create_task(self._cancel_on_stop(rounds))
        finally:
            await self.shutdown()
        if self.failure:
            raise NothingMerges(self.failure)

    async def _cancel_on_stop(self, rounds: asyncio.Task) -> None:
        """After stop(), give the round STOP_GRACE_S to finish, then cancel it (an exchange or pull waiting on a
        slow peer must not keep a stopping daemon alive); the final checkpoint still holds a consistent state."""
        await self.stopping.wait()
        done, _ = await asyncio.wait({rounds}, timeout=STOP_GRACE_S)
        if not done:
            logger.info("%s stopping: the round in progress is abandoned", self.gossip.tag)
            rounds.cancel()

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
        if self.metrics_server is not None:
            await asyncio.to_thread(self.metrics_server.stop)
            self.metrics_server = None
        if self.server is not None:
            await self.server.stop(1.0)
            self.server = None
        await self.client.close()
        if self.discovery is not None:
            await self.discovery.shutdown()
            self.discovery = None  # type: ignore[assignment]
        logger.info("shut down in %.2fs (final checkpoint %.2fs)", time.monotonic() - began, saved - began)

    async def _round_loop(self) -> None:
        # max_rounds counts from the round this run starts at (a resumed checkpoint's, else 0: a fresh joiner stops
        # with the swarm's counter); stop_at_round is the swarm's counter itself (LocalSwarm: a restarted peer
        # stops with the rest)
        todo, stop_at = self.config.max_rounds, self.config.stop_at_round
        ends = [n for n in (todo and self.state.round + todo, stop_at) if n]
        last = min(ends, default=0)
        if self.config.train.pipeline:  # block b trains rounds b S + 1 .. b S + R: everyone runs (B - 1) S more
            start = self.state.round if todo else 0
            self.pipeline_window = (last - start if last else 0, start)
            self.me = self.gossip.me = self.windowed(self.state.block_index)
            with contextlib.suppress(SwarmdError):  # the peers sitting a round out wait only for its trainers
                await self.announce()
            last = last and last + self.config.train.extra_rounds(self.cfg.blocks)
        try:
            while not self.stopping.is_set() and not (last and self.rounds.rounds_started() >= last):
                await self.rebalance()
                await self.run_round()
            # with overlap, the last round's merge lands (within the stop grace when stopping)
            await self.rounds.drain()
        finally:
            await self.rounds.cancel()
        self.stop()

    async def announce(self) -> None:
        await self.presence.announce()

    async def records(self) -> list[PeerRecord]:
        """Every peer discovery knows of now ([] with a warning if the lookup failed; swarmd.node.presence)."""
        return await self.presence.records()

    async def run_round(self) -> MergeReport | None:
        """One round: sync, H local steps, average, publish (swarmd.node.rounds.PlainRounds). Returns the MergeReport
        (None if stopped); with gossip.overlap (OverlapRounds) the report of the previous round, landing meanwhile."""
        return await self.rounds.run_round()

    async def finish_round(self, report: MergeReport, records: list[PeerRecord], started: float | None = None) -> None:
        """After a merge: serving update, announce, round time (since `started`, if given), checkpoint, consensus
        distance, held-out CE every eval_every rounds, on_round(report)."""
        g = self.gossip
        self.update_serving()
        try:
            await self.announce()
        except SwarmdError as exc:  # the DHT is unreachable (timeout): the announce loop tries again
            logger.warning("%s announce failed: %s", g.tag, exc)
        if started is not None:
            self.metrics.observe_round(time.monotonic() - started)
        if self.config.checkpoint_dir:
            await self.save_checkpoint()
        await measure_consensus(self.client, self.state, records, self.peer_id, self.metrics)
        if self.config.eval_every and self.config.eval_path and self.state.round % self.config.eval_every == 0:
            await self.measure_ce(records)
        if self.on_round is not None:
            self.on_round(report)
        self.watch_merges(report, records)

    def watch_merges(self, report: MergeReport, records: list[PeerRecord]) -> None:
        """After a round: why nothing merges, if swarmd.node.diagnosis knows; stop with that line (self.failure) or
        warn. The round's failed calls, static discovery's skipped peers included, are what it goes by."""
        m, foreign, skipped = self.metrics, [], []
        if isinstance(self.discovery, StaticDiscovery):  # the peers its last lookup skipped, and why
            foreign, skipped = self.discovery.foreign, [failure_reason(e) for e in self.discovery.failures.values()]
        expected = len(report.expected_block) + len(report.expected_emb)
        accepted = len(report.accepted_block) + len(report.accepted_emb)
        totals = (m.dial_failures, m.refused_calls, m.uptime_s)
        verdict = self.watch.observe_totals(expected, accepted, records, self.me, totals, skipped, foreign)
        if verdict is None:
            return
        if verdict.stop:
            self.failure = verdict.line
            logger.info("%s stopping: %s", self.gossip.tag, verdict.line)
            self.stop()
        else:
            logger.warning("%s %s", self.gossip.tag, verdict.line)

    @property
    def checkpoint_failures(self) -> int:
        """Consecutive failed checkpoint writes (0 after a good one)."""
        return self.checkpoints.failures

    async def save_checkpoint(self) -> bool:
        """Atomically checkpoint the state with this peer's progress counters; whether it was written (a failed write
        warns and keeps the last one; several in a row turn gRPC health NOT_SERVING: swarmd.node.checkpoints)."""
        ids = {"swarm_id": self.config.net.swarm_id, "peer_id": self.peer_id}
        return await self.checkpoints.save(self.state, self.server, self.gossip.tag if self.gossip else "", **ids)

    async def load_predecessors(self) -> int:
        """Trajectory training's frozen predecessor blocks, pulled at round start (swarmd.node.peers); how many."""
        args = (self.cfg, self.config.train.trajectory_prob)
        return await load_predecessors(self.gossip, self.state, self.records, *args)

    async def measure_ce(self, records: list[PeerRecord] | None = None) -> float:
        """From-noise CE of the assembled model: own block + embedding, other blocks pulled from peers
        (swarmd.node.measure; NaN when a block is unreachable).

        :param records: the peers to pull from (default: a fresh lookup)
        """
        return await measure_assembled_ce(self.gossip, self.state, records, self.records, self.config, self.metrics)
