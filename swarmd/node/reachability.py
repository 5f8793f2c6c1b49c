"""Reachability: can other peers dial this one? Checked at start by asking known peers to dial it back.

Owns the asking side of swarmd.v1.Swarm/DialBack (the answering side is swarmd.node.dialback). A server-mode peer's
ReachabilityCheck runs in the background from Daemon.start(), never blocking nor failing it: for up to WINDOW_S it
looks for known peers with an address (the records its presence finds), asks up to ASK of them at once to dial it
back at its announced port, and logs one line (verdict; on_result hears it too: `blocktrain run` prints it):
`reachable: peers can dial HOST:PORT`, or `not reachable from HOST: REASON; FIX` with the fixes that fit (listen on
every interface for a loopback listener, --announce, forward the port, --client-mode). It asks peers on other hosts
first, and takes the first answers (one reachable answer is enough); a peer that was busy (its dial-backs, or our
budget there) is asked again. Its result (Reachability) is what GetStatus reports and `blocktrain status` shows.
What a peer answers is untrusted: its reason is cut to one short printable line, and a peer that lies can only make
this peer log a wrong hint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from swarmd.errors import Busy
from swarmd.membership.addresses import is_loopback, is_unspecified, split_host_port
from swarmd.membership.records import PeerRecord
from swarmd.node.config import DaemonConfig
from swarmd.node.dialback import DIAL_TIMEOUT_S, one_line
from swarmd.node.presence import Presence
from swarmd.transport import PeerClient, SwarmServer
from swarmd.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)

WINDOW_S = 120.0  # look for peers to ask this long after start (the first peer of a swarm waits for a joiner)
RETRY_S = 2.0  # ... looking again this often while no peer is known or none answered
ASK = 2  # peers asked at once
ASK_TIMEOUT_S = DIAL_TIMEOUT_S + 3.0  # one DialBack call, its dial-back included


@dataclass(frozen=True)
class Reachability:
    """The check's result: pb.Reachability (UNKNOWN until a peer answered) and the line logged."""

    state: pb.Reachability = pb.REACHABILITY_UNKNOWN
    line: str = ""

    @property
    def reachable(self) -> bool | None:
        return None if self.state == pb.REACHABILITY_UNKNOWN else self.state == pb.REACHABILITY_REACHABLE


def candidates(records: list[PeerRecord], me: PeerRecord, limit: int = ASK) -> list[PeerRecord]:
    """Up to `limit` peers to ask: others with an address (not client mode), those on another host first."""
    own_host = _host(me.address)
    others = [r for r in records if r.address and not r.client_mode and r.peer_id != me.peer_id]
    others = [r for r in others if r.address != me.address]
    return sorted(others, key=lambda r: _host(r.address) == own_host)[:limit]


def _host(address: str) -> str:
    try:
        return split_host_port(address)[0]
    except ValueError:
        return address


def fixes(listen: str, announced: str, seen_as: str) -> str:
    """What to do about a peer others cannot dial: the fixes that fit its --listen and announced address.

    :param seen_as: this peer's host as the peer that dialled it back sees it ("" = unknown)
    """
    listen_host, _, listen_port = listen.rpartition(":")
    listen_host = listen_host.strip("[]")
    announced_host, port = split_host_port(announced)
    port_text = str(port) if port else listen_port
    steps = []
    if is_loopback(listen_host):
        bind = listen_port if listen_port not in ("", "0") else port_text  # port 0: the one it bound and announces
        steps.append(f"listen on every interface (--listen 0.0.0.0:{bind}: it listens on {listen_host} only)")
    if seen_as and seen_as != announced_host and not is_unspecified(seen_as):
        steps.append(f"set --announce <address others can dial> (peers see this host as {seen_as})")
    else:
        steps.append("set --announce <address others can dial>")
    steps.append(f"forward TCP port {port_text} to this host")
    return ", ".join(steps) + ", or run with --client-mode"


def verdict(answers: list[tuple[str, pb.DialBackReply]], listen: str, announced: str) -> Reachability:
    """The result of the answers (asked peer's address, its reply): reachable when any dialled us back.

    :param announced: the HOST:PORT this peer announces
    """
    for _, reply in answers:
        if reply.reachable:
            dialled = one_line(reply.dialled, 80)
            line = f"reachable: peers can dial {dialled}"
            if _host(dialled) != _host(announced):
                line += f" (this peer announces {announced}: if other hosts cannot dial that, set --announce)"
            return Reachability(pb.REACHABILITY_REACHABLE, line)
    asked, reply = answers[0]
    seen_as = _host(one_line(reply.dialled, 80)) if reply.dialled else ""
    reason = one_line(reply.reason) or "no reason given"
    line = f"not reachable from {_host(asked)}: {reason}; {fixes(listen, announced, seen_as)}"
    return Reachability(pb.REACHABILITY_UNREACHABLE, line)


class Asker(Protocol):
    """What the check reads of its daemon (swarmd.node.daemon.Daemon), once it has started."""

    @property
    def config(self) -> DaemonConfig: ...

    @property
    def presence(self) -> Presence: ...

    @property
    def client(self) -> PeerClient: ...

    @property
    def me(self) -> PeerRecord: ...

    @property
    def stopping(self) -> asyncio.Event: ...

    @property
    def address(self) -> str: ...

    @property
    def server(self) -> SwarmServer | None: ...


class ReachabilityCheck:
    """:param peer: the daemon that asks (read when start() runs: after its first announce)"""

    def __init__(self, peer: Asker, window_s: float = WINDOW_S, retry_s: float = RETRY_S):
        self.peer, self.window_s, self.retry_s = peer, window_s, retry_s
        self.result = Reachability()
        self.on_result: Callable[[Reachability], None] | None = None  # told the result once (the runner prints it)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Run the check in the background (nothing for a peer without a server: client mode)."""
        if self.peer.address and self._task is None:
            self._task = asyncio.create_task(self.run(), name="reachability check")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self) -> None:
        """Ask known peers until one answers or WINDOW_S passes (one line logged either way); never raises."""
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a check that broke says so and leaves the peer running
            logger.warning("reachability check failed: %s", one_line(str(exc)) or type(exc).__name__)

    async def _run(self) -> None:
        p = self.peer
        deadline, asked, failures = time.monotonic() + self.window_s, set(), []
        while not p.stopping.is_set() and time.monotonic() < deadline:
            records = await p.presence.recent(self.retry_s)
            picks = [r for r in candidates(records, p.me, limit=len(records)) if r.address not in asked][:ASK]
            if picks:
                replies = await asyncio.gather(*(self.ask(r.address) for r in picks), return_exceptions=True)
                asked |= {r.address for r, a in zip(picks, replies) if not isinstance(a, Busy)}  # Busy: ask again
                answers = [(r.address, a) for r, a in zip(picks, replies) if isinstance(a, pb.DialBackReply)]
                failures += [one_line(str(a), 160) for a in replies if isinstance(a, Exception)]
                if answers:
                    self.result = verdict(answers, self.listen(), p.address)
                    logger.info("%s", self.result.line)
                    if self.on_result is not None:
                        self.on_result(self.result)
                    return
            await p.presence.pause(self.retry_s)
        if not p.stopping.is_set():
            why = f"none of {len(asked)} peers asked answered ({failures[-1]})" if asked else "no other peer known"
            logger.info("reachability unknown: %s within %.0f s of start", why, self.window_s)

    def listen(self) -> str:
        """HOST:PORT the gRPC server listens on (--listen's host, the port it bound)."""
        host = self.peer.config.net.listen.rpartition(":")[0]
        server = self.peer.server
        return f"{host}:{server.port}" if server is not None else self.peer.config.net.listen

    async def ask(self, address: str) -> pb.DialBackReply:
        """One peer's answer: did it reach us at our announced port?"""
        me = self.peer.me
        _, port = split_host_port(self.peer.address)
        request = pb.DialBackRequest(port=port or 0, peer_id=me.peer_id, tls_fingerprint=me.tls_fingerprint)
        return await self.peer.client.dial_back(address, request, ASK_TIMEOUT_S)
