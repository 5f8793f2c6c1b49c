"""Compact predecessor pulls: another block's state int8-quantised per row, then zstd, for trajectory inputs only.

A block-b peer runs blocks 0..b-1 forward only (frozen trajectory inputs), and pulls them at round start and
TrainConfig.predecessor_pulls times a round: at fp32 those pulls, not the int8 deltas, are most of a swarm's wire
bytes. PULL_CODECS names what a peer may ask for them (GossipConfig.pull_codec): "fp32" (exact; the mid-round
working weights as fp16), "int8" (the default: swarmd.averaging.delta's per-row int8 codec on the weights
themselves, step max(absmax / 127, rms / PULL_INT8_LEVELS) per row, ~1/(PULL_INT8_LEVELS x sqrt(12)) relative
rms error) or "int8-delta": a mid-round pull names (PullStateRequest.against) the merged state it pulled compact
at round start; while the peer still holds that state it answers its working weights less compact_decoding(that
state) as an int8 delta (PULL_DELTA_LEVELS: ~14% of a small delta), which the puller adds to what it holds. The
encoder is deterministic, so both sides hold the same decoding; a peer that merged since answers the compact
working state instead. The header's base_hash stays the hash of the exact fp32 weights
(what records announce), so a quantised pull is never checked against a hash and never adopted: adoption,
re-sync, rejoin and joiner state are always fp32 and hash-checked (swarmd.averaging.pulls). roundtrip and
delta_roundtrip are the simulator's hand-off: the decoded weights a puller runs and the real wire bytes.
Pure: no grpc, no asyncio.
"""

from __future__ import annotations

from typing import Any

import torch

from swarmd.averaging.config import PULL_CODECS
from swarmd.averaging.delta import decode, encode, shapes_of
from swarmd.protocol import Codec, PayloadKind
from swarmd.transport.framing import Encoded

# int8 steps per row rms of a quantised pull (the delta codec's step rule on weights; None = absmax / 127)
PULL_INT8_LEVELS: float | None = 16.0
# ... and of a mid-round delta against the held state (coarser than a gossip delta: no error feedback needed, the
# next pull is taken against the same held state; ~14% of a small delta)
PULL_DELTA_LEVELS: float | None = 2.0


def check_pull_codec(name: str) -> str:
    """`name` if it is one of PULL_CODECS (ValueError naming them otherwise)."""
    if name not in PULL_CODECS:
        raise ValueError(f"pull codec must be one of {', '.join(PULL_CODECS)}, got {name!r}")
    return name


def encode_compact(tensors: dict[str, torch.Tensor], levels: float | None = PULL_INT8_LEVELS, **header: Any) -> Encoded:
    """A state as a compact (int8 + zstd) pull payload; `header`: encode's keywords (base_hash: the fp32 weights')."""
    return encode(tensors, Codec.INT8, int8_rms_levels=levels, **header)


def compact_decoding(tensors: dict[str, torch.Tensor], block_index: int) -> dict[str, torch.Tensor]:
    """What a puller decodes of this block state pulled compact (the encoder is deterministic, so the server that
    sent it can take a mid-round delta against exactly this)."""
    return roundtrip(tensors, "int8", block_index)[0]


def encode_delta(step: dict[str, torch.Tensor], **header: Any) -> Encoded:
    """A mid-round pull's int8 delta against the held state (PULL_DELTA_LEVELS); `header`: encode's keywords."""
    return encode(step, Codec.INT8, int8_rms_levels=PULL_DELTA_LEVELS, **header)


def roundtrip(
    tensors: dict[str, torch.Tensor], codec: str, block_index: int, levels: float | None = PULL_INT8_LEVELS
) -> tuple[dict[str, torch.Tensor], int]:
    """What a puller asking `codec` runs of this block state and the wire bytes of the pull (the simulator's
    hand-off): fp32 is the state itself at its raw bytes; int8 goes through the real encoder and decoder."""
    if check_pull_codec(codec) == "fp32":
        return tensors, sum(4 * t.numel() for t in tensors.values())
    meta: dict[str, Any] = dict(swarm_id="sim", config_hash="sim", kind=PayloadKind.BLOCK_STATE)
    enc = encode_compact(tensors, levels, block_index=block_index, **meta)
    return decode(enc, shapes_of(tensors), block_index=block_index, **meta), enc.wire_bytes


def delta_roundtrip(
    working: dict[str, torch.Tensor], held: dict[str, torch.Tensor], block_index: int
) -> tuple[dict[str, torch.Tensor], int]:
    """A mid-round pull as an int8 delta (the delta codec's step rule) against `held`, the compact round-start
    state the puller holds: held + decoded(working - held) and the wire bytes (the simulator's hand-off)."""
    meta: dict[str, Any] = dict(swarm_id="sim", config_hash="sim", kind=PayloadKind.BLOCK_DELTA)
    enc = encode_delta({k: working[k] - held[k] for k in held}, block_index=block_index, **meta)
    step = decode(enc, shapes_of(held), block_index=block_index, **meta)
    return {k: held[k] + step[k] for k in held}, enc.wire_bytes
