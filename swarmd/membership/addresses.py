"""Network addresses of a peer: what it binds, what it tells others to dial, and checks of given addresses.

Owns the rules (plain sockets and strings; no grpc, hivemind or torch here):
  dht_listen_host    the interface the DHT listens on: --dht-host, else the --listen host's kind (every
                     interface, loopback, or that address), so a peer listening on 0.0.0.0 is joinable as is
  plan_addresses     the gRPC host others are told to dial (--announce, else the --listen host, else, when
                     listening on 0.0.0.0 / ::, an interface address found by detect_host), where the DHT
                     listens and the host it announces (only where another host can reach its listener),
                     with the warnings to log
  multiaddr          /ip4|ip6|dns/HOST/tcp/PORT of a host and port
  preferred_multiaddr  the multiaddr the `join with:` hint shows (not loopback when there is another)
  check_peer_address   a peer address is a multiaddr (/ip4/HOST/tcp/PORT/p2p/PEER_ID) or HOST:PORT
  check_listen_ports fail in milliseconds when a --listen / --dht-port port is taken, before anything starts
detect_host sends no packet: the source address of a UDP socket "connected" to a private-range
address is the interface the host would route through; without such a route (a host on one subnet
only, e.g. a network namespace on a bridge), the first interface's address (interface_addresses).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass, field

from swarmd.errors import ConfigError, SwarmdError

# private-range addresses a UDP socket is "connected" to (no packet is sent) to learn the outgoing interface
PROBE_ADDRESSES = ("10.255.255.255", "172.31.255.255", "192.168.255.255")
MULTIADDR_EXAMPLE = "/ip4/HOST/tcp/PORT/p2p/PEER_ID"


def split_host_port(text: str) -> tuple[str, int | None]:
    """("host", port or None) of "HOST", "HOST:PORT", "[V6]:PORT" or a bare IPv6 address.

    :raises ValueError: empty host, or a port that is not a number in [1, 65535]
    """
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad address {text!r}")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:  # a bare IPv6 address has no port
        host, port_text = text, None
    else:
        host, sep, port_text = text.partition(":")
        port_text = port_text if sep else None
    if not host or any(c in host for c in " /"):
        raise ValueError(f"bad host in {text!r}")
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port must be a number in [1, 65535], got {port_text!r} in {text!r}")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def is_unspecified(host: str) -> bool:
    """0.0.0.0, :: or empty: a listener on every interface, an address no other host can dial."""
    ip = _ip(host)
    return not host or (ip is not None and ip.is_unspecified)


def is_loopback(host: str) -> bool:
    ip = _ip(host)
    return host == "localhost" or (ip is not None and ip.is_loopback)


def detect_host(probes: tuple[str, ...] = PROBE_ADDRESSES) -> str | None:
    """An IPv4 address of this host that other hosts can dial (None if it has only loopback).

    First the source address of a UDP socket "connected" to a private-range address (no packet
    leaves), then the first interface's address, then the addresses the host name resolves to that
    are this host's (in a network namespace the name may resolve to another namespace's address).
    """
    for probe in probes:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                found = s.getsockname()[0]
        except OSError:
            continue
        if not is_loopback(found) and not is_unspecified(found):
            return found
    for found in interface_addresses():
        if not is_loopback(found) and not is_unspecified(found):
            return found
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    return next((h for h in (str(i[4][0]) for i in infos) if not is_loopback(h) and _is_local(h)), None)


SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def interface_addresses() -> list[str]:
    """The IPv4 address of each interface that has one, in interface order (Linux; [] elsewhere)."""
    try:
        import fcntl
        import struct

        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError, AttributeError):
        return []
    found: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                reply = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address (EADDRNOTAVAIL), or not Linux
                continue
            found.append(socket.inet_ntoa(reply[20:24]))
    return found


def _is_local(host: str) -> bool:
    """host is an address of this machine (a socket can bind it)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((host, 0))
    except OSError:
        return False
    return True


def dht_listen_host(listen: str, dht_host: str = "") -> str:
    """The interface the DHT listens on: dht_host (--dht-host) when given, else the --listen host's kind.

    Every interface (0.0.0.0 or ::) gives 0.0.0.0, loopback 127.0.0.1, an address that address and
    a name the IPv4 address it resolves to: a peer listening on 0.0.0.0 is joinable from other hosts
    without --dht-host, one on loopback stays on loopback.
    """
    if dht_host:
        return dht_host
    host = listen.rpartition(":")[0].strip("[]")
    if is_unspecified(host):
        return "0.0.0.0"
    if is_loopback(host):
        return "127.0.0.1"
    if _ip(host) is not None:
        return host
    try:  # a name: libp2p listens on addresses only
        resolved = str(socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError):
        return host  # unknown: check_bindable says so (for --listen, checked first)
    return "127.0.0.1" if is_loopback(resolved) else resolved


@dataclass(frozen=True)
class AddressPlan:
    grpc_host: str  # the host other peers dial for gRPC (never 0.0.0.0)
    grpc_port: int | None  # the port they dial (None = the port the server bound)
    dht_announce_host: str  # the host the DHT announces in its multiaddrs ("" = let libp2p list its listeners)
    warnings: list[str] = field(default_factory=list)  # to log once at start
    dht_host: str = "127.0.0.1"  # the interface the DHT listens on (dht_listen_host)

    def grpc_address(self, bound_port: int) -> str:
        return join_host_port(self.grpc_host, self.grpc_port or bound_port)


def plan_addresses(listen: str, announce: str = "", dht_host: str = "", dht: bool = True) -> AddressPlan:
    """Where others reach this peer, from --listen HOST:PORT, --announce HOST[:PORT] and --dht-host.

    :param dht_host: the --dht-host given ("" = follow the --listen host: dht_listen_host)
    :param dht: the peer runs a DHT listener (not in client mode nor with static discovery)
    """
    listen_host = listen.rpartition(":")[0].strip("[]")
    dht_host = dht_listen_host(listen, dht_host)
    explicit, explicit_port = split_host_port(announce) if announce else ("", None)
    warnings: list[str] = []
    detected: str | None = None
    if not explicit and (is_unspecified(listen_host) or (dht and is_unspecified(dht_host))):
        detected = detect_host()
    if explicit:
        grpc_host = explicit
    elif not is_unspecified(listen_host):
        grpc_host = listen_host
    else:
        grpc_host = detected or "127.0.0.1"
        if detected is None:
            warnings.append(
                f"listening on {listen_host}, but this host has no address besides loopback: announcing 127.0.0.1, "
                "which other hosts cannot dial (pass --announce HOST)"
            )
    dht_announce = ""
    if dht:
        if is_unspecified(dht_host):
            dht_announce = explicit or detected or "127.0.0.1"
        elif not is_loopback(dht_host) and explicit and explicit != dht_host:
            dht_announce = explicit  # e.g. a public address forwarded to this interface
        if is_loopback(dht_host) and not is_loopback(grpc_host):
            warnings.append(
                f"the DHT listens on {dht_host} only: peers on other hosts cannot join through it "
                "(pass --dht-host 0.0.0.0)"
            )
        if dht_announce and not is_loopback(dht_announce) and is_loopback(grpc_host):
            warnings.append(
                f"the gRPC server listens on {grpc_host} only: peers on other hosts find this peer through the DHT "
                "but cannot dial it (pass --listen 0.0.0.0:PORT)"
            )
    return AddressPlan(grpc_host, explicit_port, dht_announce, warnings, dht_host)


def multiaddr(host: str, port: int) -> str:
    """/ip4/HOST/tcp/PORT (ip6 for an IPv6 address, dns for a name)."""
    ip = _ip(host)
    proto = "dns" if ip is None else f"ip{ip.version}"
    return f"/{proto}/{host.strip('[]')}/tcp/{port}"


def multiaddr_host(maddr: str) -> str:
    parts = maddr.split("/")
    return parts[2] if len(parts) > 2 and parts[1] in ("ip4", "ip6", "dns", "dns4", "dns6") else ""


def preferred_multiaddr(maddrs: list[str]) -> str:
    """The multiaddr to hand to other hosts: the first that is not loopback, else the first ("" if none)."""
    return next((m for m in maddrs if not is_loopback(multiaddr_host(m))), maddrs[0] if maddrs else "")


def free_port(host: str) -> int:
    """A TCP port free on host now (for a listener that must know its port before it starts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host.strip("[]"), 0))
        return int(s.getsockname()[1])


def check_bindable(host: str, port: int, flag: str = "--listen") -> None:
    """Fail now, with the cause, if host:port cannot be listened on (port 0 always can).

    :raises SwarmdError: the port is taken, the host is not an address of this machine, or unknown
    """
    if port == 0:
        return
    where = join_host_port(host, port)
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        raise SwarmdError(f"cannot listen on {where} ({flag}): unknown host {host!r}") from None
    family, kind, proto, _, sockaddr = infos[0]
    try:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: a TIME_WAIT port is free
            s.bind(sockaddr)
    except OSError as exc:
        cause = {
            errno.EADDRINUSE: "the port is already in use (another daemon?); pick another port, or 0 for any free one",
            errno.EADDRNOTAVAIL: f"{host} is not an address of this machine",
            errno.EACCES: "permission denied (ports below 1024 need privileges)",
        }.get(exc.errno or 0, exc.strerror or str(exc))
        raise SwarmdError(f"cannot listen on {where} ({flag}): {cause}") from None


def check_listen_ports(listen: str, dht_host: str, dht_port: int, *, server: bool = True, dht: bool = True) -> None:
    """check_bindable for the gRPC --listen address (when there is a server) and the --dht-port (when a DHT listens,
    on dht_listen_host: dht_host "" follows --listen)."""
    if server:
        host, _, port = listen.rpartition(":")
        check_bindable(host.strip("[]"), int(port), "--listen")
    if dht:
        check_bindable(dht_listen_host(listen, dht_host), dht_port, "--dht-port")


def is_multiaddr(text: str) -> bool:
    return text.startswith("/")


def check_peer_address(text: str) -> str:
    """'multiaddr' or 'hostport' for a valid peer address.

    :raises ConfigError: neither a multiaddr with a port and a /p2p/ peer id nor HOST:PORT
    """
    if text.startswith("/"):
        parts = text.split("/")[1:]
        pairs = dict(zip(parts[::2], parts[1::2]))
        ports = [pairs.get(k, "") for k in ("tcp", "udp") if k in pairs]
        ip4 = pairs.get("ip4")
        if not pairs.get("p2p"):
            raise ConfigError(
                f"multiaddr {text!r} has no /p2p/PEER_ID: copy a whole `multiaddr:` line that `blocktrain run` printed"
            )
        if not ports or not all(p.isdigit() and 0 < int(p) < 65536 for p in ports):
            raise ConfigError(f"multiaddr {text!r} has no /tcp/PORT; expected {MULTIADDR_EXAMPLE}")
        if ip4 is not None and (not isinstance(_ip(ip4), ipaddress.IPv4Address)):
            raise ConfigError(f"multiaddr {text!r}: {ip4!r} is not an IPv4 address")
        return "multiaddr"
    try:
        _, port = split_host_port(text)
    except ValueError as exc:
        raise ConfigError(
            f"peer address {text!r} is neither a multiaddr ({MULTIADDR_EXAMPLE}) nor HOST:PORT ({exc})"
        ) from None
    if port is None:
        raise ConfigError(
            f"peer address {text!r} is neither a multiaddr ({MULTIADDR_EXAMPLE}) nor HOST:PORT (no port given)"
        )
    return "hostport"


def check_peer_addresses(addresses: list[str] | tuple[str, ...]) -> None:
    """check_peer_address for each; ConfigError for the first bad one."""
    for a in addresses:
        check_peer_address(a)
