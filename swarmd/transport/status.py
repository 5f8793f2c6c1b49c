"""The one table between swarmd errors and gRPC status codes, used in both directions.

Server side: status_code_for(exc) gives the status code of an exception a handler raised (its class's
`status` attribute, DEADLINE_EXCEEDED for a TimeoutError, INTERNAL for anything unexpected) and
trailing_metadata(exc) names its class, so that the client side, error_for(code, message, tag),
re-raises the very class the server raised (`except WrongBlock` works across the wire). A tag is
honoured only for a class of swarmd.errors whose status matches the received code; otherwise (an
older peer, a status grpc itself produced) the code alone picks the class from DEFAULT_CLASS.
Pure: grpc's StatusCode enum and swarmd.errors only.
"""

from __future__ import annotations

from typing import Any

import grpc

from swarmd import errors
from swarmd.errors import SwarmdError

ERROR_CLASS_KEY = "swarmd-error"  # trailing-metadata key carrying the raised class's name

_CLASSES: dict[str, type[SwarmdError]] = {
    name: cls for name, cls in vars(errors).items() if isinstance(cls, type) and issubclass(cls, SwarmdError)
}

# the class a received status code becomes when no (valid) class name came with it
DEFAULT_CLASS: dict[grpc.StatusCode, type[SwarmdError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.ValidationError,
    grpc.StatusCode.FAILED_PRECONDITION: errors.ConfigMismatch,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.Busy,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.UNAVAILABLE: errors.PeerUnavailable,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
}


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    """Status code for an exception a handler raised (INTERNAL for anything unexpected)."""
    if isinstance(exc, SwarmdError):
        return grpc.StatusCode[exc.status]
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.INTERNAL


def trailing_metadata(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """Trailing metadata naming the class of a domain error (none for unexpected ones)."""
    if isinstance(exc, SwarmdError) and status_code_for(exc) != grpc.StatusCode.INTERNAL:
        return ((ERROR_CLASS_KEY, type(exc).__name__),)
    return ()


def class_tag(metadata: Any) -> str:
    """The class name a server put in its trailing metadata ("" when none)."""
    for key, value in metadata or ():
        if key == ERROR_CLASS_KEY:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return ""


def error_for(code: grpc.StatusCode, message: str, tag: str = "") -> SwarmdError:
    """The SwarmdError a caller raises for a failed call: the server's class when it sent a valid
    tag, else DEFAULT_CLASS[code]; PeerFailed for every other code (internal, cancelled, ...)."""
    cls = _CLASSES.get(tag)
    if cls is None or cls.status != code.name or code == grpc.StatusCode.INTERNAL:
        cls = DEFAULT_CLASS.get(code, errors.PeerFailed)
    return cls(message)


def one_line(exc: BaseException) -> str:
    """An error's message on one line (its class name when it has none): what a status's details carry."""
    return " ".join(str(exc).split()) or type(exc).__name__
