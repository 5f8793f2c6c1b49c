"""Second and third opinions on one hop: ask other replicas of the block, judge, name whom to drop.

Owns `CrossChecker`, which swarmd.serve.remote.RemoteSweeper calls for each hop it accepts:
  - `lone()`: whether nobody but the answering replica holds the block (the hop stays unverified; the block
    is named in VerifyStats.unverified_blocks and a warning is logged once per block);
  - `start()`: when VerifyPolicy wants this hop checked, sends the same hop (in its uncached form: the whole
    prefix from position 0, so the checker needs no session cache) to the best other replica, as a task that
    runs while the primary answers;
  - `settle()`: compares the two answers (swarmd.serve.verify.divergence against the pair's tolerance: by the
    weights both answers name, verify.between, else by their records); when they disagree, asks a third replica
    (a fresh discovery lookup when none is known) and takes the majority of three (verify.judge). With no
    majority among replicas of one base or answers that all name their weights (two and no third, or three that
    all disagree) the tie is broken by recomputing the hop from those weights (swarmd.serve.tiebreak). Two
    replicas whose records announce one base but whose answers name different weights (a merge landed on one)
    are not compared at the same-base tolerance: each answer is recomputed from its own named weights (pulled
    once per hash), so naming other weights is no way out of the same-base check.
    Returns the addresses to drop for the session; raises Inconclusive when the answer used names weights that
    could not be had (the caller re-runs the hop), ValidationError, one line, when no verdict is possible (no
    tie-breaker, or no verified copy of the weights could be pulled).
Every answer a checker gives passes verify.out_of_range first (a checker that fails it is dropped). A checker
that cannot be reached is reported to the router's backoff and the hop counts as unchecked: failover logic
stays in remote.py. Talks to peers only through forward_session() of a PeerClient; no torch math beyond
verify's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from swarmd.errors import PeerUnavailable, SwarmdError, ValidationError
from swarmd.serve.tiebreak import TieBreaker
from swarmd.serve.verify import (
    Answer,
    Hop,
    VerifyPolicy,
    VerifyStats,
    alike,
    divergence,
    judge,
    named_weights,
    out_of_range,
    same_base,
)
from swarmd.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)


@dataclass
class Check:
    """One hop's check under way: the other replica, the task of its answer, what it was asked."""

    checker: Any  # swarmd.serve.remote.Replica
    task: asyncio.Future  # -> Answer, or None when the checker could not be reached
    request: pb.ForwardRequest  # the hop in its uncached form
    z_full: torch.Tensor  # the request's z (n, t_full, d)

    def cancel(self) -> None:
        """Not needed any more (the primary failed or answered out of range)."""
        if self.task.done():
            if not self.task.cancelled():
                self.task.exception()  # retrieved: no "exception never retrieved" at exit
        else:
            self.task.cancel()


class Inconclusive(SwarmdError):
    """The hop's answer names weights that could not be had to settle a dispute: ask again (re-run the hop)."""


Unpack = Callable[[pb.ForwardReply, tuple[int, int], bool], tuple[Any, Any]]


class CrossChecker:
    """Second opinions through a BlockRouter (swarmd.serve.remote) and a PeerClient.

    :param unpack: swarmd.serve.remote.unpack_reply, its config bound: (reply, (n, t), final) -> (out, message),
        validating shapes
    """

    def __init__(
        self,
        cfg,
        router,
        client,
        policy: VerifyPolicy,
        stats: VerifyStats,
        unpack: Unpack,
        timeout_s: float,
        tiebreaker: TieBreaker | None = None,
    ):
        self.cfg, self.router, self.client, self.policy, self.stats = cfg, router, client, policy, stats
        self.unpack, self.timeout_s, self.tiebreaker = unpack, timeout_s, tiebreaker
        self._streams: dict[str, Any] = {}  # address -> forward stream used for checks
        self._warned: set[int] = set()  # blocks whose lone holder was warned about

    def others(self, block_index: int, exclude: set[str], like: Any = None) -> list:
        """Usable replicas of a block but these (not banned, not dropped): those sharing `like`'s base first
        (a peer record; None: no preference), then by latency and load."""
        now = time.monotonic()
        known = self.router.known(block_index)
        usable = [
            r
            for r in known
            if r.address not in exclude
            and r.address not in self.router.distrusted
            and not self.router.bans.banned(r.address, now)
        ]
        return sorted(usable, key=lambda r: (like is not None and not same_base(like, r.record), r.score()))

    def lone(self, block_index: int, address: str) -> bool:
        if self.others(block_index, {address}):
            return False
        self.stats.unverified_blocks.add(block_index)
        if block_index not in self._warned:
            self._warned.add(block_index)
            logger.warning(
                "block %d: only %s serves it; its answers pass range checks but are unverified", block_index, address
            )
        return True

    def start(self, session_id: str, block_index: int, primary, request: pb.ForwardRequest, z_full) -> Check | None:
        """The check of this hop under way on another replica (its task runs meanwhile), or None: not checked.

        :param request: the hop in its uncached form (start_position 0, the whole prefix); z_full: its z
        """
        t_full, final = z_full.shape[1], request.final
        if self.lone(block_index, primary.address) or self.policy.share <= 0:
            return None
        if not self.policy.wants_check(session_id, primary.address, block_index):
            return None
        checker = self.others(block_index, {primary.address}, like=primary.record)[0]
        return Check(checker, asyncio.ensure_future(self._ask(checker, request, t_full, final)), request, z_full)

    async def _ask(self, replica, request: pb.ForwardRequest, t_full: int, final: bool) -> Answer | None:
        """The replica's answer (range failures raise _Refused); None when it cannot be reached."""
        n = request.context.shape[0]
        stream = self._streams.get(replica.address)
        if stream is None:
            stream = self._streams[replica.address] = self.client.forward_session(replica.address)
        self.stats.extra_calls += 1
        replica.inflight += 1
        try:
            reply = await asyncio.wait_for(stream.step(request, timeout_s=self.timeout_s), self.timeout_s + 5.0)
        except (TimeoutError, PeerUnavailable, ConnectionError) as exc:
            self.router.report_failure(replica, exc)
            await self._close(replica.address)
            return None
        finally:
            replica.inflight -= 1
        out, message = self.unpack(reply, (n, t_full), final)
        return Answer(out, message, named_weights(reply))

    async def settle(self, check: Check, primary, hop: Hop, answer: Answer) -> list[tuple[Any, str]]:
        """Compare the primary's answer (new positions) with the checker's; [(replica to drop, why)]."""
        checker, task, request = check.checker, check.task, check.request
        t0 = time.perf_counter()
        try:
            other = await task
        except SwarmdError as exc:  # a malformed answer (shape, dtype): the checker is the one at fault
            return [(checker, f"sent a malformed answer ({exc})")]
        finally:
            self.stats.extra_s += time.perf_counter() - t0
        if other is None:
            return []
        t = hop.z.shape[1]
        full = Hop(check.z_full, hop.sigma, hop.sigma_next)
        why = out_of_range(self.cfg, full, other)
        if why:
            return [(checker, f"sent {why}")]
        other = other.tail(t)
        answers = {primary.address: answer, checker.address: other}
        if self._moved(primary, answer, checker, other):  # one base announced, other weights named: recompute each
            drops = await self._recompute(hop, request, answers, {primary.address: primary, checker.address: checker})
            if drops is not None:
                self._raise_if_inconclusive(primary, request, drops)
                return drops
        tol = self.policy.between(primary.record, answer, checker.record, other)
        gap = divergence(hop, answer, other)
        if gap <= tol:
            self.stats.checked += 1
            self.stats.loose += not alike(primary.record, answer, checker.record, other)
            return []
        self.stats.disagreements += 1
        logger.info(
            "block %d step %d: %s and %s disagree (divergence %.3g > tolerance %.3g); asking a third replica",
            request.block_index,
            request.step_index,
            primary.address,
            checker.address,
            gap,
            tol,
        )
        return await self._third_opinion(primary, check, hop, answers)

    def _moved(self, a, answer_a: Answer, b, answer_b: Answer) -> bool:
        """Whether two replicas announce one base but name other weights for their answers (a merge landed)."""
        return (
            self.tiebreaker is not None
            and answer_a.named
            and answer_b.named
            and answer_a.weights != answer_b.weights
            and same_base(a.record, b.record)
        )

    def _raise_if_inconclusive(self, primary, request: pb.ForwardRequest, drops: list) -> None:
        """Inconclusive when the answer used names weights that could not be had (and its sender is not dropped)."""
        if any(r is primary for r, _ in drops):
            return
        if self.tiebreaker is not None and primary.address in self.tiebreaker.inconclusive_now:
            raise Inconclusive(
                f"block {request.block_index} step {request.step_index}: the weights {primary.address} named for "
                "its answer could not be had to check it; asking again"
            )

    async def _third_opinion(self, primary, check: Check, hop: Hop, answers: dict[str, Answer]) -> list:
        checker, request = check.checker, check.request
        b = request.block_index
        exclude = {primary.address, checker.address}
        thirds = self.others(b, exclude, like=primary.record)
        if not thirds:
            await self.router.refresh(b)
            await self.router.probe_all()
            thirds = self.others(b, exclude, like=primary.record)
        replicas = {primary.address: primary, checker.address: checker}
        for third in thirds:
            t0 = time.perf_counter()
            try:
                got = await self._ask(third, request, request.context.shape[1], hop.sigma_next is None)
                why = None if got is None else out_of_range(self.cfg, Hop(check.z_full, hop.sigma, hop.sigma_next), got)
            except SwarmdError as exc:  # a malformed answer (shape, dtype, NaN)
                got, why = None, f"a malformed answer ({exc})"
            finally:
                self.stats.extra_s += time.perf_counter() - t0
            if why:
                self.router.distrust(third.address, f"sent {why} as a third opinion")
                self.stats.dropped[third.address] = f"sent {why} as a third opinion"
            if got is None or why:
                continue
            answers[third.address], replicas[third.address] = got.tail(hop.z.shape[1]), third
            break
        names = list(answers)
        tol = {
            frozenset((x, y)): self.policy.between(replicas[x].record, answers[x], replicas[y].record, answers[y])
            for x in names
            for y in names
        }
        verdict = judge(hop, answers, tol)
        all_named = all(a.named for a in answers.values())
        if (
            not verdict.agree
            and not all_named
            and not any(alike(replicas[x].record, answers[x], replicas[y].record, answers[y]) for x, y in _pairs(names))
        ):
            if b not in self.stats.apart_blocks:  # honest replicas of other bases may differ this much
                logger.warning(
                    "block %d: replicas %s are on different bases and disagree; no tie-break by recomputation "
                    "(no shared weights to recompute from): hops unverified",
                    b,
                    names,
                )
            self.stats.apart_blocks.add(b)
            return []
        if not verdict.agree:
            drops = await self._recompute(hop, request, answers, replicas)
            if drops is not None:
                self._raise_if_inconclusive(primary, request, drops)
                return drops
            who = " and ".join(names)
            extra = "" if len(names) > 2 else " and no third replica breaks the tie"
            raise ValidationError(
                f"block {b} step {request.step_index}: replicas {who} disagree{extra}, and no verified copy of "
                "their weights could be pulled to recompute it; refusing an unverifiable answer"
            )
        self.stats.checked += 1
        return [(replicas[a], f"disagreed with the majority {'+'.join(verdict.agree)}") for a in verdict.dissent]

    async def _recompute(self, hop: Hop, request: pb.ForwardRequest, answers: dict, replicas: dict) -> list | None:
        """No majority among replicas of one base: the tie-break by recomputation's drops (None: no verdict)."""
        if self.tiebreaker is None:
            return None
        records = [r.record for r in replicas.values()]
        if not all(a.named for a in answers.values()) and not all(same_base(records[0], r) for r in records):
            return None
        drops = await self.tiebreaker.settle(hop, request, answers, replicas, self.policy.same_tol)
        confirmed = set(answers) - {r.address for r, _ in drops or ()} - self.tiebreaker.inconclusive_now
        if drops is not None and confirmed:
            self.stats.checked += 1  # an answer the recomputation confirms is used
        return drops

    async def _close(self, address: str) -> None:
        stream = self._streams.pop(address, None)
        if stream is not None:
            with contextlib.suppress(Exception):  # a broken check stream must not mask the hop's result
                await stream.close()

    async def close(self) -> None:
        for address in list(self._streams):
            await self._close(address)


def _pairs(names: list[str]) -> list[tuple[str, str]]:
    return [(x, y) for i, x in enumerate(names) for y in names[i + 1 :]]
