"""Optional TLS for the gRPC server and the channels to it, with the certificate pinned by fingerprint.

Owns: reading a --tls-cert/--tls-key pair (PEM), the certificate fingerprint (sha256 of its DER bytes,
hex) that a peer publishes in its signed discovery record, adding a TLS or plaintext listening port, a
self-signed certificate for a peer (make_self_signed), and fetching a peer's certificate to pin it: a
client dials TLS with exactly that certificate as its only trust root (and its name as the target
name), after checking that the certificate the peer presents hashes to the fingerprint its signed
record names. A man in the middle would need the peer's private key. No torch.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ssl
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from swarmd.errors import ConfigError, PeerUnavailable, ValidationError


def load_tls(cert_path: str, key_path: str) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) from files; ConfigError (one line) when unreadable or not PEM."""
    out = []
    for what, path in (("certificate", cert_path), ("key", key_path)):
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the TLS {what} {path}: {exc.strerror or exc}") from None
        if b"-----BEGIN" not in data:
            raise ConfigError(f"the TLS {what} {path} is not PEM")
        out.append(data)
    fingerprint(out[0])  # a certificate that does not parse fails here, with its name
    return out[0], out[1]


def fingerprint(cert_pem: bytes) -> str:
    """sha256 (hex) of a certificate's DER bytes: what a signed record pins."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise ConfigError(f"not a PEM certificate: {exc}") from None
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def cert_name(cert_pem: bytes) -> str:
    """The name a client checks the certificate against: its first DNS SAN, else its common name."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
    except x509.ExtensionNotFound:
        names = []
    if names:
        return str(names[0])
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cn[0].value) if cn else ""


def add_port(server: grpc.aio.Server, address: str, tls: tuple[bytes, bytes] | None) -> int:
    """Listen on address, TLS only when `tls` = (cert PEM, key PEM) is given; returns the bound port (0: failed)."""
    if tls is None:
        return server.add_insecure_port(address)
    cert, key = tls
    return server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))


def make_self_signed(name: str = "blocktrain-peer", days: int = 3650) -> tuple[bytes, bytes]:
    """A new self-signed certificate for `name` (DNS SAN) and its key: (cert PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


async def fetch_pinned_cert(address: str, expected: str, timeout_s: float = 5.0) -> bytes:
    """The PEM certificate the peer at host:port presents, checked against the fingerprint `expected`.

    :raises PeerUnavailable: nothing answers TLS there; ValidationError: another certificate
    """
    host, _, port = address.rpartition(":")
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # we check the exact certificate below
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port), ssl=ctx)
    except (OSError, TimeoutError, ValueError) as exc:
        raise PeerUnavailable(f"peer {address}: no TLS answer to fetch its certificate ({exc})") from None
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    if not der or hashlib.sha256(der).hexdigest() != expected:
        raise ValidationError(f"peer {address} presents a certificate that its signed record does not name")
    return ssl.DER_cert_to_PEM_cert(der).encode()


def pinned_credentials(cert_pem: bytes) -> tuple[grpc.ChannelCredentials, list[tuple[str, str]]]:
    """Channel credentials that trust only `cert_pem`, and the option naming the name it is checked against."""
    return grpc.ssl_channel_credentials(root_certificates=cert_pem), [
        ("grpc.ssl_target_name_override", cert_name(cert_pem))
    ]
