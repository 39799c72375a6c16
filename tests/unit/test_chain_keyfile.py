"""Key files: created once with mode 0600, reloaded to the same account, never overwritten."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

import pytest
from eth_account import Account

from prime_swarm.libs.chain.errors import KeyFileError
from prime_swarm.libs.chain.keyfile import (
    create_key,
    import_key,
    is_encrypted,
    load_key,
    load_or_create_key,
)


def test_created_once_with_private_mode(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "worker.json"
    account = load_or_create_key(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["address"] == account.address
    assert load_or_create_key(path).address == account.address
    assert load_key(path).key == account.key
    assert [p.name for p in path.parent.iterdir()] == ["worker.json"]  # no temp files left


def test_concurrent_creators_agree_on_one_key(tmp_path: Path) -> None:
    path = tmp_path / "shared.json"
    addresses: list[str] = []
    threads = [
        threading.Thread(target=lambda: addresses.append(load_or_create_key(path).address))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(addresses)) == 1
    assert addresses[0] == load_key(path).address


def test_existing_key_is_loaded(tmp_path: Path) -> None:
    account = Account.create()
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"private_key": account.key.to_0x_hex()}))
    assert load_or_create_key(path).address == account.address


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{oops", "is not valid JSON"),
        ('{"address": "0x0"}', "neither a keystore nor a 'private_key'"),
        ("[1, 2]", "not a JSON object"),
        ('{"private_key": "0x1234"}', "invalid private key"),
        (
            json.dumps({"private_key": "0x" + "11" * 32, "address": "0x" + "22" * 20}),
            "names address",
        ),
    ],
)
def test_unusable_files_are_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(KeyFileError, match=message) as err:
        load_or_create_key(path)
    assert "1111" not in str(err.value)  # a key never leaks into an error message
    assert path.read_text() == content  # and a bad file is never replaced


def test_missing_file_for_load_key(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="does not exist"):
        load_key(tmp_path / "none.json")


# A cheap scrypt (n = 2**4) keeps these tests fast; the format is the same as the default's.
CHEAP = 16


def test_keystore_round_trip_needs_the_passphrase(tmp_path: Path) -> None:
    path = tmp_path / "worker.json"
    account = create_key(path, "correct horse", scrypt_n=CHEAP)
    assert is_encrypted(path) and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert account.key.hex()[2:10] not in path.read_text()  # the key is not stored in the clear
    assert json.loads(path.read_text())["crypto"]["kdf"] == "scrypt"
    assert load_key(path, "correct horse").address == account.address
    with pytest.raises(KeyFileError, match="no passphrase"):
        load_key(path)
    with pytest.raises(KeyFileError, match="wrong passphrase"):
        load_key(path, "wrong")


def test_import_keeps_the_address_and_never_overwrites(tmp_path: Path) -> None:
    account = Account.create()
    path = tmp_path / "imported.json"
    assert import_key(path, account.key.to_0x_hex(), "pw", scrypt_n=CHEAP).address == (
        account.address
    )
    assert load_key(path, "pw").key == account.key
    with pytest.raises(KeyFileError, match="already exists"):
        import_key(path, Account.create().key.to_0x_hex(), "pw", scrypt_n=CHEAP)
    assert load_key(path, "pw").key == account.key
    with pytest.raises(KeyFileError, match="not a 32-byte hex private key") as err:
        import_key(tmp_path / "other.json", "0xnothex")
    assert not (tmp_path / "other.json").exists() and "nothex" not in str(err.value)


def test_an_empty_passphrase_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="empty passphrase"):
        create_key(tmp_path / "k.json", "")
    assert not (tmp_path / "k.json").exists()


def test_a_huge_file_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    path.write_text(" " * (1 << 20))
    with pytest.raises(KeyFileError, match="not a key"):
        load_key(path)
