"""Samples of running processes read from /proc (resident memory, open fds, threads) and how a series of them grew.

proc_sample (one live process), groups (the live processes of each process group), Sampler (a series per process
incarnation: a restarted daemon starts a new one), windows and growth (a series' first window after a warm-up against
its last), maxrss_bytes (this process's peak). Linux only; no psutil.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean

FIELDS = ("rss_kb", "fds", "threads", "group_rss_kb", "other_fds")  # what a sample holds besides its time


def proc_sample(pid: int) -> dict[str, int] | None:
    """{"rss_kb", "fds", "threads", "other_fds"} of a live process from /proc/<pid>; None if it is gone (or a zombie).
    other_fds: the fds that are not sockets (files, pipes, eventfds): sockets come and go with the peers connected,
    the rest should not grow."""
    base = Path(f"/proc/{pid}")
    try:
        status = dict(line.split(":", 1) for line in (base / "status").read_text().splitlines() if ":" in line)
        if status.get("State", "").strip().startswith("Z"):
            return None
        fds = os.listdir(base / "fd")
    except (OSError, ValueError):
        return None
    sockets = sum(1 for fd in fds if _link(base / "fd" / fd).startswith("socket:"))
    rss = status.get("VmRSS", "0 kB").split()[0]
    threads = int(status.get("Threads", "0").strip())
    return {"rss_kb": int(rss), "fds": len(fds), "threads": threads, "other_fds": len(fds) - sockets}


def _link(path: Path) -> str:
    """Where an fd points ("socket:[1234]", a file's path), "" if it closed meanwhile."""
    try:
        return os.readlink(path)
    except OSError:
        return ""


def maxrss_bytes() -> int:
    """This process's peak resident memory so far, in bytes (Linux reports ru_maxrss in kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def groups() -> dict[int, list[int]]:
    """pgid -> the pids of its live processes, from /proc/<pid>/stat (zombies left out)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # after the command name: state, ppid, pgrp, ...
        if len(fields) > 2 and fields[0] != "Z":
            out.setdefault(int(fields[2]), []).append(int(entry))
    return out


@dataclass
class Series:
    """One process incarnation ("peer3#1": peer 3's second): its samples (t, *FIELDS), t in s since the run's start."""

    name: str
    pid: int
    started_s: float
    samples: list[tuple[float, int, int, int, int, int]] = field(default_factory=list)

    def values(self, what: str) -> list[tuple[float, float]]:
        """(t, value) of one of FIELDS."""
        i = FIELDS.index(what) + 1
        return [(s[0], float(s[i])) for s in self.samples]


class Sampler:
    """A Series per pid shown to sample({name: pid}, t): each daemon's figures and its process group's memory."""

    def __init__(self) -> None:
        self.series: dict[int, Series] = {}
        self._count: dict[str, int] = {}

    def sample(self, named: dict[str, int], t: float) -> None:
        """One sample at t of each process in `named` (name -> pid, a group leader)."""
        by_group = groups()
        for name, pid in named.items():
            if pid not in self.series:
                k = self._count.get(name, 0)
                self._count[name] = k + 1
                self.series[pid] = Series(f"{name}#{k}", pid, t)
            one = proc_sample(pid)
            if one is None:
                continue
            group = sum((s or {}).get("rss_kb", 0) for s in map(proc_sample, by_group.get(pid, [])))
            self.series[pid].samples.append((t, one["rss_kb"], one["fds"], one["threads"], group, one["other_fds"]))


def windows(
    values: list[tuple[float, float]], warmup_s: float, window_s: float
) -> tuple[list[float], list[float]] | None:
    """(values of the first window_s after warmup_s, those of the last window_s); None if they would overlap."""
    if not values or values[-1][0] - values[0][0] < warmup_s + 2 * window_s:
        return None
    t0, t_end = values[0][0], values[-1][0]
    first = [v for t, v in values if t0 + warmup_s <= t < t0 + warmup_s + window_s]
    last = [v for t, v in values if t > t_end - window_s]
    return (first, last) if first and last else None


def growth(values: list[tuple[float, float]], warmup_s: float, window_s: float) -> dict | None:
    """{"first", "last", "change", "pct"}: the windows' means, last - first, 100 (last/first - 1); None: too short."""
    w = windows(values, warmup_s, window_s)
    if w is None:
        return None
    first, last = mean(w[0]), mean(w[1])
    pct = 100.0 * (last / first - 1.0) if first else None
    return {"first": round(first, 2), "last": round(last, 2), "change": round(last - first, 2), "pct": pct}
