"""HivemindDiscovery: discovery over a real hivemind DHT, in its own process.

Records live under swarm- and block-scoped keys (swarmd.membership.records.block_key) with an expiry,
one subkey per peer; record_validator makes every node of ours refuse forged and unsigned ones. The
DHT is called with return_future=True from a worker thread with a bounded wait, so the daemon's event
loop never blocks; starting it has a timeout and fails with a SwarmdError that names the cause and
what to try (with initial peers, each multiaddr tried and why: swarmd.membership.bootstrap), leaving no p2pd
socket behind. A DHT node listens and announces where
swarmd.membership.addresses says, and keeps its libp2p key in a file when given one (the daemon's
checkpoint dir), so a restarted peer keeps its peer id; a DHT process that died alone is started
again; before a DHT process is forked with no other alive, hivemind's MPFuture backend is made anew (one killed
mid-update wedges every later call: fresh_mpfuture_backend). The forked process itself is
swarmd.membership.dht_process. With it, the only modules that
import hivemind (inside functions: importing this one stays light).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import threading
import time
import uuid
import weakref
from typing import Any

from swarmd.errors import PeerUnavailable, SwarmdError
from swarmd.membership.addresses import free_port, multiaddr
from swarmd.membership.bootstrap import FIX, bootstrap_failure
from swarmd.membership.dht_process import (
    DHT_END_S,
    _dht_neighbours,
    _dht_rebootstrap,
    _end_process,
    _p2p_socket_prefix,
    _parent_bound_dht,
    gc_paused,
    light_hivemind,
    remove_sockets,
)
from swarmd.membership.records import PeerRecord, block_key
from swarmd.membership.trust import dht_record_problem, verified

logger = logging.getLogger(__name__)


def route_hivemind_logs() -> None:
    """Send hivemind's log records through the root logger and its handlers (ours: swarmd.node.runner), not
    hivemind's own handler, which holds the stderr of the moment hivemind was imported (a closed one under a
    CLI test runner) and would replace ours."""
    light_hivemind()
    from hivemind.utils.logging import use_hivemind_log_handler

    use_hivemind_log_handler("nowhere")


def fresh_mpfuture_backend() -> None:
    """Give this process a new hivemind MPFuture backend (result pipe, its reader thread, the update lock) before
    a DHT process is forked. Every DHT result comes back through one pipe per parent process, written under one
    lock shared with every forked DHT process: a DHT process killed while writing (kill -9, or SIGTERM's os._exit
    mid-update) leaves the lock held or a partial message in the pipe, and no later DHT call, nor the start of
    another DHT, ever resolves (reproduced: a DHT killed while busy, then a new one that never got ready).
    Futures in flight are lost, and DHT processes forked before would share the new pipe under another lock: so
    it runs only when no other DHT of this process is alive (a daemon's start and DHT restart; a test's first)."""
    light_hivemind()
    from hivemind.utils.mpfuture import MPFuture

    MPFuture.reset_backend()


def _socket_tag() -> str:
    return f"blocktrain-{uuid.uuid4().hex[:10]}"


CALL_POLL_S = 0.5  # a pending DHT call checks this often whether the DHT process is still there


def _visible_maddrs(dht: Any) -> list[str]:
    """The DHT's visible multiaddrs ([] for a client-mode node, which has none)."""
    try:
        return [str(m) for m in dht.get_visible_maddrs()]
    except ValueError:
        return []


_INSTANCES: weakref.WeakSet[HivemindDiscovery] = weakref.WeakSet()  # this process's DHT instances
RECENT_PEERS = 16  # multiaddrs of peers last seen, kept to re-bootstrap from after a partition


def _start_error(
    exc: BaseException, initial_peers: list[str] | tuple[str, ...], host: str, timeout_s: float, identity_path: str
) -> str:
    """The one-line message for a DHT that did not start: the cause and what to try."""
    cause = (
        f"{type(exc).__name__}: {exc}"
        if str(exc)
        else f"no answer within {timeout_s:.0f} s"
        if isinstance(exc, TimeoutError)
        else type(exc).__name__
    )
    if identity_path and "already taken" in str(exc):
        hint = f"another running peer uses the identity in {identity_path}: give each peer its own --checkpoint-dir"
    elif initial_peers and not isinstance(exc, ValueError):  # a ValueError: a multiaddr hivemind cannot parse
        return bootstrap_failure(initial_peers, cause)  # each multiaddr tried, why it failed, and the fix
    elif initial_peers:
        hint = FIX
    else:
        hint = "check that the host can open TCP ports on " + host
    return f"could not start the DHT ({cause}); {hint}"


def share_memory_by_fd() -> None:
    """hivemind's futures (MPFuture) keep their state in torch shared memory, by default through torch_shm_manager
    ("file_system"), whose first use spawns that manager process: in every CLI client's DHT start, 0.2 s on a quiet
    machine and 2 s on a loaded one. This process shares it by file descriptor instead (no manager; no descriptor
    is left open per call: 2,000 lookups kept the count flat). Daemons keep hivemind's default; an explicit
    $HIVEMIND_MEMORY_SHARING_STRATEGY is left alone."""
    if os.environ.get("HIVEMIND_MEMORY_SHARING_STRATEGY"):
        return
    light_hivemind()
    from hivemind.utils import mpfuture  # sets hivemind's default when imported: this comes after

    mpfuture.torch.multiprocessing.set_sharing_strategy("file_descriptor")  # the torch hivemind runs on


MAX_BLOCKS = 1024  # block keys the record validator recognises as this swarm's (block indices 0 .. MAX_BLOCKS-1)


def record_validator(swarm_id: str) -> Any:
    """A hivemind RecordValidatorBase for this swarm's keys: every entry under block_key(swarm_id, *) must be a
    PeerRecord (schema) signed by the peer it names, stored under its own peer id and block key, with a DHT
    expiration no later than the signed one (swarmd.membership.trust.dht_record_problem). Other keys pass untouched.

    hivemind checks it when a node is asked to store an entry and when a lookup returns one, so a forged or
    unsigned record is never stored by, nor returned to, a node that runs it.
    """
    light_hivemind()
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord, RecordValidatorBase
    from hivemind.utils.serializer import MSGPackSerializer

    keys = {DHTID.generate(source=block_key(swarm_id, b)).to_bytes(): b for b in (None, *range(MAX_BLOCKS))}

    class PeerRecordValidator(RecordValidatorBase):
        def validate(self, record: DHTRecord) -> bool:
            if record.key not in keys:
                return True  # not a key of this swarm
            try:
                subkey = MSGPackSerializer.loads(record.subkey)
                value = MSGPackSerializer.loads(record.value)
            except Exception:  # msgpack raises several types on garbage
                return False
            rec = PeerRecord.from_value(value)
            problem = dht_record_problem(rec, subkey, record.expiration_time, keys[record.key], swarm_id)
            if problem:
                logger.debug("DHT record refused: %s", problem)
            return not problem

    return PeerRecordValidator()


class HivemindDiscovery:
    """A real hivemind DHT node: announce under block_key(swarm, b) and block_key(swarm, None).

    :param initial_peers: multiaddrs of running peers (empty: start a new swarm)
    :param host: interface for the libp2p listener
    :param start_timeout_s: fail with SwarmdError if the DHT is not up after this many seconds
    :param client_mode: the DHT node accepts no inbound connections either
    :param port: tcp port of the libp2p listener (0 = one the OS picks)
    :param announce_host: the host the node tells others to dial ("" = its listen addresses); with
        port 0 a free port is picked first, since an announced multiaddr needs its port
    :param identity_path: file holding the node's libp2p private key (created when missing), so the
        peer id, and with a fixed port the multiaddr, survive a restart ("" = a new id every start)
    :param quick_start: a CLI client's DHT (status, score, generate, the dashboard: connect_discovery): hivemind's
        futures share memory by file descriptor (share_memory_by_fd), and no multiaddrs are asked for (a client
        has none to show)
    :note: the DHT runs in its own process; every call here awaits an MPFuture. The unix sockets of
        its p2pd daemon carry a tag of this instance, so a failed start removes exactly its own.
    """

    call_timeout_s = 20.0  # bound on every store / lookup, seconds

    def __init__(
        self,
        swarm_id: str,
        initial_peers: list[str] | tuple[str, ...] = (),
        host: str = "127.0.0.1",
        start_timeout_s: float = 30.0,
        client_mode: bool = False,
        *,
        port: int = 0,
        announce_host: str = "",
        identity_path: str = "",
        quick_start: bool = False,
    ):

        self.swarm_id = swarm_id
        if quick_start:
            share_memory_by_fd()
        self._start_args = (host, start_timeout_s, client_mode, announce_host, identity_path)  # for restart()
        self.dht = self._start_dht(
            initial_peers, host, start_timeout_s, client_mode, port, announce_host, identity_path
        )
        self.peer_id = self.dht.peer_id.to_base58()
        self.initial_peers = [str(m) for m in initial_peers]
        self._maddrs = [] if quick_start else _visible_maddrs(self.dht)
        self.recent: collections.deque[str] = collections.deque(maxlen=RECENT_PEERS)  # multiaddrs last seen
        self.isolated = False  # lost every DHT neighbour (logged once, until re-bootstrapped)
        self._closing = threading.Event()  # set by shutdown(): pending calls give up
        self.restarts = 0  # DHT processes started again after the one before was gone (killed alone)
        self.may_restart = True  # False once the daemon is stopping (SIGTERM to the group ends the DHT first)
        self._found_dead = False  # the last neighbour check found the DHT process gone

    def _start_dht(
        self,
        initial_peers: list[str] | tuple[str, ...],
        host: str,
        start_timeout_s: float,
        client_mode: bool,
        port: int,
        announce_host: str,
        identity_path: str,
    ) -> Any:
        """Fork a DHT process (and its p2pd) bound to this process and wait until it is ready (SwarmdError with a
        hint if it does not start)."""
        dht = None
        self._sockets = f"/tmp/hivemind-{_socket_tag()}-"  # this instance's p2pd unix sockets start so
        _INSTANCES.add(self)
        try:
            if announce_host and not client_mode and port == 0:
                port = free_port(host)
            if not any(d is not self and d.dht_alive() for d in list(_INSTANCES)):  # no other DHT uses it now
                fresh_mpfuture_backend()  # a DHT process killed mid-update may have left the old one wedged
            with _p2p_socket_prefix(self._sockets), gc_paused():  # the prefix is read by the DHT process forked here
                dht = _parent_bound_dht()(
                    initial_peers=list(initial_peers),
                    host_maddrs=[] if client_mode else [multiaddr(host, port)],
                    announce_maddrs=[multiaddr(announce_host, port)] if announce_host and not client_mode else None,
                    identity_path=identity_path or None,
                    client_mode=client_mode,
                    record_validators=[record_validator(self.swarm_id)],
                    start=True,
                    await_ready=False,
                )
            dht.wait_until_ready(timeout=start_timeout_s)
        except BaseException as exc:  # P2PDaemonError, TimeoutError, ValueError from a bad multiaddr, ...
            if dht is not None:
                dht.shutdown()
            self._remove_sockets()
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise SwarmdError(_start_error(exc, initial_peers, host, start_timeout_s, identity_path)) from None
        return dht

    def dht_alive(self) -> bool:
        """Whether this instance's DHT process runs."""
        dht = getattr(self, "dht", None)
        return dht is not None and dht.is_alive()

    def restart(self) -> None:
        """Start the DHT process again after it died alone (an OOM kill, a crash; blocking): the same listen port
        and identity (so the same DHT peer id and multiaddrs), bootstrapping from the initial and recent peers."""
        if not self.may_restart or self._closing.is_set():
            raise PeerUnavailable("the DHT process is gone and the daemon is stopping")
        host, start_timeout_s, client_mode, announce_host, identity_path = self._start_args
        port = next((int(m.split("/tcp/")[1].split("/")[0]) for m in self._maddrs if "/tcp/" in m), 0)
        own = f"/p2p/{self.peer_id}"
        peers = [m for m in dict.fromkeys((*self.initial_peers, *reversed(self.recent))) if not m.endswith(own)]
        with contextlib.suppress(Exception):
            self.dht.shutdown()  # its process is gone: this only releases what the parent holds
        self._remove_sockets()
        for bootstrap, at in ((peers, port), ([], port), ([], 0)):  # nobody answers / the port is taken: start alone
            try:
                self.dht = self._start_dht(
                    bootstrap, host, start_timeout_s, client_mode, at, announce_host, identity_path
                )
                break
            except SwarmdError as exc:
                logger.warning("DHT restart (%d bootstrap peers, port %d) failed: %s", len(bootstrap), at, exc)
        else:
            raise SwarmdError("the DHT process is gone and could not be started again")
        self.peer_id = self.dht.peer_id.to_base58()
        self._maddrs = _visible_maddrs(self.dht) or self._maddrs
        self.restarts += 1
        if not self.may_restart or self._closing.is_set():  # the daemon began stopping meanwhile
            self.dht.shutdown()
            self._remove_sockets()

    def _remove_sockets(self) -> None:
        """Remove the unix sockets this instance's p2pd left behind (p2pd that dies by itself leaves them)."""
        remove_sockets(self._sockets)

    @classmethod
    async def create(cls, *args, **kwargs) -> HivemindDiscovery:
        """Start the DHT without blocking the event loop."""
        return await asyncio.to_thread(cls, *args, **kwargs)

    async def _call(self, what: str, fn):
        """Run a blocking DHT call in a worker thread with a timeout (MPFuture.result(timeout)).

        :note: awaiting hivemind's MPFuture directly from event loops in several threads proved
            flaky in tests; a worker thread and a bounded wait never hang the daemon. The wait gives up
            at once when the DHT process is gone or shutdown() began (a future it holds never resolves,
            and the daemon's exit would otherwise wait for the worker thread, up to call_timeout_s).
        """

        def wait():
            future, deadline = fn(), time.monotonic() + self.call_timeout_s
            while True:
                try:
                    return future.result(timeout=min(CALL_POLL_S, max(0.0, deadline - time.monotonic())))
                except TimeoutError:
                    if self._closing.is_set() or not self.dht.is_alive():
                        raise PeerUnavailable(f"DHT {what}: the DHT process is gone") from None
                    if time.monotonic() >= deadline:
                        raise

        try:
            return await asyncio.to_thread(wait)
        except TimeoutError:
            raise PeerUnavailable(f"DHT {what} took longer than {self.call_timeout_s:.0f}s") from None

    async def announce(self, record: PeerRecord, ttl_s: float) -> None:
        from hivemind.utils import get_dht_time

        expiration = record.expires or get_dht_time() + ttl_s  # a signed record expires when its owner said
        value = record.to_value()
        ok = await asyncio.gather(
            *(
                self._call(
                    "store",
                    lambda k=k: self.dht.store(
                        block_key(self.swarm_id, k), value, expiration, subkey=record.peer_id, return_future=True
                    ),
                )
                for k in (record.block_index, None)
            )
        )
        if not all(ok):
            logger.warning(
                "[block %d %s] DHT announce was not stored everywhere", record.block_index, record.peer_id[-6:]
            )

    async def _get(self, block_index: int | None) -> list[PeerRecord]:
        found = await self._call(
            "lookup", lambda: self.dht.get(block_key(self.swarm_id, block_index), latest=True, return_future=True)
        )
        if found is None or not isinstance(found.value, dict):
            return []
        records = [
            r
            for subkey, item in found.value.items()
            if (r := PeerRecord.from_value(item.value)) is not None and r.peer_id == subkey
        ]
        # verify on read too: a validator is per node, and a stranger's node need not run ours
        return sorted((r for r in verified(records) if r.swarm_id == self.swarm_id), key=lambda r: r.peer_id)

    async def find(self, block_index: int) -> list[PeerRecord]:
        return [r for r in await self._get(block_index) if r.block_index == block_index]

    async def find_all(self) -> list[PeerRecord]:
        return await self._get(None)

    def multiaddrs(self) -> list[str]:
        """The multiaddrs others dial (read once at start: GetStatus runs this on the event loop, and a DHT
        call there would block it for good once the DHT process is gone, e.g. during a SIGTERM)."""
        return list(self._maddrs)

    async def keep_connected(self) -> int:
        """Remember the peers we are connected to; with no DHT neighbour left (a partition, every peer we knew
        restarted), re-bootstrap from the initial peers and the recently seen ones. Returns the neighbour count.

        Called by the daemon every announce period: a healed partition finds the swarm again within one
        period (plus the re-bootstrap), and the next round's sync adopts the majority's state.
        """
        if not self.dht.is_alive() and self.may_restart and not self._closing.is_set():  # died alone: start again
            if not self._found_dead:  # once more on the next check: a signal to the whole group may be ending us
                self._found_dead = True
                raise PeerUnavailable("the DHT process is gone; restarting it on the next check")
            logger.warning("DHT %s: the DHT process is gone; restarting it", self.peer_id[-6:])
            await asyncio.to_thread(self.restart)
            self._found_dead = False
            logger.warning("DHT %s restarted (%d peers to bootstrap from)", self.peer_id[-6:], len(self.recent))
        size, maddrs = await self._call("neighbour lookup", lambda: self.dht.run_coroutine(_dht_neighbours, True))
        own = f"/p2p/{self.peer_id}"
        for m in maddrs:
            if not m.endswith(own) and m not in self.recent:
                self.recent.append(m)
        if size and maddrs:
            if self.isolated:
                logger.warning("DHT %s: %d neighbours again, back in the swarm", self.peer_id[-6:], size)
            self.isolated = False
            return size
        candidates = [m for m in (*self.initial_peers, *reversed(self.recent)) if not m.endswith(own)]
        if not candidates:
            return size  # the first peer of a swarm: nobody to look for
        if not self.isolated:
            logger.warning(
                "DHT %s lost every neighbour; re-bootstrapping from %d known peers", self.peer_id[-6:], len(candidates)
            )
            self.isolated = True
        found = await self._call(
            "re-bootstrap", lambda: self.dht.run_coroutine(functools.partial(_dht_rebootstrap, candidates), True)
        )
        if found:
            logger.warning("DHT %s re-bootstrapped: %d peers answered", self.peer_id[-6:], found)
            self.isolated = False
        return int(found)

    async def shutdown(self) -> None:
        """End the DHT process at once: SIGTERM runs its _end (p2pd ended, sockets removed, os._exit), as a
        signal to the daemon's process group does; hivemind's own graceful shutdown held a stopping daemon up to
        3 s more on a loaded machine and then terminated it anyway. A DHT holds nothing to save."""
        self._closing.set()
        await asyncio.to_thread(_end_process, self.dht, DHT_END_S)
        await asyncio.to_thread(self.dht.shutdown)  # the process is gone: this only releases what the parent holds
        self._remove_sockets()
