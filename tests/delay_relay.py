"""A TCP relay that delays every forwarded chunk: user-space link latency where the kernel has no tc netem.

    python tests/delay_relay.py --listen HOST:PORT --to HOST:PORT --delay-ms 50

Accepts connections on --listen and forwards each to --to, both directions. Every chunk read from
one side is written to the other side delay-ms after it was read (a timestamped queue per
direction: latency without a throughput cap, order kept, a half-close forwarded as one more
delayed chunk). Prints `relay: ready` on stdout once listening; runs until SIGTERM / SIGINT.
Placed in front of a server, every connection to it sees a link with that one-way delay in each
direction (round trip 2 x delay). Standard library only, so it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

CHUNK = 64 << 10


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy reader to writer, each chunk delivered delay_s after it was read; EOF becomes a half-close."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def feed() -> None:
        try:
            while data := await reader.read(CHUNK):
                queue.put_nowait((loop.time() + delay_s, data))
        except (ConnectionError, OSError):
            pass
        queue.put_nowait((loop.time() + delay_s, b""))

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)  # the emulated latency itself
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    feeder = asyncio.create_task(feed())
    try:
        await deliver()
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder


async def _serve(to: tuple[str, int], delay_s: float, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
    try:
        up_reader, up_writer = await asyncio.open_connection(*to)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_pipe(reader, up_writer, delay_s), _pipe(up_reader, writer, delay_s))
    except (ConnectionError, OSError):
        pass
    finally:
        for w in (writer, up_writer):
            w.close()


async def start_relay(listen: tuple[str, int], to: tuple[str, int], delay_s: float) -> asyncio.Server:
    """A listening relay (port 0: any free one; see server.sockets)."""
    return await asyncio.start_server(lambda r, w: _serve(to, delay_s, r, w), *listen, reuse_address=True, limit=CHUNK)


async def relay(listen: tuple[str, int], to: tuple[str, int], delay_s: float) -> None:
    """Serve until SIGTERM / SIGINT."""
    server = await start_relay(listen, to, delay_s)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("relay: ready", flush=True)
    await stop.wait()
    server.close()  # open connections are cancelled with the loop's other tasks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen", type=host_port, required=True, help="HOST:PORT to accept connections on")
    p.add_argument("--to", type=host_port, required=True, help="HOST:PORT every connection is forwarded to")
    p.add_argument("--delay-ms", type=float, default=50.0, help="one-way delay of every chunk, milliseconds")
    args = p.parse_args(argv)
    if args.delay_ms < 0:
        p.error("--delay-ms must be >= 0")
    try:
        asyncio.run(relay(args.listen, args.to, args.delay_ms / 1000))
    except OSError as exc:
        print(f"error: cannot listen on {args.listen[0]}:{args.listen[1]}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
