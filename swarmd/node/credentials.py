"""Who a peer is and how it proves it, from its config: the files a daemon loads its credentials from.

Owns where each credential comes from, not the cryptography (swarmd.membership.identity signs,
swarmd.transport.auth / tls check keys and certificates):
  load_identity     the Ed25519 identity records and payloads are signed with: --identity FILE, else
                    identity.key in the checkpoint dir (created on first start), else a new one per run;
  libp2p_key_path   the DHT node's libp2p key file in the checkpoint dir (LIBP2P_KEY_FILE, written by hivemind);
  load_swarm_key    a private swarm's key: --swarm-key FILE, else the process default (None: public swarm);
  load_tls          the gRPC server's (certificate, key) PEM (None: plaintext), and tls_fingerprint, what the
                    signed record pins of it.
A restarted peer with the same checkpoint dir keeps both its peer id and its DHT peer id.
"""

from __future__ import annotations

from pathlib import Path

from swarmd.membership.identity import Identity, identity_path
from swarmd.node.config import NetConfig
from swarmd.transport import auth, tls

LIBP2P_KEY_FILE = "peer.key"  # the libp2p private key in a checkpoint dir (written by hivemind, mode 0400)


def load_identity(identity: str, checkpoint_dir: str) -> Identity:
    """This peer's Ed25519 identity: the `identity` file, else identity.key in the checkpoint dir (created on first
    start, so a restarted peer keeps its peer id), else a new one for this run."""
    path = identity_path(identity, checkpoint_dir)
    return Identity.load_or_create(path) if path else Identity.generate()


def libp2p_key_path(checkpoint_dir: str) -> str:
    """The file of this peer's libp2p key, in the checkpoint dir (created): a restart keeps the DHT peer id
    ("" = none, a new id every start)."""
    if not checkpoint_dir:
        return ""
    directory = Path(checkpoint_dir)
    directory.mkdir(parents=True, exist_ok=True)
    return str(directory / LIBP2P_KEY_FILE)


def load_swarm_key(net: NetConfig) -> bytes | None:
    """The key every RPC of a private swarm proves: net.swarm_key's file, else the process default (None: public)."""
    return auth.load_swarm_key(net.swarm_key) if net.swarm_key else auth.default_swarm_key()


def load_tls(net: NetConfig) -> tuple[bytes, bytes] | None:
    """(certificate PEM, private key PEM) the gRPC server serves TLS with (None: plaintext)."""
    return tls.load_tls(net.tls_cert, net.tls_key) if net.tls_cert else None


def tls_fingerprint(pair: tuple[bytes, bytes] | None, serving: bool) -> str:
    """What the signed record pins: the sha256 of the certificate a running gRPC server serves ("" = no TLS)."""
    return tls.fingerprint(pair[0]) if pair is not None and serving else ""
