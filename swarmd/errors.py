"""Error types shared by swarmd: each carries a one-line message fit to show a user.

The CLI maps SwarmdError to exit code 1 (2 for bad input) without a traceback; gRPC servicers
map the subclasses to status codes. Nothing here imports anything.
"""


class SwarmdError(Exception):
    """Base class: the message is a complete sentence for the user."""

    exit_code = 1


class DataError(SwarmdError):
    """Training or evaluation data is missing, empty or unreadable."""

    exit_code = 2


class CheckpointError(SwarmdError):
    """A checkpoint is missing, incomplete, corrupt or of another config."""

    exit_code = 2


class ConfigMismatch(SwarmdError):
    """A peer, file or checkpoint speaks another model config."""

    exit_code = 2


class ValidationError(SwarmdError):
    """Bytes from a peer failed validation (wrong schema, shape, dtype, size or non-finite)."""


class PeerUnavailable(SwarmdError):
    """No peer could be reached for what was asked."""


class PeerRejected(ValidationError):
    """The peer refused the exchange (a pb.Payload.reject), with its reason."""
