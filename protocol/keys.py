"""Key files: a participant's Ethereum key on disk (JSON, mode 0600, written atomically)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount


class KeyFileError(ValueError):
    pass


def load_key(path: Path) -> LocalAccount:
    try:
        data = json.loads(Path(path).read_text())
        return Account.from_key(data["private_key"])
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KeyFileError(f"{path} is not a valid key file: {exc}") from exc


def write_key(path: Path, account: LocalAccount) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"address": account.address, "private_key": account.key.hex()})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".key-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_or_create_key(path: Path) -> LocalAccount:
    try:
        return load_key(path)
    except FileNotFoundError:
        account = Account.create()
        write_key(path, account)
        return account
