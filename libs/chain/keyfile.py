"""Key files: the one place a participant's Ethereum key is read from or written to disk.

Two formats, told apart by their content:
- an encrypted keystore (Web3 Secret Storage v3, scrypt; what geth, foundry and MetaMask export)
  for keys that hold value - a contributor's stake and rewards. Its passphrase comes from the
  caller (a prompt, or an environment variable), never from this module;
- a plain JSON `{"address", "private_key"}` for service keys the operator's own secret store
  protects (docker secrets, Kubernetes secrets, the local network's run folder).

Every file is mode 0600 and created exclusively: a key file is an identity, and the same file
must yield the same address on every start, so nothing here ever overwrites one.
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

__all__ = [
    "KeyFileError",
    "create_key",
    "import_key",
    "is_encrypted",
    "load_key",
    "load_or_create_key",
    "write_key",
]

# Largest key file read: a keystore is ~500 bytes; anything far bigger is not one.
MAX_KEY_FILE_BYTES = 64 * 1024


def _read(path: Path) -> dict:
    try:
        mode = path.stat().st_mode
        if path.stat().st_size > MAX_KEY_FILE_BYTES:
            raise KeyFileError(f"key file {path} is over {MAX_KEY_FILE_BYTES} bytes: not a key")
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
    if not isinstance(data, dict):
        raise KeyFileError(f"key file {path} is not a JSON object")
    return data


def is_encrypted(path: str | Path) -> bool:
    """True for a keystore (needs a passphrase), False for a plain key file."""
    return _is_keystore(_read(Path(path)))


def _is_keystore(data: dict) -> bool:
    return "crypto" in data or "Crypto" in data  # v3 spells it either way


def load_key(path: str | Path, passphrase: str | None = None) -> LocalAccount:
    """The account in `path`; a keystore needs `passphrase`."""
    path = Path(path)
    data = _read(path)
    if _is_keystore(data):
        if passphrase is None:
            raise KeyFileError(f"key file {path} is encrypted and no passphrase was given")
        try:
            key = Account.decrypt(data, passphrase)
        except ValueError as exc:
            if "MAC mismatch" in str(exc):
                raise KeyFileError(f"wrong passphrase for key file {path}") from None
            raise KeyFileError(f"key file {path} is not a valid keystore: {exc}") from None
        except (KeyError, TypeError):
            raise KeyFileError(f"key file {path} is not a valid keystore") from None
    elif isinstance(data.get("private_key"), str):
        key = data["private_key"]
    else:
        raise KeyFileError(f"key file {path} holds neither a keystore nor a 'private_key'")
    try:
        account: LocalAccount = Account.from_key(key)
    except (ValueError, TypeError):
        raise KeyFileError(f"key file {path} holds an invalid private key") from None
    recorded = data.get("address")
    if recorded and str(recorded).lower().removeprefix("0x") != account.address.lower()[2:]:
        raise KeyFileError(
            f"key file {path} names address {recorded} but its key is {account.address}"
        )
    return account


def _encode(account: LocalAccount, passphrase: str | None, scrypt_n: int | None) -> str:
    if passphrase is None:
        return json.dumps({"address": account.address, "private_key": account.key.to_0x_hex()})
    if not passphrase:
        raise KeyFileError("an empty passphrase protects nothing; choose one")
    keystore = Account.encrypt(account.key, passphrase, kdf="scrypt", iterations=scrypt_n)
    return json.dumps(keystore)


def write_key(
    path: str | Path,
    account: LocalAccount,
    passphrase: str | None = None,
    scrypt_n: int | None = None,
) -> None:
    """Write `account` to a new file at `path` (encrypted when a passphrase is given); refuses
    to replace an existing file. `scrypt_n` lowers the KDF cost, for tests only."""
    path = Path(path)
    if not create_exclusive(path, _encode(account, passphrase, scrypt_n) + "\n", mode=0o600):
        raise KeyFileError(f"key file {path} already exists; it is never overwritten")


def create_key(
    path: str | Path, passphrase: str | None = None, scrypt_n: int | None = None
) -> LocalAccount:
    """A fresh random key, written to `path`."""
    account: LocalAccount = Account.create()
    write_key(path, account, passphrase, scrypt_n)
    return account


def import_key(
    path: str | Path, private_key: str, passphrase: str | None = None, scrypt_n: int | None = None
) -> LocalAccount:
    """An existing private key (hex), written to `path`."""
    try:
        account: LocalAccount = Account.from_key(private_key.strip())
    except (ValueError, TypeError):
        raise KeyFileError("the key to import is not a 32-byte hex private key") from None
    write_key(path, account, passphrase, scrypt_n)
    return account


def load_or_create_key(path: str | Path, passphrase: str | None = None) -> LocalAccount:
    """The account in `path`, creating a fresh key there first if there is none. When two
    processes race to create it, both end up with the one that was written first."""
    path = Path(path)
    if not path.exists():
        try:
            return create_key(path, passphrase)
        except KeyFileError:
            if not path.exists():
                raise
    return load_key(path, passphrase)
