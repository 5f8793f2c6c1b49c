"""A `blocktrain` command run as a fresh process and read while it runs (swarm_commands.py, bad_input.py).

Owns: Spawned (its stdout and stderr read line by line, each line timed from the spawn), killpg, get, poll_json
and loadavg. Standard library only: swarm_commands' probe must not pay for imports of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path


def loadavg() -> float:
    """The 1-minute load average, to 2 digits."""
    return round(os.getloadavg()[0], 2)


def killpg(pgid: int, sig: int) -> None:
    """Send sig to process group pgid, if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Spawned:
    """cmd started now (stdin closed; its own process group with session=True), its output read by two threads:
    out and err, each [(seconds since the spawn, line)] (any newline ends a line, as in text mode); first_byte_s:
    seconds to its first stdout byte."""

    def __init__(self, cmd: list[str], env: dict, cwd: Path, session: bool = False):
        self.t0 = time.monotonic()
        pipe = subprocess.PIPE
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe, env=env, cwd=cwd, start_new_session=session
        )
        self.out: list[tuple[float, str]] = []
        self.err: list[tuple[float, str]] = []
        self.first_byte_s: float | None = None
        self.wall_s: float | None = None
        self.cpu_s: float | None = None
        streams = ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        self.readers = [threading.Thread(target=self._read, args=s, daemon=True) for s in streams]
        for reader in self.readers:
            reader.start()

    def since(self) -> float:
        return time.monotonic() - self.t0

    def _read(self, stream, into: list[tuple[float, str]]) -> None:
        pending = b""
        while chunk := stream.read1(65536):
            t = self.since()
            if into is self.out and self.first_byte_s is None:
                self.first_byte_s = t
            *lines, pending = (pending + chunk).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
            into.extend((t, line.decode(errors="replace")) for line in lines)
        if pending:
            into.append((self.since(), pending.decode(errors="replace")))

    def running(self) -> bool:
        """Whether it has not exited yet (asked without reaping it: wait() still gets its CPU time)."""
        if self.proc.returncode is not None:
            return False
        return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None

    def wait(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for its exit; whether it exited. Once it has: proc.returncode, wall_s (spawn to exit)
        and cpu_s (user + system seconds of it and the children it reaped), its output read to the end."""
        deadline = time.monotonic() + timeout_s
        while self.proc.returncode is None:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.wall_s, self.cpu_s = self.since(), usage.ru_utime + usage.ru_stime
                for reader in self.readers:
                    reader.join(5)  # a grandchild that keeps the pipe open holds it up no longer
            elif time.monotonic() > deadline:
                return False
            else:
                time.sleep(0.005)  # polling the child (os.wait4 gives its CPU time), with a deadline
        return True

    def stdout(self) -> str:
        return "\n".join(line for _, line in self.out)

    def url(self, bound_s: float) -> tuple[float, str] | None:
        """(seconds to it, the URL without a trailing slash) of the first http:// URL on its stdout, waiting while
        it runs, up to bound_s since the spawn; None if none came."""
        while True:
            done = not self.running() or self.since() > bound_s
            for t, line in self.out:
                if m := re.search(r"http://\S+", line):
                    return t, m.group(0).rstrip("/")
            if done:
                return None
            time.sleep(0.02)

    def stop(self, sig: int, grace_s: float, group: bool = False) -> None:
        """Send sig (to its whole process group with group=True), wait grace_s for the exit, then SIGKILL and reap."""
        send = (lambda s: killpg(self.proc.pid, s)) if group else self.proc.send_signal
        send(sig)
        if not self.wait(grace_s):
            send(signal.SIGKILL)
            self.wait(60)


def get(url: str, timeout_s: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        return reply.read()


def poll_json(
    url: str, wanted: Callable[[dict], bool], deadline: float, every_s: float, alive: Callable[[], bool]
) -> tuple[bool, dict]:
    """GET url as JSON every every_s until wanted(answer), time.monotonic() passes deadline or alive() fails;
    (whether an answer was wanted, the last answer: {"fetch_error": ...} for a GET that failed)."""
    last: dict = {}
    while time.monotonic() < deadline and alive():
        try:
            last = json.loads(get(url, 5.0))
        except (OSError, ValueError) as exc:
            last = {"fetch_error": str(exc)}
        if wanted(last):
            return True, last
        time.sleep(every_s)
    return False, last
