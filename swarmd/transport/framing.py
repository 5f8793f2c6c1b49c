"""Payload framing on the wire: one encoded payload as a stream of swarmd.v1.Payload messages.

Owns Encoded (a payload header plus the bytes it describes), to_messages (header, chunks of at
most max_chunk_bytes, end marker carrying the sha256 of the payload) and read_payload (the
receiving side: every framing check, before anything is buffered past the declared size).
The gRPC side moves the same messages without protobuf copies of the chunk bytes: wire_messages
yields them serialized (a chunk message is its 1-byte tag, a varint length and the bytes, framed
with one copy the first time and kept for the next send of the same payload), serialize_message is
the stream's serializer (bytes pass through), and parse_message its deserializer (a message that is
exactly one chunk field becomes a ChunkView, a memoryview into the received bytes; anything else
goes to the protobuf parser); read_payload keeps those views, hashes them on a helper thread as they
arrive (sha256 releases the GIL: the hash runs beside the event loop) and joins them once at the end.
The messages on the wire are byte for byte what protobuf writes, so peers of either kind interoperate.
What the bytes mean (codecs, tensors, validation against a model) is swarmd.averaging.delta's job.
Pure: protobuf and hashlib only; no torch, no grpc.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from swarmd.errors import PeerRejected, ValidationError
from swarmd.v1 import swarm_pb2 as pb

MAX_CHUNK_BYTES = 1 << 20  # default chunk size on the wire; well below gRPC's 4 MiB default limit
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 30  # refuse payloads (and decoded blobs) larger than this

HASH_OFFLOAD_BYTES = 1 << 20  # payloads at least this large are hashed on a helper thread as their chunks arrive
_CHUNK_TAG = 0x12  # Payload.chunk: field 2, wire type 2 (length-delimited)

# the largest payload admitted for a header (0: refuse): the receiver's exact size for that kind and config
PayloadLimit = Callable[[pb.PayloadHeader], int]


@dataclass
class Encoded:
    """One encoded payload: the header (schema, sizes) and the payload bytes it describes."""

    header: pb.PayloadHeader
    payload: bytes = field(repr=False)  # (a task's repr of its result must not print megabytes)
    _sha256: str = field(default="", init=False, repr=False, compare=False)
    # (chunk size, the payload framed, its chunk messages) once wire_messages sent it whole: later sends copy nothing
    _frames: tuple[int, bytes, list[bytes]] | None = field(default=None, init=False, repr=False, compare=False)
    # a payload received in a call: the local monotonic time after which an answer would reach its sender too late
    # (its call's deadline less the time the answer takes on the wire); None: no deadline known (never on the wire)
    answer_by: float | None = field(default=None, repr=False, compare=False)

    @property
    def raw_bytes(self) -> int:
        """fp32 size of all tensors (what an uncompressed fp32 exchange would move)."""
        return int(self.header.raw_bytes)

    @property
    def wire_bytes(self) -> int:
        """Bytes this payload costs on the wire: payload plus serialized header."""
        return len(self.payload) + self.header.ByteSize()

    def sha256(self) -> str:
        if not self._sha256:
            self._sha256 = hashlib.sha256(self.payload).hexdigest()
        return self._sha256


_HASHER: ThreadPoolExecutor | None = None


def _hash_thread() -> ThreadPoolExecutor:
    """The one thread that hashes received chunks (one worker: a payload's chunks are hashed in order)."""
    global _HASHER
    if _HASHER is None:
        _HASHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swarmd-sha256")
    return _HASHER


def start_hash_thread() -> None:
    """Start the hashing thread now, not at the first large payload: a daemon starts its long-lived threads at its
    start, so that a thread count that grows over hours is a leak."""
    _hash_thread().submit(int).result()


def _chunk_prefix(n: int) -> bytes:
    """Tag and varint length of a Payload whose only field is a chunk of n bytes (protobuf's own encoding)."""
    out = bytearray((_CHUNK_TAG,))
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | 0x80 if n else low)
        if not n:
            return bytes(out)


class ChunkView:
    """A chunk message parsed without copying: `.chunk` is a memoryview into the received message bytes."""

    __slots__ = ("chunk",)

    def __init__(self, chunk: memoryview):
        self.chunk = chunk

    def WhichOneof(self, oneof: str) -> str:
        return "chunk"


def serialize_message(msg: pb.Payload | bytes) -> bytes:
    """gRPC serializer of a Payload stream: bytes from wire_messages pass through, messages are serialized."""
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


def parse_message(data: bytes) -> pb.Payload | ChunkView:
    """gRPC deserializer of a Payload stream: a message that is exactly one chunk field (what every sender
    writes) becomes a ChunkView without a copy; anything else is parsed by protobuf (which raises on garbage)."""
    n = len(data)
    if n > 1 and data[0] == _CHUNK_TAG:
        size, shift, pos = 0, 0, 1
        while pos < n and pos <= 5:  # a length below 2**35: more than any message grpc admits
            byte = data[pos]
            size |= (byte & 0x7F) << shift
            pos += 1
            if not byte & 0x80:
                if pos + size == n:
                    return ChunkView(memoryview(data)[pos:])
                break
            shift += 7
    return pb.Payload.FromString(data)


def wire_messages(enc: Encoded, max_chunk_bytes: int = MAX_CHUNK_BYTES) -> Iterator[bytes]:
    """to_messages, serialized: header, chunks, end. Each chunk is framed with one copy of its bytes the first
    time `enc` is sent whole; the frames are kept on `enc` (about its payload size again), so the same payload
    sent to or served to more peers (a round's delta) is not copied again."""
    if max_chunk_bytes < 1:
        raise ValueError(f"max_chunk_bytes must be >= 1, got {max_chunk_bytes}")
    yield pb.Payload(header=enc.header).SerializeToString()
    if enc._frames is not None and enc._frames[0] == max_chunk_bytes and enc._frames[1] is enc.payload:
        yield from enc._frames[2]
    else:
        payload = enc.payload
        frames, view = [], memoryview(payload)
        for start in range(0, len(view), max_chunk_bytes):
            piece = view[start : start + max_chunk_bytes]
            frames.append(b"".join((_chunk_prefix(len(piece)), piece)))
            yield frames[-1]
        enc._frames = (max_chunk_bytes, payload, frames)
    yield pb.Payload(end=pb.PayloadEnd(sha256=enc.sha256())).SerializeToString()


def to_messages(enc: Encoded, max_chunk_bytes: int = MAX_CHUNK_BYTES) -> Iterator[pb.Payload]:
    """Stream messages of one payload: header, chunks of at most max_chunk_bytes, end (sha256)."""
    if max_chunk_bytes < 1:
        raise ValueError(f"max_chunk_bytes must be >= 1, got {max_chunk_bytes}")
    yield pb.Payload(header=enc.header)
    view = memoryview(enc.payload)
    for start in range(0, len(view), max_chunk_bytes):
        yield pb.Payload(chunk=bytes(view[start : start + max_chunk_bytes]))
    yield pb.Payload(end=pb.PayloadEnd(sha256=enc.sha256()))


async def read_payload(
    messages: AsyncIterator[Any],  # pb.Payload or ChunkView (parse_message)
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    limit: PayloadLimit | None = None,
) -> Encoded:
    """Read one payload (header, chunks, end) from a message stream and check its framing.

    Stops right after the end message, so the stream can carry more afterwards. Checks: header
    first, declared size within max_payload_bytes and within limit(header) when a limit is given
    (the size this kind of payload can have under the receiver's config; both before anything is
    buffered), each chunk at most max_chunk_bytes, chunks adding up to exactly payload_bytes,
    sha256 of the bytes.
    :raises PeerRejected: the peer sent a reject; ValidationError: any framing violation
    """
    it = aiter(messages)
    first = await anext(it, None)
    if first is None:
        raise ValidationError("payload stream ended before its header")
    part = first.WhichOneof("part")
    if part == "reject":
        raise PeerRejected(f"peer rejected the exchange: {first.reject}")
    if part != "header":
        raise ValidationError(f"payload stream must start with a header, got {part or 'an empty message'}")
    header = first.header
    size = header.payload_bytes
    if size > max_payload_bytes:
        raise ValidationError(f"payload of {size} bytes exceeds the limit of {max_payload_bytes}")
    if limit is not None and size > (admitted := limit(header)):
        raise ValidationError(f"payload of {size} bytes exceeds the {admitted} bytes this kind of payload can have")
    chunks: list[bytes | memoryview] = []  # memoryviews into the received messages: joined once at the end
    got, hasher = 0, hashlib.sha256()
    offload = size >= HASH_OFFLOAD_BYTES
    hashed: asyncio.Future | None = None  # the last chunk hash handed to the hashing thread (FIFO: all before it ran)
    async for msg in it:
        part = msg.WhichOneof("part")
        if part == "chunk":
            chunk = msg.chunk  # a pb.Payload copies the bytes out on each access: once only
            n = len(chunk)
            if n > max_chunk_bytes:
                raise ValidationError(f"chunk of {n} bytes exceeds the limit of {max_chunk_bytes}")
            if got + n > size:
                raise ValidationError(f"chunks exceed the declared payload size of {size} bytes")
            if offload:  # sha256 releases the GIL: it runs beside the event loop (and grpc's reads)
                hashed = asyncio.get_running_loop().run_in_executor(_hash_thread(), hasher.update, chunk)
            else:
                hasher.update(chunk)
            chunks.append(chunk)
            got += n
        elif part == "end":
            if got != size:
                raise ValidationError(f"payload ended after {got} of {size} declared bytes")
            if hashed is not None:
                await hashed
            if hasher.hexdigest() != msg.end.sha256:
                raise ValidationError("payload sha256 does not match its end marker")
            enc = Encoded(header, b"".join(chunks))  # one bytes chunk is returned as is
            enc._sha256 = msg.end.sha256
            return enc
        elif part == "reject":
            raise PeerRejected(f"peer rejected the exchange: {msg.reject}")
        else:
            raise ValidationError(f"unexpected {part or 'empty message'} inside a payload")
    raise ValidationError(f"payload stream ended after {got} of {size} bytes without an end marker")
