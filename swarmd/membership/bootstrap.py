"""Why joining the DHT through its initial peers failed: each multiaddr tried, why it failed, and the fix.

Owns bootstrap_failure, the one-line message swarmd.membership.dht gives when a DHT node with initial peers does
not start. hivemind's own cause names no peer ("failed to connect to bootstrap peers", "none of the
initial_peers responded to a ping"), so each multiaddr is probed here (probe): a TCP connection to its host and
port within PROBE_TIMEOUT_S, all at once, whose outcome (refused, no answer, unknown host, no route, or a port
that answers but no DHT node of that peer id did) says what to fix. The multiaddrs are the operator's own flags;
only their host and port are dialled, once each, and nothing is sent. Plain sockets: no hivemind here.
"""

from __future__ import annotations

import errno
import re
import socket
from concurrent.futures import ThreadPoolExecutor

PROBE_TIMEOUT_S = 2.0  # a multiaddr's TCP port must accept within this
MAX_PROBED = 8  # multiaddrs probed (and named) in one message; the rest are counted
FIX = (
    "check that the multiaddrs are right (copy the `multiaddr:` line a running peer printed) and that those peers "
    "run with their DHT port open to this host (a firewall; behind NAT a peer must forward its --dht-port and "
    "--announce its public address)"
)
_STAMP = re.compile(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d(\.\d+)? ")  # p2pd's log time in its error text


def host_port(maddr: str) -> tuple[str, int] | None:
    """(host, tcp port) of /ip4|ip6|dns|dns4|dns6/HOST/tcp/PORT/..., or None for anything else."""
    parts = maddr.split("/")
    if len(parts) < 5 or parts[0] or parts[1] not in ("ip4", "ip6", "dns", "dns4", "dns6") or parts[3] != "tcp":
        return None
    if not parts[2] or not parts[4].isdigit() or not 0 < int(parts[4]) < 65536:
        return None
    return parts[2], int(parts[4])


def probe(maddr: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Why a DHT node may not have answered at maddr, from a TCP connection to its host and port."""
    target = host_port(maddr)
    if target is None:
        return "not a multiaddr this peer can dial (expected /ip4/HOST/tcp/PORT/p2p/PEER_ID)"
    if "/p2p/" not in maddr:
        return "no /p2p/PEER_ID in it (copy the whole `multiaddr:` line)"
    try:
        with socket.create_connection(target, timeout=timeout_s):
            pass
    except ConnectionRefusedError:
        return "connection refused (nothing listens on that port: is the peer running, and is it its DHT port?)"
    except TimeoutError:
        return f"no answer within {timeout_s:g} s (a firewall, or NAT without the port forwarded)"
    except socket.gaierror:
        return f"unknown host {target[0]!r}"
    except OSError as exc:
        known = {errno.EHOSTUNREACH: "no route to host", errno.ENETUNREACH: "network is unreachable"}
        return known.get(exc.errno or 0, exc.strerror or type(exc).__name__)
    return (
        "the TCP port answers, but no DHT node of that peer id did (an old multiaddr of a peer that restarted "
        "with a new id, another program on that port, or another swarm's node)"
    )


def bootstrap_failure(
    initial_peers: list[str] | tuple[str, ...], cause: str, timeout_s: float = PROBE_TIMEOUT_S
) -> str:
    """The one line for a DHT that could not join through `initial_peers`: hivemind's cause, each multiaddr tried
    with why it failed (probed at once, within timeout_s), and the fix."""
    tried = [str(m) for m in dict.fromkeys(initial_peers)]
    shown = tried[:MAX_PROBED]
    with ThreadPoolExecutor(max_workers=max(1, len(shown))) as pool:
        reasons = list(pool.map(lambda m: probe(m, timeout_s), shown))
    listed = "; ".join(f"{m}: {why}" for m, why in zip(shown, reasons))
    more = f"; and {len(tried) - len(shown)} more" if len(tried) > len(shown) else ""
    cause = " ".join(_STAMP.sub("", cause).split())
    n = len(tried)
    peers = f"the {n} initial peers" if n > 1 else "the initial peer"
    return f"could not start the DHT ({cause}): no DHT node answered at {peers} tried: {listed}{more}; {FIX}"
