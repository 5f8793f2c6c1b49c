"""Delta and state payloads: codecs, zstd, error feedback, chunking and validation.

Owns the one byte format for tensors that peers swap (block/embedding deltas and state): a
pb.PayloadHeader that states the schema (swarm id, config hash, kind, block index, round, codec,
one TensorSpec per tensor), then one payload blob (each tensor encoded by the codec, concatenated
in header order, then one zstd frame), streamed as pb.Payload messages: header, chunks of at most
max_chunk_bytes, end carrying the sha256 of the payload.

Codecs (all followed by zstd unless told otherwise):
- fp32: exact; fp16 (clamped to +-65504) and bf16: a cast;
- int8: per-row symmetric quantisation (row = first dimension of a tensor with 2 or more
  dimensions, the whole tensor otherwise); each tensor's bytes are its fp32 scales (rows x 4
  bytes) followed by its int8 values, so TensorSpec.nbytes counts the scales too. The step of a
  row is max(absmax / 127, rms / int8_rms_levels): never clipped, and coarse enough that zstd
  packs the values into about 4.2 bits (absmax / 127 alone leaves ~7 bits of entropy per value
  in a trained block delta: 0.25x raw instead of ~0.15x). int8_rms_levels=None is pure absmax.
  The decoder only multiplies by the scales, so the step rule is the sender's choice.
ErrorFeedback carries what a lossy codec dropped into the next compress (EF-SGD / CHOCO style).

Every check on bytes from a peer lives here (read_payload, decode) and raises ValidationError
with a one-line reason. Pure: no grpc, no asyncio tasks, no torch.nn; never unpickles anything.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any, TypeVar

import torch

from swarmd.errors import ValidationError
from swarmd.protocol import Codec, PayloadKind
from swarmd.transport.framing import DEFAULT_MAX_PAYLOAD_BYTES, Encoded
from swarmd.v1 import swarm_pb2 as pb
from swarmd.wire import bytes_to_tensor, tensor_to_bytes, zstd_compress, zstd_decompress

logger = logging.getLogger(__name__)

CODEC_DTYPES = {Codec.FP32: "float32", Codec.FP16: "float16", Codec.BF16: "bfloat16", Codec.INT8: "int8"}
_FP16_MAX = 65504.0
INT8_RMS_LEVELS = 4.0  # int8 steps per row rms (see above); ~7% relative error, carried by ErrorFeedback


def shapes_of(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """The `expected` argument of decode for tensors shaped like these (e.g. a state_dict)."""
    return {name: tuple(t.shape) for name, t in tensors.items()}


def payload_size_bound(shapes: dict[str, tuple[int, ...]], codec: Codec, zstd: bool = True) -> int:
    """Largest payload encode() can produce for tensors of these shapes with codec (zstd's worst case included).

    The receiver admits a stream only up to this (plus PAYLOAD_SLACK): the exact size its config implies.
    """
    n = sum(_spec_nbytes(codec, tuple(s)) for s in shapes.values())
    if zstd:  # ZSTD_COMPRESSBOUND, plus the frame header
        n += (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0) + 32
    return n


PAYLOAD_SLACK = 1024  # bytes admitted beyond payload_size_bound


def _rows(shape: tuple[int, ...]) -> int:
    """Number of int8 scale rows of a tensor: its first dimension if it has 2+ dims, else 1."""
    return int(shape[0]) if len(shape) >= 2 else 1


def _spec_nbytes(codec: Codec, shape: tuple[int, ...]) -> int:
    numel = math.prod(int(s) for s in shape)
    if codec == Codec.INT8:
        return 4 * _rows(shape) + numel
    return numel * (4 if codec == Codec.FP32 else 2)


def _encode_tensor(x: torch.Tensor, codec: Codec, int8_rms_levels: float | None = INT8_RMS_LEVELS) -> bytes:
    """Codec bytes of one fp32 CPU tensor (before zstd)."""
    if codec == Codec.FP32:
        return tensor_to_bytes(x)
    if codec == Codec.FP16:
        return tensor_to_bytes(x.clamp(-_FP16_MAX, _FP16_MAX).to(torch.float16))
    if codec == Codec.BF16:
        return tensor_to_bytes(x.to(torch.bfloat16))
    rows = _rows(tuple(x.shape))
    flat = x.reshape(rows, x.numel() // rows if rows else 0)
    if x.numel() == 0:
        scales = torch.zeros(rows, dtype=torch.float32)
        q = torch.zeros(flat.shape, dtype=torch.int8)
    else:
        scales = flat.abs().amax(dim=1) / 127.0
        if int8_rms_levels is not None:
            rms = flat.double().pow(2).mean(dim=1).sqrt().float()  # float64: squares of huge values stay finite
            scales = torch.maximum(scales, rms / int8_rms_levels)
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        q = torch.round(flat / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return tensor_to_bytes(scales) + tensor_to_bytes(q)


def _decode_tensor(data: memoryview, codec: Codec, shape: tuple[int, ...]) -> torch.Tensor:
    """fp32 tensor from one tensor's codec bytes (sizes already checked); raises ValidationError."""
    if codec != Codec.INT8:
        return bytes_to_tensor(data, CODEC_DTYPES[codec], shape, max_bytes=len(data)).float()
    rows = _rows(shape)
    numel = math.prod(shape)
    scales = bytes_to_tensor(data[: 4 * rows], "float32", (rows,), max_bytes=4 * rows)
    if bool((scales < 0).any()):
        raise ValidationError("int8 scales must be >= 0")
    q = bytes_to_tensor(data[4 * rows :], "int8", (rows, numel // rows if rows else 0), max_bytes=numel)
    out = (q.float() * scales[:, None]).reshape(shape)
    if out.numel() and not bool(torch.isfinite(out).all()):
        raise ValidationError("int8 tensor dequantises to non-finite values")
    return out


def _encode_raw(
    tensors: dict[str, torch.Tensor], codec: Codec, int8_rms_levels: float | None = INT8_RMS_LEVELS
) -> tuple[list[pb.TensorSpec], bytes, int]:
    """TensorSpecs, concatenated codec bytes (pre-zstd) and the fp32 size of `tensors`."""
    specs, parts, raw = [], [], 0
    for name, t in tensors.items():
        x = t.detach().to("cpu", torch.float32).contiguous()
        if x.numel() and not bool(torch.isfinite(x).all()):
            raise ValidationError(f"refusing to encode {name}: it holds NaN or infinite values")
        data = _encode_tensor(x, codec, int8_rms_levels)
        specs.append(pb.TensorSpec(name=name, dtype=CODEC_DTYPES[codec], shape=list(x.shape), nbytes=len(data)))
        parts.append(data)
        raw += x.numel() * 4
    return specs, b"".join(parts), raw


def _decode_raw(specs: Iterable[pb.Tensor], blob: bytes, codec: Codec) -> dict[str, torch.Tensor]:
    out, view, offset = {}, memoryview(blob), 0
    for spec in specs:
        shape = tuple(int(s) for s in spec.shape)
        out[spec.name] = _decode_tensor(view[offset : offset + spec.nbytes], codec, shape)
        offset += spec.nbytes
    return out


_E = TypeVar("_E", Codec, PayloadKind)


def _member(enum: type[_E], value: str) -> _E:
    """The member named by value (a member or its string); ValueError naming the choices."""
    try:
        return enum(value)
    except ValueError:
        what = "codec" if enum is Codec else "payload kind"
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(enum)}") from None


def _wire_name(enum: type[Codec] | type[PayloadKind], value: int) -> str:
    """A header's enum value as its name, for messages ("value 9" when we do not know it)."""
    try:
        return enum.from_pb(value).value
    except ValueError:
        return f"value {value}"


def encode(
    tensors: dict[str, torch.Tensor],
    codec: Codec | str,
    *,
    swarm_id: str,
    config_hash: str,
    kind: PayloadKind | str,
    block_index: int,
    round: int = 0,
    base_hash: str = "",
    weight: float = 1.0,
    peer_id: str = "",
    zstd: bool = True,
    int8_rms_levels: float | None = INT8_RMS_LEVELS,
) -> Encoded:
    """Encode tensors (any float dtype/device) with `codec`, then zstd (unless zstd=False).

    :param codec: a Codec (or its name); :param kind: a PayloadKind; :param block_index: -1 for the embedding
    :param round: averaging round; :param base_hash: hash of the weights the delta starts from
    :param weight: samples behind this delta (the receiver's merge weight)
    :param zstd: compress the codec bytes with zstd (always on in the daemon)
    :param int8_rms_levels: int8 step is max(absmax/127, row rms / this); None = absmax/127
    :raises ValidationError: a tensor holds NaN/inf; ValueError: unknown codec or kind
    """
    return _encode(
        tensors,
        codec,
        kind=kind,
        zstd=zstd,
        int8_rms_levels=int8_rms_levels,
        swarm_id=swarm_id,
        config_hash=config_hash,
        block_index=block_index,
        round=round,
        base_hash=base_hash,
        weight=weight,
        peer_id=peer_id,
    )[0]


def _encode(
    tensors: dict[str, torch.Tensor],
    codec: Codec | str,
    *,
    kind: PayloadKind | str,
    zstd: bool = True,
    int8_rms_levels: float | None = INT8_RMS_LEVELS,
    **meta: Any,
) -> tuple[Encoded, bytes]:
    """encode, also returning the codec bytes before zstd (ErrorFeedback decodes those)."""
    kind_, codec_ = _member(PayloadKind, kind), _member(Codec, codec)
    specs, blob, raw = _encode_raw(tensors, codec_, int8_rms_levels)
    payload = zstd_compress(blob) if zstd else blob
    header = pb.PayloadHeader(
        kind=kind_.to_pb(),
        codec=codec_.to_pb(),
        tensors=specs,
        raw_bytes=raw,
        payload_bytes=len(payload),
        zstd=zstd,
        **meta,
    )
    return Encoded(header, payload), blob


def decode(
    enc: Encoded,
    expected: dict[str, tuple[int, ...]],
    *,
    swarm_id: str,
    config_hash: str,
    kind: PayloadKind | str,
    block_index: int,
    max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> dict[str, torch.Tensor]:
    """Validate a payload from a peer against what we expect and return its fp32 tensors.

    :param expected: tensor name -> shape; the payload must hold exactly these (any order)
    :param max_bytes: limit on the payload and on its decompressed size, in bytes
    :raises ValidationError: with a one-line reason on any mismatch (nothing is returned then)
    """
    h = enc.header
    if h.swarm_id != swarm_id:
        raise ValidationError(f"payload is for swarm {h.swarm_id!r}, expected {swarm_id!r}")
    if h.config_hash != config_hash:
        raise ValidationError(f"payload has config hash {h.config_hash!r}, expected {config_hash!r}")
    kind = PayloadKind(kind)
    if h.kind != kind.to_pb():
        raise ValidationError(f"payload kind is {_wire_name(PayloadKind, h.kind)!r}, expected {kind.value!r}")
    if h.block_index != block_index:
        raise ValidationError(f"payload is for block {h.block_index}, expected {block_index}")
    try:
        codec = Codec.from_pb(h.codec)
    except ValueError:
        raise ValidationError(f"unknown codec ({_wire_name(Codec, h.codec)})") from None
    if not math.isfinite(h.weight) or h.weight < 0:
        raise ValidationError(f"payload weight {h.weight} must be finite and >= 0")
    if len(enc.payload) != h.payload_bytes:
        raise ValidationError(f"payload has {len(enc.payload)} bytes, header says {h.payload_bytes}")
    if len(enc.payload) > max_bytes:
        raise ValidationError(f"payload of {len(enc.payload)} bytes exceeds the limit of {max_bytes}")
    names = [s.name for s in h.tensors]
    if len(set(names)) != len(names):
        raise ValidationError("payload names a tensor twice")
    if set(names) != set(expected):
        missing, extra = sorted(set(expected) - set(names)), sorted(set(names) - set(expected))
        raise ValidationError(
            f"payload tensors differ from the expected ones (missing {missing[:3]}, unexpected {extra[:3]})"
        )
    total, raw = 0, 0
    for spec in h.tensors:
        shape = tuple(int(s) for s in spec.shape)
        if shape != tuple(expected[spec.name]):
            raise ValidationError(f"tensor {spec.name} has shape {list(shape)}, expected {list(expected[spec.name])}")
        if spec.dtype != CODEC_DTYPES[codec]:
            raise ValidationError(
                f"tensor {spec.name} has dtype {spec.dtype!r}, codec {codec} sends {CODEC_DTYPES[codec]}"
            )
        if spec.nbytes != _spec_nbytes(codec, shape):
            raise ValidationError(
                f"tensor {spec.name} declares {spec.nbytes} bytes, {_spec_nbytes(codec, shape)} expected"
            )
        total += spec.nbytes
        raw += 4 * math.prod(shape)
    if total > max_bytes:
        raise ValidationError(f"decoded payload of {total} bytes exceeds the limit of {max_bytes}")
    if h.raw_bytes != raw:
        raise ValidationError(f"header raw_bytes {h.raw_bytes} does not match the tensors ({raw})")
    blob = zstd_decompress(enc.payload, total) if h.zstd else enc.payload
    if len(blob) != total:
        raise ValidationError(f"decoded payload has {len(blob)} bytes, the tensors need {total}")
    return _decode_raw(h.tensors, blob, codec)


class ErrorFeedback:
    """Error feedback for lossy codecs: what encoding dropped is added to the next delta.

    compress(delta) encodes delta + residual and keeps residual = (delta + residual) -
    decoded, so the running sum of decoded deltas tracks the running sum of true deltas to within
    one step's quantisation error instead of drifting. Not thread-safe: one owner (gossip).
    """

    def __init__(self) -> None:
        self.residual: dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        self.residual.clear()

    def compress(
        self, delta: dict[str, torch.Tensor], codec: Codec | str, **header: Any
    ) -> tuple[Encoded, dict[str, torch.Tensor]]:
        """Encode delta + residual; return what is sent and its decoded fp32 value.

        Merge the returned decoded value of your own delta (not the exact one), so every replica
        averages the same numbers. `header` takes encode's keyword arguments.
        """
        corrected = {}
        for name, t in delta.items():
            x = t.detach().to("cpu", torch.float32)
            r = self.residual.get(name)
            corrected[name] = x + r if r is not None and r.shape == x.shape else x
        enc, blob = _encode(corrected, codec, **header)
        decoded = _decode_raw(enc.header.tensors, blob, Codec(codec))
        self.residual = {name: corrected[name] - decoded[name] for name in corrected}
        return enc, decoded
