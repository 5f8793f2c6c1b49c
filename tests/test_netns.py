"""A swarm that spans hosts: three daemons in three network namespaces joined by a bridge (tests/netns_utils.py).

Each daemon listens on 0.0.0.0 in its own namespace and announces its namespace address
(--announce); they find each other through the real hivemind DHT (peers 1 and 2 join through
peer 0's announced multiaddr), train one block as three replicas, exchange deltas across the
bridge every round, and `blocktrain status --swarm MULTIADDR`, run in a namespace, lists all three
at their own addresses. A second test puts a 50 ms user-space delay (tests/delay_relay.py) in
front of every host's gRPC server and checks the rounds still complete, through the relays. A
third runs `blocktrain run --listen 0.0.0.0:PORT` with no other address flag, joins two daemons on
two other hosts with the very `join with:` command it printed, and lists all three from a fourth.
A fourth has two hosts: each peer's reachability line (peers dialling it back, swarmd.node.reachability) says
`reachable` for a peer listening on every interface and `not reachable` for one listening on loopback only.
Those four need root and iproute2 (skipped otherwise; CI runs as root) and are slow (daemons start
in namespaces): `python -m pytest -m slow tests/test_netns.py`. The relay's own test (latency,
bytes intact, half-close) is fast, needs neither, and runs in the default suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.delay_relay import start_relay
from tests.netns_utils import (
    BLOCKTRAIN,
    DHT_PORT,
    GRPC_PORT,
    RELAY_PORT,
    CliDaemon,
    NetnsLab,
    NetnsSwarm,
    NetnsUnavailable,
    stop_all,
    unavailable,
)
from tests.swarm_utils import tiny_model

needs_netns = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")

ROUND = re.compile(r"round (\d+): block (\d+) train ce \S+ participation ([\d.]+) sent ([\d.]+) MB in ([\d.]+)s")


@contextlib.contextmanager
def made_lab(hosts: int) -> Iterator[NetnsLab]:
    try:
        lab = NetnsLab(hosts).create()
    except NetnsUnavailable as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")
    try:
        yield lab
    finally:
        lab.destroy()


@pytest.fixture
def lab() -> Iterator[NetnsLab]:
    with made_lab(3) as made:
        yield made


def swarm_on(lab: NetnsLab, text_data: Path, tmp_path: Path, delay_ms: float | None) -> NetnsSwarm:
    return NetnsSwarm(
        lab,
        tiny_model(1),  # one block: the three replicas exchange block and byte-table deltas every round
        text_data / "train.txt",
        tmp_path,
        rounds=0,  # until stopped
        steps_per_round=3,
        batch_size=4,
        deadline_max_s=20.0,
        swarm_id="netns",
        delay_ms=delay_ms,
    )


def check_rounds(swarm: NetnsSwarm, rounds: int) -> None:
    """Every peer merged `rounds` rounds, and in some round accepted the deltas of both other hosts."""
    for p in swarm.peers:
        parsed = [ROUND.match(line) for line in p.rounds_seen[:rounds]]
        assert all(parsed), p.rounds_seen
        assert max(float(m.group(3)) for m in parsed if m) == 1.0, p.rounds_seen


@pytest.mark.slow
@needs_netns
def test_three_daemons_in_three_namespaces_find_each_other_and_train(lab, text_data, tmp_path):
    with swarm_on(lab, text_data, tmp_path, None) as swarm:
        swarm.start(timeout_s=180)
        for p, h in zip(swarm.peers, lab.hosts, strict=True):
            assert p.address == f"{h.address}:50051"  # the announced address, not 0.0.0.0
            assert p.info["multiaddrs"] == [f"/ip4/{h.address}/tcp/{DHT_PORT}/p2p/{p.info['dht peer']}"]
            assert p.info["join with"].startswith(f"blocktrain join /ip4/{h.address}/")
        swarm.wait_rounds(2, timeout_s=180)
        check_rounds(swarm, 2)
        status = swarm.swarm_status(host=2)  # a CLI on another host, joining the DHT through peer 0
    rows = sorted(status["peers"], key=lambda r: r["address"])
    assert [r["address"] for r in rows] == [f"{h.address}:50051" for h in lab.hosts]
    assert {r["peer_id"] for r in rows} == {p.info["peer"] for p in swarm.peers}
    assert all(r["round"] >= 2 and r["bytes_received"] > 0 for r in rows), rows
    assert [(b["block"], b["peers"]) for b in status["blocks"]] == [(0, 3)]


@pytest.mark.slow
@needs_netns
def test_rounds_complete_behind_a_50ms_relay_on_every_host(lab, text_data, tmp_path):
    with swarm_on(lab, text_data, tmp_path, 50.0) as swarm:
        swarm.start(timeout_s=180)
        assert [p.address for p in swarm.peers] == [f"{h.address}:{RELAY_PORT}" for h in lab.hosts]
        swarm.wait_rounds(2, timeout_s=180)
        check_rounds(swarm, 2)
        status = swarm.swarm_status(host=1)
    assert sorted(r["address"] for r in status["peers"]) == [f"{h.address}:{RELAY_PORT}" for h in lab.hosts]


# the tiny model of swarm_on (tiny_model(1)) and its fast rounds, as flags
TINY_FLAGS = ["--blocks", "1", "--layers-per-block", "1", "--d-model", "32", "--n-heads", "2", "--hidden", "64"]
TINY_FLAGS += ["--seq-len", "16"]
FAST_FLAGS = ["--steps-per-round", "3", "--batch-size", "4", "--deadline-max", "20"]


def status_until(lab: NetnsLab, on: int, maddr: str, swarm_id: str, peers: int, timeout_s: float) -> list[dict]:
    """`blocktrain status --swarm MADDR --json` on lab host `on`, again until it lists `peers` peers, each reached
    at its address (not "unreachable"); their rows (RuntimeError with the last answer after timeout_s)."""
    cmd = [str(BLOCKTRAIN), "status", "--swarm", maddr, "--swarm-id", swarm_id, "--json"]
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        result = lab.run(lab.hosts[on], cmd, timeout_s=max(5.0, deadline - time.monotonic()))
        last = result.stdout.strip() or result.stderr.strip()[-500:]
        if result.returncode == 0:
            rows = json.loads(result.stdout)["peers"]
            if len(rows) == peers and all(r["state"] != "unreachable" for r in rows):
                return rows
    raise RuntimeError(f"status --swarm did not list {peers} reachable peers in {timeout_s:.0f}s: {last}")


@pytest.mark.slow
@needs_netns
def test_a_daemon_on_every_interface_is_joinable_with_the_hint_it_prints(text_data, tmp_path):
    """`blocktrain run --listen 0.0.0.0:PORT`, no other address flag: its DHT listens on every interface too and
    its hint names its host's address; the hint, run as printed on two other hosts (with the data and fast-round
    flags), joins them, and `status --swarm` from a fourth host lists all three at their own addresses."""
    data = str(text_data / "train.txt")
    with made_lab(4) as lab:
        first_host, *joiner_hosts, viewer = lab.hosts
        run = ["run", "--listen", f"0.0.0.0:{GRPC_PORT}", "--data", data, "--swarm-id", "hint", *TINY_FLAGS]
        # --min-peers 3: no solo rounds burning the CPU the joiners start on (not an address flag)
        daemons = [CliDaemon(first_host, [*run, *FAST_FLAGS, "--min-peers", "3"], tmp_path / "run.log")]
        try:
            first = daemons[0].wait_ready(120)
            maddr = first.info["multiaddr"]
            assert maddr.startswith(f"/ip4/{first_host.address}/tcp/"), first.lines  # not 127.0.0.1
            assert first.info["address"] == f"{first_host.address}:{GRPC_PORT}"
            hint = first.info["join with"]
            assert hint == f"blocktrain join {maddr} --data FILE --swarm-id hint --listen 0.0.0.0:0"
            program, *join = (data if word == "FILE" else word for word in hint.split())
            assert program == "blocktrain"
            for h in joiner_hosts:
                daemons.append(CliDaemon(h, [*join, *FAST_FLAGS], tmp_path / f"join{h.index}.log"))
            for d in daemons[1:]:
                d.wait_ready(120)
                assert d.info["address"].startswith(f"{d.host.address}:"), d.lines
                assert d.info["multiaddr"].startswith(f"/ip4/{d.host.address}/tcp/"), d.lines
            rows = status_until(lab, viewer.index, maddr, "hint", peers=3, timeout_s=90)
        finally:
            stop_all(daemons)
    assert {r["address"]: r["peer_id"] for r in rows} == {d.info["address"]: d.info["peer"] for d in daemons}


def line_of(daemon: CliDaemon, start: str, timeout_s: float) -> str:
    """The first stdout line of `daemon` that starts with `start` (RuntimeError with its lines after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = next((line for line in list(daemon.lines) if line.startswith(start)), None)
        if found is not None:
            return found
        if daemon.proc.poll() is not None:
            break
        time.sleep(0.2)  # polling the lines its reader thread collects, with a deadline
    err = daemon.log_path.read_text(errors="replace").strip()[-800:]
    raise RuntimeError(f"no {start!r} line from {daemon.host.netns} in {timeout_s:.0f}s: {daemon.lines} {err}")


@pytest.mark.slow
@needs_netns
def test_each_peer_says_whether_the_others_can_dial_it_back(text_data, tmp_path):
    """Two hosts. A peer on the first; on the second, a joiner listening on every interface, told `reachable: peers
    can dial ITS_ADDRESS:PORT`, and one whose gRPC server listens on loopback only while it announces its host
    address, told it is not reachable from the first host, why (connection refused) and the fixes. `status
    --swarm` on the first host shows the first two reachable and the third not (it cannot dial it either)."""
    data = str(text_data / "train.txt")
    with made_lab(2) as lab:
        first_host, second = lab.hosts
        run = ["run", "--listen", f"0.0.0.0:{GRPC_PORT}", "--data", data, "--swarm-id", "reach", *TINY_FLAGS]
        daemons = [CliDaemon(first_host, [*run, *FAST_FLAGS], tmp_path / "run.log")]
        try:
            maddr = daemons[0].wait_ready(120).info["multiaddr"]
            join = ["join", maddr, "--data", data, "--swarm-id", "reach", *FAST_FLAGS]
            everywhere = CliDaemon(second, [*join, "--listen", f"0.0.0.0:{GRPC_PORT}"], tmp_path / "open.log")
            loopback = [*join, "--listen", f"127.0.0.1:{RELAY_PORT}", "--announce", second.address]
            loopback += ["--dht-host", "0.0.0.0", "--dht-port", str(DHT_PORT + 1)]
            hidden = CliDaemon(second, loopback, tmp_path / "hidden.log")
            daemons += [everywhere, hidden]
            for d in daemons[1:]:
                d.wait_ready(120)
            assert hidden.info["address"] == f"{second.address}:{RELAY_PORT}", hidden.lines
            reachable = line_of(everywhere, "reachable: ", 90)
            unreachable = line_of(hidden, "not reachable from ", 90)
            first_line = line_of(daemons[0], "reachable: ", 150)  # it asks once the joiners are known
            cmd = [str(BLOCKTRAIN), "status", "--swarm", maddr, "--swarm-id", "reach", "--json"]
            result = lab.run(first_host, cmd, timeout_s=90)
        finally:
            stop_all(daemons)
    assert reachable == f"reachable: peers can dial {second.address}:{GRPC_PORT}"
    assert unreachable.startswith(
        f"not reachable from {first_host.address}: peer {second.address}:{RELAY_PORT}: unavailable: connection refused"
    ), unreachable
    assert f"listen on every interface (--listen 0.0.0.0:{RELAY_PORT}: it listens on 127.0.0.1 only)" in unreachable
    assert unreachable.endswith(f"forward TCP port {RELAY_PORT} to this host, or run with --client-mode")
    assert first_line == f"reachable: peers can dial {first_host.address}:{GRPC_PORT}"
    assert result.returncode == 0, result.stderr[-500:]
    rows = {r["address"]: r for r in json.loads(result.stdout)["peers"]}
    assert {a: r["reachable"] for a, r in rows.items()} == {
        f"{first_host.address}:{GRPC_PORT}": True,
        f"{second.address}:{GRPC_PORT}": True,
        f"{second.address}:{RELAY_PORT}": False,  # its own check said so, and this status could not dial it
    }


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()  # the client's half-close arrived: answer with ours


async def _through_relay(delay_s: float) -> tuple[float, bytes, bool]:
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    relay = await start_relay(("127.0.0.1", 0), echo.sockets[0].getsockname()[:2], delay_s)
    try:
        reader, writer = await asyncio.open_connection(*relay.sockets[0].getsockname()[:2])
        started = time.monotonic()
        writer.write(b"ping")
        first = await asyncio.wait_for(reader.readexactly(4), 10)
        round_trip = time.monotonic() - started
        blob = os.urandom(3 << 20)
        writer.write(blob)
        writer.write_eof()
        rest = await asyncio.wait_for(reader.read(), 30)  # to EOF: the half-close went through both ways
        writer.close()
        return round_trip, first, rest == blob
    finally:
        relay.close()
        echo.close()


def test_delay_relay_holds_each_chunk_and_keeps_the_bytes():
    round_trip, first, intact = asyncio.run(_through_relay(0.05))
    assert first == b"ping" and intact
    assert 0.1 <= round_trip < 5.0  # 50 ms each way through the relay
    fast, _, _ = asyncio.run(_through_relay(0.0))
    assert fast < round_trip
