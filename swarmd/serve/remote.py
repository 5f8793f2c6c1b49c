"""Swarm inference client: route each sampler step to a peer holding its block, with failover.

Owns:
  - `BlockRouter`: finds the holders of every block through a Discovery (anything with find /
    find_all, e.g. swarmd.membership.discovery's), probes each once for its round-trip time, then picks one
    peer per block by latency EMA x (1 + calls this client has in flight to it); a peer that fails or
    stalls is banned for an exponentially growing period (swarmd.backoff) and the next replica is used;
  - `RemoteSweeper`: the swarm implementation of swarmd.serve.inference.Sweeper. One Forward stream per
    (session, block) for the session's life; every hop is timed into `trace`. For cached generation
    it keeps each step's input history (context bytes and z of every cached position) so a peer that
    lacks the session's cache (a fresh replica after failover, or one that evicted it) receives the
    whole prefix again with start_position 0 in the same call;
  - `connect_swarm()`: discovery + model config lookup for the CLI, with one-line errors for an
    unknown swarm or a block that no peer serves; the swarm-wide lookup that finds the config also
    gives the router every block's holders (no lookup per block), all probed at once.
Talks to peers only through the PeerClient interface of swarmd.transport (status, swarm_config,
forward_session); never retries in a loop on one peer: failover means another replica.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass, field
from typing import Any

import torch

from swarmd.backoff import Backoff
from swarmd.core.config import ModelConfig
from swarmd.core.model import sampler_plan
from swarmd.errors import PeerUnavailable, SessionMissing, SwarmdError, ValidationError
from swarmd.protocol import ask_model_config
from swarmd.v1 import swarm_pb2 as pb
from swarmd.wire import from_proto, to_proto

logger = logging.getLogger(__name__)


@dataclass
class Hop:
    """One call of one sampler step on one peer."""

    step_index: int
    block_index: int
    address: str
    positions: int  # positions (n * t) the peer processed
    seconds: float  # client-side wall time of the call, injected delay included
    compute_s: float  # peer-side compute time
    resent: bool = False  # the call carried the whole prefix to rebuild a cache


@dataclass
class Replica:
    record: Any  # swarmd.membership.records.PeerRecord
    latency_s: float | None = None  # EMA of call round-trip time
    inflight: int = 0

    @property
    def address(self) -> str:
        return self.record.address

    def score(self) -> float:
        return (self.latency_s if self.latency_s is not None else 1.0) * (1 + self.inflight)


class BlockRouter:
    """One peer per block, by measured latency and load; bans failing peers for a while.

    :param discovery: anything with `async find(block_index) -> list[PeerRecord]`
    :param client: a PeerClient (needs `async status(address, timeout_s)`)
    :param probe_timeout_s: deadline of the latency probe of a new replica
    """

    def __init__(
        self,
        discovery,
        client,
        config_hash: str,
        swarm_id: str | None = None,
        probe_timeout_s: float = 5.0,
        ban_s: float = 2.0,
        max_ban_s: float = 60.0,
        refresh_s: float = 30.0,
    ):
        self.discovery, self.client = discovery, client
        self.config_hash, self.swarm_id = config_hash, swarm_id
        self.probe_timeout_s, self.refresh_s = probe_timeout_s, refresh_s
        self.bans = Backoff(base_s=ban_s, max_s=max_ban_s)  # address -> ban of a failing replica
        self._replicas: dict[int, dict[str, Replica]] = {}
        self._refreshed: dict[int, float] = {}  # block -> monotonic time of the last discovery lookup

    async def refresh(self, block_index: int) -> list[Replica]:
        """Look the block's holders up again (new replicas join; stats of known ones are kept)."""
        self._refreshed[block_index] = time.monotonic()
        await self._add(block_index, await self.discovery.find(block_index))
        return list(self._replicas.setdefault(block_index, {}).values())

    async def seed(self, records: list, blocks: range) -> None:
        """Take the holders of these blocks from one swarm-wide lookup's records (a discovery's find_all), as if
        each block had just been refreshed: no lookup per block. A block that none of them serves is looked up
        on its own when chosen (choose refreshes a block with no usable replica)."""
        now = time.monotonic()
        for b in blocks:
            self._refreshed[b] = now
            await self._add(b, [r for r in records if getattr(r, "block_index", None) == b])

    async def _add(self, block_index: int, records: list) -> None:
        known = self._replicas.setdefault(block_index, {})
        for rec in records:
            if not rec.address or getattr(rec, "client_mode", False):
                continue  # client-mode peers accept no inbound calls
            if self.swarm_id and getattr(rec, "swarm_id", "") not in ("", self.swarm_id):
                continue
            if getattr(rec, "config_hash", "") not in ("", self.config_hash):
                continue
            await pin_tls(self.client, rec)
            if rec.address in known:
                known[rec.address].record = rec
            else:
                known[rec.address] = Replica(rec)

    async def probe_all(self) -> None:
        """Probe every known replica not measured yet, all at once (each with probe_timeout_s)."""
        todo = [r for replicas in self._replicas.values() for r in replicas.values() if r.latency_s is None]
        await asyncio.gather(*(self._probe(r) for r in todo))

    async def choose(self, block_index: int, exclude: Container[str] = frozenset()) -> Replica:
        """The best usable replica of a block; raises PeerUnavailable when there is none."""
        now = time.monotonic()
        stale = now - self._refreshed.get(block_index, -math.inf) > self.refresh_s
        for attempt in range(int(stale), 2):
            replicas = (
                list(self._replicas.get(block_index, {}).values()) if attempt == 0 else await self.refresh(block_index)
            )
            usable = [r for r in replicas if r.address not in exclude and not self.bans.banned(r.address, now)]
            for r in usable:
                if r.latency_s is None:
                    await self._probe(r)
            usable = [r for r in usable if not self.bans.banned(r.address)]
            if usable:
                return min(usable, key=Replica.score)
        where = f" of swarm {self.swarm_id!r}" if self.swarm_id else ""
        raise PeerUnavailable(f"no reachable peer serves block {block_index}{where}")

    async def _probe(self, replica: Replica) -> None:
        t0 = time.perf_counter()
        try:
            await self.client.status(replica.address, timeout_s=self.probe_timeout_s)
        except SwarmdError as exc:
            self.report_failure(replica, exc)
            return
        replica.latency_s = time.perf_counter() - t0

    def report_latency(self, replica: Replica, seconds: float) -> None:
        self.bans.succeed(replica.address)
        replica.latency_s = seconds if replica.latency_s is None else 0.8 * replica.latency_s + 0.2 * seconds

    def report_failure(self, replica: Replica, exc: BaseException) -> None:
        ban = self.bans.fail(replica.address)
        logger.warning(
            "block %d: peer %s failed (%s); banned for %.1f s",
            replica.record.block_index,
            replica.address,
            exc or type(exc).__name__,
            ban,
        )


@dataclass
class _Session:
    streams: dict[int, tuple[Replica, Any]] = field(default_factory=dict)  # block -> (replica, forward stream)
    warm: dict[tuple[str, int], int] = field(default_factory=dict)  # (address, step) -> positions cached there
    x_hist: torch.Tensor | None = None  # (n, positions) context of every cached position
    z_hist: dict[int, torch.Tensor] = field(default_factory=dict)  # step -> (n, positions, d) inputs
    m_hist: dict[int, torch.Tensor] = field(default_factory=dict)  # step -> (n, positions, message_dim) inputs


class RemoteSweeper:
    """swarmd.serve.inference.Sweeper over the swarm: step i of the sampler runs on a peer of its block.

    :param hop_delay_s: injected user-space delay awaited before every hop (benchmarks only)
    :param timeout_s: a call slower than this counts as a stalled peer and fails over
    :param max_failovers: replicas tried per step before giving up
    """

    def __init__(
        self,
        cfg: ModelConfig,
        router: BlockRouter,
        client,
        steps: int | None = None,
        timeout_s: float = 30.0,
        hop_delay_s: float = 0.0,
        max_failovers: int = 3,
        compress: bool = False,
    ):
        self.cfg, self.router, self.client = cfg, router, client
        self.config_hash = cfg.config_hash()
        self.plan = sampler_plan(cfg, steps)
        self.timeout_s, self.hop_delay_s, self.max_failovers, self.compress = (
            timeout_s,
            hop_delay_s,
            max_failovers,
            compress,
        )
        self.trace: list[Hop] = []
        self.failovers = 0
        self._sessions: dict[str, _Session] = {}
        self._closing: set[asyncio.Future] = set()  # streams of failed replicas being closed

    def session_routes(self) -> dict[str, dict[int, str]]:
        """Open sessions -> block index -> address of the replica its forward stream goes to (a copy)."""
        return {sid: {b: replica.address for b, (replica, _) in s.streams.items()} for sid, s in self._sessions.items()}

    async def sweep(
        self, session_id: str, x: torch.Tensor, z: torch.Tensor, start_position: int, use_cache: bool
    ) -> torch.Tensor:
        sess = self._sessions.setdefault(session_id, _Session())
        if use_cache:
            if start_position == 0:
                sess.x_hist, sess.z_hist, sess.m_hist, sess.warm = None, {}, {}, {}
            held = 0 if sess.x_hist is None else sess.x_hist.shape[1]
            if held != start_position:
                raise ValueError(f"session {session_id} holds {held} positions; asked to continue at {start_position}")
        out, message = None, None  # message: what the previous step hands this one besides z (None at step 0)
        for i, (b, sigma, sigma_next) in enumerate(self.plan):
            out, message_next = await self._step(
                session_id, sess, i, b, sigma, sigma_next, x, z, message, start_position, use_cache
            )
            if use_cache:
                _remember(sess.z_hist, i, z, start_position)
                if message is not None:
                    _remember(sess.m_hist, i, message, start_position)
            z, message = out, message_next
        if use_cache:
            sess.x_hist = x if sess.x_hist is None or start_position == 0 else torch.cat([sess.x_hist, x], dim=1)
        if out is None:
            raise RuntimeError("the sampler plan has no steps")
        return out

    async def _step(
        self,
        session_id: str,
        sess: _Session,
        i: int,
        b: int,
        sigma: float,
        sigma_next: float | None,
        x,
        z,
        message: torch.Tensor | None,
        start: int,
        use_cache: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(this step's output: next z, or the logits at the last step; its message for the next step or None)."""
        tried: set[str] = set()
        last_exc: BaseException | None = None
        while len(tried) <= self.max_failovers:
            replica, stream = await self._stream(session_id, sess, b, tried)
            resend = use_cache and start > 0 and sess.warm.get((replica.address, i)) != start
            xs, zs, ms, s0 = x, z, message, start
            if resend and sess.x_hist is not None:
                xs, zs, s0 = torch.cat([sess.x_hist, x], 1), torch.cat([sess.z_hist[i], z], 1), 0
                ms = None if message is None else torch.cat([sess.m_hist[i], message], 1)
            req = pb.ForwardRequest(
                session_id=session_id,
                block_index=b,
                config_hash=self.config_hash,
                sigma=sigma,
                sigma_next=sigma_next or 0.0,
                final=sigma_next is None,
                start_position=s0,
                use_cache=use_cache,
                step_index=i,
            )
            req.context.CopyFrom(to_proto(xs.to(torch.uint8), self.compress))
            req.z.CopyFrom(to_proto(zs.float(), self.compress))
            if ms is not None:
                req.message.CopyFrom(to_proto(ms.float(), self.compress))
            t0 = time.perf_counter()
            replica.inflight += 1
            try:
                if self.hop_delay_s > 0:
                    await asyncio.sleep(self.hop_delay_s)
                reply = await asyncio.wait_for(stream.step(req, timeout_s=self.timeout_s), self.timeout_s + 5.0)
            except (TimeoutError, PeerUnavailable, ConnectionError) as exc:
                last_exc = exc
                self._drop_stream(sess, b, replica, exc)
                tried.add(replica.address)
                self.failovers += 1
                continue
            except SessionMissing:
                if resend:
                    raise
                sess.warm.pop((replica.address, i), None)  # the peer evicted our cache: re-send to it
                continue
            finally:
                replica.inflight -= 1
            seconds = time.perf_counter() - t0
            self.router.report_latency(replica, seconds)
            out, message_out = self._unpack(reply, xs.shape, sigma_next is None)
            self.trace.append(Hop(i, b, replica.address, xs.numel(), seconds, reply.compute_s, resend))
            if use_cache:
                sess.warm[(replica.address, i)] = s0 + xs.shape[1]
            if resend:  # the reply covers the re-sent prefix too; the caller wants the new positions
                out = out[:, -x.shape[1] :]
                message_out = None if message_out is None else message_out[:, -x.shape[1] :]
            return out, message_out
        raise PeerUnavailable(f"block {b}: every replica tried failed (last: {last_exc or 'timeout'})")

    async def _stream(self, session_id: str, sess: _Session, b: int, tried: set[str]):
        held = sess.streams.get(b)
        if held and held[0].address not in tried:
            return held
        replica = await self.router.choose(b, exclude=tried)
        stream = self.client.forward_session(replica.address)
        sess.streams[b] = (replica, stream)
        return replica, stream

    def _drop_stream(self, sess: _Session, b: int, replica: Replica, exc: BaseException) -> None:
        self.router.report_failure(replica, exc)
        held = sess.streams.pop(b, None)
        if held:
            task = asyncio.ensure_future(_quiet_close(held[1]))
            self._closing.add(task)  # keep a reference until it is done
            task.add_done_callback(self._closing.discard)
        for key in [k for k in sess.warm if k[0] == replica.address]:
            del sess.warm[key]

    def _unpack(
        self, reply: pb.ForwardReply, shape: tuple[int, int], final: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits at the last step, else the next z; the message for the next step when the config passes one)."""
        n, t = shape
        if final:
            return from_proto(reply.logits, expect_shape=(n, t, self.cfg.vocab), expect_dtype="float32"), None
        z = from_proto(reply.z, expect_shape=(n, t, self.cfg.d_model), expect_dtype="float32")
        width = self.cfg.message_dim
        if not width:
            return z, None
        if not reply.HasField("message"):
            raise ValidationError(f"peer {reply.peer_id or '?'} replied without the step's message")
        return z, from_proto(reply.message, expect_shape=(n, t, width), expect_dtype="float32")

    async def end_session(self, session_id: str) -> None:
        sess = self._sessions.pop(session_id, None)
        if sess is None:
            return
        for b, (replica, stream) in sess.streams.items():
            try:
                if sess.x_hist is not None:
                    await asyncio.wait_for(
                        stream.step(
                            pb.ForwardRequest(
                                session_id=session_id, block_index=b, config_hash=self.config_hash, end_session=True
                            )
                        ),
                        self.timeout_s,
                    )
            except (TimeoutError, SwarmdError) as exc:
                logger.info("block %d: could not end session on %s: %s", b, replica.address, exc)
            finally:
                await _quiet_close(stream)

    async def close(self) -> None:
        for sid in list(self._sessions):
            await self.end_session(sid)


async def _quiet_close(stream) -> None:
    try:
        await stream.close()
    except Exception as exc:  # closing a broken stream must not mask the real error
        logger.debug("closing a forward stream failed: %s", exc)


async def swarm_model_config(
    discovery, client, timeout_s: float = 10.0, swarm_id: str | None = None
) -> tuple[ModelConfig, list]:
    """The model config of the swarm, from the first peer that answers; raises PeerUnavailable."""
    records = [r for r in await discovery.find_all() if r.address and not getattr(r, "client_mode", False)]
    if swarm_id:
        records = [r for r in records if getattr(r, "swarm_id", "") in ("", swarm_id)]
    if not records:
        where = f" {swarm_id!r}" if swarm_id else ""
        raise PeerUnavailable(f"no serving peers found in swarm{where}: is the address right and the swarm running?")
    for r in records:
        await pin_tls(client, r)
    model, _ = await ask_model_config(client, [r.address for r in records], swarm_id, timeout_s)
    return model, records


async def pin_tls(client, record) -> None:
    """A peer whose (signed, verified by discovery) record names a TLS certificate is dialled over TLS pinned
    to it (PeerClient.pin); one that cannot be pinned is logged and its calls fail like an unreachable peer's."""
    fingerprint = getattr(record, "tls_fingerprint", "")
    if fingerprint and record.address and hasattr(client, "pin"):
        try:
            await client.pin(record.address, fingerprint)
        except SwarmdError as exc:
            logger.warning("cannot pin the TLS certificate of %s: %s", record.address, exc)


async def check_coverage(router: BlockRouter, cfg: ModelConfig, records: list | None = None) -> None:
    """Raise PeerUnavailable naming the first block no reachable peer serves.

    :param records: a swarm-wide lookup's records (swarm_model_config's): the router starts from them, with no
        lookup per block (None: one lookup per block); every replica is then probed at once
    """
    if records is None:
        for b in range(cfg.blocks):
            await router.refresh(b)
    else:
        await router.seed(records, range(cfg.blocks))
    await router.probe_all()
    for b in range(cfg.blocks):
        await router.choose(b)


ConnectDiscovery = Callable[[list[str], str, Callable[[str], Awaitable[Any]]], Awaitable[Any]]


async def connect_swarm(
    swarm: list[str],
    swarm_id: str,
    connect_discovery: ConnectDiscovery,
    steps: int | None = None,
    timeout_s: float = 30.0,
    hop_delay_s: float = 0.0,
):
    """(RemoteSweeper, closer) for a swarm reached through multiaddrs or host:port addresses.

    :param connect_discovery: async (swarm, swarm_id, status_fn) -> a Discovery, e.g.
        swarmd.membership.discovery.connect_discovery (passed in: serve does not import swarm)
    The closer ends every session and shuts the client and the discovery down.
    """
    from swarmd.transport.client import PeerClient

    client = PeerClient()

    async def status_fn(address: str):
        return await client.status(address, timeout_s=min(timeout_s, 5.0))

    try:
        discovery = await connect_discovery(list(swarm), swarm_id, status_fn)
    except BaseException:
        await client.close()
        raise
    try:
        cfg, records = await swarm_model_config(discovery, client, min(timeout_s, 10.0), swarm_id)
        router = BlockRouter(discovery, client, cfg.config_hash(), swarm_id)
        await check_coverage(router, cfg, records)  # the swarm-wide lookup's records: no lookup per block
    except BaseException:
        await client.close()
        await discovery.shutdown()
        raise
    sweeper = RemoteSweeper(cfg, router, client, steps, timeout_s, hop_delay_s)

    async def closer() -> None:
        await sweeper.close()
        await client.close()
        await discovery.shutdown()

    return sweeper, closer


def _remember(history: dict[int, torch.Tensor], step: int, part: torch.Tensor, start: int) -> None:
    """Append the new positions' inputs of one step to a session's history (start 0 restarts it)."""
    history[step] = part if start == 0 else torch.cat([history[step], part], dim=1)
