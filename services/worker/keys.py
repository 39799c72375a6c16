"""The contributor's key: an encrypted keystore, unlocked by a passphrase from the environment or
a prompt. The passphrase never travels as a flag: flags land in shell history and `ps`."""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path

from eth_account.signers.local import LocalAccount

from prime_swarm.libs.chain.keyfile import (
    KeyFileError,
    create_key,
    import_key,
    is_encrypted,
    load_key,
)

PASSPHRASE_ENV = "PRIME_WORKER_PASSPHRASE"


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stderr.isatty()


def _passphrase(path: Path, confirm: bool) -> str:
    if (value := os.environ.get(PASSPHRASE_ENV)) is not None:
        return value
    if not _interactive():
        raise KeyFileError(
            f"key file {path} needs a passphrase: set {PASSPHRASE_ENV}, or run in a terminal"
        )
    first = getpass.getpass(f"passphrase for {path}: ")
    if confirm and getpass.getpass("again: ") != first:
        raise KeyFileError("the two passphrases differ; nothing was written")
    return first


def open_key(path: Path) -> LocalAccount:
    """The key in `path`; a missing file gets a fresh key, encrypted with a new passphrase."""
    if not path.exists():
        return create_key(path, _passphrase(path, confirm=True))
    return load_key(path, _passphrase(path, confirm=False) if is_encrypted(path) else None)


def import_existing(path: Path) -> LocalAccount:
    """Write a private key read from stdin (hidden when a terminal) into a new keystore."""
    if path.exists():
        raise KeyFileError(f"key file {path} already exists; choose another --key-file")
    if _interactive():
        secret = getpass.getpass("private key (hex, not shown): ")
    else:
        secret = sys.stdin.readline()
    return import_key(path, secret, _passphrase(path, confirm=True))
