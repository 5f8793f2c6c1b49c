"""The hivemind DHT's own process: what runs in it, and how it ends with the daemon that started it.

Owns ParentBoundDHT (hivemind.DHT whose forked process, and the p2pd it spawns, end within
PARENT_POLL_S of its parent's death, or at SIGTERM, removing its tagged unix sockets; every call it
runs holds its own task), the socket-prefix tagging and the collector paused around the fork (gc_paused;
the child freezes what it inherited), ending a DHT process
(SIGTERM, then SIGKILL), and the coroutines HivemindDiscovery runs in that process (the neighbour
check, the re-bootstrap after a partition). swarmd.membership.dht drives it; hivemind is imported
inside the functions, so importing this module stays light, and only the parts a DHT needs (light_hivemind).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import glob
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_SOCKET_PREFIX_LOCK = threading.Lock()
_LIGHT_LOCK = threading.RLock()
_PACKAGE_NAMES_KEPT = ("__version__", "__all__")  # dunders that run hivemind's __init__ (others: introspection)


def light_hivemind() -> None:
    """Let `from hivemind.dht import ...` (p2p, utils, ...) load without hivemind/__init__.py, which imports
    hivemind's averaging, MoE and optimizer stacks (scipy among them) that a DHT never uses: 0.4 s of CPU in every
    CLI client's start (seconds of waiting on a loaded machine). The package module is made from its spec
    without running it; the first lookup of one of its own names (hivemind.DHT, hivemind.Optimizer, ...) runs
    that __init__ then, so `import hivemind` elsewhere in the process still works. Nothing if hivemind is
    imported already."""
    with _LIGHT_LOCK:
        if "hivemind" in sys.modules:
            return
        spec = importlib.util.find_spec("hivemind")
        if spec is None or spec.loader is None:
            return  # not installed: the import that follows says so
        package = importlib.util.module_from_spec(spec)
        loader = spec.loader

        def __getattr__(name: str) -> Any:  # PEP 562: only for names the package module does not hold yet
            if name.startswith("__") and name not in _PACKAGE_NAMES_KEPT:
                raise AttributeError(name)
            if f"hivemind.{name}" in sys.modules:  # a subpackage being imported (`import hivemind.p2p.x as y`)
                return sys.modules[f"hivemind.{name}"]
            with _LIGHT_LOCK:
                if package.__dict__.pop("__getattr__", None) is not None:
                    loader.exec_module(package)  # the real __init__, once
            try:
                return package.__dict__[name]
            except KeyError:
                raise AttributeError(f"module 'hivemind' has no attribute {name!r}") from None

        setattr(package, "__getattr__", __getattr__)  # noqa: B010  (a module attribute mypy types as a method)
        sys.modules["hivemind"] = package


def remove_sockets(prefix: str) -> None:
    """Remove every unix socket whose path starts with prefix (what a p2pd of ours may leave behind)."""
    for path in glob.glob(glob.escape(prefix) + "*"):
        with contextlib.suppress(OSError):
            os.remove(path)


@contextlib.contextmanager
def _p2p_socket_prefix(prefix: str) -> Iterator[None]:
    """Name the unix sockets of the p2pd daemons started meanwhile PREFIX* (hivemind: /tmp/hivemind-*).

    hivemind.DHT forks its process in its constructor and reads P2P._UNIX_SOCKET_PREFIX there, so
    the prefix is set around the constructor only, under a lock (DHTs start from worker threads).
    """
    light_hivemind()
    from hivemind.p2p import P2P

    with _SOCKET_PREFIX_LOCK:
        saved = P2P._UNIX_SOCKET_PREFIX
        P2P._UNIX_SOCKET_PREFIX = "/unix" + prefix
        try:
            yield
        finally:
            P2P._UNIX_SOCKET_PREFIX = saved


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage collection in this process while it forks a DHT process (ParentBoundDHT.run freezes in the child
    what it inherited before it collects again).

    The daemon forks its DHT process while gRPC's threads run: objects of theirs the fork copied mid-use, if a
    collection in the child reaches them, run finalizers against locks and state those threads held. Seen in the
    default suite: a DHT process that segfaulted "Garbage-collecting" in its first neighbour check (and, very likely
    of the same cause, one that hung: every DHT call of its daemon timed out). Use it under _p2p_socket_prefix
    (one fork at a time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _frozen_inheritance() -> None:
    """In a forked DHT process, first: what the fork copied goes to the collector's permanent generation, never
    collected here, and collection resumes for what this process makes (gc_paused disabled it across the fork)."""
    gc.freeze()
    gc.enable()


PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_POLL_S = 1.0  # how often a DHT process checks that the process that started it is alive


def _forget_parent_signals(on_term: Callable[..., None]) -> None:
    """In a forked DHT process: drop the signal setup inherited from the daemon, SIGTERM -> on_term.

    The daemon's event loop installs SIGINT/SIGTERM handlers (runner) before the DHT forks: the
    child inherited handlers that only write to the parent's wakeup fd, so SIGTERM (to the process
    group, or hivemind's terminate() after a slow shutdown) did nothing, and the daemon's exit then
    waited on this process. hivemind ignores SIGINT in its own run().
    """
    with contextlib.suppress(ValueError):  # only possible in the process's main thread
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, on_term)


def _p2pd_dies_with_us() -> None:
    """In a forked DHT process (Linux): the p2pd it spawns gets PR_SET_PDEATHSIG(SIGTERM), so p2pd ends
    even when this process is killed with SIGKILL (an OOM kill) and no watch thread gets to run.

    hivemind spawns p2pd with asyncio.subprocess.create_subprocess_exec from this process's event loop
    thread, which lives as long as the process; the wrapper adds a preexec_fn (uvloop supports it).
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return
    spawn = asyncio.subprocess.create_subprocess_exec

    def bound_spawn(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("preexec_fn", lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM))
        return spawn(*args, **kwargs)

    asyncio.subprocess.create_subprocess_exec = bound_spawn  # this process only


def _parent_bound_dht() -> type:
    """hivemind.DHT whose process, and its p2pd, end within PARENT_POLL_S when its parent dies.

    hivemind's DHT process outlives a parent killed with SIGKILL and keeps its p2pd running: the
    --dht-port and the identity in the checkpoint dir stay taken, so the restarted daemon could not
    have them back. A watch thread in the DHT process ends p2pd (removing its tagged sockets) and
    the process once it is reparented (the parent's pid, not a thread's, as PR_SET_PDEATHSIG would).
    """
    light_hivemind()
    from hivemind.dht import DHT
    from hivemind.p2p import P2P

    class ParentBoundDHT(DHT):
        def run(self) -> None:  # in the forked DHT process
            _frozen_inheritance()
            parent, sockets = os.getppid(), P2P._UNIX_SOCKET_PREFIX.removeprefix("/unix")
            _forget_parent_signals(lambda *_: self._end(sockets))
            _p2pd_dies_with_us()
            threading.Thread(target=self._exit_with, args=(parent, sockets), daemon=True).start()
            super().run()

        # hivemind's DHT process runs each call as asyncio.create_task(...) and drops the reference, so a call
        # awaiting a future that only it references can be garbage-collected mid-await ("Task was destroyed but
        # it is pending!", GeneratorExit in _run_coroutine): its caller then waits for an answer that never
        # comes. Each call this daemon makes holds its own task until it ends.
        async def _get(self, *args: Any, **kwargs: Any) -> None:
            await _held(super()._get(*args, **kwargs))

        async def _store(self, *args: Any, **kwargs: Any) -> None:
            await _held(super()._store(*args, **kwargs))

        async def _run_coroutine(self, *args: Any, **kwargs: Any) -> None:
            await _held(super()._run_coroutine(*args, **kwargs))

        def _exit_with(self, parent: int, sockets: str) -> None:
            while os.getppid() == parent:
                time.sleep(PARENT_POLL_S)
            self._end(sockets)

        def _end(self, sockets: str) -> None:
            """End p2pd, remove this DHT's sockets, exit now (parent gone, or SIGTERM)."""
            p2pd = getattr(getattr(getattr(self, "_node", None), "p2p", None), "_child", None)
            if p2pd is not None and p2pd.returncode is None:
                with contextlib.suppress(OSError):
                    os.kill(p2pd.pid, signal.SIGTERM)
            if "blocktrain-" in sockets:
                remove_sockets(sockets)
            os._exit(0)

    return ParentBoundDHT


_HELD_TASKS: set[asyncio.Task] = set()  # in a DHT process: the calls running now (see ParentBoundDHT)


async def _held(coro: Any) -> Any:
    """Await coro with a strong reference to the running task (the event loop keeps only weak ones)."""
    task = asyncio.current_task()
    if task is not None:
        _HELD_TASKS.add(task)
    try:
        return await coro
    finally:
        _HELD_TASKS.discard(task)


DHT_END_S = 2.0  # a DHT process asked to end (SIGTERM) gets this long, then SIGKILL


def _end_process(process: Any, timeout_s: float) -> None:
    """SIGTERM a (DHT) process, wait up to timeout_s, then SIGKILL it; nothing if it is already gone."""
    if not process.is_alive():
        return
    with contextlib.suppress(OSError):
        os.kill(process.pid, signal.SIGTERM)
    process.join(timeout_s)
    if process.is_alive():
        with contextlib.suppress(OSError):
            os.kill(process.pid, signal.SIGKILL)
        process.join(timeout_s)


REBOOTSTRAP_TIMEOUT_S = 10.0  # bound on one re-bootstrap attempt (connect + ping + neighbour lookup)


async def _dht_neighbours(dht: Any, node: Any) -> tuple[int, list[str]]:
    """In the DHT process: (routing-table size, multiaddrs of the peers p2pd is connected to)."""
    size = len(node.protocol.routing_table.uid_to_peer_id)
    maddrs = []
    for info in await node.p2p.list_peers():
        peer = info.peer_id.to_base58()
        maddrs += [f"{addr}/p2p/{peer}" for addr in info.addrs if "/p2p/" not in str(addr)]
    return size, maddrs


async def _dht_rebootstrap(maddrs: list[str], dht: Any, node: Any) -> int:
    """In the DHT process: dial and ping each multiaddr, then look up our own neighbours (as DHTNode.create's
    bootstrap does); returns how many peers answered."""
    from hivemind.p2p import PeerID
    from hivemind.utils.multiaddr import Multiaddr

    async def one(maddr: str) -> bool:
        try:
            ma = Multiaddr(maddr)
            peer = PeerID.from_base58(ma.value_for_protocol("p2p"))
            if peer == node.peer_id:
                return False
            await node.p2p._client.connect(peer, [ma.decapsulate(Multiaddr(f"/p2p/{peer.to_base58()}"))])
            return await node.protocol.call_ping(peer) is not None
        except Exception:  # unreachable, malformed: the next one may answer
            return False

    answered = sum(await asyncio.gather(*(one(m) for m in dict.fromkeys(maddrs))))
    if answered:
        await asyncio.wait_for(node.find_nearest_nodes([node.node_id]), REBOOTSTRAP_TIMEOUT_S)
    return answered
