"""Tie-break by recomputation: when replicas of one base disagree and no majority breaks the tie, the client
pulls the weights each disputing replica serves, recomputes the hop from them, and names the replica that lied.

Owns `TieBreaker`, which swarmd.serve.crosscheck.CrossChecker calls when a hop has no majority:
  - the weights: PullState (BLOCK_STATE, and EMBEDDING_STATE for the byte table) from each disputing replica,
    fp32, which must come signed by the peer asked and decode to our shapes (the checks are `StateChecks`:
    swarmd.membership.trust.verify_payload, swarmd.averaging.delta.decode and swarmd.averaging.state.weights_hash,
    passed in because serve imports neither package). A state that fails those is not the peer's own: a lie. A
    peer that cannot be reached, or refuses PullState (an inference-only peer), is only skipped;
  - the verdict: a replica whose answer is not what the weights it serves compute (swarmd.serve.verify.divergence
    against the same-base tolerance, the hop in its uncached form on the client's CPU) lied. Where every one
    answers by the weights it serves and those differ, the one whose weights hash to what the records announce
    wins if exactly one does; else there is no verdict. A served hash that differs from a record is no lie by
    itself: a training replica merges a round or more between its record and the pull;
  - the cost bound: each replica is pulled at most once per announced base (a failure is remembered too), local
    blocks and tables are shared by hash, so a liar cannot make the client download again and again. Counts and
    seconds go to VerifyStats (state_downloads, failed_pulls, tiebreak_s).
Where no weights can be had (every pull fails) there is no verdict: `settle()` returns None and the caller
refuses the hop with one line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from swarmd.core.config import ModelConfig
from swarmd.core.model import ByteEmbedding, DenoisingBlock, euler_step
from swarmd.errors import SwarmdError
from swarmd.protocol import PayloadKind
from swarmd.serve.verify import Answer, Hop, VerifyStats, divergence
from swarmd.v1 import swarm_pb2 as pb
from swarmd.wire import from_proto

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StateChecks:
    """How a pulled state is validated (the functions of swarmd.membership / swarmd.averaging, passed in)."""

    verify_payload: Callable[[Any], None]  # raises on a payload not signed by the peer its header names
    decode: Callable[..., dict[str, torch.Tensor]]  # swarmd.averaging.delta.decode's signature
    weights_hash: Callable[[dict[str, torch.Tensor]], str]  # the hash records announce


class _Lie(Exception):
    """A pulled state that proves its sender served weights other than those its record announces."""


@dataclass(frozen=True)
class _Served:
    """The weights one replica serves: its block and row-normalised byte table, and their hashes."""

    block: DenoisingBlock
    table_hat: torch.Tensor
    block_hash: str
    table_hash: str


class TieBreaker:
    """Recompute a disputed hop from a replica's verified weights (see the module doc).

    :param client: a PeerClient (needs `async pull_state(address, request, timeout_s)`)
    :param swarm_id: the swarm the pull requests name ("" where the swarm has none)
    :param timeout_s: deadline of one state pull, in seconds
    """

    def __init__(
        self, cfg: ModelConfig, client, swarm_id: str, checks: StateChecks, stats: VerifyStats, timeout_s: float = 60.0
    ):
        self.cfg, self.client, self.swarm_id, self.checks, self.stats = cfg, client, swarm_id, checks, stats
        self.timeout_s = timeout_s
        self._blocks: dict[tuple[int, str], DenoisingBlock] = {}  # (block, base_hash) -> verified local block
        self._tables: dict[str, torch.Tensor] = {}  # emb_hash -> verified row-normalised table
        self._served_by: dict[tuple[str, str, str], _Served | Exception] = {}  # (address, announced hashes) -> pull
        self._block_shapes = {k: tuple(v.shape) for k, v in DenoisingBlock(cfg).state_dict().items()}
        self._emb_shapes = {k: tuple(v.shape) for k, v in ByteEmbedding(cfg).state_dict().items()}

    async def settle(
        self, hop: Hop, request: pb.ForwardRequest, answers: dict[str, Answer], replicas: dict[str, Any], tol: float
    ) -> list[tuple[Any, str]] | None:
        """[(replica, why)] to drop for the disputed hop, or None when no verdict is possible.

        :param hop: the hop's new positions (what `answers` cover); request: the hop in its uncached form
        :param replicas: address -> Replica (records announcing one base_hash / emb_hash)
        """
        t0 = time.perf_counter()
        try:
            return await self._settle(hop, request, answers, replicas, tol)
        finally:
            self.stats.tiebreak_s += time.perf_counter() - t0

    async def _settle(self, hop, request, answers, replicas, tol) -> list[tuple[Any, str]] | None:
        b = request.block_index
        records = [r.record for r in replicas.values()]
        base, emb = getattr(records[0], "base_hash", ""), getattr(records[0], "emb_hash", "")
        drops: list[tuple[Any, str]] = []
        consistent: dict[str, _Served] = {}  # address -> the weights it serves, which its answer agrees with
        for address in sorted(answers):
            replica = replicas[address]
            try:
                served = await self._served(replica, b)
            except _Lie as exc:
                self.stats.failed_pulls += 1
                drops.append((replica, f"served a state that is not its own ({exc})"))
                continue
            except SwarmdError as exc:  # unreachable, or no PullState (inference-only): cannot be judged
                self.stats.failed_pulls += 1
                logger.info("block %d: cannot pull the state of %s to break a tie: %s", b, address, exc)
                continue
            local = await asyncio.to_thread(self._recompute, served.block, served.table_hat, request, hop)
            gap = divergence(hop, answers[address], local)
            if gap > tol:
                drops.append(
                    (replica, f"its answer disagrees with the recomputation from the weights it serves ({gap:.3g})")
                )
            else:
                consistent[address] = served
        if len(consistent) > 1 and len({(w.block_hash, w.table_hash) for w in consistent.values()}) > 1:
            # each answers by the weights it serves, and they differ: the ones that serve what the records announce
            # win; where none or several do, there is no verdict
            announced = [a for a, w in consistent.items() if (w.block_hash, w.table_hash) == (base, emb)]
            if len(announced) != 1:
                return drops or None
            drops += [
                (replicas[a], "serves and answers by weights other than its record announces")
                for a in consistent
                if a not in announced
            ]
        if not drops and not consistent:
            return None  # nothing could be pulled: no verdict
        self.stats.tiebreaks += 1
        logger.info("block %d step %d: tie broken by recomputation: %s", b, request.step_index, drops or "no liar")
        return drops

    async def _served(self, replica, b: int) -> _Served:
        """The block and byte table `replica` serves now (pulled at most once per replica and announced base, so
        a liar cannot make the client download again and again; verified copies are shared by hash)."""
        record = replica.record
        key = (replica.address, getattr(record, "base_hash", ""), getattr(record, "emb_hash", ""))
        if key in self._served_by:
            got = self._served_by[key]
            if isinstance(got, Exception):
                raise got
            return got
        try:
            block_t, block_hash = await self._pull(record, PayloadKind.BLOCK_STATE, b, self._block_shapes)
            emb_t, emb_hash = await self._pull(record, PayloadKind.EMBEDDING_STATE, -1, self._emb_shapes)
        except (_Lie, SwarmdError) as exc:
            self._served_by[key] = exc
            raise
        block = self._blocks.get((b, block_hash))
        if block is None:
            block = DenoisingBlock(self.cfg)
            block.load_state_dict(block_t)
            block = self._blocks[(b, block_hash)] = block.eval()
        table_hat = self._tables.setdefault(emb_hash, F.normalize(emb_t["table"].float(), dim=-1))
        got = self._served_by[key] = _Served(block, table_hat, block_hash, emb_hash)
        return got

    async def _pull(self, record, kind: PayloadKind, b: int, shapes: dict) -> tuple[dict[str, torch.Tensor], str]:
        """(tensors, their hash) of a state of `kind` from the peer of `record`, signed by it (else _Lie)."""
        swarm = getattr(record, "swarm_id", "") or self.swarm_id  # the router kept only records of our swarm
        request = pb.PullStateRequest(
            swarm_id=swarm, config_hash=self.cfg.config_hash(), kind=kind.to_pb(), block_index=b
        )
        t0 = time.perf_counter()
        enc = await self.client.pull_state(record.address, request, self.timeout_s)
        self.stats.state_downloads += 1
        self.stats.state_download_bytes += int(enc.wire_bytes)
        if enc.header.peer_id != record.peer_id:
            raise _Lie(f"state signed as {enc.header.peer_id[-6:] or '?'}, its record names {record.peer_id[-6:]}")
        try:
            self.checks.verify_payload(enc)
            tensors = self.checks.decode(
                enc, shapes, swarm_id=swarm, config_hash=self.cfg.config_hash(), kind=kind, block_index=b
            )
        except SwarmdError as exc:
            raise _Lie(str(exc)) from None
        got = await asyncio.to_thread(self.checks.weights_hash, tensors)
        logger.info("pulled the %s of %s in %.2f s", kind.value, record.address, time.perf_counter() - t0)
        return tensors, got

    @torch.no_grad()
    def _recompute(
        self, block: DenoisingBlock, table_hat: torch.Tensor, request: pb.ForwardRequest, hop: Hop
    ) -> Answer:
        """The hop over its whole prefix on the local block; the answer for the hop's new positions."""
        n, t = request.context.shape
        x = from_proto(request.context, expect_shape=(n, t), expect_dtype="uint8").long()
        z = from_proto(request.z, expect_shape=(n, t, self.cfg.d_model), expect_dtype="float32")
        pred = from_proto(request.message) if request.HasField("message") else None
        final = request.final
        logits, z_next, message = euler_step(
            block, table_hat, x, z, request.sigma, None if final else request.sigma_next, pred=pred
        )
        out = logits if final else z_next
        return Answer(out.float(), None if final or message is None else message.float()).tail(hop.z.shape[1])
