"""The names of the swarmd.v1 protocol, each defined once, and the SwarmConfig message.

Owns:
  - PROTOCOL, the protocol name peers exchange in SwarmConfig ("swarmd.v1", the proto package);
  - Codec, PayloadKind and PeerState: str Enums kept in step with the proto enums of the same
    name (member NAME <-> proto value PREFIX_NAME, e.g. Codec.INT8 <-> pb.CODEC_INT8), with
    to_pb() / from_pb() to cross over; tests/test_protos.py checks both sides list the same names;
  - swarm_config() builds the SwarmConfig a peer answers GetConfig with, and model_config() /
    ask_model_config() read one back, checking the swarm id and the config hash.
Used by the CLI, swarm and serve alike, so: no torch, no grpc, no hivemind here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Protocol, Self

from swarmd.core.config import ModelConfig
from swarmd.errors import ConfigMismatch, PeerUnavailable, SwarmdError
from swarmd.v1 import swarm_pb2 as pb

PROTOCOL = pb.DESCRIPTOR.package  # "swarmd.v1"


class _ProtoEnum(StrEnum):
    """A str Enum mirrored by the proto enum of the same class name."""

    @classmethod
    def _prefix(cls) -> str:
        return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).upper() + "_"  # PayloadKind -> PAYLOAD_KIND_

    def to_pb(self) -> Any:
        """The proto enum value of this member (an int typed as the proto enum in the stubs)."""
        return getattr(pb, type(self)._prefix() + self.name)

    @classmethod
    def from_pb(cls, value: int) -> Self:
        """The member of a proto enum value; ValueError for UNSPECIFIED or a value we do not know."""
        proto = getattr(pb, cls.__name__)
        name = proto.Name(value) if value in proto.values() else ""
        member = cls.__members__.get(name.removeprefix(cls._prefix()))
        if member is None:
            raise ValueError(f"no {cls.__name__} for proto value {value}")
        return member


class Codec(_ProtoEnum):
    """Delta codec on the wire (always followed by zstd); see swarmd.averaging.delta."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"


class PayloadKind(_ProtoEnum):
    """What a payload carries: a round's delta or the merged state, of the block or the byte table."""

    BLOCK_DELTA = "block_delta"
    EMBEDDING_DELTA = "embedding_delta"
    BLOCK_STATE = "block_state"
    EMBEDDING_STATE = "embedding_state"

    @property
    def part(self) -> str:
        """Which weights the payload holds: "block" or "embedding"."""
        return self.value.rpartition("_")[0]

    @property
    def is_block(self) -> bool:
        return self in (PayloadKind.BLOCK_DELTA, PayloadKind.BLOCK_STATE)

    @property
    def state(self) -> PayloadKind:
        """The state kind of the same part (BLOCK_DELTA -> BLOCK_STATE)."""
        return PayloadKind.BLOCK_STATE if self.is_block else PayloadKind.EMBEDDING_STATE

    @property
    def delta(self) -> PayloadKind:
        """The delta kind of the same part (BLOCK_STATE -> BLOCK_DELTA)."""
        return PayloadKind.BLOCK_DELTA if self.is_block else PayloadKind.EMBEDDING_DELTA


class PeerState(_ProtoEnum):
    """What a peer is doing, as GetStatus reports it."""

    JOINING = "joining"
    TRAINING = "training"
    AVERAGING = "averaging"
    STOPPING = "stopping"
    SERVING = "serving"  # an inference-only peer: serves its block, trains nothing


def peer_state_name(value: int) -> str:
    """A PeerStatus.state for display: its PeerState value, "unknown" for anything else."""
    try:
        return PeerState.from_pb(value).value
    except ValueError:
        return "unknown"


# -- the SwarmConfig message ---------------------------------------------------------------------
def swarm_config(swarm_id: str, model: ModelConfig) -> pb.SwarmConfig:
    """The SwarmConfig a peer of `swarm_id` running `model` answers GetConfig with."""
    return pb.SwarmConfig(
        swarm_id=swarm_id,
        model_config_json=json.dumps(model.to_dict(), sort_keys=True),
        config_hash=model.config_hash(),
        protocol=PROTOCOL,
    )


def model_config(sc: pb.SwarmConfig, address: str, swarm_id: str | None = None) -> ModelConfig:
    """The ModelConfig a SwarmConfig from `address` carries, checked against its hash and our swarm id.

    :param swarm_id: the swarm we want; None or "" accepts any
    :raises ConfigMismatch: another swarm, or a model config that does not match its own hash
    """
    if swarm_id and sc.swarm_id and sc.swarm_id != swarm_id:
        raise ConfigMismatch(
            f"peer {address} runs swarm {sc.swarm_id!r}, not {swarm_id!r}; pass --swarm-id {sc.swarm_id}"
        )
    try:
        model = ModelConfig.from_dict(json.loads(sc.model_config_json))
    except (TypeError, ValueError) as exc:
        raise ConfigMismatch(f"peer {address} sent a model config we cannot read: {exc}") from None
    if model.config_hash() != sc.config_hash:
        raise ConfigMismatch(f"peer {address} sent a model config that does not match its own hash")
    return model


class ConfigSource(Protocol):
    """What ask_model_config needs of a client (swarmd.transport.PeerClient has it)."""

    async def swarm_config(self, address: str, timeout_s: float = ...) -> pb.SwarmConfig: ...


async def ask_model_config(
    client: ConfigSource, addresses: Iterable[str], swarm_id: str | None = None, timeout_s: float = 10.0
) -> tuple[ModelConfig, str]:
    """The model config of a swarm and the address that told it: the first peer that answers GetConfig.

    An unreachable peer is skipped; a peer of another swarm or with an inconsistent config stops the
    search (the user pointed at the wrong swarm).
    :raises PeerUnavailable: no peer answered; ConfigMismatch: see model_config()
    """
    errors = []
    for address in addresses:
        try:
            sc = await client.swarm_config(address, timeout_s=timeout_s)
        except SwarmdError as exc:
            errors.append(str(exc))
            continue
        return model_config(sc, address, swarm_id), address
    raise PeerUnavailable(f"no peer answered GetConfig ({'; '.join(errors[:2]) or 'none found'})")
