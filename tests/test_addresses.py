"""Reachable addresses (--announce, --dht-port, a stable peer id, the join hint) and network bad input.

The announce tests listen on 0.0.0.0 and announce 127.0.0.2, a loopback alias Linux routes to the
same host: whatever dials the announced address proves it is the one other hosts are told.
"""

from __future__ import annotations

import asyncio
import glob
import os
import selectors
import socket
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from swarm_utils import daemon_config, running, write_corpus
from typer.testing import CliRunner

from cli.main import app
from swarmd.errors import ConfigError, SwarmdError
from swarmd.membership import addresses, dht
from swarmd.membership.addresses import (
    check_bindable,
    check_peer_address,
    dht_listen_host,
    multiaddr,
    plan_addresses,
    preferred_multiaddr,
    split_host_port,
)
from swarmd.membership.dht import HivemindDiscovery
from swarmd.membership.discovery import connect_discovery
from swarmd.node.config import DaemonConfig, NetConfig
from swarmd.node.runner import join_hint
from swarmd.transport import PeerClient

runner = CliRunner()
ALIAS = "127.0.0.2"  # announced by the daemons below; reachable on Linux through the loopback interface
TINY = ["--blocks", "2", "--layers-per-block", "1", "--d-model", "32", "--n-heads", "2", "--seq-len", "16"]
DEAD_PEER = "/ip4/127.0.0.1/tcp/1/p2p/QmXnnt3xYtRb1Y4RrTC8mkThQGr5rhr7DVvbTNmY5bMwPi"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def taken_port():
    """A port with a listener on 127.0.0.1 for the test's duration."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


# -- the rules ---------------------------------------------------------------------------------------
def test_split_host_port_and_multiaddrs():
    assert split_host_port("10.0.0.5") == ("10.0.0.5", None)
    assert split_host_port("node-a:50051") == ("node-a", 50051)
    assert split_host_port("[::1]:7") == ("::1", 7) and split_host_port("fe80::1") == ("fe80::1", None)
    for bad in ("host:x", "host:0", "host:70000", ":5", "a b:5"):
        with pytest.raises(ValueError):
            split_host_port(bad)
    assert multiaddr("10.0.0.5", 31337) == "/ip4/10.0.0.5/tcp/31337"
    assert multiaddr("::1", 1) == "/ip6/::1/tcp/1" and multiaddr("node-a", 2) == "/dns/node-a/tcp/2"
    loop, lan = "/ip4/127.0.0.1/tcp/5/p2p/Qm1", "/ip4/192.168.1.4/tcp/5/p2p/Qm1"
    assert preferred_multiaddr([loop, lan]) == lan and preferred_multiaddr([loop]) == loop
    assert preferred_multiaddr([]) == ""


def test_plan_announces_a_dialable_host(monkeypatch):
    monkeypatch.setattr(addresses, "detect_host", lambda: "192.168.1.4")
    local = plan_addresses("127.0.0.1:0")
    assert (local.grpc_host, local.dht_announce_host, local.warnings) == ("127.0.0.1", "", [])
    everywhere = plan_addresses("0.0.0.0:50051", "", "0.0.0.0")  # the Dockerfile's flags
    assert everywhere.grpc_address(50051) == "192.168.1.4:50051" and everywhere.dht_announce_host == "192.168.1.4"
    assert not everywhere.warnings
    told = plan_addresses("0.0.0.0:0", "203.0.113.7:6000", "0.0.0.0")  # a NAT's forwarded address and port
    assert told.grpc_address(41234) == "203.0.113.7:6000" and told.dht_announce_host == "203.0.113.7"
    dht_on_loopback = plan_addresses("0.0.0.0:0", "", "127.0.0.1")  # an explicit --dht-host 127.0.0.1
    assert dht_on_loopback.grpc_host == "192.168.1.4" and dht_on_loopback.dht_announce_host == ""
    assert dht_on_loopback.dht_host == "127.0.0.1"
    assert any("--dht-host 0.0.0.0" in w for w in dht_on_loopback.warnings)
    grpc_on_loopback = plan_addresses("127.0.0.1:0", "", "0.0.0.0")
    assert any("--listen 0.0.0.0" in w for w in grpc_on_loopback.warnings)
    monkeypatch.setattr(addresses, "detect_host", lambda: None)  # a host with loopback only
    alone = plan_addresses("0.0.0.0:0", "", "0.0.0.0")
    assert alone.grpc_host == "127.0.0.1" and any("--announce HOST" in w for w in alone.warnings)


def test_the_dht_follows_the_listen_host_unless_told(monkeypatch):
    """No --dht-host: the DHT listens where gRPC does (its kind), so `--listen 0.0.0.0:PORT` alone is joinable."""
    monkeypatch.setattr(addresses, "detect_host", lambda: "192.168.1.4")
    assert dht_listen_host("0.0.0.0:50051") == "0.0.0.0" and dht_listen_host("[::]:1") == "0.0.0.0"
    assert dht_listen_host("127.0.0.1:0") == dht_listen_host("[::1]:0") == dht_listen_host("localhost:0") == "127.0.0.1"
    assert dht_listen_host("10.0.0.5:50051") == "10.0.0.5"
    assert (
        dht_listen_host("0.0.0.0:0", "127.0.0.1") == "127.0.0.1"
        and dht_listen_host("127.0.0.1:0", "0.0.0.0") == "0.0.0.0"
    )
    everywhere = plan_addresses("0.0.0.0:50051")  # `blocktrain run --listen 0.0.0.0:50051`, no other flag
    assert (everywhere.dht_host, everywhere.dht_announce_host) == ("0.0.0.0", "192.168.1.4")
    assert everywhere.grpc_address(50051) == "192.168.1.4:50051" and not everywhere.warnings
    local = plan_addresses("127.0.0.1:0")  # the default --listen stays on loopback
    assert (local.dht_host, local.dht_announce_host, local.warnings) == ("127.0.0.1", "", [])
    assert NetConfig().dht_host == "" and plan_addresses(NetConfig().listen, "", NetConfig().dht_host) == local
    # a config written before the default followed --listen says 127.0.0.1 outright, and keeps meaning it
    old = DaemonConfig.from_dict({"net": {"listen": "0.0.0.0:50051", "dht_host": "127.0.0.1"}}).net
    assert (
        old.dht_host == "127.0.0.1" and plan_addresses(old.listen, old.announce, old.dht_host).dht_host == "127.0.0.1"
    )
    assert DaemonConfig.from_dict(DaemonConfig().to_dict()).net.dht_host == ""


def test_the_join_hint_is_dialable_from_another_host():
    loop, lan = "/ip4/127.0.0.1/tcp/5/p2p/Qm1", "/ip4/192.168.1.4/tcp/5/p2p/Qm1"
    assert join_hint([loop, lan], "sw") == f"blocktrain join {lan} --data FILE --swarm-id sw --listen 0.0.0.0:0"
    assert join_hint([loop], "sw") == f"blocktrain join {loop} --data FILE --swarm-id sw"


def test_detect_host_is_not_loopback_or_none():
    found = addresses.detect_host()
    assert found is None or not (addresses.is_loopback(found) or addresses.is_unspecified(found))
    assert all(not addresses.is_unspecified(a) for a in addresses.interface_addresses())
    assert "127.0.0.1" in addresses.interface_addresses() or not sys.platform.startswith("linux")


def test_peer_addresses_are_checked():
    assert check_peer_address(DEAD_PEER) == "multiaddr" and check_peer_address("10.0.0.5:50051") == "hostport"
    for bad, words in [
        ("not-a-multiaddr", "neither a multiaddr"),
        ("host:port", "neither a multiaddr"),
        ("/ip4/127.0.0.1/tcp/5", "/p2p/PEER_ID"),
        ("/ip4/127.0.0.1/p2p/Qm1", "/tcp/PORT"),
        ("/ip4/300.1.1.1/tcp/5/p2p/Qm1", "not an IPv4 address"),
    ]:
        with pytest.raises(ConfigError, match=words):
            check_peer_address(bad)
    with pytest.raises(ConfigError, match="neither a multiaddr"):
        NetConfig(initial_peers=("not-a-multiaddr",))
    with pytest.raises(ConfigError, match="other hosts can dial"):
        NetConfig(announce="0.0.0.0")
    with pytest.raises(ConfigError, match="dht_port"):
        NetConfig(dht_port=70000)
    assert NetConfig(announce="[::1]:5", dht_port=31337).announce == "[::1]:5"


def test_a_taken_port_fails_at_once(taken_port):
    start = time.monotonic()
    with pytest.raises(SwarmdError, match="already in use"):
        check_bindable("127.0.0.1", taken_port, "--listen")
    with pytest.raises(SwarmdError, match="not an address of this machine"):
        check_bindable("192.0.2.254", free_port())
    assert time.monotonic() - start < 1.0
    check_bindable("127.0.0.1", 0)  # port 0: always fine


# -- network bad input through the CLI ----------------------------------------------------------------
def test_status_of_a_closed_port_says_connection_refused_fast():
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    result = runner.invoke(app, ["status", address, "--timeout-s", "15"])
    took = time.monotonic() - start
    assert result.exit_code == 1 and "connection refused" in result.output, result.output
    assert result.output.count("\n") == 1 and "Deadline" not in result.output
    assert took < 3.0, took


def test_join_and_status_refuse_a_malformed_peer_address(tmp_path):
    data = write_corpus(tmp_path)
    start = time.monotonic()
    join = runner.invoke(app, ["join", "not-a-multiaddr", "--data", str(data)])
    took = time.monotonic() - start
    status = runner.invoke(app, ["status", "--swarm", "/ip4/127.0.0.1/tcp/5"])
    run = runner.invoke(app, ["run", "host:port", "--data", str(data)])
    assert join.exit_code == 2 and "neither a multiaddr" in join.output and join.output.count("\n") == 1
    assert took < 3.0, took
    assert status.exit_code == 2 and "/p2p/PEER_ID" in status.output
    assert run.exit_code == 2 and "neither a multiaddr" in run.output


def test_a_taken_listen_port_is_one_line_before_anything_starts(tmp_path, taken_port):
    data = write_corpus(tmp_path)
    start = time.monotonic()
    listen = runner.invoke(app, ["run", "--listen", f"127.0.0.1:{taken_port}", "--data", str(data), *TINY])
    dht = runner.invoke(app, ["run", "--dht-port", str(taken_port), "--data", str(data), *TINY])
    assert time.monotonic() - start < 3.0
    assert listen.exit_code == 1 and listen.output.startswith("error: cannot listen on") and "--listen" in listen.output
    assert listen.output.count("\n") == 1 and "already in use" in listen.output
    assert dht.exit_code == 1 and "(--dht-port): the port is already in use" in dht.output


def test_the_cli_process_silences_grpc_core_logs(taken_port):
    """A bind that fails inside gRPC itself prints our one error line only, no `E... add_port.cc` log line."""
    code = (
        "import cli, asyncio\n"
        "from swarmd.transport import start_server\n"
        f"try:\n    asyncio.run(start_server(None, '127.0.0.1', {taken_port}))\n"
        "except Exception as exc:\n    print('error:', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert "error: cannot listen" in done.stdout, done.stdout + done.stderr
    assert "add_port" not in done.stderr and done.stderr.strip() == "", done.stderr


# -- real daemons and DHTs ------------------------------------------------------------------------------
@pytest.mark.swarm
def test_announced_address_is_in_status_and_the_dht_record(tmp_path):
    dht_port = free_port()
    base = daemon_config(tmp_path, 0)
    cfg = replace(
        base, net=replace(base.net, listen="0.0.0.0:0", announce=ALIAS, dht_host="0.0.0.0", dht_port=dht_port)
    )

    async def main():
        async with running(cfg) as (d,):
            address = f"{ALIAS}:{d.server.port}"
            assert d.address == address
            assert d.multiaddrs() == [f"/ip4/{ALIAS}/tcp/{dht_port}/p2p/{d.discovery.peer_id}"]  # the DHT node's id
            client = PeerClient()
            try:
                st = await client.status(address, 5.0)  # dialled at the announced address
            finally:
                await client.close()
            assert st.address == address and list(st.multiaddrs) == d.multiaddrs()
            found = await connect_discovery(d.multiaddrs(), "test", start_timeout_s=20)
            try:
                records = await found.find_all()
            finally:
                await found.shutdown()
            assert [(r.peer_id, r.address) for r in records] == [(d.peer_id, address)]

    asyncio.run(main())


@pytest.mark.swarm
def test_restart_keeps_the_peer_id_and_the_hint_shows_the_announced_multiaddr(tmp_path):
    data, ckpt, dht_port = write_corpus(tmp_path), tmp_path / "ckpt", free_port()
    args = ["run", "--data", str(data), "--checkpoint-dir", str(ckpt), "--rounds", "1", "--steps-per-round", "1"]
    args += ["--listen", "0.0.0.0:0", "--announce", ALIAS, "--dht-host", "0.0.0.0", "--dht-port", str(dht_port)]
    runs = [runner.invoke(app, [*args, *TINY]) for _ in range(2)]
    lines = []
    for result in runs:
        assert result.exit_code == 0, result.output
        lines.append(dict(line.split(": ", 1) for line in result.output.splitlines() if ": " in line))
    first, second = lines
    assert first["peer"] == second["peer"] and first["multiaddr"] == second["multiaddr"]
    assert first["dht peer"] == second["dht peer"]
    assert first["multiaddr"] == f"/ip4/{ALIAS}/tcp/{dht_port}/p2p/{first['dht peer']}"
    assert first["join with"].startswith(f"blocktrain join {first['multiaddr']} ")
    assert first["address"].startswith(f"{ALIAS}:")
    assert (ckpt / "peer.key").is_file() and (ckpt / "peer.key").stat().st_mode & 0o077 == 0
    assert (ckpt / "identity.key").is_file() and (ckpt / "identity.key").stat().st_mode & 0o077 == 0


@pytest.mark.swarm
def test_a_dht_that_fails_to_start_leaves_no_socket(monkeypatch):
    """p2pd dies by itself when no bootstrap peer answers, leaving its socket; the tagged ones are removed."""
    monkeypatch.setattr(dht, "_socket_tag", lambda: "blocktrain-test-ok")
    ok = HivemindDiscovery("sw")
    try:  # the tag reaches the forked DHT process: its p2pd's socket carries it
        assert glob.glob("/tmp/hivemind-blocktrain-test-ok-p2pd-*.sock")
    finally:
        asyncio.run(ok.shutdown())
    assert glob.glob("/tmp/hivemind-blocktrain-test-ok-*") == []
    monkeypatch.setattr(dht, "_socket_tag", lambda: "blocktrain-test-failed")
    with pytest.raises(SwarmdError, match="could not start the DHT"):
        HivemindDiscovery("sw", [DEAD_PEER], start_timeout_s=15)
    assert glob.glob("/tmp/hivemind-blocktrain-test-failed-*") == []


def _start_run(args: list[str], timeout_s: float = 120.0) -> tuple[subprocess.Popen, dict[str, str]]:
    """`blocktrain run ARGS` in its own process; its `key: value` lines up to `ready`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    info: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=1.0):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line or line.strip() == "ready":
                break
            key, _, value = line.strip().partition(": ")
            info.setdefault(key, value)
    return proc, info


@pytest.mark.swarm
def test_a_killed_daemon_restarts_with_its_peer_id_on_its_dht_port(tmp_path):
    """kill -9 leaves no DHT process holding the port and the identity: a restart gets both back."""
    data, dht_port = write_corpus(tmp_path), free_port()
    args = ["--data", str(data), "--checkpoint-dir", str(tmp_path / "ckpt"), "--dht-port", str(dht_port), *TINY]
    first, info = _start_run(args)
    try:
        assert info.get("peer") and info.get("dht peer"), info
    finally:
        first.kill()
        first.wait(30)
    deadline = time.monotonic() + 15  # the orphaned DHT process notices within PARENT_POLL_S and ends p2pd
    while True:
        try:
            check_bindable("127.0.0.1", dht_port, "--dht-port")
            break
        except SwarmdError:
            assert time.monotonic() < deadline, "the killed daemon's DHT still holds its port"
            time.sleep(0.2)
    again = HivemindDiscovery("sw", port=dht_port, identity_path=str(tmp_path / "ckpt" / "peer.key"))
    try:  # what the restarted daemon's DHT would be (the daemon's own restart is the test above)
        assert again.peer_id == info["dht peer"] and again.multiaddrs() == [info["multiaddr"]]
    finally:
        asyncio.run(again.shutdown())
