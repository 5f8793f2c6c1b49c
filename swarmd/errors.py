"""The one error hierarchy of swarmd: each class carries a user-fit message and its gRPC status.

Every error a peer can raise at another peer lives here, with its gRPC status code *name* as a
plain class attribute (`status = "NOT_FOUND"`). swarmd.transport.status holds the one table that
turns a raised class into a status code on the server and a received status code (plus the class
name sent in trailing metadata) back into the same class on the client, so a caller can
`except WrongBlock` whether the block was asked of a local object or of a peer. The CLI maps
SwarmdError to exit code 1 (2 for bad input) without a traceback. Nothing here imports anything.

    SwarmdError (INTERNAL: not meant to cross the wire)
      ConfigError, DataError, CheckpointError
      ConfigMismatch (FAILED_PRECONDITION): StaleRound, BaseMismatch
      ValidationError (INVALID_ARGUMENT): PeerRejected, SessionMissing
      PeerUnavailable (UNAVAILABLE): DeadlineExceeded, NotFound (WrongBlock), Busy (NotReady), PeerFailed
      Unauthenticated (UNAUTHENTICATED): a private swarm refused a call without a valid proof of its key:
        SwarmKeyRequired (the call carried no proof), SwarmKeyMismatch (a proof made with another key)
      NothingMerges (exit code 3): every exchange of a few rounds failed for a known cause (swarmd.node.diagnosis)
"""


class SwarmdError(Exception):
    """Base class: the message is a complete sentence for the user."""

    exit_code = 1
    status = "INTERNAL"  # gRPC status code name when raised by an RPC handler (INTERNAL: unexpected)


class DataError(SwarmdError):
    """Training or evaluation data is missing, empty or unreadable."""

    exit_code = 2


class CheckpointError(SwarmdError):
    """A checkpoint is missing, incomplete, corrupt or of another config."""

    exit_code = 2


class ConfigError(SwarmdError, ValueError):
    """A configuration value is invalid (a flag, a config file, a config dataclass field)."""

    exit_code = 2


class ConfigMismatch(SwarmdError):
    """A peer, file or checkpoint speaks another model config."""

    exit_code = 2
    status = "FAILED_PRECONDITION"


class StaleRound(ConfigMismatch):
    """A delta belongs to another averaging round than ours."""


class BaseMismatch(ConfigMismatch):
    """A delta was computed from other weights than our base (the re-sync rule sorts it out)."""


class ValidationError(SwarmdError):
    """Bytes from a peer failed validation (wrong schema, shape, dtype, size or non-finite)."""

    status = "INVALID_ARGUMENT"


class PeerRejected(ValidationError):
    """The peer refused the exchange (a pb.Payload.reject), with its reason."""


class SessionMissing(ValidationError):
    """The session's cache for this step is gone or at another length: re-send from position 0."""


class PeerUnavailable(SwarmdError):
    """No peer could be reached for what was asked (try another one)."""

    status = "UNAVAILABLE"


class DeadlineExceeded(PeerUnavailable):
    """The peer did not answer within the call's deadline (slow, not necessarily gone)."""

    status = "DEADLINE_EXCEEDED"


class NotFound(PeerUnavailable):
    """The peer does not serve what was asked (unknown block or kind)."""

    status = "NOT_FOUND"


class WrongBlock(NotFound):
    """Asked a peer for a block it does not train or serve."""


class Busy(PeerUnavailable):
    """The peer is overloaded or not ready for this request."""

    status = "RESOURCE_EXHAUSTED"


class NotReady(Busy):
    """The peer is still starting, or its own delta was not ready in time."""


class PeerFailed(PeerUnavailable):
    """The peer failed the call itself (internal error, cancelled, unimplemented)."""

    status = "INTERNAL"


class Unauthenticated(SwarmdError):
    """A private swarm refused the call: it carried no valid proof of the swarm key (--swarm-key)."""

    exit_code = 2
    status = "UNAUTHENTICATED"


class SwarmKeyRequired(Unauthenticated):
    """A private swarm refused a call that carried no proof of its key (the caller has no --swarm-key)."""


class SwarmKeyMismatch(Unauthenticated):
    """A private swarm refused a call whose proof was made with another swarm key."""


class NothingMerges(SwarmdError):
    """A peer stopped: every exchange of its last rounds failed for the cause the message names (--keep-trying
    goes on instead)."""

    exit_code = 3
