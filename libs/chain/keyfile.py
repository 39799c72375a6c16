"""Key files: a JSON holding one private key, mode 0600, created once and atomically.

Workers and operators keep their identity in one of these (`--key-file`); the same file must
yield the same address on every start, so creation never overwrites an existing file.
"""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from .errors import KeyFileError
from .files import create_exclusive

log = logging.getLogger(__name__)

__all__ = ["KeyFileError", "load_key", "load_or_create_key"]


def load_key(path: str | Path) -> LocalAccount:
    path = Path(path)
    try:
        mode = path.stat().st_mode
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise KeyFileError(f"key file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc}") from None
    except json.JSONDecodeError:
        # The message must not quote the content: it may be a key.
        raise KeyFileError(f"key file {path} is not valid JSON") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("key file %s is accessible by other users (mode %o)", path, mode & 0o777)
    if not isinstance(data, dict) or not isinstance(data.get("private_key"), str):
        raise KeyFileError(f"key file {path} has no 'private_key' string")
    try:
        account: LocalAccount = Account.from_key(data["private_key"])
    except (ValueError, TypeError):
        raise KeyFileError(f"key file {path} holds an invalid private key") from None
    recorded = data.get("address")
    if recorded and str(recorded).lower() != account.address.lower():
        raise KeyFileError(
            f"key file {path} names address {recorded} but its key is {account.address}"
        )
    return account


def load_or_create_key(path: str | Path) -> LocalAccount:
    """The account in `path`, creating a fresh random key there first if there is none."""
    path = Path(path)
    if not path.exists():
        account: LocalAccount = Account.create()
        text = json.dumps(
            {"address": account.address, "private_key": account.key.to_0x_hex()}, indent=2
        )
        if create_exclusive(path, text + "\n", mode=0o600):
            return account
        # Another process created it between our check and our link: use theirs.
    return load_key(path)
