"""A DHT that cannot join through its initial peers names each multiaddr tried, why it failed, and the fix
(swarmd.membership.bootstrap): probes of real sockets on 127.0.0.1, no DHT started. The DHT start itself failing
with this message is tests/test_discovery.py's."""

from __future__ import annotations

import socket

import pytest

from swarmd.membership import bootstrap
from swarmd.membership.bootstrap import FIX, bootstrap_failure, host_port, probe

PEER = "QmXnnt3xYtRb1Y4RrTC8mkThQGr5rhr7DVvbTNmY5bMwPi"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_host_port_of_a_multiaddr():
    assert host_port(f"/ip4/10.0.0.1/tcp/31337/p2p/{PEER}") == ("10.0.0.1", 31337)
    assert host_port(f"/dns/peer.example/tcp/1/p2p/{PEER}") == ("peer.example", 1)
    for bad in ("10.0.0.1:31337", "/ip4/10.0.0.1/udp/1", "/ip4/10.0.0.1/tcp/0", "/ip4/10.0.0.1/tcp/x", ""):
        assert host_port(bad) is None, bad


def test_probe_says_why_a_multiaddr_did_not_answer():
    port = closed_port()
    assert probe(f"/ip4/127.0.0.1/tcp/{port}/p2p/{PEER}").startswith("connection refused")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = listening.getsockname()[1]
        assert probe(f"/ip4/127.0.0.1/tcp/{up}/p2p/{PEER}").startswith("the TCP port answers, but no DHT node")
        assert "no /p2p/PEER_ID" in probe(f"/ip4/127.0.0.1/tcp/{up}")
    assert probe("127.0.0.1:31337").startswith("not a multiaddr")


@pytest.mark.parametrize(
    "error, said",
    [
        (TimeoutError(), "no answer within 2 s"),
        (socket.gaierror(-2, "Name or service not known"), "unknown host 'h'"),
        (OSError(113, "No route to host"), "no route to host"),
    ],
)
def test_probe_names_timeouts_unknown_hosts_and_routes(monkeypatch, error, said):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(bootstrap.socket, "create_connection", fail)
    assert probe(f"/dns/h/tcp/1/p2p/{PEER}").startswith(said)


def test_the_message_lists_every_multiaddr_tried_with_its_reason_and_the_fix():
    ports = [closed_port() for _ in range(2)]
    tried = [f"/ip4/127.0.0.1/tcp/{p}/p2p/{PEER}" for p in ports]
    cause = "P2PDaemonError: Daemon failed to start: 2026/12/04 19:30:06 failed to connect to bootstrap peers"
    line = bootstrap_failure([*tried, tried[0]], cause)
    assert "\n" not in line and "2026/12/04" not in line
    assert line.startswith("could not start the DHT (P2PDaemonError: Daemon failed to start: failed to connect to")
    assert "no DHT node answered at the 2 initial peers tried: " in line
    for maddr in tried:
        assert f"{maddr}: connection refused (nothing listens on that port" in line
    assert line.endswith(FIX) and "check that the multiaddrs are right" in line
    many = bootstrap_failure([f"/ip4/127.0.0.1/tcp/{ports[0]}/p2p/Qm{i}" for i in range(10)], "x", 0.5)
    assert many.count("connection refused") == bootstrap.MAX_PROBED and "; and 2 more;" in many
    assert "at the initial peer tried" in bootstrap_failure(tried[:1], "x")
