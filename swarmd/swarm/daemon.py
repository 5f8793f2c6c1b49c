"""Daemon: one swarm peer. Wires discovery, state, gossip, transport, serving and checkpoints.

Owns the peer's lifecycle and nothing else (the math lives in state/gossip, the bytes in delta,
the sockets in transport):
  start()      discovery (hivemind DHT or static list), block choice (--block auto: least combined
               throughput), BlockState (resumed from the checkpoint dir when there is one), the gRPC
               server (none in client mode), BlockServing, first announce;
  serve()      one asyncio TaskGroup: the announce loop and the round loop, until stop() or
               max_rounds; then a final checkpoint and a clean shutdown;
  run_round()  one round: re-sync from the reference if our base differs (joiners too), pull the
               earlier blocks when training on the sampler's trajectory, H local
               steps in the single worker thread (asyncio.to_thread), gossip average, serving
               update, announce, atomic checkpoint, consensus distance from same-block statuses.
Implements the transport's SwarmHandler (status, swarm_config, pull_state, exchange, forward).
Starts: the DHT process (hivemind), one worker thread at a time for torch, grpc's own threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch.nn.functional as F

from swarmd.core import checkpoint as ck
from swarmd.core.data import ByteData
from swarmd.core.model import ByteEmbedding, DenoisingBlock
from swarmd.core.train import seed_for, trajectory_predecessors
from swarmd.errors import CheckpointError, ConfigMismatch, SwarmdError
from swarmd.swarm.discovery import HivemindDiscovery, PeerRecord, StaticDiscovery, choose_block
from swarmd.swarm.gossip import Gossip, NotReady
from swarmd.swarm.metrics import Metrics
from swarmd.swarm.peer_config import DaemonConfig
from swarmd.swarm.sketch import sketch_distance
from swarmd.swarm.state import BlockState
from swarmd.transport import PeerClient, start_server
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)
PROTOCOL = "swarmd.v1"


def checkpoint_block(directory: str | Path) -> int | None:
    """The block a checkpoint dir was training (None if there is no peer checkpoint there)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    body = ck.read_config(Path(directory))
    return int(body["block_index"]) if body.get("kind") == "swarm-peer" else None


class Daemon:
    def __init__(self, config: DaemonConfig):
        self.config = config
        self.cfg = config.model
        self.metrics = Metrics()
        self.phase = "joining"
        self.stopping = asyncio.Event()
        self._stop_thread = threading.Event()
        self.round_done = asyncio.Event()  # pulsed after every merged round (tests wait on it)
        self.reports: list = []
        self.server = self.discovery = self.gossip = self.state = self.serving = None
        self.client = PeerClient(max_payload_bytes=config.gossip.max_payload_bytes)

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        c, net = self.config, self.config.net
        data = ByteData.from_path(c.data_path, self.cfg.seq_len)  # bad data fails before anything starts
        saved_block = checkpoint_block(c.checkpoint_dir) if c.checkpoint_dir else None
        if saved_block is not None and c.block >= 0 and c.block != saved_block:
            raise ConfigMismatch(
                f"checkpoint {c.checkpoint_dir} trains block {saved_block}, not --block {c.block}; use --block auto or another --checkpoint-dir"
            )
        if net.discovery == "static":
            self.discovery = StaticDiscovery(
                list(net.initial_peers), lambda a: self.client.status(a, c.gossip.rpc_timeout_s), net.swarm_id
            )
        else:
            self.discovery = await HivemindDiscovery.create(
                net.swarm_id, net.initial_peers, net.dht_host, net.dht_start_timeout_s, net.client_mode
            )
        self.peer_id = self.discovery.peer_id
        resumed = saved_block is not None
        block = saved_block if resumed else c.block
        if block is None or block < 0:
            records = [r for r in await self.discovery.find_all() if r.config_hash == self.cfg.config_hash()]
            block = choose_block(records, self.cfg.blocks)
        self.state = BlockState(self.cfg, c.train, block, c.device, worker_seed=c.peer_seed)
        if resumed:
            await asyncio.to_thread(self._load_checkpoint)
        if not net.client_mode:
            host, _, port = net.listen.rpartition(":")
            self.server = await start_server(self, host, int(port), max_payload_bytes=c.gossip.max_payload_bytes)
        address = self.server.address if self.server else ""
        me = PeerRecord(self.peer_id, address, block, 0, 0.0, self.cfg.config_hash(), "", net.client_mode, net.swarm_id)
        self.gossip = Gossip(self.state, self.client, c.gossip, me, self.metrics)
        self.serving = self._make_serving()
        self._update_serving()
        # a resumed peer continues with fresh batches instead of replaying the ones it trained on
        self.batches = data.stream(
            seed_for("data", c.train.seed, block, c.peer_seed, *((self.state.round,) if resumed else ())),
            c.train.batch_size,
        )
        await self.announce()
        logger.info(
            "%s started (round %d%s), address %s",
            self.gossip.tag,
            self.state.round,
            ", resumed" if resumed else "",
            address or "none (client mode)",
        )

    def _make_serving(self):
        try:
            from swarmd.serve.serving import BlockServing
        except ImportError:  # pragma: no cover - serving lands with the inference issue
            return None
        return BlockServing(self.cfg, self.state.block_index, self.config.device, peer_id=self.peer_id)

    def _update_serving(self) -> None:
        if self.serving is not None:
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
                tg.create_task(self._round_loop())
        finally:
            await self.shutdown()

    def stop(self) -> None:
        """Ask serve() to finish (safe from a signal handler on the loop)."""
        self.phase = "stopping"
        self._stop_thread.set()
        self.stopping.set()

    async def shutdown(self) -> None:
        self.phase = "stopping"
        if self.state is not None and self.config.checkpoint_dir:
            await asyncio.to_thread(self.save_checkpoint)
        if self.server is not None:
            await self.server.stop(1.0)
            self.server = None
        await self.client.close()
        if self.discovery is not None:
            await self.discovery.shutdown()
            self.discovery = None

    async def _announce_loop(self) -> None:
        period = self.config.net.announce_period_s
        while not self.stopping.is_set():
            try:
                await self.announce()
            except Exception as exc:
                logger.warning("%s announce failed: %s", self.gossip.tag, exc)
            try:
                await asyncio.wait_for(self.stopping.wait(), period * (1 + 0.2 * random.random()))
            except TimeoutError:
                pass

    async def wait_for_peers(self) -> None:
        """Block the first round until discovery sees config.min_peers peers (or the timeout passes)."""
        want, deadline = self.config.min_peers, time.monotonic() + self.config.min_peers_timeout_s
        while want > 1 and not self.stopping.is_set() and time.monotonic() < deadline:
            if len({r.peer_id for r in await self._records()} | {self.peer_id}) >= want:
                self.metrics.discovery_s = self.metrics.uptime_s
                return
            try:
                await asyncio.wait_for(self.stopping.wait(), 1.0)  # each lookup is a DHT traversal: do not hammer it
            except TimeoutError:
                pass
        if want > 1 and time.monotonic() >= deadline:
            logger.warning(
                "%s started with fewer than %d peers after %.0fs",
                self.gossip.tag,
                want,
                self.config.min_peers_timeout_s,
            )

    async def _round_loop(self) -> None:
        if self.config.max_rounds and self.state.round >= self.config.max_rounds:
            self.stop()
        while not self.stopping.is_set():
            await self.run_round()
            if self.config.max_rounds and self.state.round >= self.config.max_rounds:
                self.stop()  # the swarm's round counter: a resumed or joined peer stops at the same round as the rest

    async def announce(self) -> None:
        started = time.monotonic()
        await self.discovery.announce(self.gossip.record(), self.config.net.record_ttl_s)
        if time.monotonic() - started > self.config.net.announce_period_s:
            logger.warning(
                "%s announce took %.1fs, longer than its period", self.gossip.tag, time.monotonic() - started
            )

    async def _records(self) -> list[PeerRecord]:
        try:
            return await self.discovery.find_all()
        except Exception as exc:
            logger.warning("%s peer lookup failed: %s", self.gossip.tag, exc)
            return []

    async def run_round(self):
        """One round: sync, H local steps, average, publish. Returns the RoundReport (None if stopped)."""
        g, H = self.gossip, self.config.gossip.steps_per_round
        pulled = await g.sync(await self._records())
        if pulled:
            self._update_serving()
        await g.open_round()
        await self.load_predecessors()
        self.phase = "training"
        stats = await asyncio.to_thread(self.state.train_steps, H, self.batches, self._stop_thread)
        self.metrics.observe_throughput(stats["samples"], stats["seconds"])
        self.metrics.last_train_ce = stats["ce"]
        if self.stopping.is_set():
            return None
        self.phase = "averaging"
        report = await g.average(await self._records())
        self.phase = "training"
        self._update_serving()
        self.reports.append(report)
        await self.announce()
        if self.config.checkpoint_dir:
            await asyncio.to_thread(self.save_checkpoint)
        await self._measure_consensus()
        if self.config.eval_every and self.config.eval_path and self.state.round % self.config.eval_every == 0:
            await self.measure_ce()
        self.round_done.set()
        self.round_done.clear()
        return report

    async def _pull_block(self, records: list[PeerRecord], block_index: int) -> dict | None:
        """The merged state of another block from the first of its peers that answers (None if none does)."""
        for r in (r for r in records if r.block_index == block_index and r.address):
            try:
                return await self.gossip.fetch_block(r)
            except SwarmdError as exc:
                logger.info("%s could not pull block %d from %s: %s", self.gossip.tag, block_index, r.peer_id[-6:], exc)
        return None

    async def load_predecessors(self) -> int:
        """Trajectory training: pull the blocks that run before ours (frozen, forward only) at round start.

        They come with the round's merged byte table. If a predecessor block has no reachable peer,
        this round trains on the documented noisy targets instead. Returns the blocks loaded.
        """
        wanted = self.config.train
        needed = sorted({b for b, _ in trajectory_predecessors(self.cfg, self.state.block_index)})
        if wanted.trajectory_prob <= 0 or not needed:
            return 0
        records = await self._records()
        others = {}
        for b in needed:
            if (state := await self._pull_block(records, b)) is not None:
                others[b] = DenoisingBlock(self.cfg)
                others[b].load_state_dict(state)
                others[b].to(self.config.device).eval()
        trainer = self.state.trainer
        complete = len(others) == len(needed)
        if not complete:
            logger.warning(
                "%s trajectory training needs blocks %s, found %s: this round uses noisy targets",
                self.gossip.tag,
                needed,
                sorted(others),
            )
        _, _, emb_state = self.state.snapshot()
        trainer.set_others(others if complete else {}, table=F.normalize(emb_state["table"].float(), dim=-1))
        trainer.train_cfg = wanted if complete else replace(wanted, trajectory_prob=0.0)
        return len(others) if complete else 0

    async def _measure_consensus(self) -> None:
        """Max sketch distance to same-block peers that reached our round (NaN if none did)."""
        peers = [
            r
            for r in await self._records()
            if r.block_index == self.state.block_index and r.peer_id != self.peer_id and r.address
        ]
        results = await asyncio.gather(*(self.client.status(r.address, 2.0) for r in peers), return_exceptions=True)
        dists = [
            sketch_distance(self.state.sketch, list(st.sketch), self.state.param_norm)
            for st in results
            if not isinstance(st, BaseException) and st.round == self.state.round
        ]
        self.metrics.consensus_distance = (
            max(dists) if dists else (0.0 if not peers else self.metrics.consensus_distance)
        )

    async def measure_ce(self) -> float:
        """From-noise CE of the assembled model: own block + embedding, other blocks pulled from peers."""
        from swarmd.core.evaluate import from_noise_ce

        records = await self._records()
        _, own_block, own_emb = self.state.snapshot()
        states = {self.state.block_index: own_block}
        for b in range(self.cfg.blocks):
            if b not in states and (state := await self._pull_block(records, b)) is not None:
                states[b] = state
        if len(states) < self.cfg.blocks:
            return float("nan")

        def evaluate() -> float:
            blocks = []
            for b in range(self.cfg.blocks):
                m = DenoisingBlock(self.cfg)
                m.load_state_dict(states[b])
                blocks.append(m)
            emb = ByteEmbedding(self.cfg)
            emb.load_state_dict(own_emb)
            x, y = ByteData.from_path(self.config.eval_path, self.cfg.seq_len).eval_windows(self.config.eval_tokens)
            return from_noise_ce(blocks, emb, x, y, self.cfg)["ce"]

        self.metrics.last_ce = await asyncio.to_thread(evaluate)
        return self.metrics.last_ce

    # -- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Atomically write the merged block, embedding, AdamW state and progress (worker thread)."""
        d, st = Path(self.config.checkpoint_dir), self.state
        round, block_sd, emb_sd = st.snapshot()
        block, emb = DenoisingBlock(self.cfg), ByteEmbedding(self.cfg)
        block.load_state_dict(block_sd)
        emb.load_state_dict(emb_sd)
        with st.lock:
            ck.save_optimizer(d, st.block_index, st.trainer.opt, st.trainer.step_count)
            step = st.trainer.step_count
        ck.save_block(d, self.cfg, st.block_index, block, step)
        ck.save_embedding(d, self.cfg, emb)
        m = self.metrics
        ck.write_config(
            d,
            self.cfg,
            self.config.train,
            kind="swarm-peer",
            block_index=st.block_index,
            round=round,
            local_steps=step,
            samples=st.samples,
            swarm_id=self.config.net.swarm_id,
            peer_id=getattr(self, "peer_id", ""),
            rounds_merged=m.rounds,
            participation=m.participation,
            bytes_sent=m.bytes_sent,
            bytes_received=m.bytes_received,
            raw_bytes_sent=m.raw_bytes_sent,
            rejected=m.rejected,
            last_round_s=m.last_round_s,
            train_ce=m.last_train_ce,
            discovery_s=m.discovery_s,
            started_wall=m.started_wall,
            history=m.round_history,
        )

    def _load_checkpoint(self) -> None:
        d, st = Path(self.config.checkpoint_dir), self.state
        body = ck.read_config(d)
        if body["model_config"].config_hash() != self.cfg.config_hash():
            raise ConfigMismatch(
                f"checkpoint {d} holds another model config ({body['config_hash']}); use another --checkpoint-dir or the same model flags"
            )
        block, step = ck.load_block(d, self.cfg, st.block_index)
        emb = ck.load_embedding(d, self.cfg)
        st.adopt(block.state_dict(), emb.state_dict(), int(body.get("round", 0)))
        with st.lock:
            try:
                ck.load_optimizer(d, st.block_index, st.trainer.opt)
            except CheckpointError as exc:
                logger.warning("optimizer state not restored: %s", exc)
            st.trainer.step_count = step
            st.samples = int(body.get("samples", 0))

    # -- SwarmHandler ------------------------------------------------------------------------
    def status(self) -> pb.PeerStatus:
        st, m = self.state, self.metrics
        return pb.PeerStatus(
            peer_id=self.peer_id,
            block_index=st.block_index,
            state=self.phase,
            round=st.round,
            local_steps=st.trainer.step_count,
            samples_per_s=m.samples_per_s,
            last_ce=m.last_ce,
            bytes_sent=m.bytes_sent,
            bytes_received=m.bytes_received,
            participation=m.participation,
            uptime_s=m.uptime_s,
            address=self.server.address if self.server else "",
            swarm_id=self.config.net.swarm_id,
            config_hash=self.cfg.config_hash(),
            consensus_distance=m.consensus_distance,
            base_hash=f"{st.block_hash}/{st.emb_hash}",  # block hash / embedding hash
            multiaddrs=self.discovery.multiaddrs() if self.discovery else [],
            client_mode=self.config.net.client_mode,
            raw_bytes_sent=m.raw_bytes_sent,
            last_round_s=m.last_round_s,
            sketch=st.sketch,
            param_norm=st.param_norm,
        )

    def swarm_config(self) -> pb.SwarmConfig:
        return pb.SwarmConfig(
            swarm_id=self.config.net.swarm_id,
            model_config_json=json.dumps(self.cfg.to_dict(), sort_keys=True),
            config_hash=self.cfg.config_hash(),
            protocol=PROTOCOL,
        )

    async def pull_state(self, request: pb.PullStateRequest) -> Encoded:
        return self.gossip.state_payload(request)

    async def exchange(self, incoming: Encoded) -> Encoded:
        if self.gossip is None:
            raise NotReady("peer is still starting")
        return await self.gossip.handle_exchange(incoming)

    async def forward(self, request: pb.ForwardRequest) -> pb.ForwardReply:
        if self.serving is None:
            raise SwarmdError("this peer does not serve inference")
        return await self.serving.forward(request)
