"""SwarmService: the transport's SwarmHandler for one daemon (GetStatus, GetConfig, PullState, Exchange, Forward,
DialBack).

A thin adapter in the style of flower's servicers: it reads the peer's state, metrics and reachability check
(swarmd.node.reachability) into pb.PeerStatus / pb.SwarmConfig and delegates PullState and ExchangeDeltas to
Gossip (a pull naming a weights_hash to swarmd.node.served: the serving snapshot of that hash), Forward to the
peer's block server and DialBack to swarmd.node.dialback. No torch math, no policy, no
grpc (the transport's servicer maps the errors raised here to status codes). It never imports swarmd.serve: the
block server arrives through the peer as anything with an async `forward(request)`.
"""

from __future__ import annotations

from typing import Any, Protocol

from swarmd.averaging.gossip import Gossip
from swarmd.averaging.state import BlockState
from swarmd.errors import NotReady, SwarmdError
from swarmd.membership.identity import verify
from swarmd.metrics import Metrics
from swarmd.node.config import DaemonConfig
from swarmd.node.dialback import DialBacks
from swarmd.node.reachability import ReachabilityCheck
from swarmd.node.served import Served, served_payload
from swarmd.protocol import PeerState, swarm_config
from swarmd.transport.auth import CallerCheck
from swarmd.transport.framing import Encoded
from swarmd.transport.limits import Caller, CallerBudget, StreamLimiter
from swarmd.v1 import swarm_pb2 as pb


class Forwarder(Protocol):
    async def forward(self, request: pb.ForwardRequest) -> pb.ForwardReply: ...

    @property
    def served(self) -> Served: ...


class Peer(Protocol):
    """What the service reads of its daemon (swarmd.node.daemon.Daemon); state and gossip are None
    until the daemon has started, serving is None on a peer that serves no inference."""

    @property
    def config(self) -> DaemonConfig: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def phase(self) -> PeerState: ...

    @property
    def peer_id(self) -> str: ...

    @property
    def state(self) -> BlockState | None: ...

    @property
    def gossip(self) -> Gossip | None: ...

    @property
    def serving(self) -> Forwarder | None: ...

    @property
    def address(self) -> str: ...

    @property
    def swarm_key(self) -> bytes | None: ...

    @property
    def reachability(self) -> ReachabilityCheck: ...

    def multiaddrs(self) -> list[str]: ...


class SwarmService:
    """:param peer: the daemon whose state the RPCs expose; read at call time (it fills in as it starts)"""

    def __init__(self, peer: Peer):
        self.peer = peer
        self.dial_backs = DialBacks(peer.swarm_key)  # answers other peers' DialBack

    def status(self) -> pb.PeerStatus:
        p, m = self.peer, self.peer.metrics
        st = p.state
        if st is None:
            raise NotReady("peer is still starting")
        return pb.PeerStatus(
            peer_id=p.peer_id,
            block_index=st.block_index,
            state=p.phase.to_pb(),
            round=st.round,
            local_steps=st.local_steps,
            samples_per_s=m.samples_per_s,
            last_ce=m.last_ce,
            train_ce=m.last_train_ce,
            bytes_sent=m.bytes_sent,
            bytes_received=m.bytes_received,
            participation=m.participation,
            uptime_s=m.uptime_s,
            address=p.address,
            swarm_id=p.config.net.swarm_id,
            config_hash=p.config.model.config_hash(),
            consensus_distance=m.consensus_distance,
            base_hash=st.block_hash,
            emb_hash=st.emb_hash,
            multiaddrs=p.multiaddrs(),
            client_mode=p.config.net.client_mode,
            raw_bytes_sent=m.raw_bytes_sent,
            last_round_s=m.last_round_s,
            sketch=st.sketch,
            param_norm=st.param_norm,
            signed_record=self._signed_record(),
            reachability=p.reachability.result.state,
            reachability_detail=p.reachability.result.line,
        )

    def _signed_record(self) -> str:
        """The peer's current signed record as JSON (static discovery reads and verifies it)."""
        import json

        g = self.peer.gossip
        return json.dumps(g.record(self.peer.config.net.record_ttl_s).to_value()) if g is not None else ""

    def swarm_config(self) -> pb.SwarmConfig:
        return swarm_config(self.peer.config.net.swarm_id, self.peer.config.model)

    async def pull_state(self, request: pb.PullStateRequest) -> Encoded:
        if request.weights_hash:  # exactly the weights a Forward answer named
            serving = self.peer.serving
            return served_payload(self._gossip(), None if serving is None else serving.served, request)
        return await self._gossip().served_state(request)

    async def exchange(self, incoming: Encoded) -> Encoded:
        return await self._gossip().handle_exchange(incoming)

    async def forward(self, request: pb.ForwardRequest) -> pb.ForwardReply:
        if self.peer.serving is None:
            raise SwarmdError("this peer does not serve inference")
        return await self.peer.serving.forward(request)

    async def dial_back(self, request: pb.DialBackRequest, caller: Caller) -> pb.DialBackReply:
        return await self.dial_backs.answer(request, caller)

    def payload_limit(self, header: pb.PayloadHeader) -> int:
        """Largest payload admitted for this header: the exact size under our config (gossip.payload_limit);
        the config's max_payload_bytes while the peer is still starting (its RPCs answer NotReady then)."""
        gossip = self.peer.gossip
        return gossip.payload_limit(header) if gossip is not None else self.peer.config.gossip.max_payload_bytes

    def server_limits(self) -> dict[str, Any]:
        """start_server's keyword arguments that bound what callers can hold (config: NetConfig limits), keyed by
        the peer id a call proves (its Ed25519 signature, signed for this peer, checked by
        swarmd.membership.identity.verify) under a ceiling per caller host; a caller that proves none is keyed by
        its host (swarmd.transport.limits). A proof signed for another peer counts in Metrics.refused_calls."""
        net, metrics = self.peer.config.net, self.peer.metrics
        return dict(
            payload_limit=self.payload_limit,
            streams=StreamLimiter(net.max_streams, net.max_streams_per_peer, net.max_streams_per_identity),
            forward_rate=CallerBudget.of(net.forward_rate, net.forward_burst, net.forward_host_shares),
            callers=CallerCheck(verify, self.peer.peer_id, on_refused=metrics.refuse_call),
            requests=CallerBudget.of(net.request_rate, net.request_burst, net.host_shares),
            pulls=CallerBudget.of(net.pull_rate, net.pull_burst, net.host_shares),
        )

    def _gossip(self) -> Gossip:
        if self.peer.gossip is None:
            raise NotReady("peer is still starting")
        return self.peer.gossip
