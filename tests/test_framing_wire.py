"""The copy-free wire path of swarmd.transport.framing: wire_messages, parse_message, cached frames, hashing off-loop.

The bytes on the wire must stay exactly what protobuf writes and reads (old and new peers interoperate), and
read_payload must keep every check whatever kind of message (pb.Payload or ChunkView) it is handed.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading

import pytest
from google.protobuf.message import DecodeError

from swarmd.errors import ValidationError
from swarmd.transport import framing
from swarmd.transport.framing import ChunkView, Encoded, parse_message, read_payload, to_messages, wire_messages
from swarmd.v1 import swarm_pb2 as pb


def encoded(n: int, seed: int = 0) -> Encoded:
    data = hashlib.shake_256(seed.to_bytes(4, "little")).digest(n)
    return Encoded(pb.PayloadHeader(swarm_id="s", payload_bytes=n, peer_id="p"), data)


async def agen(msgs):
    for m in msgs:
        yield m


def read(msgs, **kw) -> Encoded:
    return asyncio.run(read_payload(agen(msgs), **kw))


@pytest.mark.parametrize("n, chunk", [(0, 7), (1, 1), (127, 64), (128, 128), (300, 100), (20_000, 16_384)])
def test_wire_messages_are_exactly_what_protobuf_writes(n, chunk):
    enc = encoded(n)
    assert list(wire_messages(enc, chunk)) == [m.SerializeToString() for m in to_messages(enc, chunk)]


def test_parse_message_matches_protobuf_and_copies_no_chunk():
    enc = encoded(70_000)
    for raw in wire_messages(enc, 30_000):
        got, want = parse_message(raw), pb.Payload.FromString(raw)
        assert got.WhichOneof("part") == want.WhichOneof("part")
        if isinstance(got, ChunkView):
            assert isinstance(got.chunk, memoryview) and got.chunk.obj is raw and bytes(got.chunk) == want.chunk
        else:
            assert got == want


def test_parse_message_leaves_anything_but_one_whole_chunk_to_protobuf():
    one = pb.Payload(chunk=b"abc").SerializeToString()
    two_fields = one + pb.Payload(chunk=b"xy").SerializeToString()  # protobuf: the last one wins
    assert parse_message(two_fields) == pb.Payload(chunk=b"xy")
    for truncated in (b"\x12\x05ab", b"\x12", b"\x12\xff\xff\xff\xff\xff\xff\xff"):
        with pytest.raises(DecodeError):
            parse_message(truncated)
    overlong_varint = b"\x12\x83\x80\x00abc"  # a non-minimal length of 3: protobuf accepts it, so do we
    assert bytes(parse_message(overlong_varint).chunk) == b"abc"
    assert parse_message(b"") == pb.Payload()


def test_frames_are_cached_per_payload_and_chunk_size():
    enc = encoded(5000)
    first = list(wire_messages(enc, 1024))
    again = list(wire_messages(enc, 1024))
    assert again == first and all(a is b for a, b in zip(first[1:-1], again[1:-1]))  # no new copies
    assert list(wire_messages(enc, 512)) == [m.SerializeToString() for m in to_messages(enc, 512)]
    enc.payload = b"\x00" * 5000  # a changed payload is framed again, never sent stale
    enc._sha256 = ""
    assert list(wire_messages(enc, 512)) == [m.SerializeToString() for m in to_messages(enc, 512)]
    partial = encoded(5000, seed=1)
    next(iter(wire_messages(partial, 1024)))  # a send cut short caches nothing
    assert partial._frames is None


@pytest.mark.parametrize("offload", [False, True])
def test_read_payload_of_parsed_wire_messages(offload, monkeypatch):
    monkeypatch.setattr(framing, "HASH_OFFLOAD_BYTES", 1 if offload else 1 << 40)
    enc = encoded(50_000)
    msgs = [parse_message(m) for m in wire_messages(enc, 4096)]
    got = read(msgs, max_chunk_bytes=4096)
    assert isinstance(got.payload, bytes) and got.payload == enc.payload and got.sha256() == enc.sha256()
    tampered = [*msgs[:3], ChunkView(memoryview(b"\x00" * len(msgs[3].chunk))), *msgs[4:]]
    with pytest.raises(ValidationError, match="sha256"):
        read(tampered, max_chunk_bytes=4096)
    with pytest.raises(ValidationError, match="chunk of"):
        read(msgs, max_chunk_bytes=4095)
    with pytest.raises(ValidationError, match="exceed the declared"):
        read(msgs[:-1] + msgs[1:2] + msgs[-1:], max_chunk_bytes=4096)


def test_the_hash_thread_started_up_front_is_the_one_a_large_payload_uses(monkeypatch):
    monkeypatch.setattr(framing, "_HASHER", None)  # as in a fresh daemon process
    hashers = lambda: sum(t.name.startswith("swarmd-sha256") for t in threading.enumerate())
    before = hashers()  # the hashing threads only: other tests' threads may come and go meanwhile
    framing.start_hash_thread()
    assert hashers() == before + 1
    monkeypatch.setattr(framing, "HASH_OFFLOAD_BYTES", 1)
    enc = encoded(50_000)
    try:
        assert read([parse_message(m) for m in wire_messages(enc, 4096)], max_chunk_bytes=4096).payload == enc.payload
        assert hashers() == before + 1
    finally:
        framing._hash_thread().shutdown(wait=True)


def test_encoded_repr_leaves_the_payload_out():
    enc = Encoded(pb.PayloadHeader(payload_bytes=1 << 20), os.urandom(1 << 20))
    assert len(repr(enc)) < 1000
