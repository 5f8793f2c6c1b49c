"""Property-based fuzzing (hypothesis) of every decoder of bytes from the network.

Each decoder gets arbitrary or mutated input and must either return a well-formed value or raise the
project's error (swarmd.errors.SwarmdError subclasses: ValidationError and friends; a DHT record parser
returns None) — never another exception type, never an allocation beyond its declared limit. Targets:
the payload header and chunk stream (framing.read_payload), payload decoding (delta.decode: codecs, zstd),
raw tensors (wire.bytes_to_tensor / from_proto / zstd_decompress), undecodable protobuf requests
(transport.decoding's lenient parser), DHT records (discovery.PeerRecord.from_value) and Forward request
validation (serving.BlockServing). The default suite runs ~150 examples per property (derandomized: the
same examples every run, a few seconds in all); `-m slow` runs 2,000 each.
"""

from __future__ import annotations

import asyncio
import hashlib
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmd.averaging.delta import decode, encode
from swarmd.errors import SwarmdError
from swarmd.membership.records import PeerRecord
from swarmd.protocol import Codec, PayloadKind
from swarmd.serve.serving import BlockServing
from swarmd.transport.decoding import Undecodable, lenient
from swarmd.transport.framing import Encoded, read_payload
from swarmd.v1 import swarm_pb2 as pb
from swarmd.wire import DTYPES, bytes_to_tensor, from_proto, zstd_compress, zstd_decompress
from tests.test_inference import CFG, tiny_model

FAST, SLOW = 150, 2000
EXAMPLES = [pytest.param(FAST, id="fast"), pytest.param(SLOW, id="slow", marks=pytest.mark.slow)]
META = dict(swarm_id="s", config_hash="c", kind="block_delta", block_index=0)
SHAPES = {"w": (6, 5), "b": (5,)}
LIMIT = 1 << 16  # every decoder below runs with this byte limit


_LOOP: list[asyncio.AbstractEventLoop] = []


@pytest.fixture(scope="module", autouse=True)
def _one_loop():
    """One event loop for the whole module (asyncio.run per example costs more than the decoders)."""
    _LOOP.append(asyncio.new_event_loop())
    yield
    _LOOP.pop().close()


def arun(coro):
    return _LOOP[0].run_until_complete(coro)


def run(examples: int, strategy, check) -> None:
    """Run `check` on `examples` draws of `strategy` (derandomized in the default suite)."""
    settings(
        max_examples=examples,
        deadline=None,
        derandomize=examples == FAST,
        suppress_health_check=list(HealthCheck),
        database=None,
    )(given(strategy)(check))()


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}


# -- framing: header + chunks + end ------------------------------------------------------------------------------
headers = st.builds(
    pb.PayloadHeader,
    payload_bytes=st.integers(0, 1 << 40),
    raw_bytes=st.integers(0, 1 << 40),
    kind=st.integers(0, 6),
    codec=st.integers(0, 6),
    zstd=st.booleans(),
    round=st.integers(0, 1 << 40),
    peer_id=st.text(max_size=8),
)
messages = st.one_of(
    headers.map(lambda h: pb.Payload(header=h)),
    st.binary(max_size=300).map(lambda b: pb.Payload(chunk=b)),
    st.one_of(st.text(max_size=64), st.binary(max_size=32).map(lambda b: hashlib.sha256(b).hexdigest())).map(
        lambda s: pb.Payload(end=pb.PayloadEnd(sha256=s))
    ),
    st.text(max_size=20).map(lambda s: pb.Payload(reject=s)),
    st.just(pb.Payload()),
)


async def _stream(msgs):
    for m in msgs:
        yield m


@pytest.mark.parametrize("examples", EXAMPLES)
def test_read_payload_on_arbitrary_message_streams(examples):
    def check(msgs):
        try:
            enc = arun(read_payload(_stream(msgs), max_payload_bytes=LIMIT, max_chunk_bytes=256))
        except SwarmdError:
            return
        assert len(enc.payload) == enc.header.payload_bytes <= LIMIT
        assert enc.sha256() == hashlib.sha256(enc.payload).hexdigest()

    run(examples, st.lists(messages, max_size=8), check)


@pytest.mark.parametrize("examples", EXAMPLES)
def test_read_payload_of_a_valid_payload_cut_and_spliced(examples):
    good = encode(_tensors(), "int8", **META)
    from swarmd.transport.framing import to_messages

    base = list(to_messages(good, max_chunk_bytes=64))

    def check(args):
        cut, insert, extra = args
        msgs = base[:cut] + extra + base[cut + insert :]
        try:
            enc = arun(read_payload(_stream(msgs), max_payload_bytes=LIMIT, max_chunk_bytes=64, limit=lambda h: 4096))
        except SwarmdError:
            return
        assert len(enc.payload) == enc.header.payload_bytes <= 4096

    run(examples, st.tuples(st.integers(0, len(base)), st.integers(0, 3), st.lists(messages, max_size=3)), check)


@pytest.mark.parametrize("examples", EXAMPLES)
def test_undecodable_protobuf_never_raises_in_the_server_parser(examples):
    parsers = [lenient(cls) for cls in (pb.Payload, pb.ForwardRequest, pb.PullStateRequest, pb.StatusRequest)]

    def check(data):
        for parse in parsers:
            out = parse(data)
            if isinstance(out, Undecodable):
                assert out.exception().status == "INVALID_ARGUMENT"

    run(examples, st.binary(max_size=200), check)


# -- payload decoding (codecs, zstd, schema) ---------------------------------------------------------------------
def _mutated_payload():
    """A valid encoded payload, then random changes to its header fields and bytes."""
    specs = st.lists(
        st.builds(
            pb.TensorSpec,
            name=st.sampled_from(["w", "b", "x", ""]),
            dtype=st.sampled_from([*DTYPES, "float64", ""]),
            shape=st.lists(st.integers(-3, 1 << 31), max_size=4),
            nbytes=st.integers(0, 1 << 40),
        ),
        max_size=3,
    )
    return st.fixed_dictionaries(
        {
            "codec": st.sampled_from(list(Codec)),
            "zstd": st.booleans(),
            "seed": st.integers(0, 3),
            "scale": st.sampled_from([1.0, 1e30, 1e38, -1e38]),
            "header": st.dictionaries(
                st.sampled_from(["kind", "codec", "raw_bytes", "payload_bytes", "zstd", "weight", "block_index"]),
                st.one_of(st.integers(-2, 1 << 34), st.floats(allow_nan=True), st.booleans()),
                max_size=3,
            ),
            "specs": st.one_of(st.none(), specs),
            "flip": st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4),
            "truncate": st.one_of(st.none(), st.integers(0, 1 << 16)),
            "replace": st.one_of(st.none(), st.binary(max_size=400)),
            "bomb": st.booleans(),
        }
    )


def _apply(m) -> Encoded | None:
    tensors = {k: v * m["scale"] for k, v in _tensors(m["seed"]).items()}
    try:
        enc = encode(tensors, m["codec"], zstd=m["zstd"], **META)
    except SwarmdError:  # the sender refuses to encode non-finite values (fp16 clamps, int8 scales stay finite)
        return None
    h = pb.PayloadHeader()
    h.CopyFrom(enc.header)
    for key, value in m["header"].items():
        try:
            setattr(h, key, value)
        except (TypeError, ValueError):
            pass
    if m["specs"] is not None:
        del h.tensors[:]
        h.tensors.extend(m["specs"])
    payload = bytearray(enc.payload if m["replace"] is None else m["replace"])
    if m["bomb"]:
        payload = bytearray(zstd_compress(bytes(1 << 20)))  # 1 MiB of zeros in a few dozen bytes
    for pos, byte in m["flip"]:
        if payload:
            payload[pos % len(payload)] = byte
    if m["truncate"] is not None:
        payload = payload[: m["truncate"]]
    return Encoded(h, bytes(payload))


@pytest.mark.parametrize("examples", EXAMPLES)
def test_decode_of_mutated_payloads_raises_validation_errors_only(examples):
    def check(m):
        enc = _apply(m)
        if enc is None:
            return
        try:
            out = decode(enc, SHAPES, **{**META, "kind": PayloadKind.BLOCK_DELTA}, max_bytes=LIMIT)
        except SwarmdError as exc:
            assert exc.status == "INVALID_ARGUMENT"
            return
        assert {k: tuple(v.shape) for k, v in out.items()} == SHAPES
        assert all(bool(torch.isfinite(v).all()) for v in out.values())

    run(examples, _mutated_payload(), check)


# -- raw tensors -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("examples", EXAMPLES)
def test_raw_tensor_decoders_raise_validation_errors_only(examples):
    tensors = st.builds(
        pb.Tensor,
        dtype=st.sampled_from([*DTYPES, "float64", "complex", ""]),
        shape=st.lists(st.integers(-2, 1 << 40), max_size=4),
        data=st.binary(max_size=256),
        zstd=st.booleans(),
    )

    def check(msg):
        for call in (
            lambda: from_proto(msg, max_bytes=LIMIT),
            lambda: bytes_to_tensor(msg.data, msg.dtype, list(msg.shape), max_bytes=LIMIT),
            lambda: zstd_decompress(msg.data, LIMIT),
        ):
            try:
                out = call()
            except SwarmdError as exc:
                assert exc.status == "INVALID_ARGUMENT"
                continue
            assert len(out if isinstance(out, bytes) else out.untyped_storage()) <= LIMIT

    run(examples, tensors, check)


# -- DHT records -------------------------------------------------------------------------------------------------
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12), st.binary(max_size=8))
record_fields = ["peer_id", "address", "block_index", "round", "samples_per_s", "config_hash", "base_hash"]
record_fields += ["client_mode", "swarm_id", "emb_hash", "tls_fingerprint", "pinned", "expires", "signature", "extra"]


@pytest.mark.parametrize("examples", EXAMPLES)
def test_peer_record_parser_returns_a_record_or_none(examples):
    valid = PeerRecord("p", "h:1", 0, 3, 1.5, "c", "b", False, "s").to_value()
    values = st.one_of(
        json_leaf,
        st.lists(json_leaf, max_size=3),
        st.dictionaries(st.sampled_from(record_fields), json_leaf, max_size=14),
        st.dictionaries(st.sampled_from(record_fields), json_leaf, max_size=4).map(lambda d: {**valid, **d}),
        st.tuples(st.sampled_from(record_fields), json_leaf).map(lambda kv: {**valid, kv[0]: kv[1]}),
        st.sampled_from([math.nan, math.inf, -1.0, 10**400, "1e999"]).map(lambda x: {**valid, "samples_per_s": x}),
    )

    def check(value):
        rec = PeerRecord.from_value(value)
        if rec is None:
            return
        assert isinstance(rec.block_index, int) and isinstance(rec.round, int)
        assert isinstance(rec.peer_id, str) and isinstance(rec.client_mode, bool)
        assert math.isfinite(rec.samples_per_s) and rec.samples_per_s >= 0

    run(examples, values, check)


# -- Forward request validation ----------------------------------------------------------------------------------
_SERVING: list[BlockServing] = []


def _serving() -> BlockServing:
    if not _SERVING:
        blocks, emb = tiny_model()
        s = BlockServing(CFG, 0, max_cache_bytes=1 << 20)
        s.update_weights(blocks[0].state_dict(), emb.table)
        _SERVING.append(s)
    return _SERVING[0]


def _forward_requests():
    floats = st.one_of(st.floats(), st.sampled_from([CFG.sigma_lo, CFG.sigma_hi, 0.0, 1e30]))
    return st.fixed_dictionaries(
        {
            "sigma": floats,
            "sigma_next": floats,
            "final": st.booleans(),
            "step_index": st.integers(-1, 1 << 20),
            "start_position": st.integers(-1, 300),
            "use_cache": st.booleans(),
            "session_id": st.text(max_size=140),
            "n": st.integers(0, 3),
            "t": st.integers(0, CFG.seq_len + 2),
            "shape": st.one_of(st.none(), st.lists(st.integers(-1, 1 << 33), max_size=4)),
            "z_value": st.one_of(st.floats(width=32), st.just(0.5)),
            "context_dtype": st.sampled_from(["uint8", "int64", "float32"]),
            "zstd": st.booleans(),
            "message": st.booleans(),
        }
    )


def _build(f) -> pb.ForwardRequest:
    n, t = f["n"], f["t"]
    req = pb.ForwardRequest(
        block_index=0,
        config_hash=CFG.config_hash(),
        **{k: f[k] for k in ("sigma", "sigma_next", "final", "step_index", "start_position", "use_cache")},
        session_id=f["session_id"],
    )
    ctx = torch.zeros(n, t, dtype=DTYPES[f["context_dtype"]])
    z = torch.full((n, t, CFG.d_model), f["z_value"])
    req.context.CopyFrom(pb.Tensor(dtype=f["context_dtype"], shape=list(ctx.shape), data=ctx.numpy().tobytes()))
    raw = z.numpy().tobytes()
    req.z.CopyFrom(pb.Tensor(dtype="float32", shape=f["shape"] or list(z.shape), data=raw, zstd=False))
    if f["zstd"]:
        req.z.data, req.z.zstd = zstd_compress(raw), True
    if f["message"]:
        req.message.CopyFrom(pb.Tensor(dtype="float32", shape=[n, t, max(CFG.message_dim, 1)], data=b"\0" * 8))
    return req


@pytest.mark.parametrize("examples", EXAMPLES)
def test_forward_validation_raises_the_project_errors_only(examples):
    s = _serving()

    def check(f):
        req = _build(f)
        try:
            s._check_header(req)
            s._check_tensors(req)
        except SwarmdError as exc:
            assert exc.status in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND")
            return
        assert 0 < req.sigma < math.inf and req.start_position + f["t"] <= CFG.seq_len

    run(examples, _forward_requests(), check)


@pytest.mark.parametrize(
    "examples", [pytest.param(25, id="fast"), pytest.param(400, id="slow", marks=pytest.mark.slow)]
)
def test_forward_end_to_end_never_answers_non_finite_values(examples):
    s = _serving()

    def check(f):
        req = _build({**f, "n": max(f["n"], 1), "t": max(min(f["t"], 8), 1), "shape": None, "start_position": 0})
        try:
            reply = arun(s.forward(req))
        except SwarmdError as exc:
            assert exc.status in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND")
            return
        out = from_proto(reply.logits if req.final else reply.z, max_bytes=1 << 24)
        assert bool(torch.isfinite(out).all())
        assert s.cache_bytes <= s.max_cache_bytes

    run(examples, _forward_requests(), check)
