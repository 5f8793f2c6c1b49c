"""Hosts made of Linux network namespaces, and a swarm of daemons spread over them (tests, benchmarks/netns.py).

NetnsLab(n) creates n+1 namespaces named bt<tag>-h<i> and bt<tag>-br: the last holds a bridge
br0; each host namespace has its loopback up and an eth0 (one end of a veth pair whose other end
is a port of br0) at 10.213.0.<10+i>/24. The subnet exists only inside these namespaces: no route
leaves them, the root namespace gets no interface, and nothing here ever targets another address.
Leaving the lab (a context manager) kills whatever still runs in its namespaces (only processes
this lab's users started there) and deletes them; the veth pairs and the bridge go with them.
Needs root and iproute2 (`unavailable()` says why not, for a skip).

Relay runs tests/delay_relay.py inside a host namespace: a user-space delay on every connection
to one port (the kernel here has no tc netem). NetnsSwarm is a LocalSwarm (swarmd/tools/launch.py)
whose peer i runs as `ip netns exec bt<tag>-h<i> python -m swarmd ...`, listening and announcing
on host i's address; with a delay, each host's gRPC server sits behind a Relay, so every exchange,
pull and status call to a peer crosses one delayed hop. CliDaemon runs one `blocktrain run` /
`blocktrain join` command line on a host and reads the lines it prints (`join with:` among them).
Every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from swarmd.node.config import DaemonConfig
from swarmd.tools.launch import LocalSwarm, PeerProc

ROOT = Path(__file__).resolve().parents[1]
RELAY = ROOT / "tests" / "delay_relay.py"
SUBNET = "10.213.0"  # a /24 that exists only inside the namespaces a NetnsLab creates
FIRST_HOST = 10  # host i is SUBNET.(FIRST_HOST + i)
GRPC_PORT = 50051  # each host is its own namespace, so the same ports are free on every host
RELAY_PORT = 50052  # the delayed front of GRPC_PORT (NetnsSwarm with a delay)
DHT_PORT = 40000


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (a skip reason), or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root to create network namespaces and veth pairs (CI runs as root)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` (apt-get install iproute2)"
    return None


class NetnsUnavailable(RuntimeError):
    """The first `ip netns add` failed: this machine cannot make namespaces (a skip, not a failure)."""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")


@dataclass(frozen=True)
class Host:
    index: int
    netns: str
    address: str  # its eth0 address, 10.213.0.<10+i>

    def prefix(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.netns]


class NetnsLab:
    """n hosts (network namespaces) on one bridge; see the module doc. Use as a context manager."""

    def __init__(self, hosts: int = 3, tag: str | None = None):
        if not 1 <= hosts <= 200:
            raise ValueError("hosts must be in [1, 200]")
        self.tag = tag or "bt" + secrets.token_hex(3)
        self.bridge = f"{self.tag}-br"
        self.hosts = [Host(i, f"{self.tag}-h{i}", f"{SUBNET}.{FIRST_HOST + i}") for i in range(hosts)]
        self.created: list[str] = []  # namespaces to delete, in creation order

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self.created.append(name)

    def create(self) -> NetnsLab:
        try:
            self._add_netns(self.bridge)
        except RuntimeError as exc:
            raise NetnsUnavailable(str(exc)) from None
        try:
            _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.bridge, "link", "set", "br0", "up")
            for h in self.hosts:
                self._add_netns(h.netns)
                port = f"h{h.index}"
                # both ends are made inside our namespaces: the root namespace never sees them
                _ip("-n", self.bridge, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
                _ip("-n", self.bridge, "link", "set", port, "master", "br0")
                _ip("-n", self.bridge, "link", "set", port, "up")
                _ip("-n", h.netns, "link", "set", "lo", "up")
                _ip("-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0")
                _ip("-n", h.netns, "link", "set", "eth0", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def pids(self) -> list[int]:
        """Processes still running in this lab's namespaces (all started by its users)."""
        found: list[int] = []
        for name in self.created:
            out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30)
            found += [int(x) for x in out.stdout.split() if x.isdigit()]
        return found

    def destroy(self) -> None:
        """Kill what still runs in the namespaces, delete them (their veths and bridge go along)."""
        deadline = time.monotonic() + 10.0
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for the killed processes to be gone, with a deadline
        errors = []
        for name in reversed(self.created):
            try:
                _ip("netns", "del", name)
            except RuntimeError as exc:
                errors.append(str(exc))
        self.created = []
        if errors:
            raise RuntimeError("; ".join(errors))

    def run(self, host: Host, cmd: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        """Run cmd on host to completion (output captured as text)."""
        return subprocess.run(
            [*host.prefix(), *cmd], capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=_child_env()
        )

    def __enter__(self) -> NetnsLab:
        return self.create()

    def __exit__(self, *exc: Any) -> None:
        self.destroy()


BLOCKTRAIN = Path(sys.executable).parent / "blocktrain"  # the console script of this environment


class CliDaemon:
    """`blocktrain ARGS...` on a host, its stdout lines read as they come (key: value lines into info), its stderr
    in a file; stop_all() ends its whole process group (the daemon, its DHT process, p2pd)."""

    def __init__(self, host: Host, args: list[str], log_path: Path):
        self.host, self.args, self.log_path = host, args, log_path
        self.info: dict[str, str] = {}
        self.lines: list[str] = []
        self.ready = threading.Event()
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*host.prefix(), str(BLOCKTRAIN), *args],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                cwd=ROOT,
                env=_child_env(),
                start_new_session=True,
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if line == "ready":
                self.ready.set()
            key, sep, value = line.partition(": ")
            if sep:
                self.info.setdefault(key, value)
        self.proc.stdout.close()

    def wait_ready(self, timeout_s: float) -> CliDaemon:
        """Until it printed `ready` (RuntimeError, with its output, if it exits first or after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = f"exited {self.proc.returncode}" if self.proc.poll() is not None else f"not ready in {timeout_s}s"
                err = self.log_path.read_text(errors="replace").strip()[-800:]
                raise RuntimeError(
                    f"blocktrain {' '.join(self.args[:2])} on {self.host.netns} {why}: {self.lines} {err}"
                )
        return self

    def kill_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_all(daemons: list[CliDaemon], grace_s: float = 10.0) -> None:
    """SIGTERM every daemon at once, SIGKILL each group after grace_s (whatever of it is left)."""
    for d in daemons:
        if d.proc.poll() is None:
            d.kill_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for d in daemons:
        try:
            d.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        d.kill_group(signal.SIGKILL)
        d.proc.wait(timeout=10)


def _child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "GRPC_VERBOSITY": "ERROR"}


class Relay:
    """tests/delay_relay.py on a host: listen -> to, every chunk delayed delay_ms (one way)."""

    def __init__(self, host: Host, listen: str, to: str, delay_ms: float):
        self.host, self.listen, self.to, self.delay_ms = host, listen, to, delay_ms
        self.proc: subprocess.Popen | None = None
        # a file, not a pipe: nobody reads it while the relay runs; closed by stop()
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115

    def start(self, timeout_s: float = 20.0) -> Relay:
        cmd = [sys.executable, str(RELAY), "--listen", self.listen, "--to", self.to, "--delay-ms", str(self.delay_ms)]
        self.proc = subprocess.Popen(
            [*self.host.prefix(), *cmd], stdout=subprocess.PIPE, stderr=self.stderr, start_new_session=True
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)  # waits for its first line, or the deadline
        line = self.proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        if line != "relay: ready":
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.stderr.seek(0)
            err = self.stderr.read().decode(errors="replace").strip()[-300:]
            self.stop()
            raise RuntimeError(f"relay on {self.host.netns} {self.listen} did not start: {line!r} {err}")
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()
        self.proc = None


class NetnsSwarm(LocalSwarm):
    """A LocalSwarm with peer i on lab host i, announcing that host's address; see the module doc.

    :param delay_ms: None: each daemon listens on 0.0.0.0 (gRPC and DHT) and announces its host
        address (--announce); a number: its gRPC server listens on 127.0.0.1 behind a Relay on the
        host address that delays every chunk this long (0 = the same path without the delay), and
        it announces the relay's HOST:PORT; its DHT listens on the host address directly
    """

    def __init__(self, lab: NetnsLab, *args: Any, delay_ms: float | None = None, **kw: Any):
        super().__init__(len(lab.hosts), *args, **kw)
        self.lab, self.delay_ms = lab, delay_ms
        self.relays: list[Relay] = []

    def host(self, p: PeerProc) -> Host:
        return self.lab.hosts[p.index]

    def peer_config(self, p: PeerProc) -> DaemonConfig:
        config = super().peer_config(p)
        address = self.host(p).address
        if self.delay_ms is None:
            net = replace(
                config.net, listen=f"0.0.0.0:{GRPC_PORT}", dht_host="0.0.0.0", dht_port=DHT_PORT, announce=address
            )
        else:
            net = replace(
                config.net,
                listen=f"127.0.0.1:{GRPC_PORT}",
                dht_host=address,
                dht_port=DHT_PORT,
                announce=f"{address}:{RELAY_PORT}",
            )
        return replace(config, net=net)

    def command(self, p: PeerProc, config_path: Path) -> list[str]:
        return [*self.host(p).prefix(), *super().command(p, config_path)]

    def start(self, timeout_s: float = 120.0) -> None:
        if self.delay_ms is not None and not self.relays:
            for h in self.lab.hosts:
                relay = Relay(h, f"{h.address}:{RELAY_PORT}", f"127.0.0.1:{GRPC_PORT}", self.delay_ms)
                self.relays.append(relay.start())
        super().start(timeout_s)

    def stop(self, grace_s: float = 20.0) -> None:
        try:
            super().stop(grace_s)
        finally:
            for relay in self.relays:
                relay.stop()
            self.relays = []

    def swarm_status(self, host: int = 0, timeout_s: float = 60.0) -> dict:
        """`blocktrain status --swarm MULTIADDR --json`, run on lab host `host`, through peer 0's multiaddr."""
        blocktrain = Path(sys.executable).parent / "blocktrain"
        maddr = self.peers[0].info["multiaddrs"][0]
        cmd = [str(blocktrain), "status", "--swarm", maddr, "--swarm-id", self.config.net.swarm_id, "--json"]
        result = self.lab.run(self.lab.hosts[host], cmd, timeout_s)
        if result.returncode != 0:
            raise RuntimeError(f"status --swarm exited {result.returncode}: {result.stderr.strip()[-500:]}")
        return json.loads(result.stdout)

    def wait_rounds(self, rounds: int, timeout_s: float) -> None:
        """Wait until every peer printed `rounds` round lines (RuntimeError naming the laggards on timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            behind = [p for p in self.peers if len(p.rounds_seen) < rounds]
            if not behind:
                return
            dead = [p for p in behind if not p.alive()]
            if dead or time.monotonic() > deadline:
                why = "exited" if dead else f"not at round {rounds} after {timeout_s:.0f}s"
                detail = "; ".join(f"peer {p.index}: {len(p.rounds_seen)} rounds, log: {self.tail(p)}" for p in behind)
                raise RuntimeError(f"{why}: {detail}")
            time.sleep(0.2)  # polling the peers' printed round lines, with a deadline
