"""Daemon: one swarm peer. Wires discovery, state, gossip, transport, serving and checkpoints.

Owns the peer's lifecycle and nothing else (the math lives in state/gossip, the bytes in delta,
the sockets in transport, the RPC handlers in service, the files in state's save/restore):
  start()      the addresses others dial (swarmd.membership.addresses: --announce or a detected host; a
               taken --listen / --dht-port fails first), discovery (hivemind DHT, its libp2p key in
               the checkpoint dir, or a static list), block choice (--block auto: least combined
               throughput), BlockState (resumed from the checkpoint dir when there is one), the gRPC
               server over a SwarmService (none in client mode), BlockServing, first announce;
  serve()      one asyncio TaskGroup: the announce loop and the round loop, until stop() or
               max_rounds; then a final checkpoint and a clean shutdown;
  run_round()  re-sync if our base differs (joiners too), predecessors for trajectory training, H
               local steps in the worker thread, gossip average, serving update, announce,
               checkpoint, consensus distance, then on_round(report); with gossip.overlap the next round's
               steps run while a round's exchange does (swarmd.node.overlap.OverlapRounds).
The only module that wires swarm + serve + transport. Starts: the DHT process (hivemind), one
worker thread at a time for torch, grpc's own threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import torch

from swarmd.averaging.gossip import Gossip, MergeReport
from swarmd.averaging.outer import make_outer
from swarmd.averaging.state import BlockState
from swarmd.core import checkpoint as ck
from swarmd.core.data import ByteData
from swarmd.core.train import BlockTrainer, seed_for, trajectory_predecessors
from swarmd.errors import SwarmdError
from swarmd.membership.addresses import AddressPlan, check_listen_ports, plan_addresses
from swarmd.membership.discovery import HivemindDiscovery, StaticDiscovery
from swarmd.membership.identity import Identity, identity_path
from swarmd.membership.records import PeerRecord, choose_block
from swarmd.membership.trust import pin_tls
from swarmd.metrics import Metrics
from swarmd.node.config import DaemonConfig
from swarmd.node.overlap import OverlapRounds
from swarmd.node.peers import assembled_ce, consensus_distance, pull_blocks, pull_predecessors
from swarmd.node.prometheus import MetricsCollector, MetricsServer
from swarmd.node.service import SwarmService
from swarmd.protocol import PeerState
from swarmd.serve.serving import BlockServing
from swarmd.transport import PeerClient, SwarmServer, start_server
from swarmd.transport.auth import default_swarm_key, load_swarm_key
from swarmd.transport.tls import fingerprint, load_tls

logger = logging.getLogger(__name__)

STOP_GRACE_S = 2.0  # a stopping daemon lets the round in progress finish this long, then abandons it
CHECKPOINT_FAILURES_UNHEALTHY = 3  # consecutive failed checkpoint writes that turn gRPC health NOT_SERVING
IDENTITY_FILE = "peer.key"  # the libp2p private key in a checkpoint dir (written by hivemind, mode 0400)

# Metrics saved with every checkpoint (benchmarks read them): config.json key -> Metrics attribute
SAVED_METRICS = {k: k for k in ("participation", "bytes_sent", "bytes_received", "raw_bytes_sent", "rejected")}
SAVED_METRICS |= {k: k for k in ("last_round_s", "discovery_s", "started_wall")}
SAVED_METRICS |= {"rounds_merged": "rounds", "train_ce": "last_train_ce", "history": "round_history"}


class Daemon:
    """:param on_round: called with the MergeReport after every merged round (the runner prints a line)"""

    # built by start() (None before it; discovery and server None again after shutdown())
    discovery: StaticDiscovery | HivemindDiscovery
    state: BlockState
    gossip: Gossip
    serving: BlockServing
    server: SwarmServer | None
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]

    def __init__(self, config: DaemonConfig, on_round: Callable[[MergeReport], None] | None = None):
        self.config, self.cfg, self.on_round = config, config.model, on_round
        self.metrics = Metrics()
        self.phase: PeerState = PeerState.JOINING
        self.peer_id = ""
        self.stopping = asyncio.Event()
        self._stop_thread = threading.Event()
        self.server = self.discovery = self.gossip = self.state = self.serving = None  # type: ignore[assignment]
        net = config.net
        self.swarm_key = load_swarm_key(net.swarm_key) if net.swarm_key else default_swarm_key()  # None: public
        self.tls = load_tls(net.tls_cert, net.tls_key) if net.tls_cert else None  # (cert, key) PEM: serve TLS
        self.client = PeerClient(
            max_payload_bytes=config.gossip.max_payload_bytes, meter=self.metrics, swarm_key=self.swarm_key
        )
        self.metrics_server: MetricsServer | None = None  # the Prometheus endpoint (net.metrics_port), from start()
        self.announced = ""  # HOST:PORT other peers dial (--announce, or the --listen / detected host), from start()
        self.service = SwarmService(self)
        self.client.payload_limit = self.service.payload_limit  # replies admitted up to the size our config implies
        self.checkpoint_failures = 0  # consecutive failed checkpoint writes (0 after a good one)
        # gossip.overlap: rounds train while the previous round's exchange runs (swarmd.node.overlap)
        self.overlap = OverlapRounds(self) if config.gossip.overlap else None

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
        plan = self._plan_addresses()
        self.identity = self._load_identity()
        if net.discovery == "static":
            status = lambda a: self.client.status(a, c.gossip.rpc_timeout_s)
            self.discovery = StaticDiscovery(list(net.initial_peers), status, net.swarm_id)
        else:
            self.discovery = await HivemindDiscovery.create(
                net.swarm_id,
                net.initial_peers,
                net.dht_host,
                net.dht_start_timeout_s,
                net.client_mode,
                port=net.dht_port,
                announce_host=plan.dht_announce_host,
                identity_path=self._identity_path(),
            )
        self.peer_id = self.identity.peer_id  # the Ed25519 key's id (the DHT node keeps its own libp2p id)
        peer_seed = c.peer_seed if c.peer_seed is not None else seed_for("peer", self.peer_id)
        resumed = saved_block is not None
        block = saved_block if resumed else c.block
        if block is None or block < 0:
            records = [r for r in await self.discovery.find_all() if r.config_hash == self.cfg.config_hash()]
            block = choose_block(records, self.cfg.blocks)
        outer = make_outer(c.gossip.outer, c.gossip.outer_lr, c.gossip.outer_momentum)
        self.state = BlockState(BlockTrainer(self.cfg, c.train, block, c.device, worker_seed=peer_seed), outer)
        if resumed:
            await asyncio.to_thread(self.state.restore, c.checkpoint_dir)
        if not net.client_mode:
            host, _, port = net.listen.rpartition(":")
            self.server = await start_server(
                self.service,
                host,
                int(port),
                swarm_key=self.swarm_key,
                tls=self.tls,
                max_payload_bytes=c.gossip.max_payload_bytes,
                **self.service.server_limits(),
            )
            self.announced = plan.grpc_address(self.server.port)
        me = PeerRecord(
            self.peer_id, self.address, block, 0, 0.0, self.cfg.config_hash(), "", net.client_mode, net.swarm_id
        )
        if self.tls is not None and self.server is not None:  # the signed record pins our certificate
            me = replace(me, tls_fingerprint=fingerprint(self.tls[0]))
        self.gossip = Gossip(
            self.state, self.client, c.gossip, me, self.metrics, identity=self.identity, lookup=self.records
        )
        self.serving = BlockServing(
            self.cfg, block, c.device, peer_id=self.peer_id, max_cache_bytes=c.net.serve_cache_bytes
        )
        self._update_serving()
        # a resumed peer continues with fresh batches instead of replaying the ones it trained on
        resume = (self.state.round,) if resumed else ()
        self.batches = data.stream(seed_for("data", c.train.seed, block, peer_seed, *resume), c.train.batch_size)
        await self.announce()
        self._start_metrics_server()
        resumed_msg = ", resumed" if resumed else ""
        logger.info("%s started (round %d%s), address %s", self.gossip.tag, self.state.round, resumed_msg, self.address)

    def _start_metrics_server(self) -> None:
        """Serve Prometheus metrics on the --listen host at net.metrics_port (None: off; 0: any free port)."""
        net = self.config.net
        if net.metrics_port is None:
            return
        from swarmd import __version__

        collector = MetricsCollector(self.metrics, net.swarm_id, self.state.block_index, self.peer_id, __version__)
        self.metrics_server = MetricsServer(collector)
        self.metrics_server.start(net.listen.rpartition(":")[0].strip("[]"), net.metrics_port)

    @property
    def metrics_url(self) -> str:
        """http://HOST:PORT/metrics of the Prometheus endpoint ("" when off)."""
        return self.metrics_server.url if self.metrics_server else ""

    def _plan_addresses(self) -> AddressPlan:
        """Where others reach this peer (warnings logged); a taken --listen or --dht-port fails here, at once."""
        net = self.config.net
        dht = net.discovery == "hivemind" and not net.client_mode
        check_listen_ports(net.listen, net.dht_host, net.dht_port, server=not net.client_mode, dht=dht)
        plan = plan_addresses(net.listen, net.announce, net.dht_host, dht)
        for warning in plan.warnings:
            logger.warning("%s", warning)
        return plan

    def _load_identity(self) -> Identity:
        """This peer's Ed25519 identity: --identity FILE, else identity.key in the checkpoint dir (created on first
        start, so a restarted peer keeps its peer id), else a new one for this run."""
        path = identity_path(self.config.identity, self.config.checkpoint_dir)
        return Identity.load_or_create(path) if path else Identity.generate()

    def _identity_path(self) -> str:
        """The file of this peer's libp2p key, in the checkpoint dir: a restart keeps the peer id ("" = none)."""
        if not self.config.checkpoint_dir:
            return ""
        directory = Path(self.config.checkpoint_dir)
        directory.mkdir(parents=True, exist_ok=True)
        return str(directory / IDENTITY_FILE)

    def _update_serving(self) -> None:
        _, block, emb = self.state.snapshot()
        self.serving.update_weights(block, emb["table"])

    async def serve(self) -> None:
        """Run until stop() (or max_rounds), then checkpoint and shut down."""
        if self.state is None:
            await self.start()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._announce_loop())
                await self.wait_for_peers()
                rounds = tg.create_task(self._round_loop())
                tg.create_task(self._cancel_on_stop(rounds))
        finally:
            await self.shutdown()

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

    async def _wait_stopping(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self.stopping.wait(), timeout_s)
        except TimeoutError:
            pass

    async def _announce_loop(self) -> None:
        period = self.config.net.announce_period_s
        while not self.stopping.is_set():
            if isinstance(self.discovery, HivemindDiscovery):
                try:
                    await self.discovery.keep_connected()  # no neighbour left: re-bootstrap (partition healed)
                except Exception as exc:
                    logger.warning("%s DHT neighbour check failed: %s", self.gossip.tag, exc)
            try:
                await self.announce()
            except Exception as exc:
                logger.warning("%s announce failed: %s", self.gossip.tag, exc)
            await self._wait_stopping(period * (1 + 0.2 * random.random()))

    async def wait_for_peers(self) -> None:
        """Block the first round until discovery sees config.min_peers peers (or the timeout passes)."""
        want, deadline = self.config.min_peers, time.monotonic() + self.config.min_peers_timeout_s
        while want > 1 and not self.stopping.is_set() and time.monotonic() < deadline:
            if len({r.peer_id for r in await self.records()} | {self.peer_id}) >= want:
                self.metrics.discovery_s = self.metrics.uptime_s
                return
            await self._wait_stopping(1.0)  # each lookup is a DHT traversal: do not hammer it
        if want > 1 and time.monotonic() >= deadline:
            logger.warning("%s started with fewer than %d peers (timeout)", self.gossip.tag, want)

    async def _round_loop(self) -> None:
        # max_rounds counts from the round this run starts at (a resumed checkpoint's, else 0: a fresh joiner stops
        # with the swarm's counter); stop_at_round is the swarm's counter itself (LocalSwarm: a restarted peer
        # stops with the rest)
        todo, stop_at = self.config.max_rounds, self.config.stop_at_round
        ends = [n for n in (todo and self.state.round + todo, stop_at) if n]
        last = min(ends, default=0)
        overlap = self.overlap
        started = overlap.rounds_started if overlap is not None else (lambda: self.state.round)
        try:
            while not self.stopping.is_set() and not (last and started() >= last):
                await self.run_round()
            if self.overlap is not None:
                await self.overlap.drain()  # the last round's merge lands (within the stop grace when stopping)
        finally:
            if self.overlap is not None:
                await self.overlap.cancel()
        self.stop()

    async def announce(self) -> None:
        started = time.monotonic()
        ttl = self.config.net.record_ttl_s
        await self.discovery.announce(self.gossip.record(ttl), ttl)
        if (took := time.monotonic() - started) > self.config.net.announce_period_s:
            logger.warning("%s announce took %.1fs, longer than its period", self.gossip.tag, took)

    async def records(self) -> list[PeerRecord]:
        """Every peer discovery knows of now ([] with a warning if the lookup failed)."""
        try:
            found = await self.discovery.find_all()
        except Exception as exc:
            logger.warning("%s peer lookup failed: %s", self.gossip.tag, exc)
            return []
        self.metrics.observe_peers([(r.peer_id, r.block_index) for r in [*found, self.gossip.me]])
        await pin_tls(self.client, found, skip=self.peer_id)
        return found

    async def run_round(self) -> MergeReport | None:
        """One round: sync, H local steps, average, publish. Returns the MergeReport (None if stopped).

        With gossip.overlap, OverlapRounds.run_round: returns the report of the previous round, which lands meanwhile.
        """
        if self.overlap is not None:
            return await self.overlap.run_round()
        g, H, started = self.gossip, self.config.gossip.steps_per_round, time.monotonic()
        if await g.sync(await self.records()):
            self._update_serving()
            with contextlib.suppress(SwarmdError):  # our record names the adopted state before this round's deltas
                await self.announce()
        await g.open_round()
        await self.load_predecessors()
        self.phase = PeerState.TRAINING
        steps_before = self.state.local_steps
        stats = await asyncio.to_thread(self.state.train_steps, H, self.batches, self._stop_thread)
        self.metrics.observe_throughput(stats["samples"], stats["seconds"], self.state.local_steps - steps_before)
        self.metrics.observe_train_ce(stats["ce"])
        if self.stopping.is_set():
            return None
        self.phase = PeerState.AVERAGING
        records = await self.records()  # one lookup serves the merge, the consensus and the CE of this round
        report = await g.average(records)
        self.phase = PeerState.TRAINING
        await self.finish_round(report, records, started)
        return report

    async def finish_round(self, report: MergeReport, records: list[PeerRecord], started: float | None = None) -> None:
        """After a merge: serving update, announce, round time (since `started`, if given), checkpoint, consensus
        distance, held-out CE every eval_every rounds, on_round(report)."""
        g = self.gossip
        self._update_serving()
        try:
            await self.announce()
        except SwarmdError as exc:  # the DHT is unreachable (timeout): the announce loop tries again
            logger.warning("%s announce failed: %s", g.tag, exc)
        if started is not None:
            self.metrics.observe_round(time.monotonic() - started)
        if self.config.checkpoint_dir:
            await self.save_checkpoint()
        await self._measure_consensus(records)
        if self.config.eval_every and self.config.eval_path and self.state.round % self.config.eval_every == 0:
            await self.measure_ce(records)
        if self.on_round is not None:
            self.on_round(report)

    async def save_checkpoint(self) -> bool:
        """Atomically checkpoint the state with this peer's progress counters (in the worker thread).

        A failed write (disk full, read-only dir, non-finite state) is one warning line per round and
        keeps the previous generation; CHECKPOINT_FAILURES_UNHEALTHY in a row turn gRPC health
        NOT_SERVING, the next good write turns it SERVING again. Returns whether it was written.
        """
        saved = {k: getattr(self.metrics, a) for k, a in SAVED_METRICS.items()}
        saved |= {"swarm_id": self.config.net.swarm_id, "peer_id": self.peer_id}
        try:
            await asyncio.to_thread(self.state.save, self.config.checkpoint_dir, **saved)
        except (OSError, SwarmdError) as exc:
            self.checkpoint_failures += 1
            logger.warning(
                "%s checkpoint of round %d not written (%d in a row), the last one stays: %s",
                self.gossip.tag if self.gossip else "",
                self.state.round,
                self.checkpoint_failures,
                exc,
            )
            if self.checkpoint_failures == CHECKPOINT_FAILURES_UNHEALTHY and self.server is not None:
                logger.error("%s checkpoints keep failing: health NOT_SERVING until one is written", self.gossip.tag)
                await self.server.set_serving(False)
            return False
        if self.checkpoint_failures >= CHECKPOINT_FAILURES_UNHEALTHY and self.server is not None:
            logger.warning("%s checkpoint written again: health SERVING", self.gossip.tag)
            await self.server.set_serving(True)
        self.checkpoint_failures = 0
        return True

    async def load_predecessors(self) -> int:
        """Trajectory training: pull the blocks that run before ours (frozen, forward only; with the merged
        byte table) at round start, or train on noisy targets this round if one is unreachable. Returns how many."""
        if self.config.train.trajectory_prob <= 0 or not trajectory_predecessors(self.cfg, self.state.block_index):
            return 0
        pulled = await pull_predecessors(self.gossip, await self.records(), self.cfg, self.state.block_index)
        await asyncio.to_thread(self.state.use_predecessors, pulled)
        return len(pulled or {})

    async def _measure_consensus(self, records: list[PeerRecord]) -> None:
        """Max sketch distance to same-block peers that reached our round (kept when none answered)."""
        dist = await consensus_distance(self.client, self.state, records, self.peer_id)
        if dist is not None:
            self.metrics.consensus_distance = dist

    async def measure_ce(self, records: list[PeerRecord] | None = None) -> float:
        """From-noise CE of the assembled model: own block + embedding, other blocks pulled from peers.

        :param records: the peers to pull from (default: a fresh lookup)
        """
        own, (_, own_block, own_emb) = self.state.block_index, self.state.snapshot()
        records = records if records is not None else await self.records()
        others = await pull_blocks(self.gossip, records, (b for b in range(self.cfg.blocks) if b != own))
        if len(others) < self.cfg.blocks - 1:
            return float("nan")
        args = (self.cfg, {**others, own: own_block}, own_emb, self.config.eval_path, self.config.eval_tokens)
        self.metrics.last_ce = await asyncio.to_thread(assembled_ce, *args)
        return self.metrics.last_ce
