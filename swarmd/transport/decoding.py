"""Requests as the server's gRPC handlers receive them: parsed leniently, so that bytes which are not a valid
protobuf message become an Undecodable (the servicer answers INVALID_ARGUMENT) instead of grpc's UNKNOWN or
INTERNAL; a Payload parsed by swarmd.transport.framing.parse_message (its chunks without a protobuf copy).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from swarmd.errors import ValidationError
from swarmd.transport.framing import parse_message
from swarmd.transport.status import one_line
from swarmd.v1 import swarm_pb2 as pb


class Undecodable:
    """What a request that is not a valid protobuf message becomes (the servicer answers INVALID_ARGUMENT)."""

    def __init__(self, type_name: str, error: Exception):
        self.type_name, self.error = type_name, error

    def exception(self) -> ValidationError:
        return ValidationError(f"request is not a valid {self.type_name}: {one_line(self.error)}")


def lenient(cls: Any) -> Callable[[bytes], Any]:
    """cls.FromString that returns an Undecodable instead of raising (grpc would answer UNKNOWN/INTERNAL).

    A Payload is parsed by framing.parse_message (chunks without a protobuf copy)."""
    name = cls.DESCRIPTOR.full_name
    from_string = parse_message if cls is pb.Payload else cls.FromString

    def parse(data: bytes) -> Any:
        try:
            return from_string(data)
        except Exception as exc:  # google.protobuf.message.DecodeError, or a RuntimeWarning-ish parse failure
            return Undecodable(name, exc)

    return parse


async def checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A request stream that raises the ValidationError of the first undecodable message."""
    async for request in requests:
        if isinstance(request, Undecodable):
            raise request.exception()
        yield request
