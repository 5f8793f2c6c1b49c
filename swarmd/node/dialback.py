"""Answering a dial-back request: can the peer that asks be dialled where it says it listens?

Owns DialBacks, the answering side of swarmd.v1.Swarm/DialBack (the asking side is swarmd.node.reachability). What
another peer asks is hostile input, so a dial-back never dials an address the request names: it dials the host the
call came from (grpc's peer address, as the servicer saw it), at the port the request names, with one GetStatus call
under DIAL_TIMEOUT_S over a fresh channel that is closed afterwards (TLS pinned to the fingerprint the asker gives,
when it gives one). The asker must have proved the peer id it names (its call proof, checked by the servicer), and
the answer counts only when it names that very peer id. The servicer charges each request
swarmd.transport.server.DIAL_BACK_COST of the asker's request budget, and at most MAX_DIALS dial-backs run at once,
one per caller host (its IPv6 /64), the one over Busy. So a stranger can make this peer dial only its own host, at
the budget's pace, and learns only whether a server of its own answered there.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable

from swarmd.errors import Busy, SwarmdError, ValidationError
from swarmd.membership.addresses import join_host_port
from swarmd.transport import PeerClient
from swarmd.transport.limits import Caller
from swarmd.v1 import swarm_pb2 as pb

DIAL_TIMEOUT_S = 3.0  # the dial-back's GetStatus (connect and answer) must be done within this
MAX_DIALS = 4  # dial-backs running at once, all askers together


def one_line(text: str, limit: int = 240) -> str:
    """text on one line of printable characters, at most `limit` long (what a peer sends is logged)."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def dial_address(request: pb.DialBackRequest, caller: Caller) -> str:
    """HOST:PORT a dial-back dials: the caller's own host (an IP address) at the port it names.

    :raises ValidationError: a port outside [1, 65535], a peer id the call did not prove, a host that is no IP
    """
    if not 1 <= request.port <= 65535:
        raise ValidationError(f"a dial-back port must be in [1, 65535], got {request.port}")
    if not caller.peer_id or request.peer_id != caller.peer_id:
        who = request.peer_id[-6:] or "no peer"
        raise ValidationError(f"a dial-back request for {who} sent by {caller}: ask for your own peer id")
    try:
        ip = ipaddress.ip_address(caller.host)
    except ValueError:
        raise ValidationError(f"cannot dial back a caller at {caller.host!r}") from None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None  # a dual-stack listener's view
    return join_host_port(str(mapped or ip), request.port)


class DialBacks:
    """:param swarm_key: the swarm's key (the asker's server asks a proof of it; None: a public swarm)
    :param client: makes the PeerClient of one dial-back (tests)"""

    def __init__(
        self,
        swarm_key: bytes | None = None,
        timeout_s: float = DIAL_TIMEOUT_S,
        max_dials: int = MAX_DIALS,
        client: Callable[[], PeerClient] | None = None,
    ):
        self.timeout_s, self.max_dials = timeout_s, max_dials
        self.client = client or (lambda: PeerClient(swarm_key=swarm_key))
        self.running = 0
        self._hosts: set[str] = set()  # caller hosts (Caller.ceiling) with a dial-back in flight: one each
        self.answered = 0  # dial-backs done (either answer)

    async def answer(self, request: pb.DialBackRequest, caller: Caller) -> pb.DialBackReply:
        """Dial the caller back (dial_address) and say whether the peer it proved answered there.

        :raises ValidationError: a request dial_address refuses; Busy: MAX_DIALS run already
        """
        address = dial_address(request, caller)
        if self.running >= self.max_dials:
            raise Busy(f"{self.running} dial-backs run already (limit {self.max_dials}); retry later")
        if caller.ceiling in self._hosts:
            raise Busy(f"a dial-back to {caller.ceiling} runs already; retry later")
        self.running += 1
        self._hosts.add(caller.ceiling)
        try:
            reason = await self._dial(address, request)
        finally:
            self.running -= 1
            self._hosts.discard(caller.ceiling)
        self.answered += 1
        return pb.DialBackReply(reachable=not reason, dialled=address, reason=reason)

    async def _dial(self, address: str, request: pb.DialBackRequest) -> str:
        """Why the peer of `request` did not answer GetStatus at address ("" when it did)."""
        client = self.client()
        try:
            async with asyncio.timeout(self.timeout_s):
                if request.tls_fingerprint:
                    await client.pin(address, request.tls_fingerprint)
                status = await client.status(address, self.timeout_s)
        except TimeoutError:
            return f"no answer at {address} within {self.timeout_s:g} s (a firewall, or a port not forwarded?)"
        except SwarmdError as exc:
            return one_line(str(exc))
        finally:
            await client.close()
        if status.peer_id != request.peer_id:
            return f"{address} answered as another peer ({status.peer_id[-6:] or 'no id'}, not {request.peer_id[-6:]})"
        return ""
