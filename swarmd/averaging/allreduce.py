"""Butterfly all-reduce (reduce-scatter, then all-gather) of one flat fp32 vector among a known group of peers.

Owns ButterflyRound: one average of one vector among `peers` (sorted peer ids, ours included) at one round.
The vector is cut into len(peers) contiguous parts (part_bounds); the peer at sorted index k owns part k.
  1. scatter: every peer sends part k of its vector to the owner of part k and receives, on the same
     ExchangeDeltas stream, the owner's part of the vector for its own part (each pair of peers opens one
     stream: `dials` balances who opens it); an owner that holds every contribution (or reaches its deadline
     with those that came) merges them: weighted mean (header weights) by default, or the `merge` given;
  2. gather: every owner sends its merged part to every other peer, again one stream per pair; the callee
     answers with its own merged part once it has it.
Each peer sends about 2 x (n - 1) / n of the vector whatever n (all-to-all sends n - 1 whole vectors).

What a receiver verifies on every payload, before it decodes anything: the payload signature names a peer of
the group other than itself (swarmd.membership.trust.verify_payload), the round and the swarm/config/kind/block
are ours, the one tensor it holds is the part its name says and has exactly that part's size (decode), its
values are finite. What it cannot verify: that an owner's merged part is the merge of the contributions
(the other peers' contributions never reach it). A lying owner can therefore corrupt the 1/n of the vector it
owns, for this round, for everyone; its signature makes the merged part attributable (a peer can keep it
as evidence), and the part still passes the caller's `check` (e.g. a norm bound against the receiver's own
part) before it is used. Owners change when the group changes (a new group or a permutation per round).
A peer that fails: the parts it owned keep our own (unaveraged) values and its contributions are left out
of the parts we own; `missing` says which.

Wiring into a daemon: ButterflyRound.handle is the callee side; the daemon's exchange handler routes a
payload whose tensor name starts with PART_PREFIX (is_allreduce) to the open round of that round number
(new_round -> rounds[round]) before its own round logic. Pure asyncio and torch; no grpc (`client` is
anything with PeerClient.exchange's signature). Runs on the caller's event loop; starts no threads.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import torch

from swarmd.averaging.delta import decode, encode
from swarmd.errors import ValidationError
from swarmd.membership.identity import Identity
from swarmd.membership.trust import sign_payload, verify_payload
from swarmd.transport.framing import Encoded

logger = logging.getLogger(__name__)

PART_PREFIX = "allreduce."  # tensor names: allreduce.scatter.<part> / allreduce.gather.<part>
SCATTER, GATHER = "scatter", "gather"

# (contributions: peer id -> part, weights: peer id -> weight) -> the merged part
Merge = Callable[[dict[str, torch.Tensor], dict[str, float]], torch.Tensor]


class Exchanger(Protocol):
    async def exchange(self, address: str, outgoing: Encoded, timeout_s: float) -> Encoded: ...


def part_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of each part: contiguous, sizes differing by at most one, the larger ones first."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for k in range(parts):
        end = start + base + (k < extra)
        bounds.append((start, end))
        start = end
    return bounds


def dials(i: int, j: int, n: int) -> bool:
    """Whether the peer at index i opens the stream to the peer at index j (exactly one of each pair does;
    every peer opens about (n - 1) / 2 streams)."""
    d = (j - i) % n
    return 0 < d < n - d or (d == n - d and i < j)


def weighted_mean(parts: dict[str, torch.Tensor], weights: dict[str, float]) -> torch.Tensor:
    """sum(w x) / sum(w) in sorted peer-id order (every owner that holds the same inputs gets the same bits)."""
    ids = sorted(parts)
    total = sum(weights[p] for p in ids)
    if total <= 0:
        weights, total = {p: 1.0 for p in ids}, float(len(ids))
    acc = torch.zeros_like(parts[ids[0]], dtype=torch.float32)
    for p in ids:
        acc.add_(parts[p], alpha=weights[p])
    return acc.div_(total)


def is_allreduce(enc: Encoded) -> bool:
    """Whether a payload belongs to an all-reduce (route it to ButterflyRound.handle)."""
    return len(enc.header.tensors) == 1 and enc.header.tensors[0].name.startswith(PART_PREFIX)


def round_of(enc: Encoded) -> int:
    return int(enc.header.round)


class ButterflyRound:
    """One butterfly all-reduce of `vector` (flat fp32) among `peers` at `round`; see the module docstring.

    :param meta: swarm_id, config_hash, kind and block_index of the payloads (as delta.encode takes them)
    :param codec: fp32 (exact) or fp16/bf16 (half the bytes; relative error ~2e-4 / ~2e-3 per part)
    :param weight: our merge weight (samples behind our vector)
    :param merge: how an owner merges the contributions to its part (default weighted_mean)
    :param check: called on every merged part received (part index, part, our own part); raise
        ValidationError to refuse it (the part then keeps our own values)
    :param timeout_s: each phase's deadline; an owner merges what it has by then
    """

    def __init__(
        self,
        vector: torch.Tensor,
        *,
        identity: Identity,
        peers: list[str],
        round: int,
        meta: dict,
        codec: str = "fp32",
        weight: float = 1.0,
        merge: Merge = weighted_mean,
        check: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
        timeout_s: float = 30.0,
    ):
        self.me, self.peers = identity.peer_id, sorted(set(peers))
        if self.me not in self.peers:
            raise ValueError("the group must include our own peer id")
        self.identity, self.round, self.meta, self.codec = identity, round, dict(meta), codec
        self.weight, self.merge, self.check, self.timeout_s = weight, merge, check, timeout_s
        self.vector = vector.detach().to("cpu", torch.float32).reshape(-1)
        self.n = len(self.peers)
        self.index = {p: k for k, p in enumerate(self.peers)}
        self.mine = self.index[self.me]
        self.bounds = part_bounds(self.vector.numel(), self.n)
        own = self._part(self.vector, self.mine)
        self.contributions: dict[str, torch.Tensor] = {self.me: own}
        self.weights: dict[str, float] = {self.me: weight}
        self.merged: torch.Tensor | None = None
        self.gathered: dict[int, torch.Tensor] = {}
        self.refused: set[int] = set()  # merged parts refused by `check` or lost with their stream (own values kept)
        self.lost: set[str] = set()  # peers whose contribution will not come (their stream failed)
        self.missing: set[str] = set()
        self._contributed = asyncio.Event()  # every contribution to our part is in
        self._merged = asyncio.Event()
        self._gathered = asyncio.Event()  # every other merged part is in
        self._scatter: dict[int, Encoded] = {}  # part -> our signed scatter payload to its owner (built lazily)
        self._gather: Encoded | None = None
        self._check_done()

    # ---- payloads --------------------------------------------------------------------------------
    def _part(self, vector: torch.Tensor, k: int) -> torch.Tensor:
        start, end = self.bounds[k]
        return vector[start:end]

    def _name(self, phase: str, k: int) -> str:
        return f"{PART_PREFIX}{phase}.{k}"

    def _payload(self, phase: str, k: int, part: torch.Tensor) -> Encoded:
        enc = encode(
            {self._name(phase, k): part},
            self.codec,
            **self.meta,
            round=self.round,
            weight=self.weight,
            peer_id=self.me,
            zstd=False,  # dense fp32/fp16 values: zstd saves a few percent for a full pass over the bytes
        )
        return sign_payload(enc, self.identity)

    def scatter_payload(self, k: int) -> Encoded:
        """Our part k, for its owner."""
        if k not in self._scatter:
            self._scatter[k] = self._payload(SCATTER, k, self._part(self.vector, k))
        return self._scatter[k]

    def gather_payload(self) -> Encoded:
        if self.merged is None:
            raise RuntimeError("our part is not merged yet")
        if self._gather is None:
            self._gather = self._payload(GATHER, self.mine, self.merged)
        return self._gather

    def _accept(self, enc: Encoded, phase: str, k: int) -> tuple[str, torch.Tensor]:
        """The sender and the part of a payload from a group peer; ValidationError on anything else."""
        verify_payload(enc)  # first: signed by the peer it names, bytes unchanged
        h = enc.header
        sender = h.peer_id
        if sender not in self.index or sender == self.me:
            raise ValidationError(f"all-reduce payload from {sender[-6:] or '?'}, not a peer of this group")
        if h.round != self.round:
            raise ValidationError(f"all-reduce payload of round {h.round}, this one is {self.round}")
        start, end = self.bounds[k]
        tensors = decode(enc, {self._name(phase, k): (end - start,)}, **self.meta)
        return sender, tensors[self._name(phase, k)]

    # ---- state -----------------------------------------------------------------------------------
    def _add_contribution(self, sender: str, part: torch.Tensor, weight: float) -> None:
        if sender in self.contributions:
            raise ValidationError(f"a second contribution from {sender[-6:]}")
        self.contributions[sender], self.weights[sender] = part, weight
        self._check_done()

    def _add_gathered(self, sender: str, part: torch.Tensor) -> None:
        k = self.index[sender]
        if k in self.gathered:
            raise ValidationError(f"a second merged part from {sender[-6:]}")
        if k in self.refused:
            raise ValidationError(f"a second merged part from {sender[-6:]}")
        if self.check is not None:
            try:
                self.check(k, part, self._part(self.vector, k))
            except ValidationError:
                self.refused.add(k)
                self._check_done()
                raise
        self.gathered[k] = part
        self._check_done()

    def _check_done(self) -> None:
        if len(self.contributions) + len(self.lost - set(self.contributions)) == self.n:
            self._contributed.set()
        if len(self.gathered) + len(self.refused) == self.n - 1:
            self._gathered.set()

    def _merge_now(self) -> None:
        if self.merged is None:
            self.merged = self.merge(dict(self.contributions), dict(self.weights))
            self._merged.set()

    # ---- callee ----------------------------------------------------------------------------------
    async def handle(self, incoming: Encoded) -> Encoded:
        """Callee side of one stream: take the caller's scatter (answer with our part for it) or its merged
        part (answer with ours once merged). :raises ValidationError: anything but a payload this round expects
        """
        if not is_allreduce(incoming):
            raise ValidationError("not an all-reduce payload")
        phase, _, part = incoming.header.tensors[0].name[len(PART_PREFIX) :].partition(".")
        sender = incoming.header.peer_id
        if sender not in self.index:
            raise ValidationError(f"all-reduce payload from {sender[-6:] or '?'}, not a peer of this group")
        if phase == SCATTER and part == str(self.mine):
            sender, values = self._accept(incoming, SCATTER, self.mine)
            self._add_contribution(sender, values, float(incoming.header.weight))
            return self.scatter_payload(self.index[sender])
        if phase == GATHER and part == str(self.index[sender]):
            sender, values = self._accept(incoming, GATHER, self.index[sender])
            self._add_gathered(sender, values)
            try:
                await asyncio.wait_for(self._merged.wait(), self.timeout_s)
            except TimeoutError:
                raise ValidationError("our part was not merged in time") from None
            return self.gather_payload()
        raise ValidationError(f"unexpected all-reduce tensor {incoming.header.tensors[0].name!r}")

    # ---- caller ----------------------------------------------------------------------------------
    async def run(self, client: Exchanger, addresses: dict[str, str]) -> torch.Tensor:
        """Average our vector with the group's: returns the averaged vector (flat fp32, our values where a
        part could not be had; see `missing`). `addresses`: peer id -> address of every peer we dial."""
        start = time.perf_counter()
        deadline = start + self.timeout_s
        targets = [p for p in self.peers if p != self.me and dials(self.mine, self.index[p], self.n)]

        async def scatter(peer: str) -> None:
            k = self.index[peer]
            reply = await client.exchange(addresses[peer], self.scatter_payload(k), self.timeout_s)
            sender, values = self._accept(reply, SCATTER, self.mine)
            if sender != peer:
                raise ValidationError(f"{addresses[peer]} answered as {sender[-6:]}")
            self._add_contribution(sender, values, float(reply.header.weight))

        async def gather(peer: str) -> None:
            reply = await client.exchange(addresses[peer], self.gather_payload(), self.timeout_s)
            sender, values = self._accept(reply, GATHER, self.index[peer])
            if sender != peer:
                raise ValidationError(f"{addresses[peer]} answered as {sender[-6:]}")
            self._add_gathered(sender, values)

        failed: set[str] = set()
        await self._each(scatter, targets, failed)
        self.lost |= failed  # their contributions will not come: merge without waiting for them
        self._check_done()
        await _wait(self._contributed, deadline - time.perf_counter())
        self.missing |= set(self.peers) - set(self.contributions)
        self._merge_now()
        await self._each(gather, [p for p in targets if p not in failed], failed)
        self.refused |= {self.index[p] for p in failed} - set(self.gathered)
        self._check_done()
        await _wait(self._gathered, deadline - time.perf_counter())
        out = self.vector.clone()
        merged = self.merged
        if merged is None:
            raise RuntimeError("our part is not merged")  # _merge_now ran above
        start_m, end_m = self.bounds[self.mine]
        out[start_m:end_m] = merged
        for p in self.peers:
            k = self.index[p]
            if p == self.me:
                continue
            if k in self.gathered:
                s, e = self.bounds[k]
                out[s:e] = self.gathered[k]
            else:
                self.missing.add(p)
        if self.missing:
            logger.warning(
                "all-reduce of round %d: no part from %s", self.round, ", ".join(p[-6:] for p in self.missing)
            )
        return out

    async def _each(self, step: Callable[[str], Awaitable[object]], peers: list[str], failed: set[str]) -> None:
        results = await asyncio.gather(*(step(p) for p in peers), return_exceptions=True)
        for peer, result in zip(peers, results):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                failed.add(peer)
                logger.info("all-reduce of round %d with %s failed: %s", self.round, peer[-6:], result)


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), max(timeout_s, 0.0))
    except TimeoutError:
        pass


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (0 when both are zero)."""
    num = float((got.double() - want.double()).norm())
    den = float(want.double().norm())
    return num / den if den else (0.0 if num == 0 else math.inf)
