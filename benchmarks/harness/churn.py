"""Churn for a soak run: a seeded fault schedule, and the faults a LocalSwarm of daemons suffers while it trains.

draw_schedule: when and which fault (every kind of FAULTS once in every six). Churn injects them without blocking:
inject(kind, t) starts one, tick(t) carries on those in flight (SIGCONT after a pause, restart after a stop, the
restarted peer's readiness and resumed round), release() continues paused groups. It keeps between min_peers and
max_peers up and never takes down a block's last peer up; a restart that does not resume its checkpoint's round, or
does not start, is a lost checkpoint.
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass, field

from benchmarks.harness.cli_runs import killpg  # the daemon leads its own group: its DHT process and p2pd are in it
from swarmd.errors import SwarmdError
from swarmd.tools.launch import LocalSwarm, PeerProc

FAULTS = ("kill9_restart", "sigterm_rejoin", "join", "leave", "bootstrap_kill", "pause")
READY_TIMEOUT_S = 240.0  # a (re)started daemon not ready after this long did not come back
STOP_TIMEOUT_S = 60.0  # a daemon still running this long after its SIGTERM is killed


def draw_schedule(seed: int, duration_s: float, every_s: tuple[float, float], start_s: float = 0.0) -> list[dict]:
    """The faults of a run: one every uniform(*every_s) seconds from start_s on, until duration_s, their kinds
    FAULTS in a shuffled order, shuffled again after every len(FAULTS) (a run of six faults has every kind); each
    {"t", "kind"} (the same seed, the same schedule)."""
    rng, t = random.Random(seed), start_s
    out: list[dict] = []
    kinds: list[str] = []
    while True:
        t += rng.uniform(*every_s)
        if t >= duration_s:
            return out
        kinds = kinds or rng.sample(FAULTS, len(FAULTS))
        out.append({"t": round(t, 1), "kind": kinds.pop()})


@dataclass
class _Pending:
    """A fault in flight on one peer: what comes next ("cont", "restart", "ready") and when."""

    peer: PeerProc
    step: str
    due: float
    fault: dict
    checkpoint_round: int | None = None
    started: float = 0.0


@dataclass
class Churn:
    """Faults on `swarm` (started); pause_s: how long a pause lasts; down_s: how long peer 0 stays down."""

    swarm: LocalSwarm
    min_peers: int
    max_peers: int
    pause_s: float = 30.0
    down_s: float = 20.0
    seed: int = 0
    faults: list[dict] = field(default_factory=list)
    lost_checkpoints: list[dict] = field(default_factory=list)
    paused: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # peer -> its pauses (start, end)
    pgids: list[int] = field(default_factory=list)  # every process group it started (besides the swarm's first)
    pending: list[_Pending] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed + 1)  # which peer takes a fault

    # -- choosing ------------------------------------------------------------------------------
    def up(self) -> list[PeerProc]:
        """The peers running with no fault in flight (ready, not paused, not restarting)."""
        busy = {q.peer.index for q in self.pending}
        return [p for p in self.swarm.peers if p.alive() and p.ready.is_set() and p.index not in busy]

    def spare(self, p: PeerProc) -> bool:
        """Whether p's block has another peer up besides p."""
        return any(q.block == p.block and q.index != p.index for q in self.up())

    def _pick(self, exclude_zero: bool = True) -> PeerProc | None:
        options = [p for p in self.up() if self.spare(p) and not (exclude_zero and p.index == 0)]
        return self.rng.choice(options) if options else None

    # -- faults --------------------------------------------------------------------------------
    def inject(self, kind: str, t: float) -> dict:
        """Start a fault of `kind` at t (s since the run's start); returns its record {"t", "kind", "peer", ...}
        (kind "none" with a reason when no peer may take it; "drawn": the kind drawn, when another happened)."""
        alive = sum(p.alive() for p in self.swarm.peers)
        drawn = kind
        if kind == "join" and alive >= self.max_peers:
            kind = "leave"
        elif kind == "leave" and alive <= self.min_peers:
            kind = "join"
        fault: dict = {"t": round(t, 1), "kind": kind}
        if drawn != kind:
            fault["drawn"] = drawn
        if kind == "join":
            joiner = self._joiner()
            fault["peer"], fault["block"] = joiner.index, joiner.block
            self._spawn(joiner, fault, t, None)
        else:
            p = self.swarm.peers[0] if kind == "bootstrap_kill" else self._pick()
            if p is None or (kind == "bootstrap_kill" and (p not in self.up() or not self.spare(p))):
                fault.update(kind="none", drawn=drawn, reason="no peer up may take it (its block has no other)")
            else:
                fault["peer"], fault["block"] = p.index, p.block
                self._start(kind, p, fault, t)
        self.faults.append(fault)
        return fault

    def _start(self, kind: str, p: PeerProc, fault: dict, t: float) -> None:
        proc = p.process
        if kind == "pause":
            killpg(proc.pid, signal.SIGSTOP)
            self.pending.append(_Pending(p, "cont", t + self.pause_s, fault))
        elif kind in ("kill9_restart", "bootstrap_kill"):
            killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            fault["exit_code"] = proc.returncode
            self.pending.append(_Pending(p, "restart", t + (self.down_s if kind == "bootstrap_kill" else 0.0), fault))
        else:  # sigterm_rejoin, leave: it checkpoints and leaves
            proc.send_signal(signal.SIGTERM)
            self.pending.append(_Pending(p, "stopping", t + STOP_TIMEOUT_S, fault))

    def _joiner(self) -> PeerProc:
        """A new peer on the block with the fewest peers up, with its own index, identity and checkpoint dir."""
        blocks = range(self.swarm.model.blocks)
        block = min(blocks, key=lambda b: (sum(p.block == b for p in self.swarm.peers if p.alive()), b))
        i, w = len(self.swarm.peers), self.swarm.workdir
        p = PeerProc(i, block, w / f"peer{i}", w / f"peer{i}.log")
        self.swarm.peers.append(p)
        return p

    def _spawn(self, p: PeerProc, fault: dict, t: float, checkpoint_round: int | None) -> None:
        live = [q for q in self.up() if q.index != p.index and q.info.get("multiaddrs")]
        self.swarm.bootstrap = [q.info["multiaddrs"][0] for q in live[:4]]  # peers up now, as an operator would
        self.swarm._spawn(p)
        self.pgids.append(p.process.pid)
        self.pending.append(_Pending(p, "ready", t + READY_TIMEOUT_S, fault, checkpoint_round, t))

    def tick(self, t: float) -> None:
        """Carry on the faults in flight whose next step is due (a stop: once the daemon exited)."""
        for q in list(self.pending):
            p = q.peer
            if q.step == "cont" and t >= q.due:
                killpg(p.process.pid, signal.SIGCONT)
                self.paused.setdefault(p.index, []).append((q.fault["t"], t))
                self.pending.remove(q)
            elif q.step == "stopping" and (not p.alive() or t >= q.due):
                if p.alive():  # a SIGTERM it did not obey in time
                    killpg(p.process.pid, signal.SIGKILL)
                    p.process.wait(timeout=30)
                    q.fault["sigkilled"] = True
                q.fault["exit_code"] = p.process.returncode
                q.fault["stopped_after_s"] = round(t - q.fault["t"], 1)
                q.step, q.due = ("gone", t) if q.fault["kind"] == "leave" else ("restart", t)
                if q.step == "gone":
                    self.pending.remove(q)
            elif q.step == "restart" and t >= q.due:
                self.pending.remove(q)
                self._spawn(p, q.fault, t, self.checkpoint_round(p))
            elif q.step == "ready":
                self._check_ready(q, t)

    def _check_ready(self, q: _Pending, t: float) -> None:
        p = q.peer
        if p.ready.is_set():
            resumed = int(p.info.get("round", "-1"))
            q.fault.update(ready_after_s=round(t - q.started, 1), resumed_round=resumed)
            if q.checkpoint_round is not None:
                q.fault["checkpoint_round"] = q.checkpoint_round
                if resumed != q.checkpoint_round:
                    self.lost_checkpoints.append({"peer": p.index, "t": q.fault["t"], "why": "resumed another round"})
            self.pending.remove(q)
        elif not p.alive() or t >= q.due:
            why = f"exit code {p.process.poll()}" if not p.alive() else "not ready in time"
            q.fault["failed"] = f"{why}: {self.swarm.tail(p)}"
            if q.checkpoint_round is not None:
                self.lost_checkpoints.append({"peer": p.index, "t": q.fault["t"], "why": why})
            self.pending.remove(q)

    @staticmethod
    def checkpoint_round(p: PeerProc) -> int | None:
        """The round p's checkpoint holds (None: it has none yet)."""
        from swarmd.core import checkpoint as ck

        try:
            return int(ck.read_config(p.checkpoint_dir)["round"])
        except (SwarmdError, KeyError, ValueError):
            return None

    def settle(self, t0: float, timeout_s: float) -> None:
        """Carry on the faults in flight until none is left or timeout_s passed (t0: the run's start, monotonic)."""
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            self.tick(time.monotonic() - t0)
            time.sleep(0.5)  # polling the peers in flight, with a deadline

    def release(self) -> None:
        """Continue every paused group (a stopped process group cannot stop on SIGTERM)."""
        for q in list(self.pending):
            if q.step == "cont" and q.peer.alive():
                killpg(q.peer.process.pid, signal.SIGCONT)
