"""HttpEndpoint: what a small HTTP server on its own daemon thread shares (the dashboard, Prometheus metrics).

Owns the bound host and port, the URL built from them (IPv6 hosts in brackets), and an idempotent
stop() that shuts the server down and joins its thread. Subclasses start their own server kind
and set _server, _thread, host and port. Standard library only.
"""

from __future__ import annotations

import threading
from typing import Any

from swarmd.membership.addresses import join_host_port


class HttpEndpoint:
    path = "/"  # the path url() points at

    def __init__(self) -> None:
        self._server: Any = None  # a socketserver-style server with shutdown() and server_close()
        self._thread: threading.Thread | None = None
        self.host, self.port = "", 0

    @property
    def url(self) -> str:
        """http://HOST:PORT/PATH ("" when not serving)."""
        return f"http://{join_host_port(self.host, self.port)}{self.path}" if self._server is not None else ""

    def stop(self) -> None:
        """Stop serving and join the server thread (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
        self._server = self._thread = None
