"""`blocktrain health ADDRESS` (the Docker HEALTHCHECK): exit 0 on SERVING, 1 otherwise, 2 for a bad address."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from typer.testing import CliRunner

from cli.main import app
from swarmd.transport import start_server
from swarmd.transport.server import SERVICE_NAME

runner = CliRunner()


@contextlib.contextmanager
def serving_in_thread(start):
    """Run `await start()` (returns (address, stop coroutine fn)) on a loop in a thread; yield the address."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    address, stop = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield address
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_health_of_a_serving_daemon_server_is_exit_0():
    async def start():
        server = await start_server(object(), "127.0.0.1", 0)  # health never calls the handler
        return server.address, lambda: server.stop(0)

    with serving_in_thread(start) as address:
        result = runner.invoke(app, ["health", address])
    assert result.exit_code == 0 and result.output.strip() == "SERVING", result.output


def test_health_not_serving_or_unknown_is_exit_1():
    async def start():
        server = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        return f"127.0.0.1:{port}", lambda: server.stop(0)

    with serving_in_thread(start) as address:
        result = runner.invoke(app, ["health", address])
    assert result.exit_code == 1 and result.output == f"error: {address} is NOT_SERVING\n", result.output


def test_health_of_nothing_is_exit_1_fast_and_of_a_multiaddr_exit_2():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    start = time.monotonic()
    closed = runner.invoke(app, ["health", address])
    assert time.monotonic() - start < 3.0
    assert closed.exit_code == 1 and "connection refused" in closed.output and closed.output.count("\n") == 1
    multiaddr = runner.invoke(app, ["health", "/ip4/127.0.0.1/tcp/5/p2p/QmX"])
    assert multiaddr.exit_code == 2 and "not a multiaddr" in multiaddr.output
