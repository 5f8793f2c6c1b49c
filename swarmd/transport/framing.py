"""Payload framing on the wire: one encoded payload as a stream of swarmd.v1.Payload messages.

Owns Encoded (a payload header plus the bytes it describes), to_messages (header, chunks of at
most max_chunk_bytes, end marker carrying the sha256 of the payload) and read_payload (the
receiving side: every framing check, before anything is buffered past the declared size).
What the bytes mean (codecs, tensors, validation against a model) is swarmd.swarm.delta's job.
Pure: protobuf and hashlib only; no torch, no grpc.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from swarmd.errors import PeerRejected, ValidationError
from swarmd.v1 import swarm_pb2 as pb

MAX_CHUNK_BYTES = 1 << 20  # default chunk size on the wire; well below gRPC's 4 MiB default limit
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 30  # refuse payloads (and decoded blobs) larger than this

# the largest payload admitted for a header (0: refuse): the receiver's exact size for that kind and config
PayloadLimit = Callable[[pb.PayloadHeader], int]


@dataclass
class Encoded:
    """One encoded payload: the header (schema, sizes) and the payload bytes it describes."""

    header: pb.PayloadHeader
    payload: bytes
    _sha256: str = field(default="", init=False, repr=False, compare=False)

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
    messages: AsyncIterator[pb.Payload],
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
    chunks: list[bytes] = []
    got, hasher = 0, hashlib.sha256()
    async for msg in it:
        part = msg.WhichOneof("part")
        if part == "chunk":
            chunk = msg.chunk  # each access copies the bytes out of the message: once only
            n = len(chunk)
            if n > max_chunk_bytes:
                raise ValidationError(f"chunk of {n} bytes exceeds the limit of {max_chunk_bytes}")
            if got + n > size:
                raise ValidationError(f"chunks exceed the declared payload size of {size} bytes")
            hasher.update(chunk)  # while the chunk is still in cache
            chunks.append(chunk)
            got += n
        elif part == "end":
            if got != size:
                raise ValidationError(f"payload ended after {got} of {size} declared bytes")
            if hasher.hexdigest() != msg.end.sha256:
                raise ValidationError("payload sha256 does not match its end marker")
            enc = Encoded(header, chunks[0] if len(chunks) == 1 else b"".join(chunks))
            enc._sha256 = msg.end.sha256
            return enc
        elif part == "reject":
            raise PeerRejected(f"peer rejected the exchange: {msg.reject}")
        else:
            raise ValidationError(f"unexpected {part or 'empty message'} inside a payload")
    raise ValidationError(f"payload stream ended after {got} of {size} bytes without an end marker")
