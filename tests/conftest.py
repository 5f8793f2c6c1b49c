"""Session-wide test fixtures: real text for every test that wants it, and no child process left behind.

`text_data` is a folder with train.txt and eval.txt of real text, so no test skips for lack of data:
WikiText-2 from $BLOCKTRAIN_DATA, ../shared/data/wikitext-2 or the fetched cache when one is there,
else the Python standard library's sources (swarmd.core.corpus.stdlib_corpus, held out by file),
built once per session. An autouse session fixture points $BLOCKTRAIN_CACHE at a session temp
folder, so the tests never write into the user's cache (held-out tails, the stdlib corpus).

The autouse session fixture `no_leaked_children` runs once after the whole suite: it polls (with a
deadline) for every descendant of the pytest process to be gone (hivemind DHT processes, their p2pd
daemons, `python -m swarmd` daemon subprocesses, multiprocessing children), then reaps and reports
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
SHARED_WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"
USER_ENV = {k: os.environ.get(k) for k in ("BLOCKTRAIN_DATA", "BLOCKTRAIN_CACHE")}  # before the session changes them


def _split_dir(candidate: str | os.PathLike | None) -> Path | None:
    if candidate and (Path(candidate) / "train.txt").is_file() and (Path(candidate) / "eval.txt").is_file():
        return Path(candidate)
    return None


def _user_wikitext() -> Path | None:
    """WikiText-2 as the user has it: $BLOCKTRAIN_DATA, ../shared/data/wikitext-2, or the fetched cache."""
    for candidate in (USER_ENV["BLOCKTRAIN_DATA"], SHARED_WIKITEXT):
        if found := _split_dir(candidate):
            return found
    cache = Path(USER_ENV["BLOCKTRAIN_CACHE"] or Path.home() / ".cache" / "blocktrain") / "wikitext-2"
    return _split_dir(cache) if (cache / "manifest.json").is_file() else None


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """$BLOCKTRAIN_CACHE -> a session temp folder for the whole run (daemon subprocesses inherit it)."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("blocktrain-cache")
    mp.setenv("BLOCKTRAIN_CACHE", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="session")
def text_data(session_cache) -> Path:
    """A folder with train.txt and eval.txt: WikiText-2 if the user has it, else the stdlib corpus."""
    found = _user_wikitext()
    if found is not None:
        return found
    from swarmd.core.corpus import stdlib_corpus

    return stdlib_corpus(cache=session_cache).train.parent


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
