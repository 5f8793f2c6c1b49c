"""Run one daemon in the foreground: logging, signal handlers, the lines it prints, a clean stop.

Owns the stdout of a daemon process, shared by `blocktrain run` / `blocktrain join` and
`python -m swarmd`, which LocalSwarm (launch.py) and the tests parse:
  swarm: ID / peer: ID / block: N / round: N / address: HOST:PORT or (client mode)
  metrics: http://HOST:PORT/metrics (with --metrics-port)
  multiaddr: MULTIADDR (one line each) / join with: COMMAND (when there is a multiaddr; join_hint) / ready
then one `round R: block B train ce ... participation ... sent X.XX MB in ...s` line per merged
round (bytes sent so far, in MB = 10^6 bytes as `blocktrain demo` shows them), once a peer dialled it back
the reachability line (`reachable: peers can dial HOST:PORT` or `not reachable from HOST: ...`,
swarmd.node.reachability), and a final
`stopped at round R[, checkpoint in DIR]`. SIGINT / SIGTERM stop the daemon
(it checkpoints and leaves). A joiner that merges nothing for a known cause (swarmd.node.diagnosis) stops
the same way, and run_foreground then raises NothingMerges: one `error: ...` line on stderr, exit code 3
(unless --keep-trying). Torch is imported only when a daemon runs, so importing this module
(for setup_logging) stays light.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from swarmd.errors import NothingMerges
from swarmd.membership.addresses import is_loopback, multiaddr_host, preferred_multiaddr
from swarmd.node.config import DaemonConfig

if TYPE_CHECKING:  # the round loop's report (importing gossip at run time would load torch)
    from swarmd.averaging.round import MergeReport


def _print(line: str) -> None:
    print(line, flush=True)  # a parent process reads these lines as they come


LIBRARY_LOGGERS = ("hivemind", "grpc")  # their own log lines reach stderr only with verbose


class _Stderr(logging.StreamHandler):
    """A handler writing to whatever sys.stderr is when a record comes (a CLI test runner swaps and closes it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def setup_logging(verbose: bool = False, hivemind: bool = True) -> None:
    """Log to stderr (INFO with verbose, else WARNING), hivemind's logger routed into the root logger.

    Without verbose a daemon's stderr shows only our warnings and errors (its rounds are the stdout
    lines), none of hivemind's or grpc's own log lines (e.g. the ERROR and traceback hivemind's DHT
    process logs when a client-mode node has no multiaddr to show); verbose adds the INFO logs of
    every exchange, merge and re-sync, hivemind's and grpc's included. `HIVEMIND_LOGLEVEL`, when set,
    is the hivemind loggers' level either way; `GRPC_VERBOSITY` (gRPC core's own stderr lines), when
    set, is left alone, else it is NONE without verbose (for the channels and servers created after).

    :param hivemind: route hivemind's logger (imports hivemind, and so torch: off for a peer status)
    """
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=[_Stderr()])
    if not verbose:
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    quiet_library_logs(verbose)
    if not hivemind:
        return
    from swarmd.membership.dht import route_hivemind_logs

    route_hivemind_logs()  # resets the hivemind logger's level, and the root's to $HIVEMIND_LOGLEVEL (INFO)
    logging.getLogger().setLevel(level)  # ours wins
    quiet_library_logs(verbose)


class HungUpCaller(logging.Filter):
    """grpc's asyncio server logs an ERROR with a traceback (`ExecuteBatchError raised in core`) when it cannot send
    the status of a call whose caller has already gone, e.g. a peer refused mid-stream that hung up: nothing failed
    on our side, so it becomes one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("ExecuteBatchError raised in core"):
            record.msg, record.args = f"the caller hung up before our answer ({record.getMessage()})", ()
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
        return True


GRPC_SERVER_LOGGER = "grpc._cython.cygrpc"  # where grpc's asyncio server logs a servicer's failures


def quiet_library_logs(verbose: bool) -> None:
    """hivemind's and grpc's Python loggers: CRITICAL only without verbose, else the root's level.

    An explicit $HIVEMIND_LOGLEVEL sets the hivemind loggers' level instead (a debugging user asked
    for it). Setting a level, not a handler: the DHT process, forked after this, inherits it.
    """
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.CRITICAL)
    server = logging.getLogger(GRPC_SERVER_LOGGER)
    if not any(isinstance(f, HungUpCaller) for f in server.filters):
        server.addFilter(HungUpCaller())
    explicit = os.environ.get("HIVEMIND_LOGLEVEL", "").strip().upper()
    if explicit and isinstance(logging.getLevelName(explicit), int):
        logging.getLogger("hivemind").setLevel(explicit)


EXIT_GRACE_S = 2.0  # a process entry point ends at most this long after its daemon has shut down
_end_process = False  # set by end_process_after_shutdown (process entry points only)


def end_process_after_shutdown() -> None:
    """For a process entry point (`python -m swarmd`, the `blocktrain` console script): once a daemon run here
    has shut down (final checkpoint written, servers and DHT stopped), the process ends within EXIT_GRACE_S even
    if a worker thread is still blocked (asyncio.run waits for its executor's threads, e.g. a DHT or disk call
    in flight), so SIGTERM / SIGINT end the process within seconds. Never in a process that goes on (tests)."""
    global _end_process
    _end_process = True


def _exit_now(code: int = 0) -> None:
    """End the process (with `code`) without waiting on threads that outlived the daemon (see run_foreground).

    Runs on a timer thread, maybe while the interpreter is finalizing: no logging (its handlers' streams may be
    closed, and a logging error prints a traceback), one raw write to fd 2, then os._exit."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(OSError):
        os.write(2, f"ending the process: still running {EXIT_GRACE_S:.0f}s after the daemon's shutdown\n".encode())
    os._exit(code)


def run_foreground(config: DaemonConfig, echo: Callable[[str], None] = _print) -> None:
    """Start a Daemon, print how to reach it, serve until SIGINT/SIGTERM or max_rounds, print how it stopped.

    :param echo: where each stdout line goes (default: print and flush)
    :raises NothingMerges: after the `stopped at round` line, when the daemon stopped because nothing merges
    :note: blocks the calling thread (asyncio.run); errors from start() propagate after a clean shutdown.
    """
    asyncio.run(_main(config, echo))


async def _main(config: DaemonConfig, echo: Callable[[str], None]) -> None:
    from swarmd.node.daemon import Daemon
    from swarmd.transport.framing import start_hash_thread

    def on_round(report: MergeReport) -> None:
        st, m = daemon.state, daemon.metrics
        echo(
            f"round {st.round}: block {st.block_index} train ce {m.last_train_ce:.4f} "
            f"participation {report.participation:.2f} sent {m.bytes_sent / 1e6:.2f} MB in {report.seconds:.2f}s"
        )

    loop = asyncio.get_running_loop()
    loop.set_default_executor(started_worker_pool())  # every long-lived thread starts now: a count that grows leaks
    start_hash_thread()
    daemon = Daemon(config, on_round=on_round)
    daemon.reachability.on_result = lambda result: echo(result.line)  # `reachable: ...` once a peer dialled us back
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, daemon.stop)
    try:
        await daemon.start()
    except BaseException:
        await daemon.shutdown()
        raise
    swarm_id = config.net.swarm_id
    echo(f"swarm: {swarm_id}")
    echo(f"peer: {daemon.peer_id}")
    if daemon.discovery is not None and daemon.discovery.peer_id != daemon.peer_id:
        echo(f"dht peer: {daemon.discovery.peer_id}")  # the DHT node's libp2p id: the one in the multiaddr
    echo(f"block: {daemon.state.block_index}")
    echo(f"round: {daemon.state.round}")
    echo(f"address: {daemon.address or '(client mode)'}")
    if daemon.metrics_url:
        echo(f"metrics: {daemon.metrics_url}")
    multiaddrs = daemon.multiaddrs()
    for m in multiaddrs:
        echo(f"multiaddr: {m}")
    if multiaddrs:
        echo(f"join with: {join_hint(multiaddrs, swarm_id, keyed=daemon.swarm_key is not None)}")
    echo("ready")
    failure: NothingMerges | None = None
    try:
        await daemon.serve()
    except NothingMerges as exc:  # stopped cleanly (checkpoint written, DHT stopped): say why after the last line
        failure = exc
    where = f", checkpoint in {config.checkpoint_dir}" if config.checkpoint_dir else ""
    echo(f"stopped at round {daemon.state.round}{where}")
    arm_process_end(failure.exit_code if failure else 0)
    if failure is not None:
        raise failure


WORKER_THREADS = min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor's size
WORKER_START_S = 10.0


def started_worker_pool(workers: int = WORKER_THREADS) -> ThreadPoolExecutor:
    """The event loop's executor (asyncio.to_thread: DHT calls, disk, training) with all its threads started now.

    A ThreadPoolExecutor starts a thread only when a task finds none idle, so a daemon's thread count rose over
    hours as bursts of slow DHT calls (a bootstrap peer down) reached the pool's bound: growth that looks like a
    leak. Started up front, the count is flat from the start, and one that grows is a leak."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="swarmd-worker")
    barrier = threading.Barrier(workers)

    def meet() -> None:  # every thread busy at once: each submit finds none idle and starts one
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(WORKER_START_S)

    for future in [pool.submit(meet) for _ in range(workers)]:
        future.result()
    return pool


def join_hint(multiaddrs: list[str], swarm_id: str, keyed: bool = False) -> str:
    """The `blocktrain join` command the `join with:` line shows: the multiaddr another host can dial (not loopback
    when the DHT announces another address) and, with such a one, `--listen 0.0.0.0:0`, so that the joiner on
    another host is reachable in turn (its default --listen is loopback); with `keyed` (this swarm has a key),
    ` --swarm-key FILE`, a placeholder: the key never shows."""
    maddr = preferred_multiaddr(multiaddrs)
    everywhere = "" if is_loopback(multiaddr_host(maddr)) else " --listen 0.0.0.0:0"
    key = " --swarm-key FILE" if keyed else ""
    return f"blocktrain join {maddr} --data FILE --swarm-id {swarm_id}{key}{everywhere}"


def arm_process_end(code: int = 0) -> None:
    """After a daemon's shutdown: if this is a process entry point, end the process within EXIT_GRACE_S (with
    `code` if it has not ended by then)."""
    if _end_process:
        timer = threading.Timer(EXIT_GRACE_S, _exit_now, args=(code,))
        timer.daemon = True
        timer.start()
