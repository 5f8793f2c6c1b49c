"""Session-wide test fixtures: no test may leave a child process behind.

The autouse session fixture below runs once after the whole suite: it polls (with a deadline) for
every descendant of the pytest process to be gone (hivemind DHT processes, their p2pd daemons,
`python -m swarmd` daemon subprocesses, multiprocessing children), then reaps and reports
leftovers. Linux only (/proc); elsewhere it checks multiprocessing.active_children() alone.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

ALLOWED = ("torch_shm_manager",)  # torch's shared-memory helper lives as long as pytest itself


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live (non-zombie) descendant of root, read from /proc."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] == "Z":
                continue
            parents[int(entry.name)] = int(fields[1])
            names[int(entry.name)] = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
            )
        except (OSError, ValueError):
            continue
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = names.get(pid, "?")
                frontier.append(pid)
    return found


@pytest.fixture
def one_thread():
    """Torch on one thread for the test (swarm tests run several peers in one process)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session", autouse=True)
def no_leaked_children():
    yield
    deadline = time.monotonic() + 10.0
    while True:
        multiprocessing.active_children()  # joins finished ones as a side effect
        left = (
            _descendants(os.getpid())
            if Path("/proc").is_dir()
            else {p.pid: p.name for p in multiprocessing.active_children()}
        )
        left = {pid: cmd for pid, cmd in left.items() if not any(a in cmd for a in ALLOWED)}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # polling with a deadline: children exit on their own schedule
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"tests leaked child processes: {left}"
