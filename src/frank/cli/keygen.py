"""``frank keygen``: an ECDSA P-256 key pair for ``frank attest`` and ``frank verify``."""

from __future__ import annotations

import os
from pathlib import Path

import click

from frank.cli.output import emit_json, json_option


@click.command()
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("frank.key"),
              show_default=True, help="Private key file (PKCS#8 PEM, mode 0600); the public "
                                      "key goes beside it with .pub.")
@click.option("--password-env", "password_env", default=None, metavar="VAR",
              help="Encrypt the private key with the passphrase in this variable.")
@json_option
def keygen(out: Path, password_env: str | None, as_json: bool) -> None:
    """Write a new signing key pair: OUT (private) and OUT with .pub (public)."""
    from frank.errors import FrankError
    from frank.ship.attest.dsse import keygen as make

    password = None
    if password_env is not None:
        password = os.environ.get(password_env)
        if not password:
            raise FrankError(f"${password_env} is empty or unset", field="--password-env")
    public = out.with_suffix(".pub")
    kid = make(out, public, password=password)
    if as_json:
        emit_json({"private": str(out), "public": str(public), "keyid": kid})
        return
    click.echo(f"private key {out} (keep it), public key {public}: {kid}")
