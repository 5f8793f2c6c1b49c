"""`blocktrain keygen swarm-key FILE` / `keygen identity FILE` / `keygen tls FILE.crt FILE.key`: make keys.

Thin: the files are written by swarmd.transport.auth (a swarm key: 32 random bytes, mode 0600, never
overwritten), swarmd.membership.identity (an Ed25519 peer identity; its peer id is printed) and
swarmd.transport.tls (a self-signed certificate whose fingerprint a peer's signed record pins).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import cli_errors
from swarmd.errors import ConfigError

app = typer.Typer(help="Make a swarm key, a peer identity or a TLS certificate.", no_args_is_help=True)


@app.command("swarm-key")
def swarm_key(path: Annotated[Path, typer.Argument(help="File to create (mode 0600).")]) -> None:
    """A new private swarm key: give the file to every member (--swarm-key FILE or BLOCKTRAIN_SWARM_KEY=FILE)."""
    from swarmd.transport.auth import write_swarm_key

    with cli_errors():
        write_swarm_key(path)
    typer.echo(f"swarm key: {path}")


@app.command("identity")
def identity(path: Annotated[Path, typer.Argument(help="File to create (mode 0600).")]) -> None:
    """A new Ed25519 peer identity (--identity FILE); prints its peer id."""
    from swarmd.membership.identity import Identity

    with cli_errors():
        if path.exists():
            raise ConfigError(f"{path} exists already: an identity is never overwritten (remove it first)")
        typer.echo(f"peer: {Identity.load_or_create(path).peer_id}")


@app.command("tls")
def tls(
    cert: Annotated[Path, typer.Argument(help="Certificate file to create (PEM).")],
    key: Annotated[Path, typer.Argument(help="Private key file to create (PEM, mode 0600).")],
) -> None:
    """A self-signed TLS certificate for --tls-cert/--tls-key; prints the fingerprint peers pin."""
    import os

    from swarmd.transport.tls import fingerprint, make_self_signed

    with cli_errors():
        for p in (cert, key):
            if p.exists():
                raise ConfigError(f"{p} exists already (remove it first)")
        cert_pem, key_pem = make_self_signed()
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        cert.write_bytes(cert_pem)
    typer.echo(f"certificate: {cert}\nfingerprint: {fingerprint(cert_pem)}")
