"""Raw tensor bytes on the wire: dtype names, tensor <-> bytes, tensor <-> swarmd.v1.Tensor.

Owns the one mapping between torch dtypes and the dtype strings in the protocol, and the checks
applied to every tensor that arrives from a peer before it is used: known dtype, byte count that
matches the shape, a size limit, and (for floats) finite values. Tensors are little-endian raw
bytes, optionally one zstd frame; nothing is ever pickled. No grpc server or torch.nn here.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import zstandard

from swarmd.errors import ValidationError
from swarmd.v1 import swarm_pb2 as pb

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int64": torch.int64,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
FLOAT_DTYPES = {"float32", "float16", "bfloat16"}
DEFAULT_MAX_TENSOR_BYTES = 256 << 20  # refuse any single tensor larger than this

_ZSTD_LEVEL = 3


def tensor_to_bytes(t: torch.Tensor) -> bytes:
    """Raw little-endian bytes of a (CPU, contiguous) tensor; bf16 goes through an int16 view."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    arr = t.numpy()
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()  # a no-op on little-endian hosts


def bytes_to_tensor(
    data: bytes | memoryview,
    dtype: str,
    shape: list[int] | tuple[int, ...],
    max_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
    check_finite: bool = True,
) -> torch.Tensor:
    """Validated tensor from raw bytes: raises ValidationError on any mismatch."""
    if dtype not in DTYPES:
        raise ValidationError(f"unknown dtype {dtype!r}")
    if any(int(s) < 0 for s in shape):
        raise ValidationError(f"negative dimension in shape {list(shape)}")
    torch_dtype = DTYPES[dtype]
    itemsize = torch.empty(0, dtype=torch_dtype).element_size()
    expected = math.prod(int(s) for s in shape) * itemsize
    if expected > max_bytes:
        raise ValidationError(f"tensor of {expected} bytes exceeds the limit of {max_bytes}")
    if len(data) != expected:
        raise ValidationError(
            f"tensor bytes {len(data)} do not match dtype {dtype} and shape {list(shape)} ({expected} expected)"
        )
    np_dtype = np.dtype(np.int16) if torch_dtype == torch.bfloat16 else torch.empty(0, dtype=torch_dtype).numpy().dtype
    wire = np.frombuffer(data, dtype=np_dtype.newbyteorder("<")).reshape([int(s) for s in shape])
    arr = wire.astype(np_dtype.newbyteorder("="), copy=True)  # native order for torch
    t = torch.from_numpy(arr)
    if torch_dtype == torch.bfloat16:
        t = t.view(torch.bfloat16)
    if check_finite and dtype in FLOAT_DTYPES and t.numel() and not bool(torch.isfinite(t.float()).all()):
        raise ValidationError("tensor holds NaN or infinite values")
    return t


def zstd_compress(data: bytes, level: int = _ZSTD_LEVEL) -> bytes:
    return zstandard.ZstdCompressor(level=level).compress(data)


def zstd_decompress(data: bytes, max_bytes: int) -> bytes:
    """Decompress one frame, refusing output larger than max_bytes (zip-bomb guard)."""
    try:
        params = zstandard.get_frame_parameters(data)
        if params.content_size > max_bytes:
            raise ValidationError(f"zstd frame declares {params.content_size} bytes, over the limit of {max_bytes}")
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=max_bytes)
    except zstandard.ZstdError as exc:
        raise ValidationError(f"bad zstd frame: {exc}") from None


def to_proto(t: torch.Tensor, compress: bool = False) -> pb.Tensor:
    raw = tensor_to_bytes(t)
    return pb.Tensor(
        dtype=DTYPE_NAMES[t.dtype], shape=list(t.shape), data=zstd_compress(raw) if compress else raw, zstd=compress
    )


def from_proto(
    msg: pb.Tensor,
    max_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
    expect_shape: tuple[int | None, ...] | None = None,
    expect_dtype: str | None = None,
) -> torch.Tensor:
    """Validated tensor from a Tensor message; expect_shape may hold None for free dimensions."""
    if expect_dtype is not None and msg.dtype != expect_dtype:
        raise ValidationError(f"expected dtype {expect_dtype}, got {msg.dtype!r}")
    if expect_shape is not None and (
        len(msg.shape) != len(expect_shape) or any(e is not None and e != s for e, s in zip(expect_shape, msg.shape))
    ):
        raise ValidationError(f"expected shape {list(expect_shape)}, got {list(msg.shape)}")
    data = zstd_decompress(msg.data, max_bytes) if msg.zstd else msg.data
    return bytes_to_tensor(data, msg.dtype, list(msg.shape), max_bytes)
