"""PullState of exactly the weights a Forward answer named (PullStateRequest.weights_hash).

Owns `served_payload()`, which swarmd.node.service calls for a pull that names a hash: the block state (or the
embedding state) of the serving snapshot of that hash, fp32, its header's base_hash that hash, signed by this peer,
so a client can recompute an answer from the very weights that computed it (swarmd.serve.tiebreak). The snapshots
are what the daemon's BlockServing keeps (its `served`: swarmd.serve.snapshots.ServedWeights, read through the
`Served` protocol: the node never imports serving). A hash no held snapshot has answers NotFound (NOT_FOUND), never
another state; a hash of the wrong form or a pull for another swarm, config or block is a ValidationError.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from swarmd.averaging.context import PeerContext
from swarmd.averaging.delta import encode
from swarmd.averaging.pulls import requested_kind
from swarmd.averaging.state import weights_hash
from swarmd.errors import NotFound, ValidationError
from swarmd.membership.trust import sign_payload
from swarmd.protocol import Codec
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)

MAX_HASH = 64  # characters (swarmd.serve.snapshots.MAX_HASH)
_HEX = frozenset("0123456789abcdef")


class Served(Protocol):
    """What a pull by hash reads of the serving snapshots (swarmd.serve.snapshots.ServedWeights)."""

    def block_state(self, h: str) -> dict[str, torch.Tensor] | None: ...

    def emb_state(self, h: str) -> dict[str, torch.Tensor] | None: ...


def served_payload(ctx: PeerContext, served: Served | None, request: pb.PullStateRequest) -> Encoded:
    """The signed fp32 state of the serving snapshot `request.weights_hash` names (see the module doc)."""
    h = request.weights_hash
    if not (0 < len(h) <= MAX_HASH and set(h) <= _HEX):
        raise ValidationError(f"weights_hash must be 1..{MAX_HASH} lower-case hex characters")
    kind = requested_kind(ctx.me, request)
    if request.outer_state or request.current or request.working:
        raise ValidationError("a pull by weights_hash takes no outer_state, current or working")
    tensors = None if served is None else (served.block_state(h) if kind.is_block else served.emb_state(h))
    if tensors is None:
        raise NotFound(f"no served {kind.value} of hash {h} is held any more (only the last few are kept)")
    if weights_hash(tensors) != h:  # a bug, not a peer's doing: refuse rather than send weights of another hash
        logger.warning("%s served %s of hash %s does not hash to it; refusing the pull", ctx.tag, kind.value, h)
        raise NotFound(f"no served {kind.value} of hash {h} is held any more")
    enc = sign_payload(encode(tensors, Codec.FP32, base_hash=h, **ctx.hdr(kind, ctx.state.round)), ctx.identity)
    ctx.metrics.add_sent(enc.wire_bytes, enc.raw_bytes)
    return enc
