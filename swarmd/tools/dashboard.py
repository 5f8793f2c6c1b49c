"""Web swarm map: the JSON behind `blocktrain dashboard`, the CE history it keeps, and its small HTTP server.

Owns, for a client of the swarm like `blocktrain status` (no torch, no model, no grpc here):
  swarm_view(summary, history)  the /api/swarm JSON: blocks as columns, each with its peers (state,
                  round, samples/s, participation, consensus distance, train and held-out CE) and
                  the block's CE history; unknown values (NaN) become null;
  CeHistory       per block, the (seconds, round, train CE, held-out CE) points seen so far (bounded);
  SwarmWatcher    one discovery (a client-mode DHT, or a static HOST:PORT list) and one PeerClient,
                  kept open between polls; surveys the swarm every period (survey.survey_discovered)
                  as a task on the caller's loop and keeps the latest view as JSON bytes; `first`
                  is set once the first survey is done (or failed, or the watcher stopped);
  DashboardServer the page (dashboard.html, package data beside this module) at / and the latest
                  view at /api/swarm, from the standard library's ThreadingHTTPServer in one daemon
                  thread (start/stop; port 0 = any free port). The page carries the view of its
                  moment (page_with_view), and a page asked for before the first survey is done
                  waits for it (up to FIRST_VIEW_WAIT_S): its first paint shows the swarm, not
                  "connecting";
  run_dashboard   all of it until stopped (SIGINT/SIGTERM, or an event the caller sets).
Server choice: the standard library's http.server. aiohttp is not installed (neither hivemind nor
grpc pulls it in), the page needs two GET routes, and prometheus_client serves /metrics the same way
(a stdlib server in a thread). The HTTP thread never calls the swarm: it hands out the bytes the
watcher last produced (at most waiting for the first survey), so a slow peer never stalls the page. The
page fetches nothing from the internet (no CDN): plain JS draws the view it came with, then polls
/api/swarm every second and draws the chart as inline SVG.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from swarmd.errors import ConfigError
from swarmd.membership.discovery import Discovery, connect_discovery
from swarmd.node.http_endpoint import HttpEndpoint
from swarmd.tools.survey import survey_discovered
from swarmd.transport import PeerClient

logger = logging.getLogger(__name__)

PAGE = "dashboard.html"  # package data of swarmd.tools (pyproject [tool.setuptools.package-data])
FIRST_VIEW = b'<script id="first-view" type="application/json">null</script>'  # in PAGE: the view goes here
FIRST_VIEW_WAIT_S = 60.0  # a page asked for before the first survey waits this long for it at most
PEER_FIELDS = (
    "peer_id",
    "state",
    "round",
    "local_steps",
    "samples_per_s",
    "participation",
    "consensus_distance",
    "train_ce",
    "last_ce",
    "bytes_sent",
    "bytes_received",
    "uptime_s",
    "address",
    "client_mode",
)


def finite(value: Any) -> Any:
    """NaN and infinities (unknown) become None, recursively, so the JSON is strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def _mean(values: list[float]) -> float:
    known = [v for v in values if isinstance(v, float | int) and math.isfinite(v)]
    return sum(known) / len(known) if known else math.nan


class CeHistory:
    """Per block, a point (t_s, round, train CE, held-out CE) whenever one of the last three changes.

    Train CE is the mean over the block's peers of their last round's training CE; held-out CE the
    mean of their last from-noise CE of the assembled model (NaN until a peer measured one).

    :param max_points: points kept per block (the oldest go first)
    """

    def __init__(self, max_points: int = 1000):
        self.max_points = max_points
        self.points: dict[int, deque[tuple[float, int, float, float]]] = {}

    def add(self, summary: dict, t_s: float) -> None:
        """Record the blocks of one survey (survey.summarize's dict) seen t_s seconds after the start."""
        for b in {r["block"] for r in summary["peers"]}:
            rows = [r for r in summary["peers"] if r["block"] == b]
            train = _mean([r.get("train_ce", math.nan) for r in rows])  # train_ce: peers that report it
            held_out = _mean([r["last_ce"] for r in rows])
            if math.isnan(train) and math.isnan(held_out):
                continue
            point = (round(t_s, 2), max(r["round"] for r in rows), train, held_out)
            series = self.points.setdefault(b, deque(maxlen=self.max_points))
            if not series or _differs(series[-1][1:], point[1:]):
                series.append(point)

    def series(self, block_index: int) -> dict[str, list]:
        """{"t_s": [...], "round": [...], "train_ce": [...], "eval_ce": [...]} of one block (empty lists if none)."""
        pts = list(self.points.get(block_index, ()))
        return {key: [p[i] for p in pts] for i, key in enumerate(("t_s", "round", "train_ce", "eval_ce"))}


def _differs(a: tuple, b: tuple) -> bool:
    return any(not (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))) for x, y in zip(a, b))


def swarm_view(
    summary: dict | None, history: CeHistory, swarm_id: str = "", status: str = "ok", error: str = ""
) -> dict:
    """The /api/swarm JSON: swarm totals and one column per block, peers sorted by id; None for unknowns.

    :param summary: survey.summarize's dict (None before the first survey: no blocks yet)
    :param status: "connecting" (no survey yet), "ok", or "error" (the last survey failed; the
        blocks are those of the last survey that worked)
    """
    summary = summary or {"peers": [], "blocks": [], "consensus_distance": math.nan}
    n_blocks = max([len(summary["blocks"]), *(r["block"] + 1 for r in summary["peers"])])
    by_index = {b["block"]: b for b in summary["blocks"]}
    blocks = []
    for b in range(n_blocks):
        rows = sorted((r for r in summary["peers"] if r["block"] == b), key=lambda r: r["peer_id"])
        info = by_index.get(b, {})
        blocks.append(
            {
                "block": b,
                "samples_per_s": sum(r["samples_per_s"] for r in rows),
                "consensus_distance": info.get("consensus_distance", math.nan),
                "peers": [{k: r.get(k, math.nan) for k in PEER_FIELDS} for r in rows],
                "history": history.series(b),
            }
        )
    peers = summary["peers"]
    return finite(
        {
            "swarm_id": swarm_id,
            "status": status,
            "error": error,
            "updated_unix": time.time(),
            "peers": len(peers),
            "round": max((r["round"] for r in peers), default=0),
            "samples_per_s": sum(r["samples_per_s"] for r in peers),
            "consensus_distance": summary["consensus_distance"],
            "blocks": blocks,
        }
    )


class SwarmWatcher:
    """Surveys a swarm every period_s through one open discovery and client; `view_bytes()` is the latest JSON.

    :param swarm: DHT multiaddrs (a client-mode DHT finds the peers) or HOST:PORT gRPC addresses
    :param timeout_s: per peer status call, seconds
    :param period_s: pause between the end of one survey and the start of the next, seconds
    :param start_timeout_s: for the client DHT to start and reach the swarm, seconds
    """

    def __init__(
        self,
        swarm: list[str],
        swarm_id: str,
        timeout_s: float = 2.0,
        period_s: float = 1.0,
        start_timeout_s: float = 30.0,
    ):
        self.swarm, self.swarm_id = list(swarm), swarm_id
        self.timeout_s, self.period_s, self.start_timeout_s = timeout_s, period_s, start_timeout_s
        self.history = CeHistory()
        self.client = PeerClient()
        self.discovery: Discovery | None = None
        self.summary: dict | None = None
        self.started = time.monotonic()
        self.polls = 0
        self.first = threading.Event()  # the first survey is done (or failed, or the watcher stopped)
        self._view = self._encode("connecting")

    def _encode(self, status: str, error: str = "") -> bytes:
        view = swarm_view(self.summary, self.history, self.swarm_id, status, error)
        return json.dumps({**view, "polls": self.polls}, separators=(",", ":")).encode()

    def view_bytes(self) -> bytes:
        """The latest /api/swarm JSON (safe from any thread: one reference swapped per survey)."""
        return self._view

    async def start(self) -> None:
        """Open the discovery (bad addresses raise SwarmdError; an unreachable DHT fails after start_timeout_s)."""
        timeout_s = self.timeout_s
        self.discovery = await connect_discovery(
            self.swarm, self.swarm_id, lambda a: self.client.status(a, timeout_s), self.start_timeout_s
        )

    async def poll(self) -> dict:
        """One survey now: updates the history and the view; returns the survey's summary."""
        if self.discovery is None:
            await self.start()
        assert self.discovery is not None
        summary = await survey_discovered(self.discovery, self.client, self.timeout_s)
        self.summary, self.polls = summary, self.polls + 1
        self.history.add(summary, time.monotonic() - self.started)
        self._view = self._encode("ok")
        return summary

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until stop is set; a failed survey logs one warning and shows its error on the page."""
        try:
            while not stop.is_set():
                try:
                    await self.poll()
                except Exception as exc:  # a DHT lookup or a config call failed: keep the last view, say why
                    logger.warning("dashboard: survey failed: %s", exc)
                    self._view = self._encode("error", str(exc) or type(exc).__name__)
                self.first.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.period_s)
        finally:
            self.first.set()

    async def close(self) -> None:
        self.first.set()  # a page waiting for the first survey gets the view as it is
        if self.discovery is not None:
            await self.discovery.shutdown()
            self.discovery = None
        await self.client.close()


def page_with_view(page: bytes, view: bytes) -> bytes:
    """The page with a view (the /api/swarm JSON) in its FIRST_VIEW element, which the page draws at once.

    The JSON is ASCII (json.dumps); <, > and & become \\u escapes, valid JSON that can never close the script
    element, whatever strings the peers sent.
    """
    safe = view.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")
    return page.replace(FIRST_VIEW, FIRST_VIEW.replace(b">null<", b">" + safe + b"<"), 1)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        page: bytes,
        view: Callable[[], bytes],
        first_view: Callable[[float], object] | None,
    ):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.page, self.view, self.first_view = page, view, first_view
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            if self.server.first_view is not None:
                self.server.first_view(FIRST_VIEW_WAIT_S)  # this thread only: the first survey, then the page
            self._send(200, "text/html; charset=utf-8", page_with_view(self.server.page, self.server.view()))
        elif path == "/api/swarm":
            self._send(200, "application/json", self.server.view())
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("dashboard %s " + format, self.address_string(), *args)


def page_bytes() -> bytes:
    """The dashboard page shipped with the package."""
    return resources.files("swarmd.tools").joinpath(PAGE).read_bytes()


class DashboardServer(HttpEndpoint):
    """The page at http://HOST:PORT/ (with `view()`'s bytes in it) and `view()`'s bytes at /api/swarm, served by
    daemon threads.

    :param view: returns the current /api/swarm JSON bytes (called on an HTTP thread; must not block)
    :param first_view: waits up to the seconds it is given for the first survey (e.g. SwarmWatcher.first.wait);
        a page request calls it first, so the page carries the swarm (None: no wait)
    """

    path = "/"

    def __init__(self, view: Callable[[], bytes], first_view: Callable[[float], object] | None = None):
        super().__init__()
        self.view, self.first_view = view, first_view

    def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve on host:port (port 0 = any free port); returns the bound port.

        :raises ConfigError: the port is taken or the host cannot be bound
        """
        try:
            self._server = _Server((host, port), page_bytes(), self.view, self.first_view)
        except OSError as exc:
            raise ConfigError(f"cannot serve the dashboard on {host}:{port}: {exc.strerror or exc}") from None
        self.host, self.port = host, int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="dashboard-http", daemon=True)
        self._thread.start()
        return self.port


async def run_dashboard(
    swarm: list[str],
    swarm_id: str,
    host: str = "127.0.0.1",
    port: int = 0,
    timeout_s: float = 2.0,
    ready: Callable[[str], None] = print,
    stop: asyncio.Event | None = None,
    period_s: float = 1.0,
) -> None:
    """Serve the swarm map until `stop` is set (None: until SIGINT or SIGTERM).

    Binds host:port first (a taken port fails at once), calls ready(url), then connects to the swarm
    and surveys it every period_s; a page asked for meanwhile is served once the first survey is done.

    :raises ConfigError: the port cannot be bound; SwarmdError: bad swarm addresses, an unreachable DHT
    """
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    watcher = SwarmWatcher(swarm, swarm_id, timeout_s, period_s)
    server = DashboardServer(watcher.view_bytes, watcher.first.wait)
    server.start(host, port)
    try:
        ready(server.url)
        await watcher.start()
        await watcher.run(stop)
    finally:
        watcher.first.set()  # the DHT did not start: a waiting page gets the view as it is
        await asyncio.to_thread(server.stop)
        await watcher.close()
