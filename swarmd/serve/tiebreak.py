"""Tie-break by recomputation: when replicas disagree and no majority breaks the tie, the client pulls the
weights each disputing answer was computed from, recomputes the hop from them, and names the replica that lied.

Owns `TieBreaker`, which swarmd.serve.crosscheck.CrossChecker calls when a hop has no majority (or when two replicas
of one announced base answer from different named weights):
  - the weights: an answer that names them (Answer.weights: the ForwardReply's block_hash / emb_hash) is checked
    against exactly those: PullState with weights_hash (BLOCK_STATE, and EMBEDDING_STATE for the byte table), fp32,
    signed by the peer asked, decoding to our shapes and hashing to the name (the checks are `StateChecks`:
    swarmd.membership.trust.verify_payload, swarmd.averaging.delta.decode and swarmd.averaging.state.weights_hash,
    passed in because serve imports neither package). A state that fails those is not what the peer named: a lie.
    An answer that names nothing (a peer before the names) is checked against the state its record announces, as
    before; a peer that cannot be reached or refuses that pull is skipped;
  - the verdict: a replica whose answer is not what the named weights compute (swarmd.serve.verify.divergence
    against the same-base tolerance, the hop in its uncached form on the client's CPU) lied. Answers that each
    match their own, different named weights are no lie: the weights moved between them (a merge landed). For
    unnamed answers that match served weights which differ, the one whose weights hash to what the records
    announce wins if exactly one does; else there is no verdict;
  - inconclusive: named weights that cannot be had (NOT_FOUND: no longer held; unreachable; a pull refused) prove
    nothing either way: the replica is in `inconclusive_now` and the caller re-runs the hop. Each counts against
    the replica; at MAX_INCONCLUSIVE it is dropped ("keeps naming weights it does not serve", logged as a
    warning), so a liar cannot name weights it then refuses to serve, over and over, at no cost;
  - the cost bound: each replica is pulled at most once per named hash (once per announced base for unnamed
    answers; a failure is remembered too), verified blocks and tables are shared by hash, so a liar cannot make the
    client download again and again (what is remembered is bounded: the last 4 x MAX_HELD pulls and MAX_HELD
    blocks, so a client that runs for many rounds keeps a few blocks, not one per round). Counts and seconds go to
    VerifyStats (state_downloads, failed_pulls, tiebreak_s, inconclusive).
Where no weights can be had for unnamed answers (every pull fails) there is no verdict: `settle()` returns None and
the caller refuses the hop with one line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
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

MAX_INCONCLUSIVE = 3  # judgements with named weights that could not be had before a replica is dropped
MAX_HELD = 16  # verified blocks (and tables) a client keeps; the pulls remembered are 4x this


@dataclass(frozen=True)
class StateChecks:
    """How a pulled state is validated (the functions of swarmd.membership / swarmd.averaging, passed in)."""

    verify_payload: Callable[[Any], None]  # raises on a payload not signed by the peer its header names
    decode: Callable[..., dict[str, torch.Tensor]]  # swarmd.averaging.delta.decode's signature
    weights_hash: Callable[[dict[str, torch.Tensor]], str]  # the hash records announce


class _Bounded(OrderedDict):
    """A dict that forgets its oldest entries beyond `cap` (the client's memory of pulled weights stays bounded
    however long it runs against a swarm that merges every round)."""

    def __init__(self, cap: int = MAX_HELD):
        super().__init__()
        self.cap = cap

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.cap:
            self.popitem(last=False)


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
        self._blocks: _Bounded = _Bounded()  # (block, base_hash) -> verified local block
        self._tables: _Bounded = _Bounded()  # emb_hash -> verified row-normalised table
        self._served_by: _Bounded = _Bounded(4 * MAX_HELD)  # (address, hashes, how) -> pull (or its failure)
        self._inconclusives: dict[str, int] = {}  # address -> judgements its named weights could not settle
        self.inconclusive_now: set[str] = set()  # addresses inconclusive in the last settle()
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
        consistent: dict[str, _Served] = {}  # address -> the weights its answer agrees with
        self.inconclusive_now = set()
        for address in sorted(answers):
            replica, answer = replicas[address], answers[address]
            named = answer.weights if answer.named else None
            try:
                served = await self._served(replica, b, named)
            except _Lie as exc:
                self.stats.failed_pulls += 1
                drops.append((replica, f"served a state that is not the one it named ({exc})"))
                continue
            except SwarmdError as exc:  # not held any more, unreachable, or no PullState: cannot be judged
                self.stats.failed_pulls += 1
                if named is None:
                    logger.info("block %d: cannot pull the state of %s to break a tie: %s", b, address, exc)
                elif (why := self._inconclusive(replica, b, exc)) is not None:
                    drops.append((replica, why))
                continue
            local = await asyncio.to_thread(self._recompute, served.block, served.table_hat, request, hop)
            gap = divergence(hop, answer, local)
            if gap > tol:
                whose = "it named" if named else "it serves"
                drops.append(
                    (replica, f"its answer disagrees with the recomputation from the weights {whose} ({gap:.3g})")
                )
            else:
                consistent[address] = served
        unnamed = [a for a in consistent if not answers[a].named]
        if len(unnamed) > 1 and len({(consistent[a].block_hash, consistent[a].table_hash) for a in unnamed}) > 1:
            # unnamed answers each agree with the weights their peers serve, and those differ: the ones that serve
            # what the records announce win; where none or several do, there is no verdict
            announced = [a for a in unnamed if (consistent[a].block_hash, consistent[a].table_hash) == (base, emb)]
            if len(announced) != 1:
                return drops or None
            drops += [
                (replicas[a], "serves and answers by weights other than its record announces")
                for a in unnamed
                if a not in announced
            ]
        if not drops and not consistent and not self.inconclusive_now:
            return None  # nothing could be pulled: no verdict
        self.stats.tiebreaks += 1
        logger.info("block %d step %d: tie broken by recomputation: %s", b, request.step_index, drops or "no liar")
        return drops

    def _inconclusive(self, replica, b: int, exc: Exception) -> str | None:
        """Count a judgement the named weights could not settle; why to drop the replica once it is one too many."""
        self.stats.inconclusive += 1
        self.inconclusive_now.add(replica.address)
        n = self._inconclusives[replica.address] = self._inconclusives.get(replica.address, 0) + 1
        if n >= MAX_INCONCLUSIVE:
            why = f"keeps naming weights it does not serve ({n} inconclusive tie-breaks; last: {exc})"
            logger.warning("block %d: dropping %s: %s", b, replica.address, why)
            return why
        logger.info(
            "block %d: the weights %s named cannot be had (%s): inconclusive, %d of %d",
            b,
            replica.address,
            exc,
            n,
            MAX_INCONCLUSIVE,
        )
        return None

    async def _served(self, replica, b: int, named: tuple[str, str] | None) -> _Served:
        """The block and byte table an answer of `replica` came from: exactly the named weights where it names them,
        else what it serves now (pulled at most once per replica and named hash or announced base, so a liar cannot
        make the client download again and again; verified copies are shared by hash)."""
        record = replica.record
        announced = (getattr(record, "base_hash", ""), getattr(record, "emb_hash", ""))
        key = (replica.address, *(named or announced), "named" if named else "served")
        if key in self._served_by:
            got = self._served_by[key]
            if isinstance(got, Exception):
                raise got
            return got
        try:
            want = named or ("", "")
            block_t, block_hash = await self._pull(record, PayloadKind.BLOCK_STATE, b, self._block_shapes, want[0])
            emb_t, emb_hash = await self._pull(record, PayloadKind.EMBEDDING_STATE, -1, self._emb_shapes, want[1])
        except (_Lie, SwarmdError) as exc:
            self._served_by[key] = exc
            raise
        block = self._blocks.get((b, block_hash))
        if block is None:
            block = DenoisingBlock(self.cfg)
            block.load_state_dict(block_t)
            block = self._blocks[(b, block_hash)] = block.eval()
        table_hat = self._tables.get(emb_hash)
        if table_hat is None:
            table_hat = self._tables[emb_hash] = F.normalize(emb_t["table"].float(), dim=-1)
        got = self._served_by[key] = _Served(block, table_hat, block_hash, emb_hash)
        return got

    async def _pull(
        self, record, kind: PayloadKind, b: int, shapes: dict, want: str = ""
    ) -> tuple[dict[str, torch.Tensor], str]:
        """(tensors, their hash) of a state of `kind` from the peer of `record`, signed by it (else _Lie); `want`:
        exactly the weights of that hash (the state must hash to it, else _Lie), "" for what its record announces."""
        swarm = getattr(record, "swarm_id", "") or self.swarm_id  # the router kept only records of our swarm
        request = pb.PullStateRequest(
            swarm_id=swarm, config_hash=self.cfg.config_hash(), kind=kind.to_pb(), block_index=b, weights_hash=want
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
        if want and got != want:
            raise _Lie(f"its {kind.value} hashes to {got[:16]}, not the {want[:16]} its answer named")
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
