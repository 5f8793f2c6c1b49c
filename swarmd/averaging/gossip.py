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
                rejoining a majority or the fresh states after isolation, pulls, the states served
  swarmd.membership.quorum  the pure quorum rules over signed records the agreement applies
Talks to a Transport protocol (PeerClient, or an in-memory one in tests) and a Discovery lookup; no grpc
or hivemind imports. Every merge is a pure function of the accepted deltas (merge.merge_deltas).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import torch

from swarmd.averaging.agreement import Agreement
from swarmd.averaging.config import GossipConfig
from swarmd.averaging.context import PeerContext, Transport
from swarmd.averaging.deadline import DeadlinePolicy
from swarmd.averaging.delta import ErrorFeedback
from swarmd.averaging.exchange import Exchange, MergeReport, Round
from swarmd.averaging.groups import Anchor
from swarmd.averaging.state import BlockState
from swarmd.backoff import Backoff
from swarmd.membership.identity import Identity
from swarmd.membership.records import PeerRecord
from swarmd.metrics import Metrics
from swarmd.protocol import PayloadKind
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb


class Gossip:
    """Averaging rounds of one peer: a PeerContext (peer), its rounds (rounds) and its state agreement (agreement).

    :param state: the peer's BlockState
    :param transport: dials peers (PeerClient or an in-memory stand-in)
    :param me: this peer's record (peer_id, address, block, client mode, swarm id, config hash)
    """

    def __init__(
        self,
        state: BlockState,
        transport: Transport,
        cfg: GossipConfig,
        me: PeerRecord,
        metrics: Metrics,
        *,
        identity: Identity,
        lookup: Callable[[], Awaitable[list[PeerRecord]]] | None = None,
    ):
        """:param identity: signs this peer's records and payloads; me.peer_id must be its peer id
        :param lookup: a fresh discovery lookup, used when a delta arrives from a peer whose signed record
            for that block and round we have not seen yet (None: only the records given to sync/average)"""
        self.peer = PeerContext(state, transport, cfg, me, metrics, identity=identity, lookup=lookup)
        self.rounds = Exchange(self.peer)
        self.agreement = Agreement(self.peer)

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

    # -- state agreement (swarmd.averaging.agreement) ------------------------------------------------
    async def sync(self, records: list[PeerRecord]) -> list[str]:
        """Adopt the reference's block and embedding if our base differs; returns what was pulled."""
        return await self.agreement.sync(records)

    async def pull(
        self,
        peer: PeerRecord,
        kind: PayloadKind,
        expect: tuple[str, int] | None = None,
        round_limit: int | None = None,
        back: bool = False,
    ) -> None:
        """Download a peer's block or embedding state (signed, validated) and adopt it (Agreement.pull)."""
        await self.agreement.pull(peer, kind, expect, round_limit, back)

    async def fetch_block(self, peer: PeerRecord) -> dict[str, torch.Tensor]:
        """Download (and validate) another peer's block state without adopting it (CE measurement)."""
        return await self.agreement.fetch_block(peer)

    def state_payload(self, request: pb.PullStateRequest) -> Encoded:
        """The base (merged) block or embedding as an fp32 payload, for PullState."""
        return self.agreement.state_payload(request)

    # -- the context (swarmd.averaging.context) ------------------------------------------------------
    def record(self, ttl_s: float = 300.0) -> PeerRecord:
        """This peer's current record (what announce publishes), signed, valid for ttl_s seconds."""
        return self.peer.record(ttl_s)

    def payload_limit(self, header: pb.PayloadHeader) -> int:
        """Bytes a payload with this header may have (0: refused); see PeerContext.payload_limit."""
        return self.peer.payload_limit(header)

    def norm_bound(self, kind: PayloadKind) -> float:
        """Largest decoded delta norm of this kind merged (inf: no bound)."""
        return self.peer.norm_bound(kind)

    def _hdr(self, kind: PayloadKind, round: int) -> dict:
        """PeerContext.hdr (a subclass re-encoding its payloads, benchmarks/adversary.py, signs these fields)."""
        return self.peer.hdr(kind, round)

    @property
    def state(self) -> BlockState:
        return self.peer.state

    @property
    def transport(self) -> Transport:
        return self.peer.transport

    @property
    def cfg(self) -> GossipConfig:
        return self.peer.cfg

    @cfg.setter
    def cfg(self, cfg: GossipConfig) -> None:
        self.peer.cfg = cfg

    @property
    def me(self) -> PeerRecord:
        return self.peer.me

    @property
    def metrics(self) -> Metrics:
        return self.peer.metrics

    @property
    def identity(self) -> Identity:
        return self.peer.identity

    @property
    def lookup(self) -> Callable[[], Awaitable[list[PeerRecord]]] | None:
        return self.peer.lookup

    @property
    def tag(self) -> str:
        return self.peer.tag

    @property
    def known(self) -> dict[str, PeerRecord]:
        return self.peer.known

    @property
    def bans(self) -> Backoff:
        return self.peer.bans

    @property
    def ef(self) -> dict[PayloadKind, ErrorFeedback]:
        return self.peer.ef

    @property
    def anchors(self) -> dict[PayloadKind, Anchor]:
        return self.peer.anchors

    @property
    def last_split(self) -> dict[str, tuple[set[str], set[str]]]:
        return self.peer.last_split

    @property
    def current(self) -> Round | None:
        return self.rounds.current

    @property
    def deadline(self) -> DeadlinePolicy:
        return self.rounds.deadline

    @deadline.setter
    def deadline(self, policy: DeadlinePolicy) -> None:
        self.rounds.deadline = policy

    @property
    def history(self) -> dict[str, dict[int, str]]:
        return self.agreement.history

    @property
    def isolated(self) -> dict[PayloadKind, int]:
        return self.agreement.isolated
