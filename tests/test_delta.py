"""Codec round trips and ratios, error feedback, chunking and validation of swarmd.averaging.delta."""

from __future__ import annotations

import asyncio
import hashlib
import math

import pytest
import torch

from swarmd.averaging.delta import INT8_RMS_LEVELS, ErrorFeedback, decode, encode, shapes_of
from swarmd.errors import PeerRejected, ValidationError
from swarmd.protocol import Codec, PayloadKind
from swarmd.transport.framing import read_payload, to_messages
from swarmd.v1 import swarm_pb2 as pb

META = dict(swarm_id="swarm-a", config_hash="abc123", kind="block_delta", block_index=1)


def make_delta(seed: int = 0, scale: float = 1e-3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "layers.0.attn.weight": torch.randn(64, 32, generator=g) * scale,
        "layers.0.norm.weight": torch.randn(32, generator=g) * scale,
        "out.bias": torch.randn(3, 4, 5, generator=g) * scale,
        "scalar": torch.tensor(0.25),
    }


def roundtrip(d, codec, **kw):
    enc = encode(d, codec, **META, **kw)
    return enc, decode(enc, shapes_of(d), **META)


async def agen(msgs):
    for m in msgs:
        yield m


def read(msgs, **kw):
    return asyncio.run(read_payload(agen(msgs), **kw))


# ---- codecs -------------------------------------------------------------------------------


def test_fp32_round_trip_is_exact():
    d = make_delta()
    enc, out = roundtrip(d, "fp32")
    assert list(out) == list(d)
    for name in d:
        assert out[name].dtype == torch.float32 and torch.equal(out[name], d[name])
    assert enc.header.raw_bytes == sum(t.numel() * 4 for t in d.values())
    assert enc.header.zstd and Codec.from_pb(enc.header.codec) == "fp32"


@pytest.mark.parametrize("codec,rel,tiny", [("fp16", 2**-11, 2**-25), ("bf16", 2**-8, 0.0)])
def test_half_codecs_error_bound(codec, rel, tiny):
    """Half an ulp relative error; fp16 subnormals (below 6e-5) have a fixed 2**-24 spacing."""
    d = make_delta(1)
    _, out = roundtrip(d, codec)
    for name in d:
        err = (out[name] - d[name]).abs()
        assert bool((err <= d[name].abs() * rel + tiny).all()), name


def test_fp16_clamps_instead_of_overflowing():
    d = {"w": torch.tensor([1e6, -1e6, 1.0])}
    _, out = roundtrip(d, "fp16")
    assert out["w"].tolist() == [65504.0, -65504.0, 1.0]


@pytest.mark.parametrize("levels", [None, INT8_RMS_LEVELS, 2.0])
def test_int8_error_is_half_a_step_per_row(levels):
    """The step is absmax/127 (levels=None) or max(absmax/127, rms/levels); error <= step/2."""
    d = make_delta(2)
    d["w_zero_row"] = torch.zeros(4, 8)
    d["w_zero_row"][1] = torch.linspace(-1, 1, 8)
    d["empty"] = torch.zeros(0, 8)
    _, out = roundtrip(d, "int8", int8_rms_levels=levels)
    for name, t in d.items():
        if not t.numel():
            assert out[name].shape == t.shape
            continue
        rows = t.reshape(t.shape[0], -1) if t.dim() >= 2 else t.reshape(1, -1)
        got = out[name].reshape(rows.shape)
        step = rows.abs().amax(dim=1, keepdim=True) / 127
        if levels is not None:
            step = torch.maximum(step, rows.pow(2).mean(dim=1, keepdim=True).sqrt() / levels)
        assert bool(((got - rows).abs() <= step / 2 + 1e-9).all()), name
    assert torch.equal(out["w_zero_row"][0], torch.zeros(8))


def test_wire_to_raw_ratios():
    d = {"w": torch.randn(256, 256) * 1e-3, "b": torch.randn(256) * 1e-3}
    ratios = {c: encode(d, c, **META).wire_bytes / encode(d, c, **META).raw_bytes for c in Codec}
    assert ratios["fp32"] <= 1.0
    assert ratios["fp16"] <= 0.5 and ratios["bf16"] <= 0.5
    assert ratios["int8"] <= 0.16  # Gaussian: ~4.4 bits per value after zstd
    absmax = encode(d, "int8", **META, int8_rms_levels=None)
    assert absmax.wire_bytes / absmax.raw_bytes <= 0.27
    plain = encode(d, "int8", **META, zstd=False)
    assert not plain.header.zstd and plain.header.payload_bytes == 4 * 256 + 256 * 256 + 4 + 256


def test_encode_refuses_nan_and_unknown_codec():
    with pytest.raises(ValidationError, match="NaN"):
        encode({"w": torch.tensor([1.0, math.nan])}, "fp32", **META)
    with pytest.raises(ValueError, match="codec"):
        encode({"w": torch.ones(2)}, "fp8", **META)
    with pytest.raises(ValueError, match="kind"):
        encode({"w": torch.ones(2)}, "fp32", **{**META, "kind": "gradients"})


# ---- error feedback -----------------------------------------------------------------------


def test_error_feedback_tracks_the_true_sum():
    """Small entries below half an int8 step are lost by plain quantisation but not with EF."""
    steps, ef = 60, ErrorFeedback()
    true_sum = torch.zeros(16, 64)
    ef_sum, plain_sum = torch.zeros(16, 64), torch.zeros(16, 64)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        delta = torch.full((16, 64), 1e-3) + torch.randn(16, 64, generator=g) * 1e-4
        delta[:, 0] = 1.0  # one int8 step is max(1/127, rms/4) ~ 0.03, so 1e-3 rounds to 0
        true_sum += delta
        enc, sent = ef.compress({"w": delta}, "int8", **META)
        assert torch.equal(sent["w"], decode(enc, {"w": (16, 64)}, **META)["w"])
        ef_sum += sent["w"]
        plain_sum += roundtrip({"w": delta}, "int8")[1]["w"]
    ef_err = (ef_sum - true_sum).abs().max().item()
    plain_err = (plain_sum - true_sum).abs().max().item()
    assert torch.allclose(ef_sum + ef.residual["w"], true_sum, atol=1e-5)  # nothing is lost
    step = max(1 / 127, math.sqrt((1 + 63 * 1.1e-3**2) / 64) / INT8_RMS_LEVELS)
    assert ef_err <= step / 2 + 1e-5  # at most half a step behind, whatever the step count
    assert plain_err >= 0.9 * steps * 1e-3  # plain quantisation loses every small entry: linear drift
    assert plain_err > 3 * ef_err


def test_error_feedback_fp32_has_no_residual():
    ef = ErrorFeedback()
    d = make_delta(3)
    _enc, sent = ef.compress(d, "fp32", **META)
    assert all(torch.equal(sent[k], d[k]) for k in d)
    assert all(not r.any() for r in ef.residual.values())


def test_fp32_codec_merge_equals_in_memory_average():
    """Deltas that went through encode -> chunks -> read_payload -> decode average bit-identically."""
    deltas = [make_delta(seed) for seed in range(4)]
    received = []
    for d in deltas:
        enc = read(to_messages(encode(d, "fp32", **META), max_chunk_bytes=777))
        received.append(decode(enc, shapes_of(d), **META))
    for name in deltas[0]:
        direct = torch.stack([d[name] for d in deltas]).mean(0)
        wire = torch.stack([r[name] for r in received]).mean(0)
        assert torch.equal(direct, wire)


# ---- chunking and read_payload --------------------------------------------------------------


def test_chunking_round_trip_and_chunk_sizes():
    enc = encode(make_delta(), "fp16", **META)
    msgs = list(to_messages(enc, max_chunk_bytes=100))
    assert msgs[0].WhichOneof("part") == "header" and msgs[-1].WhichOneof("part") == "end"
    assert all(len(m.chunk) <= 100 for m in msgs[1:-1])
    assert b"".join(m.chunk for m in msgs[1:-1]) == enc.payload
    got = read(msgs, max_chunk_bytes=100)
    assert got.header == enc.header and got.payload == enc.payload
    assert msgs[-1].end.sha256 == hashlib.sha256(enc.payload).hexdigest()


def test_read_payload_rejects_a_chunk_too_big():
    enc = encode(make_delta(), "fp32", **META)
    with pytest.raises(ValidationError, match="chunk of"):
        read(to_messages(enc, max_chunk_bytes=4096), max_chunk_bytes=1024)


def test_read_payload_rejects_bad_sha256():
    msgs = list(to_messages(encode(make_delta(), "fp32", **META), max_chunk_bytes=256))
    msgs[1] = pb.Payload(chunk=bytes(len(msgs[1].chunk)))
    with pytest.raises(ValidationError, match="sha256"):
        read(msgs)


def test_read_payload_rejects_wrong_totals_and_framing():
    msgs = list(to_messages(encode(make_delta(), "fp32", **META), max_chunk_bytes=256))
    with pytest.raises(ValidationError, match="ended after"):
        read(msgs[:2] + msgs[-1:])  # too few bytes
    with pytest.raises(ValidationError, match="exceed the declared"):
        read(msgs[:-1] + msgs[1:2] + msgs[-1:])  # too many bytes
    with pytest.raises(ValidationError, match="without an end"):
        read(msgs[:-1])
    with pytest.raises(ValidationError, match="start with a header"):
        read(msgs[1:])
    with pytest.raises(ValidationError, match="unexpected header"):
        read(msgs[:1] + msgs)
    with pytest.raises(ValidationError, match="before its header"):
        read([])


def test_read_payload_refuses_oversize_before_buffering():
    header = encode(make_delta(), "fp32", **META).header
    header.payload_bytes = 1 << 40

    async def stream():
        yield pb.Payload(header=header)
        raise AssertionError("read_payload pulled a chunk of an oversize payload")

    with pytest.raises(ValidationError, match="exceeds the limit"):
        asyncio.run(read_payload(stream(), max_payload_bytes=1 << 20))


def test_reject_becomes_peer_rejected():
    with pytest.raises(PeerRejected, match="wrong round"):
        read([pb.Payload(reject="wrong round")])
    assert issubclass(PeerRejected, ValidationError)


# ---- decode validation --------------------------------------------------------------------


def _nan_payload():
    enc = encode({"w": torch.ones(2, 2)}, "fp32", **META, zstd=False)
    enc.payload = torch.tensor([1.0, math.nan, 0.0, 0.0]).numpy().tobytes()
    return enc


def _negative_scale():
    enc = encode({"w": torch.ones(2, 2)}, "int8", **META, zstd=False)
    enc.payload = torch.tensor([-1.0, 1.0]).numpy().tobytes() + enc.payload[8:]
    return enc


def _mutated(field, value, codec="fp32"):
    enc = encode({"w": torch.ones(2, 2)}, codec, **META)
    setattr(enc.header, field, value)
    return enc


def _spec(field, value):
    enc = encode({"w": torch.ones(2, 2)}, "fp32", **META)
    setattr(enc.header.tensors[0], field, value)
    return enc


def _zstd_lie():
    enc = encode({"w": torch.zeros(2, 2)}, "fp32", **META, zstd=False)
    enc.header.zstd = True  # claims a zstd frame, holds raw bytes
    return enc


@pytest.mark.parametrize(
    "make,expected,match",
    [
        (lambda: _mutated("config_hash", "other"), None, "config hash"),
        (lambda: _mutated("swarm_id", "swarm-b"), None, "swarm"),
        (lambda: _mutated("kind", PayloadKind.EMBEDDING_DELTA.to_pb()), None, "kind"),
        (lambda: _mutated("block_index", 2), None, "block 2"),
        (lambda: _mutated("codec", 64), None, "codec"),  # a codec value we do not know
        (lambda: _mutated("weight", math.nan), None, "weight"),
        (lambda: _mutated("raw_bytes", 4), None, "raw_bytes"),
        (lambda: _mutated("payload_bytes", 3), None, "header says"),
        (lambda: encode({"w": torch.ones(2, 2)}, "fp32", **META), {"w": (4,)}, "shape"),
        (lambda: encode({"w": torch.ones(2, 2)}, "fp32", **META), {"w": (2, 2), "b": (2,)}, "missing"),
        (lambda: encode({"w": torch.ones(2, 2), "x": torch.ones(1)}, "fp32", **META), None, "unexpected"),
        (lambda: _spec("dtype", "float16"), None, "dtype"),
        (lambda: _spec("nbytes", 8), None, "declares"),
        (_nan_payload, None, "NaN"),
        (_negative_scale, None, "scales"),
        (_zstd_lie, None, "zstd"),
    ],
)
def test_decode_rejects(make, expected, match):
    with pytest.raises(ValidationError, match=match):
        decode(make(), expected or {"w": (2, 2)}, **META)


def test_decode_rejects_oversize_payload():
    enc = encode({"w": torch.randn(64, 64)}, "fp32", **META)
    with pytest.raises(ValidationError, match="exceeds the limit"):
        decode(enc, {"w": (64, 64)}, **META, max_bytes=1024)
    assert decode(enc, {"w": (64, 64)}, **META, max_bytes=64 * 64 * 4)["w"].shape == (64, 64)
