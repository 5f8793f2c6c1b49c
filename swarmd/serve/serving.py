"""BlockServing: one peer's inference service for its block (the daemon's Forward RPC delegates here).

Owns, for one block:
  - the weight snapshot inference reads: `update_weights()` swaps in a new (block, table) pair as one
    reference, so a request always runs on one consistent snapshot while training goes on, and a
    cached session keeps the snapshot it started on until it ends (its caches stay coherent); every
    reply names the hashes of the snapshot that computed it, and `served` (swarmd.serve.snapshots)
    keeps the recent ones pullable by those hashes;
  - validation of every ForwardRequest (config hash, block index, dtypes, shapes, positions, finite
    values, and the previous step's message where the config passes one) before any math, raising
    swarmd.errors types the transport maps to status codes;
  - per-(session, step_index) KV caches for incremental decoding, LRU-evicted beyond max_sessions
    sessions (a client that finds its session gone re-sends the prefix from start_position 0);
  - batching: requests that arrive while the worker is busy queue up, and the next round runs every
    compatible group (same sigmas, positions and cache length) as one batch.
Runs torch in one worker thread at a time (asyncio.to_thread); no grpc, no filesystem.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from swarmd.core.config import ModelConfig
from swarmd.core.model import DenoisingBlock, euler_step
from swarmd.errors import ConfigMismatch, NotFound, SessionMissing, SwarmdError, ValidationError, WrongBlock
from swarmd.protocol import PeerState, swarm_config
from swarmd.serve.snapshots import KEEP, ServedWeights, Snapshot
from swarmd.v1 import swarm_pb2 as pb
from swarmd.wire import from_proto, to_proto

logger = logging.getLogger(__name__)

MAX_SESSION_ID = 128  # characters
MAX_ROWS = 256  # sequences per request
SIGMA_SLACK = 16.0  # sigma must lie in [sigma_lo / this, sigma_hi * this] (sampler steps use [sigma_lo, sigma_hi])
Z_LIMIT_PER_SIGMA = 64.0  # |z| <= this x (sigma_hi + 1): ~10x the largest honest |z| (x0 + sigma x a gaussian)
MESSAGE_LIMIT = 1e4  # |message| <= this
DEFAULT_CACHE_BYTES = 512 << 20  # KV caches of all sessions and sampler steps together


@dataclass
class _Session:
    snapshot: Snapshot
    caches: dict[int, tuple[int, list[dict]]] = field(default_factory=dict)  # step_index -> (positions, KV per layer)


@dataclass
class _Job:
    request: pb.ForwardRequest
    x: torch.Tensor  # (n, t) int64
    z: torch.Tensor  # (n, t, d) fp32
    message: torch.Tensor | None  # (n, t, message_dim) fp32: the previous step's message; None at step 0 / none passed
    future: asyncio.Future


@dataclass(frozen=True)
class SessionInfo:
    """A read-only view of one cached session (status, tests)."""

    snapshot_version: int  # the weights version the session runs on (kept across weight updates)
    cached_positions: dict[int, int]  # step_index -> positions its KV cache holds


@dataclass
class ServingStats:
    requests: int = 0
    batches: int = 0
    max_batch_requests: int = 0  # most requests ever run as one batch
    evicted_sessions: int = 0
    evicted_caches: int = 0  # (session, step) caches dropped to stay within max_cache_bytes
    compute_s: float = 0.0


class BlockServing:
    """Serve one block's sampler steps.

    :param cfg: the model config peers must share (its hash is checked on every request)
    :param block_index: the block this peer serves
    :param device: torch device of the inference copy of the block
    :param max_sessions: cached sessions kept; the least recently used one is dropped beyond this
    :param max_batch_rows: most sequences run in one batch
    :param max_cache_bytes: KV caches of all sessions and steps together; the least recently used
        (session, step) cache is dropped beyond it (its next request gets SessionMissing and re-sends)
    """

    def __init__(
        self,
        cfg: ModelConfig,
        block_index: int,
        device: str = "cpu",
        max_sessions: int = 64,
        max_batch_rows: int = 256,
        peer_id: str = "",
        max_cache_bytes: int = DEFAULT_CACHE_BYTES,
        keep_snapshots: int = KEEP,
    ):
        if not 0 <= block_index < cfg.blocks:
            raise ValueError(f"block_index {block_index} outside [0, {cfg.blocks})")
        self.cfg, self.block_index, self.device = cfg, block_index, device
        self.config_hash = cfg.config_hash()
        self.max_sessions, self.max_batch_rows, self.peer_id = max_sessions, max_batch_rows, peer_id
        self.stats = ServingStats()
        self._snapshot: Snapshot | None = None
        self.served = ServedWeights(keep_snapshots)  # snapshots pullable by the hashes replies name
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self.max_cache_bytes = max_cache_bytes
        self.cache_bytes = 0  # bytes of every cached KV tensor (all sessions and steps)
        self._cache_lru: OrderedDict[tuple[str, int], int] = OrderedDict()  # (session, step) -> bytes, LRU first
        self._lock = threading.Lock()  # guards _sessions between the loop thread and the worker
        self._pending: list[_Job] = []
        self._worker: asyncio.Task | None = None

    # -- weights ---------------------------------------------------------------------------------
    def update_weights(
        self,
        block_state_dict: dict[str, torch.Tensor],
        table: torch.Tensor,
        block_hash: str = "",
        emb_hash: str = "",
        emb_state: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Install a new snapshot (a private copy): the block's state dict and the byte table (V, d).

        :param block_hash: weights_hash(block_state_dict), emb_hash: weights_hash(emb_state), emb_state: the
            embedding state holding `table`: with all three, replies name the snapshot and a pull by hash gets it
        """
        block = DenoisingBlock(self.cfg)
        block.load_state_dict({k: v.detach().to("cpu", copy=True) for k, v in block_state_dict.items()})
        table_hat = F.normalize(table.detach().float().to("cpu", copy=True), dim=-1)
        if tuple(table_hat.shape) != (self.cfg.vocab, self.cfg.d_model):
            raise ValueError(f"byte table of shape {list(table_hat.shape)} does not fit the config")
        version = self._snapshot.version + 1 if self._snapshot else 1
        snap = Snapshot(version, block.to(self.device).eval(), table_hat.to(self.device))
        if block_hash and emb_hash and emb_state is not None:  # named: replies carry the hashes, pulls find it
            snap.block_hash, snap.emb_hash = block_hash, emb_hash
            snap.emb_state = {k: v.detach().to("cpu", copy=True) for k, v in emb_state.items()}
            self.served.add(snap)
        self._snapshot = snap

    @property
    def ready(self) -> bool:
        return self._snapshot is not None

    @property
    def weights_version(self) -> int:
        """Version of the installed weights: 1 for the first update_weights, +1 each after; 0 before any."""
        return self._snapshot.version if self._snapshot else 0

    def sessions(self) -> int:
        return len(self._sessions)

    def session_info(self, session_id: str) -> SessionInfo | None:
        """What a cached session holds, or None when it is not (or no longer) cached."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            cached = {step: positions for step, (positions, _) in session.caches.items()}
            return SessionInfo(session.snapshot.version, cached)

    # -- requests --------------------------------------------------------------------------------
    async def forward(self, request: pb.ForwardRequest) -> pb.ForwardReply:
        """Validate, queue for the next batch, and answer with the next z (or logits when final)."""
        self._check_header(request)
        if request.end_session:
            with self._lock:
                self._drop_session(request.session_id)
            return pb.ForwardReply(peer_id=self.peer_id)
        x, z, message = self._check_tensors(request)
        if self._snapshot is None:
            raise SwarmdError(f"block {self.block_index} has no weights yet")
        job = _Job(request, x, z, message, asyncio.get_running_loop().create_future())
        self._pending.append(job)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await job.future

    def _check_header(self, r: pb.ForwardRequest) -> None:
        if r.config_hash != self.config_hash:
            raise ConfigMismatch(
                f"request is for model config {r.config_hash or '(none)'}, this peer serves {self.config_hash}"
            )
        if r.block_index != self.block_index:
            raise WrongBlock(f"this peer serves block {self.block_index}, not block {r.block_index}")
        if len(r.session_id) > MAX_SESSION_ID:
            raise ValidationError(f"session_id longer than {MAX_SESSION_ID} characters")
        if (r.use_cache or r.end_session) and not r.session_id:
            raise ValidationError("a cached request needs a session_id")

    def _check_tensors(self, r: pb.ForwardRequest) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The request's (context, z, message), validated against our config (request_tensors)."""
        return request_tensors(r, self.cfg)

    # -- batching --------------------------------------------------------------------------------
    async def _drain(self) -> None:
        """Run queued jobs in rounds until none are left; each round batches compatible jobs."""
        while self._pending:
            jobs, self._pending = self._pending, []
            jobs = [j for j in jobs if not j.future.done()]  # callers that gave up
            try:
                results, deferred = await asyncio.to_thread(self._run_round, jobs)
            except Exception as exc:  # a bug or OOM in the math: fail this round's callers, keep serving
                logger.exception("block %d: inference round failed", self.block_index)
                for j in jobs:
                    if not j.future.done():
                        j.future.set_exception(SwarmdError(f"block {self.block_index} inference failed: {exc}"))
                continue
            self._pending[:0] = deferred
            for job, result in results:
                if job.future.done():
                    continue
                if isinstance(result, BaseException):
                    job.future.set_exception(result)
                else:
                    job.future.set_result(result)

    def _run_round(self, jobs: list[_Job]) -> tuple[list[tuple[_Job, object]], list[_Job]]:
        """Worker thread: group jobs by what can share one batch, run each group, split the results."""
        results: list[tuple[_Job, object]] = []
        deferred: list[_Job] = []
        groups: dict[tuple, list[tuple[_Job, Snapshot, list[dict] | None]]] = {}
        seen: set[tuple[str, int]] = set()
        current = self._snapshot
        if current is None:  # forward() checks this before queueing
            raise RuntimeError(f"block {self.block_index} has no weights yet")
        for job in jobs:
            r = job.request
            key_session = (r.session_id, r.step_index)
            if r.use_cache and key_session in seen:  # same session and step twice: the second waits for the first
                deferred.append(job)
                continue
            try:
                snap, cache, past = self._session_cache(r, current) if r.use_cache else (current, None, 0)
            except SwarmdError as exc:
                results.append((job, exc))
                continue
            seen.add(key_session)
            key = (
                snap.version,
                r.use_cache,
                past,
                job.x.shape[1],
                r.sigma,
                None if r.final else r.sigma_next,
                job.message is not None,
            )
            groups.setdefault(key, []).append((job, snap, cache))
        for key, members in groups.items():
            for chunk in _chunks(members, self.max_batch_rows):
                results.extend(self._run_group(chunk, key[1], key[2]))
        return results, deferred

    def _session_cache(self, r: pb.ForwardRequest, current: Snapshot) -> tuple[Snapshot, list[dict], int]:
        with self._lock:
            session = self._sessions.get(r.session_id)
            if r.start_position == 0:
                if session is None or r.step_index in session.caches:  # new session, or a restart (re-window, re-send)
                    self._drop_session(r.session_id)
                    session = _Session(current)
                self._sessions[r.session_id] = session
                self._sessions.move_to_end(r.session_id)
                while len(self._sessions) > self.max_sessions:
                    dropped = next(iter(self._sessions))
                    self._drop_session(dropped)
                    self.stats.evicted_sessions += 1
                    logger.info(
                        "block %d: evicted session %s (LRU, %d kept)", self.block_index, dropped, self.max_sessions
                    )
                return session.snapshot, session.snapshot.block.new_cache(), 0
            held = session.caches.get(r.step_index) if session else None
            if session is None or held is None or held[0] != r.start_position:
                have = held[0] if held else 0
                raise SessionMissing(
                    f"session {r.session_id} step {r.step_index} holds {have} positions, request starts at "
                    f"{r.start_position}: re-send the prefix from position 0"
                )
            self._sessions.move_to_end(r.session_id)
            self._cache_lru.move_to_end((r.session_id, r.step_index))
            return session.snapshot, held[1], r.start_position

    def _drop_session(self, session_id: str) -> None:
        """Forget a session and its caches (call under self._lock)."""
        session = self._sessions.get(session_id)
        if session is not None:
            for step in list(session.caches):
                self._drop_cache(session_id, step)
            del self._sessions[session_id]

    def _drop_cache(self, session_id: str, step: int) -> None:
        """Forget one (session, step) cache and its bytes (call under self._lock)."""
        self.cache_bytes -= self._cache_lru.pop((session_id, step), 0)
        session = self._sessions.get(session_id)
        if session is not None:
            session.caches.pop(step, None)

    @torch.no_grad()
    def _run_group(
        self, members: list[tuple[_Job, Snapshot, list[dict] | None]], use_cache: bool, past: int
    ) -> list[tuple[_Job, object]]:
        t0 = time.perf_counter()
        first, snap, _ = members[0]
        r = first.request
        x = torch.cat([j.x for j, _, _ in members]).to(self.device)
        z = torch.cat([j.z for j, _, _ in members]).to(self.device)
        messages = [j.message for j, _, _ in members if j.message is not None]  # all or none: part of the group key
        pred = torch.cat(messages).to(self.device) if messages else None
        rows = [j.x.shape[0] for j, _, _ in members]
        cache = None
        if use_cache:
            cache = snap.block.new_cache()
            if past > 0:
                for li, layer_cache in enumerate(cache):
                    for kv in ("k", "v"):
                        layer_cache[kv] = torch.cat([c[li][kv] for _, _, c in members if c is not None])
        logits, z_next, message = euler_step(
            snap.block, snap.table_hat, x, z, r.sigma, None if r.final else r.sigma_next, cache, pred=pred
        )
        out = (logits if r.final else z_next).float().cpu()
        message_out = None if r.final or message is None else message.float().cpu()
        compute_s = time.perf_counter() - t0
        self.stats.requests += len(members)
        self.stats.batches += 1
        self.stats.max_batch_requests = max(self.stats.max_batch_requests, len(members))
        self.stats.compute_s += compute_s
        results: list[tuple[_Job, object]] = []
        offset = 0
        for (job, _, _), n in zip(members, rows):
            mine = slice(offset, offset + n)
            if not (
                bool(torch.isfinite(out[mine]).all())
                and (message_out is None or torch.isfinite(message_out[mine]).all())
            ):
                offset += n  # never answer (or cache) non-finite values: the request's inputs are out of range
                results.append((job, ValidationError("the request's inputs give non-finite outputs (out of range)")))
                continue
            if cache is not None:
                split = [{kv: layer_cache[kv][mine] for kv in ("k", "v")} for layer_cache in cache]
                self._store(job.request, snap, past + x.shape[1], split)
            offset += n
            reply = pb.ForwardReply(
                compute_s=compute_s, peer_id=self.peer_id, block_hash=snap.block_hash, emb_hash=snap.emb_hash
            )
            (reply.logits if r.final else reply.z).CopyFrom(to_proto(out[mine].contiguous()))
            if message_out is not None:
                reply.message.CopyFrom(to_proto(message_out[mine].contiguous()))
            results.append((job, reply))
        return results

    def _store(self, r: pb.ForwardRequest, snap: Snapshot, positions: int, cache: list[dict]) -> None:
        with self._lock:
            session = self._sessions.get(r.session_id)
            if session is None or session.snapshot is not snap:  # evicted meanwhile (or restarted)
                return
            size = sum(t.numel() * t.element_size() for layer in cache for t in layer.values())
            self._drop_cache(r.session_id, r.step_index)
            if size > self.max_cache_bytes:
                return  # larger than the whole budget: not cached (the next request re-sends from position 0)
            session.caches[r.step_index] = (positions, cache)
            self._cache_lru[(r.session_id, r.step_index)] = size
            self.cache_bytes += size
            while self.cache_bytes > self.max_cache_bytes:
                sid, step = next(iter(self._cache_lru))
                self._drop_cache(sid, step)
                self.stats.evicted_caches += 1


def request_tensors(r: pb.ForwardRequest, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A Forward request's (context, z, message), checked against `cfg` before anything is computed: noise levels
    in range, shapes within seq_len and MAX_ROWS, byte values in the vocabulary, z and the message bounded
    (ValidationError otherwise)."""
    lo, hi = cfg.sigma_lo / SIGMA_SLACK, cfg.sigma_hi * SIGMA_SLACK
    if not (math.isfinite(r.sigma) and lo <= r.sigma <= hi):
        raise ValidationError(f"sigma must be finite and in [{lo:g}, {hi:g}], got {r.sigma}")
    if not r.final and not (math.isfinite(r.sigma_next) and 0 <= r.sigma_next <= hi):
        raise ValidationError(f"sigma_next must be finite and in [0, {hi:g}], got {r.sigma_next}")
    if r.step_index < 0 or r.start_position < 0:
        raise ValidationError("step_index and start_position must be >= 0")
    if not r.use_cache and r.start_position != 0:
        raise ValidationError("start_position > 0 needs use_cache")
    if not r.HasField("context") or not r.HasField("z"):
        raise ValidationError("a forward request needs context and z")
    if len(r.context.shape) != 2:
        raise ValidationError(f"context must be (n, t), got shape {list(r.context.shape)}")
    n, t = r.context.shape
    if not (1 <= n <= MAX_ROWS and 1 <= t <= cfg.seq_len):
        raise ValidationError(f"context shape {[n, t]} outside [1..{MAX_ROWS}] x [1..{cfg.seq_len}]")
    if r.start_position + t > cfg.seq_len:
        raise ValidationError(f"positions {r.start_position}..{r.start_position + t - 1} exceed seq_len {cfg.seq_len}")
    limit = n * t * cfg.d_model * 4 + 1024
    x = from_proto(r.context, max_bytes=limit, expect_shape=(n, t), expect_dtype="uint8").long()
    z = from_proto(r.z, max_bytes=limit, expect_shape=(n, t, cfg.d_model), expect_dtype="float32")
    _check_range("z", z, Z_LIMIT_PER_SIGMA * (cfg.sigma_hi + 1))
    if bool((x >= cfg.vocab).any()):
        raise ValidationError(f"context holds a byte >= the vocabulary size {cfg.vocab}")
    message = _request_message(r, cfg, n, t)
    if message is not None:
        _check_range("message", message, MESSAGE_LIMIT)
    return x, z, message


def _request_message(r: pb.ForwardRequest, cfg: ModelConfig, n: int, t: int) -> torch.Tensor | None:
    """The previous step's message: required iff the config passes one and this is not step 0."""
    width = cfg.message_dim
    wanted = width > 0 and r.step_index > 0
    if r.HasField("message") != wanted:
        why = (
            "this model passes no message"
            if width == 0
            else f"step {r.step_index} "
            + ("needs the previous step's message" if wanted else "is the first step and takes no message")
        )
        raise ValidationError(f"forward request: {why}")
    if not wanted:
        return None
    limit = n * t * width * 4 + 1024
    return from_proto(r.message, max_bytes=limit, expect_shape=(n, t, width), expect_dtype="float32")


def _check_range(name: str, t: torch.Tensor, limit: float) -> None:
    """ValidationError unless every value of t lies in [-limit, limit] (from_proto already refused non-finite)."""
    peak = float(t.abs().max()) if t.numel() else 0.0
    if peak > limit:
        raise ValidationError(f"{name} holds values beyond +-{limit:g} (got {peak:.3g})")


def _chunks(members: list, max_rows: int):
    chunk: list = []
    rows = 0
    for m in members:
        n = m[0].x.shape[0]
        if chunk and rows + n > max_rows:
            yield chunk
            chunk, rows = [], 0
        chunk.append(m)
        rows += n
    if chunk:
        yield chunk


class ServingOnlyHandler:
    """A SwarmHandler that only serves inference for one block (benchmarks, tests, inference-only peers).

    Answers GetStatus/GetConfig so discovery and clients can find it; refuses state and gossip.
    Start it with swarmd.transport.hosting.start_server(handler) and then set `address`.
    """

    def __init__(self, serving: BlockServing, swarm_id: str = "blocktrain", peer_id: str = ""):
        self.serving, self.swarm_id = serving, swarm_id
        self.peer_id = peer_id or serving.peer_id or f"serve-{serving.block_index}"
        self.address = ""
        self._started = time.monotonic()

    def status(self) -> pb.PeerStatus:
        return pb.PeerStatus(
            peer_id=self.peer_id,
            block_index=self.serving.block_index,
            state=PeerState.SERVING.to_pb(),
            address=self.address,
            swarm_id=self.swarm_id,
            config_hash=self.serving.config_hash,
            uptime_s=time.monotonic() - self._started,
            last_ce=math.nan,
            train_ce=math.nan,
        )

    def swarm_config(self) -> pb.SwarmConfig:
        return swarm_config(self.swarm_id, self.serving.cfg)

    async def pull_state(self, request: pb.PullStateRequest):
        raise NotFound("this peer serves inference only")

    async def exchange(self, incoming):
        raise NotFound("this peer serves inference only")

    async def forward(self, request: pb.ForwardRequest) -> pb.ForwardReply:
        return await self.serving.forward(request)
