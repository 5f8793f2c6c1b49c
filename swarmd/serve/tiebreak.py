"""Tie-break by recomputation: when two replicas of one base disagree and no third breaks the tie, the client
pulls the block's announced weights, recomputes the disputed hop itself, and names the replica that lied.

Owns `TieBreaker`, which swarmd.serve.crosscheck.CrossChecker calls when a hop has no majority:
  - the weights: PullState (BLOCK_STATE, and EMBEDDING_STATE for the byte table) from one of the disputing
    replicas, fp32, which must come signed by the peer asked and hash to the base_hash / emb_hash its record
    announces (the checks are `StateChecks`: swarmd.membership.trust.verify_payload, swarmd.averaging.delta.decode
    and swarmd.averaging.state.weights_hash, passed in because serve imports neither package). A peer whose pulled
    state fails a check served weights it does not announce: it is one of the liars. A peer that cannot be
    reached, or refuses PullState (an inference-only peer), is only skipped: the other replica is asked;
  - the recomputation: the block built locally from those weights (swarmd.core.model.euler_step on the client's
    CPU, in a worker thread) over the hop in its uncached form, compared with each answer under the same-base
    tolerance (swarmd.serve.verify.divergence); an answer beyond it is a lie;
  - the cost bound: at most one successful download per (block, base hash) and per emb hash in a client's life,
    kept in memory; each replica is asked at most once per base (a failed pull is not repeated), so a liar cannot
    make the client download again and again. Counts and seconds go to VerifyStats (state_downloads,
    failed_pulls, tiebreak_s).
Where no verified copy can be had (both pulls fail, or the records announce no hashes) there is no verdict:
`settle()` returns None and the caller refuses the hop with one line.
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


@dataclass
class _Pulled:
    block: DenoisingBlock | None = None
    table_hat: torch.Tensor | None = None


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
        self._asked: set[tuple[str, str]] = set()  # (address, hash) pulls already tried (never repeated)
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
        if not base or not emb or any((r.base_hash, r.emb_hash) != (base, emb) for r in records):
            return None  # nothing announced to check pulled weights against
        drops: list[tuple[Any, str]] = []
        got = await self._weights(b, base, emb, list(replicas.values()), drops)
        if got is None:
            return drops or None
        block, table_hat = got
        local = await asyncio.to_thread(self._recompute, block, table_hat, request, hop)
        self.stats.tiebreaks += 1
        lied = {r.address for r, _ in drops}
        for address, answer in answers.items():
            gap = divergence(hop, answer, local)
            if address not in lied and gap > tol:
                drops.append(
                    (replicas[address], f"disagreed with the recomputation from its block's weights ({gap:.3g})")
                )
        logger.info("block %d step %d: tie broken by recomputation: %s", b, request.step_index, drops or "no liar")
        return drops

    async def _weights(
        self, b: int, base: str, emb: str, replicas: list, drops: list
    ) -> tuple[DenoisingBlock, torch.Tensor] | None:
        """The verified local block and table of this base, pulled (once) from the first replica that serves them."""
        got = _Pulled(self._blocks.get((b, base)), self._tables.get(emb))
        for replica in replicas:
            if got.block is not None and got.table_hat is not None:
                break
            try:
                if got.block is None and (replica.address, base) not in self._asked:
                    self._asked.add((replica.address, base))
                    tensors = await self._pull(replica.record, PayloadKind.BLOCK_STATE, b, base, self._block_shapes)
                    block = DenoisingBlock(self.cfg)
                    block.load_state_dict(tensors)
                    got.block = self._blocks[(b, base)] = block.eval()
                if got.table_hat is None and (replica.address, emb) not in self._asked:
                    self._asked.add((replica.address, emb))
                    tensors = await self._pull(replica.record, PayloadKind.EMBEDDING_STATE, -1, emb, self._emb_shapes)
                    got.table_hat = self._tables[emb] = F.normalize(tensors["table"].float(), dim=-1)
            except _Lie as exc:
                self.stats.failed_pulls += 1
                drops.append((replica, f"served weights it does not announce ({exc})"))
            except SwarmdError as exc:  # unreachable, or no PullState (inference-only): ask the other replica
                self.stats.failed_pulls += 1
                logger.info("block %d: cannot pull the state of %s to break a tie: %s", b, replica.address, exc)
        if got.block is None or got.table_hat is None:
            return None
        return got.block, got.table_hat

    async def _pull(self, record, kind: PayloadKind, b: int, announced: str, shapes: dict) -> dict[str, torch.Tensor]:
        """A state of `kind` from the peer of `record`, signed by it and hashing to `announced` (else _Lie)."""
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
        if got != announced:
            raise _Lie(f"{kind.value} hashes to {got}, its record announces {announced}")
        return tensors

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
