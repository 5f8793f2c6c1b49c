"""Swarm inference client: route each sampler step to a peer holding its block, with failover.

Owns (the choice of replica is swarmd.serve.routing's BlockRouter, re-exported here):
  - `RemoteSweeper`: the swarm implementation of swarmd.serve.inference.Sweeper. One Forward stream per
    (session, block) for the session's life; every hop is timed into `trace`. For cached generation
    it keeps each step's input history (context bytes and z of every cached position) so a peer that
    lacks the session's cache (a fresh replica after failover, or one that evicted it) receives the
    whole prefix again with start_position 0 in the same call;
  - verification (swarmd.serve.verify, swarmd.serve.crosscheck): every answer passes range checks
    from the sampler math; with a VerifyPolicy, the first answer of every replica in a session and a share of
    the rest are recomputed on a second replica (majority of three when two disagree; with two of one base and
    no third, the client recomputes the hop from their pulled, verified weights: swarmd.serve.tiebreak). A peer
    found lying is dropped for the client's life (`BlockRouter.distrust`) and the sweep is redone without it: a
    cached session is rebuilt from position 0, since the dropped peer's answers are in other peers' caches (a hop
    whose named weights could not be had to settle a dispute is re-run the same way, crosscheck.Inconclusive); earlier
    uncached sweeps that used it are named by `tainted_sweeps()` for the caller to redo. A lone holder that
    answers out of range is refused with a one-line ValidationError;
  - `connect_swarm()`: discovery + model config lookup for the CLI, with one-line errors for an
    unknown swarm or a block that no peer serves; the swarm-wide lookup that finds the config also
    gives the router every block's holders (no lookup per block), all probed at once.
Talks to peers only through the PeerClient interface of swarmd.transport (status, swarm_config,
forward_session); never retries in a loop on one peer: failover means another replica.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from swarmd.core.config import ModelConfig
from swarmd.core.model import sampler_plan
from swarmd.errors import PeerUnavailable, SessionMissing, SwarmdError, ValidationError
from swarmd.protocol import ask_model_config
from swarmd.serve.crosscheck import CrossChecker, Inconclusive
from swarmd.serve.routing import BlockRouter, Replica, check_coverage, pin_tls
from swarmd.serve.tiebreak import StateChecks, TieBreaker
from swarmd.serve.verify import DEFAULT_SHARE, Answer, VerifyPolicy, VerifyStats, named_weights, out_of_range
from swarmd.serve.verify import Hop as HopInput
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
class _Session:
    streams: dict[int, tuple[Replica, Any]] = field(default_factory=dict)  # block -> (replica, forward stream)
    warm: dict[tuple[str, int], int] = field(default_factory=dict)  # (address, step) -> positions cached there
    x_hist: torch.Tensor | None = None  # (n, positions) context of every cached position
    z_hist: dict[int, torch.Tensor] = field(default_factory=dict)  # step -> (n, positions, d) inputs
    m_hist: dict[int, torch.Tensor] = field(default_factory=dict)  # step -> (n, positions, message_dim) inputs
    used: list[set[str]] = field(default_factory=list)  # per finished sweep: addresses whose answers it used
    current: set[str] = field(default_factory=set)  # addresses whose answers the sweep in flight used


class _Redo(Exception):
    """A peer whose answers this sweep (or a cached session) used was dropped: run the sweep again."""


MAX_REDOS = 4  # sweeps redone in a row before giving up (each drops at least one peer)


def unpack_reply(
    cfg: ModelConfig, reply: pb.ForwardReply, shape: tuple[int, int], final: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A Forward reply's tensors, checked against the shapes asked for: (logits at the last step, else the next z;
    the message for the next step when the config passes one)."""
    n, t = shape
    if final:
        return from_proto(reply.logits, expect_shape=(n, t, cfg.vocab), expect_dtype="float32"), None
    z = from_proto(reply.z, expect_shape=(n, t, cfg.d_model), expect_dtype="float32")
    width = cfg.message_dim
    if not width:
        return z, None
    if not reply.HasField("message"):
        raise ValidationError(f"peer {reply.peer_id or '?'} replied without the step's message")
    return z, from_proto(reply.message, expect_shape=(n, t, width), expect_dtype="float32")


class RemoteSweeper:
    """swarmd.serve.inference.Sweeper over the swarm: step i of the sampler runs on a peer of its block.

    :param hop_delay_s: injected user-space delay awaited before every hop (benchmarks only)
    :param timeout_s: a call slower than this counts as a stalled peer and fails over
    :param max_failovers: replicas tried per step before giving up
    :param verify: which hops get a second opinion (None: none; range checks always run)
    :param state_checks: how pulled states are validated (swarmd.serve.tiebreak); None: two replicas of one base
        that disagree with no third are refused instead of told apart by recomputation
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
        verify: VerifyPolicy | None = None,
        state_checks: StateChecks | None = None,
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
        self.verify = verify or VerifyPolicy(share=0.0)
        self.stats = VerifyStats()
        tiebreaker = None
        if state_checks is not None:  # two replicas of one base that disagree: recompute the hop from their weights
            tiebreaker = TieBreaker(cfg, client, router.swarm_id or "", state_checks, self.stats, max(timeout_s, 60.0))
        unpack = functools.partial(unpack_reply, cfg)
        self.checker = CrossChecker(cfg, router, client, self.verify, self.stats, unpack, timeout_s, tiebreaker)

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
        xs, zs, start = x, z, start_position
        for _ in range(MAX_REDOS + 1):
            try:
                out = await self._sweep_once(session_id, sess, xs, zs, start, use_cache)
            except _Redo:
                self.stats.redone_sweeps += 1
                if use_cache and sess.x_hist is not None and start > 0:  # rebuild every cache from clean inputs
                    xs, zs, start = torch.cat([sess.x_hist, x], 1), torch.cat([sess.z_hist[0], z], 1), 0
                    sess.warm = {}
                continue
            if use_cache and start == 0:  # every cache was rebuilt: earlier sweeps' answers are in none of them
                sess.used = []
            sess.used.append(sess.current)
            return out[:, -x.shape[1] :]
        raise PeerUnavailable(f"dropped peers in {MAX_REDOS} sweeps in a row; giving up")

    async def _sweep_once(
        self, session_id: str, sess: _Session, x: torch.Tensor, z: torch.Tensor, start: int, use_cache: bool
    ) -> torch.Tensor:
        """One traversal of the plan; the session's input history is changed only when it completes."""
        sess.current = set()
        out, message = None, None  # message: what the previous step hands this one besides z (None at step 0)
        inputs: list[tuple[int, torch.Tensor, torch.Tensor | None]] = []
        for i, (b, sigma, sigma_next) in enumerate(self.plan):
            out, message_next = await self._step(
                session_id, sess, i, b, sigma, sigma_next, x, z, message, start, use_cache
            )
            inputs.append((i, z, message))
            z, message = out, message_next
        if out is None:
            raise RuntimeError("the sampler plan has no steps")
        if use_cache:
            for i, zi, mi in inputs:
                _remember(sess.z_hist, i, zi, start)
                if mi is not None:
                    _remember(sess.m_hist, i, mi, start)
            sess.x_hist = x if sess.x_hist is None or start == 0 else torch.cat([sess.x_hist, x], dim=1)
        return out

    def tainted_sweeps(self, session_id: str) -> list[int]:
        """Indices (in call order) of the session's finished sweeps that used a peer dropped since."""
        sess = self._sessions.get(session_id)
        if sess is None:
            return []
        return [k for k, used in enumerate(sess.used) if used & self.router.distrusted.keys()]

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
            check = self.checker.start(session_id, b, replica, *self._uncached(req, sess, i, x, z, message, start))
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
                _cancel(check)
                continue
            except SessionMissing:
                _cancel(check)
                if resend:
                    raise
                sess.warm.pop((replica.address, i), None)  # the peer evicted our cache: re-send to it
                continue
            except BaseException:
                _cancel(check)
                raise
            finally:
                replica.inflight -= 1
            seconds = time.perf_counter() - t0
            self.router.report_latency(replica, seconds)
            try:
                out, message_out = unpack_reply(self.cfg, reply, xs.shape, sigma_next is None)
                weights = named_weights(reply)  # the weights this answer names: a tie-break recomputes from those
                why = out_of_range(self.cfg, HopInput(zs, sigma, sigma_next), Answer(out, message_out))
            except ValidationError as exc:  # wrong shape or dtype, NaN or inf: no honest peer sends it
                why = f"a malformed answer ({exc})"
            if why:
                _cancel(check)
                if not self.checker.others(b, {replica.address}):
                    raise ValidationError(
                        f"block {b}: {replica.address}, the only peer serving it, sent {why}; "
                        "refusing an unverifiable answer"
                    )
                if self._drop(sess, replica, f"sent {why}", use_cache):
                    raise _Redo
                last_exc = ValidationError(why)
                tried.add(replica.address)
                continue
            self.trace.append(Hop(i, b, replica.address, xs.numel(), seconds, reply.compute_s, resend))
            if use_cache:
                sess.warm[(replica.address, i)] = s0 + xs.shape[1]
            if resend:  # the reply covers the re-sent prefix too; the caller wants the new positions
                out = out[:, -x.shape[1] :]
                message_out = None if message_out is None else message_out[:, -x.shape[1] :]
            if check is not None:
                try:
                    drops = await self.checker.settle(
                        check, replica, HopInput(z, sigma, sigma_next), Answer(out, message_out, weights)
                    )
                except Inconclusive as exc:  # its named weights could not be had: ask again (counted per replica)
                    logger.info("%s", exc)
                    raise _Redo from None
                tainted = [self._drop(sess, r, why, use_cache) or r is replica for r, why in drops]
                if any(tainted):
                    raise _Redo
                if drops:  # the checker was the liar: is anybody left to check this block?
                    self.checker.lone(b, replica.address)
            sess.current.add(replica.address)
            self.stats.hops += 1
            return out, message_out
        raise PeerUnavailable(f"block {b}: every replica tried failed (last: {last_exc or 'timeout'})")

    def _uncached(self, req: pb.ForwardRequest, sess: _Session, i: int, x, z, message, start: int):
        """(the hop as one uncached request over the whole prefix, its z): what a checker is asked."""
        check = pb.ForwardRequest()
        check.CopyFrom(req)
        check.session_id, check.start_position, check.use_cache = f"verify-{req.session_id}"[:128], 0, False
        if req.use_cache and start > 0 and sess.x_hist is not None:  # the cached positions' inputs too
            x = torch.cat([sess.x_hist, x], 1)
            z = torch.cat([sess.z_hist[i], z], 1)
            message = None if message is None else torch.cat([sess.m_hist[i], message], 1)
            check.context.CopyFrom(to_proto(x.to(torch.uint8), self.compress))
            check.z.CopyFrom(to_proto(z.float(), self.compress))
            if message is not None:
                check.message.CopyFrom(to_proto(message.float(), self.compress))
        return check, z.float()

    def _drop(self, sess: _Session, replica: Replica, why: str, use_cache: bool) -> bool:
        """Drop a lying peer for the client's life; whether answers of it are in this sweep (or cached session)."""
        self.router.distrust(replica.address, why)
        self.stats.dropped[replica.address] = why
        for s in self._sessions.values():
            for b, (held, stream) in list(s.streams.items()):
                if held.address == replica.address:
                    del s.streams[b]
                    task = asyncio.ensure_future(_quiet_close(stream))
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)
            for key in [k for k in s.warm if k[0] == replica.address]:
                del s.warm[key]
        return replica.address in sess.current or (use_cache and any(replica.address in u for u in sess.used))

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

    async def end_session(self, session_id: str) -> None:
        sess = self._sessions.pop(session_id, None)
        self.verify.forget(session_id)
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
        await self.checker.close()


def _cancel(check) -> None:
    if check is not None:
        check.cancel()


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


ConnectDiscovery = Callable[[list[str], str, Callable[[str], Awaitable[Any]]], Awaitable[Any]]


async def connect_swarm(
    swarm: list[str],
    swarm_id: str,
    connect_discovery: ConnectDiscovery,
    steps: int | None = None,
    timeout_s: float = 30.0,
    hop_delay_s: float = 0.0,
    verify_share: float = DEFAULT_SHARE,
    state_checks: StateChecks | None = None,
):
    """(RemoteSweeper, closer) for a swarm reached through multiaddrs or host:port addresses.

    :param connect_discovery: async (swarm, swarm_id, status_fn) -> a Discovery, e.g.
        swarmd.membership.discovery.connect_discovery (passed in: serve does not import swarm)
    :param verify_share: chance a hop is recomputed on a second replica (swarmd.serve.verify; 0: range checks only)
    :param state_checks: validation of pulled states for tie-breaks by recomputation (swarmd.serve.tiebreak;
        passed in, e.g. by cli.common: serve does not import membership or averaging)
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
    policy = VerifyPolicy(verify_share)
    sweeper = RemoteSweeper(
        cfg, router, client, steps, timeout_s, hop_delay_s, verify=policy, state_checks=state_checks
    )

    async def closer() -> None:
        await sweeper.close()
        await client.close()
        await discovery.shutdown()

    return sweeper, closer


def _remember(history: dict[int, torch.Tensor], step: int, part: torch.Tensor, start: int) -> None:
    """Append the new positions' inputs of one step to a session's history (start 0 restarts it)."""
    history[step] = part if start == 0 else torch.cat([history[step], part], dim=1)
