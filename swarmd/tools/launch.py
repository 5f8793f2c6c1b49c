"""LocalSwarm: N daemons as separate processes on loopback (demo, benchmarks, tests).

Owns process orchestration only: write each peer's DaemonConfig as JSON and spawn it as
`python -m swarmd --config peerI.json` (the daemon's own entry point; its stdout lines come from
swarmd.node.runner), spawn peer 0, read the multiaddr it prints, spawn the others
joining through it (block i mod B, peer seed i, own checkpoint dir), poll their GetStatus, wait
for them to finish their rounds, kill -9 / restart one (fault benchmark), stop all (SIGTERM, then
SIGKILL after a grace period), and assemble the trained model from their checkpoints. Every wait
has a deadline. Children get OMP_NUM_THREADS=1 so N peers share a small machine fairly.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from swarmd.averaging.config import GossipConfig
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.errors import ConfigError, SwarmdError
from swarmd.node.config import DaemonConfig, NetConfig, peer_train_config
from swarmd.protocol import Codec
from swarmd.transport import PeerClient


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class PeerProc:
    index: int
    block: int
    checkpoint_dir: Path
    log_path: Path
    proc: subprocess.Popen | None = None
    info: dict = field(default_factory=dict)  # key: value lines the peer printed (address, peer, multiaddr, ...)
    rounds_seen: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def address(self) -> str:
        return self.info.get("address", "")

    @property
    def process(self) -> subprocess.Popen:
        """The peer's current process (SwarmdError if it was never started)."""
        if self.proc is None:
            raise SwarmdError(f"peer {self.index} was never started")
        return self.proc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalSwarm:
    """:param model: the swarm's model config; :param rounds: rounds each daemon runs (0 = until stopped)
    :param trajectory_prob: chance a batch trains on the sampler's trajectory (every peer)
    :param freeze_z_in: TrainConfig.freeze_z_in of every peer (none for the documented block)
    :param replica_adam: TrainConfig.replica_adam of every peer (ReplicaAdamW, swarmd.core.optim)
    :param predecessor_pulls: TrainConfig.predecessor_pulls of every peer (trajectory predecessors refreshed per round)
        and prefetch_pulls (those pulls run while the steps go on)
    :param pipeline: TrainConfig.pipeline of every peer (block b starts b rounds late; B - 1 more rounds)
    :param pipeline_stagger: TrainConfig.pipeline_stagger (rounds between two blocks' starts)
    :param overlap: GossipConfig.overlap of every peer (training goes on during the exchange); overlap_steps too
    :param balance_steps: GossipConfig.balance_steps of every peer (a faster peer takes up to this x H steps a round)
    :param pull_codec: GossipConfig.pull_codec of every peer (how predecessors are pulled)
    :param group_size: GossipConfig.group_size of every peer (0 = all-to-all averaging); table_group_size: the
        byte table's; group_layout: how the groups are drawn (GossipConfig.group_layout)
    :param device: torch device of every peer (cpu, cuda)
    """

    def __init__(
        self,
        peers: int,
        model: ModelConfig,
        data: Path,
        workdir: Path,
        *,
        rounds: int,
        steps_per_round: int,
        codec: Codec | str = Codec.INT8,
        batch_size: int = 16,
        lr: float = 1e-3,
        seed: int = 0,
        deadline_max_s: float = 30.0,
        swarm_id: str = "demo",
        trajectory_prob: float = TrainConfig.trajectory_prob,
        freeze_z_in: str = TrainConfig.freeze_z_in,
        replica_adam: bool = TrainConfig.replica_adam,
        predecessor_pulls: int = TrainConfig.predecessor_pulls,
        prefetch_pulls: bool = TrainConfig.prefetch_pulls,
        pipeline: bool = TrainConfig.pipeline,
        pipeline_stagger: int = TrainConfig.pipeline_stagger,
        outer: str = GossipConfig.outer,
        outer_lr: float = GossipConfig.outer_lr,
        outer_momentum: float = GossipConfig.outer_momentum,
        overlap: bool = GossipConfig.overlap,
        overlap_steps: int = GossipConfig.overlap_steps,
        balance_steps: float = GossipConfig.balance_steps,
        pull_codec: str = GossipConfig.pull_codec,
        group_size: int = GossipConfig.group_size,
        table_group_size: int = GossipConfig.table_group_size,
        group_layout: str = GossipConfig.group_layout,
        device: str = "cpu",
    ):
        if peers < 1:
            raise ConfigError("need at least one peer")
        # absolute: the children run in the checkout root, not in the caller's directory
        self.model, self.data, self.workdir = model, Path(data).resolve(), Path(workdir).resolve()
        train = peer_train_config(
            steps_per_round,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            trajectory_prob=trajectory_prob,
            freeze_z_in=freeze_z_in,
            replica_adam=replica_adam,
            predecessor_pulls=predecessor_pulls,
            prefetch_pulls=prefetch_pulls,
            pipeline=pipeline,
            pipeline_stagger=pipeline_stagger,
        )
        self.config = DaemonConfig(
            model=model,
            train=train,
            gossip=GossipConfig(
                steps_per_round=steps_per_round,
                codec=Codec(codec),
                deadline_max_s=deadline_max_s,
                outer=outer,
                outer_lr=outer_lr,
                outer_momentum=outer_momentum,
                overlap=overlap,
                overlap_steps=overlap_steps,
                balance_steps=balance_steps,
                pull_codec=pull_codec,
                group_size=group_size,
                table_group_size=table_group_size,
                group_layout=group_layout,
            ),
            net=NetConfig(swarm_id=swarm_id),
            data_path=str(self.data),
            stop_at_round=rounds,  # the swarm's round counter: a restarted peer stops with the rest
            min_peers=peers,
            device=device,
        )
        self.peers = [
            PeerProc(i, i % model.blocks, self.workdir / f"peer{i}", self.workdir / f"peer{i}.log")
            for i in range(peers)
        ]
        self.bootstrap: list[str] = []

    def peer_config(self, p: PeerProc) -> DaemonConfig:
        """Peer p's DaemonConfig: its block, peer seed and checkpoint dir, joining through the bootstrap."""
        net = replace(self.config.net, initial_peers=tuple(self.bootstrap))
        return replace(self.config, net=net, block=p.block, peer_seed=p.index, checkpoint_dir=str(p.checkpoint_dir))

    # -- processes -------------------------------------------------------------------------------
    def command(self, p: PeerProc, config_path: Path) -> list[str]:
        """The command line that runs peer p from its config file (a subclass may wrap it: `ip netns exec NS ...`)."""
        return [sys.executable, "-m", "swarmd", "--config", str(config_path), "--verbose"]

    def _spawn(self, p: PeerProc) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / f"peer{p.index}.json"
        config_path.write_text(json.dumps(self.peer_config(p).to_dict(), indent=2))
        cmd = self.command(p, config_path)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "GRPC_VERBOSITY": "ERROR"}
        p.info, p.rounds_seen, p.ready = {}, [], threading.Event()
        # own process group: kill -9 must take the peer's DHT process and p2pd along (they would be orphaned)
        with open(p.log_path, "ab") as log:
            p.proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                cwd=Path(__file__).resolve().parents[2],  # the checkout root: `-m swarmd` works uninstalled too
                start_new_session=True,
            )
        threading.Thread(target=self._read, args=(p, p.proc), daemon=True).start()

    @staticmethod
    def _read(p: PeerProc, proc: subprocess.Popen) -> None:
        if proc.stdout is None:
            return
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line == "ready":
                p.ready.set()
            elif line.startswith("round "):
                p.rounds_seen.append(line)
            elif ": " in line:
                key, _, value = line.partition(": ")
                if key == "multiaddr":
                    p.info.setdefault("multiaddrs", []).append(value)
                else:
                    p.info.setdefault(key, value)
        proc.stdout.close()

    def _wait_ready(self, p: PeerProc, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not p.ready.wait(0.2):
            if not p.alive():
                raise SwarmdError(
                    f"peer {p.index} exited with code {p.process.returncode} before it was ready; "
                    f"see {p.log_path}: {self.tail(p)}"
                )
            if time.monotonic() > deadline:
                raise SwarmdError(f"peer {p.index} not ready after {timeout_s:.0f}s; see {p.log_path}")

    def tail(self, p: PeerProc, lines: int = 3) -> str:
        try:
            return " | ".join(p.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def start(self, timeout_s: float = 120.0) -> None:
        """Start peer 0, then every other peer joining through its multiaddrs; wait until all are ready."""
        first = self.peers[0]
        self._spawn(first)
        self._wait_ready(first, timeout_s)
        self.bootstrap = list(first.info.get("multiaddrs", []))
        for p in self.peers[1:]:
            self._spawn(p)
        for p in self.peers[1:]:
            self._wait_ready(p, timeout_s)

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Signal a peer's whole process group (daemon, its DHT process, p2pd) and wait for the daemon."""
        p = self.peers[index]
        if p.alive():
            _killpg(p.process, sig)
            p.process.wait(timeout=30)

    def restart(self, index: int, timeout_s: float = 120.0) -> PeerProc:
        """Start a stopped peer again with the same checkpoint dir (it resumes from its last checkpoint)."""
        p = self.peers[index]
        if p.alive():
            raise SwarmdError(f"peer {index} is still running")
        if not self.bootstrap or index == 0:
            live = [q for q in self.peers if q.alive() and q.info.get("multiaddrs")]
            self.bootstrap = live[0].info["multiaddrs"] if live else []
        self._spawn(p)
        self._wait_ready(p, timeout_s)
        return p

    def wait(self, timeout_s: float) -> bool:
        """Wait for every peer to exit on its own (its rounds done); False on timeout."""
        deadline = time.monotonic() + timeout_s
        for p in self.peers:
            try:
                p.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM every live peer (they checkpoint and leave), SIGKILL whatever is left after grace_s."""
        for p in self.peers:
            if p.alive():
                p.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.peers:
            if p.proc is None:
                continue
            try:
                p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _killpg(p.proc, signal.SIGKILL)  # whatever is left of the group (a DHT child of a killed daemon)
            p.proc.wait(timeout=10)

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- observation -----------------------------------------------------------------------------
    async def statuses(self, timeout_s: float = 2.0) -> list:
        """GetStatus of every live peer (None for a dead or silent one), in peer order."""
        client = PeerClient()
        try:

            async def one(p: PeerProc):
                if not p.alive() or not p.address:
                    return None
                try:
                    return await client.status(p.address, timeout_s)
                except SwarmdError:
                    return None

            return await asyncio.gather(*(one(p) for p in self.peers))
        finally:
            await client.close()

    def summaries(self) -> list[dict]:
        """Each peer's last checkpoint config.json (round, participation, bytes, ...)."""
        from swarmd.core import checkpoint as ck  # torch: only once there is something to read

        out = []
        for p in self.peers:
            try:
                out.append(ck.read_config(p.checkpoint_dir))
            except SwarmdError:
                out.append({})
        return out

    def assemble(self):
        """(blocks, embedding) of the trained model from the checkpoints: block b from the first peer
        that trained it (replicas are identical after a merge), the byte table from peer 0."""
        from swarmd.core import checkpoint as ck

        blocks = []
        for b in range(self.model.blocks):
            holders = [p for p in self.peers if p.block == b and (p.checkpoint_dir / "config.json").is_file()]
            if not holders:
                raise SwarmdError(f"no checkpoint holds block {b}")
            blocks.append(ck.load_block(holders[0].checkpoint_dir, self.model, b)[0])
        emb_dir = next(p.checkpoint_dir for p in self.peers if (p.checkpoint_dir / "config.json").is_file())
        return blocks, ck.load_embedding(emb_dir, self.model)


def process_group(pgid: int) -> list[str]:
    """`pid comm` of every live process in a process group (zombies left out): what a peer leaves behind."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,pgid=,stat=,comm="], capture_output=True, text=True).stdout
    rows = [line.split() for line in out.splitlines()]
    return [f"{f[0]} {f[3]}" for f in rows if len(f) >= 4 and f[1] == str(pgid) and "Z" not in f[2]]


def wait_group_gone(pgid: int, timeout_s: float) -> list[str]:
    """Poll until the process group is empty or timeout_s passes; returns what is left."""
    deadline = time.monotonic() + timeout_s
    while (left := process_group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling the process table, with a deadline
    return left
