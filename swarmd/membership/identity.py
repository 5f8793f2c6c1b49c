"""Peer identity: an Ed25519 key pair kept in a file, the peer id derived from its public key, signatures.

Owns the key file (created on first start, atomically, mode 0600; a restarted peer loads it and keeps
its peer id), the peer id format and sign / verify. A peer id is the libp2p form of an Ed25519 public
key: base58btc of the identity multihash of the protobuf-encoded key ("12D3KooW..."), so anyone holding
a peer id holds the key that must have signed what that peer sends: verify() needs nothing else.
(The hivemind DHT node keeps its own libp2p RSA key, peer.key; its id only routes DHT traffic.)
Pure: `cryptography` only; no torch, grpc or hivemind.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from swarmd.errors import ConfigError

logger = logging.getLogger(__name__)

IDENTITY_FILE = "identity.key"  # the Ed25519 private key in a checkpoint dir (PEM, PKCS#8, mode 0600)
_PREFIX = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])  # identity multihash, 36 bytes: PublicKey{Ed25519, 32 bytes}
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def _b58encode(data: bytes) -> str:
    n, out = int.from_bytes(data, "big"), ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def _b58decode(text: str) -> bytes:
    n = 0
    for c in text:
        i = _B58.find(c)
        if i < 0:
            raise ValueError(f"not base58: {c!r}")
        n = n * 58 + i
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return b"\0" * (len(text) - len(text.lstrip("1"))) + body


def peer_id_of(public_key: bytes) -> str:
    """The peer id of a raw 32-byte Ed25519 public key."""
    if len(public_key) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, got {len(public_key)}")
    return _b58encode(_PREFIX + public_key)


def public_key_of(peer_id: str) -> bytes:
    """The raw Ed25519 public key a peer id names; ValueError for anything that is not such an id."""
    if not isinstance(peer_id, str) or not 40 <= len(peer_id) <= 60:
        raise ValueError("not an Ed25519 peer id")
    raw = _b58decode(peer_id)
    if len(raw) != len(_PREFIX) + 32 or not raw.startswith(_PREFIX):
        raise ValueError("not an Ed25519 peer id")
    return raw[len(_PREFIX) :]


def verify(peer_id: str, data: bytes, signature: bytes) -> bool:
    """Whether `signature` is the Ed25519 signature of `data` by the key `peer_id` names."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key_of(peer_id)).verify(bytes(signature), data)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


class Identity:
    """One peer's Ed25519 key pair: `.peer_id`, `.public_key` (32 raw bytes), `.sign(data)`."""

    def __init__(self, private_key: Ed25519PrivateKey):
        self._key = private_key
        self.public_key = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.peer_id = peer_id_of(self.public_key)

    @classmethod
    def generate(cls, seed: bytes | None = None) -> Identity:
        """A new key pair (from a 32-byte seed: deterministic, for tests)."""
        return cls(Ed25519PrivateKey.from_private_bytes(seed) if seed is not None else Ed25519PrivateKey.generate())

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def to_pem(self) -> bytes:
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @classmethod
    def from_pem(cls, data: bytes, source: str = "the identity file") -> Identity:
        """Parse a PEM key; ConfigError (one line) for anything that is not an unencrypted Ed25519 key."""
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            reason = " ".join(str(exc).split())[:120] or type(exc).__name__
            raise ConfigError(
                f"{source} is not a readable Ed25519 private key ({reason}); "
                "move it away to create a new identity (a new peer id), or pass another --identity"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{source} holds a {type(key).__name__}, not an Ed25519 private key")
        return cls(key)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike) -> Identity:
        """The identity in `path`, created (atomically, mode 0600) when the file does not exist yet.

        Two processes creating the same file at once end with one key: the file appears by a hard
        link of a complete temporary file, which fails if another process got there first.
        :raises ConfigError: the file exists but holds no Ed25519 key, or cannot be read or written
        """
        path = Path(path)
        try:
            return cls._load(path)
        except FileNotFoundError:
            pass
        identity = cls.generate()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(identity.to_pem())
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:  # another process created it meanwhile: use theirs
                return cls._load(path)
            logger.info("created a new peer identity %s in %s", identity.peer_id, path)
            return identity
        except OSError as exc:
            raise ConfigError(f"cannot create the identity file {path}: {exc.strerror or exc}") from None
        finally:
            with contextlib.suppress(OSError):
                os.remove(tmp)

    @classmethod
    def _load(cls, path: Path) -> Identity:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise ConfigError(f"cannot read the identity file {path}: {exc.strerror or exc}") from None
        if path.stat().st_mode & 0o077:
            logger.warning("identity file %s is readable by other users; chmod 600 it", path)
        return cls.from_pem(data, f"identity file {path}")


def identity_path(identity: str, checkpoint_dir: str) -> str:
    """Where a peer keeps its identity: --identity FILE, else the checkpoint dir ("" = a new one each start)."""
    if identity:
        return identity
    return str(Path(checkpoint_dir) / IDENTITY_FILE) if checkpoint_dir else ""
