"""One averaging round's bookkeeping: Round (what is open, stashed and judged; the collection's wait), RowValues
(phase 2 of a two-phase round: the rows' values) and MergeReport (what a closed round merged). Plain data and one
wait; swarmd.averaging.exchange (and swarmd.averaging.phase2) run the protocol."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import torch

from swarmd.averaging.context import BLOCK, EMB
from swarmd.protocol import PayloadKind
from swarmd.transport.framing import Encoded


@dataclass
class MergeReport:
    """What one averaging round merged: whose deltas were expected and accepted, and how long it took."""

    round: int  # round index that was merged (rounds completed before it)
    expected_block: list[str]
    expected_emb: list[str]
    accepted_block: list[str]
    accepted_emb: list[str]
    rejected: int
    deadline_s: float
    seconds: float  # from own delta ready to merge
    premerge_distance: float  # max relative distance between own live block and an accepted replica before the merge
    # the loss check (swarmd.averaging.merge): whether the merge fell back to the deltas that pass one by one, the
    # peers whose delta passed / failed such a check (failed: kept out), and the seconds it took
    fell_back: bool = False
    passed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    check_s: float = 0.0

    @property
    def participation(self) -> float:
        """Fraction of the expected (peer, kind) deltas that were accepted; 1.0 when none was expected."""
        expected = len(self.expected_block) + len(self.expected_emb)
        got = len(set(self.accepted_block) & set(self.expected_block)) + len(
            set(self.accepted_emb) & set(self.expected_emb)
        )
        return 1.0 if expected == 0 else got / expected


@dataclass
class RowValues:
    """Phase 2 of a two-phase round (swarmd.averaging.phase2): own row's value as sent, and every row's value got."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)  # own row values encoded (or none to send)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # a row value came (or a fetch ended)
    outgoing: dict[str, Encoded] = field(default_factory=dict)  # kind -> own row's value, signed
    # kind -> row index -> (the row's merged count, its decoded value): the first accepted value of each row
    got: dict[str, dict[int, tuple[float, dict[str, torch.Tensor]]]] = field(
        default_factory=lambda: {BLOCK: {}, EMB: {}}
    )


@dataclass
class Round:
    """One open round: own payloads, the deltas stashed and the peers judged, and the events the collection waits on."""

    round: int
    hashes: dict[str, str]  # kind -> base hash
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    outgoing: dict[str, Encoded] = field(default_factory=dict)
    own: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    inbox: dict[str, dict[str, dict[str, torch.Tensor]]] = field(default_factory=lambda: {BLOCK: {}, EMB: {}})
    failed: dict[str, set[str]] = field(default_factory=lambda: {BLOCK: set(), EMB: set()})
    closed: bool = False
    mismatched: dict[str, dict[str, str]] = field(
        default_factory=lambda: {BLOCK: {}, EMB: {}}
    )  # kind -> sender on another base -> the base its delta was on
    opened_at: float = field(default_factory=time.monotonic)
    ready_at: float = 0.0
    last_arrival: float = 0.0
    arrivals: list[float] = field(default_factory=list)  # seconds after open of each accepted delta
    rejected: int = 0
    senders: dict[str, set[str]] = field(
        default_factory=lambda: {BLOCK: set(), EMB: set()}
    )  # peers whose (signed) delta of this round was judged: one each, accepted or not
    exact: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # own deltas before the codec (overlap)
    members: dict[str, set[str] | None] = field(default_factory=lambda: {BLOCK: None, EMB: None})  # group (None: all)
    idle: dict[str, set[str]] = field(
        default_factory=lambda: {BLOCK: set(), EMB: set()}
    )  # senders whose delta carries weight 0 (they trained nothing this round): arrived, but not merged
    # two-phase layout: each part's rows (swarmd.averaging.phases.rows; None: no phase 2 for the part this round)
    rows: dict[str, list[list[str]] | None] = field(default_factory=lambda: {BLOCK: None, EMB: None})
    phase2: RowValues = field(default_factory=RowValues)

    def active(self) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
        """The accepted deltas the merge counts: every kind's inbox without the idle senders' (weight 0)."""
        return {k: {pid: t for pid, t in box.items() if pid not in self.idle[k]} for k, box in self.inbox.items()}

    def judged(self, kind: PayloadKind, peer_id: str) -> None:
        """`peer_id`'s delta of `kind` failed (or will not come this round): the collection stops waiting for it."""
        self.failed[kind].add(peer_id)
        self.arrived.set()

    def stash(self, kind: PayloadKind, peer_id: str, tensors: dict[str, torch.Tensor], idle: bool = False) -> None:
        """An accepted decoded delta, with its arrival time (not of an idle sender's: ready at once, it would teach
        the deadline policy that deltas come early)."""
        self.inbox[kind][peer_id] = tensors
        if idle:
            self.idle[kind].add(peer_id)
        else:
            self.last_arrival = time.monotonic()
            self.arrivals.append(self.last_arrival - self.opened_at)
        self.arrived.set()

    def complete(self, expected: dict[PayloadKind, set[str]]) -> bool:
        """Every expected delta was accepted or judged."""
        return all(expected[k] <= set(self.inbox[k]) | self.failed[k] for k in (BLOCK, EMB))

    async def collect(self, expected: dict[PayloadKind, set[str]], deadline: float) -> None:
        """Wait until complete(expected) or the deadline (time.monotonic()), whichever comes first."""
        while not self.complete(expected):
            self.arrived.clear()
            if self.complete(expected):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(self.arrived.wait(), remaining)
            except TimeoutError:
                break
