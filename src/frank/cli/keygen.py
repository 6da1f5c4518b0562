"""``frank keygen``: an ECDSA P-256 key pair for ``frank attest`` and ``frank verify``.

The pair goes to frank's config folder by default (``$XDG_CONFIG_HOME/frank``, else
``~/.config/frank``), where ``attest`` and ``verify`` look when given no key. A private key
is never written inside a git work tree unless ``--in-repo`` says so: one ``git add -A``
would publish it. The key itself is never printed.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from frank.cli.output import emit_json, json_option

KEY_NAME = "frank.key"


def config_dir() -> Path:
    """frank's config folder: ``$XDG_CONFIG_HOME/frank``, else ``~/.config/frank``."""
    from frank.ship.attest.dsse import config_dir as where

    return where()


def default_key() -> Path:
    """Where ``frank keygen`` writes the private key when not told (the .pub beside it)."""
    return config_dir() / KEY_NAME


def _work_tree(path: Path) -> Path | None:
    """The git work tree holding ``path`` (a folder with ``.git`` up from it), or None."""
    for folder in [path, *path.parents]:
        if (folder / ".git").exists():
            return folder
    return None


@click.command()
@click.option("--out", "out", type=click.Path(path_type=Path), default=None,
              help="Private key file (PKCS#8 PEM, mode 0600; default: "
                   "$XDG_CONFIG_HOME/frank/frank.key); the public key goes beside it (.pub).")
@click.option("--in-repo", "in_repo", is_flag=True,
              help="Allow writing the private key inside a git work tree.")
@click.option("--password-env", "password_env", default=None, metavar="VAR",
              help="Encrypt the private key with the passphrase in this variable.")
@json_option
def keygen(out: Path | None, in_repo: bool, password_env: str | None, as_json: bool) -> None:
    """Write a new signing key pair: OUT (private) and OUT with .pub (public)."""
    from frank.errors import FrankError
    from frank.ship.attest.dsse import keygen as make

    out = (out or default_key()).expanduser().absolute()
    tree = _work_tree(out.parent)
    if tree is not None and not in_repo:
        raise FrankError(f"refusing to write a private key inside the git work tree {tree} "
                         "(one `git add` would publish it): leave out --out for frank's "
                         "config folder, or pass --in-repo", field="--out")
    password = None
    if password_env is not None:
        password = os.environ.get(password_env)
        if not password:
            raise FrankError(f"${password_env} is empty or unset", field="--password-env")
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    public = out.with_suffix(".pub")
    kid = make(out, public, password=password)
    if as_json:
        emit_json({"private": str(out), "public": str(public), "keyid": kid})
        return
    click.echo(f"private key {out} (keep it), public key {public}: {kid}")
