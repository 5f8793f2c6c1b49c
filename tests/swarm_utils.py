"""Helpers for swarm tests: tiny configs, in-memory gossip peers, real daemons on loopback.

Everything here runs on 127.0.0.1 with ephemeral ports and is torn down in reverse order, each
with a timeout (`async with running(*configs) as daemons`). Waiting is always on an event or a
polled condition with a deadline, never a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.gossip import Gossip
from swarmd.averaging.outer import outer_for
from swarmd.averaging.state import BlockState
from swarmd.averaging.validation import HeldOutCheck
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.train import BlockTrainer
from swarmd.errors import PeerUnavailable
from swarmd.membership.discovery import MemoryDiscovery
from swarmd.membership.identity import Identity
from swarmd.membership.records import PeerRecord
from swarmd.metrics import Metrics
from swarmd.node.config import DaemonConfig, NetConfig
from swarmd.node.daemon import Daemon
from swarmd.transport.framing import Encoded

TEXT = (b"the quick brown fox jumps over the lazy dog. " * 40) + bytes(range(32, 127)) * 8


def tiny_model(blocks: int = 2) -> ModelConfig:
    return ModelConfig(blocks=blocks, layers_per_block=1, d_model=32, n_heads=2, hidden=64, seq_len=16)


def tiny_train(seed: int = 0) -> TrainConfig:
    return TrainConfig(batch_size=4, lr=3e-3, warmup_steps=0, seed=seed)


def write_corpus(directory: Path) -> Path:
    path = Path(directory) / "train.txt"
    path.write_bytes(TEXT)
    (Path(directory) / "eval.txt").write_bytes(TEXT[::-1])
    return path


def batches(seed: int, seq_len: int = 16, batch_size: int = 4):
    from swarmd.core.data import ByteData

    return ByteData(np.frombuffer(TEXT, dtype=np.uint8), seq_len).stream(seed, batch_size)


def random_windows(seq_len: int, n: int = 4, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """n uniformly random byte windows (context x, next bytes y), each (n, seq_len): a batch for one step."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.randint(0, 256, (n, seq_len + 1), generator=g)
    return xy[:, :-1], xy[:, 1:]


class MemoryTransport:
    """Dials in-process Gossip peers by address, with the same timeout and byte-meter semantics as PeerClient."""

    def __init__(self, peers: dict[str, Gossip], dead: set[str] | None = None, meter: Metrics | None = None):
        self.peers = peers
        self.dead: set[str] = dead if dead is not None else set()
        self.meter = meter

    def dialer(self, meter: Metrics) -> MemoryTransport:
        """The same swarm as seen by one peer, counting its bytes into meter (PeerClient(meter=...))."""
        return MemoryTransport(self.peers, self.dead, meter)

    async def exchange(self, address: str, outgoing: Encoded, timeout_s: float) -> Encoded:
        if address in self.dead or address not in self.peers:
            raise PeerUnavailable(f"peer {address} is down")
        try:
            reply = await asyncio.wait_for(self.peers[address].handle_exchange(outgoing), timeout_s)
        except TimeoutError:
            raise PeerUnavailable(f"peer {address}: deadline exceeded") from None
        if self.meter is not None:
            self.meter.add_sent(outgoing.wire_bytes, outgoing.raw_bytes)
            self.meter.add_received(reply.wire_bytes, reply.raw_bytes)
        return reply

    async def pull_state(self, address: str, request, timeout_s: float) -> Encoded:
        if address in self.dead or address not in self.peers:
            raise PeerUnavailable(f"peer {address} is down")
        enc = await self.peers[address].served_state(request)
        if self.meter is not None:
            self.meter.add_received(enc.wire_bytes, enc.raw_bytes)
        return enc


def held_out_check(cfg: ModelConfig, block_index: int, seed: int = 0) -> HeldOutCheck:
    """The held-out sample a daemon of block `block_index` would draw (HeldOutCheck.from_data), from TEXT."""
    from swarmd.core.data import ByteData

    data = ByteData(np.frombuffer(TEXT, dtype=np.uint8), cfg.seq_len)
    return HeldOutCheck.from_data(data, cfg, block_index, seed)


def peer_identities(n: int) -> list[Identity]:
    """n deterministic peer identities, in increasing peer-id order (peer i ranks below peer i+1)."""
    return sorted((Identity.generate(bytes([i + 1]) * 32) for i in range(n)), key=lambda x: x.peer_id)


def memory_swarm(
    blocks_of: list[int],
    codec: str = "fp32",
    blocks: int = 2,
    deadline_max_s: float = 5.0,
    deadline_min_s: float = 0.2,
    client_mode: set[int] = frozenset(),
    checks: bool = False,
    public: bool = False,
    train: TrainConfig | None = None,
    **gossip,
) -> tuple[list[Gossip], MemoryTransport, dict]:
    """One in-process Gossip per entry of blocks_of (its block index), sharing a MemoryDiscovery board.

    :param checks: give every peer a HeldOutCheck on TEXT (swarmd.averaging.validation: verified adoption)
    :param public: the peers are of a public swarm (swarmd.averaging.standing: probation and the range cap)
    :param train: every peer's TrainConfig (default tiny_train())
    :param gossip: more GossipConfig fields (merge="mean", clip_factor, ...)
    """
    cfg = tiny_model(blocks)
    gcfg = GossipConfig(
        steps_per_round=2, codec=codec, deadline_min_s=deadline_min_s, deadline_max_s=deadline_max_s, **gossip
    )
    board: dict[str, PeerRecord] = {}
    peers: dict[str, Gossip] = {}
    transport = MemoryTransport(peers)
    out = []
    identities = peer_identities(len(blocks_of))
    for i, b in enumerate(blocks_of):
        outer = outer_for(gcfg)
        state = BlockState(BlockTrainer(cfg, train or tiny_train(), b, worker_seed=i), outer)
        pid = identities[i].peer_id
        me = PeerRecord(
            pid,
            "" if i in client_mode else f"mem:{i}",
            b,
            0,
            0.0,
            cfg.config_hash(),
            state.block_hash,
            i in client_mode,
            "test",
            state.emb_hash,
        )
        metrics = Metrics()
        check = held_out_check(cfg, b) if checks else None
        g = Gossip(
            state, transport.dialer(metrics), gcfg, me, metrics, identity=identities[i], check=check, public=public
        )
        if me.address:
            peers[me.address] = g
        out.append(g)
        board[pid] = g.record()
    return out, transport, board


# each in-memory peer's training batches, kept across memory_round calls (gone with the peer)
ROUND_STREAMS: weakref.WeakKeyDictionary[Gossip, Iterator] = weakref.WeakKeyDictionary()


async def memory_round(peers: list[Gossip], board: dict, steps: int = 2, skip: set[int] = frozenset()) -> list:
    """One round on every peer (except skip): sync, open, train `steps`, average; returns the reports."""
    records = list(board.values())
    live = [g for i, g in enumerate(peers) if i not in skip]
    for g in live:
        await g.sync(records)
        await g.open_round()
    for g in live:
        stream = ROUND_STREAMS.setdefault(g, batches(peers.index(g)))
        await asyncio.to_thread(g.state.train_steps, steps, stream)
    reports = await asyncio.gather(*(g.average(records) for g in live))
    for g in live:
        board[g.me.peer_id] = g.record()
    return reports


def daemon_config(
    tmp: Path,
    block: int,
    *,
    blocks: int = 2,
    seed: int = 0,
    initial_peers: tuple[str, ...] = (),
    discovery: str = "hivemind",
    client_mode: bool = False,
    checkpoint: bool = False,
    max_rounds: int = 0,
    steps: int = 2,
    deadline_max_s: float = 8.0,
    codec: str = "fp32",
    min_peers: int = 0,
    eval_every: int = 0,
) -> DaemonConfig:
    data = write_corpus(tmp) if not (Path(tmp) / "train.txt").exists() else Path(tmp) / "train.txt"
    return DaemonConfig(
        model=tiny_model(blocks),
        train=tiny_train(),
        gossip=GossipConfig(  # H steps every round (balance 1): the tests count steps (test_balance balances)
            steps_per_round=steps,
            codec=codec,
            deadline_min_s=0.5,
            deadline_max_s=deadline_max_s,
            rpc_timeout_s=5.0,
            balance_steps=1.0,
        ),
        net=NetConfig(
            swarm_id="test",
            listen="127.0.0.1:0",
            initial_peers=tuple(initial_peers),
            discovery=discovery,
            client_mode=client_mode,
            announce_period_s=0.5,
            record_ttl_s=4.0,
            dht_start_timeout_s=20.0,
        ),
        data_path=str(data),
        eval_path=str(Path(tmp) / "eval.txt"),
        eval_tokens=256,
        eval_every=eval_every,
        block=block,
        checkpoint_dir=str(Path(tmp) / f"ckpt{seed}") if checkpoint else "",
        peer_seed=seed,
        max_rounds=max_rounds,
        min_peers=min_peers,
        min_peers_timeout_s=30.0,
    )


def trajectory_config(tmp: Path, block: int, *, blocks: int = 3, max_rounds: int = 0, **train) -> DaemonConfig:
    """A static-discovery daemon of block `block` (seed = block) of `blocks` that trains on the sampler's
    trajectory (trajectory_prob 1), with these TrainConfig fields besides; link_static() wires the addresses."""
    cfg = daemon_config(
        tmp, block, blocks=blocks, seed=block, discovery="static", deadline_max_s=3.0, max_rounds=max_rounds
    )
    return replace(cfg, train=replace(cfg.train, trajectory_prob=1.0, **train))


def link_static(daemons: list[Daemon]) -> None:
    """Static discovery among started daemons: each knows every one's address."""
    addresses = [d.server.address for d in daemons]
    for d in daemons:
        d.discovery.addresses = addresses


@contextlib.asynccontextmanager
async def running(*configs: DaemonConfig, reports: list[list] | None = None) -> AsyncIterator[list[Daemon]]:
    """Start a Daemon per config, in order; yield them; shut every one down in reverse order (30 s each),
    whatever happens (a start that fails included).

    :param reports: each daemon's RoundReports (its on_round) go to a new list appended here
    """
    daemons: list[Daemon] = []
    try:
        for cfg in configs:
            log: list = []
            daemons.append(Daemon(cfg, on_round=log.append))
            if reports is not None:
                reports.append(log)
            await daemons[-1].start()
        yield daemons
    finally:
        for d in reversed(daemons):
            await asyncio.wait_for(d.shutdown(), 30)


async def wait_until(predicate, timeout_s: float = 20.0, poll_s: float = 0.05, what: str = "condition") -> None:
    """Poll an (optionally async) predicate until it is true; TimeoutError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(poll_s)


__all__ = [
    "MemoryDiscovery",
    "daemon_config",
    "memory_round",
    "memory_swarm",
    "replace",
    "running",
    "tiny_model",
    "tiny_train",
    "wait_until",
    "write_corpus",
]
