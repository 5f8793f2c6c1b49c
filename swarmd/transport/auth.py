"""Swarm membership: the swarm key file, the proof of it every RPC carries, and the server's check.

A private swarm shares one secret key (`blocktrain keygen swarm-key FILE`; --swarm-key FILE or
BLOCKTRAIN_SWARM_KEY=FILE). Every call a PeerClient makes then carries, in metadata AUTH_HEADER, a fresh
proof: "v1.<unix ms>.<nonce>.<HMAC-SHA256(key, v1|ms|nonce|method)>". The server's SwarmKeyInterceptor
refuses any call on any service but grpc.health.v1 whose proof is missing, for another method, made with
another key, outside +-WINDOW_S of its clock, or seen before (a nonce is remembered for the window), with
UNAUTHENTICATED and a message that says what to pass; its trailing metadata names the error class
(SwarmKeyRequired: no proof, SwarmKeyMismatch: another key, else Unauthenticated), so the caller can tell
why, and the server's on_refusal callback hears of each refusal (a daemon counts them: swarmd.node.diagnosis).
Without a key the swarm is public and nothing is checked. The key never travels; a proof is bound to one
method and usable once.
Also who a call is from, in any swarm: a daemon's PeerClient signs every call to a peer it knows (PeerClient.bind:
the peer id the callee's signed record places at that address) with its Ed25519 identity, in metadata
CALLER_HEADER: "v2.<peer id>.<callee peer id>.<unix ms>.<nonce>.<hex Ed25519 signature of
CALLER_DOMAIN|callee|method|ms|nonce>"; a call to an address it knows no peer id for carries none. The server's
CallerCheck turns it into the caller's verified peer id (swarmd.transport.limits keys budgets by it), or "" when
the call carries none, a malformed one (an older v1 proof, bound to no callee, among them), one signed for another
callee (logged, at most one line per REFUSAL_LOG_S, and counted), one for another method, one outside
+-WINDOW_S, one whose signature does not match the id, or one seen before: such a caller is unproven and is keyed
by its host, so a claimed id never spends another identity's budget, and a proof a callee received is worth
nothing at any other server. The signature check itself is injected (verify(peer_id, data, signature),
swarmd.membership.identity.verify): the transport never imports membership.
Pure Python + grpc; no torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc

from swarmd.errors import ConfigError, SwarmKeyMismatch, SwarmKeyRequired, Unauthenticated
from swarmd.transport.status import trailing_metadata

logger = logging.getLogger(__name__)

AUTH_HEADER = "x-blocktrain-swarm-proof"  # metadata key (lower case, as gRPC requires)
ENV_VAR = "BLOCKTRAIN_SWARM_KEY"  # a swarm key FILE, used wherever no key is passed explicitly
WINDOW_S = 60.0  # a proof is accepted this long either side of the server's clock
MAX_NONCES = 200_000  # proofs remembered against replay (oldest forgotten first)
KEY_BYTES = 32
_PREFIX = "blocktrain-swarm-key-v1:"
OPEN_SERVICES = ("/grpc.health.v1.Health/",)  # answered without a proof
DRAIN_MESSAGES, DRAIN_S = 64, 2.0  # a refused stream's messages read and dropped before the refusal
NO_PROOF = "no proof of the swarm key"  # ProofChecker.problem's reasons that name a class of their own
OTHER_KEY = "a proof made with another swarm key"
OnRefusal = Callable[[Unauthenticated], None]  # told of every call a SwarmKeyInterceptor refuses


def new_swarm_key() -> str:
    """The text of a new swarm key file (one line)."""
    return f"{_PREFIX}{secrets.token_hex(KEY_BYTES)}\n"


def parse_swarm_key(text: str, source: str = "the swarm key") -> bytes:
    """The key bytes of a swarm key file's text; ConfigError (one line) for anything else."""
    body = text.strip()
    if not body.startswith(_PREFIX):
        raise ConfigError(f"{source} is not a swarm key file (make one with `blocktrain keygen swarm-key FILE`)")
    try:
        key = bytes.fromhex(body.removeprefix(_PREFIX))
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ConfigError(f"{source} is damaged: expected {2 * KEY_BYTES} hex digits after the prefix")
    return key


def load_swarm_key(path: str | os.PathLike) -> bytes:
    """Read a swarm key file; ConfigError (one line) when it is missing, unreadable or not a key."""
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise ConfigError(f"cannot read the swarm key {path}: {exc.strerror or exc}") from None
    return parse_swarm_key(text, f"swarm key {path}")


def write_swarm_key(path: str | os.PathLike) -> None:
    """Create a new swarm key file (mode 0600); ConfigError if it exists already or cannot be written."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} exists already: a swarm key is never overwritten (remove it first)") from None
    except OSError as exc:
        raise ConfigError(f"cannot create {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(new_swarm_key())
        f.flush()
        os.fsync(f.fileno())


_default: bytes | None = None
_default_set = False


def use_swarm_key(key: bytes | None) -> None:
    """Make `key` the swarm key of every PeerClient created later in this process without one (CLI commands)."""
    global _default, _default_set
    _default, _default_set = key, True


def default_swarm_key() -> bytes | None:
    """The process-wide swarm key: use_swarm_key's, else the file BLOCKTRAIN_SWARM_KEY names, else None."""
    if _default_set:
        return _default
    path = os.environ.get(ENV_VAR, "")
    return load_swarm_key(path) if path else None


def _mac(key: bytes, stamp: str, nonce: str, method: str) -> str:
    return hmac.new(key, f"v1|{stamp}|{nonce}|{method}".encode(), hashlib.sha256).hexdigest()


def make_proof(key: bytes, method: str, now: float | None = None, nonce: str | None = None) -> str:
    """The proof a call of `method` ("/swarmd.v1.Swarm/GetStatus") carries in AUTH_HEADER."""
    stamp = str(int(1000 * (time.time() if now is None else now)))
    nonce = nonce or secrets.token_hex(12)
    return f"v1.{stamp}.{nonce}.{_mac(key, stamp, nonce, method)}"


class ProofChecker:
    """Checks proofs against one key: fresh (within window_s), for this method, made with the key, never seen."""

    def __init__(self, key: bytes, window_s: float = WINDOW_S, max_nonces: int = MAX_NONCES):
        self.key, self.window_s, self.max_nonces = key, window_s, max_nonces
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> stamp (seconds), oldest first

    def problem(self, method: str, proof: str | None, now: float | None = None) -> str:
        """Why a call must be refused ("" when its proof is good; the proof is then used up)."""
        if not proof:
            return NO_PROOF
        parts = proof.split(".")
        if len(parts) != 4 or parts[0] != "v1" or not parts[1].isdigit() or not 8 <= len(parts[2]) <= 64:
            return "a malformed proof of the swarm key"
        _, stamp, nonce, mac = parts
        now = time.time() if now is None else now
        when = int(stamp) / 1000
        if abs(now - when) > self.window_s:
            return f"a proof made {now - when:+.0f} s from now (allowed: +-{self.window_s:.0f} s; check the clocks)"
        if not hmac.compare_digest(mac, _mac(self.key, stamp, nonce, method)):
            return OTHER_KEY
        if nonce in self._seen:
            return "a replayed proof"
        self._seen[nonce] = when
        horizon = now - 2 * self.window_s
        while self._seen and (len(self._seen) > self.max_nonces or next(iter(self._seen.values())) < horizon):
            self._seen.popitem(last=False)
        return ""


def refusal(reason: str) -> str:
    return (
        f"this swarm is private and the call carried {reason}: "
        f"pass --swarm-key FILE (or set {ENV_VAR}=FILE) with the swarm's key"
    )


def refusal_error(reason: str) -> Unauthenticated:
    """The error a call refused for `reason` (ProofChecker.problem) ends with: SwarmKeyRequired for no proof,
    SwarmKeyMismatch for another key, Unauthenticated for the rest (stale, replayed, malformed)."""
    cls = {NO_PROOF: SwarmKeyRequired, OTHER_KEY: SwarmKeyMismatch}.get(reason, Unauthenticated)
    return cls(refusal(reason))


class SwarmKeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call but health checks without a valid proof of the swarm key (UNAUTHENTICATED).

    :param on_refusal: called with the error of every call refused (on the server's loop)
    """

    def __init__(self, key: bytes, window_s: float = WINDOW_S, on_refusal: OnRefusal | None = None):
        self.checker = ProofChecker(key, window_s)
        self.on_refusal = on_refusal

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(OPEN_SERVICES):
            return await continuation(handler_call_details)
        proof = next((v for k, v in handler_call_details.invocation_metadata or () if k == AUTH_HEADER), None)
        if isinstance(proof, bytes):
            proof = proof.decode("ascii", "replace")
        reason = self.checker.problem(method, proof)
        handler = await continuation(handler_call_details)
        if not reason or handler is None:
            return handler
        error = refusal_error(reason)
        if self.on_refusal is not None:
            self.on_refusal(error)
        return _refusing(handler, error)


def _refusing(handler: grpc.RpcMethodHandler, error: Unauthenticated) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that aborts with UNAUTHENTICATED (naming the error's class in the
    trailing metadata) before reading anything."""
    message, metadata = str(error), trailing_metadata(error)

    async def abort(_request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message, metadata)

    async def abort_stream(request, context):  # a streaming answer is an async generator in grpc.aio
        if hasattr(request, "__aiter__"):
            # aborting while the caller still writes its stream reaches it as INTERNAL ("Internal error from
            # Core"), not UNAUTHENTICATED: drain (and drop) what it sends, at most DRAIN_MESSAGES or DRAIN_S
            with contextlib.suppress(Exception):
                async with asyncio.timeout(DRAIN_S):
                    n = 0
                    async for _ in request:
                        n += 1
                        if n >= DRAIN_MESSAGES:
                            break
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message, metadata)
        yield  # never reached

    args = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(abort, **args)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(abort_stream, **args)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(abort, **args)
    return grpc.stream_stream_rpc_method_handler(abort_stream, **args)


def server_interceptors(key: bytes | None, on_refusal: OnRefusal | None = None) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors a server of a swarm with this key runs (none for a public swarm)."""
    return [SwarmKeyInterceptor(key, on_refusal=on_refusal)] if key is not None else []


def proof_metadata(key: bytes | None, method: str) -> tuple[tuple[str, str], ...] | None:
    """Call metadata carrying a fresh proof for `method` (None without a key: a public swarm)."""
    if key is None:
        return None
    return ((AUTH_HEADER, make_proof(key, method)),)


# -- who a call is from -------------------------------------------------------------------------------------------
CALLER_HEADER = "x-blocktrain-caller"  # metadata key of a call's identity proof
CALLER_VERSION = "v2"  # the proof's first field; v2 binds it to its callee (a v1 proof, bound to none, is refused)
CALLER_DOMAIN = "blocktrain-caller-v2"  # what a caller signs starts with this tag (no other signed bytes do)
REFUSAL_LOG_S = 10.0  # proofs signed for another callee: one log line per this many seconds, with how many
Verify = Callable[[str, bytes, bytes], bool]  # (peer_id, data, signature) -> whether that peer's key signed data
OnProofRefused = Callable[[str], None]  # told the reason word ("other_callee") of each proof a CallerCheck refuses


class CallSigner(Protocol):
    """What signs a PeerClient's calls: a peer's identity (swarmd.membership.identity.Identity is one)."""

    @property
    def peer_id(self) -> str: ...

    def sign(self, data: bytes) -> bytes: ...


def caller_bytes(callee: str, method: str, stamp: str, nonce: str) -> bytes:
    """The bytes a caller signs for one call of `method` ("/swarmd.v1.Swarm/GetStatus") to the peer `callee`."""
    return f"{CALLER_DOMAIN}|{callee}|{method}|{stamp}|{nonce}".encode()


def make_caller_proof(
    signer: CallSigner, callee: str, method: str, now: float | None = None, nonce: str | None = None
) -> str:
    """The identity proof a call of `method` to the peer `callee` (its peer id) carries in CALLER_HEADER."""
    stamp = str(int(1000 * (time.time() if now is None else now)))
    nonce = nonce or secrets.token_hex(12)
    signature = signer.sign(caller_bytes(callee, method, stamp, nonce)).hex()
    return f"{CALLER_VERSION}.{signer.peer_id}.{callee}.{stamp}.{nonce}.{signature}"


class CallerCheck:
    """The verified peer id of a call to the peer `callee`: its proof fresh (within window_s), signed for this
    callee and this method by the key its peer id names, never seen before; "" for anything else (the caller is
    then keyed by its host).

    :param verify: the signature check, verify(peer_id, data, signature) (swarmd.membership.identity.verify)
    :param callee: the peer id of the server that checks (a daemon's own); a proof signed for another is refused
    :param on_refused: told "other_callee" for each proof signed for another callee (a daemon counts them)
    """

    def __init__(
        self,
        verify: Verify,
        callee: str,
        window_s: float = WINDOW_S,
        max_nonces: int = MAX_NONCES,
        on_refused: OnProofRefused | None = None,
    ):
        self.verify, self.callee, self.window_s, self.max_nonces = verify, callee, window_s, max_nonces
        self.on_refused = on_refused
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> stamp (seconds), oldest first
        self.unproven = 0  # calls that carried a proof that did not hold (other_callee ones included)
        self.other_callee = 0  # ... of them, proofs signed for another callee (replayed from it, or a stale address)
        self._logged = (0, float("-inf"))  # (other_callee when last logged, monotonic time of that line)

    def peer_id(self, method: str, proof: str | bytes | None, now: float | None = None) -> str:
        """The peer id `proof` proves for a call of `method`, or "" (no proof, or one that does not hold)."""
        if not proof:
            return ""
        if isinstance(proof, bytes):
            proof = proof.decode("ascii", "replace")
        parts = proof.split(".")
        if len(parts) != 6 or parts[0] != CALLER_VERSION or not parts[3].isdigit() or not 8 <= len(parts[4]) <= 64:
            self.unproven += 1
            return ""
        _, peer_id, callee, stamp, nonce, signature = parts
        if callee != self.callee:
            self._other_callee(peer_id, callee)
            return ""
        now = time.time() if now is None else now
        when = int(stamp) / 1000
        try:
            sig = bytes.fromhex(signature)
        except ValueError:
            sig = b""
        fresh = abs(now - when) <= self.window_s and nonce not in self._seen
        if not fresh or not sig or not self.verify(peer_id, caller_bytes(callee, method, stamp, nonce), sig):
            self.unproven += 1
            return ""
        self._seen[nonce] = when
        horizon = now - 2 * self.window_s
        while self._seen and (len(self._seen) > self.max_nonces or next(iter(self._seen.values())) < horizon):
            self._seen.popitem(last=False)
        return peer_id

    def _other_callee(self, caller: str, callee: str) -> None:
        """Count a proof signed for another callee; log it (the first at once, then one line per REFUSAL_LOG_S)."""
        self.unproven += 1
        self.other_callee += 1
        if self.on_refused is not None:
            self.on_refused("other_callee")
        count, at = self._logged
        now = time.monotonic()
        if now - at >= REFUSAL_LOG_S:
            more = self.other_callee - count - 1
            logger.info(
                "refused a call proof of %s signed for another callee (%s, not this peer %s): the caller is unproven%s",
                caller[-6:] or "?",
                callee[-6:] or "none",
                self.callee[-6:],
                f" (and {more} more since the last line)" if more else "",
            )
            self._logged = (self.other_callee, now)

    def of(self, method: str, metadata) -> str:
        """The verified peer id of a call with these invocation metadata (grpc's (key, value) pairs), or ""."""
        return self.peer_id(method, _caller_proof(metadata))

    @staticmethod
    def claimed(metadata) -> str:
        """The peer id a call's proof names, NOT verified ("" without a proof): only to refuse a call early (the
        identity it claims is over its budget), never to spend a budget."""
        proof = _caller_proof(metadata)
        if isinstance(proof, bytes):
            proof = proof.decode("ascii", "replace")
        return proof.split(".", 2)[1] if proof and proof.count(".") >= 2 else ""


def _caller_proof(metadata) -> str | bytes | None:
    return next((v for k, v in metadata or () if k == CALLER_HEADER), None)


def call_metadata(
    key: bytes | None, signer: CallSigner | None, method: str, callee: str = ""
) -> tuple[tuple[str, str], ...] | None:
    """Metadata of one call of `method` to the peer `callee`: a fresh proof of the swarm key (private swarms) and
    of the caller's identity (a PeerClient with a signer, to a callee whose peer id it knows; "" = unknown: no
    identity proof, the caller is keyed by its host there); None when it carries neither."""
    entries = proof_metadata(key, method) or ()
    if signer is not None and callee:
        entries = (*entries, (CALLER_HEADER, make_caller_proof(signer, callee, method)))
    return entries or None
