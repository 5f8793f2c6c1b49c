"""Gossip: one peer's averaging, the round protocol and the state agreement over one shared context.

The averaging protocol (litepaper §2.3-2.4, ../shared/docs/gossip.md), piece by piece:
  context.py    PeerContext: who the peer is, what it averages, whom it knows, how it talks; the payload
                rules (headers, signing, decoding within our shapes and cap, the delta norm bound)
  exchange.py   Exchange: the rounds. Own deltas encoded with error feedback after H local steps, swapped
                bidirectionally (exactly one side of each pair dials), each incoming delta verified,
                judged against round, sender record, group and base, decoded, norm-checked, stashed;
                the collection ends when all expected peers answered or at the deadline
  deadline.py   DeadlinePolicy: the participation target, else the adaptive EMA deadline
  merge.py      the merge rule (robust or plain mean, in peer-id order: bit-identical replicas) and its
                landing (anchors under group averaging, land_merge under overlap)
  agreement.py  Agreement: re-sync to the reference a quorum of signed records announces, split rounds,
                rejoining a majority or the fresh states after isolation, verified adoption
  pulls.py      StatePulls: the signed states pulled (validated, not adopted) and the states served (PullState)
  swarmd.membership.quorum  the pure quorum rules over signed records the agreement applies
Talks to a Transport protocol (PeerClient, or an in-memory one in tests) and a Discovery lookup; no grpc
or hivemind imports. Every merge is a pure function of the accepted deltas (merge.merge_deltas).
"""

from __future__ import annotations

from functools import cached_property

import torch

from swarmd.averaging.agreement import Agreement
from swarmd.averaging.context import PeerContext
from swarmd.averaging.deadline import DeadlinePolicy
from swarmd.averaging.exchange import Exchange
from swarmd.averaging.round import MergeReport, Round
from swarmd.membership.records import PeerRecord
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb


class Gossip(PeerContext):
    """Averaging rounds of one peer: its PeerContext (this object), its rounds (Exchange) and its state
    agreement (Agreement), both over the same context.

    Built with PeerContext's parameters (state, transport, cfg, me, metrics, identity, lookup).
    """

    @cached_property
    def rounds(self) -> Exchange:
        """The round protocol over this context (made on first use, with the context's state as it is then)."""
        return Exchange(self)

    @cached_property
    def agreement(self) -> Agreement:
        """The state agreement over this context."""
        return Agreement(self)

    # -- the round (swarmd.averaging.exchange) -------------------------------------------------------
    async def open_round(self) -> None:
        """Start accepting deltas for the round we are about to train (call after sync)."""
        await self.rounds.open_round()

    async def publish(self) -> None:
        """Encode this round's deltas (error feedback) and let waiting callers have them."""
        await self.rounds.publish()

    async def handle_exchange(self, incoming: Encoded) -> Encoded:
        """Callee side of ExchangeDeltas: validate and stash the caller's delta, answer with ours."""
        return await self.rounds.handle_exchange(incoming)

    async def average(self, records: list[PeerRecord]) -> MergeReport:
        """Publish own deltas (self.publish), exchange with the peers in `records`, wait for the deadline, merge."""
        return await self.rounds.average(records, self.publish)

    @property
    def current(self) -> Round | None:
        """The round open now (None before the first open_round)."""
        return self.rounds.current

    @property
    def deadline(self) -> DeadlinePolicy:
        return self.rounds.deadline

    @deadline.setter
    def deadline(self, policy: DeadlinePolicy) -> None:
        self.rounds.deadline = policy

    # -- state agreement (swarmd.averaging.agreement) ------------------------------------------------
    async def sync(self, records: list[PeerRecord]) -> list[str]:
        """Adopt the reference's block and embedding if our base differs; returns what was pulled."""
        return await self.agreement.sync(records)

    async def fetch_block(
        self, peer: PeerRecord, compact: bool = False, chain: bool = False
    ) -> dict[str, torch.Tensor]:
        """Download (and validate) another peer's block state without adopting it (StatePulls.fetch_block)."""
        return await self.agreement.pulls.fetch_block(peer, compact, chain)

    async def fetch_working(
        self, peer: PeerRecord, compact: bool = False, held: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """Another block's working weights now (mid-round; StatePulls.fetch_working)."""
        return await self.agreement.pulls.fetch_working(peer, compact, held)

    async def served_state(self, request: pb.PullStateRequest) -> Encoded:
        """PullState's answer: the state, after this round's end when asked for the next (StatePulls.served_state)."""
        return await self.agreement.pulls.served_state(request)
